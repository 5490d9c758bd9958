"""Captions files as an Apache Beam pipeline: `sat-caption-beam`'s work.

    patterns -> matched files with their sizes -> their bytes -> RunInference(
    serving_default of an export) -> one JSON line per file (`caption_rows`) ->
    PREFIX-SSSSS-of-NNNNN.jsonl

Every file is read through Beam's `FileSystems` (local, `gs://`, `s3://` ...), so the same
pipeline runs on the DirectRunner and on Dataflow, Flink or Spark. A file's size comes
from the filesystem's listing first: one over `max_image_bytes` becomes a row with status
`caption_rows.TOO_LARGE` naming its size, never read. The export decodes, admits and
captions each photo in its graph (`exporting`, §6 of docs/design.md): a photo that is
empty, not an image, truncated or has too many pixels comes back with a status and a
reason, a pattern that matches nothing or a file that cannot be read becomes a row with
status `caption_rows.MISSING`, and no photo fails the pipeline. The captioned and refused
photos are counted as Beam metrics (`NAMESPACE`). Each step carries the pipeline options
given to its workers (`launch.use_worker_options`).
"""

import json

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference

from sat_tf.data.image_files import MAX_IMAGE_BYTES
from sat_tf.pipelines import caption_rows, launch
from sat_tf.pipelines.beam_handler import SavedModelHandler
from sat_tf.utils import filesystem

# The export's info file (`exporting.EXPORT_INFO`; that module imports TensorFlow).
EXPORT_INFO = "sat_tf_export.json"

NAMESPACE = "sat_caption"
_CAPTIONED = Metrics.counter(NAMESPACE, "captioned")
_REFUSED = Metrics.counter(NAMESPACE, "refused")


class Match(beam.DoFn):
    """(path, size in bytes) of each file a pattern (a path or a glob) names, in name
    order; an error row for a pattern that names none."""

    def __init__(self, worker_options=None):
        self._worker_options = worker_options

    def setup(self):
        launch.use_worker_options(self._worker_options)

    def process(self, pattern):
        try:
            found = FileSystems.match([pattern])[0].metadata_list
        except Exception as e:  # Beam's filesystems raise their own errors: one row, no failure
            found, why = [], f": {e}"
        else:
            why = ""
        if not found:
            yield caption_rows.error_row(pattern, caption_rows.MISSING, f"no file {pattern!r}{why}")
        for metadata in sorted(found, key=lambda m: m.path):
            yield metadata.path, metadata.size_in_bytes


class ReadFiles(beam.DoFn):
    """(path, bytes) of each (path, size); a file over `max_image_bytes` (unread) or one
    that cannot be read, or an error row already made, goes to the `refused` output as
    its row."""

    def __init__(self, max_image_bytes=MAX_IMAGE_BYTES, worker_options=None):
        self._max_bytes = max_image_bytes
        self._worker_options = worker_options

    def setup(self):
        launch.use_worker_options(self._worker_options)

    def process(self, element):
        if isinstance(element, dict):
            yield beam.pvalue.TaggedOutput("refused", element)
            return
        path, size = element
        if size > self._max_bytes:
            why = f"is {size:,} bytes, more than {self._limit()}; it was not read"
            yield beam.pvalue.TaggedOutput("refused", _too_large(path, why))
            return
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                data = f.read()
        except Exception as e:  # missing since matched, a folder, no permission
            row = caption_rows.error_row(path, caption_rows.MISSING, f"{path} cannot be read: {e}")
            yield beam.pvalue.TaggedOutput("refused", row)
            return
        if len(data) > self._max_bytes:
            why = f"grew past {self._limit()} after it was listed"
            yield beam.pvalue.TaggedOutput("refused", _too_large(path, why))
            return
        yield path, data

    def _limit(self):
        return f"the {self._max_bytes:,} bytes a photo may have (--max_image_bytes)"


def _too_large(path, why):
    return caption_rows.error_row(path, caption_rows.TOO_LARGE, f"{path} {why}")


def _line(row):
    (_REFUSED if "error" in row else _CAPTIONED).inc()
    return json.dumps(row)


def _export_row(keyed, num_captions):
    path, result = keyed
    return caption_rows.export_row(path, result.inference, num_captions)


def caption_files(
    pipeline,
    export_dir,
    patterns,
    output_prefix,
    *,
    batch_size=16,
    num_shards=0,
    max_image_bytes=MAX_IMAGE_BYTES,
    num_captions=1,
    worker_options=None,
):
    """Adds the captioning of the files `patterns` name to `pipeline`.

    Args:
      pipeline: a `beam.Pipeline`.
      export_dir: a `sat-export` SavedModel folder (any filesystem Beam reads).
      patterns: paths or globs (`FileSystems.match`).
      output_prefix: the rows go to `<output_prefix>-SSSSS-of-NNNNN.jsonl`.
      batch_size: most photos per call of the model (Beam's batching may send fewer).
      num_shards: output files; 0 lets the runner choose.
      max_image_bytes: a larger file is refused unread (`caption_rows.TOO_LARGE`).
      num_captions: over 1, each row also holds the export's best `num_captions`
        captions with their scores (at most its beam size: `check_export`).
      worker_options: `launch.worker_options` of the pipeline's options, set in each
        worker that reads files; None leaves the workers' as the runner gives them.

    Returns:
      the PCollection of the output file names.
    """
    model = SavedModelHandler(
        export_dir,
        min_batch_size=batch_size,
        max_batch_size=batch_size,
        worker_options=worker_options,
    )
    files = (
        pipeline
        | "Patterns" >> beam.Create(list(patterns))
        | "Match" >> beam.ParDo(Match(worker_options))
        | "Spread" >> beam.Reshuffle()
        | "Read"
        >> beam.ParDo(ReadFiles(max_image_bytes, worker_options)).with_outputs(
            "refused", main="photos"
        )
    )
    captioned = (
        files.photos
        | "Caption" >> RunInference(KeyedModelHandler(model))
        | "Row" >> beam.Map(_export_row, num_captions)
    )
    return (
        (captioned, files.refused)
        | "All" >> beam.Flatten()
        | "Json" >> beam.Map(_line)
        | "Write" >> beam.io.WriteToText(output_prefix, ".jsonl", num_shards=num_shards)
    )


def counts(result) -> dict:
    """{"captioned": n, "refused": n} of a finished run, from its Beam metrics."""
    return launch.counters(result, NAMESPACE, ("captioned", "refused"))


def check_export(export_dir, num_captions=1) -> None:
    """Raises ValueError unless `export_dir` holds a SavedModel whose beam gives
    `num_captions` captions a photo (read through `FileSystems`, whose options must be
    set), before any worker starts."""
    path = FileSystems.join(export_dir, "saved_model.pb")
    if not FileSystems.exists(path):
        raise ValueError(f"--export={export_dir} holds no saved_model.pb (sat-export writes one)")
    if num_captions > 1:
        info_path = FileSystems.join(export_dir, EXPORT_INFO)
        try:
            beam_size = int(json.loads(filesystem.read_bytes(info_path))["beam_size"])
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(
                f"--num_captions={num_captions}: cannot read the beam size from {info_path} "
                f"({e}); sat-export writes it"
            ) from e
        if num_captions > beam_size:
            raise ValueError(
                f"--num_captions={num_captions} is over the beam of {beam_size} of "
                f"--export={export_dir}: export it with --beam_size={num_captions} or more"
            )


def run(export_dir, patterns, output_prefix, options, **kwargs) -> dict:
    """Runs `caption_files` with the given `PipelineOptions` to the end, the export
    checked first.

    Returns:
      `counts` of the run.
    """
    FileSystems.set_options(options)
    check_export(export_dir, kwargs.get("num_captions", 1))
    pipeline = beam.Pipeline(runner=launch.runner(options), options=options)
    caption_files(
        pipeline,
        export_dir,
        patterns,
        output_prefix,
        worker_options=launch.worker_options(options),
        **kwargs,
    )
    return counts(launch.run(pipeline))
