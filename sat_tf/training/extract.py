"""Feature extraction: the frozen encoder run once over every image of a dataset, its
annotation vectors written into the feature cache (`sat_tf/data/feature_cache.py` holds
the cache's format and reads it back; this module is where the images meet the model).

Each shard is written under a temporary name and renamed when complete (in a folder
elsewhere, `s3://` or `gs://`, uploaded whole once complete: `filesystem.atomic_path`),
and the index is rewritten (atomically) after each shard, so a run that is killed loses
at most the shard it was writing: the same command again skips the finished shards. The
per-shard step (`ShardEncoder`) is also the one of `sat-extract-features-beam`'s
pipeline (`sat_tf.pipelines.extract_pipeline`), which reads the photos through a reader
of its own (Beam's `FileSystems`, sizes first).
"""

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
from sat_tf.utils import files, filesystem
from sat_tf.utils.messages import preview

_FLOAT16_MAX = float(np.finfo(np.float16).max)


def _why_bad(path: str, image_size: int, crop_fraction: float, read=None) -> str:
    """Why an image cannot be encoded (read by `read`, a function of the path that
    returns its bytes or raises naming it; None: a local file)."""
    try:
        if read is None:
            image_io.load_image_file(path, image_size, crop_fraction)
        else:
            image_io.decode_admitted(read(path), path, image_size, crop_fraction)
    except (OSError, ValueError) as e:
        return str(e)
    return f"image {path!r} could not be read"


def _image_bytes(records, read):
    """(position, bytes) of each record's image: read by TensorFlow from a local file
    (`read` None), else by `read` (an image it cannot read is left out)."""
    positions = np.arange(len(records), dtype=np.int64)
    if read is None:
        paths = [r.image_path for r in records]
        ds = tf.data.Dataset.from_tensor_slices((positions, paths))
        return ds.map(lambda i, p: (i, tf.io.read_file(p)))

    def images():
        for position, record in zip(positions, records, strict=True):
            try:
                yield position, read(record.image_path)
            except (OSError, ValueError):  # named by `_why_bad`
                continue

    spec = (tf.TensorSpec((), tf.int64), tf.TensorSpec((), tf.string))
    return tf.data.Dataset.from_generator(images, output_signature=spec)


def _write_shard(
    path, records, encode, image_size, crop_fraction, batch_size, skip_bad, progbar, read=None
):
    """Encodes `records` into the TFRecord file `path` (written whole:
    `filesystem.atomic_path`), the images read by `read` (`_image_bytes`).

    Images that cannot be read or decoded are left out; unless `skip_bad`, the shard is
    then not written at all and `Undecodable` names them.

    Returns:
      (image ids written, [(record, reason)] of the images left out, number of values
      beyond the float16 range that were clipped).
    """
    ds = _image_bytes(records, read).filter(
        lambda i, data: graph_admission.admits(data)  # a refused image is never decoded
    )
    ds = ds.map(
        lambda i, data: (i, image_io.decode_image(data, image_size, crop_fraction)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    ds = ds.ignore_errors().batch(batch_size).prefetch(1)
    written, overflow = [], 0
    with filesystem.atomic_path(path) as tmp:
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
            (r, _why_bad(r.image_path, image_size, crop_fraction, read))
            for i, r in enumerate(records)
            if i not in kept
        ]
        if bad:  # an add after the last image would print the finished bar again
            progbar.add(len(bad))
        if bad and not skip_bad:
            raise Undecodable(bad)
    return [records[i].image_id for i in written], bad, overflow


class Undecodable(Exception):
    """Images of a shard that cannot be decoded, when they may not be skipped."""

    def __init__(self, bad):
        super().__init__(len(bad))
        self.bad = bad


def undecodable_error(refused, out_dir, done) -> ValueError:
    """The error of the shards left unwritten for images that cannot be decoded.

    Args:
      refused: {shard file name: [why each of its images cannot be decoded]}.
      out_dir: the feature folder.
      done: how many shards of it are finished (and kept).
    """
    reasons = [why for name in sorted(refused) for why in refused[name]]
    shards = f"shard{'s' if len(refused) > 1 else ''} {', '.join(sorted(refused))}"
    return ValueError(
        f"{len(reasons)} image(s) of {shards} cannot be decoded:\n  "
        + "\n  ".join(reasons)
        + f"\nthe {done} finished shard(s) in {out_dir} are kept; replace or remove the "
        "file(s) (or pass --skip_bad_images) and run again to resume"
    )


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


def start(records, encoder_name, encoder_weights, image_size, out_dir, shard_size):
    """Begins an extraction into `out_dir`, or resumes the one there: the records checked,
    the index started (`feature_cache.start_index`: one made with other settings or
    records refuses), the temporary files of a killed run removed.

    Returns:
      (the index, the shards not finished in it).

    Raises:
      ValueError: on no records, duplicate ids, or a cache made with other settings.
    """
    _check_records(records)
    settings = {
        "format": feature_cache.FORMAT_VERSION,
        "encoder": encoder_name,
        "encoder_weights": encoder_weights or "",
        "image_size": image_size,
        "shard_size": shard_size,
    }
    filesystem.make_folder(out_dir)
    index = feature_cache.start_index(out_dir, settings, records)
    present = filesystem.files_in(out_dir)
    for name in list(present):
        # Temporary files of a killed run; `<name>.tmp<pid>` is how earlier versions named them.
        if files.is_temporary(name) or re.fullmatch(r".*\.tmp\d+", name):
            filesystem.delete(filesystem.join(out_dir, name))
            del present[name]
    return index, feature_cache.unfinished(index, present)


def set_geometry(index, out_dir, geometry) -> None:
    """Puts the encoder's `ShardEncoder.geometry` into the index and writes it.

    Raises:
      ValueError: when the index holds another (a cache of another encoder grid).
    """
    feature_cache.check_settings(
        index, out_dir, **{k: v for k, v in geometry.items() if k in index}
    )
    index.update(geometry)
    feature_cache.write_index(out_dir, index)


class ShardEncoder:
    """The frozen encoder of an extraction, loaded once, and the shards it writes: the one
    step per shard of `extract_features` and of its Beam pipeline (`extract_pipeline`).

    Args:
      encoder_name, encoder_weights, image_size, crop_fraction: as for `extract_features`
        (crop_fraction resolved: not 0).
      batch_size: images per encoder call.
      read: a function of an image's path that returns its bytes, or raises naming the
        path (OSError, ValueError); None reads local files with TensorFlow.
    """

    def __init__(
        self, encoder_name, encoder_weights, image_size, crop_fraction, batch_size, read=None
    ):
        encoder = ImageEncoder(encoder_name, image_size, encoder_weights or None)
        height, width, depth = encoder.feature_grid()
        self.geometry = {
            "crop_fraction": crop_fraction,
            "feature_shape": [height * width, depth],
            "grid": [height, width],
            "dtype": "float16",
        }
        self.encode = tf.function(lambda x: encoder(x, training=False), reduce_retracing=True)
        self._image = (image_size, crop_fraction)
        self._batch_size = batch_size
        self._read = read

    def write(self, out_dir, shard, num_shards, records, skip_bad, progbar) -> dict:
        """Writes shard `shard` of `num_shards` (its `records`) into `out_dir` (`_write_shard`).

        Returns:
          its index entry: {"file", "image_ids", "skipped": [{"image_id", "reason"}]}.

        Raises:
          Undecodable: naming the images that cannot be decoded (unless `skip_bad`).
        """
        started = time.time()
        name = feature_cache.shard_name(shard, num_shards)
        path = filesystem.join(out_dir, name)
        ids, bad, overflow = _write_shard(
            path,
            records,
            self.encode,
            *self._image,
            self._batch_size,
            skip_bad,
            progbar,
            self._read,
        )
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
        seconds = time.time() - started
        logging.info(
            "features: %s done, %d images in %.1fs (%.1f images/s)",
            *(name, len(records), seconds, len(records) / max(seconds, 1e-9)),
        )
        return _entry(name, ids, bad)

    def entry_of_file(self, out_dir, shard, num_shards, records):
        """The index entry of shard `shard` from its file, complete (files are renamed into
        place whole) but not in the index (the run that wrote it did not finish): its image
        ids read back, its other records skipped, each with the reason. None when there is
        no such file, or it holds ids that are not `records`' in their order."""
        name = feature_cache.shard_name(shard, num_shards)
        path = filesystem.join(out_dir, name)
        if not filesystem.exists(path):
            return None
        ids = feature_cache.shard_image_ids(path)
        written = set(ids)
        if ids != [r.image_id for r in records if r.image_id in written]:
            return None
        bad = [
            (r, _why_bad(r.image_path, *self._image, self._read))
            for r in records
            if r.image_id not in written
        ]
        return _entry(name, ids, bad)


def _entry(name, ids, bad) -> dict:
    return {
        "file": name,
        "image_ids": ids,
        "skipped": [{"image_id": r.image_id, "reason": why} for r, why in bad],
    }


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
    if shard_size < 1 or batch_size < 1:
        raise ValueError(f"shard_size={shard_size} and batch_size={batch_size} must be >= 1")
    crop_fraction = crop_fraction or config_lib.encoder_crop_fraction(encoder_name)
    index, todo = start(records, encoder_name, encoder_weights, image_size, out_dir, shard_size)
    num_shards = index["num_shards"]
    if not todo:
        logging.info("features: all %d shards in %s are complete", num_shards, out_dir)
        return index
    if len(todo) < num_shards:
        logging.info("features: resuming; %d of %d shards done", num_shards - len(todo), num_shards)
    if not encoder_weights:
        logging.warning("features: the %s encoder has random weights", encoder_name)
    encoder = ShardEncoder(encoder_name, encoder_weights, image_size, crop_fraction, batch_size)
    set_geometry(index, out_dir, encoder.geometry)
    total = sum(len(records[i * shard_size : (i + 1) * shard_size]) for i in todo)
    # Off a terminal, one plain line when done: Keras draws the bar with escapes and
    # carriage returns wherever it runs (POSIX).
    shown = 1 if sys.stdout.isatty() else 2
    progbar = keras.utils.Progbar(total, unit_name="image", verbose=shown if progress else 0)
    for shard in todo:
        shard_records = records[shard * shard_size : (shard + 1) * shard_size]
        try:
            entry = encoder.write(
                out_dir, shard, num_shards, shard_records, skip_bad_images, progbar
            )
        except Undecodable as e:
            name = feature_cache.shard_name(shard, num_shards)
            done = sum(s is not None for s in index["shards"])
            raise undecodable_error({name: [why for _, why in e.bad]}, out_dir, done) from None
        index["shards"][shard] = entry
        feature_cache.write_index(out_dir, index)
    return index


def records_of(config, records=None) -> list:
    """The records of `config.dataset` (or `records`, when read already) in extraction
    order: val, test, train (each in file order), so that the validation images the
    training loop captions every epoch sit in the first shards."""
    if records is None:
        records = datasets.load_records(
            config.dataset, config.data_dir, captions=config.captions, on_missing=config.on_missing
        )
    return sorted(records, key=lambda r: feature_cache.SPLIT_ORDER[r.split])


def extract_for_config(config, records=None, **kwargs) -> dict:
    """Extracts features of every image of `config.dataset` (`records_of`; `records`:
    those read already) into `feature_cache.feature_dir_of(config)`.

    Args:
      config: a `sat_tf.config.Config`.
      records: the dataset's records (`datasets.load_records` of the config) when the
        caller has read them already; None reads them.
      **kwargs: passed to `extract_features` (shard_size, batch_size, progress,
        skip_bad_images).

    Returns:
      the index.
    """
    return extract_features(
        records_of(config, records),
        config.encoder,
        config.encoder_weights,
        config.image_size,
        feature_cache.feature_dir_of(config),
        crop_fraction=config.effective_crop_fraction,
        **kwargs,
    )
