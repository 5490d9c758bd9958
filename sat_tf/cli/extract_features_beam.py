"""Writes sat-extract-features' feature cache as an Apache Beam pipeline: on this machine, or
on the workers of a runner that share its feature folder.

  sat-extract-features-beam --flagfile=configs/coco.flags
  sat-extract-features-beam --dataset=flickr8k --data_dir=data/flickr8k \
      --encoder=vgg19 --encoder_weights=imagenet --image_size=224

The flags are sat-extract-features' (--shard_size, --extract_batch_size,
--skip_bad_images and the settings) and so is the cache, shard for shard: sat-train
--use_feature_cache reads it unchanged. Each shard is one element: a worker loads the
encoder once and writes whole shards, and a rerun skips every shard already written, also
after a run that did not finish. An image that cannot be decoded stops its shard only: the
others are written and the command ends naming every such image, or with
--skip_bad_images leaves them out and lists them in the index, as sat-extract-features
does.

Every flag that is not one of this command's is a Beam pipeline option (--runner,
--direct_num_workers, ...); without --runner it runs on this machine in sat-caption-beam's
local setting. The feature folder is a local path: a remote runner's workers must have it
mounted.
"""

from absl import flags

from sat_tf.cli import caption_beam, extract_features
from sat_tf.cli.flags_lib import config_from_flags

PROGRAM = "sat-extract-features-beam"

FLAGS = flags.FlagValues()
extract_features.define_flags(FLAGS)


def _check(pipeline_args, argv):
    """Checks the pipeline options, the flags and the data folder before TensorFlow loads."""
    caption_beam.pipeline_options(pipeline_args, PROGRAM)
    extract_features.check(FLAGS, argv)
    if "://" in FLAGS.feature_dir:
        raise ValueError(
            f"--feature_dir={FLAGS.feature_dir}: the feature cache is a local folder (a "
            "remote runner's workers must have it mounted)"
        )


def _main(pipeline_args, argv):
    options = caption_beam.pipeline_options(pipeline_args, PROGRAM)
    from sat_tf.data import feature_cache
    from sat_tf.pipelines import extract_pipeline
from sat_tf.training import extract

    config = config_from_flags(FLAGS)
    feature_dir = feature_cache.feature_dir_of(config)
    index, found = extract_pipeline.run(
        extract.records_of(config),
        config.encoder,
        config.encoder_weights,
        config.image_size,
        feature_dir,
        options,
        crop_fraction=config.effective_crop_fraction,
        shard_size=FLAGS.shard_size,
        batch_size=FLAGS.extract_batch_size,
        skip_bad_images=FLAGS.skip_bad_images,
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
    return caption_beam.run_beam_command(_main, _check, FLAGS, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
