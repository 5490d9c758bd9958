"""Serves the exports under a folder with TF Serving's REST and gRPC APIs, batching
concurrent requests.

  sat-serve --model_name=sat --model_base_path=exports/sat
  sat-serve --model_base_path=exports/sat --rest_api_port=8501 --port=8500 \
      --batching_parameters_file=export/serving/batching_parameters.txt

The flags are TF Serving's (tensorflow_model_server) with their meanings: the newest
complete version folder under --model_base_path is served (`sat-export
--output=exports/sat/1` writes one) and a newer one is picked up every
--file_system_poll_wait_seconds. REST: POST /v1/models/<name>[/versions/<v>]:predict,
GET /v1/models/<name> and /v1/models/<name>/metadata; gRPC: PredictionService and
ModelService. A port of 0 picks a free one. SIGTERM finishes the requests in flight and
exits 0. See export/serving/README.md.
"""

import os
import signal
import sys
import threading

from absl import flags

from sat_tf.cli.flags_lib import run

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "model_name", "sat", "Name of the model in URLs and requests.", flag_values=FLAGS
)
flags.DEFINE_string(
    "model_base_path", None, "Folder of numbered version folders (exports).", flag_values=FLAGS
)
flags.DEFINE_integer("rest_api_port", 8501, "Port of the REST API.", flag_values=FLAGS)
flags.DEFINE_integer("port", 8500, "Port of the gRPC API.", flag_values=FLAGS)
flags.DEFINE_string("host", "0.0.0.0", "Address both APIs listen on.", flag_values=FLAGS)
flags.DEFINE_bool(
    "enable_batching", True, "Batch concurrent requests into one call.", flag_values=FLAGS
)
flags.DEFINE_string(
    "batching_parameters_file",
    "",
    "TF Serving's BatchingParameters in text format; empty: "
    "export/serving/batching_parameters.txt's values.",
    flag_values=FLAGS,
)
flags.DEFINE_float(
    "file_system_poll_wait_seconds",
    1.0,
    "Seconds between looks for a new version; 0 looks once.",
    flag_values=FLAGS,
)
flags.DEFINE_integer(
    "rest_api_num_threads", 48, "Threads answering requests (each API).", flag_values=FLAGS
)
flags.DEFINE_integer(
    "max_body_bytes",
    64 * 2**20,
    "Request bodies (REST) and messages (gRPC) over this size are refused.",
    flag_values=FLAGS,
)
flags.mark_flag_as_required("model_base_path", flag_values=FLAGS)
_quiet = True


def _main(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not os.path.isdir(FLAGS.model_base_path):
        raise ValueError(f"--model_base_path {FLAGS.model_base_path!r} is not a folder")
    try:
        import waitress  # noqa: F401
    except ImportError:
        raise ValueError('sat-serve needs waitress: pip install "sat_tf[serve]"') from None
    if _quiet:
        from sat_tf import cli

        cli.quiet_tensorflow()
    from sat_tf.server import batching
    from sat_tf.server import manager as model_server

    parameters = None
    if FLAGS.enable_batching:
        parameters = (
            batching.read_parameters(FLAGS.batching_parameters_file)
            if FLAGS.batching_parameters_file
            else batching.SERVE_DEFAULTS
        )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    manager = model_server.ModelManager(
        FLAGS.model_name, FLAGS.model_base_path, parameters, FLAGS.file_system_poll_wait_seconds
    )
    manager.start()
    server = model_server.serve(
        manager,
        FLAGS.rest_api_port,
        FLAGS.port,
        FLAGS.host,
        FLAGS.rest_api_num_threads,
        FLAGS.max_body_bytes,
    )
    version = manager.servable.version if manager.servable else "none yet"
    print(
        f"serving {FLAGS.model_name} (version {version}) from {FLAGS.model_base_path}: "
        f"REST on {FLAGS.host}:{server.rest_port}, gRPC on {FLAGS.host}:{server.grpc_port}",
        flush=True,
    )
    stop.wait()
    server.stop()
    print("stopped", flush=True)


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    global _quiet
    from sat_tf import cli

    _quiet = not cli.verbose(sys.argv if argv is None else argv)
    return run(_main, FLAGS, argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
