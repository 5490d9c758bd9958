"""Feature extraction as an Apache Beam pipeline: `sat-extract-features-beam`'s work.

    the shards not in the index -> (shard, its records) -> ExtractShards (the encoder
    loaded once per worker; each shard written by `extract.ShardEncoder`, the step of
    sat-extract-features) -> every shard's outcome -> index.json, written here at the end

The cache is the one `extract.extract_features` writes, shard for shard (the same file
names, records, index), so `sat-train --use_feature_cache` reads it unchanged. The
feature folder and the photos may be on any filesystem Beam reads (`s3://`, `gs://`,
`hdfs://` or local): a worker reads each photo through `FileSystems`, its size first
(`ImageReader`: a photo over `max_image_bytes` is refused unread, as an undecodable one),
and writes each shard whole (`filesystem.atomic_path`). A rerun after a run that did not
finish (the index then lacks its shards) reads the image ids back from each complete
file rather than encoding it again. An image that cannot be decoded is skipped and listed
in the index with --skip_bad_images; without it its shard is not written, the others
are, and `run` raises the error sat-extract-features raises, naming every such image.
The outcomes reach the launcher through a temporary file in the feature folder, removed
when read.
"""

import json
import uuid

import apache_beam as beam
import keras
from absl import logging
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from sat_tf import config as config_lib
from sat_tf.data import feature_cache
from sat_tf.data.image_files import MAX_IMAGE_BYTES
from sat_tf.pipelines import launch
from sat_tf.training import extract
from sat_tf.utils import filesystem

NAMESPACE = "sat_extract_features"
_ENCODED = Metrics.counter(NAMESPACE, "encoded")
_FOUND = Metrics.counter(NAMESPACE, "found")
_REFUSED = Metrics.counter(NAMESPACE, "refused")
# Where the outcomes go for `run` to read: a temporary name, which the next start removes
# if a run leaves it.
_OUTCOMES = ".tmp-beam-outcomes-{}.json"


class ImageReader:
    """A photo's bytes through `filesystem` (Beam's `FileSystems`), its size read from
    the listing first.

    Raises (when called):
      ValueError: naming the photo and its size, when it has more than `max_bytes`
        (never read).
      OSError: when it cannot be read.
    """

    def __init__(self, max_bytes=MAX_IMAGE_BYTES):
        self._max_bytes = max_bytes

    def __call__(self, path):
        size = filesystem.size(path)
        if size > self._max_bytes:
            raise ValueError(
                f"{path} is {size:,} bytes, more than the {self._max_bytes:,} a photo may "
                "have (--max_image_bytes); it was not read"
            )
        return filesystem.read_bytes(path)


class ExtractShards(beam.DoFn):
    """(shard, its records) -> (shard, outcome): the shard written (or found complete) and
    its index entry {"entry": ..., "geometry": ...}, or {"refused": [reasons]} when it has
    images that cannot be decoded and they may not be skipped.

    Args:
      out_dir: the feature folder.
      num_shards: the shards of the whole extraction.
      encoder_args: `extract.ShardEncoder`'s arguments (but `read`).
      skip_bad: leave out images that cannot be decoded.
      reuse: whether a shard file already there is complete work of this extraction
        (its index was there at the start).
      max_image_bytes: a larger photo is refused unread.
      worker_options: `launch.worker_options`, set in the worker; None for none.
    """

    def __init__(
        self, out_dir, num_shards, encoder_args, skip_bad, reuse, max_image_bytes, worker_options
    ):
        self._out_dir = out_dir
        self._num_shards = num_shards
        self._encoder_args = encoder_args
        self._skip_bad = skip_bad
        self._reuse = reuse
        self._max_bytes = max_image_bytes
        self._worker_options = worker_options

    def setup(self):
        launch.use_worker_options(self._worker_options)
        read = ImageReader(self._max_bytes)
        self._encoder = extract.ShardEncoder(*self._encoder_args, read=read)

    def process(self, element):
        shard, records = element
        args = (self._out_dir, shard, self._num_shards, records)
        geometry = self._encoder.geometry
        entry = self._encoder.entry_of_file(*args) if self._reuse else None
        if entry is not None:
            _FOUND.inc()
            yield shard, {"entry": entry, "geometry": geometry}
            return
        progbar = keras.utils.Progbar(len(records), verbose=0)
        try:
            entry = self._encoder.write(*args, self._skip_bad, progbar)
        except extract.Undecodable as e:
            _REFUSED.inc()
            yield shard, {"refused": [why for _, why in e.bad]}
            return
        _ENCODED.inc()
        yield shard, {"entry": entry, "geometry": geometry}


class _Save(beam.DoFn):
    """Writes the list of outcomes to `path` (through `filesystem`)."""

    def __init__(self, path, worker_options):
        self._path = path
        self._worker_options = worker_options

    def setup(self):
        launch.use_worker_options(self._worker_options)

    def process(self, outcomes):
        filesystem.write_bytes(self._path, json.dumps(sorted(outcomes)).encode())


def extract_shards(pipeline, records, index, todo, shard_fn, outcomes_path, worker_options=None):
    """Adds the writing of the shards `todo` of `records` by `shard_fn` (an
    `ExtractShards`) to `pipeline`; the outcomes go to `outcomes_path` as one JSON list
    (written by a worker, with `worker_options`)."""
    size = index["shard_size"]
    elements = [(shard, records[shard * size : (shard + 1) * size]) for shard in todo]
    return (
        pipeline
        | "Shards" >> beam.Create(elements, reshuffle=False)
        | "Spread" >> beam.Reshuffle()
        | "Extract" >> beam.ParDo(shard_fn)
        | "Gather" >> beam.combiners.ToList()
        | "Save" >> beam.ParDo(_Save(outcomes_path, worker_options))
    )


def counts(result) -> dict:
    """{"encoded": n, "found": n, "refused": n} shards of a finished run (Beam metrics):
    written, found complete from an earlier run, left unwritten for undecodable images."""
    return launch.counters(result, NAMESPACE, ("encoded", "found", "refused"))


def run(
    records,
    encoder_name,
    encoder_weights,
    image_size,
    out_dir,
    options,
    *,
    crop_fraction=0.0,
    shard_size=1000,
    batch_size=32,
    skip_bad_images=False,
    max_image_bytes=MAX_IMAGE_BYTES,
):
    """`extract.extract_features` as a Beam pipeline run with `options` (`PipelineOptions`):
    the same arguments (but `progress`) and the same cache; `max_image_bytes`: a larger
    photo is refused unread, as one that cannot be decoded.

    Returns:
      (the index, `counts` of the run; None when every shard was already in the index).

    Raises:
      ValueError: as `extract.extract_features`: duplicate ids, a cache made with other
        settings, or (unless skip_bad_images) images that cannot be decoded, naming them
        all; every shard without one is written and kept.
    """
    records = list(records)
    if shard_size < 1 or batch_size < 1:
        raise ValueError(f"shard_size={shard_size} and batch_size={batch_size} must be >= 1")
    FileSystems.set_options(options)
    crop_fraction = crop_fraction or config_lib.encoder_crop_fraction(encoder_name)
    reuse = filesystem.exists(filesystem.join(out_dir, feature_cache.INDEX_FILE))
    index, todo = extract.start(
        records, encoder_name, encoder_weights, image_size, out_dir, shard_size
    )
    if not todo:
        return index, None
    if "crop_fraction" in index:  # the rest of the geometry follows from the settings
        feature_cache.check_settings(index, out_dir, crop_fraction=crop_fraction)
    if not encoder_weights:
        logging.warning("features: the %s encoder has random weights", encoder_name)
    feature_cache.write_index(out_dir, index)  # the settings, before any shard is written
    encoder_args = (encoder_name, encoder_weights, image_size, crop_fraction, batch_size)
    carried = launch.worker_options(options)
    shard_fn = ExtractShards(
        out_dir, index["num_shards"], encoder_args, skip_bad_images, reuse, max_image_bytes, carried
    )
    path = filesystem.join(out_dir, _OUTCOMES.format(uuid.uuid4().hex))
    pipeline = beam.Pipeline(runner=launch.runner(options), options=options)
    extract_shards(pipeline, records, index, todo, shard_fn, path, carried)
    try:
        result = launch.run(pipeline)
        outcomes = json.loads(filesystem.read_bytes(path).decode("utf-8"))
    finally:
        if filesystem.exists(path):
            filesystem.delete(path)
    return _finish(index, out_dir, outcomes), counts(result)


def _finish(index, out_dir, outcomes) -> dict:
    """The index with the shards of `outcomes` in it, written.

    Raises:
      ValueError: naming the images of the shards left unwritten (`extract.Undecodable`).
    """
    refused = {}
    for shard, outcome in outcomes:
        if "refused" in outcome:
            refused[feature_cache.shard_name(shard, index["num_shards"])] = outcome["refused"]
        else:
            geometry = outcome["geometry"]  # every worker's encoder is the same
            index["shards"][shard] = outcome["entry"]
    if len(refused) < len(outcomes):
        extract.set_geometry(index, out_dir, geometry)
    feature_cache.write_index(out_dir, index)
    if refused:
        done = sum(entry is not None for entry in index["shards"])
        raise extract.undecodable_error(refused, out_dir, done)
    return index
