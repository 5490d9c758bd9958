"""Captions a split with a trained model and scores it with the coco-caption metrics.

  python scripts/evaluate.py --workdir=runs/shapes --split=test --beam_size=3

Writes captions_<split>.json (COCO results format), metrics_<split>.json and
table_<split>.md (laid out like the paper's Table 1) into the workdir.
"""

import json
import os

from absl import flags
from flags_lib import define_override, override, run

from sat_tf import files
from sat_tf.evaluation import metrics
from sat_tf.training import captioning, prepare
from sat_tf.training import workdir as workdir_lib

flags.DEFINE_string("workdir", "runs/shapes", "A trained workdir (scripts/train.py).")
flags.DEFINE_enum("split", "test", ["train", "val", "test"], "Split to caption.")
define_override("beam_size", "Beam size (1 = greedy)")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    beam_size = override(FLAGS, "beam_size")
    model, vocab, config = workdir_lib.load_trained(FLAGS.workdir)
    data = prepare.prepare_data(config, FLAGS.workdir)
    scores = captioning.evaluate(model, data, config, FLAGS.workdir, FLAGS.split, beam_size)
    beam = beam_size or config.beam_size
    name = f"this model ({config.attention} attention, {config.attention_score}, beam {beam})"
    table = metrics.format_table1(scores, config.dataset, name)
    files.write_text(os.path.join(FLAGS.workdir, f"table_{FLAGS.split}.md"), table)
    print(json.dumps(scores, indent=2, sort_keys=True))
    print(table)


if __name__ == "__main__":
    run(main)
