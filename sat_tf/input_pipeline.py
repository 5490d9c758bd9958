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
from PIL import Image

AUTOTUNE = tf.data.AUTOTUNE
SHUFFLE_BYTES = 2 * 1024**3
_FORMATS = {"JPEG", "PNG", "GIF", "BMP", "WEBP"}


def decode_image(data, image_size, crop_fraction=224 / 256):
    """Encoded image bytes -> (image_size, image_size, 3) float32 pixels in [0, 255].

    Accepts JPEG, PNG, GIF (first frame), BMP and WebP. Grayscale is replicated to three
    channels, an alpha channel is dropped and 16-bit PNGs are scaled to 8 bits. The
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
    image = tf.io.decode_image(data, expand_animations=False, dtype=tf.uint8)
    image = tf.cond(
        tf.shape(image)[-1] < 3,
        lambda: tf.repeat(image[..., :1], 3, axis=-1),
        lambda: image[..., :3],
    )
    image = tf.cast(tf.ensure_shape(image, [None, None, 3]), tf.float32)
    return resize_and_crop(image, image_size, crop_fraction)


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


def load_image_file(path, image_size, crop_fraction=224 / 256):
    """Reads and decodes one image file with `decode_image`.

    Raises:
      ValueError: naming the path when it is missing, a directory, or not a decodable
        JPEG / PNG / GIF / BMP image.
    """
    if not os.path.exists(path):
        raise ValueError(f"image {path!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"image {path!r} is a directory, not a file")
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
    image is decoded in full (a truncated JPEG passes a header check).
    """
    bad = []
    for path in paths:
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
    """Encodes every caption once: (flat ids, row splits per caption, captions per image)."""
    texts = [c for r in records for c in r.captions]
    ids = vocab.encode(tf.constant(texts, tf.string), max_length=max_length)
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
):
    """Infinite training batches of (image or features, caption) of one caption length.

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
    ds = tf.data.Dataset.zip(inputs, index).shuffle(
        buffer, seed=seed, reshuffle_each_iteration=True
    )

    def captions_of(x, span):
        start, count = span
        rows = tf.data.Dataset.range(start, start + count)
        return rows.map(lambda row: {key: x, "caption": ids[row]})

    ds = ds.flat_map(captions_of).repeat()
    ds = ds.shuffle(min(16 * batch_size, 4096), seed=seed + 1)
    boundaries = list(range(3, max_length + 3))
    ds = ds.bucket_by_sequence_length(
        lambda e: tf.shape(e["caption"])[0],
        bucket_boundaries=boundaries,
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        drop_remainder=True,
    )
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
