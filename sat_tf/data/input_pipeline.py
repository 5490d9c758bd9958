"""tf.data pipelines: images (`image_io.decode_image`) or cached features, caption ids,
batches of one caption length.

Training batches hold captions of a single length (paper §4.3): elements are grouped by
length with `bucket_by_sequence_length`, one bucket per length, and the buckets are
shuffled against each other by the shuffle before grouping. This module never imports
the model.
"""

import numpy as np
import tensorflow as tf
from absl import logging

from sat_tf.data import image_io
from sat_tf.data import vocab as vocab_lib

AUTOTUNE = tf.data.AUTOTUNE
SHUFFLE_BYTES = 2 * 1024**3


def _caption_table(records, vocab, max_words):
    """Encodes every caption once: (ragged ids per caption, captions per image).

    Captions longer than `max_words` words are cut to it; their number is logged.
    """
    tokens = vocab_lib.tokenize(tf.constant([c for r in records for c in r.captions], tf.string))
    ids = vocab.encode_words(tokens, max_words=max_words)
    words = tokens.row_lengths()
    over = int(tf.math.count_nonzero(words > max_words))
    if over:
        logging.warning(
            "%d of %d training captions are longer than --max_caption_length=%d words "
            "(the longest has %d) and are cut to it",
            over,
            len(words),
            max_words,
            int(tf.reduce_max(words)),
        )
    per_image = np.array([len(r.captions) for r in records], np.int64)
    return ids, per_image


def image_dataset(paths, image_size, crop_fraction):
    """Dataset of decoded images, one per path, in order.

    Raises:
      ValueError: naming the files that admission refuses (`image_io.admit_files`: read
        from their headers, before anything is decoded).
    """
    paths = list(paths)
    image_io.admit_files(paths)
    paths = tf.data.Dataset.from_tensor_slices(tf.constant(paths, tf.string))
    return paths.map(
        lambda p: image_io.decode_image(tf.io.read_file(p), image_size, crop_fraction),
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
    max_words,
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
      max_words: captions are cut to this many words.
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
    ids, per_image = _caption_table(records, vocab, max_words)
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
    boundaries = list(range(3, max_words + 3))

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


def image_batches(
    records,
    *,
    image_size,
    crop_fraction,
    batch_size,
    seed,
    steps_per_epoch,
    first_epoch,
    epochs,
    features=None,
):
    """Shuffled batches of images (or features) with their record index, one element per
    image: what self-critical training samples captions for.

    Epoch e is shuffled with a seed made from (seed, e) alone, so that a run resumed at
    `first_epoch` sees the batches an uninterrupted run sees (as `train_dataset`).

    Returns:
      `tf.data.Dataset` of dicts {"image" (B, S, S, 3) | "features" (B, L, D),
      "image_index" (B,) int32}.
    """
    key = "features" if features is not None else "image"
    inputs = features
    if inputs is None:
        inputs = image_dataset([r.image_path for r in records], image_size, crop_fraction)
    index = tf.data.Dataset.range(len(records)).map(lambda i: tf.cast(i, tf.int32))
    pairs = tf.data.Dataset.zip(inputs, index).map(lambda x, i: {key: x, "image_index": i})
    element_bytes = 4 * np.prod(inputs.element_spec.shape.as_list())
    buffer = int(min(len(records), max(1024, SHUFFLE_BYTES // element_bytes)))
    if first_epoch >= epochs:
        raise ValueError(f"no epochs to train: the run finished {first_epoch} of {epochs}")
    ds = None
    for epoch in range(first_epoch, epochs):
        part = pairs.shuffle(buffer, seed=seed * 2**20 + 2 * epoch).repeat()
        part = part.batch(batch_size, drop_remainder=True).take(steps_per_epoch)
        ds = part if ds is None else ds.concatenate(part)
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


def teacher_forced_dataset(records, vocab, *, image_size, crop_fraction, batch_size, max_words):
    """Validation batches for the teacher-forced loss: every caption, padded, in order."""
    ids, per_image = _caption_table(records, vocab, max_words)
    images = image_dataset([r.image_path for r in records], image_size, crop_fraction)
    ds = tf.data.Dataset.zip(images, tf.data.Dataset.from_tensor_slices(per_image))
    ds = ds.flat_map(lambda x, n: tf.data.Dataset.from_tensors(x).repeat(n))
    captions = tf.data.Dataset.from_tensor_slices(ids)
    ds = tf.data.Dataset.zip(ds, captions).map(lambda x, c: {"image": x, "caption": c})
    return ds.padded_batch(batch_size, padding_values={"image": 0.0, "caption": 0})
