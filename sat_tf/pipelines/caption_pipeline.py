"""Captions files as an Apache Beam pipeline: `sat-caption-beam`'s work.

    patterns -> matched files -> their bytes -> RunInference(serving_default of an
    export) -> one JSON line per file (`caption_rows`) -> PREFIX-SSSSS-of-NNNNN.jsonl

Every file is read through Beam's `FileSystems` (local, `gs://`, `s3://` ...), so the same
pipeline runs on the DirectRunner and on Dataflow, Flink or Spark. The export decodes,
admits and captions each photo in its graph (`exporting`, §6 of docs/design.md): a photo
that is empty, not an image, truncated or has too many pixels comes back with a status
and a reason, a pattern that matches nothing or a file that cannot be read becomes a row
with status `caption_rows.MISSING`, and no photo fails the pipeline. The captioned and
refused photos are counted as Beam metrics (`NAMESPACE`).
"""

import json

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference

from sat_tf.pipelines import caption_rows
from sat_tf.pipelines.beam_handler import SavedModelHandler

NAMESPACE = "sat_caption"
_CAPTIONED = Metrics.counter(NAMESPACE, "captioned")
_REFUSED = Metrics.counter(NAMESPACE, "refused")


def match(pattern):
    """The files a pattern (a path or a glob) names, in name order; an error row for a
    pattern that names none."""
    try:
        found = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception as e:  # Beam's filesystems raise their own errors: one row, no failure
        found, why = [], f": {e}"
    else:
        why = ""
    if not found:
        yield caption_rows.error_row(pattern, caption_rows.MISSING, f"no file {pattern!r}{why}")
    yield from found


class ReadFiles(beam.DoFn):
    """(path, bytes) of each file; a file that cannot be read (or an error row already
    made) goes to the `refused` output as its row."""

    def process(self, element):
        if isinstance(element, dict):
            yield beam.pvalue.TaggedOutput("refused", element)
            return
        try:
            with FileSystems.open(element, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                data = f.read()
        except Exception as e:  # missing since matched, a folder, no permission
            row = caption_rows.error_row(
                element, caption_rows.MISSING, f"{element} cannot be read: {e}"
            )
            yield beam.pvalue.TaggedOutput("refused", row)
            return
        yield element, data


def _line(row):
    (_REFUSED if "error" in row else _CAPTIONED).inc()
    return json.dumps(row)


def _export_row(keyed):
    path, result = keyed
    return caption_rows.export_row(path, result.inference)


def caption_files(pipeline, export_dir, patterns, output_prefix, *, batch_size=16, num_shards=0):
    """Adds the captioning of the files `patterns` name to `pipeline`.

    Args:
      pipeline: a `beam.Pipeline`.
      export_dir: a `sat-export` SavedModel folder (any filesystem Beam reads).
      patterns: paths or globs (`FileSystems.match`).
      output_prefix: the rows go to `<output_prefix>-SSSSS-of-NNNNN.jsonl`.
      batch_size: most photos per call of the model (Beam's batching may send fewer).
      num_shards: output files; 0 lets the runner choose.

    Returns:
      the PCollection of the output file names.
    """
    model = SavedModelHandler(export_dir, min_batch_size=batch_size, max_batch_size=batch_size)
    handler = KeyedModelHandler(model)
    files = (
        pipeline
        | "Patterns" >> beam.Create(list(patterns))
        | "Match" >> beam.FlatMap(match)
        | "Spread" >> beam.Reshuffle()
        | "Read" >> beam.ParDo(ReadFiles()).with_outputs("refused", main="photos")
    )
    captioned = files.photos | "Caption" >> RunInference(handler) | "Row" >> beam.Map(_export_row)
    return (
        (captioned, files.refused)
        | "All" >> beam.Flatten()
        | "Json" >> beam.Map(_line)
        | "Write" >> beam.io.WriteToText(output_prefix, ".jsonl", num_shards=num_shards)
    )


def counts(result) -> dict:
    """{"captioned": n, "refused": n} of a finished run, from its Beam metrics."""
    found = {"captioned": 0, "refused": 0}
    for counter in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]:
        found[counter.key.metric.name] += counter.committed or 0
    return found


def run(export_dir, patterns, output_prefix, options, **kwargs) -> dict:
    """Runs `caption_files` with the given `PipelineOptions` to the end.

    Returns:
      `counts` of the run.
    """
    pipeline = beam.Pipeline(options=options)
    caption_files(pipeline, export_dir, patterns, output_prefix, **kwargs)
    result = pipeline.run()
    result.wait_until_finish()
    return counts(result)
