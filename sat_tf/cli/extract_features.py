"""Runs the frozen encoder once per image of a dataset and writes float16 feature shards.

  sat-extract-features --flagfile=configs/coco.flags
  sat-extract-features --dataset=flickr8k --data_dir=data/flickr8k \
      --encoder=vgg19 --encoder_weights=imagenet --image_size=224

Shards go to --feature_dir (default <cache_dir>/<dataset>-<hash>/features_<encoder>;
s3:// or gs:// too, with apache-beam's filesystems and Beam's --s3_* options). Running
the same command again after an interruption skips the shards already written. Training reads
them with --use_feature_cache: the settings are resolved as sat-train resolves them
(with --dataset=folder, the recipe of its shipped preset for those not given), so a
cache written with some flags is the one sat-train reads with the same flags. A cache
is worth writing only from a pretrained encoder: one with random weights is refused
unless --allow_random_encoder (tests). sat-extract-features-beam writes the same cache
as an Apache Beam pipeline.
"""

from absl import flags

from sat_tf.cli.flags_lib import (
    check_data_dir,
    config_from_flags,
    define_config_flags,
    run_with_filesystem_options,
)


def define_flags(flag_values):
    """Defines the command's flags on `flag_values` (sat-extract-features-beam's too)."""
    flags.DEFINE_integer("shard_size", 1000, "Images per TFRecord shard.", flag_values=flag_values)
    flags.DEFINE_integer(
        "extract_batch_size", 32, "Images per encoder call.", flag_values=flag_values
    )
    flags.DEFINE_bool(
        "skip_bad_images",
        False,
        "Leave out images that cannot be decoded instead of stopping.",
        flag_values=flag_values,
    )
    flags.DEFINE_bool(
        "allow_random_encoder",
        False,
        "Write a cache from an encoder with random weights (tests only: its features mean "
        "nothing and differ in every process).",
        flag_values=flag_values,
    )
    define_config_flags(flag_values)


FLAGS = flags.FlagValues()
define_flags(FLAGS)


def check(flag_values, argv, program="sat-extract-features"):
    """Raises ValueError for stray arguments, sizes below 1 or a missing data folder; a
    data folder elsewhere (`s3://...`) is read by sat-extract-features-beam only."""
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    for name in ("shard_size", "extract_batch_size"):
        if flag_values[name].value < 1:
            raise ValueError(f"--{name}={flag_values[name].value} must be at least 1")
    config = config_from_flags(flag_values)
    if "://" not in config.data_dir:
        check_data_dir(config)
    elif program == "sat-extract-features":
        raise ValueError(
            f"--data_dir={config.data_dir}: sat-extract-features reads a local folder; "
            "sat-extract-features-beam reads one on any filesystem Beam reads"
        )


def resolved_config(flag_values):
    """The settings of the extraction, resolved as sat-train resolves them
    (`workdir.resolved_config`).

    Raises:
      ValueError: as `resolved_config`, or for an encoder with random weights without
        --allow_random_encoder.
    """
    from sat_tf.training import workdir

    given = {name for name in flag_values if flag_values[name].present}
    config = workdir.resolved_config(config_from_flags(flag_values), given)
    if not config.encoder_weights and not flag_values.allow_random_encoder:
        raise ValueError(
            f"--encoder={config.encoder} with --encoder_weights='' has random weights: its "
            "features mean nothing (and differ in every process), so no cache is written; "
            "give --encoder_weights=imagenet or a weights file (--allow_random_encoder "
            "writes one anyway, for tests)"
        )
    return config


def summary(index, feature_dir) -> str:
    """The line the command prints of a finished extraction's index."""
    length, depth = index["feature_shape"]
    skipped = sum(len(s["skipped"]) for s in index["shards"])
    return (
        f"{index['num_records'] - skipped} images, {length} x {depth} float16 features in "
        f"{index['num_shards']} shards: {feature_dir}"
        + (f" ({skipped} undecodable images skipped)" if skipped else "")
    )


def _main(argv):
    from sat_tf.data import feature_cache
    from sat_tf.training import extract

    config = resolved_config(FLAGS)
    index = extract.extract_for_config(
        config,
        shard_size=FLAGS.shard_size,
        batch_size=FLAGS.extract_batch_size,
        skip_bad_images=FLAGS.skip_bad_images,
    )
    print(summary(index, feature_cache.feature_dir_of(config)))


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run_with_filesystem_options(
        _main, FLAGS, argv, __doc__, check=lambda argv: check(FLAGS, argv)
    )


if __name__ == "__main__":
    raise SystemExit(main())
