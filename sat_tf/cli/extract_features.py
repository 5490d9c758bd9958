"""Runs the frozen encoder once per image of a dataset and writes float16 feature shards.

  sat-extract-features --flagfile=configs/coco.flags
  sat-extract-features --dataset=flickr8k --data_dir=data/flickr8k \
      --encoder=vgg19 --encoder_weights=imagenet --image_size=224

Shards go to --feature_dir (default <data_dir>/features_<encoder>). Running the same
command again after an interruption skips the shards already written. Training reads
them with --use_feature_cache. sat-extract-features-beam writes the same cache as an
Apache Beam pipeline.
"""

from absl import flags

from sat_tf.cli.flags_lib import check_data_dir, config_from_flags, define_config_flags, run


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
    define_config_flags(flag_values)


FLAGS = flags.FlagValues()
define_flags(FLAGS)


def check(flag_values, argv):
    """Raises ValueError for stray arguments, sizes below 1 or a missing data folder."""
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    for name in ("shard_size", "extract_batch_size"):
        if flag_values[name].value < 1:
            raise ValueError(f"--{name}={flag_values[name].value} must be at least 1")
    check_data_dir(config_from_flags(flag_values))


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

    config = config_from_flags(FLAGS)
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
    return run(_main, FLAGS, argv, __doc__, check=lambda argv: check(FLAGS, argv))


if __name__ == "__main__":
    raise SystemExit(main())
