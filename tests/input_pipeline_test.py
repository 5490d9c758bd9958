"""Tests for sat_tf.input_pipeline: image decoding and cropping, file checks, batching."""

import collections
import io
import os

import hypothesis
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from hypothesis import strategies as st
from PIL import Image

from sat_tf import input_pipeline
from sat_tf.datasets import Record
from sat_tf.vocab import Vocab

COLOURS = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
}
FILLER = ("thing", "here", "on", "the", "floor")


def _encode(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _decode(data, size, crop_fraction=1.0):
    return input_pipeline.decode_image(tf.constant(data), size, crop_fraction).numpy()


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def _quadrants():
    """4 x 4 RGB image with four distinct 2 x 2 quadrants."""
    pixels = np.zeros((4, 4, 3), np.uint8)
    pixels[:2, :2] = (255, 0, 0)
    pixels[:2, 2:] = (0, 255, 0)
    pixels[2:, :2] = (0, 0, 255)
    pixels[2:, 2:] = (255, 255, 255)
    return pixels


def _ramp(height, width):
    """Red = column index, green = row index: the source position of every pixel."""
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[..., 0] = np.arange(width)[None, :]
    pixels[..., 1] = np.arange(height)[:, None]
    return pixels


def _noise_jpeg():
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)
    return _encode(Image.fromarray(pixels), "JPEG")


class DecodeImageTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters("PNG", "BMP", "WEBP")
    def test_lossless_rgb(self, fmt):
        pixels = _quadrants()
        kwargs = {"lossless": True} if fmt == "WEBP" else {}
        out = _decode(_encode(Image.fromarray(pixels), fmt, **kwargs), 4)
        self.assertEqual(out.dtype, np.float32)
        self.assertAllEqual(out, pixels.astype(np.float32))

    def test_jpeg_rgb(self):
        out = _decode(_encode(Image.new("RGB", (16, 16), (200, 100, 50)), "JPEG", quality=95), 8)
        self.assertEqual(out.shape, (8, 8, 3))
        self.assertAllClose(out, np.full((8, 8, 3), (200, 100, 50), np.float32), atol=3)

    @parameterized.parameters("PNG", "JPEG", "BMP", "GIF")
    def test_grayscale_gives_three_equal_channels(self, fmt):
        pixels = np.array([[10, 10, 200, 200]] * 4, np.uint8)
        out = _decode(_encode(Image.fromarray(pixels, "L"), fmt), 4)
        self.assertEqual(out.shape, (4, 4, 3))
        self.assertAllEqual(out[..., 0], out[..., 1])
        self.assertAllEqual(out[..., 0], out[..., 2])
        atol = 8 if fmt == "JPEG" else 0
        self.assertAllClose(out[..., 0], pixels.astype(np.float32), atol=atol)

    @parameterized.parameters("PNG", "BMP", "WEBP")
    def test_alpha_is_dropped(self, fmt):
        pixels = np.zeros((4, 4, 4), np.uint8)
        pixels[..., :3] = _quadrants()
        pixels[..., 3] = np.array([0, 64, 128, 255], np.uint8)[None, :]
        kwargs = {"lossless": True, "exact": True} if fmt == "WEBP" else {}
        out = _decode(_encode(Image.fromarray(pixels, "RGBA"), fmt, **kwargs), 4)
        self.assertAllEqual(out, _quadrants().astype(np.float32))

    def test_grayscale_with_alpha(self):
        image = Image.fromarray(np.full((4, 4, 2), (90, 0), np.uint8), "LA")
        self.assertAllEqual(_decode(_encode(image, "PNG"), 4), np.full((4, 4, 3), 90.0))

    @parameterized.parameters("PNG", "GIF")
    def test_palette(self, fmt):
        image = Image.fromarray(_quadrants()).convert("P", palette=Image.Palette.ADAPTIVE)
        self.assertEqual(image.mode, "P")
        self.assertAllEqual(_decode(_encode(image, fmt), 4), _quadrants().astype(np.float32))

    def test_animated_gif_gives_first_frame(self):
        frames = [Image.new("RGB", (4, 4), c).convert("P") for c in [(255, 0, 0), (0, 0, 255)]]
        data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
        self.assertAllEqual(_decode(data, 4), np.full((4, 4, 3), (255, 0, 0), np.float32))

    def test_sixteen_bit_png_is_scaled_to_eight_bits(self):
        pixels = np.array([[0, 40000], [65535, 1000]], np.uint16)
        out = _decode(_encode(Image.fromarray(pixels), "PNG"), 2)
        self.assertAllClose(out[..., 0], pixels / 257.0, atol=1.0)

    def test_cmyk_jpeg_is_converted_to_rgb(self):
        image = Image.new("CMYK", (8, 8), (0, 255, 255, 0))
        out = _decode(_encode(image, "JPEG", quality=95), 8)
        self.assertAllClose(out, np.full((8, 8, 3), (255, 0, 0), np.float32), atol=3)

    @parameterized.parameters((224 / 256, 16), (1.0, 16), (0.5, 7))
    def test_output_size(self, crop_fraction, size):
        data = _encode(Image.fromarray(_ramp(30, 50)), "PNG")
        self.assertEqual(_decode(data, size, crop_fraction).shape, (size, size, 3))
        data = _encode(Image.fromarray(_ramp(50, 30)), "PNG")
        self.assertEqual(_decode(data, size, crop_fraction).shape, (size, size, 3))

    @parameterized.named_parameters(
        ("wide", 100, 250, (20, 80)),
        ("tall", 250, 100, (80, 20)),
    )
    def test_centre_crop_keeps_the_centre_of_the_resized_image(self, height, width, offset):
        # Shorter side 100 -> 40 / 0.5 = 80 (scale 0.8): the resized image is 80 x 200
        # (or 200 x 80) and the 40 x 40 crop starts at `offset` = ((H' - 40) // 2, ...).
        # On a ramp every output pixel shows its source position (up to the filter's
        # asymmetry, < 0.1 px); a half-pixel error in the crop would be 0.625 px.
        out = _decode(_encode(Image.fromarray(_ramp(height, width)), "PNG"), 40, 0.5)
        top, left = offset
        source_x = (left + np.arange(40) + 0.5) / 0.8 - 0.5
        source_y = (top + np.arange(40) + 0.5) / 0.8 - 0.5
        self.assertAllClose(out[..., 0], np.broadcast_to(source_x[None, :], (40, 40)), atol=0.1)
        self.assertAllClose(out[..., 1], np.broadcast_to(source_y[:, None], (40, 40)), atol=0.1)
        self.assertAllEqual(out[..., 2], np.zeros((40, 40)))

    def test_crop_fraction_one_squeezes_the_whole_image(self):
        out = _decode(_encode(Image.fromarray(_ramp(60, 250)), "PNG"), 50, 1.0)
        source_x = (np.arange(50) + 0.5) * 250 / 50 - 0.5
        source_y = (np.arange(50) + 0.5) * 60 / 50 - 0.5
        inner = slice(2, 48)
        self.assertAllClose(out[inner, inner, 0], np.tile(source_x[inner], (46, 1)), atol=0.1)
        self.assertAllClose(out[inner, inner, 1], np.tile(source_y[inner, None], (1, 46)), atol=0.1)

    @parameterized.parameters((90, 120, 32, 224 / 256), (120, 90, 32, 224 / 256), (77, 77, 20, 0.8))
    def test_crop_matches_pillow(self, height, width, size, crop_fraction):
        y, x = np.mgrid[:height, :width]
        palette = np.array(list(COLOURS.values()), np.uint8)
        pixels = palette[(x // 7 + 3 * (y // 9)) % len(palette)]
        short = size / crop_fraction
        new_w = round(width * short / min(height, width))
        new_h = round(height * short / min(height, width))
        top, left = (new_h - size) // 2, (new_w - size) // 2
        resized = Image.fromarray(pixels).resize((new_w, new_h), Image.Resampling.BILINEAR)
        expected = np.asarray(resized.crop((left, top, left + size, top + size)), np.float32)

        out = _decode(_encode(Image.fromarray(pixels), "PNG"), size, crop_fraction)
        self.assertEqual(out.shape, expected.shape)
        self.assertLess(np.abs(out - expected).max(), 3.0)
        self.assertLess(np.abs(out - expected).mean(), 0.5)

    @parameterized.named_parameters(
        ("truncated_png", lambda: _encode(Image.fromarray(_ramp(32, 32)), "PNG")[:-60]),
        ("truncated_jpeg", lambda: _noise_jpeg()[: len(_noise_jpeg()) // 2]),
        ("text", lambda: b"this is not an image\n"),
        ("empty", lambda: b""),
    )
    def test_corrupt_bytes_raise(self, data):
        with self.assertRaises(tf.errors.InvalidArgumentError):
            _decode(data(), 8, 1.0)


class CheckImageFilesTest(tf.test.TestCase, parameterized.TestCase):
    def _good(self):
        folder = self.get_temp_dir()
        images = {
            "rgb.png": _encode(Image.fromarray(_ramp(8, 8)), "PNG"),
            "gray.jpg": _encode(Image.new("L", (8, 8), 40), "JPEG"),
            "palette.gif": _encode(Image.new("RGB", (8, 8), (255, 0, 0)).convert("P"), "GIF"),
            "rgba.bmp": _encode(Image.new("RGBA", (8, 8), (1, 2, 3, 4)), "BMP"),
        }
        return [_write(os.path.join(folder, name), data) for name, data in images.items()]

    def test_good_files_pass(self):
        input_pipeline.check_image_files(self._good())

    @parameterized.named_parameters(
        ("truncated_png", "cut.png", lambda: _encode(Image.fromarray(_ramp(32, 32)), "PNG")[:-60]),
        ("text_named_jpg", "notes.jpg", lambda: b"this is not an image\n"),
        ("zero_bytes", "zero.jpg", lambda: b""),
        ("truncated_jpeg", "cut.jpg", lambda: _noise_jpeg()[: len(_noise_jpeg()) // 2]),
        ("tiff_named_jpg", "scan.jpg", lambda: _encode(Image.fromarray(_ramp(8, 8)), "TIFF")),
    )
    def test_bad_file_is_named(self, name, data):
        bad = _write(os.path.join(self.get_temp_dir(), name), data())
        with self.assertRaises(tf.errors.InvalidArgumentError):
            input_pipeline.decode_image(tf.io.read_file(bad), 8, 1.0)
        with self.assertRaisesRegex(ValueError, name):
            input_pipeline.check_image_files(self._good() + [bad])

    def test_every_bad_file_is_named(self):
        folder = self.get_temp_dir()
        bad = [
            _write(os.path.join(folder, "first_bad.png"), b"\x89PNG\r\n\x1a\n"),
            os.path.join(folder, "never_written.png"),
        ]
        with self.assertRaises(ValueError) as raised:
            input_pipeline.check_image_files([bad[0], *self._good(), bad[1]])
        message = str(raised.exception)
        self.assertIn("2 image file(s)", message)
        self.assertIn("first_bad.png", message)
        self.assertIn("never_written.png", message)
        self.assertNotIn("rgb.png", message)


def _captions(i, colour):
    """Three captions of image i with 1..6 words, each naming the colour first."""
    lengths = (i % 6 + 1, (i + 2) % 6 + 1, (i + 4) % 6 + 1)
    return tuple(" ".join((colour.capitalize(),) + FILLER[: n - 1]) + "." for n in lengths)


class DatasetTest(tf.test.TestCase, parameterized.TestCase):
    def setUp(self):
        super().setUp()
        folder = self.get_temp_dir()
        self.records = []
        for i, (colour, rgb) in enumerate(COLOURS.items()):
            path = _write(
                os.path.join(folder, f"{colour}.png"), _encode(Image.new("RGB", (8, 8), rgb), "PNG")
            )
            self.records.append(Record(str(i), path, _captions(i, colour), "train"))
        texts = [c for r in self.records for c in r.captions]
        self.vocab = Vocab.build(texts)

    def _expected_ids(self, caption, max_length=None):
        words = caption.lower().rstrip(".").split()[:max_length]
        return [1] + self.vocab.ids(words) + [2]

    def _image_index(self, image):
        """Index of the record whose solid colour fills `image` exactly."""
        matches = [
            i
            for i, rgb in enumerate(COLOURS.values())
            if np.all(image == np.array(rgb, np.float32))
        ]
        self.assertLen(matches, 1)
        return matches[0]

    def _train(self, **kwargs):
        args = dict(image_size=8, crop_fraction=1.0, batch_size=3, max_length=10, seed=0)
        args.update(kwargs)
        return input_pipeline.train_dataset(self.records, self.vocab, **args)

    def _pairs(self, batches, key="image"):
        """(record index, caption tuple) for every row of every batch."""
        pairs = []
        for batch in batches:
            for x, caption in zip(batch[key], batch["caption"], strict=True):
                if key == "image":
                    index = self._image_index(x)
                else:
                    self.assertAllEqual(x, np.full_like(x, x[0, 0]))
                    index = int(x[0, 0])
                pairs.append((index, tuple(caption.tolist())))
        return pairs

    @parameterized.parameters(True, False)
    def test_batches_hold_one_caption_length_and_pair_captions_with_images(self, cache_images):
        batches = list(self._train(cache_images=cache_images).take(60).as_numpy_iterator())
        lengths = collections.Counter()
        for batch in batches:
            self.assertEqual(set(batch), {"image", "caption"})
            self.assertEqual(batch["image"].shape, (3, 8, 8, 3))
            self.assertEqual(batch["image"].dtype, np.float32)
            caption = batch["caption"]
            self.assertEqual(caption.dtype, np.int32)
            self.assertEqual(caption.shape[0], 3)
            self.assertAllEqual(caption[:, 0], [1, 1, 1])
            self.assertAllEqual(caption[:, -1], [2, 2, 2])
            self.assertTrue(np.all(caption[:, 1:-1] > 3), caption)
            lengths[caption.shape[1]] += 1
        self.assertEqual(set(lengths), {3, 4, 5, 6, 7, 8})

        expected = {
            (i, tuple(self._expected_ids(c)))
            for i, r in enumerate(self.records)
            for c in r.captions
        }
        pairs = self._pairs(batches)
        self.assertLen(expected, 24)
        self.assertEqual(set(pairs), expected)
        counts = collections.Counter(pairs)
        self.assertBetween(min(counts.values()), 3, 8)
        self.assertBetween(max(counts.values()), 7, 12)

    def test_lengths_are_interleaved(self):
        lengths = [b["caption"].shape[1] for b in self._train().take(12).as_numpy_iterator()]
        self.assertGreater(len(set(lengths)), 2, lengths)
        self.assertNotEqual(lengths, sorted(lengths))

    @parameterized.parameters(1, 4)
    def test_batch_size(self, batch_size):
        for batch in self._train(batch_size=batch_size).take(10).as_numpy_iterator():
            self.assertEqual(batch["caption"].shape[0], batch_size)
            self.assertEqual(batch["image"].shape[0], batch_size)

    def test_captions_are_cut_to_max_length_words(self):
        expected = {
            (i, tuple(self._expected_ids(c, max_length=2)))
            for i, r in enumerate(self.records)
            for c in r.captions
        }
        batches = list(self._train(max_length=2).take(30).as_numpy_iterator())
        self.assertEqual({b["caption"].shape[1] for b in batches}, {3, 4})
        self.assertEqual(set(self._pairs(batches)), expected)

    def test_shuffle_is_deterministic_given_the_seed(self):
        def first(seed, n=30):
            return self._pairs(self._train(seed=seed).take(n).as_numpy_iterator())

        run = first(0)
        self.assertEqual(run, first(0))
        self.assertNotEqual(run, first(1))
        self.assertNotEqual(run[:45], run[45:])

    def test_features_replace_images(self):
        features = np.arange(8, dtype=np.float32)[:, None, None] * np.ones((8, 2, 5), np.float32)
        records = [
            Record(r.image_id, "/no/such/file.png", r.captions, r.split) for r in self.records
        ]
        ds = input_pipeline.train_dataset(
            records,
            self.vocab,
            image_size=8,
            crop_fraction=1.0,
            batch_size=2,
            max_length=10,
            features=tf.data.Dataset.from_tensor_slices(features),
        )
        batches = list(ds.take(40).as_numpy_iterator())
        for batch in batches:
            self.assertEqual(set(batch), {"features", "caption"})
            self.assertEqual(batch["features"].shape, (2, 2, 5))
        expected = {
            (i, tuple(self._expected_ids(c)))
            for i, r in enumerate(self.records)
            for c in r.captions
        }
        self.assertContainsSubset(set(self._pairs(batches, key="features")), expected)

    def test_eval_dataset_keeps_record_order(self):
        ds = input_pipeline.eval_dataset(
            self.records, image_size=8, crop_fraction=1.0, batch_size=3
        )
        batches = list(ds.as_numpy_iterator())
        self.assertEqual([len(b["index"]) for b in batches], [3, 3, 2])
        index = np.concatenate([b["index"] for b in batches])
        self.assertAllEqual(index, np.arange(8))
        images = np.concatenate([b["image"] for b in batches])
        self.assertEqual([self._image_index(x) for x in images], list(range(8)))

    def test_eval_dataset_with_features(self):
        features = tf.data.Dataset.from_tensor_slices(np.arange(8, dtype=np.float32)[:, None] * 10)
        ds = input_pipeline.eval_dataset(
            self.records, image_size=8, crop_fraction=1.0, batch_size=5, features=features
        )
        batches = list(ds.as_numpy_iterator())
        self.assertEqual(set(batches[0]), {"features", "index"})
        self.assertAllEqual(np.concatenate([b["index"] for b in batches]), np.arange(8))
        self.assertAllEqual(
            np.concatenate([b["features"] for b in batches])[:, 0], np.arange(8) * 10.0
        )

    def test_teacher_forced_dataset_pads_every_caption_in_order(self):
        ds = input_pipeline.teacher_forced_dataset(
            self.records, self.vocab, image_size=8, crop_fraction=1.0, batch_size=5, max_length=4
        )
        batches = list(ds.as_numpy_iterator())
        self.assertEqual([len(b["caption"]) for b in batches], [5, 5, 5, 5, 4])

        expected = [
            (i, self._expected_ids(c, 4)) for i, r in enumerate(self.records) for c in r.captions
        ]
        for k, batch in enumerate(batches):
            rows = expected[5 * k : 5 * k + 5]
            width = max(len(ids) for _, ids in rows)
            padded = np.array([ids + [0] * (width - len(ids)) for _, ids in rows], np.int32)
            self.assertAllEqual(batch["caption"], padded)
            self.assertEqual([self._image_index(x) for x in batch["image"]], [i for i, _ in rows])


if __name__ == "__main__":
    tf.test.main()


def _valid_images():
    """Small valid files of every format decode_image reads."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    return [_encode(image, fmt) for fmt in ("PNG", "JPEG", "GIF", "BMP", "WEBP")]


@st.composite
def _image_bytes(draw):
    """Arbitrary bytes, and valid images truncated or with bytes overwritten."""
    kind = draw(st.sampled_from(["random", "truncated", "mutated"]))
    if kind == "random":
        return draw(st.binary(max_size=200))
    data = bytearray(draw(st.sampled_from(_valid_images())))
    if kind == "truncated":
        return bytes(data[: draw(st.integers(0, len(data)))])
    for _ in range(draw(st.integers(1, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


class DecodeImagePropertyTest(tf.test.TestCase):
    @hypothesis.settings(max_examples=150, deadline=None, database=None)
    @hypothesis.given(_image_bytes())
    def test_any_bytes_give_an_image_or_a_clean_error(self, data):
        try:
            out = _decode(data, 8)
        except tf.errors.InvalidArgumentError as e:
            self.assertTrue(e.message.strip())
            return
        self.assertEqual(out.shape, (8, 8, 3))
        self.assertTrue(np.all(np.isfinite(out)))
        self.assertTrue(np.all((out >= -1e-3) & (out <= 255 + 1e-3)), (out.min(), out.max()))
