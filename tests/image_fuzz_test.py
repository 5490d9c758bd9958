"""Fuzzing the image path: random bytes, and real JPEG / PNG / GIF / BMP / WebP files of
the shapes dataset truncated, with bytes overwritten (the header most often), inserted
or cut out, through admission and decoding in Python (`decode_admitted`, what the API,
the commands and evaluation run) and in a graph (`decode_images_admitted`, what the
SavedModel runs). Each input gives pixels or one clean line of the package's words; the
graph's header walk agrees with Python's; nothing crashes, hangs or takes a gigabyte
(measured in a fresh process, with a decompression bomb among the inputs). The default
run is small; `-m slow` runs a thousand inputs."""

import functools
import io
import os
import struct
import subprocess
import sys
import zlib

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st
from PIL import Image

from sat_tf.data import graph_admission, image_io, shapes

TESTS = os.path.dirname(os.path.abspath(__file__))
SIZE = 16
# Small enough that anything admitted decodes in a few tens of megabytes.
LIMIT = 4_000_000
TF_INTERNALS = ("{{function_node", "[Op:", "Traceback", "node ", "\n")
FAST = hypothesis.settings(max_examples=40, deadline=None, database=None, derandomize=True)
SLOW = hypothesis.settings(max_examples=1000, deadline=None, database=None)


@functools.cache
def real_files():
    """A shapes scene saved in every format read, progressive JPEG and lossless WebP
    included."""
    pixels, _ = shapes._draw_scene(np.random.default_rng(0), 48)
    image = Image.fromarray(pixels)
    out = []
    for fmt, options in (
        ("JPEG", {}),
        ("JPEG", {"progressive": True}),
        ("PNG", {}),
        ("GIF", {}),
        ("BMP", {}),
        ("WEBP", {}),
        ("WEBP", {"lossless": True}),
    ):
        buffer = io.BytesIO()
        image.save(buffer, fmt, **options)
        out.append(buffer.getvalue())
    return tuple(out)


def whole_png_bomb(width=10_000, height=10_000):
    """A whole PNG of width x height black RGB pixels in about 300 kB (rows of zeros
    compress 1000:1): 300 MB as decoded bytes, 1.2 GB as the float32 pixels that are
    resized. Compressed row by row, so that making it costs no memory."""
    chunk = lambda kind, body: (  # noqa: E731
        struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    compressor, row = zlib.compressobj(9), bytes(1 + 3 * width)
    rows = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


@st.composite
def hostile_bytes(draw):
    kind = draw(st.sampled_from(["random", "truncated", "overwritten", "spliced"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    data = bytearray(draw(st.sampled_from(real_files())))
    if kind == "truncated":
        return bytes(data[: draw(st.integers(0, len(data)))])
    if kind == "overwritten":
        for _ in range(draw(st.integers(1, 8))):
            end = len(data) if draw(st.booleans()) else min(len(data), 64)
            data[draw(st.integers(0, end - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    start = draw(st.integers(0, len(data)))
    cut = draw(st.integers(0, 64))
    return bytes(data[:start] + draw(st.binary(max_size=32)) + data[start + cut :])


_graph_header = tf.function(graph_admission.read_header_tf)
_graph_batch = tf.function(
    lambda batch: graph_admission.decode_images_admitted(batch, SIZE, 1.0, max_image_pixels=LIMIT),
    input_signature=[tf.TensorSpec([None], tf.string)],
)


def python_outcome(data):
    """(status, pixels or message) of the Python path."""
    try:
        pixels = image_io.decode_admitted(data, "x.jpg", SIZE, 1.0, max_image_pixels=LIMIT)
    except image_io.ImageError as e:
        return e.status, str(e)
    return image_io.OK, pixels.numpy()


# Runs as `python -c PEAK_SCRIPT` in a fresh process from tests/: after one input through
# each path (imports, traced graphs), the bomb through both paths and the inputs of the
# two default fuzz tests; prints how far the process's peak resident size (its own,
# nothing an earlier test did) grew over them, in kilobytes.
PEAK_SCRIPT = """
import resource

import image_fuzz_test as fuzz

bomb = fuzz.whole_png_bomb()
case = fuzz.FuzzTest("test_any_bytes_give_pixels_or_a_clean_line")
case.check_one(fuzz.real_files()[0])
case.check_batch([fuzz.real_files()[0]])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
case.check_one(bomb)
case.check_batch([bomb, fuzz.real_files()[1], bomb])
case.test_any_bytes_give_pixels_or_a_clean_line()
case.test_a_batch_in_the_graph_gives_what_python_gives()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


class FuzzTest(tf.test.TestCase):
    def check_one(self, data):
        status, outcome = python_outcome(data)
        if status == image_io.OK:
            self.assertEqual(outcome.shape, (SIZE, SIZE, 3))
            self.assertTrue(np.all(np.isfinite(outcome)))
        else:
            self.assertStartsWith(outcome, "x.jpg")
            for internal in TF_INTERNALS:
                self.assertNotIn(internal, outcome)
        python = image_io.read_header(data)
        graph = {k: int(v) for k, v in _graph_header(tf.constant(data)).items()}
        self.assertEqual(graph["status"], python[0])
        if python[1] is not None:
            header = python[1]
            self.assertEqual(
                (graph["width"], graph["height"], graph["pixels"]),
                (header.width, header.height, min(header.pixels, 2**62)),
            )

    def check_batch(self, batch):
        pixels, status, error = _graph_batch(tf.constant(batch))
        for data, got, message, image in zip(
            batch, status.numpy(), error.numpy(), pixels, strict=True
        ):
            want, outcome = python_outcome(data)
            self.assertEqual(got, want, message)
            if want == image_io.OK:
                self.assertAllClose(image, outcome, atol=1e-3)
            else:
                for internal in TF_INTERNALS:
                    self.assertNotIn(internal, message.decode())

    @FAST
    @hypothesis.given(hostile_bytes())
    def test_any_bytes_give_pixels_or_a_clean_line(self, data):
        self.check_one(data)

    @hypothesis.settings(FAST, max_examples=6)
    @hypothesis.given(st.lists(hostile_bytes(), min_size=1, max_size=8))
    def test_a_batch_in_the_graph_gives_what_python_gives(self, batch):
        self.check_batch(batch)

    @pytest.mark.slow
    @SLOW
    @hypothesis.given(hostile_bytes())
    def test_many_bytes_give_pixels_or_a_clean_line(self, data):
        self.check_one(data)

    @pytest.mark.slow
    @hypothesis.settings(SLOW, max_examples=100)
    @hypothesis.given(st.lists(hostile_bytes(), min_size=1, max_size=8))
    def test_many_batches_in_the_graph(self, batch):
        self.check_batch(batch)

    def test_peak_memory_stays_under_a_gigabyte(self):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        done = subprocess.run(
            [sys.executable, "-c", PEAK_SCRIPT],
            cwd=TESTS,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertLess(int(done.stdout.split()[-1]), 2**20)  # kilobytes


if __name__ == "__main__":
    tf.test.main()
