"""Lays the test metrics of several runs out like Table 1 of the paper, beside its rows.

  python scripts/table.py --dataset=flickr8k --output=docs/flickr8k_table_test.md \
      "Soft, greedy=runs/f8k_soft/metrics_test.json" \
      "Soft, beam 3=runs/f8k_soft/metrics_test_beam3.json"

Each argument is `<row name>=<metrics JSON>` (written by evaluate.py or train.py).
"""

import json
import os

from absl import flags

from sat_tf import files
from sat_tf.cli.flags_lib import run
from sat_tf.evaluation import metrics

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "dataset", "flickr8k", "Dataset whose rows of the paper to show.", flag_values=FLAGS
)
flags.DEFINE_string("output", "", "Markdown file to write; '' prints only.", flag_values=FLAGS)


def _main(argv):
    rows = {}
    for arg in argv[1:]:
        name, sep, path = arg.rpartition("=")
        if not sep or not name:
            raise ValueError(f"{arg!r} is not <row name>=<metrics JSON>")
        try:
            with open(path, encoding="utf-8") as f:
                rows[name] = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read metrics {path}: {e}") from e
    if not rows:
        raise ValueError("give one or more <row name>=<metrics JSON>")
    table = metrics.table1(rows, FLAGS.dataset)
    if FLAGS.output:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
        files.write_text(FLAGS.output, table)
    print(table)


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__)
