"""Runs the frozen encoder once per image of a dataset and writes float16 feature shards.

  sat-extract-features --flagfile=configs/coco.flags
  sat-extract-features --dataset=flickr8k --data_dir=data/flickr8k \
      --encoder=vgg19 --encoder_weights=imagenet --image_size=224

Shards go to --feature_dir (default <data_dir>/features_<encoder>). Running the same
command again after an interruption skips the shards already written. Training reads
them with --use_feature_cache.
"""

from absl import flags

from sat_tf.cli.flags_lib import check_data_dir, config_from_flags, define_config_flags, run

FLAGS = flags.FlagValues()
flags.DEFINE_integer("shard_size", 1000, "Images per TFRecord shard.", flag_values=FLAGS)
flags.DEFINE_integer("extract_batch_size", 32, "Images per encoder call.", flag_values=FLAGS)
flags.DEFINE_bool(
    "skip_bad_images",
    False,
    "Leave out images that cannot be decoded instead of stopping.",
    flag_values=FLAGS,
)
define_config_flags(FLAGS)


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    for name in ("shard_size", "extract_batch_size"):
        if FLAGS[name].value < 1:
            raise ValueError(f"--{name}={FLAGS[name].value} must be at least 1")
    check_data_dir(config_from_flags(FLAGS))


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
    length, depth = index["feature_shape"]
    skipped = sum(len(s["skipped"]) for s in index["shards"])
    print(
        f"{index['num_records'] - skipped} images, {length} x {depth} float16 features in "
        f"{index['num_shards']} shards: {feature_cache.feature_dir_of(config)}"
        + (f" ({skipped} undecodable images skipped)" if skipped else "")
    )


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
