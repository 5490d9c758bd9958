"""Serves the exports under a folder with TF Serving's REST and gRPC APIs, batching
concurrent requests.

  sat-serve --model_name=sat --model_base_path=exports/sat
  sat-serve --model_base_path=exports/sat --rest_api_port=8501 --port=8500 \\
      --batching_parameters_file=export/serving/batching_parameters.txt
  sat-serve --model_config_file=models.config --monitoring_config_file=monitoring.config \\
      --ssl_config_file=ssl.config --enable_grpc_healthcheck_service

The flags are TF Serving's (tensorflow_model_server) with their meanings: the version
folders under --model_base_path are served as TF Serving's default policy serves them
(the newest; a new one loads before the old one goes; a broken one is retried, then
listed with its error), looked at every --file_system_poll_wait_seconds. REST: POST
/v1/models/<name>[/versions/<v> | /labels/<label>]:predict, GET /v1/models/<name> and
.../metadata; gRPC: PredictionService and ModelService. TF Serving's operators' files
work unchanged: --model_config_file (several models, version policies and labels),
--monitoring_config_file (Prometheus metrics on the REST port), --ssl_config_file (TLS on
the gRPC port); --enable_grpc_healthcheck_service answers grpc.health.v1 from the models'
states. A port of 0 picks a free one. SIGTERM finishes every request accepted and exits
0. See export/serving/README.md.
"""

import dataclasses
import os
import sys

from absl import flags

from sat_tf.cli.flags_lib import run
from sat_tf.server.options import ServerOptions

FLAGS = flags.FlagValues()
_DEFINE = {
    bool: flags.DEFINE_bool,
    int: flags.DEFINE_integer,
    float: flags.DEFINE_float,
    str: flags.DEFINE_string,
}
for _field in dataclasses.fields(ServerOptions):
    _DEFINE[_field.type](_field.name, _field.default, _field.metadata["help"], flag_values=FLAGS)


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.version:
        return
    path = FLAGS.model_base_path
    if not path and not FLAGS.model_config_file:
        raise ValueError(
            "--model_base_path is required: the folder of the version folders (or "
            "--model_config_file)"
        )
    if not FLAGS.model_config_file and "://" not in path and not os.path.isdir(path):
        raise ValueError(f"--model_base_path {path!r} is not a folder")
    if not (flags.FLAGS["verbose"].value or flags.FLAGS["verbosity"].present):
        # TensorFlow's own error lines (out of memory, a failed op) stay on for the life
        # of a server; without -v, `run` hides only what TensorFlow prints as it loads.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import waitress  # noqa: F401
    except ImportError:
        raise ValueError('sat-serve needs waitress: pip install "sat_tf[serve]"') from None


def _main(argv):
    import tensorflow as tf

    import sat_tf
    from sat_tf.server import lifecycle

    options = ServerOptions(
        **{f.name: FLAGS[f.name].value for f in dataclasses.fields(ServerOptions)}
    )
    if options.version:
        print(f"sat-serve: {sat_tf.__version__}\nTensorFlow Library: {tf.__version__}")
        return 0
    if not options.model_config_file and not tf.io.gfile.isdir(options.model_base_path):
        raise ValueError(f"--model_base_path {options.model_base_path!r} is not a folder")
    try:
        return lifecycle.run(options, announce=lambda line: print(line, flush=True))
    except lifecycle.StartError as e:
        raise ValueError(str(e)) from None


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, sys.argv if argv is None else argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
