"""Image bytes to model input with TensorFlow: decoding (JPEG, PNG, GIF, BMP, WebP),
EXIF orientation read with TensorFlow ops, the paper's resize and centre crop (§5.4), and
checks that name an unreadable file. One `decode_image` serves training, captioning and
export; one admission rule (`image_header.read_header` in Python,
`graph_admission.read_header_tf` in a graph, the same walk) guards every path that
decodes bytes from outside: a small file that declares a huge image (a "decompression
bomb") is refused with a one-line message before a pixel is allocated. The header's
names (`admit`, `ImageError`, the statuses ...) are importable from here too.
"""

from collections.abc import Sequence

import tensorflow as tf
from PIL import Image

from sat_tf.data.image_files import MAX_IMAGE_PIXELS, check_path, path_problem
from sat_tf.data.image_header import (  # noqa: F401 (the admission rule's names, here too)
    CORRUPT,
    EMPTY,
    EXIF_MAX_ENTRIES,
    EXIF_SEARCH_BYTES,
    FORMATS_TEXT,
    HEADER_FORMATS,
    MAX_STEPS,
    NOT_AN_IMAGE,
    OK,
    ORIENTATION_TAG,
    SHORT,
    SIGNATURES,
    STATUS_NAMES,
    TOO_MANY_PIXELS,
    UPRIGHT,
    WEBP,
    ImageError,
    ImageHeader,
    admit,
    admit_files,
    corrupt_message,
    read_header,
)

_FORMATS = {"JPEG", "MPO", "PNG", "GIF", "BMP", "WEBP"}


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
    head = tf.strings.substr(data, 0, EXIF_SEARCH_BYTES)
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
    index = tf.range(EXIF_MAX_ENTRIES, dtype=tf.int64)
    entry = ifd + 2 + 12 * index  # (64,)
    value = uint(entry + 8, 2, little)  # a SHORT sits in the first 2 of the 4 value bytes
    hit = (
        (index < uint(ifd, 2, little))
        & (entry + 12 <= end)
        & tf.equal(uint(entry, 2, little), ORIENTATION_TAG)
        & tf.equal(uint(entry + 2, 2, little), SHORT)
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
    transpose, flip_lr, flip_ud = tf.unstack(tf.gather(tf.constant(UPRIGHT), orientation))
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
        raise ImageError(corrupt_message(name, len(data), header.format), CORRUPT) from None
