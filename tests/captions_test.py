"""Tests for sat_tf.serving.captions: every kind of image `pixels` takes gives the same
pixels through TensorFlow's image code and the NumPy one, numpy images are converted or
refused with a line naming them, batches are told from single images, and the module
loads neither TensorFlow nor Pillow."""

import io
import os
import pathlib

import numpy as np
import tensorflow as tf
from fixtures import fresh_python
from PIL import Image

from sat_tf.data import image_io, image_pixels
from sat_tf.serving import captions

SIZE, CROP, LIMIT = 32, 224 / 256, 10**6


def _pixels(image, decoder, index=0):
    return captions.pixels(image, index, SIZE, CROP, LIMIT, decoder)


class PixelsTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        rng = np.random.default_rng(0)
        cls.array = rng.integers(0, 256, (40, 60, 3), np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(cls.array).save(buffer, "PNG")
        cls.png = buffer.getvalue()

    def test_every_kind_through_both_decoders(self):
        path = os.path.join(self.get_temp_dir(), "photo.png")
        with open(path, "wb") as f:
            f.write(self.png)
        kinds = {
            "path": path,
            "pathlike": pathlib.Path(path),
            "bytes": self.png,
            "bytearray": bytearray(self.png),
            "pil": Image.open(io.BytesIO(self.png)),
            "uint8": self.array,
            "uint16": self.array.astype(np.uint16) * 257,
            "float": self.array.astype(np.float32),
            "gray": self.array[..., 0],
            "rgba": np.dstack([self.array, self.array[..., :1]]),
        }
        want = np.asarray(image_io.resize_and_crop(self.array, SIZE, CROP))
        for name, image in kinds.items():
            with self.subTest(name):
                got = _pixels(image, image_pixels)
                self.assertEqual(got.shape, (SIZE, SIZE, 3))
                self.assertEqual(got.dtype, np.float32)
                self.assertAllClose(got, _pixels(image, image_io), atol=1e-4)
                if name not in ("gray",):
                    self.assertAllClose(got, want, atol=1e-3)

    def test_refusals_name_the_image(self):
        cases = {
            r"image 2 of the batch \(ndarray\): a numpy image must be \(H, W\), \(H, W, 1\), "
            r"\(H, W, 3\) or \(H, W, 4\); got shape \(4, 4, 2\)": np.zeros((4, 4, 2), np.uint8),
            r"float pixels must lie in \[0, 255\]; these all lie in \[0, 1\] \(multiply by 255\)": (
                np.full((4, 4, 3), 0.5)
            ),
            r"float pixels must lie in \[0, 255\]; these span \[-1.0, -1.0\]": np.full(
                (4, 4, 3), -1.0
            ),
            "pixels must be uint8, uint16 or float, not int64": np.zeros((4, 4, 3), np.int64),
            "image 2 of the batch \\(float\\): give a file path, bytes, a PIL image or a numpy "
            "array": 3.5,
            "image 2 of the batch is empty \\(0 bytes\\)": b"",
        }
        for message, image in cases.items():
            with self.subTest(message):
                for decoder in (image_io, image_pixels):
                    with self.assertRaisesRegex(ValueError, message):
                        _pixels(image, decoder, index=2)

    def test_batches(self):
        self.assertTrue(captions.is_batch([self.png]))
        self.assertTrue(captions.is_batch((self.png,)))
        self.assertTrue(captions.is_batch(np.zeros((2, 4, 4, 3))))
        self.assertFalse(captions.is_batch(np.zeros((4, 4, 3))))
        self.assertFalse(captions.is_batch(self.png))


def test_loads_neither_tensorflow_nor_pillow():
    status, lines, stderr = fresh_python("from sat_tf.serving import captions")
    assert status == 0, stderr
    assert lines == ["[]"]


if __name__ == "__main__":
    tf.test.main()
