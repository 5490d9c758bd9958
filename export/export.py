"""Exports a trained workdir or a preset as a SavedModel for TF Serving (and optionally
TFLite).

  python export/export.py --workdir=runs/shapes --output=exports/sat/1
  python export/export.py --workdir=runs/shapes --output=exports/sat/2 --beam_size=3 --tflite
  python export/export.py --preset=<name> --output=exports/preset/1 --tflite --quantize=dynamic

The export directory gets the SavedModel (signatures serving_default, caption_images,
caption_features), vocab.txt, sat_tf_export.json and, with --tflite, caption.tflite;
--quantize=dynamic adds caption_int8.tflite (int8 weights, float activations).
See export/serving/README.md for serving it.
"""

import json
import os
import sys

from absl import flags

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "scripts")]

from flags_lib import (  # noqa: E402
    define_model_source,
    define_override,
    load_model,
    override,
    run,
)

from sat_tf import export_model  # noqa: E402

define_model_source()
flags.DEFINE_string("output", None, "Export directory, e.g. exports/sat/1 (a TF Serving version).")
define_override("beam_size", "Beam size fixed in the graph (1 = greedy)")
define_override("max_length", "Most tokens per caption")
flags.DEFINE_bool("tflite", False, "Also write caption.tflite (builtin ops, greedy decoding).")
flags.DEFINE_enum(
    "quantize",
    None,
    list(export_model.QUANTIZATIONS),
    "With --tflite, also write caption_int8.tflite: dynamic = int8 weights, float activations.",
)
flags.DEFINE_bool("overwrite", False, "Replace an earlier export at --output.")
flags.mark_flag_as_required("output")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    model, vocab, config = load_model(FLAGS)
    info = export_model.export(
        model,
        vocab,
        config,
        FLAGS.output,
        beam_size=override(FLAGS, "beam_size"),
        max_length=override(FLAGS, "max_length"),
        tflite=FLAGS.tflite,
        quantize=FLAGS.quantize,
        overwrite=FLAGS.overwrite,
    )
    summary = {k: v for k, v in info.items() if k != "config"}
    print(json.dumps({"output": os.path.abspath(FLAGS.output), **summary}, indent=2))


if __name__ == "__main__":
    run(main)
