"""A model server for sat_tf exports that speaks TF Serving's REST and gRPC APIs.

`ModelManager` watches `--model_base_path`, a folder of numbered version folders
(`sat-export --output=exports/sat/1` writes one), and serves the newest complete one (a
folder whose name is a number and that holds `saved_model.pb`; `sat-export` assembles
its export in a hidden folder and renames it into place, so a half-written export is
never a candidate). A new version is loaded and warmed up (its
`assets.extra/tf_serving_warmup_requests`) before it replaces the old one, as TF
Serving's default version policy (the latest one) does. Every signature runs through a
`batching.Batcher` unless batching is off.

`rest_app` is the REST API as a WSGI app (`POST /v1/models/<name>[/versions/<v>]:predict`
in row and columnar form, `GET /v1/models/<name>[/versions/<v>]` and `.../metadata`);
`grpc_servicers` are `PredictionService` (`Predict`, `GetModelMetadata`) and
`ModelService.GetModelStatus`. Errors carry TF Serving's status codes (`ServingError`).
"""

import base64
import concurrent.futures
import json
import logging
import os
import re
import threading
import time

import numpy as np
import tensorflow as tf

from sat_tf.server import batching
from sat_tf.serving import warmup

DEFAULT_SIGNATURE = "serving_default"
# How a failed tf.debugging.Assert reads inside TensorFlow's error message.
_ASSERTION = re.compile(r"assertion failed: \[(.*?)\]\n", re.S)

_log = logging.getLogger(__name__)


class ServingError(Exception):
    """A request the server cannot answer: a gRPC status code name and its HTTP status."""

    HTTP = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "UNAVAILABLE": 503, "INTERNAL": 500}

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message, self.http_status = code, message, self.HTTP[code]


def error_line(e: Exception) -> str:
    """One line for a refused call: the text of a failed assertion (how exports made
    before `serving_default`'s `status` output refuse a bad image), else the first line."""
    message = getattr(e, "message", str(e))
    found = _ASSERTION.search(message)
    return ((found.group(1) if found else message).strip().splitlines() or [""])[0]


def find_versions(base_path: str) -> list[int]:
    """The complete versions under `base_path`, oldest first: folders named by a number
    that hold `saved_model.pb`."""
    try:
        names = os.listdir(base_path)
    except OSError:
        return []
    return sorted(
        int(n)
        for n in names
        if n.isdigit() and os.path.isfile(os.path.join(base_path, n, "saved_model.pb"))
    )


class Servable:
    """One loaded version: its signatures, their `SignatureDef`s, their batchers
    (`batchers`: {signature: `batching.Batcher`}, empty without batching).

    Args:
      path: the version folder.
      version: its number.
      parameters: `batching.BatchingParameters`, or None to run each request alone.
    """

    def __init__(self, path: str, version: int, parameters=None):
        from tensorflow.core.protobuf import saved_model_pb2

        self.path, self.version = path, version
        self._loaded = tf.saved_model.load(path)
        saved = saved_model_pb2.SavedModel()
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            saved.ParseFromString(f.read())
        self.signature_defs = {
            k: v for k, v in saved.meta_graphs[0].signature_def.items() if not k.startswith("__")
        }
        self._run, self.batchers = {}, {}
        for name, fn in self._loaded.signatures.items():
            call = self._caller(fn)
            if parameters is not None:
                call = batching.Batcher(call, parameters, rebase=batching.rename_errors)
                self.batchers[name] = call
            self._run[name] = call

    @staticmethod
    def _caller(fn):
        specs = fn.structured_input_signature[1]

        def call(inputs):
            tensors = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()}
            return {k: v.numpy() for k, v in fn(**tensors).items()}

        return call

    def input_dtypes(self, signature: str) -> dict:
        """{input name: tf.DType} of a signature."""
        return {k: tf.as_dtype(v.dtype) for k, v in self.signature_defs[signature].inputs.items()}

    def predict(self, signature: str, inputs: dict) -> dict:
        """The signature's outputs (NumPy) for NumPy `inputs`.

        Raises:
          ServingError: INVALID_ARGUMENT for an unknown signature or inputs, or when the
            signature refuses them; UNAVAILABLE when the batch queue is full.
        """
        signature = signature or DEFAULT_SIGNATURE
        if signature not in self._run:
            raise ServingError(
                "INVALID_ARGUMENT", f'Serving signature key "{signature}" not found.'
            )
        wanted = set(self.signature_defs[signature].inputs)
        if set(inputs) != wanted:
            raise ServingError(
                "INVALID_ARGUMENT",
                f"signature {signature} takes inputs {sorted(wanted)}, got {sorted(inputs)}",
            )
        try:
            return self._run[signature](inputs)
        except batching.QueueFullError as e:
            raise ServingError("UNAVAILABLE", str(e)) from None
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            raise ServingError("INVALID_ARGUMENT", error_line(e)) from None

    def warm_up(self) -> int:
        """Runs the version's warm-up requests (if any); returns how many ran."""
        path = os.path.join(self.path, warmup.WARMUP_FILE)
        if not os.path.exists(path):
            return 0
        requests = warmup.read_warmup(path)
        for request in requests:
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            self.predict(request.model_spec.signature_name, inputs)
        return len(requests)

    def close(self):
        """Runs what is queued, then stops the batch threads."""
        for batcher in self.batchers.values():
            batcher.close()


class ModelManager:
    """Serves the newest complete version under `base_path` as `name`.

    Args:
      name: the model's name in URLs and requests.
      base_path: the folder of numbered version folders.
      parameters: `batching.BatchingParameters`, or None for no batching.
      poll_wait_seconds: seconds between looks for a new version; 0 or less looks once.
    """

    def __init__(self, name, base_path, parameters=None, poll_wait_seconds=1.0):
        self.name, self.base_path = name, base_path
        self.parameters, self.poll_wait_seconds = parameters, poll_wait_seconds
        self.servable = None
        self._stop = threading.Event()
        self._thread = None

    def poll(self) -> bool:
        """Loads and warms up the newest version if it is newer than the one served;
        whether a new one was loaded. A version that fails to load is logged and skipped."""
        versions = find_versions(self.base_path)
        if not versions or (self.servable and versions[-1] <= self.servable.version):
            return False
        version = versions[-1]
        try:
            servable = Servable(
                os.path.join(self.base_path, str(version)), version, self.parameters
            )
            warmed = servable.warm_up()
        except Exception as e:  # noqa: BLE001 - the old version goes on serving
            _log.error("version %d of %s failed to load: %s", version, self.name, e)
            return False
        old, self.servable = self.servable, servable
        _log.info("serving %s version %d (%d warm-up requests)", self.name, version, warmed)
        if old is not None:
            old.close()
        return True

    def start(self):
        """Loads the newest version now, then polls in a thread."""
        self.poll()
        if self.poll_wait_seconds > 0:
            self._thread = threading.Thread(target=self._loop, name="version-poll", daemon=True)
            self._thread.start()

    def _loop(self):
        while not self._stop.wait(self.poll_wait_seconds):
            self.poll()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.servable is not None:
            self.servable.close()

    def get(self, name: str, version: int | None = None) -> Servable:
        """The servable for a request of `name` (and `version`, None for the newest).

        Raises:
          ServingError: NOT_FOUND for another model, another version, or none loaded yet.
        """
        servable = self.servable
        wanted = f"Latest({name})" if version is None else f"{{ name: {name} version: {version} }}"
        if name != self.name or servable is None or version not in (None, servable.version):
            raise ServingError("NOT_FOUND", f"Servable not found for request: {wanted}")
        return servable


# The REST API.


def _decode_value(value, dtype):
    """A JSON value of a tensor (nested lists, {"b64": ...} for bytes) as NumPy."""

    def strings(v):
        if isinstance(v, list):
            return [strings(x) for x in v]
        if isinstance(v, dict) and set(v) == {"b64"}:
            return base64.b64decode(v["b64"], validate=True)
        if isinstance(v, str):
            return v.encode("utf-8")
        raise ValueError(f"expected a string or {{'b64': ...}}, got {type(v).__name__}")

    if dtype == tf.string:
        return np.array(strings(value), dtype=object)
    return np.array(value, dtype=dtype.as_numpy_dtype)


def _jsonable(array):
    """A NumPy output for the JSON answer: numbers as the array itself (`_dumps` writes
    it), strings as text (non-UTF-8 bytes as {"b64": ...})."""
    if array.dtype != object:
        return np.ascontiguousarray(array)

    def text(b):
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(b).decode("ascii")}

    return np.vectorize(text, otypes=[object])(array).tolist() if array.size else array.tolist()


def _named(value):
    """Whether a JSON value is an object of named inputs (not one {"b64": ...} value)."""
    return isinstance(value, dict) and set(value) != {"b64"}


def _predict_rest(servable, body):
    """A REST predict body (row or columnar) -> the answer's dict."""
    if not isinstance(body, dict) or ("instances" in body) == ("inputs" in body):
        raise ValueError('the body must be a JSON object with "instances" or "inputs"')
    signature = body.get("signature_name") or DEFAULT_SIGNATURE
    if signature not in servable.signature_defs:
        raise ServingError("INVALID_ARGUMENT", f'Serving signature key "{signature}" not found.')
    dtypes = servable.input_dtypes(signature)
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list) or not rows:
            raise ValueError('"instances" must be a non-empty list')
        if len(dtypes) == 1 and not any(_named(r) for r in rows):
            rows = [{next(iter(dtypes)): r} for r in rows]
        for row in rows:
            if not _named(row) or set(row) != set(dtypes):
                raise ValueError(f"signature {signature} takes inputs {sorted(dtypes)}")
        columns = {k: [r[k] for r in rows] for k in dtypes}
    else:
        columns = body["inputs"]
        if len(dtypes) == 1 and not _named(columns):
            columns = {next(iter(dtypes)): columns}
    if not isinstance(columns, dict) or set(columns) != set(dtypes):
        raise ValueError(f"signature {signature} takes inputs {sorted(dtypes)}")
    inputs = {k: _decode_value(v, dtypes[k]) for k, v in columns.items()}
    outputs = {k: _jsonable(v) for k, v in servable.predict(signature, inputs).items()}
    if "inputs" in body:
        return {"outputs": outputs if len(outputs) > 1 else next(iter(outputs.values()))}
    if len(outputs) == 1:
        return {"predictions": next(iter(outputs.values()))}
    n = len(next(iter(outputs.values())))
    return {"predictions": [{k: v[i] for k, v in outputs.items()} for i in range(n)]}


def model_status(name: str, version: int) -> dict:
    """The REST answer of `GET /v1/models/<name>`."""
    return {
        "model_version_status": [
            {
                "version": str(version),
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }


def model_metadata(name: str, servable: Servable) -> dict:
    """The REST answer of `GET /v1/models/<name>/metadata`."""
    from google.protobuf import json_format
    from tensorflow_serving.apis import get_model_metadata_pb2

    signatures = get_model_metadata_pb2.SignatureDefMap()
    for key, value in servable.signature_defs.items():
        signatures.signature_def[key].CopyFrom(value)
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(servable.version)},
        "metadata": {
            "signature_def": {
                "@type": "type.googleapis.com/tensorflow.serving.SignatureDefMap",
                **json_format.MessageToDict(signatures, preserving_proto_field_name=True),
            }
        },
    }


def _route(manager, method, path, read_body):
    """(HTTP status, answer dict) for one REST request."""
    prefix = "/v1/models/"
    if not path.startswith(prefix):
        raise ServingError("NOT_FOUND", f"Malformed request: {method} {path}")
    rest, _, verb = path[len(prefix) :].partition(":")
    parts = rest.split("/")
    name, version, what = parts[0], None, parts[1:]
    if what[:1] == ["versions"] and len(what) >= 2:
        if not what[1].isdigit():
            raise ServingError("INVALID_ARGUMENT", f"version {what[1]!r} is not a number")
        version, what = int(what[1]), what[2:]
    if method == "POST" and verb == "predict" and not what:
        try:
            body = json.loads(read_body())
        except (ValueError, UnicodeDecodeError) as e:
            raise ServingError("INVALID_ARGUMENT", f"the body is not JSON: {e}") from None
        servable = manager.get(name, version)
        try:
            return 200, _predict_rest(servable, body)
        except ValueError as e:
            raise ServingError("INVALID_ARGUMENT", str(e)) from None
    if method == "GET" and not verb and what in ([], ["metadata"]):
        servable = manager.get(name, version)
        if what:
            return 200, model_metadata(name, servable)
        return 200, model_status(name, servable.version)
    raise ServingError("NOT_FOUND", f"Malformed request: {method} {path}")


def _dumps(answer) -> bytes:
    """The answer as JSON bytes, its arrays written by orjson from their memory: a float32
    as the shortest decimal that reads back as the same float32 (TF Serving writes nine
    digits), about 20 x faster than the json module on the attention maps and half the
    bytes. Non-finite floats become null."""
    import orjson

    return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)


def rest_app(manager: ModelManager, max_body_bytes: int = 64 * 2**20, draining=None):
    """TF Serving's REST API over `manager` as a WSGI app.

    Args:
      manager: the `ModelManager`.
      max_body_bytes: larger bodies are refused (413) from their Content-Length.
      draining: a `threading.Event`; once set, new requests get 503.
    """

    def app(environ, start_response):
        try:
            if draining is not None and draining.is_set():
                raise ServingError("UNAVAILABLE", "the server is shutting down")
            length = int(environ.get("CONTENT_LENGTH") or 0)
            if length > max_body_bytes:
                status, answer = (
                    413,
                    {"error": f"the body ({length} bytes) is over {max_body_bytes}"},
                )
            else:
                status, answer = _route(
                    manager,
                    environ["REQUEST_METHOD"],
                    environ.get("PATH_INFO", ""),
                    lambda: environ["wsgi.input"].read(length),
                )
        except ServingError as e:
            status, answer = e.http_status, {"error": e.message}
        except Exception as e:  # noqa: BLE001 - one line, and the server goes on
            _log.exception("internal error")
            status, answer = 500, {"error": f"internal error: {type(e).__name__}: {e}"}
        data = _dumps(answer)
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large"}
        start_response(
            f"{status} {reason.get(status, 'Error')}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    return app


# The gRPC API.


def grpc_servicers(manager: ModelManager):
    """(PredictionService servicer, ModelService servicer) over `manager`; add them to a
    `grpc.server` with `add_PredictionServiceServicer_to_server` and
    `add_ModelServiceServicer_to_server`."""
    import grpc
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    def servable_of(spec, context):
        version = spec.version.value if spec.HasField("version") else None
        try:
            return manager.get(spec.name, version)
        except ServingError as e:
            context.abort(getattr(grpc.StatusCode, e.code), e.message)

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):  # noqa: N802 - the proto's name
            servable = servable_of(request.model_spec, context)
            signature = request.model_spec.signature_name or DEFAULT_SIGNATURE
            try:
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                outputs = servable.predict(signature, inputs)
            except ServingError as e:
                context.abort(getattr(grpc.StatusCode, e.code), e.message)
            except (TypeError, ValueError) as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            response = predict_pb2.PredictResponse()
            response.model_spec.name = manager.name
            response.model_spec.version.value = servable.version
            response.model_spec.signature_name = signature
            wanted = set(request.output_filter) or set(outputs)
            for name, value in outputs.items():
                if name in wanted:
                    response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
            return response

        def GetModelMetadata(self, request, context):  # noqa: N802
            servable = servable_of(request.model_spec, context)
            if list(request.metadata_field) != ["signature_def"]:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "Metadata field signature_def must be the one requested",
                )
            signatures = get_model_metadata_pb2.SignatureDefMap()
            for key, value in servable.signature_defs.items():
                signatures.signature_def[key].CopyFrom(value)
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = manager.name
            response.model_spec.version.value = servable.version
            response.metadata["signature_def"].Pack(signatures)
            return response

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        def GetModelStatus(self, request, context):  # noqa: N802
            servable = servable_of(request.model_spec, context)
            response = get_model_status_pb2.GetModelStatusResponse()
            status = response.model_version_status.add()
            status.version = servable.version
            status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
            return response

    return PredictionService(), ModelService()


def serve(
    manager,
    rest_api_port=8501,
    grpc_port=8500,
    host="0.0.0.0",
    threads=16,
    max_body_bytes=64 * 2**20,
):
    """Starts the REST (waitress) and gRPC servers over a started `manager`.

    Returns:
      a `Server`: its `rest_port` and `grpc_port` are the bound ports (useful with 0),
      `stop()` finishes the requests in flight and stops both.
    """
    return Server(manager, rest_api_port, grpc_port, host, threads, max_body_bytes)


class Server:
    """The running REST and gRPC servers of `serve`."""

    def __init__(self, manager, rest_api_port, grpc_port, host, threads, max_body_bytes):
        import grpc
        import waitress
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self.manager = manager
        self.draining = threading.Event()
        self._in_flight = 0
        self._idle = threading.Condition()
        app = rest_app(manager, max_body_bytes, self.draining)

        def counted(environ, start_response):
            with self._idle:
                self._in_flight += 1
            try:
                return app(environ, start_response)
            finally:
                with self._idle:
                    self._in_flight -= 1
                    self._idle.notify_all()

        self._rest = waitress.create_server(
            counted,
            host=host,
            port=rest_api_port,
            threads=threads,
            max_request_body_size=max_body_bytes,
            ident="sat-serve",
        )
        self.rest_port = self._rest.effective_port
        self._grpc = grpc.server(
            concurrent.futures.ThreadPoolExecutor(threads),
            options=[("grpc.max_receive_message_length", max_body_bytes)],
        )
        prediction, models = grpc_servicers(manager)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(prediction, self._grpc)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(models, self._grpc)
        self.grpc_port = self._grpc.add_insecure_port(f"{host}:{grpc_port}")
        if self.grpc_port == 0:
            raise ValueError(f"cannot serve gRPC on {host}:{grpc_port}")
        self._grpc.start()
        self._thread = threading.Thread(target=self._rest.run, name="rest", daemon=True)
        self._thread.start()

    def stop(self, grace_seconds: float = 30.0):
        """Answers new REST requests 503, lets those in flight finish (up to
        `grace_seconds`), then stops both servers and the manager."""
        self.draining.set()
        done = self._grpc.stop(grace_seconds)
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0, grace_seconds)
        # Waitress's threads hand the last answers to its loop, which writes them out; only
        # then may its wake-up pipe close (a thread pulling it after would fail).
        self._rest.task_dispatcher.shutdown(cancel_pending=False, timeout=grace_seconds)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and any(
            c.total_outbufs_len for c in list(self._rest.active_channels.values())
        ):
            time.sleep(0.01)
        self._rest.close()
        done.wait(grace_seconds)
        self.manager.stop()
