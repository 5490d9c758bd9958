"""The feature cache: encoder outputs of every image, computed once and read by training.

The frozen encoder (paper §4.3: VGG19 pretrained on ImageNet, not fine-tuned) gives the
same annotation vectors `a` for an image in every epoch, so `training/extract.py` runs
it once per image and stores the (L, D) map as float16 in TFRecord shards:

    <feature_dir>/shard-00000-of-00124.tfrecord   tf.train.Example per image:
                                                  "image_id" bytes, "features" bytes
                                                  (L * D float16, little-endian, row-major
                                                  (L, D)), "shape" int64 [L, D]
    <feature_dir>/index.json                      encoder, weights, image size, (L, D),
                                                  grid, the fingerprint of the record list
                                                  and, per finished shard, its image ids

Shard i holds records [i * shard_size, (i + 1) * shard_size). This module is the cache's
format (the index, one record's bytes) and its reader: `feature_dataset` streams the
shards back in record order without holding them in memory.

The folder may be elsewhere (`s3://`, `gs://`, `hdfs://`): the index and the shards are
read and written through `sat_tf.utils.filesystem` (Beam's `FileSystems`), each written
whole. TensorFlow reads neither s3:// nor gs:// itself, so training reads such a cache
from a local copy (`local_copy`, kept under the cache folder and brought up to date with
the shards that changed).
"""

import hashlib
import json
import math
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from sat_tf import config as config_lib
from sat_tf.data import datasets
from sat_tf.utils import filesystem
from sat_tf.utils.messages import preview

INDEX_FILE = "index.json"
FORMAT_VERSION = 1
SPLIT_ORDER = {"val": 0, "test": 1, "train": 2}
_CHECKED = ("format", "encoder", "encoder_weights", "image_size", "shard_size")


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
    path = filesystem.join(feature_dir, INDEX_FILE)
    if not filesystem.exists(path):
        raise ValueError(
            f"no feature cache in {feature_dir} ({INDEX_FILE} is missing); run "
            "sat-extract-features with the same --dataset, --data_dir, --encoder, "
            "--encoder_weights, --image_size and --feature_dir first"
        )
    try:
        return json.loads(filesystem.read_bytes(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read feature index {path}: {e}") from e


def write_index(feature_dir: str, index: dict) -> None:
    filesystem.write_bytes(filesystem.join(feature_dir, INDEX_FILE), json.dumps(index).encode())


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


def unfinished(index: dict, present) -> list[int]:
    """The shards not done: not in the index, or their file not among `present` (the
    names of the files in the feature folder)."""
    shards = index["shards"]
    return [i for i, entry in enumerate(shards) if entry is None or entry["file"] not in present]


def start_index(feature_dir, settings, records) -> dict:
    """The existing index if it was made with the same settings and records, else a new one."""
    num_shards = math.ceil(len(records) / settings["shard_size"])
    fingerprint = records_fingerprint(records)
    if filesystem.exists(filesystem.join(feature_dir, INDEX_FILE)):
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


def encode_example(image_id: str, features: np.ndarray) -> bytes:
    feature = {
        "image_id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_id.encode()])),
        "features": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[features.astype("<f2").tobytes()])
        ),
        "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=list(features.shape))),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def shard_image_ids(path: str) -> list[str]:
    """The image ids of a shard file (anywhere `filesystem` reads), in its order."""
    spec = {"image_id": tf.io.FixedLenFeature([], tf.string)}
    with filesystem.local_file(path) as local:
        ds = tf.data.TFRecordDataset(local).map(lambda s: tf.io.parse_single_example(s, spec))
        return [example["image_id"].decode() for example in ds.as_numpy_iterator()]


def local_copy(feature_dir: str, cache_dir: str) -> str:
    """A local folder holding the cache `feature_dir`: itself when it is local, else
    `<cache_dir>/copies/<scheme>-<hash of its address>`, where its index and finished
    shards are copied (a shard already there with the same size is kept, so a second
    run copies only what changed).

    Raises:
      ValueError: as `read_index`, or when the extra the filesystem needs is missing.
    """
    if not filesystem.is_remote(feature_dir):
        return feature_dir
    index = read_index(feature_dir)
    digest = hashlib.sha256(feature_dir.rstrip("/").encode()).hexdigest()[:12]
    local = os.path.join(cache_dir, "copies", f"{filesystem.scheme(feature_dir)}-{digest}")
    names = [entry["file"] for entry in index["shards"] if entry is not None]
    copied = filesystem.mirror(feature_dir, local, names)
    write_index(local, index)
    logging.info(
        "features: %s copied to %s (%d of %d shards new)", feature_dir, local, copied, len(names)
    )
    return local


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
      feature_dir: a folder written by `extract.extract_features`.
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
                "sat-extract-features again to resume"
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
        crop_fraction=config.effective_crop_fraction,
    )
