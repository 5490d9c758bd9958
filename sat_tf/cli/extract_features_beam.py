"""Writes sat-extract-features' feature cache as an Apache Beam pipeline: on this machine, or
on Dataflow, Flink or Spark with the photos and the cache on a filesystem they share.

  sat-extract-features-beam --flagfile=configs/coco.flags
  sat-extract-features-beam --dataset=flickr8k --data_dir=data/flickr8k \
      --encoder=vgg19 --encoder_weights=imagenet --image_size=224
  sat-extract-features-beam --dataset=flickr8k --data_dir=s3://bucket/flickr8k \
      --feature_dir=s3://bucket/features --encoder=vgg19 --encoder_weights=imagenet \
      --image_size=224 --s3_region_name=eu-west-1

The flags are sat-extract-features' (--shard_size, --extract_batch_size,
--skip_bad_images, --allow_random_encoder and the settings, resolved as sat-train resolves
them) and so is the cache, shard for shard: sat-train --use_feature_cache reads it
unchanged, also from s3:// or gs://. Each shard is one element: a worker loads the encoder
once, reads each photo through Beam's FileSystems (its size first: one over
--max_image_bytes is refused unread, as an undecodable one) and writes whole shards, and
a rerun skips every shard already written, also after a run that did not finish. An
image that cannot be decoded stops its shard only: the others are written and the
command ends naming every such image, or with --skip_bad_images leaves them out and
lists them in the index, as sat-extract-features does.

--data_dir and --feature_dir may be on any filesystem Beam reads (a --data_dir elsewhere
needs --feature_dir). Every flag that is not one of this command's is a Beam pipeline
option (--runner, --direct_num_workers, the --s3_* options, ...); every worker gets them.
Without --runner it runs on this machine in sat-caption-beam's local setting. A runner
whose workers are elsewhere refuses a local --data_dir or --feature_dir at once.
"""

from absl import flags

from sat_tf.cli import extract_features, flags_lib
from sat_tf.cli.flags_lib import config_from_flags
from sat_tf.data.image_files import MAX_IMAGE_BYTES

PROGRAM = "sat-extract-features-beam"

FLAGS = flags.FlagValues()
extract_features.define_flags(FLAGS)
flags.DEFINE_integer(
    "max_image_bytes",
    MAX_IMAGE_BYTES,
    "A larger photo is refused from its listed size, unread, as an undecodable one.",
    flag_values=FLAGS,
)


def _check(pipeline_args, argv):
    """Checks the pipeline options, the flags, the data folder and the paths the
    runner's workers must reach before TensorFlow loads."""
    from sat_tf.pipelines import launch

    options = launch.parse(pipeline_args, PROGRAM)
    extract_features.check(FLAGS, argv, PROGRAM)
    if FLAGS.max_image_bytes < 1:
        raise ValueError(f"--max_image_bytes={FLAGS.max_image_bytes} must be at least 1")
    config = config_from_flags(FLAGS)
    if "://" in config.data_dir and not config.feature_dir:
        raise ValueError(
            f"--data_dir={config.data_dir} is elsewhere: give --feature_dir too (the default "
            "sits under --cache_dir, named after a local data folder)"
        )
    launch.check_paths(
        options, [("data_dir", config.data_dir), ("feature_dir", config.feature_dir)]
    )


def _main(pipeline_args, argv):
    from sat_tf.data import feature_cache
    from sat_tf.pipelines import extract_pipeline, launch, remote_data
    from sat_tf.training import extract
    from sat_tf.utils import filesystem

    options = launch.parse(pipeline_args, PROGRAM)
    filesystem.set_options(options)
    config = extract_features.resolved_config(FLAGS)
    feature_dir = feature_cache.feature_dir_of(config)
    remote = filesystem.is_remote(config.data_dir)
    index, found = extract_pipeline.run(
        remote_data.records_of(config) if remote else extract.records_of(config),
        config.encoder,
        config.encoder_weights,
        config.image_size,
        feature_dir,
        options,
        crop_fraction=config.effective_crop_fraction,
        shard_size=FLAGS.shard_size,
        batch_size=FLAGS.extract_batch_size,
        skip_bad_images=FLAGS.skip_bad_images,
        max_image_bytes=FLAGS.max_image_bytes,
    )
    print(extract_features.summary(index, feature_dir))
    if found is None:
        print("shards: all were complete already")
    else:
        print(f"shards: {found['encoded']} encoded, {found['found']} complete from an earlier run")


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status: 0, or 1 when nothing could start or images could not be decoded.
    """
    return flags_lib.run_beam_command(_main, _check, FLAGS, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
