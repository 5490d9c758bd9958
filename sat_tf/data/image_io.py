"""Image bytes to model input: decoding (JPEG, PNG, GIF, BMP, WebP), EXIF orientation
read with TensorFlow ops, the paper's resize and centre crop (§5.4), and checks that name
an unreadable file. One `decode_image` serves training, captioning and export.
"""

import os
from collections.abc import Sequence

import tensorflow as tf
from PIL import Image

_FORMATS = {"JPEG", "MPO", "PNG", "GIF", "BMP", "WEBP"}

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


def _path_problem(path):
    """Why `path` cannot be an image file (missing, a directory), or None."""
    if not os.path.exists(path):
        return "does not exist"
    if os.path.isdir(path):
        return "is a directory, not a file"
    return None


def load_image_file(path, image_size, crop_fraction=224 / 256):
    """Reads and decodes one image file with `decode_image`.

    Args:
      path: image file.
      image_size, crop_fraction: see `decode_image`.

    Returns:
      float32 tensor (image_size, image_size, 3).

    Raises:
      ValueError: naming the path when it is missing, a directory, empty, or not a
        decodable JPEG / PNG / GIF / BMP / WebP image.
    """
    problem = _path_problem(path)
    if problem:
        raise ValueError(f"image {path!r} {problem}")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise ValueError(f"image {path!r} is empty (0 bytes)")
    try:
        return decode_image(tf.constant(data), image_size, crop_fraction)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
        reason = e.message.strip().splitlines()[0]
        raise ValueError(f"image {path!r} cannot be decoded: {reason}") from None


def check_image_files(paths: Sequence[str]) -> None:
    """Raises ValueError naming every image file that cannot be read or decoded.

    Run before training so that a bad file stops the run at once, not mid-epoch. Every
    image is decoded in full (a truncated JPEG passes a header check). MPO files (the
    multi-picture JPEGs of many cameras) pass: `decode_image` reads their first picture.

    Args:
      paths: image files.

    Raises:
      ValueError: listing up to 10 bad files, each with its path and what is wrong.
    """
    bad = []
    for path in paths:
        problem = _path_problem(path)
        if problem:
            bad.append(f"{path}: {problem}")
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
