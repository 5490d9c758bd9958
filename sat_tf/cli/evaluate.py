"""Captions a split with a trained model or a preset and scores it with the coco-caption
metrics.

  sat-evaluate --workdir=runs/shapes --split=test --beam_size=3
  sat-evaluate --preset=<name> --data_dir=../shared/data/flickr8k --split=test

Writes captions_<split>.json (COCO results format), metrics_<split>.json and
table_<split>.md (laid out like the paper's Table 1) into the workdir, or into
--output_dir (for a preset by default runs/presets/<its name>); `_beam<k>`, `_lp<value>`,
`_<hard decoding>`, `_repeats` and `_nobadendings` come before the extension when
--beam_size, --length_penalty, --hard_decoding, --block_repeats or --block_bad_endings
override the model's own. A workdir's model reads its
feature cache, if it was trained on one; a preset is evaluated from the image files (its
encoder runs on every photo, as in caption.py and the exports), and on the data it was
trained on its scores are compared with those stored in its metadata.json; on other
data (`--dataset=folder --data_dir=my_photos`) they are that data's alone.
"""

import dataclasses
import json
import os

from absl import flags

from sat_tf.cli.flags_lib import (
    check_model_source,
    decoding_overrides,
    define_model_source,
    define_override,
    model_source,
    override,
    run,
)
from sat_tf.config import DATASETS
from sat_tf.utils import files

FLAGS = flags.FlagValues()
define_model_source(FLAGS)
flags.DEFINE_enum("split", "test", ["train", "val", "test"], "Split to caption.", flag_values=FLAGS)
define_override("beam_size", "Beam size (1 = greedy)", FLAGS)
flags.DEFINE_string(
    "data_dir",
    None,
    "Dataset folder; default the one the model was trained on.",
    flag_values=FLAGS,
)
flags.DEFINE_enum(
    "dataset",
    None,
    list(DATASETS),
    "Dataset kind of --data_dir; default the one the model was trained on (e.g. "
    "--dataset=folder --data_dir=my_photos scores a preset on a folder of your own).",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "captions",
    None,
    "--dataset=folder: its captions file; default found in --data_dir.",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "output_dir",
    None,
    "Folder for the results; default the workdir, or runs/presets/<name>.",
    flag_values=FLAGS,
)


def _with_data_dir(config):
    """`config` with the data flags given: the dataset to score."""
    given = {name: FLAGS[name].value for name in ("dataset", "data_dir", "captions")}
    return dataclasses.replace(config, **{k: v for k, v in given.items() if v is not None})


def _same_data(config, trained) -> bool:
    """Whether `config` names data of the kind the model was trained on: a Flickr or COCO
    dataset it was trained on (its stored scores are of that split), never a folder of a
    user's own photos."""
    return config.dataset == trained.dataset and config.dataset != "folder"


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    override(FLAGS, "beam_size")
    check_model_source(FLAGS)
    if FLAGS.data_dir is not None and not os.path.isdir(FLAGS.data_dir):
        raise ValueError(f"--data_dir={FLAGS.data_dir} is not a folder")


def _main(argv):
    from sat_tf.evaluation import metrics
    from sat_tf.serving import inference, preset
    from sat_tf.training import prepare, publish, scoring

    beam_size = override(FLAGS, "beam_size")
    kind, source = model_source(FLAGS)
    stored = None
    if kind == "workdir":
        model, vocab, config = inference.load_workdir(source)
        config = _with_data_dir(config)
        config, overrides = decoding_overrides(FLAGS, config)
        output_dir = FLAGS.output_dir or source
        scoring.check_output_dir(output_dir, config)
        os.makedirs(output_dir, exist_ok=True)
        data = prepare.prepare_data(config, source)
        scores = scoring.evaluate(
            model, data, config, output_dir, FLAGS.split, beam_size, overrides=overrides
        )
    else:
        model, vocab, trained, _, directory = inference.load(source, kind="preset")
        metadata = preset.read_metadata(directory)
        config = _with_data_dir(trained)
        config, overrides = decoding_overrides(FLAGS, config)
        output_dir = FLAGS.output_dir or os.path.join("runs", "presets", metadata["name"])
        scores = scoring.evaluate_images(
            model, vocab, config, output_dir, FLAGS.split, beam_size, overrides
        )
        if not overrides and _same_data(config, trained):
            stored = publish.stored_scores(metadata, beam_size or config.beam_size, FLAGS.split)
    beam = beam_size or config.beam_size
    decoding = f", {config.hard_decoding} context" if config.attention == "hard" else ""
    if config.length_penalty:
        decoding += f", length penalty {config.length_penalty:g}"
    if not config.block_repeats:
        decoding += ", repeats allowed"
    if config.block_bad_endings:
        decoding += ", no bad endings"
    score = config.attention_score + (" + mean context" if config.global_context else "")
    if config.start_state != "mean":
        score += f", {config.start_state} start state"
    if config.location_prior:
        score += ", location prior"
    name = f"this model ({config.attention} attention{decoding}, {score}, beam {beam})"
    table = metrics.format_table1(scores, config.dataset, name)
    table_name = scoring.result_name("table", FLAGS.split, config, beam_size, ".md", overrides)
    files.write_text(os.path.join(output_dir, table_name), table)
    print(json.dumps(scores, indent=2, sort_keys=True))
    print(table)
    if stored is not None:
        differences = publish.score_differences(stored, scores)
        print(
            f"the preset's metadata.json stores the scores of {FLAGS.split}, beam {beam}: "
            + ("these are equal" if not differences else "they differ: " + "; ".join(differences))
        )


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
