"""Tests for sat_tf.data.graph_admission, the admission rule in TensorFlow ops: a batch
decoded with a status and a message per image, the `tf.data` filter at the limit, the
pixel count capped as image_io caps it, and Python's thousands separators in the graph
(the header walk against image_io's on every format: admission_test.py,
image_fuzz_test.py)."""

import struct
import zlib

import tensorflow as tf
from absl.testing import parameterized
from admission_test import encode, png_bomb

from sat_tf.data import graph_admission, image_io

_header = tf.function(graph_admission.read_header_tf)


def _png_header(width, height):
    """A PNG's signature and IHDR chunk alone: all the header walk reads."""
    body = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + body))
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(body)) + b"IHDR" + body + crc


class DecodeImagesAdmittedTest(tf.test.TestCase):
    def test_a_batch_gives_a_status_and_an_error_per_image(self):
        good = encode("PNG", 12, 10)
        batch = [good, png_bomb(), b"text", encode("JPEG", 64, 64)[:400], b"", good]
        pixels, status, error = tf.function(
            lambda b: graph_admission.decode_images_admitted(b, 8, 1.0)
        )(tf.constant(batch))
        self.assertAllEqual(status, [0, 4, 2, 3, 1, 0])
        expected = image_io.decode_image(tf.constant(good), 8, 1.0)
        self.assertAllClose(pixels[0], expected)
        self.assertAllClose(pixels[5], expected)
        self.assertAllEqual(pixels[1], tf.zeros([8, 8, 3]))
        self.assertEqual(
            [e.decode() for e in error.numpy()],
            [
                "",
                "image_bytes[1]: 529,000,000 pixels (23000 x 23000) is over the limit of "
                "50,000,000; max_image_pixels (--max_image_pixels) sets it",
                "image_bytes[2] (4 bytes) is not a JPEG, PNG, GIF, BMP or WebP image",
                "image_bytes[3] (400 bytes) is a truncated or corrupt JPEG file",
                "image_bytes[4] is empty (0 bytes)",
                "",
            ],
        )

    def test_an_image_that_resizes_past_the_limit_is_decoded_apart_as_alone(self):
        # 4 x 200 resizes to 18 x 914 before its 16 x 16 crop: past a limit of 10,000
        # pixels that its 800 are within.
        long, good = encode("PNG", 200, 4), encode("PNG", 12, 10)
        apart = graph_admission._resized_pixels(
            {"width": tf.constant([200, 12], tf.int64), "height": tf.constant([4, 10], tf.int64)},
            16,
            0.875,
        )
        self.assertAllEqual(apart, [18 * 914, 18 * 22])
        batch = [long, good, long[:60]]
        pixels, status, _ = tf.function(
            lambda b: graph_admission.decode_images_admitted(b, 16, 0.875, 10_000)
        )(tf.constant(batch))
        self.assertAllEqual(status, [0, 0, 3])
        for i in (0, 1):
            self.assertAllEqual(pixels[i], image_io.decode_image(tf.constant(batch[i]), 16, 0.875))


class AdmitsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(10_000, 9_999)
    def test_the_filter_takes_what_admit_takes(self, limit):
        for data in (encode("PNG", 100, 100), encode("JPEG", 100, 100), b"text", b""):
            try:
                image_io.admit(data, "x", max_image_pixels=limit)
                admitted = True
            except image_io.ImageError:
                admitted = False
            got = graph_admission.admits(tf.constant(data), max_image_pixels=limit)
            self.assertEqual(bool(got), admitted, (data[:8], limit))

    def test_a_bomb_is_filtered_out_of_a_dataset(self):
        batch = [encode("PNG", 4, 4), png_bomb(), encode("GIF", 4, 4)]
        kept = tf.data.Dataset.from_tensor_slices(batch).filter(graph_admission.admits)
        self.assertEqual([bytes(b) for b in kept.as_numpy_iterator()], [batch[0], batch[2]])


class PixelCountTest(tf.test.TestCase):
    def test_width_times_height_capped_at_two_to_the_62(self):
        # PNG sides reach 2**32 - 1: their product overflows int64 unless capped first.
        for width, height, pixels in [
            (2**31, 2, 2**32),
            (2**32 - 1, 1, 2**32 - 1),
            (2**31, 2**31, 2**62),
            (2**32 - 1, 2**32 - 1, 2**62),
            (2**32 - 1, 2**30 + 1, 2**62),
        ]:
            header = _header(tf.constant(_png_header(width, height)))
            self.assertEqual(int(header["status"]), image_io.OK)
            self.assertEqual((int(header["width"]), int(header["height"])), (width, height))
            self.assertEqual(int(header["pixels"]), pixels, (width, height))


class GroupedTest(tf.test.TestCase):
    def test_thousands_separators_are_pythons(self):
        values = [0, 7, 999, 1000, 1001, 10_000, 999_999, 1_000_000, 50_000_000]
        values += [529_000_000, 2**32 - 1, 2**62, 2**63 - 1]
        got = graph_admission._grouped(tf.constant(values, tf.int64))
        self.assertEqual([g.decode() for g in got.numpy()], [f"{v:,}" for v in values])


if __name__ == "__main__":
    tf.test.main()
