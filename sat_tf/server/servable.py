"""One loaded version of a model: its signatures, each behind a `batching.Batcher` (TF
Serving's servable: a SavedModel bundle in a batching session).

Loading reads what can be broken before the model: `saved_model.pb` (a file that does not
parse is DATA_LOSS) and the warm-up file (`sat_tf.serving.warmup`), so a broken version
costs no model load. A request's inputs are checked against the signature (names, dtype,
rank and fixed sizes) in the caller's thread, before they meet anyone else's in a batch:
a bad input is the caller's INVALID_ARGUMENT, never a batch's failure. Every path goes
through TensorFlow's file system layer (gs:// as a local folder).
"""

import functools
import os

import numpy as np
import tensorflow as tf

from sat_tf.server import batching
from sat_tf.server.errors import ServingError, from_exception
from sat_tf.serving import warmup

DEFAULT_SIGNATURE = warmup.DEFAULT_SIGNATURE


def rename_errors(outputs: dict, shift: int) -> dict:
    """`serving_default`'s rows with each `error` naming its image by its index in the
    request (`image_bytes[k]` of the batch is `image_bytes[k + shift]`); a `Batcher`'s
    `rebase`."""
    if "error" not in outputs or shift == 0:
        return outputs
    errors = [_rebased(e, shift) for e in outputs["error"]]
    return {**outputs, "error": np.array(errors, dtype=object)}


def _rebased(error: bytes, shift: int) -> bytes:
    prefix = b"image_bytes["
    if not error.startswith(prefix):
        return error
    index, bracket, rest = error[len(prefix) :].partition(b"]")
    if not bracket or not index.isdigit():
        return error
    return b"%s%d]%s" % (prefix, int(index) + shift, rest)


def examples(inputs: dict) -> int:
    """How many images (the size of the first axis) a request's inputs hold."""
    shape = np.shape(next(iter(inputs.values()))) if inputs else ()
    return shape[0] if shape else 1


def read_signature_defs(path: str) -> dict:
    """{name: SignatureDef} of the SavedModel in `path` (its `__`-named ones left out).

    Raises:
      ServingError: NOT_FOUND without saved_model.pb, DATA_LOSS when it does not parse.
    """
    from google.protobuf import message
    from tensorflow.core.protobuf import saved_model_pb2

    file = os.path.join(path, "saved_model.pb")
    try:
        with tf.io.gfile.GFile(file, "rb") as f:
            data = f.read()
    except tf.errors.OpError as e:
        raise ServingError("NOT_FOUND", f"cannot read {file}: {e.message}") from None
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(data)
    except message.DecodeError as e:
        raise ServingError("DATA_LOSS", f"{file} is not a SavedModel: {e}") from None
    if not saved.meta_graphs:
        raise ServingError("DATA_LOSS", f"{file} holds no MetaGraph")
    defs = saved.meta_graphs[0].signature_def
    return {k: v for k, v in defs.items() if not k.startswith("__")}


def _specs(signature_def) -> dict:
    """{input name: (NumPy dtype, shape with None for an unknown size, or None)}."""
    specs = {}
    for name, info in signature_def.inputs.items():
        shape = info.tensor_shape
        dims = (
            None
            if shape.unknown_rank
            else tuple(d.size if d.size >= 0 else None for d in shape.dim)
        )
        specs[name] = (np.dtype(tf.as_dtype(info.dtype).as_numpy_dtype), dims)
    return specs


def conform(signature: str, name: str, value, spec) -> np.ndarray:
    """`value` as the array input `name` of `signature` takes.

    Raises:
      ServingError: INVALID_ARGUMENT naming the input when its dtype, rank or a fixed
        size differs from the signature's.
    """
    dtype, dims = spec
    array = np.asarray(value)
    strings = dtype.kind == "O"
    if strings and array.dtype.kind == "S":
        array = array.astype(object)
    if strings:
        if array.dtype != object or not all(isinstance(x, bytes) for x in array.flat):
            raise ServingError(
                "INVALID_ARGUMENT", f"input {name} of signature {signature} takes strings (bytes)"
            )
    elif array.dtype != dtype:
        raise ServingError(
            "INVALID_ARGUMENT",
            f"input {name} of signature {signature} takes {dtype.name}, got {array.dtype.name}",
        )
    if dims is not None and (
        array.ndim != len(dims)
        or any(d is not None and d != s for d, s in zip(dims, array.shape, strict=True))
    ):
        want = "[" + ", ".join("-1" if d is None else str(d) for d in dims) + "]"
        raise ServingError(
            "INVALID_ARGUMENT",
            f"input {name} of signature {signature} takes shape {want}, got {list(array.shape)}",
        )
    return array


class Servable:
    """One version, loaded.

    Args:
      path: the version folder.
      version: its number.
      parameters: `batching.BatchingParameters`, or None to run each request alone.
      model: the model's name (for the observer).
      observer: an `observer.Observer` told of each batch, or None.
      per_model: batched as the folder's batching_params.pbtxt says, not `parameters`
        (`batching.version_parameters`; without the file, not batched).

    Raises:
      ServingError: with the canonical code of what failed (DATA_LOSS for a corrupt
        saved_model.pb or warm-up file, INVALID_ARGUMENT for its batching_params.pbtxt,
        the TensorFlow error's code for the load).
    """

    def __init__(self, path, version, parameters=None, model="", observer=None, per_model=False):
        self.path, self.version, self.model = path, version, model
        self.signature_defs = read_signature_defs(path)
        if per_model:
            try:
                parameters = batching.version_parameters(path, parameters)
            except ValueError as e:
                raise ServingError("INVALID_ARGUMENT", str(e)) from None
        self.warmup_path = os.path.join(path, warmup.WARMUP_FILE)
        self.warmup_requests = self._read_warmup()
        try:
            self._loaded = tf.saved_model.load(path)
        except Exception as e:  # noqa: BLE001 - the load's error, with its code
            raise from_exception(e, f"loading {path}", load=True) from None
        self._specs = {k: _specs(v) for k, v in self.signature_defs.items()}
        self._run, self.batchers = {}, {}
        for name, fn in self._loaded.signatures.items():
            call = self._caller(fn)
            if parameters is not None:
                report = observer and functools.partial(observer.batch, model, name)
                call = batching.Batcher(call, parameters, rename_errors, report)
                self.batchers[name] = call
            self._run[name] = call

    def _read_warmup(self):
        if not tf.io.gfile.exists(self.warmup_path):
            return []
        try:
            return warmup.read_warmup(self.warmup_path)
        except ImportError:  # tensorflow-serving-api reads the file (sat-serve's extra)
            return []
        except warmup.WarmupError as e:
            raise ServingError(e.code, str(e)) from None

    @staticmethod
    def _caller(fn):
        specs = fn.structured_input_signature[1]

        def call(inputs):
            tensors = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()}
            return {k: v.numpy() for k, v in fn(**tensors).items()}

        return call

    def _signature(self, signature):
        """(its name, {input: (dtype, dims)}) of a signature ("" for the default).

        Raises:
          ServingError: INVALID_ARGUMENT for a signature the version does not have.
        """
        signature = signature or DEFAULT_SIGNATURE
        specs = self._specs.get(signature)
        if specs is None:
            raise ServingError(
                "INVALID_ARGUMENT", f'Serving signature name: "{signature}" not found'
            )
        return signature, specs

    def input_numpy_dtypes(self, signature: str) -> dict:
        """{input name: NumPy dtype (object for strings)} of a signature ("" for the
        default).

        Raises:
          ServingError: INVALID_ARGUMENT for a signature the version does not have.
        """
        return {k: dtype for k, (dtype, _) in self._signature(signature)[1].items()}

    def predict(self, signature: str, inputs: dict, deadline=None) -> dict:
        """The signature's outputs (NumPy) for NumPy `inputs`.

        Args:
          signature: its name; "" for `DEFAULT_SIGNATURE`.
          inputs: {input name: array}.
          deadline: a `batching.Deadline`, or None.

        Raises:
          ServingError: INVALID_ARGUMENT for an unknown signature or inputs it does not
            take, else the code of what failed (`batching.Batcher`).
        """
        signature, specs = self._signature(signature)
        if set(inputs) != set(specs):
            raise ServingError(
                "INVALID_ARGUMENT",
                f"signature {signature} takes inputs {sorted(specs)}, got {sorted(inputs)}",
            )
        arrays = {k: conform(signature, k, v, specs[k]) for k, v in inputs.items()}
        if len({len(a) if a.ndim else None for a in arrays.values()}) > 1:
            raise ServingError(
                "INVALID_ARGUMENT", f"the inputs of {signature} differ in their first dimension"
            )
        if signature in self.batchers:
            if any(a.ndim == 0 for a in arrays.values()):
                raise ServingError(
                    "INVALID_ARGUMENT", f"the inputs of {signature} need a first (batch) dimension"
                )
            return self.batchers[signature](arrays, deadline)
        try:
            return self._run[signature](arrays)
        except Exception as e:  # noqa: BLE001 - the error's code goes to the caller
            raise from_exception(e, f"{signature} of {self.path}") from None

    def warm_up(self, iterations: int = 1) -> int:
        """Runs the warm-up requests (through the batch queues, as requests do), each
        `iterations` times; returns how many requests there are.

        Raises:
          ServingError: naming the warm-up file and the request that failed, with its code.
        """
        for i, request in enumerate(self.warmup_requests):
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            for _ in range(iterations):
                try:
                    self.predict(request.model_spec.signature_name, inputs)
                except ServingError as e:
                    raise ServingError(
                        e.code, f"warm-up request {i} of {self.warmup_path}: {e.message}"
                    ) from None
        return len(self.warmup_requests)

    def close(self):
        """Runs what is queued, then stops the batch threads."""
        for batcher in self.batchers.values():
            batcher.close()
