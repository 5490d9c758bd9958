"""Tests for sat_tf.data.image_pixels: TensorFlow's pixels without TensorFlow, held to
`image_io` (TensorFlow's decoders, resize and crop) as the independent implementation:
every format and colour mode, EXIF orientations, CMYK, BMP's layouts, GIF frames and
transparency, truncations, random sizes through the resize, and fuzzed bytes give the
same pixels or the same one-line refusal; the module loads no TensorFlow."""

import io
import os

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized
from fixtures import fresh_python
from image_fuzz_test import SLOW, hostile_bytes
from image_io_test import _camera_jpeg, _exif
from PIL import Image

from sat_tf.data import image_header, image_io, image_pixels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 24


def _encode(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _photo(height=37, width=53):
    """Smooth colour ramps: what a lossy codec keeps, with every level used."""
    y, x = np.mgrid[:height, :width]
    return np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (height + width)], -1)


def _noise(height=37, width=53, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)


def _noise16():
    """16-bit grey levels whose low bytes differ from their high ones."""
    return np.random.default_rng(3).integers(0, 65536, (37, 53)).astype(np.uint16)


def _files():
    """{name: bytes}: every format, colour mode and layout the package reads."""
    photo, noise = Image.fromarray(_photo().astype(np.uint8)), Image.fromarray(_noise())
    rgba = Image.fromarray(np.dstack([_noise(), _noise(seed=1)[..., 0]]), "RGBA")
    frames = [noise, Image.fromarray(_noise(seed=2))]
    out = {
        "jpeg": _encode(photo, "JPEG", quality=75),
        "jpeg_progressive": _encode(photo, "JPEG", progressive=True),
        "jpeg_444": _encode(photo, "JPEG", subsampling=0),
        "jpeg_422": _encode(photo, "JPEG", subsampling=1),
        "jpeg_gray": _encode(photo.convert("L"), "JPEG"),
        "jpeg_cmyk": _encode(photo.convert("CMYK"), "JPEG"),
        "png": _encode(noise, "PNG"),
        "png_rgba": _encode(rgba, "PNG"),
        "png_gray": _encode(noise.convert("L"), "PNG"),
        "png_gray_alpha": _encode(noise.convert("LA"), "PNG"),
        "png_1bit": _encode(noise.convert("1"), "PNG"),
        "png_2bit": _encode(noise.convert("L"), "PNG", bits=2),
        "png_palette": _encode(noise.convert("P"), "PNG"),
        "png_palette_transparency": _encode(noise.convert("P"), "PNG", transparency=3),
        "png_16bit": _encode(Image.fromarray(_noise16()), "PNG"),
        "gif": _encode(noise, "GIF"),
        "gif_transparency": _encode(noise.convert("P"), "GIF", transparency=5),
        "gif_animated": _encode(frames[0], "GIF", save_all=True, append_images=frames[1:]),
        "bmp": _encode(noise, "BMP"),
        "bmp_rgba": _encode(rgba, "BMP"),
        "bmp_gray": _encode(noise.convert("L"), "BMP"),
        "bmp_palette": _encode(noise.convert("P"), "BMP"),
        "bmp_1bit": _encode(noise.convert("1"), "BMP"),
        "webp": _encode(photo, "WEBP"),
        "webp_lossless": _encode(noise, "WEBP", lossless=True),
        "webp_alpha": _encode(rgba, "WEBP"),
    }
    for orientation in range(1, 9):
        out[f"jpeg_exif_{orientation}"] = _camera_jpeg(_exif(orientation))
    out["gif_offset_frame"] = _gif_offset_frame()
    out["bmp_top_down"] = _bmp_top_down(_noise(5, 7))
    out["bmp_trailing_bytes"] = out["bmp"] + b"xx"
    return out


def _gif_offset_frame():
    """A GIF whose only frame, 6 x 4 with transparent index 7, sits at (2, 1) of a
    10 x 8 screen, written byte by byte (Pillow writes frames whole)."""
    image = Image.fromarray(np.arange(24, dtype=np.uint8).reshape(4, 6), "P")
    image.putpalette(np.random.default_rng(4).integers(1, 256, 96).tolist())
    frame = _encode(image, "GIF", optimize=False)
    descriptor = frame.index(b"\x2c\x00\x00\x00\x00\x06\x00\x04\x00")
    screen = (10).to_bytes(2, "little") + (8).to_bytes(2, "little")
    control = b"\x21\xf9\x04\x01\x00\x00\x07\x00"
    offset = (2).to_bytes(2, "little") + (1).to_bytes(2, "little")
    body = frame[descriptor : descriptor + 1] + offset + frame[descriptor + 5 :]
    return frame[:6] + screen + frame[10:descriptor] + control + body


def _bmp_top_down(pixels):
    """A 24-bit BMP stored top down (negative height), rows padded to 4 bytes."""
    height, width, _ = pixels.shape
    row = (3 * width + 3) // 4 * 4
    rows = b"".join(p[:, ::-1].tobytes().ljust(row, b"\0") for p in pixels)
    header = b"BM" + (54 + len(rows)).to_bytes(4, "little") + bytes(4) + (54).to_bytes(4, "little")
    info = (40).to_bytes(4, "little") + width.to_bytes(4, "little")
    info += (-height).to_bytes(4, "little", signed=True) + (1).to_bytes(2, "little")
    info += (24).to_bytes(2, "little") + bytes(24)
    return header + info + rows


def outcome(module, data, crop_fraction=1.0):
    """(status, pixels or message) of one module's `decode_admitted`."""
    try:
        pixels = module.decode_admitted(data, "x.img", SIZE, crop_fraction, max_image_pixels=10**6)
    except image_header.ImageError as e:
        return e.status, str(e)
    return image_header.OK, np.asarray(pixels)


class SamePixelsTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.files = _files()

    def assert_same(self, data, crop_fraction=1.0):
        want_status, want = outcome(image_io, data, crop_fraction)
        got_status, got = outcome(image_pixels, data, crop_fraction)
        self.assertEqual(got_status, want_status, (got, want))
        if want_status == image_header.OK:
            self.assertAllClose(got, want, atol=1e-4, rtol=0)
        else:
            self.assertEqual(got, want)

    def test_every_format_decodes_to_tensorflows_bytes(self):
        refused = []
        for name, data in self.files.items():
            with self.subTest(name):
                try:
                    want = image_io.decode_upright(data).numpy()
                except tf.errors.InvalidArgumentError:
                    refused.append(name)
                    with self.assertRaises(ValueError):
                        image_pixels.decode_upright(data)
                    continue
                self.assertAllEqual(image_pixels.decode_upright(data), want)
        # TensorFlow reads BMPs of 8, 24 or 32 bits a pixel and exactly their rows' bytes.
        self.assertEqual(refused, ["bmp_1bit", "bmp_trailing_bytes"])

    def test_every_format_resized_and_cropped_alike(self):
        for name, data in self.files.items():
            for crop_fraction in (1.0, 224 / 256):
                with self.subTest(name, crop_fraction=crop_fraction):
                    self.assert_same(data, crop_fraction)

    def test_a_cmyk_jpeg_is_turned_by_tensorflows_rule(self):
        # Pillow writes Adobe's marker (inverted values): the CMYK branch's Adobe case.
        data = self.files["jpeg_cmyk"]
        self.assertTrue(image_pixels._adobe(data))
        self.assertFalse(image_pixels._adobe(self.files["jpeg"]))
        pixels = image_pixels.decode_upright(data)
        self.assertAllEqual(pixels, image_io.decode_upright(data).numpy())
        self.assertGreater(np.std(pixels), 20)

    def test_the_transparent_index_of_a_first_frame_is_black(self):
        data = self.files["gif_offset_frame"]
        pixels = image_pixels.decode_upright(data)
        self.assertAllEqual(pixels, image_io.decode_upright(data).numpy())
        # TensorFlow's canvas is the largest frame's size, the frame drawn at its offset.
        self.assertEqual(pixels.shape, (4, 6, 3))
        self.assertAllEqual(pixels[0], np.zeros((6, 3)))
        colours = np.frombuffer(data[13 : 13 + (3 << ((data[10] & 7) + 1))], np.uint8)
        colours = colours.reshape(-1, 3)
        self.assertAllEqual(pixels[1, 2], colours[0])
        self.assertAllEqual(pixels[1, 3], colours[1])
        self.assertAllEqual(pixels[2, 3], [0, 0, 0])  # index 7: transparent

    def test_every_truncation(self):
        for name, data in self.files.items():
            # A JPEG cut by its last byte alone: TensorFlow's libjpeg-turbo decodes 3 in 100
            # of them, simplejpeg's none (BUILD_NOTES.md, "Captioning without TensorFlow").
            first = 2 if name.startswith("jpeg") else 1
            for cut in sorted({first, 2, 3, 17, len(data) // 4, len(data) // 2, len(data) - 30}):
                if 0 < cut < len(data):
                    with self.subTest(name, cut=cut):
                        self.assert_same(data[: len(data) - cut])

    def test_refusals_are_tensorflows_lines(self):
        for data in (b"", b"hello world\n", b"\xff\xd8\xff\xe0 this JPEG ends here", b"GIF89a"):
            with self.subTest(data[:12]):
                self.assert_same(data)
        status, message = outcome(image_pixels, b"")
        self.assertEqual((status, message), (image_header.EMPTY, "x.img is empty (0 bytes)"))

    @parameterized.parameters((1, 1), (5, 300), (300, 5), (224, 224), (600, 450), (97, 1031))
    def test_resize_is_tensorflows(self, height, width):
        image = np.random.default_rng(height * width).uniform(0, 255, (height, width, 3))
        for size in (7, 224, 511):
            got = image_pixels.resize(image, size, size + 3)
            want = tf.image.resize(image.astype(np.float32), [size, size + 3], antialias=True)
            self.assertAllClose(got, want, atol=1e-4, rtol=0)

    @parameterized.parameters((480, 640), (640, 480), (224, 224), (1, 9))
    def test_crop_window_is_tensorflows(self, height, width):
        for size, fraction in ((224, 224 / 256), (112, 1.0), (299, 0.875)):
            got = image_pixels.crop_window((height, width), size, fraction)
            new_size, top, left = image_io.crop_window([height, width], size, fraction)
            self.assertEqual(got, (tuple(new_size.numpy()), int(top), int(left)))

    def test_a_file_and_its_bytes_give_one_outcome(self):
        path = os.path.join(self.get_temp_dir(), "photo.jpg")
        with open(path, "wb") as f:
            f.write(self.files["jpeg_exif_6"])
        got = image_pixels.load_image_file(path, SIZE, 1.0)
        self.assertAllClose(got, image_io.load_image_file(path, SIZE, 1.0), atol=1e-4, rtol=0)
        for bad in (os.path.join(self.get_temp_dir(), "missing.jpg"), self.get_temp_dir()):
            with self.assertRaises(ValueError) as want:
                image_io.load_image_file(bad, SIZE)
            with self.assertRaisesRegex(ValueError, "^" + str(want.exception) + "$"):
                image_pixels.load_image_file(bad, SIZE)

    def test_damaged_files_mostly_get_tensorflows_outcome(self):
        """Files truncated, with bytes overwritten, inserted or cut out (as the fuzz tests
        damage them): the same refusal or pixels on at least 95 of 100; a JPEG damaged
        within its data gets the same status, its concealed pixels may differ. Damaged GIF
        picture data and WebP files are where the decoders part (giflib against Pillow's
        LZW; libwebp's whole-file against its animation decoder)."""
        rng = np.random.default_rng(0)
        files = list(self.files.values())
        same = statuses = 0
        for _ in range(100):
            data = bytearray(files[rng.integers(len(files))])
            start = int(rng.integers(len(data)))
            kind = rng.integers(3)
            if kind == 0:
                data = data[:start]
            elif kind == 1:
                data[start] = int(rng.integers(256))
            else:
                data[start : start + int(rng.integers(1, 9))] = rng.bytes(int(rng.integers(9)))
            (want_status, want), (got_status, got) = (
                outcome(module, bytes(data)) for module in (image_io, image_pixels)
            )
            statuses += got_status == want_status
            if got_status == want_status and want_status != image_header.OK:
                self.assertEqual(got, want)
            same += got_status == want_status and (
                want_status != image_header.OK or np.allclose(got, want, atol=1e-3)
            )
        self.assertGreaterEqual(same, 95)
        self.assertGreaterEqual(statuses, 96)

    @pytest.mark.slow
    @SLOW
    @hypothesis.given(hostile_bytes())
    def test_fuzzed_bytes_give_pixels_or_a_clean_line(self, data):
        status, got = outcome(image_pixels, data)
        if status == image_header.OK:
            self.assertEqual(got.shape, (SIZE, SIZE, 3))
        else:
            self.assertStartsWith(got, "x.img")
            self.assertNotIn("\n", got)


def test_no_tensorflow_is_loaded():
    script = (
        "import sys; from sat_tf.data import image_pixels; "
        "image_pixels.decode_admitted(open(sys.argv[1], 'rb').read(), 'x', 8)"
    )
    status, lines, stderr = fresh_python(script, os.path.join(ROOT, "docs", "shapes_attention.png"))
    assert status == 0, stderr
    assert lines == ["['PIL']"]  # a PNG: Pillow decodes it


if __name__ == "__main__":
    tf.test.main()
