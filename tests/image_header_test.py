"""Tests for sat_tf.data.image_header: the EXIF orientation read in Python as the graph
reads it (`image_io.exif_orientation`), admission's lines without TensorFlow, and that
the module loads none (its header walk and messages are tested through `image_io`'s
names in image_io_test.py and admission_test.py)."""

import tensorflow as tf
from fixtures import fresh_python
from image_io_test import _camera_jpeg, _exif
from image_pixels_test import _files

from sat_tf.data import image_header, image_io


class OrientationTest(tf.test.TestCase):
    def test_read_as_the_graph_reads_it(self):
        cases = [_camera_jpeg(_exif(o, endian)) for o in range(1, 9) for endian in "<>"]
        block = _exif(6)
        jpeg = _camera_jpeg(block)
        start = jpeg.index(b"Exif")
        # Every cut of the EXIF block, a few bytes of it overwritten, and other formats.
        cases += [jpeg[:cut] for cut in range(start - 6, start + len(block) + 4)]
        cases += [jpeg[:i] + b"\xff" + jpeg[i + 1 :] for i in range(start, start + len(block))]
        cases += [b"", b"Exif\0\0MM", _files()["png"]]
        for data in cases:
            with self.subTest(len(data)):
                want = int(image_io.exif_orientation(tf.constant(data)))
                self.assertEqual(image_header.read_orientation(data), want)


def test_admission_loads_no_tensorflow():
    script = (
        "from sat_tf.data import image_header\n"
        "for data in (b'', b'hello', b'GIF89a' + bytes(7)):\n"
        "    try: image_header.admit(data, 'x')\n"
        "    except image_header.ImageError as e: print(e.status, e)"
    )
    status, lines, stderr = fresh_python(script)
    assert status == 0, stderr
    assert lines == [
        "1 x is empty (0 bytes)",
        "2 x (5 bytes) is text, not a JPEG, PNG, GIF, BMP or WebP image",
        "3 x (13 bytes) is a truncated or corrupt GIF file",
        "[]",
    ]


if __name__ == "__main__":
    tf.test.main()
