"""Feature extraction: the frozen encoder run once over every image of a dataset, its
annotation vectors written into the feature cache (`sat_tf/data/feature_cache.py` holds
the cache's format and reads it back; this module is where the images meet the model).

Each shard is written under a temporary name and renamed when complete, and the index
is rewritten (atomically) after each shard, so a run that is killed loses at most the
shard it was writing: the same command again skips the finished shards.
"""

import os
import re
import sys
import time
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from sat_tf import config as config_lib
from sat_tf.data import datasets, feature_cache, graph_admission, image_io
from sat_tf.model.encoder import ImageEncoder
from sat_tf.utils import files
from sat_tf.utils.messages import preview

_FLOAT16_MAX = float(np.finfo(np.float16).max)


def _why_bad(path: str, image_size: int, crop_fraction: float) -> str:
    try:
        image_io.load_image_file(path, image_size, crop_fraction)
    except ValueError as e:
        return str(e)
    return f"image {path!r} could not be read"


def _write_shard(path, records, encode, image_size, crop_fraction, batch_size, skip_bad, progbar):
    """Encodes `records` into the TFRecord file `path` (temp file, then rename).

    Images that cannot be read or decoded are left out; unless `skip_bad`, the shard is
    then not written at all and `_Undecodable` names them.

    Returns:
      (image ids written, [(record, reason)] of the images left out, number of values
      beyond the float16 range that were clipped).
    """
    paths = [r.image_path for r in records]
    ds = tf.data.Dataset.from_tensor_slices((np.arange(len(records), dtype=np.int64), paths))
    ds = ds.map(lambda i, p: (i, tf.io.read_file(p))).filter(
        lambda i, data: graph_admission.admits(data)  # a refused image is never decoded
    )
    ds = ds.map(
        lambda i, data: (i, image_io.decode_image(data, image_size, crop_fraction)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    ds = ds.ignore_errors().batch(batch_size).prefetch(1)
    written, overflow = [], 0
    with files.atomic_path(path) as tmp:
        with tf.io.TFRecordWriter(tmp) as writer:
            for positions, images in ds:
                features = encode(images).numpy()  # (B, L, D)
                overflow += int(np.sum(np.abs(features) > _FLOAT16_MAX))
                features = np.clip(features, -_FLOAT16_MAX, _FLOAT16_MAX).astype(np.float16)
                for position, feature in zip(positions.numpy(), features, strict=True):
                    writer.write(feature_cache.encode_example(records[position].image_id, feature))
                    written.append(int(position))
                progbar.add(len(features))
        kept = set(written)
        bad = [
            (r, _why_bad(r.image_path, image_size, crop_fraction))
            for i, r in enumerate(records)
            if i not in kept
        ]
        if bad:  # an add after the last image would print the finished bar again
            progbar.add(len(bad))
        if bad and not skip_bad:
            raise _Undecodable(bad)
    return [records[i].image_id for i in written], bad, overflow


class _Undecodable(Exception):
    """Images of a shard that cannot be decoded, when they may not be skipped."""

    def __init__(self, bad):
        super().__init__(len(bad))
        self.bad = bad


def _check_records(records) -> None:
    if not records:
        raise ValueError("no images to extract features from")
    seen, dupes = set(), []
    for r in records:
        if r.image_id in seen:
            dupes.append(r.image_id)
        seen.add(r.image_id)
    if dupes:
        raise ValueError(f"image ids listed more than once: {preview(dupes)}")


def _extract_shard(out_dir, index, shard, records, encode, geometry, skip_bad, progbar):
    """Writes shard `shard` of `records` and records it in the index (`_write_shard`).

    Args:
      geometry: (image size, crop fraction, images per encoder call).

    Raises:
      ValueError: naming the images that cannot be decoded (unless `skip_bad`).
    """
    start = time.time()
    name = feature_cache.shard_name(shard, index["num_shards"])
    try:
        ids, bad, overflow = _write_shard(
            os.path.join(out_dir, name), records, encode, *geometry, skip_bad, progbar
        )
    except _Undecodable as e:
        reasons = "\n  ".join(reason for _, reason in e.bad)
        done = sum(entry is not None for entry in index["shards"])
        raise ValueError(
            f"{len(e.bad)} image(s) of shard {name} cannot be decoded:\n  {reasons}\n"
            f"the {done} finished shard(s) in {out_dir} are kept; replace or remove the "
            "file(s) (or pass --skip_bad_images) and run again to resume"
        ) from None
    if bad:
        logging.warning(
            "features: skipped %d undecodable image(s) in %s: %s",
            *(len(bad), name, preview(r.image_path for r, _ in bad)),
        )
    if overflow:
        logging.warning(
            "features: %d value(s) in %s exceeded the float16 range and were clipped",
            *(overflow, name),
        )
    index["shards"][shard] = {
        "file": name,
        "image_ids": ids,
        "skipped": [{"image_id": r.image_id, "reason": why} for r, why in bad],
    }
    feature_cache.write_index(out_dir, index)
    seconds = time.time() - start
    logging.info(
        "features: %s done, %d images in %.1fs (%.1f images/s)",
        *(name, len(records), seconds, len(records) / max(seconds, 1e-9)),
    )


def extract_features(
    records: Sequence[datasets.Record],
    encoder_name: str,
    encoder_weights: str | None,
    image_size: int,
    out_dir: str,
    *,
    crop_fraction: float = 0.0,
    shard_size: int = 1000,
    batch_size: int = 32,
    progress: bool = True,
    skip_bad_images: bool = False,
) -> dict:
    """Runs the frozen encoder once per image and writes float16 feature shards.

    Images are preprocessed as for training (`image_io.decode_image`: shorter side
    to `image_size / crop_fraction`, centre crop, paper §5.4) and then by the backbone's
    own `preprocess_input`. A rerun with the same arguments skips the shards already
    finished; a rerun with another encoder, weights, image size, shard size or record
    list refuses.

    Args:
      records: the images, in the order they go into shards (ids must be unique).
      encoder_name: backbone name in `sat_tf.backbones.registry.REGISTRY`.
      encoder_weights: "" or None (random), "imagenet", or a weights file.
      image_size: square encoder input size.
      out_dir: the feature folder.
      crop_fraction: see `image_io.resize_and_crop`; 0 = the encoder's own.
      shard_size: images per shard.
      batch_size: images per encoder call.
      progress: show a progress bar.
      skip_bad_images: leave out images that cannot be decoded (counted, logged and
        listed in the index) instead of stopping.

    Returns:
      the index (the contents of `index.json`).

    Raises:
      ValueError: on duplicate ids, a cache made with other settings, or (unless
        skip_bad_images) an image that cannot be decoded, naming its file; the shards
        finished before it stay.
    """
    records = list(records)
    _check_records(records)
    if shard_size < 1 or batch_size < 1:
        raise ValueError(f"shard_size={shard_size} and batch_size={batch_size} must be >= 1")
    crop_fraction = crop_fraction or config_lib.encoder_crop_fraction(encoder_name)
    settings = {
        "format": feature_cache.FORMAT_VERSION,
        "encoder": encoder_name,
        "encoder_weights": encoder_weights or "",
        "image_size": image_size,
        "shard_size": shard_size,
    }
    os.makedirs(out_dir, exist_ok=True)
    index = feature_cache.start_index(out_dir, settings, records)
    for name in os.listdir(out_dir):
        # Temporary files of a killed run; `<name>.tmp<pid>` is how earlier versions named them.
        if files.is_temporary(name) or re.fullmatch(r".*\.tmp\d+", name):
            os.remove(os.path.join(out_dir, name))
    num_shards = index["num_shards"]
    todo = [i for i in range(num_shards) if not feature_cache.is_done(out_dir, index, i)]
    if not todo:
        logging.info("features: all %d shards in %s are complete", num_shards, out_dir)
        return index
    if len(todo) < num_shards:
        logging.info("features: resuming; %d of %d shards done", num_shards - len(todo), num_shards)
    if not encoder_weights:
        logging.warning("features: the %s encoder has random weights", encoder_name)
    encoder = ImageEncoder(encoder_name, image_size, encoder_weights or None)
    height, width, depth = encoder.feature_grid()
    geometry = {
        "crop_fraction": crop_fraction,
        "feature_shape": [height * width, depth],
        "grid": [height, width],
        "dtype": "float16",
    }
    feature_cache.check_settings(
        index, out_dir, **{k: v for k, v in geometry.items() if k in index}
    )
    index.update(geometry)
    feature_cache.write_index(out_dir, index)
    encode = tf.function(lambda x: encoder(x, training=False), reduce_retracing=True)
    total = sum(len(records[i * shard_size : (i + 1) * shard_size]) for i in todo)
    # Off a terminal, one plain line when done: Keras draws the bar with escapes and
    # carriage returns wherever it runs (POSIX).
    shown = 1 if sys.stdout.isatty() else 2
    progbar = keras.utils.Progbar(total, unit_name="image", verbose=shown if progress else 0)
    for shard in todo:
        shard_records = records[shard * shard_size : (shard + 1) * shard_size]
        _extract_shard(
            out_dir,
            index,
            shard,
            shard_records,
            encode,
            (image_size, crop_fraction, batch_size),
            skip_bad_images,
            progbar,
        )
    return index


def extract_for_config(config, records=None, **kwargs) -> dict:
    """Extracts features of every image of `config.dataset` into
    `feature_cache.feature_dir_of(config)`.

    Records are ordered val, test, train (each in file order), so that the validation
    images the training loop captions every epoch sit in the first shards.

    Args:
      config: a `sat_tf.config.Config`.
      records: the dataset's records (`datasets.load_records` of the config) when the
        caller has read them already; None reads them.
      **kwargs: passed to `extract_features` (shard_size, batch_size, progress,
        skip_bad_images).

    Returns:
      the index.
    """
    if records is None:
        records = datasets.load_records(
            config.dataset, config.data_dir, captions=config.captions, on_missing=config.on_missing
        )
    records = sorted(records, key=lambda r: feature_cache.SPLIT_ORDER[r.split])
    return extract_features(
        records,
        config.encoder,
        config.encoder_weights,
        config.image_size,
        feature_cache.feature_dir_of(config),
        crop_fraction=config.effective_crop_fraction,
        **kwargs,
    )
