"""Trains Show, Attend and Tell, keeps the best model by validation BLEU-4, and prints
its test metrics.

  sat-train                                 # built-in shapes dataset
  sat-train --flagfile=configs/coco.flags --workdir=runs/coco

Running the same command again after an interruption resumes from the last backup.
--feature_dir may name a cache on s3:// or gs:// (apache-beam's filesystems: the beam or
gcp extra), read from a local copy under --cache_dir; Beam's --s3_* options reach it.
"""

import json

from absl import flags

from sat_tf.cli import flags_lib
from sat_tf.cli.flags_lib import check_data_dir, config_from_flags, define_config_flags

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "workdir", "runs/shapes", "Where checkpoints, logs and results go.", flag_values=FLAGS
)
define_config_flags(FLAGS)
# What --help lists first: the data, where the run goes, the model it starts from, how long.
HELP_FIRST = ("dataset", "data_dir", "workdir", "captions", "init_from", "epochs")


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    check_data_dir(config_from_flags(FLAGS))


def _main(argv):
    from sat_tf.training import train_lib

    config = config_from_flags(FLAGS)
    given = {name for name in FLAGS if FLAGS[name].present}
    scores = train_lib.train_and_evaluate(config, FLAGS.workdir, given)
    print(json.dumps(scores, indent=2, sort_keys=True))


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    run = flags_lib.run_with_filesystem_options
    return run(_main, FLAGS, argv, __doc__, check=_check, help_first=HELP_FIRST)


if __name__ == "__main__":
    raise SystemExit(main())
