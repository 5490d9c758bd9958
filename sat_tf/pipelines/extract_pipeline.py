"""Feature extraction as an Apache Beam pipeline: `sat-extract-features-beam`'s work.

    the shards not in the index -> (shard, its records) -> ExtractShards (the encoder
    loaded once per worker; each shard written by `extract.ShardEncoder`, the step of
    sat-extract-features) -> every shard's outcome -> index.json, written here at the end

The cache is the one `extract.extract_features` writes, shard for shard (the same file
names, records, index), so `sat-train --use_feature_cache` reads it unchanged. A shard
file is renamed into place when complete; a rerun after a run that did not finish (the
index then lacks its shards) reads the image ids back from each complete file rather
than encoding it again. An image that cannot be decoded is skipped and listed in the
index with --skip_bad_images; without it its shard is not written, the others are, and
`run` raises the error sat-extract-features raises, naming every such image. The folder
is a local path, which the workers must share (a local runner, or a shared mount).
"""

import json
import os

import apache_beam as beam
import keras
from absl import logging
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter

from sat_tf import config as config_lib
from sat_tf.data import feature_cache
from sat_tf.training import extract
from sat_tf.utils import files

NAMESPACE = "sat_extract_features"
_ENCODED = Metrics.counter(NAMESPACE, "encoded")
_FOUND = Metrics.counter(NAMESPACE, "found")
_REFUSED = Metrics.counter(NAMESPACE, "refused")
# Where the outcomes go for `run` to read: a temporary name, removed by the next start.
_OUTCOMES = ".tmp-beam-outcomes.json"


class ExtractShards(beam.DoFn):
    """(shard, its records) -> (shard, outcome): the shard written (or found complete) and
    its index entry {"entry": ..., "geometry": ...}, or {"refused": [reasons]} when it has
    images that cannot be decoded and they may not be skipped.

    Args:
      out_dir: the feature folder.
      num_shards: the shards of the whole extraction.
      encoder_args: `extract.ShardEncoder`'s arguments.
      skip_bad: leave out images that cannot be decoded.
      reuse: whether a shard file already there is complete work of this extraction
        (its index was there at the start).
    """

    def __init__(self, out_dir, num_shards, encoder_args, skip_bad, reuse):
        self._out_dir = out_dir
        self._num_shards = num_shards
        self._encoder_args = encoder_args
        self._skip_bad = skip_bad
        self._reuse = reuse

    def setup(self):
        self._encoder = extract.ShardEncoder(*self._encoder_args)

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


def _save(outcomes, path):
    files.write_json(path, sorted(outcomes))


def extract_shards(pipeline, records, index, todo, out_dir, encoder_args, skip_bad, reuse):
    """Adds the writing of the shards `todo` of `records` into `out_dir` to `pipeline`;
    the outcomes (`ExtractShards`) go to `<out_dir>/_OUTCOMES` as one JSON list."""
    size = index["shard_size"]
    elements = [(shard, records[shard * size : (shard + 1) * size]) for shard in todo]
    fn = ExtractShards(out_dir, index["num_shards"], encoder_args, skip_bad, reuse)
    return (
        pipeline
        | "Shards" >> beam.Create(elements, reshuffle=False)
        | "Spread" >> beam.Reshuffle()
        | "Extract" >> beam.ParDo(fn)
        | "Gather" >> beam.combiners.ToList()
        | "Save" >> beam.Map(_save, os.path.join(out_dir, _OUTCOMES))
    )


def counts(result) -> dict:
    """{"encoded": n, "found": n, "refused": n} shards of a finished run (Beam metrics):
    written, found complete from an earlier run, left unwritten for undecodable images."""
    found = {"encoded": 0, "found": 0, "refused": 0}
    for counter in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]:
        found[counter.key.metric.name] += counter.committed or 0
    return found


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
):
    """`extract.extract_features` as a Beam pipeline run with `options` (`PipelineOptions`):
    the same arguments (but `progress`) and the same cache.

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
    crop_fraction = crop_fraction or config_lib.encoder_crop_fraction(encoder_name)
    reuse = os.path.exists(os.path.join(out_dir, feature_cache.INDEX_FILE))
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
    pipeline = beam.Pipeline(options=options)
    extract_shards(pipeline, records, index, todo, out_dir, encoder_args, skip_bad_images, reuse)
    result = pipeline.run()
    result.wait_until_finish()
    path = os.path.join(out_dir, _OUTCOMES)
    with open(path, encoding="utf-8") as f:
        outcomes = json.load(f)
    os.remove(path)
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
    return index, counts(result)
