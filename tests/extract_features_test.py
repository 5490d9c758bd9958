"""Tests for sat_tf.cli.extract_features (sat-extract-features), the command around
`training.extract.extract_for_config` (stood in here; the extraction: extract_test.py;
the command in a fresh process, quiet: quiet_test.py): the config and the extraction
flags passed on, resolved as sat-train resolves them, the summary line naming the
feature folder, with and without undecodable images, an encoder with random weights and
stray arguments refused."""

import os
from unittest import mock

import tensorflow as tf
from fixtures import run_main, write_photo_folder

from sat_tf.cli import extract_features
from sat_tf.config import derived_dir
from sat_tf.training import extract

# The encoder of the shipped grid preset, whose recipe a folder trains with.
PRESET_ENCODER = "efficientnet_lite0_head_dilated"


def _index(num_records, shards_skipped):
    """An index as extract_for_config returns it: shards with their skipped images."""
    shards = [{"skipped": [{"image_id": str(i)} for i in range(n)]} for n in shards_skipped]
    return {
        "num_records": num_records,
        "feature_shape": [196, 512],
        "num_shards": len(shards),
        "shards": shards,
    }


class ExtractFeaturesCommandTest(tf.test.TestCase):
    def test_flags_are_passed_on_and_the_summary_printed(self):
        data_dir = self.get_temp_dir()
        cache_dir = os.path.join(data_dir, "cache")
        with mock.patch.object(
            extract, "extract_for_config", return_value=_index(30, [0, 0])
        ) as run:
            code, out, err = run_main(
                extract_features.main,
                "sat-extract-features",
                "--dataset=flickr8k",
                f"--data_dir={data_dir}",
                f"--cache_dir={cache_dir}",
                "--encoder=vgg19",
                "--encoder_weights=imagenet",
                "--shard_size=16",
                "--extract_batch_size=4",
            )
        self.assertEqual(code, 0, err)
        (config,), kwargs = run.call_args
        self.assertEqual(
            (config.dataset, config.data_dir, config.encoder), ("flickr8k", data_dir, "vgg19")
        )
        self.assertEqual(kwargs, {"shard_size": 16, "batch_size": 4, "skip_bad_images": False})
        # The default folder: <cache_dir>/<dataset>-<hash of the data folder>/features_<encoder>.
        folder = os.path.join(derived_dir(config), "features_vgg19")
        self.assertStartsWith(folder, os.path.join(cache_dir, "flickr8k-"))
        self.assertEqual(out, f"30 images, 196 x 512 float16 features in 2 shards: {folder}\n")

    def test_skipped_images_are_counted_out(self):
        feature_dir = os.path.join(self.get_temp_dir(), "f")
        with mock.patch.object(
            extract, "extract_for_config", return_value=_index(30, [2, 0, 1])
        ) as run:
            code, out, err = run_main(
                extract_features.main,
                "sat-extract-features",
                f"--feature_dir={feature_dir}",
                "--skip_bad_images",
                "--allow_random_encoder",
            )
        self.assertEqual(code, 0, err)
        self.assertTrue(run.call_args.kwargs["skip_bad_images"])
        self.assertEqual(
            out,
            f"27 images, 196 x 512 float16 features in 3 shards: {feature_dir} "
            "(3 undecodable images skipped)\n",
        )

    def test_an_encoder_with_random_weights_is_refused(self):
        with mock.patch.object(extract, "extract_for_config") as run:
            code, out, err = run_main(
                extract_features.main, "sat-extract-features", "--encoder=shapes_cnn"
            )
        self.assertEqual((code, out), (1, ""))
        self.assertEqual(
            err,
            "error: --encoder=shapes_cnn with --encoder_weights='' has random weights: its "
            "features mean nothing (and differ in every process), so no cache is written; "
            "give --encoder_weights=imagenet or a weights file (--allow_random_encoder "
            "writes one anyway, for tests)\n",
        )
        run.assert_not_called()

    def test_settings_resolved_as_sat_train_resolves_them(self):
        # A folder trains with the shipped grid preset's recipe (workdir.FOLDER_RECIPE):
        # EfficientNet-Lite0 with ImageNet weights, cropped at 1.0 (not the encoder's own
        # 0.875), for every setting not given.
        data_dir = write_photo_folder(os.path.join(self.get_temp_dir(), "mine"))
        flags = ["--dataset=folder", f"--data_dir={data_dir}", "--image_size=224"]
        lite0 = ["--encoder=efficientnet_lite0", "--encoder_weights=imagenet"]
        for given, encoder in ((lite0, "efficientnet_lite0"), ([], PRESET_ENCODER)):
            with mock.patch.object(
                extract, "extract_for_config", return_value=_index(12, [0])
            ) as run:
                code, _, err = run_main(
                    extract_features.main, "sat-extract-features", *flags, *given
                )
            self.assertEqual(code, 0, err)
            (config,), _ = run.call_args
            self.assertEqual(
                (config.encoder, config.encoder_weights, config.image_size),
                (encoder, "imagenet", 224),
            )
            self.assertEqual(config.effective_crop_fraction, 1.0)
            self.assertEqual(config.data_dir, data_dir)

    def test_stray_arguments_are_refused_before_extracting(self):
        with mock.patch.object(extract, "extract_for_config") as run:
            code, _, err = run_main(extract_features.main, "sat-extract-features", "photos/")
        self.assertEqual(code, 1)
        self.assertIn("error: unexpected arguments: photos/", err)
        run.assert_not_called()


if __name__ == "__main__":
    tf.test.main()
