"""`SavedModelHandler`: any TensorFlow SavedModel in Apache Beam's `RunInference`.

Beam's own TensorFlow handlers (`apache_beam.ml.inference.tensorflow_inference`) import
tensorflow_hub and load a model through Keras, which under Keras 3 refuses a SavedModel
folder; this one loads it with `tf.saved_model.load` alone and calls one of its
signatures on each batch that Beam gathers:

    handler = SavedModelHandler("gs://bucket/exports/sat/1", max_batch_size=16)
    photos | RunInference(KeyedModelHandler(handler))   # (path, image bytes) in

An element is one row of the signature's inputs: a value (bytes, str, number or array)
for a signature of one input, or a dict {input name: value}. Beam stacks none of them;
the handler does, so a batch of N elements is one call with inputs of N rows, and each
element gets back row i of every output. The model is read from any path that Beam's
`FileSystems` reads (local, `gs://`, `s3://` with their extras): a folder elsewhere is
copied to a local temporary folder of a unique name first, since `tf.saved_model.load`
reads local files (and `gs://` only where TensorFlow was built with it), and the copy is
removed as soon as the model is loaded (the loaded model holds its variables and
constants in memory), so a worker leaves no file behind even when it is killed later.
"""

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from sat_tf.pipelines import launch


def _is_local_folder(path: str) -> bool:
    return os.path.isdir(path)


def _copy_into(path: str, target: str) -> None:
    """Copies every file under `path` (through `FileSystems`) into the folder `target`.

    Raises:
      ValueError: when nothing is found under `path`, or a file's name leads outside
        `target` (a `..` in an object key).
    """
    root = path.rstrip("/")
    matches = FileSystems.match([FileSystems.join(root, "**")])[0].metadata_list
    if not matches:
        raise ValueError(f"no SavedModel at {path}: no file found under it")
    for metadata in matches:
        relative = metadata.path[len(root) :].lstrip("/")
        local = os.path.normpath(os.path.join(target, *relative.split("/")))
        if not local.startswith(os.path.join(target, "")):
            raise ValueError(
                f"{metadata.path}: its name leads outside {path} ('..'), so it is not copied"
            )
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with (
            FileSystems.open(metadata.path, compression_type=CompressionTypes.UNCOMPRESSED) as f,
            open(local, "wb") as sink,
        ):
            shutil.copyfileobj(f, sink)


@contextlib.contextmanager
def local_copy(path: str):
    """`path` itself when it is a local folder, else a local temporary folder of a unique
    name holding a copy of every file under it (read through Beam's `FileSystems`),
    removed when the block ends, also on an error.

    Raises:
      ValueError: as `_copy_into`.
    """
    if _is_local_folder(path):
        yield path
        return
    target = tempfile.mkdtemp(prefix="sat_saved_model_")
    try:
        _copy_into(path, target)
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


def _stack(values, spec):
    """One input of a batch: the elements' values stacked into a tensor of `spec`'s type."""
    if spec.dtype == tf.string:
        return tf.constant([v.encode() if isinstance(v, str) else bytes(v) for v in values])
    return tf.constant(np.stack([np.asarray(v) for v in values]), spec.dtype)


def _size(value) -> int:
    if isinstance(value, (bytes, str)):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values())
    return np.asarray(value).nbytes


class SavedModelHandler(ModelHandler):
    """Runs one signature of a SavedModel on batches of elements (a Beam `ModelHandler`).

    Args:
      model_uri: the SavedModel folder, on any filesystem Beam reads.
      signature: the signature to call (`serving_default` by default).
      saved_model_tags: the meta graph's tags, for a SavedModel of more than one.
      min_batch_size, max_batch_size: elements per call, passed to Beam's batching.
      large_model: share one loaded model among the processes of a worker (Beam's
        `multi_process_shared`) instead of one per process.
      model_copies: how many copies a worker holds when shared (implies sharing).
      worker_options: the pipeline options `FileSystems` needs to read `model_uri`
        (`launch.worker_options`), for workers started without them; None for none.
      **kwargs: Beam's other `ModelHandler` arguments (`max_batch_duration_secs`,
        `env_vars`, ...).
    """

    def __init__(
        self,
        model_uri: str,
        signature: str = "serving_default",
        *,
        saved_model_tags: Sequence[str] | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        large_model: bool = False,
        model_copies: int | None = None,
        worker_options: dict | None = None,
        **kwargs,
    ):
        super().__init__(
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            large_model=large_model,
            model_copies=model_copies,
            **kwargs,
        )
        self._model_uri = model_uri
        self._signature = signature
        self._tags = list(saved_model_tags) if saved_model_tags else None
        self._worker_options = worker_options

    def load_model(self):
        """The loaded SavedModel (its signature checked, so a wrong name fails at once).

        Raises:
          ValueError: naming the signatures the model has, when `signature` is not one.
        """
        launch.use_worker_options(self._worker_options)
        with local_copy(self._model_uri) as folder:
            loaded = tf.saved_model.load(folder, tags=self._tags)
        if self._signature not in loaded.signatures:
            raise ValueError(
                f"{self._model_uri} has no signature {self._signature!r}; it has "
                f"{', '.join(sorted(loaded.signatures))}"
            )
        return loaded

    def run_inference(
        self, batch: Sequence[Any], model, inference_args: dict | None = None
    ) -> Iterable[PredictionResult]:
        """One call of the signature on the whole batch.

        Args:
          batch: the elements (values, or dicts by input name).
          model: what `load_model` returned.
          inference_args: further inputs of the signature, the same for every element.

        Returns:
          a `PredictionResult` per element, `inference` {output name: numpy row}.
        """
        function = model.signatures[self._signature]
        specs = function.structured_input_signature[1]
        if batch and isinstance(batch[0], dict):
            columns = {name: [element[name] for element in batch] for name in batch[0]}
        elif len(specs) == 1:
            columns = {next(iter(specs)): list(batch)}
        else:
            raise ValueError(
                f"signature {self._signature!r} takes {', '.join(sorted(specs))}: give each "
                "element as a dict of them"
            )
        inputs = {name: _stack(values, specs[name]) for name, values in columns.items()}
        outputs = {k: v.numpy() for k, v in function(**inputs, **(inference_args or {})).items()}
        return [
            PredictionResult(element, {k: v[i] for k, v in outputs.items()}, self._model_uri)
            for i, element in enumerate(batch)
        ]

    def get_num_bytes(self, batch: Sequence[Any]) -> int:
        return sum(_size(element) for element in batch)

    def get_metrics_namespace(self) -> str:
        return "SavedModel"

    def update_model_path(self, model_path: str | None = None):
        self._model_uri = model_path or self._model_uri
