"""The feature cache: encoder outputs of every image, computed once and read by training.

The frozen encoder (paper §4.3: VGG19 pretrained on ImageNet, not fine-tuned) gives the
same annotation vectors `a` for an image in every epoch, so `extract_features` runs it
once per image and stores the (L, D) map as float16 in TFRecord shards:

    <feature_dir>/shard-00000-of-00124.tfrecord   tf.train.Example per image:
                                                  "image_id" bytes, "features" bytes
                                                  (L * D float16, little-endian, row-major
                                                  (L, D)), "shape" int64 [L, D]
    <feature_dir>/index.json                      encoder, weights, image size, (L, D),
                                                  grid, the fingerprint of the record list
                                                  and, per finished shard, its image ids

Shard i holds records [i * shard_size, (i + 1) * shard_size). Each shard is written under
a temporary name and renamed when complete, and `index.json` is rewritten (atomically)
after each shard, so a run that is killed loses at most the shard it was writing: the
same command again skips the finished shards. `feature_dataset` streams the shards back
in record order without holding them in memory.
"""

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from sat_tf import config as config_lib
from sat_tf import files
from sat_tf.data import datasets, image_io
from sat_tf.messages import preview
from sat_tf.model.encoder import ImageEncoder, crop_fraction_of, get_spec

INDEX_FILE = "index.json"
FORMAT_VERSION = 1
SPLIT_ORDER = {"val": 0, "test": 1, "train": 2}
_CHECKED = ("format", "encoder", "encoder_weights", "image_size", "shard_size")
_FLOAT16_MAX = float(np.finfo(np.float16).max)


def default_feature_dir(config) -> str:
    """`<derived_dir>/features_<encoder>`, where `--feature_dir=''` puts the shards."""
    return os.path.join(config_lib.derived_dir(config), f"features_{config.encoder}")


def feature_dir_of(config) -> str:
    """The feature folder of a `Config`: `--feature_dir`, else the default."""
    return config.feature_dir or default_feature_dir(config)


def shard_name(shard: int, num_shards: int) -> str:
    return f"shard-{shard:05d}-of-{num_shards:05d}.tfrecord"


def records_fingerprint(records: Sequence[datasets.Record]) -> str:
    """Short hash of the ordered (image id, file name) list; shard contents depend on it."""
    digest = hashlib.sha256()
    for r in records:
        digest.update(f"{r.image_id}\t{os.path.basename(r.image_path)}\n".encode())
    return digest.hexdigest()[:16]


def read_index(feature_dir: str) -> dict:
    """Reads `<feature_dir>/index.json`.

    Raises:
      ValueError: when it is absent (naming the command that writes it) or unreadable.
    """
    path = os.path.join(feature_dir, INDEX_FILE)
    if not os.path.exists(path):
        raise ValueError(
            f"no feature cache in {feature_dir} ({INDEX_FILE} is missing); run "
            "scripts/extract_features.py with the same --dataset, --data_dir, --encoder, "
            "--encoder_weights, --image_size and --feature_dir first"
        )
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read feature index {path}: {e}") from e


def _write_index(feature_dir: str, index: dict) -> None:
    files.write_json(os.path.join(feature_dir, INDEX_FILE), index)


def _differences(saved: dict, wanted: dict, keys) -> list[str]:
    return [
        f"{key}: the cache has {saved.get(key)!r}, this run {wanted[key]!r}"
        for key in keys
        if saved.get(key) != wanted[key]
    ]


def check_settings(index: dict, feature_dir: str, **settings) -> None:
    """Raises ValueError naming every setting (encoder, encoder_weights, image_size ...)
    whose value in the index differs from the one given, with both values."""
    diff = _differences(index, settings, settings)
    if diff:
        raise ValueError(
            f"the features in {feature_dir} were made with other settings:\n  "
            + "\n  ".join(diff)
            + "\nuse the settings of the cache, another --feature_dir, or extract again"
        )


def _is_done(feature_dir: str, index: dict, shard: int) -> bool:
    entry = index["shards"][shard]
    return entry is not None and os.path.exists(os.path.join(feature_dir, entry["file"]))


def _start_index(feature_dir, settings, records) -> dict:
    """The existing index if it was made with the same settings and records, else a new one."""
    path = os.path.join(feature_dir, INDEX_FILE)
    num_shards = math.ceil(len(records) / settings["shard_size"])
    fingerprint = records_fingerprint(records)
    if os.path.exists(path):
        index = read_index(feature_dir)
        diff = _differences(index, settings, _CHECKED)
        if index.get("records_fingerprint") != fingerprint:
            diff.append(
                f"records: the cache was made from {index.get('num_records')} images "
                f"(fingerprint {index.get('records_fingerprint')}), this run has "
                f"{len(records)} (fingerprint {fingerprint})"
            )
        if diff:
            raise ValueError(
                f"{feature_dir} holds features made with other settings:\n  "
                + "\n  ".join(diff)
                + f"\nuse another --feature_dir, or delete {feature_dir} to extract again"
            )
        return index
    return {
        **settings,
        "num_records": len(records),
        "records_fingerprint": fingerprint,
        "num_shards": num_shards,
        "shards": [None] * num_shards,
    }


def _example(image_id: str, features: np.ndarray) -> bytes:
    feature = {
        "image_id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_id.encode()])),
        "features": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[features.astype("<f2").tobytes()])
        ),
        "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(features.shape))),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


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
    ds = ds.map(
        lambda i, p: (
            i,
            image_io.decode_image(tf.io.read_file(p), image_size, crop_fraction),
        ),
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
                    writer.write(_example(records[position].image_id, feature))
                    written.append(int(position))
                progbar.add(len(features))
        kept = set(written)
        bad = [
            (r, _why_bad(r.image_path, image_size, crop_fraction))
            for i, r in enumerate(records)
            if i not in kept
        ]
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
    name = shard_name(shard, index["num_shards"])
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
    _write_index(out_dir, index)
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
      encoder_name: backbone name in `encoder.REGISTRY`.
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
    crop_fraction = crop_fraction or get_spec(encoder_name).crop_fraction
    settings = {
        "format": FORMAT_VERSION,
        "encoder": encoder_name,
        "encoder_weights": encoder_weights or "",
        "image_size": image_size,
        "shard_size": shard_size,
    }
    os.makedirs(out_dir, exist_ok=True)
    index = _start_index(out_dir, settings, records)
    for name in os.listdir(out_dir):
        # Temporary files of a killed run; `<name>.tmp<pid>` is how earlier versions named them.
        if files.is_temporary(name) or re.fullmatch(r".*\.tmp\d+", name):
            os.remove(os.path.join(out_dir, name))
    num_shards = index["num_shards"]
    todo = [i for i in range(num_shards) if not _is_done(out_dir, index, i)]
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
    check_settings(index, out_dir, **{k: v for k, v in geometry.items() if k in index})
    index.update(geometry)
    _write_index(out_dir, index)
    encode = tf.function(lambda x: encoder(x, training=False), reduce_retracing=True)
    total = sum(len(records[i * shard_size : (i + 1) * shard_size]) for i in todo)
    progbar = keras.utils.Progbar(total, unit_name="image", verbose=1 if progress else 0)
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


def extract_for_config(config, **kwargs) -> dict:
    """Extracts features of every image of `config.dataset` into `feature_dir_of(config)`.

    Records are ordered val, test, train (each in file order), so that the validation
    images the training loop captions every epoch sit in the first shards.

    Args:
      config: a `sat_tf.config.Config`.
      **kwargs: passed to `extract_features` (shard_size, batch_size, progress,
        skip_bad_images).

    Returns:
      the index.
    """
    records = datasets.load_records(config.dataset, config.data_dir, on_missing=config.on_missing)
    records = sorted(records, key=lambda r: SPLIT_ORDER[r.split])
    return extract_features(
        records,
        config.encoder,
        config.encoder_weights,
        config.image_size,
        feature_dir_of(config),
        crop_fraction=crop_fraction_of(config),
        **kwargs,
    )


def drop_skipped(records, feature_dir: str) -> list:
    """`records` without the images that extraction skipped as undecodable (logged)."""
    index = read_index(feature_dir)
    skipped = {s["image_id"] for entry in index["shards"] if entry for s in entry["skipped"]}
    kept = [r for r in records if r.image_id not in skipped]
    if len(kept) < len(records):
        logging.warning(
            "features: leaving out %d image(s) skipped at extraction as undecodable",
            len(records) - len(kept),
        )
    return kept


def _parse(feature_shape):
    spec = {
        "image_id": tf.io.FixedLenFeature([], tf.string),
        "features": tf.io.FixedLenFeature([], tf.string),
    }

    def parse(serialized):
        example = tf.io.parse_single_example(serialized, spec)
        values = tf.io.decode_raw(example["features"], tf.float16)
        return example["image_id"], tf.cast(tf.reshape(values, feature_shape), tf.float32)

    return parse


def feature_dataset(feature_dir: str, records: Sequence[datasets.Record], **settings):
    """The cached features of `records`, streamed from the shards in record order.

    Args:
      feature_dir: a folder written by `extract_features`.
      records: the images wanted, in the order of extraction (a subsequence of it, such
        as one split).
      **settings: index values to check, e.g. encoder="vgg19", image_size=224.

    Returns:
      (`tf.data.Dataset` of float32 (L, D) tensors, one per record, in record order,
      (L, D)).

    Raises:
      ValueError: naming the records that have no features (extraction unfinished, the
        image skipped, or another dataset), records out of extraction order, or settings
        that differ from the cache's.
    """
    index = read_index(feature_dir)
    check_settings(index, feature_dir, **settings)
    location, skipped = {}, set()
    for shard, entry in enumerate(index["shards"]):
        if entry is None:
            continue
        for position, image_id in enumerate(entry["image_ids"]):
            location[image_id] = (shard, position)
        skipped.update(s["image_id"] for s in entry["skipped"])
    missing = [r.image_id for r in records if r.image_id not in location]
    if missing:
        done = sum(entry is not None for entry in index["shards"])
        hints = []
        if done < index["num_shards"]:
            hints.append(
                f"extraction is unfinished ({done} of {index['num_shards']} shards): run "
                "scripts/extract_features.py again to resume"
            )
        if any(m in skipped for m in missing):
            hints.append("some were skipped at extraction as undecodable")
        raise ValueError(
            f"{feature_dir} has no features for {len(missing)} of {len(records)} images: "
            f"{preview(missing)}" + "".join(f"; {h}" for h in hints)
        )
    wanted = [location[r.image_id] for r in records]
    for i in range(1, len(wanted)):
        if wanted[i] <= wanted[i - 1]:
            raise ValueError(
                f"image {records[i].image_id} comes after {records[i - 1].image_id} here but "
                f"not in the feature shards of {feature_dir}; pass records in extraction order"
            )
    shards = sorted({shard for shard, _ in wanted})
    sizes = [len(index["shards"][s]["image_ids"]) for s in shards]
    offsets = dict(zip(shards, np.cumsum([0, *sizes[:-1]]), strict=True))
    keep = np.zeros(sum(sizes), bool)
    keep[[offsets[shard] + position for shard, position in wanted]] = True
    files = [os.path.join(feature_dir, index["shards"][s]["file"]) for s in shards]
    feature_shape = tuple(index["feature_shape"])
    expected = tf.constant([r.image_id for r in records], tf.string)
    keep = tf.constant(keep, tf.bool)
    message = f"the shards in {feature_dir} do not match its {INDEX_FILE}; extract again"

    def check(position, parsed):
        image_id, features = parsed
        ok = tf.debugging.assert_equal(image_id, expected[position], message=message)
        with tf.control_dependencies([ok]):
            return tf.identity(features)

    ds = tf.data.TFRecordDataset(tf.constant(files, tf.string), buffer_size=8 << 20)
    ds = ds.enumerate().filter(lambda i, _: keep[i]).map(lambda _, x: x)
    ds = ds.map(_parse(feature_shape), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.enumerate().map(check)
    return ds, feature_shape


def feature_dataset_for(config, records):
    """`feature_dataset` of a `Config`'s feature folder, checking its encoder settings."""
    return feature_dataset(
        feature_dir_of(config),
        records,
        encoder=config.encoder,
        encoder_weights=config.encoder_weights or "",
        image_size=config.image_size,
        crop_fraction=crop_fraction_of(config),
    )
