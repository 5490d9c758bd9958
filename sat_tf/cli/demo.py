"""Serves a web page on 127.0.0.1 to try a captioner: upload or drop a photo, read its
caption and see where the model looked for every word.

  sat-demo
  sat-demo --preset=flickr8k_lite0_soft
  sat-demo --workdir=runs/shapes
  sat-demo --export=exports/sat/1,exports/sat/2 --port=8000 --samples=photos/

Without --preset, --workdir or --export the shipped preset flickr8k_lite0_grid14_soft
serves (`sat-caption`'s default too). With --preset or --workdir the trained model is
exported twice (greedy and beam 3) into a temporary folder, removed when the demo stops;
with --export (one or two SavedModel folders of export/export.py, repeated or
comma-separated) the page offers the decodings they were exported with. Captions come
from each SavedModel's serving_default signature, concurrent uploads batched into one call
as sat-serve batches them, after the export's warm-up requests.
"""

import os
import signal
import sys
import tempfile

from absl import flags

from sat_tf.cli.flags_lib import (
    DEFAULT_PRESET,
    check_model_source,
    define_model_source,
    load_trained,
    run,
)

# The one line a user without the demo's extra gets.
NO_FLASK = (
    'the demo needs Flask, which sat_tf installs with its demo extra: pip install "sat_tf[demo]"'
)

FLAGS = flags.FlagValues()
flags.DEFINE_multi_string(
    "export",
    [],
    "SavedModel folder(s) of sat-export, one per decoding (at most two).",
    flag_values=FLAGS,
)
define_model_source(FLAGS)
flags.DEFINE_integer("port", 8000, "Port on 127.0.0.1; 0 picks a free one.", flag_values=FLAGS)
flags.DEFINE_string(
    "samples", "", "Folder of sample photos offered on the page (first 8).", flag_values=FLAGS
)


def _exports():
    """The folders of --export, repeated or comma-separated."""
    return [p for value in FLAGS.export for p in value.split(",") if p]


def export_dirs(folder):
    """The export folders to serve: --export's, or the model of --preset or --workdir
    exported into `folder`."""
    from sat_tf.server import demo

    exports = _exports()
    trained = FLAGS.workdir or FLAGS.preset
    if exports and trained:
        raise ValueError("give --export, or one of --preset and --workdir, not both")
    if not exports and not trained:
        FLAGS.preset = trained = DEFAULT_PRESET
    if trained:
        print(f"exporting {trained} (greedy and beam 3) to {folder} ...", flush=True)
        loaded = load_trained(FLAGS)
        return demo.export_decodings(loaded[:3], folder, off_world=loaded.off_world)
    return exports


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        import flask  # noqa: F401
    except ImportError:
        raise ValueError(NO_FLASK) from None
    exports = _exports()
    if exports and (FLAGS.workdir or FLAGS.preset):
        raise ValueError("give --export, or one of --preset and --workdir, not both")
    for path in exports:
        if not os.path.isdir(path):
            raise ValueError(f"--export={path} is not a folder")
    if not exports:
        if not FLAGS.workdir and not FLAGS.preset:
            FLAGS.preset = DEFAULT_PRESET
        check_model_source(FLAGS)
    if FLAGS.samples and not os.path.isdir(FLAGS.samples):
        raise ValueError(f"--samples={FLAGS.samples} is not a folder")


def _main(argv):
    from sat_tf.server import demo

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    samples = demo.find_samples(FLAGS.samples) if FLAGS.samples else []
    with tempfile.TemporaryDirectory(prefix="sat_tf_demo_") as folder:
        captioners = demo.load_captioners(export_dirs(folder))
        server = demo.serve(demo.create_app(captioners, samples), FLAGS.port)
        names = " and ".join(c.name for c in captioners)
        print(f"demo ({names}) at http://{demo.HOST}:{server.port}/ ; Ctrl-C stops it", flush=True)
        server.serve_forever()


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
