"""Exports a trained workdir as a SavedModel for TF Serving (and optionally TFLite).

  python export/export.py --workdir=runs/shapes --output=exports/sat/1
  python export/export.py --workdir=runs/shapes --output=exports/sat/2 --beam_size=3 --tflite

The export directory gets the SavedModel (signatures serving_default, caption_images,
caption_features), vocab.txt, sat_tf_export.json and, with --tflite, caption.tflite.
See export/serving/README.md for serving it.
"""

import json
import os
import sys

from absl import flags

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "scripts")]

from flags_lib import run  # noqa: E402

from sat_tf import serving  # noqa: E402

flags.DEFINE_string("workdir", "runs/shapes", "A trained workdir (scripts/train.py).")
flags.DEFINE_string("output", None, "Export directory, e.g. exports/sat/1 (a TF Serving version).")
flags.DEFINE_integer("beam_size", 0, "Beam size fixed in the graph; 0 = the workdir's setting.")
flags.DEFINE_integer("max_length", 0, "Most tokens per caption; 0 = the workdir's setting.")
flags.DEFINE_bool("tflite", False, "Also write caption.tflite (builtin ops, greedy decoding).")
flags.DEFINE_bool("overwrite", False, "Replace an earlier export at --output.")
flags.mark_flag_as_required("output")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    for name in ("beam_size", "max_length"):
        if FLAGS[name].value < 0:
            raise ValueError(f"--{name}={FLAGS[name].value} must be 0 (workdir default) or more")
    info = serving.export_workdir(
        FLAGS.workdir,
        FLAGS.output,
        beam_size=FLAGS.beam_size or None,
        max_length=FLAGS.max_length or None,
        tflite=FLAGS.tflite,
        overwrite=FLAGS.overwrite,
    )
    summary = {k: v for k, v in info.items() if k != "config"}
    print(json.dumps({"output": os.path.abspath(FLAGS.output), **summary}, indent=2))


if __name__ == "__main__":
    run(main)
