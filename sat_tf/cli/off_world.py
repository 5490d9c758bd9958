"""Off-world statistics of a preset or a workdir: how unlike its training photos a photo is.

  sat-off-world --preset=flickr8k_lite0_grid14_soft --feature_dir=data/cache/flickr8k_lite0 \\
      --data_dir=../shared/data/flickr8k
  sat-off-world --workdir=runs/flickr8k_grid

Fits the statistics of `sat_tf/serving/off_world.py` to the cached encoder features of the
training photos (`sat-extract-features` made them), sets the threshold at --quantile of
the validation photos' distances, and writes off_world.npz into the preset (listed in its
metadata.json with the share of each split's photos flagged) or the workdir. Captioning
with it then scores every photo (`Caption.off_world_score`, sat-caption's JSON lines, the
SavedModel's outputs, the demo page).
"""

import dataclasses
import json
import os
import shlex
import sys

from absl import flags

from sat_tf import config as config_lib
from sat_tf.cli.flags_lib import run
from sat_tf.config import Config
from sat_tf.serving import preset
from sat_tf.utils import files

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "preset", None, "A preset (shipped name or folder); or --workdir.", flag_values=FLAGS
)
flags.DEFINE_string("workdir", None, "A trained workdir; or --preset.", flag_values=FLAGS)
flags.DEFINE_string(
    "feature_dir", None, "Cached features of the dataset; default the run's.", flag_values=FLAGS
)
flags.DEFINE_string("data_dir", None, "Dataset folder; default the run's.", flag_values=FLAGS)
flags.DEFINE_integer(
    "num_components",
    config_lib.OFF_WORLD_COMPONENTS,
    "Principal directions kept.",
    flag_values=FLAGS,
)
flags.DEFINE_float(
    "quantile",
    config_lib.OFF_WORLD_QUANTILE,
    "Share of the validation photos whose distance lies under the threshold.",
    flag_values=FLAGS,
)


def _folder():
    """The folder of --preset or --workdir, checked.

    Raises:
      ValueError: unless one of them names a folder whose files can be written.
    """
    if bool(FLAGS.preset) == bool(FLAGS.workdir):
        raise ValueError("give --preset=<name or folder> or --workdir=<folder>, one of them")
    if FLAGS.preset and "://" in FLAGS.preset:
        raise ValueError("--preset: a shipped name or a folder, whose files can be written")
    folder = preset.resolve(FLAGS.preset) if FLAGS.preset else FLAGS.workdir
    if not os.path.isfile(os.path.join(folder, preset.CONFIG_FILE)):
        raise ValueError(f"{folder} is not a sat_tf workdir: {preset.CONFIG_FILE} is missing")
    return folder


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    _folder()
    for name in ("feature_dir", "data_dir"):
        if FLAGS[name].value and not os.path.isdir(FLAGS[name].value):
            raise ValueError(f"--{name}={FLAGS[name].value} is not a folder")


def _main(argv):
    from sat_tf.data import datasets, feature_cache
    from sat_tf.serving import off_world

    folder = _folder()
    config = Config.load(os.path.join(folder, preset.CONFIG_FILE))
    if FLAGS.feature_dir:
        config = dataclasses.replace(config, feature_dir=FLAGS.feature_dir)
    feature_dir = feature_cache.feature_dir_of(config)
    records = datasets.load_records(
        config.dataset,
        FLAGS.data_dir or config.data_dir,
        captions=config.captions,
        on_missing=config.on_missing,
    )
    records = feature_cache.drop_skipped(records, feature_dir)
    stats, flagged = off_world.compute(
        feature_dir,
        records,
        FLAGS.num_components,
        FLAGS.quantile,
        encoder=config.encoder,
        encoder_weights=config.encoder_weights or "",
        image_size=config.image_size,
        crop_fraction=config.effective_crop_fraction,
    )
    path = os.path.join(folder, off_world.FILE)
    off_world.save(stats, path)
    summary = {
        "threshold": round(stats.threshold, 4),
        "quantile": stats.quantile,
        "num_components": FLAGS.num_components,
        "flagged": {split: round(rate, 4) for split, rate in flagged.items()},
    }
    if FLAGS.preset:
        metadata = preset.read_metadata(folder)
        metadata["files"][off_world.FILE] = {
            "bytes": os.path.getsize(path),
            "sha256": files.sha256_of(path),
        }
        command = shlex.join(["sat-off-world", *sys.argv[1:]])
        metadata["off_world"] = {**summary, "command": command}
        preset.write_metadata(folder, metadata)
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
