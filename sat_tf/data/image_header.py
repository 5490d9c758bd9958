"""What an image's header says, read in Python without decoding a pixel or loading
TensorFlow: its format, its size (the admission rule: a small file that declares a huge
image, a "decompression bomb", is refused with a one-line message before anything is
allocated), a JPEG's EXIF orientation, and the messages that name an image that cannot be
read. `image_io` (TensorFlow's decoders, for training, the commands and the export) and
`image_pixels` (the same pixels without TensorFlow, for LiteRT) both admit images here;
`graph_admission.read_header_tf` repeats the walk in a graph.
"""

import dataclasses
from collections.abc import Sequence

from sat_tf.data.image_files import MAX_IMAGE_PIXELS, path_problem

FORMATS_TEXT = "JPEG, PNG, GIF, BMP or WebP"
# The status of one image (the SavedModel's `status` output), and each one's name.
OK, EMPTY, NOT_AN_IMAGE, CORRUPT, TOO_MANY_PIXELS = 0, 1, 2, 3, 4
STATUS_NAMES = ("ok", "empty", "not an image", "corrupt", "too many pixels")
# The formats read, by the index `read_header` gives; a WebP file is RIFF....WEBP.
HEADER_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WebP")
SIGNATURES = ((b"\xff\xd8\xff",), (b"\x89PNG\r\n\x1a\n",), (b"GIF87a", b"GIF89a"), (b"BM",))
WEBP = 4
# JPEG segments, or GIF blocks and sub-blocks, walked at most: a header not found within
# them is called corrupt (a real JPEG reaches its SOF in a few dozen segments; a GIF has
# one sub-block per 255 bytes, so 16 MB of GIF fit).
MAX_STEPS = 1 << 16
# Start-of-frame markers of every JPEG coding (baseline, extended, progressive, lossless,
# arithmetic): C0-CF but DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Formats that are not read but are worth naming when refused.
_OTHER_FORMATS = (
    (b"II*\0", "a TIFF image"),
    (b"MM\0*", "a TIFF image"),
    (b"%PDF", "a PDF document"),
    (b"\0\0\1\0", "an ICO icon"),
    (b"8BPS", "a Photoshop document"),
)

# EXIF (JEITA CP-3451) in a JPEG: an APP1 segment `FF E1 <u16 length> Exif\0\0` holds a
# TIFF header (`II` little- or `MM` big-endian, 42, u32 offset of IFD0); IFD0 is a u16
# entry count and 12-byte entries (u16 tag, u16 type, u32 count, 4-byte value).
EXIF_SEARCH_BYTES = 1 << 17
EXIF_MAX_ENTRIES = 64
ORIENTATION_TAG = 0x0112
SHORT = 3
# Per orientation 0..8: (transpose, flip left-right, flip up-down) that sets the image
# upright, applied in that order; 0 (no tag) and 1 are the identity. 6 and 8 are rotations
# by 90 degrees clockwise and counter-clockwise, 3 by 180, 5 and 7 are the two diagonal
# mirrors (PIL's TRANSPOSE and TRANSVERSE).
UPRIGHT = (
    (False, False, False),
    (False, False, False),
    (False, True, False),
    (False, True, True),
    (False, False, True),
    (True, False, False),
    (True, True, False),
    (True, True, True),
    (True, False, True),
)


def read_orientation(data: bytes) -> int:
    """The EXIF orientation tag (1..8) of JPEG bytes; 1 when there is none: the walk of
    `image_io.exif_orientation` (TensorFlow ops, for graphs) in Python, answer for
    answer (tests/image_pixels_test.py holds them equal).

    Finds the first `Exif\\0\\0` APP1 segment that starts within the first 128 KiB, reads
    its TIFF byte order and IFD0 offset, and looks for tag 0x0112 (one SHORT) among the
    first 64 IFD0 entries; a read past the segment's bytes reads zeros, so non-JPEG
    bytes and a missing, truncated or malformed EXIF block give 1, never an error.
    """
    found = data[:EXIF_SEARCH_BYTES].find(b"Exif\0\0")
    start = found - 4  # the APP1 marker, then the segment's length, then "Exif"
    if not data.startswith(b"\xff\xd8") or found < 0 or start < 0:
        return 1
    # Offsets count from the APP1 marker: the length at 2, the TIFF header at 10.
    segment = data[start : start + 2 + 0xFFFF]
    uint = lambda pos, width, little=True: _uint(segment, pos, width, little)  # noqa: E731
    tiff, end = 10, 2 + uint(2, 2, little=False)
    little = uint(tiff, 2) == 0x4949
    ifd = tiff + uint(tiff + 4, 4, little)
    if not (
        uint(0, 2, little=False) == 0xFFE1
        and end <= len(segment)
        and (little or uint(tiff, 2) == 0x4D4D)
        and uint(tiff + 2, 2, little) == 42
        and ifd >= tiff + 8
    ):
        return 1
    for index in range(min(uint(ifd, 2, little), EXIF_MAX_ENTRIES)):
        entry = ifd + 2 + 12 * index
        value = uint(entry + 8, 2, little)  # a SHORT sits in the first 2 of the 4 value bytes
        if (
            entry + 12 <= end
            and uint(entry, 2, little) == ORIENTATION_TAG
            and uint(entry + 2, 2, little) == SHORT
            and uint(entry + 4, 4, little) == 1
            and 1 <= value <= 8
        ):
            return value
    return 1


class ImageError(ValueError):
    """An image that admission or decoding refuses; the message is one line that names
    the image and what is wrong with it.

    Attributes:
      status: `EMPTY`, `NOT_AN_IMAGE`, `CORRUPT` or `TOO_MANY_PIXELS`.
    """

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class ImageHeader:
    """What an image's header declares.

    Attributes:
      format: one of `HEADER_FORMATS`.
      width, height: the size the decoder allocates (a GIF's logical screen).
      frames: pictures in the file (GIF; 1 for the others).
      frame_pixels: pixels of all a GIF's frames, which its decoder holds at once.
    """

    format: str
    width: int
    height: int
    frames: int = 1
    frame_pixels: int = 0

    @property
    def pixels(self) -> int:
        """The count the limit applies to."""
        return max(self.width * self.height, self.frame_pixels)


def _uint(data, pos, width, little):
    """The unsigned integer of `width` bytes at `pos`; bytes past the end read as 0."""
    return int.from_bytes(
        data[pos : pos + width].ljust(width, b"\0"), "little" if little else "big"
    )


def _jpeg_size(data):
    """(width, height) of the first start-of-frame segment, walking segment by segment
    from SOI as libjpeg does; None when the walk meets anything else first."""
    n, pos = len(data), 2
    for _ in range(MAX_STEPS):
        marker = data[pos + 1] if pos + 1 < n else 0
        if pos + 4 > n or data[pos] != 0xFF or marker in (0x00, 0xD8, 0xD9, 0xDA):
            return None
        if marker == 0xFF:  # a fill byte before the marker
            pos += 1
        elif marker in _SOF:
            return (_uint(data, pos + 7, 2, False), _uint(data, pos + 5, 2, False))
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
        elif _uint(data, pos + 2, 2, False) < 2:
            return None
        else:
            pos += 2 + _uint(data, pos + 2, 2, False)
    return None


def _gif_frames(data):
    """(frames, pixels of all frames) of a GIF, walking its blocks as giflib does; None
    when no frame is found within `MAX_STEPS`. Like TensorFlow's decoder (which keeps
    what giflib read before an error), a file cut after a frame began still counts it."""
    n = len(data)
    table = data[10] & 0x80 and 3 << ((data[10] & 7) + 1)
    pos, frames, pixels, in_blocks = 13 + table, 0, 0, False
    for _ in range(MAX_STEPS):
        if pos >= n:
            break
        if in_blocks:  # a sub-block: its size, then that many bytes; size 0 ends them
            in_blocks = data[pos] != 0
            pos += 1 + data[pos]
        elif data[pos] == 0x21:  # an extension: its label, then sub-blocks
            pos, in_blocks = pos + 2, True
        elif data[pos] == 0x2C and pos + 10 <= n:  # a frame: its descriptor, LZW size
            frames += 1
            pixels += _uint(data, pos + 5, 2, True) * _uint(data, pos + 7, 2, True)
            table = data[pos + 9] & 0x80 and 3 << ((data[pos + 9] & 7) + 1)
            pos, in_blocks = pos + 11 + table, True
        else:  # the trailer (0x3B), or a record that ends giflib's reading
            break
    else:
        return None
    return (frames, pixels) if frames else None


def read_header(data: bytes):
    """(status, header): status `OK` with an `ImageHeader`, else `EMPTY`,
    `NOT_AN_IMAGE` (also an animated WebP, which TensorFlow's decoder cannot read) or
    `CORRUPT` with None. The walk `graph_admission.read_header_tf` repeats in a graph."""
    if not data:
        return EMPTY, None
    index = _read_format(data)
    if index < 0:
        return NOT_AN_IMAGE, None
    frames, frame_pixels = 1, 0
    if index == 0:
        size = _jpeg_size(data)
    elif index == 1:
        size = data[12:16] == b"IHDR" and (_uint(data, 16, 4, False), _uint(data, 20, 4, False))
    elif index == 2:
        size = len(data) >= 13 and (_uint(data, 6, 2, True), _uint(data, 8, 2, True))
        counted = size and _gif_frames(data)
        size = counted and size
        frames, frame_pixels = counted or (1, 0)
    elif index == 3:
        width, height = (int.from_bytes(data[i : i + 4], "little", signed=True) for i in (18, 22))
        size = len(data) >= 26 and width > 0 and (width, abs(height))
    elif len(data) < 30:
        size = None
    else:
        chunk = data[12:16]
        if chunk == b"VP8X" and data[20] & 0x02:
            return NOT_AN_IMAGE, None
        if chunk == b"VP8 ":
            size = data[23:26] == b"\x9d\x01\x2a" and (
                _uint(data, 26, 2, True) & 0x3FFF,
                _uint(data, 28, 2, True) & 0x3FFF,
            )
        elif chunk == b"VP8L":
            bits = _uint(data, 21, 4, True)
            size = data[20:21] == b"\x2f" and ((bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1)
        elif chunk == b"VP8X":
            size = (_uint(data, 24, 3, True) + 1, _uint(data, 27, 3, True) + 1)
        else:
            size = None
    if not size or min(size) == 0:
        return CORRUPT, None
    return OK, ImageHeader(HEADER_FORMATS[index], *size, frames, frame_pixels)


def _what_it_is(data):
    """A few words naming a format that is not read (TIFF, SVG, text ...), or ''."""
    for signature, what in _OTHER_FORMATS:
        if data.startswith(signature):
            return what
    if data[4:8] == b"ftyp":
        return "a HEIF, AVIF or MP4 file"
    head = data[:512]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:  # a character cut at the 512th byte still is text
        text = head[: e.start].decode("utf-8") if e.start >= len(head) - 3 else ""
    if not text.strip() or not all(c.isprintable() or c in "\t\r\n" for c in text):
        return ""
    text = text.lstrip("\ufeff \t\r\n").lower()
    if text.startswith(("<svg", "<?xml", "<!doctype svg")) and "<svg" in text:
        return "an SVG drawing"
    if text.startswith(("<!doctype html", "<html")):
        return "an HTML page"
    return "text"


def _too_many(name, pixels, width, height, frames, limit):
    size = f"{width} x {height}" + (f", {frames} frames" if frames > 1 else "")
    return (
        f"{name}: {pixels:,} pixels ({size}) is over the limit of {limit:,}; "
        "max_image_pixels (--max_image_pixels) sets it"
    )


def corrupt_message(name, size, fmt):
    return f"{name} ({size} bytes) is a truncated or corrupt {fmt} file"


def admit(data: bytes, name: str, max_image_pixels: int = MAX_IMAGE_PIXELS) -> ImageHeader:
    """The admission rule: reads the image's size from its header, decoding nothing.

    Args:
      data: the encoded bytes.
      name: how messages name the image (its path, or its place in a batch).
      max_image_pixels: the most pixels (width x height; a GIF's frames together)
        admitted. The default takes 48-megapixel phone photos and refuses a small file
        that decodes to gigabytes.

    Returns:
      the `ImageHeader`.

    Raises:
      ImageError: one line naming `name`: empty, not a JPEG / PNG / GIF / BMP / WebP
        image (naming TIFF, SVG, text ... when it is one), a header that is cut or
        damaged, or more pixels than `max_image_pixels`.
    """
    status, header = read_header(data)
    if status == EMPTY:
        raise ImageError(f"{name} is empty (0 bytes)", EMPTY)
    if status == NOT_AN_IMAGE and _read_format(data) == WEBP:
        raise ImageError(
            f"{name} ({len(data)} bytes) is an animated WebP; sat_tf reads still WebP images "
            "(TensorFlow's decoder cannot read animated ones)",
            status,
        )
    if status == NOT_AN_IMAGE:
        what = _what_it_is(data)
        what = f"{what}, not" if what else "not"
        raise ImageError(f"{name} ({len(data)} bytes) is {what} a {FORMATS_TEXT} image", status)
    if status == CORRUPT:
        index = _read_format(data)
        raise ImageError(corrupt_message(name, len(data), HEADER_FORMATS[index]), CORRUPT)
    if header.pixels > max_image_pixels:
        message = _too_many(
            name, header.pixels, header.width, header.height, header.frames, max_image_pixels
        )
        raise ImageError(message, TOO_MANY_PIXELS)
    return header


def _read_format(data):
    """The index in `HEADER_FORMATS` of the format `data` starts like, or -1."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return WEBP
    found = [i for i, signatures in enumerate(SIGNATURES) if data.startswith(signatures)]
    return found[0] if found else -1


_HEADER_BYTES = 1 << 18


def admit_files(paths: Sequence[str], max_image_pixels: int = MAX_IMAGE_PIXELS) -> None:
    """`admit` for image files, reading their headers only (the first 256 KiB; a whole
    GIF, whose frames all count, or a JPEG whose frame header lies further in).

    Raises:
      ValueError: listing up to 10 files that are missing, empty, not images, damaged
        in their header or over `max_image_pixels`, each in one line.
    """
    bad = []
    for path in paths:
        problem = path_problem(path)
        if problem:
            bad.append(f"{path} {problem}")
            continue
        with open(path, "rb") as f:
            data = f.read(_HEADER_BYTES)
            status, _ = read_header(data)
            if len(data) == _HEADER_BYTES and (status == CORRUPT or data.startswith(b"GIF")):
                data += f.read()
        try:
            admit(data, path, max_image_pixels)
        except ImageError as e:
            bad.append(str(e))
    if bad:
        listed = "\n  ".join(bad[:10])
        raise ValueError(f"{len(bad)} image file(s) refused before decoding:\n  {listed}")
