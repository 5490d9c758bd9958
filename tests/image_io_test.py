"""Tests for sat_tf.data.image_io: decoding every format, EXIF orientation, resizing
and cropping against Pillow, file checks, and arbitrary bytes."""

import io
import os

import fixtures
import hypothesis
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from hypothesis import strategies as st
from PIL import Image, ImageOps

from sat_tf.data import image_io


def _encode(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _decode(data, size, crop_fraction=1.0):
    return image_io.decode_image(tf.constant(data), size, crop_fraction).numpy()


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def _quadrants(height=4, width=4):
    """RGB image with four distinct quadrants: red, green / blue, white."""
    pixels = np.zeros((height, width, 3), np.uint8)
    top, left = height // 2, width // 2
    pixels[:top, :left] = (255, 0, 0)
    pixels[:top, left:] = (0, 255, 0)
    pixels[top:, :left] = (0, 0, 255)
    pixels[top:, left:] = (255, 255, 255)
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


def _exif(orientation, endian=">"):
    """EXIF block whose IFD0 holds Make, Orientation and Software, in that order.

    Big-endian (">"), its bytes are: "Exif\\0\\0" 0-5, "MM" 6-7, 42 at 8-9, IFD0 offset
    10-13, entry count 14-15, Make 16-27, Orientation 28-39 (type 30-31, count 32-35,
    value 36-37).
    """
    exif = Image.Exif()
    exif.endian = endian
    exif[0x010F] = "Camera"
    exif[0x0112] = orientation
    exif[0x0131] = "sat_tf test"
    return exif.tobytes()


def _camera_jpeg(exif=b"", fmt="JPEG", **kwargs):
    """16 x 32 quadrants, stored as JPEG (4:4:4, so the quadrants keep clean edges)."""
    image = Image.fromarray(_quadrants(16, 32))
    return _encode(image, fmt, quality=95, subsampling=0, exif=exif, **kwargs)


def _pillow_upright(data):
    """PIL's decode of `data` turned by its EXIF orientation (`ImageOps.exif_transpose`)."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


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
        palette = np.array(list(fixtures.COLOURS.values()), np.uint8)
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


def _pillow_resized(data, size):
    """`_pillow_upright` squeezed to size x size as `decode_image` does at crop 1.0."""
    resized = _pillow_upright(data).resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(resized, np.float32)


class ExifOrientationTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(orientation=[1, 2, 3, 4, 5, 6, 7, 8], endian=["<", ">"])
    def test_turned_upright_as_pillow_does(self, orientation, endian):
        data = _camera_jpeg(_exif(orientation, endian))
        orientation_read = image_io.exif_orientation(tf.constant(data))
        self.assertEqual(int(orientation_read), orientation)
        # Both decoders are libjpeg-turbo (bit-identical here, 2 levels allowed); a wrong
        # turn or flip moves whole quadrants (errors of 255).
        upright = image_io.decode_upright(tf.constant(data)).numpy()
        self.assertEqual(upright.shape, (32, 16, 3) if orientation >= 5 else (16, 32, 3))
        self.assertAllClose(upright, np.asarray(_pillow_upright(data)), atol=2)
        self.assertLess(np.abs(_decode(data, 8) - _pillow_resized(data, 8)).max(), 3.0)

    def test_in_a_dataset_and_a_function(self):
        datas = [_camera_jpeg(_exif(k)) for k in range(1, 9)]
        expected = [_pillow_resized(data, 8) for data in datas]
        ds = tf.data.Dataset.from_tensor_slices(datas).map(
            lambda data: image_io.decode_image(data, 8, 1.0)
        )
        for out, want in zip(ds.as_numpy_iterator(), expected, strict=True):
            self.assertLess(np.abs(out - want).max(), 3.0)

        decode = tf.function(
            lambda data: image_io.decode_image(data, 8, 1.0),
            input_signature=[tf.TensorSpec([], tf.string)],
        )
        for data, want in zip(datas, expected, strict=True):
            self.assertLess(np.abs(decode(tf.constant(data)).numpy() - want).max(), 3.0)

    def test_every_truncation_of_the_exif_block(self):
        # The Orientation entry of `_exif` ends at byte 40: a block cut before it has no
        # orientation; the rest of IFD0 and the strings are not needed.
        exif = _exif(6)
        orientation = tf.function(image_io.exif_orientation)
        for cut in range(len(exif) + 1):
            data = _camera_jpeg(exif[:cut])
            self.assertEqual(int(orientation(tf.constant(data))), 6 if cut >= 40 else 1, cut)

    def test_every_truncation_of_the_file_header(self):
        # A file cut inside its APP1 segment (4 bytes of marker and length, then the
        # block) has no orientation: nothing is read beyond the bytes given.
        data = _camera_jpeg(_exif(6))
        segment_end = data.index(b"\xff\xe1") + 4 + len(_exif(6))
        orientation = tf.function(image_io.exif_orientation)
        for cut in range(segment_end + 3):
            expected = 6 if cut >= segment_end else 1
            self.assertEqual(int(orientation(tf.constant(data[:cut]))), expected, cut)

    @parameterized.named_parameters(
        ("garbage", lambda e: b"Exif\0\0" + bytes(np.random.default_rng(0).integers(0, 256, 64))),
        ("unknown_byte_order", lambda e: e[:6] + b"XX" + e[8:]),
        ("not_42", lambda e: e[:8] + b"\0\x2b" + e[10:]),
        ("ifd0_beyond_the_segment", lambda e: e[:10] + b"\0\0\x7f\xff" + e[14:]),
        ("ifd0_inside_the_header", lambda e: e[:10] + b"\0\0\0\0" + e[14:]),
        ("no_entries", lambda e: e[:14] + b"\0\0" + e[16:]),
        ("orientation_9", lambda e: e[:37] + b"\x09" + e[38:]),
        ("orientation_0", lambda e: e[:37] + b"\0" + e[38:]),
        ("orientation_not_a_short", lambda e: e[:31] + b"\x04" + e[32:]),
        ("orientation_count_2", lambda e: e[:35] + b"\x02" + e[36:]),
        ("no_exif_header", lambda e: e[6:]),
    )
    def test_malformed_exif_leaves_the_image_as_stored(self, corrupt):
        data = _camera_jpeg(corrupt(_exif(6)))
        self.assertEqual(int(image_io.exif_orientation(tf.constant(data))), 1)
        stored = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        self.assertAllClose(image_io.decode_upright(tf.constant(data)), stored, atol=2)

    def test_exif_segment_outside_a_jpeg_is_ignored(self):
        exif = _exif(6)
        segment = b"\xff\xe1" + (len(exif) + 2).to_bytes(2, "big") + exif
        data = _encode(Image.fromarray(_quadrants(16, 32)), "PNG") + segment
        self.assertEqual(int(image_io.exif_orientation(tf.constant(data))), 1)
        self.assertAllEqual(_decode(data, 8), _decode(data[: -len(segment)], 8))
        self.assertEqual(int(image_io.exif_orientation(tf.constant(segment))), 1)

    def test_mpo_first_picture_is_turned(self):
        second = Image.new("RGB", (32, 16), (0, 0, 0))
        data = _camera_jpeg(_exif(8), "MPO", save_all=True, append_images=[second])
        self.assertEqual(Image.open(io.BytesIO(data)).format, "MPO")
        self.assertLess(np.abs(_decode(data, 8) - _pillow_resized(data, 8)).max(), 3.0)


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
        image_io.check_image_files(self._good())

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
            image_io.decode_image(tf.io.read_file(bad), 8, 1.0)
        with self.assertRaisesRegex(ValueError, name):
            image_io.check_image_files(self._good() + [bad])

    def test_mpo_passes(self):
        second = Image.new("RGB", (8, 8), (0, 0, 255))
        data = _encode(
            Image.new("RGB", (8, 8), (255, 0, 0)), "MPO", save_all=True, append_images=[second]
        )
        path = _write(os.path.join(self.get_temp_dir(), "camera.jpg"), data)
        self.assertEqual(Image.open(path).format, "MPO")
        image_io.check_image_files([path])
        self.assertAllClose(
            image_io.load_image_file(path, 4, 1.0), np.full((4, 4, 3), (255, 0, 0)), atol=3
        )

    def test_directory_is_named(self):
        folder = os.path.join(self.get_temp_dir(), "album.jpg")
        os.makedirs(folder, exist_ok=True)
        with self.assertRaisesRegex(ValueError, r"1 image file.*\n  .*album\.jpg: is a directory"):
            image_io.check_image_files([*self._good(), folder])

    def test_every_bad_file_is_named(self):
        folder = self.get_temp_dir()
        bad = [
            _write(os.path.join(folder, "first_bad.png"), b"\x89PNG\r\n\x1a\n"),
            os.path.join(folder, "never_written.png"),
        ]
        with self.assertRaises(ValueError) as raised:
            image_io.check_image_files([bad[0], *self._good(), bad[1]])
        message = str(raised.exception)
        self.assertIn("2 image file(s)", message)
        self.assertIn("first_bad.png", message)
        self.assertIn("never_written.png", message)
        self.assertNotIn("rgb.png", message)


class LoadImageFileTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(224 / 256, 1.0)
    def test_one_pixel_image_fills_the_output(self, crop_fraction):
        path = os.path.join(self.get_temp_dir(), "dot.png")
        _write(path, _encode(Image.new("RGB", (1, 1), (30, 140, 220)), "PNG"))
        out = image_io.load_image_file(path, 16, crop_fraction).numpy()
        self.assertEqual(out.shape, (16, 16, 3))
        self.assertAllClose(out, np.full((16, 16, 3), (30, 140, 220), np.float32), atol=1e-3)

    @parameterized.product(tall=[True, False], crop_fraction=[0.5, 1.0])
    def test_long_thin_image(self, tall, crop_fraction):
        # 10000 x 100 (or 100 x 10000), red then blue along the long side. Squeezed (1.0)
        # or centre-cropped (0.5), the 16 output rows (columns) are split at the middle:
        # the first 7 red, the last 7 blue, the middle two blended by the filter.
        pixels = np.zeros((10000, 100, 3), np.uint8)
        pixels[:5000] = (255, 0, 0)
        pixels[5000:] = (0, 0, 255)
        if not tall:
            pixels = pixels.transpose(1, 0, 2)
        path = _write(
            os.path.join(self.get_temp_dir(), "strip.png"), _encode(Image.fromarray(pixels), "PNG")
        )
        out = image_io.load_image_file(path, 16, crop_fraction).numpy()
        self.assertEqual(out.shape, (16, 16, 3))
        self.assertTrue(np.all(np.isfinite(out)))
        if not tall:
            out = out.transpose(1, 0, 2)
        self.assertAllClose(out[:7], np.full((7, 16, 3), (255, 0, 0)), atol=0.01)
        self.assertAllClose(out[9:], np.full((7, 16, 3), (0, 0, 255)), atol=0.01)

    def test_directory_is_named(self):
        folder = os.path.join(self.get_temp_dir(), "album.jpg")
        os.makedirs(folder, exist_ok=True)
        with self.assertRaisesRegex(
            ValueError, r"^image '.*album\.jpg' is a directory, not a file$"
        ):
            image_io.load_image_file(folder, 8)


def _valid_images():
    """Small valid files of every format decode_image reads."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    files = [_encode(image, fmt) for fmt in ("PNG", "JPEG", "GIF", "BMP", "WEBP")]
    return [*files, _encode(image, "JPEG", exif=_exif(6))]


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


if __name__ == "__main__":
    tf.test.main()
