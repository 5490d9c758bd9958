"""Exports a trained workdir or a preset as a SavedModel for TF Serving (and optionally
TFLite).

  sat-export --workdir=runs/shapes --output=exports/sat/1
  sat-export --workdir=runs/shapes --output=exports/sat/2 --beam_size=3 --tflite
  sat-export --preset=<name> --output=exports/preset/1 --tflite --quantize=dynamic

The export directory gets the SavedModel (signatures serving_default, caption_images,
caption_features; serving_default also returns a status and an error per image),
vocab.txt, sat_tf_export.json and, with --tflite, caption.tflite: the export's decoding
(beam search, tags, off-world score) and its K hypotheses in builtin ops, or greedy with
--tflite_greedy; --quantize=dynamic adds caption_int8.tflite (int8 weights, float
activations).
See export/serving/README.md for serving it.
"""

import json
import os

from absl import flags

from sat_tf.cli.flags_lib import (
    check_model_source,
    define_model_source,
    define_override,
    load_trained,
    override,
    run,
)
from sat_tf.config import QUANTIZATIONS

FLAGS = flags.FlagValues()
define_model_source(FLAGS)
flags.DEFINE_string(
    "output",
    None,
    "Export directory, e.g. exports/sat/1 (a TF Serving version).",
    flag_values=FLAGS,
)
define_override("beam_size", "Beam size fixed in the graph (1 = greedy)", FLAGS)
define_override("max_decode_length", "Most tokens per exported caption (<end> included)", FLAGS)
flags.DEFINE_bool(
    "tflite",
    False,
    "Also write caption.tflite (builtin ops, the export's decoding and its K hypotheses).",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "tflite_greedy",
    False,
    "With --tflite, caption.tflite decodes greedily without tags (the SavedModel keeps "
    "the export's decoding).",
    flag_values=FLAGS,
)
flags.DEFINE_enum(
    "quantize",
    None,
    list(QUANTIZATIONS),
    "With --tflite, also write caption_int8.tflite: dynamic = int8 weights, float activations.",
    flag_values=FLAGS,
)
flags.DEFINE_bool("overwrite", False, "Replace an earlier export at --output.", flag_values=FLAGS)
flags.DEFINE_integer(
    "max_image_pixels",
    50_000_000,
    "serving_default gives status 4 and no caption for images of more pixels, read from "
    "their headers before anything is decoded.",
    flag_values=FLAGS,
)
flags.mark_flag_as_required("output", flag_values=FLAGS)


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    override(FLAGS, "beam_size")
    override(FLAGS, "max_decode_length")
    if FLAGS.max_image_pixels < 1:
        raise ValueError(f"--max_image_pixels={FLAGS.max_image_pixels} must be at least 1")
    check_model_source(FLAGS)


def _main(argv):
    from sat_tf.serving import exporting

    model, vocab, config, off_world, _ = load_trained(FLAGS)
    info = exporting.export(
        model,
        vocab,
        config,
        FLAGS.output,
        beam_size=override(FLAGS, "beam_size"),
        max_length=override(FLAGS, "max_decode_length"),
        tflite=FLAGS.tflite,
        quantize=FLAGS.quantize,
        tflite_greedy=FLAGS.tflite_greedy,
        overwrite=FLAGS.overwrite,
        max_image_pixels=FLAGS.max_image_pixels,
        off_world=off_world,
    )
    summary = {k: v for k, v in info.items() if k != "config"}
    print(json.dumps({"output": os.path.abspath(FLAGS.output), **summary}, indent=2))


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
