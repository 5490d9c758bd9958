"""Tests for image admission (sat_tf.data.image_io.admit, and in a graph
graph_admission.read_header_tf): sizes read from headers against Pillow's, bombs refused
before decoding, every refusal worded in one line, and the graph's walk giving the Python
walk's answers."""

import io
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from PIL import Image

from sat_tf.data import graph_admission, image_io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_INTERNALS = ("{{function_node", "[Op:", "Traceback", "node ")


_graph_header = tf.function(graph_admission.read_header_tf)


def encode(fmt, width=40, height=30, **kwargs):
    pixels = np.random.default_rng(width * height).integers(0, 256, (height, width, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def png_bomb(width=23000, height=23000):
    """A PNG that declares width x height RGB pixels in a few kilobytes (rows of zeros
    compress 1000:1); never decode it without admission."""
    chunk = lambda kind, body: (  # noqa: E731
        struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"\0" * (1 + 3 * width) * 16, 9)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


def gif_frames(width, height, frames):
    """A GIF whose `frames` frames each cover the whole width x height screen (no pixel
    data: the admission walk refuses it before any decoder reads it)."""
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0)
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x00"
    return screen + frame * frames + b"\x3b"


def animated(fmt):
    pictures = [Image.new("RGB", (64, 48), (40 * i, 0, 0)) for i in range(3)]
    buffer = io.BytesIO()
    pictures[0].save(buffer, fmt, save_all=True, append_images=pictures[1:])
    return buffer.getvalue()


def still_images():
    """(name, bytes) of every format and variant read, with Pillow's (width, height)."""
    rgba = io.BytesIO()
    Image.new("RGBA", (33, 17)).save(rgba, "WEBP")  # VP8X with alpha
    bottom_up = encode("BMP", 21, 13)
    top_down = bytearray(bottom_up)
    top_down[22:26] = struct.pack("<i", -13)
    return {
        "jpeg": encode("JPEG"),
        "progressive jpeg": encode("JPEG", 41, 29, progressive=True),
        "jpeg with exif": encode("JPEG", 20, 60, exif=Image.Exif().tobytes()),
        "png": encode("PNG", 7, 300),
        "gif": encode("GIF", 64, 3),
        "animated gif": animated("GIF"),
        "bmp": bottom_up,
        "top-down bmp": bytes(top_down),
        "webp": encode("WEBP", 50, 20),
        "lossless webp": encode("WEBP", 50, 21, lossless=True),
        "webp with alpha": rgba.getvalue(),
    }


class HeaderTest(tf.test.TestCase, parameterized.TestCase):
    def graph(self, data):
        return {k: int(v) for k, v in _graph_header(tf.constant(data)).items()}

    @parameterized.named_parameters(*still_images().items())
    def test_the_size_is_pillows_in_python_and_in_the_graph(self, data):
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
        header = image_io.admit(data, "x")
        self.assertEqual((header.width, header.height), (width, height))
        graph = self.graph(data)
        self.assertEqual(graph["status"], image_io.OK)
        self.assertEqual((graph["width"], graph["height"]), (width, height))
        self.assertEqual(graph["pixels"], header.pixels)
        self.assertEqual(image_io.HEADER_FORMATS[graph["format"]], header.format)

    def test_the_bomb_is_refused_in_one_line_naming_the_file(self):
        data = png_bomb()
        self.assertLess(len(data), 70_000)
        with self.assertRaises(image_io.ImageError) as caught:
            image_io.admit(data, "x.png")
        self.assertEqual(caught.exception.status, image_io.TOO_MANY_PIXELS)
        self.assertEqual(
            str(caught.exception),
            "x.png: 529,000,000 pixels (23000 x 23000) is over the limit of 50,000,000; "
            "max_image_pixels (--max_image_pixels) sets it",
        )
        graph = self.graph(data)
        self.assertEqual((graph["pixels"], graph["width"]), (529_000_000, 23000))

    def test_the_limit_is_settable(self):
        data = encode("PNG", 100, 100)
        self.assertEqual(image_io.admit(data, "x", max_image_pixels=10_000).pixels, 10_000)
        with self.assertRaisesRegex(image_io.ImageError, "10,000 pixels .* limit of 9,999"):
            image_io.admit(data, "x", max_image_pixels=9_999)

    def test_gif_frames_count_together(self):
        data = gif_frames(5000, 5000, 3)
        with self.assertRaisesRegex(
            image_io.ImageError,
            r"^x.gif: 75,000,000 pixels \(5000 x 5000, 3 frames\) is over the limit",
        ):
            image_io.admit(data, "x.gif")
        self.assertEqual(self.graph(data)["pixels"], 75_000_000)
        self.assertEqual(self.graph(data)["frames"], 3)
        self.assertEqual(image_io.admit(gif_frames(5000, 5000, 2), "x").pixels, 50_000_000)

    @parameterized.named_parameters(
        ("empty", b"", image_io.EMPTY, "x.jpg is empty (0 bytes)"),
        (
            "text",
            b"404 not found\n",
            image_io.NOT_AN_IMAGE,
            "x.jpg (14 bytes) is text, not a JPEG, PNG, GIF, BMP or WebP image",
        ),
        (
            "svg",
            b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>',
            image_io.NOT_AN_IMAGE,
            "x.jpg (63 bytes) is an SVG drawing, not a JPEG, PNG, GIF, BMP or WebP image",
        ),
        (
            "tiff",
            b"II*\0" + b"\0" * 60,
            image_io.NOT_AN_IMAGE,
            "x.jpg (64 bytes) is a TIFF image, not a JPEG, PNG, GIF, BMP or WebP image",
        ),
        (
            "cut header",
            b"\xff\xd8\xff\xe0\x00\x10JFIF",
            image_io.CORRUPT,
            "x.jpg (10 bytes) is a truncated or corrupt JPEG file",
        ),
        (
            "no start of frame",
            b"\xff\xd8\xff\xda\x00\x08" + b"\0" * 40,
            image_io.CORRUPT,
            "x.jpg (46 bytes) is a truncated or corrupt JPEG file",
        ),
        (
            "zero height",
            png_bomb(10, 0),
            image_io.CORRUPT,
            "is a truncated or corrupt PNG file",
        ),
    )
    def test_refusals_are_one_line_in_the_package_words(self, data, status, message):
        with self.assertRaises(image_io.ImageError) as caught:
            image_io.admit(data, "x.jpg")
        self.assertEqual(caught.exception.status, status)
        self.assertIn(message, str(caught.exception))
        self.assertNotIn("\n", str(caught.exception))
        self.assertEqual(self.graph(data)["status"], status)

    def test_animated_webp_is_refused_not_decoded(self):
        # TensorFlow 2.21's decoder frees twice on it: the process dies.
        data = animated("WEBP")
        with self.assertRaisesRegex(image_io.ImageError, r"is an animated WebP; sat_tf reads"):
            image_io.admit(data, "x.webp")
        self.assertEqual(self.graph(data)["status"], image_io.NOT_AN_IMAGE)


class DecodeTest(tf.test.TestCase):
    def test_a_truncated_file_is_named_without_tensorflow_internals(self):
        data = encode("JPEG", 64, 64)[:400]
        with self.assertRaises(image_io.ImageError) as caught:
            image_io.decode_admitted(data, "cut.jpg", 8)
        self.assertEqual(
            str(caught.exception), "cut.jpg (400 bytes) is a truncated or corrupt JPEG file"
        )
        self.assertEqual(caught.exception.status, image_io.CORRUPT)

    def test_a_file_is_named_by_its_path(self):
        path = os.path.join(self.get_temp_dir(), "bomb.png")
        with open(path, "wb") as f:
            f.write(png_bomb())
        with self.assertRaisesRegex(ValueError, f"^{path}: 529,000,000 pixels"):
            image_io.load_image_file(path, 8)
        with self.assertRaisesRegex(ValueError, "bomb.png: 529,000,000 pixels"):
            image_io.check_image_files([path])


class BombMemoryTest(tf.test.TestCase):
    def test_a_refused_bomb_costs_under_a_gigabyte_in_python_and_in_a_graph(self):
        script = textwrap.dedent(
            """
            import resource, sys
            import tensorflow as tf
            sys.path.insert(0, "tests")
            from admission_test import png_bomb
            from sat_tf.data import graph_admission, image_io
            data = png_bomb()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            try:
                image_io.decode_admitted(data, "bomb.png", 224)
            except image_io.ImageError as e:
                assert e.status == image_io.TOO_MANY_PIXELS, e
            else:
                raise AssertionError("the bomb was decoded")
            _, status, _ = tf.function(lambda b: graph_admission.decode_images_admitted(b, 224))(
                tf.constant([data, data])
            )
            assert status.numpy().tolist() == [4, 4], status
            print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
            """
        )
        env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
        )
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        self.assertLess(int(done.stdout.split()[-1]), 1024)


class PipelineTest(tf.test.TestCase):
    """Evaluation, training and feature extraction read images through tf.data: a bomb
    among them is refused from its header, never decoded."""

    def setUp(self):
        super().setUp()
        self.good = os.path.join(self.get_temp_dir(), "good.png")
        with open(self.good, "wb") as f:
            f.write(encode("PNG", 20, 20))
        self.bomb = os.path.join(self.get_temp_dir(), "bomb.png")
        with open(self.bomb, "wb") as f:
            f.write(png_bomb())

    def test_the_image_dataset_names_the_bomb_before_decoding(self):
        from sat_tf.data import input_pipeline

        with self.assertRaisesRegex(
            ValueError,
            rf"1 image file\(s\) refused before decoding:\n  {self.bomb}: 529,000,000 pixels",
        ):
            input_pipeline.image_dataset([self.good, self.bomb], 8, 1.0)
        images = list(input_pipeline.image_dataset([self.good], 8, 1.0))
        self.assertEqual(images[0].shape, (8, 8, 3))

    def test_feature_extraction_skips_the_bomb_and_names_it(self):
        import collections

        from sat_tf.training import extract

        record = collections.namedtuple("Record", "image_id image_path")
        records = [record("good", self.good), record("bomb", self.bomb)]

        class Progress:
            def add(self, count):
                pass

        written, bad, _ = extract._write_shard(
            os.path.join(self.get_temp_dir(), "shard.tfrecord"),
            records,
            lambda images: tf.zeros([tf.shape(images)[0], 4, 2]),
            8,
            1.0,
            2,
            True,
            Progress(),
        )
        self.assertEqual(written, ["good"])
        self.assertEqual([r.image_id for r, _ in bad], ["bomb"])
        self.assertStartsWith(bad[0][1], f"{self.bomb}: 529,000,000 pixels (23000 x 23000)")


if __name__ == "__main__":
    tf.test.main()
