"""Tests for sat_tf.model.encoder (ImageEncoder), the backbones of registry_test.py behind it."""

import os

import fixtures
import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model.encoder import ImageEncoder


class ImageEncoderTest(tf.test.TestCase, parameterized.TestCase):
    def test_shapes_cnn(self):
        layer = ImageEncoder("shapes_cnn", 112)
        images = tf.random.stateless_uniform((2, 112, 112, 3), (1, 2), maxval=255.0)
        out = layer(images)
        self.assertEqual(out.shape, (2, 196, 50))
        self.assertEqual(layer.feature_grid(), (14, 14, 50))
        # 3x3 convolutions without bias to 12, 24, 48, 48, 48 channels, each with batch
        # normalisation (4 numbers per channel).
        convs = 9 * (3 * 12 + 12 * 24 + 24 * 48 + 48 * 48 + 48 * 48)
        self.assertEqual(layer.count_params(), convs + 4 * (12 + 24 + 48 + 48 + 48))

    def test_locations_are_row_major(self):
        layer = ImageEncoder("shapes_cnn", 112)
        images = tf.random.stateless_uniform((1, 112, 112, 3), (3, 4), maxval=255.0)
        out = layer(images).numpy()
        grid = layer.net(images / 255.0).numpy()
        coords = np.linspace(-1.0, 1.0, 14)
        for location in (0, 1, 13, 14, 100, 195):
            row, col = divmod(location, 14)
            self.assertAllClose(out[0, location], grid[0, row, col])
            self.assertAllClose(out[0, location, -2:], [coords[row], coords[col]])

    def test_config_round_trip(self):
        layer = ImageEncoder("shapes_cnn", 96, name="encoder")
        config = layer.get_config()
        self.assertEqual(
            {k: config[k] for k in ("backbone", "image_size", "weights", "name")},
            {"backbone": "shapes_cnn", "image_size": 96, "weights": None, "name": "encoder"},
        )
        images = tf.random.stateless_uniform((1, 96, 96, 3), (1, 1), maxval=255.0)
        clone = fixtures.check_round_trip(self, layer, images)
        self.assertEqual(clone.feature_grid(), (12, 12, 50))

    def test_weights_file_is_loaded(self):
        source = ImageEncoder("shapes_cnn", 112)
        path = os.path.join(self.get_temp_dir(), "shapes.weights.h5")
        source.net.save_weights(path)
        loaded = ImageEncoder("shapes_cnn", 112, weights=path)
        self.assertTrue(loaded.pretrained)
        images = tf.random.stateless_uniform((1, 112, 112, 3), (5, 6), maxval=255.0)
        self.assertAllClose(loaded(images), source(images))

    def _save_and_load(self, layer):
        inputs = keras.Input((112, 112, 3))
        model = keras.Model(inputs, layer(inputs), name="wrapper")
        images = tf.random.stateless_uniform((2, 112, 112, 3), (7, 8), maxval=255.0)
        expected = model(images).numpy()
        loaded = fixtures.check_saved_model_file(self, model, images, expected, atol=0.0)
        return expected, loaded, images

    def test_keras_save_load(self):
        expected, loaded, images = self._save_and_load(ImageEncoder("shapes_cnn", 112))
        self.assertIsInstance(loaded.layers[-1], ImageEncoder)
        self.assertAllEqual(loaded(images).numpy(), expected)

    def test_keras_load_does_not_need_the_initial_weights_file(self):
        path = os.path.join(self.get_temp_dir(), "initial.weights.h5")
        ImageEncoder("shapes_cnn", 112).net.save_weights(path)
        expected, _, _ = self._save_and_load(ImageEncoder("shapes_cnn", 112, weights=path))
        os.remove(path)
        loaded = keras.saving.load_model(
            os.path.join(self.get_temp_dir(), "wrapper.keras"), safe_mode=True
        )
        images = tf.random.stateless_uniform((2, 112, 112, 3), (7, 8), maxval=255.0)
        self.assertAllEqual(loaded(images).numpy(), expected)


if __name__ == "__main__":
    tf.test.main()
