"""tf.data pipelines: image decoding, caption ids, batches of one caption length.

Training batches hold captions of a single length (paper §4.3): elements are grouped by
length with `bucket_by_sequence_length`, one bucket per length, and the buckets are
shuffled against each other by the shuffle before grouping. This module never imports
the model.
"""

import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from absl import logging
from PIL import Image

from sat_tf.data import vocab as vocab_lib

AUTOTUNE = tf.data.AUTOTUNE
SHUFFLE_BYTES = 2 * 1024**3
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
    shape = tf.cast(tf.shape(image)[-3:-1], tf.float32)
    scale = (image_size / crop_fraction) / tf.reduce_min(shape)
    new_size = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), image_size)
    image = tf.image.resize(image, new_size, antialias=True)
    top = (new_size[0] - image_size) // 2
    left = (new_size[1] - image_size) // 2
    image = image[..., top : top + image_size, left : left + image_size, :]
    return tf.ensure_shape(image, [*image.shape[:-3], image_size, image_size, 3])


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


def _caption_table(records, vocab, max_length):
    """Encodes every caption once: (ragged ids per caption, captions per image).

    Captions longer than `max_length` words are cut to it; their number is logged.
    """
    tokens = vocab_lib.tokenize(tf.constant([c for r in records for c in r.captions], tf.string))
    ids = vocab.encode_words(tokens, max_length=max_length)
    words = tokens.row_lengths()
    over = int(tf.math.count_nonzero(words > max_length))
    if over:
        logging.warning(
            "%d of %d training captions are longer than --max_caption_length=%d words "
            "(the longest has %d) and are cut to it",
            over,
            len(words),
            max_length,
            int(tf.reduce_max(words)),
        )
    per_image = np.array([len(r.captions) for r in records], np.int64)
    return ids, per_image


def image_dataset(paths, image_size, crop_fraction):
    """Dataset of decoded images, one per path, in order."""
    paths = tf.data.Dataset.from_tensor_slices(tf.constant(list(paths), tf.string))
    return paths.map(
        lambda p: decode_image(tf.io.read_file(p), image_size, crop_fraction),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,
    )


def train_dataset(
    records,
    vocab,
    *,
    image_size,
    crop_fraction,
    batch_size,
    max_length,
    seed=0,
    features=None,
    cache_images=True,
    steps_per_epoch=None,
    first_epoch=0,
    epochs=None,
):
    """Training batches of (image or features, caption) of one caption length.

    Args:
      records: training `Record`s.
      vocab: `Vocab` for the caption ids.
      image_size, crop_fraction: see `decode_image`.
      batch_size: captions per batch.
      max_length: captions are cut to this many words.
      seed: shuffle seed.
      features: optional dataset of (L, D) feature tensors in record order, used
        instead of images.
      cache_images: keep decoded images in memory after the first epoch.
      steps_per_epoch: batches in a training epoch. When given (with `epochs`), epoch e
        holds the first `steps_per_epoch` batches of a stream shuffled with seeds made
        from (seed, e) alone, so a run resumed at `first_epoch` sees the batches that an
        uninterrupted run sees from that epoch on. When None, one endless stream
        shuffled from `seed`.
      first_epoch: the epoch the returned dataset starts with (with `steps_per_epoch`).
      epochs: the epoch it ends before (with `steps_per_epoch`).

    Images (or feature maps) are shuffled in a buffer of at most `SHUFFLE_BYTES` (the
    whole set for shapes; about 5,000 VGG feature maps for COCO).

    Returns:
      `tf.data.Dataset` of dicts {"image" (B, S, S, 3) | "features" (B, L, D),
      "caption" (B, T + 2) int32 framed by `<start>` and `<end>`}.
    """
    ids, per_image = _caption_table(records, vocab, max_length)
    key = "features" if features is not None else "image"
    inputs = features
    if inputs is None:
        inputs = image_dataset([r.image_path for r in records], image_size, crop_fraction)
        if cache_images:
            inputs = inputs.cache()
    starts = np.concatenate([[0], np.cumsum(per_image)[:-1]])
    index = tf.data.Dataset.from_tensor_slices((starts, per_image))
    element_bytes = 4 * np.prod(inputs.element_spec.shape.as_list())
    buffer = int(min(len(records), max(1024, SHUFFLE_BYTES // element_bytes)))
    boundaries = list(range(3, max_length + 3))

    def captions_of(x, span):
        start, count = span
        rows = tf.data.Dataset.range(start, start + count)
        return rows.map(lambda row: {key: x, "caption": ids[row]})

    def stream(image_seed, caption_seed):
        ds = tf.data.Dataset.zip(inputs, index).shuffle(
            buffer, seed=image_seed, reshuffle_each_iteration=True
        )
        ds = ds.flat_map(captions_of).repeat()
        ds = ds.shuffle(min(16 * batch_size, 4096), seed=caption_seed)
        return ds.bucket_by_sequence_length(
            lambda e: tf.shape(e["caption"])[0],
            bucket_boundaries=boundaries,
            bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
            drop_remainder=True,
        )

    if steps_per_epoch is None:
        return stream(seed, seed + 1).prefetch(AUTOTUNE)
    if epochs is None:
        raise ValueError("train_dataset: steps_per_epoch needs epochs (the epoch to end before)")
    ds = None
    for epoch in range(first_epoch, epochs):
        epoch_seed = seed * 2**20 + 2 * epoch
        part = stream(epoch_seed, epoch_seed + 1).take(steps_per_epoch)
        ds = part if ds is None else ds.concatenate(part)
    if ds is None:
        raise ValueError(f"no epochs to train: the run finished {first_epoch} of {epochs}")
    return ds.prefetch(AUTOTUNE)


def eval_dataset(records, *, image_size, crop_fraction, batch_size, features=None):
    """Batches of images (or features) in record order, one element per image.

    Returns:
      `tf.data.Dataset` of dicts {"image" | "features", "index" (B,) int64 record index}.
    """
    key = "features" if features is not None else "image"
    inputs = features
    if inputs is None:
        inputs = image_dataset([r.image_path for r in records], image_size, crop_fraction)
    index = tf.data.Dataset.range(len(records))
    ds = tf.data.Dataset.zip(inputs, index).map(lambda x, i: {key: x, "index": i})
    return ds.batch(batch_size).prefetch(AUTOTUNE)


def teacher_forced_dataset(records, vocab, *, image_size, crop_fraction, batch_size, max_length):
    """Validation batches for the teacher-forced loss: every caption, padded, in order."""
    ids, per_image = _caption_table(records, vocab, max_length)
    images = image_dataset([r.image_path for r in records], image_size, crop_fraction)
    ds = tf.data.Dataset.zip(images, tf.data.Dataset.from_tensor_slices(per_image))
    ds = ds.flat_map(lambda x, n: tf.data.Dataset.from_tensors(x).repeat(n))
    captions = tf.data.Dataset.from_tensor_slices(ids)
    ds = tf.data.Dataset.zip(ds, captions).map(lambda x, c: {"image": x, "caption": c})
    return ds.padded_batch(batch_size, padding_values={"image": 0.0, "caption": 0})
