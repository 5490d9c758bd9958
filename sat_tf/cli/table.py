"""Lays the test metrics of several runs out like Table 1 of the paper, beside its rows.

  sat-table --dataset=flickr8k --output=docs/flickr8k_table_test.md \
      "Soft, greedy=runs/f8k_soft/metrics_test.json" \
      "Soft, beam 3=runs/f8k_soft/metrics_test_beam3.json"

Each argument is `<row name>=<metrics JSON>` (written by evaluate.py or train.py).

With --seeds, each argument is one run, `<row name>=<metrics JSON>[,<grounding JSON>]`
(the second written by grounding.py --output); arguments that share a row name are
seeds of one model, shown as mean ± standard deviation. A metrics JSON inside a workdir
(beside its config.json) says how its run was trained: the seeds of one row must agree on
every setting but the seed, the paths and the decoding, else the table is refused, naming
the settings that differ.

  sat-table --seeds "soft=runs/s0/metrics_test.json,runs/s0/grounding.json" \
      "soft=runs/s1/metrics_test.json,runs/s1/grounding.json" "none=runs/n0/metrics_test.json"
"""

import dataclasses
import json
import os

from absl import flags

from sat_tf.cli.flags_lib import run
from sat_tf.config import Config
from sat_tf.serving.preset import CONFIG_FILE
from sat_tf.utils import files

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "dataset", "flickr8k", "Dataset whose rows of the paper to show.", flag_values=FLAGS
)
flags.DEFINE_string("output", "", "Markdown file to write; '' prints only.", flag_values=FLAGS)
flags.DEFINE_bool(
    "seeds",
    False,
    "One run per argument (metrics JSON, optionally ',' and a grounding JSON); runs of one "
    "row name are seeds: mean ± standard deviation.",
    flag_values=FLAGS,
)


# The settings that may differ between the seeds of one row: the seed, where the run read
# and wrote, how its captions were decoded (evaluate.py may override the workdir's), and
# how the work was spread over the machine.
PER_RUN_FIELDS = frozenset(
    ("seed", "data_dir", "on_missing", "init_from", "feature_dir", "cache_dir", "eval_images")
    + ("beam_size", "max_decode_length", "length_penalty", "hard_decoding")
    + ("strategy", "jit_compile")
)
# The rest: the recipe, which the seeds of one row share.
_RECIPE_FIELDS = tuple(f.name for f in dataclasses.fields(Config) if f.name not in PER_RUN_FIELDS)


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read metrics {path}: {e}") from e


def _run_scores(paths):
    """One run's scores: its metrics JSON, and a grounding report's rates as
    "grounding <key>"."""
    from sat_tf.evaluation import coco_grounding

    first, *rest = paths.split(",")
    scores = dict(_read(first))
    for path in rest:
        report = _read(path)
        if not all(k in report for k in coco_grounding.SCORES):
            raise ValueError(
                f"{path} is not a grounding report (keys {', '.join(coco_grounding.SCORES)})"
            )
        scores.update({f"grounding {k}": report[k] for k in coco_grounding.SCORES})
        off_centre = report.get("off_centre") or {}
        scores.update({f"grounding off-centre {k}": off_centre.get(k) for k in ("hit", "random")})
    return scores


def _run_config(metrics_path):
    """The config of the run a metrics JSON belongs to: the config.json beside it, or
    None when there is none (a metrics JSON kept outside its workdir)."""
    path = os.path.join(os.path.dirname(os.path.abspath(metrics_path)), CONFIG_FILE)
    if not os.path.exists(path):
        return None
    try:
        return Config.load(path)
    except ValueError as e:
        raise ValueError(f"{path}, the config of {metrics_path}: {e}") from e


def _check_seeds(name, paths):
    """Raises ValueError when the runs of row `name` (their metrics JSONs) are not seeds
    of one recipe: a file given twice, or workdir configs that differ in a setting other
    than PER_RUN_FIELDS."""
    for path in paths:
        if paths.count(path) > 1:
            raise ValueError(f"row {name!r} lists {path} twice: its seeds must be other runs")
    known = [(path, config) for path in paths if (config := _run_config(path)) is not None]
    if not known:
        return
    first_path, first = known[0]
    for path, config in known[1:]:
        diff = [
            f"--{k}: {first_path} has {mine!r}, {path} {theirs!r}"
            for k, mine, theirs in first.differences(config, _RECIPE_FIELDS)
        ]
        if diff:
            raise ValueError(
                f"row {name!r} mixes runs of other settings; give them other row names:\n  "
                + "\n  ".join(diff)
            )


def _check(argv):
    for arg in argv[1:]:
        name, sep, paths = arg.rpartition("=")
        if not sep or not name:
            raise ValueError(f"{arg!r} is not <row name>=<metrics JSON>")
        for path in paths.split(",") if FLAGS.seeds else [paths]:
            if not os.path.isfile(path):
                raise ValueError(f"cannot read metrics {path}: no such file")
    if len(argv) < 2:
        raise ValueError("give one or more <row name>=<metrics JSON>")


def _main(argv):
    from sat_tf.evaluation import metrics

    rows, seed_paths = {}, {}
    for arg in argv[1:]:
        name, sep, path = arg.rpartition("=")
        if not sep or not name:
            raise ValueError(f"{arg!r} is not <row name>=<metrics JSON>")
        if FLAGS.seeds:
            rows.setdefault(name, []).append(_run_scores(path))
            seed_paths.setdefault(name, []).append(path.split(",")[0])
        else:
            rows[name] = _read(path)
    if not rows:
        raise ValueError("give one or more <row name>=<metrics JSON>")
    for name, paths in seed_paths.items():
        _check_seeds(name, paths)
    table = metrics.seed_table(rows) if FLAGS.seeds else metrics.table1(rows, FLAGS.dataset)
    if FLAGS.output:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
        files.write_text(FLAGS.output, table)
    print(table)


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
