"""Image bytes to model input: admission (the pixel count read from the header, before
anything is decoded), decoding (JPEG, PNG, GIF, BMP, WebP), EXIF orientation read with
TensorFlow ops, the paper's resize and centre crop (§5.4), and checks that name an
unreadable file. One `decode_image` serves training, captioning and export; one admission
rule (`read_header` here, `graph_admission.read_header_tf` in a graph, the same walk) guards every
path that decodes bytes from outside: a small file that declares a huge image (a
"decompression bomb") is refused with a one-line message before a pixel is allocated.
"""

import dataclasses
from collections.abc import Sequence

import tensorflow as tf
from PIL import Image

from sat_tf.data.image_files import MAX_IMAGE_PIXELS, check_path, path_problem

_FORMATS = {"JPEG", "MPO", "PNG", "GIF", "BMP", "WEBP"}

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
_EXIF_SEARCH_BYTES = 1 << 17
_EXIF_MAX_ENTRIES = 64
_ORIENTATION_TAG = 0x0112
_SHORT = 3
# Per orientation 0..8: (transpose, flip left-right, flip up-down) that sets the image
# upright, applied in that order; 0 (no tag) and 1 are the identity. 6 and 8 are rotations
# by 90 degrees clockwise and counter-clockwise, 3 by 180, 5 and 7 are the two diagonal
# mirrors (PIL's TRANSPOSE and TRANSVERSE).
_UPRIGHT = (
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


def exif_orientation(data):
    """The EXIF orientation tag (1..8) of JPEG bytes; 1 when there is none.

    Finds the first `Exif\\0\\0` APP1 segment that starts within the first 128 KiB, reads
    its TIFF byte order and IFD0 offset, and looks for tag 0x0112 (one SHORT) among the
    first 64 IFD0 entries. Every read is checked against the segment's bounds, so
    non-JPEG bytes and a missing, truncated or malformed EXIF block give 1, never an
    error. Core TF ops only: works in a `tf.function`, `tf.data` and an exported graph.

    Args:
      data: scalar string tensor of encoded bytes.

    Returns:
      int64 scalar tensor in 1..8.
    """
    data = tf.reshape(data, [])
    head = tf.strings.substr(data, 0, _EXIF_SEARCH_BYTES)
    pieces = tf.strings.split(head, b"Exif\0\0", maxsplit=1)
    start = tf.strings.length(pieces[0]) - 4
    # Offsets below count from the APP1 marker: length at 2, TIFF header at 10. Reads
    # past the segment's bytes land in the zero padding or are clipped, never fail.
    segment = tf.strings.substr(data, tf.maximum(start, 0), 2 + 0xFFFF)
    segment = tf.pad(tf.io.decode_raw(segment, tf.uint8), [[0, 16]])
    size = tf.size(segment, out_type=tf.int64) - 16

    def uint(pos, width, little=True):
        """Unsigned integers of `width` bytes at segment offsets `pos` (any shape)."""
        place = tf.range(width, dtype=tf.int64)
        pos = tf.clip_by_value(tf.cast(pos, tf.int64)[..., None] + place, 0, size + 15)
        weights = tf.where(little, 256**place, 256 ** (width - 1 - place))
        return tf.reduce_sum(tf.cast(tf.gather(segment, pos), tf.int64) * weights, axis=-1)

    tiff = 10
    end = 2 + uint(2, 2, little=False)
    little = tf.equal(uint(tiff, 2), 0x4949)
    ifd = tiff + uint(tiff + 4, 4, little)
    valid = (
        tf.equal(tf.strings.substr(data, 0, 2), b"\xff\xd8")
        & (tf.size(pieces) == 2)
        & (start >= 0)
        & tf.equal(uint(0, 2, little=False), 0xFFE1)
        & (end <= size)
        & (little | tf.equal(uint(tiff, 2), 0x4D4D))
        & tf.equal(uint(tiff + 2, 2, little), 42)
        & (ifd >= tiff + 8)
    )
    index = tf.range(_EXIF_MAX_ENTRIES, dtype=tf.int64)
    entry = ifd + 2 + 12 * index  # (64,)
    value = uint(entry + 8, 2, little)  # a SHORT sits in the first 2 of the 4 value bytes
    hit = (
        (index < uint(ifd, 2, little))
        & (entry + 12 <= end)
        & tf.equal(uint(entry, 2, little), _ORIENTATION_TAG)
        & tf.equal(uint(entry + 2, 2, little), _SHORT)
        & tf.equal(uint(entry + 4, 4, little), 1)
        & (value >= 1)
        & (value <= 8)
    )
    first = tf.argmax(tf.cast(hit, tf.int32), output_type=tf.int64)
    return tf.where(valid & tf.reduce_any(hit), value[first], tf.constant(1, tf.int64))


def orient_upright(image, orientation):
    """Turns (H, W, C) pixels stored with an EXIF orientation upright.

    Args:
      image: (H, W, C) tensor.
      orientation: scalar integer tensor in 1..8, e.g. from `exif_orientation`.

    Returns:
      the upright image: (H, W, C) for orientations 1..4, (W, H, C) for 5..8.
    """
    transpose, flip_lr, flip_ud = tf.unstack(tf.gather(tf.constant(_UPRIGHT), orientation))
    image = tf.cond(transpose, lambda: tf.transpose(image, [1, 0, 2]), lambda: image)
    image = tf.cond(flip_lr, lambda: tf.reverse(image, [1]), lambda: image)
    return tf.cond(flip_ud, lambda: tf.reverse(image, [0]), lambda: image)


def decode_upright(data):
    """Encoded image bytes -> (H, W, 3) uint8 RGB pixels, upright, at their stored size.

    Accepts JPEG (MPO: the first picture), PNG, GIF (first frame), BMP and WebP.
    Grayscale is replicated to three channels, an alpha channel is dropped, 16-bit PNGs
    are scaled to 8 bits and a JPEG is turned by its EXIF orientation (`exif_orientation`).

    Args:
      data: scalar string tensor of encoded bytes.

    Returns:
      uint8 tensor (H, W, 3); H and W are swapped for EXIF orientations 5..8.
    """
    image = tf.io.decode_image(data, expand_animations=False, dtype=tf.uint8)
    image = tf.cond(
        tf.shape(image)[-1] < 3,
        lambda: tf.repeat(image[..., :1], 3, axis=-1),
        lambda: image[..., :3],
    )
    image = orient_upright(image, exif_orientation(data))
    return tf.ensure_shape(image, [None, None, 3])


def decode_image(data, image_size, crop_fraction=224 / 256):
    """Encoded image bytes -> (image_size, image_size, 3) float32 pixels in [0, 255].

    Decodes with `decode_upright` (any format it reads, converted to upright RGB). The
    shorter side is resized to `image_size / crop_fraction` and the centre `image_size`
    square is kept (paper §5.4: 256 then 224); with crop_fraction 1.0 the image is
    resized to the square directly.

    Args:
      data: scalar string tensor of encoded bytes.
      image_size: output side length.
      crop_fraction: share of the resized shorter side that the crop keeps.

    Returns:
      float32 tensor (image_size, image_size, 3).
    """
    return resize_and_crop(decode_upright(data), image_size, crop_fraction)


def resize_and_crop(image, image_size, crop_fraction=224 / 256):
    """The resize and centre crop of `decode_image`, for one image or a batch.

    Args:
      image: (H, W, 3) or (B, H, W, 3) pixels in [0, 255], any real or integer dtype.
      image_size: output side length.
      crop_fraction: share of the resized shorter side that the crop keeps.

    Returns:
      float32 tensor (image_size, image_size, 3), or (B, image_size, image_size, 3).
    """
    image = tf.cast(image, tf.float32)
    if crop_fraction >= 1.0:
        return tf.image.resize(image, [image_size, image_size], antialias=True)
    new_size, top, left = crop_window(tf.shape(image)[-3:-1], image_size, crop_fraction)
    image = tf.image.resize(image, new_size, antialias=True)
    image = image[..., top : top + image_size, left : left + image_size, :]
    return tf.ensure_shape(image, [*image.shape[:-3], image_size, image_size, 3])


def crop_window(shape, image_size, crop_fraction=224 / 256):
    """Where `resize_and_crop` cuts its square: the size the image is resized to first
    and the corner of the kept `image_size` square in the resized image.

    The resized image spans the same frame as the original (`tf.image.resize`), so the
    square shows the original's pixels `[left, left + image_size) * width / new_width`
    across and likewise down.

    Args:
      shape: int (2,) tensor or sequence, (height, width) of the image.
      image_size, crop_fraction: see `resize_and_crop`.

    Returns:
      (new_size int32 (2,) (height, width), top, left) int32 tensors; for crop_fraction
      1.0 new_size is (image_size, image_size) and top = left = 0.
    """
    if crop_fraction >= 1.0:
        return tf.constant([image_size, image_size]), tf.constant(0), tf.constant(0)
    shape = tf.cast(shape, tf.float32)
    scale = (image_size / crop_fraction) / tf.reduce_min(shape)
    new_size = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), image_size)
    top = (new_size[0] - image_size) // 2
    left = (new_size[1] - image_size) // 2
    return new_size, top, left


def load_image_file(path, image_size, crop_fraction=224 / 256, max_image_pixels=MAX_IMAGE_PIXELS):
    """Reads one image file, admits it (`admit`) and decodes it with `decode_image`.

    Args:
      path: image file.
      image_size, crop_fraction: see `decode_image`.
      max_image_pixels: see `admit`.

    Returns:
      float32 tensor (image_size, image_size, 3).

    Raises:
      ValueError: naming the path when it is missing or a directory; `ImageError` (a
        ValueError) when it is empty, not a JPEG / PNG / GIF / BMP / WebP image,
        truncated or corrupt, or over `max_image_pixels`.
    """
    check_path(path)
    with open(path, "rb") as f:
        data = f.read()
    return decode_admitted(data, str(path), image_size, crop_fraction, max_image_pixels)


def check_image_files(paths: Sequence[str], max_image_pixels: int = MAX_IMAGE_PIXELS) -> None:
    """Raises ValueError naming every image file that cannot be read or decoded.

    Run before training so that a bad file stops the run at once, not mid-epoch. Every
    image is decoded in full (a truncated JPEG passes a header check). MPO files (the
    multi-picture JPEGs of many cameras) pass: `decode_image` reads their first picture.

    Args:
      paths: image files.
      max_image_pixels: see `admit`; a file over it is named, never decoded.

    Raises:
      ValueError: listing up to 10 bad files, each with its path and what is wrong.
    """
    bad = []
    for path in paths:
        problem = path_problem(path)
        if problem:
            bad.append(f"{path}: {problem}")
            continue
        try:
            with open(path, "rb") as f:
                admit(f.read(), path, max_image_pixels)
        except ImageError as e:
            bad.append(str(e))
            continue
        try:
            with Image.open(path) as image:
                if image.format not in _FORMATS:
                    raise ValueError(f"format {image.format} is not one of {sorted(_FORMATS)}")
                image.load()
        except Exception as e:  # noqa: BLE001 - every failure is reported by name
            bad.append(f"{path}: {type(e).__name__}: {e}")
    if bad:
        listed = "\n  ".join(bad[:10])
        raise ValueError(f"{len(bad)} image file(s) cannot be decoded:\n  {listed}")


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


def _corrupt(name, size, fmt):
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
        raise ImageError(_corrupt(name, len(data), HEADER_FORMATS[index]), CORRUPT)
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


def decode_admitted(
    data: bytes,
    name: str,
    image_size: int,
    crop_fraction: float = 224 / 256,
    max_image_pixels: int = MAX_IMAGE_PIXELS,
):
    """`admit`, then `decode_image`: the one way bytes from outside become pixels in
    Python (the API, the commands, evaluation).

    Returns:
      float32 tensor (image_size, image_size, 3).

    Raises:
      ImageError: as `admit`, or `CORRUPT` when the decoder fails (a truncated file),
        worded as the demo words it, never TensorFlow's message.
    """
    header = admit(data, name, max_image_pixels)
    try:
        return decode_image(tf.constant(data), image_size, crop_fraction)
    except tf.errors.OpError:
        raise ImageError(_corrupt(name, len(data), header.format), CORRUPT) from None
