"""TF Serving's REST API as a WSGI app over the `Manager` (model_servers/
http_rest_api_handler.cc); it only translates.

    POST /v1/models/<name>[/versions/<v> | /labels/<label>]:predict
    GET  /v1/models/<name>[/versions/<v> | /labels/<label>]           the version states
    GET  /v1/models/<name>[/versions/<v> | /labels/<label>]/metadata  the signatures

Every answer is JSON; an error is `{"error": "..."}` with the HTTP status of its
canonical code (`errors.HTTP_STATUS`). An OPTIONS request (a browser's CORS preflight)
under /v1/ answers 200 with no body when it carries an http(s) Origin, else 400, as TF
Serving's does; with `cors` (--rest_api_enable_cors_support) every answer of the API
carries TF Serving's CORS headers. A predict runs under a deadline of
`timeout_seconds` (--rest_api_timeout_in_ms): past it the answer is 429 if the request
was still queued, 504 if its batch was running. Other paths under /v1/ are malformed
(400), paths elsewhere unknown (404), unless `routes` serves them.
"""

import http
import re
import time

from sat_tf.server import batching, errors, observer, reports, rest_codec
from sat_tf.server import servable as servable_lib
from sat_tf.server.errors import ServingError

_PATH = re.compile(
    r"/v1/models/(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>[0-9]+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<metadata>/metadata)?(?::(?P<verb>[A-Za-z]+))?"
)
_JSON = [("Content-Type", "application/json")]
# TF Serving's CORS headers (http_rest_api_util.cc `AddCORSHeaders`).
CORS_HEADERS = [
    ("Access-Control-Allow-Origin", "*"),
    ("Access-Control-Allow-Methods", "POST, GET"),
    ("Access-Control-Allow-Headers", "Content-Type"),
]
_ORIGIN = re.compile(r"https?://")


def reason(status: int) -> str:
    """The reason phrase of an HTTP status (499: nginx's "Client Closed Request")."""
    if status == 499:
        return "Client Closed Request"
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class _Call:
    """One request: what it asks for, as the route and the observer see it."""

    __slots__ = ("method", "path", "name", "version", "label", "api", "examples")

    def __init__(self, environ):
        self.method = environ["REQUEST_METHOD"]
        self.path = environ.get("PATH_INFO", "")
        self.name, self.version, self.label, self.api, self.examples = "", None, None, "", 0


def rest_app(manager, timeout_seconds: float = 30.0, routes: dict | None = None, cors=False):
    """TF Serving's REST API over `manager` as a WSGI app.

    Args:
      manager: the `manager.Manager`.
      timeout_seconds: the deadline of a predict (0 or less: none).
      routes: {path: WSGI app} of other pages served on the same port (e.g. metrics).
      cors: whether the API's answers carry `CORS_HEADERS`.
    """
    routes = dict(routes or {})
    headers = _JSON + CORS_HEADERS if cors else _JSON
    limit = f"the deadline of --rest_api_timeout_in_ms ({round(timeout_seconds * 1000)} ms)"

    def app(environ, start_response):
        start = time.perf_counter()
        call = _Call(environ)
        if call.path in routes:
            return routes[call.path](environ, start_response)
        try:
            status, answer = 200, _route(manager, call, environ, timeout_seconds, limit)
            code = "OK"
        except Exception as e:  # noqa: BLE001 - every error answers with its code
            error = errors.from_exception(e, f"{call.method} {call.path}")
            code, status = error.code, error.http_status
            answer = rest_codec.error_body(error.message)
        observer.tell(
            "the request report",
            manager.observer.request,
            call.name,
            call.api,
            "REST",
            code,
            time.perf_counter() - start,
            call.examples,
        )
        start_response(
            f"{status} {reason(status)}", [*headers, ("Content-Length", str(len(answer)))]
        )
        return [answer]

    return app


def _route(manager, call, environ, timeout_seconds, limit) -> bytes:
    """The answer's JSON bytes for one request (errors raised as `ServingError`)."""
    found = _PATH.fullmatch(call.path)
    if not call.path.startswith("/v1/"):
        raise ServingError("NOT_FOUND", f"no page at {call.path}")
    if call.method == "OPTIONS":
        if not _ORIGIN.search(environ.get("HTTP_ORIGIN", "")):
            raise ServingError("FAILED_PRECONDITION", "Origin header is missing in CORS preflight")
        return b""
    if found is None or call.method not in ("GET", "POST"):
        raise ServingError("INVALID_ARGUMENT", f"Malformed request: {call.method} {call.path}")
    call.name, call.label = found["name"], found["label"]
    call.version = int(found["version"]) if found["version"] else None
    if call.version is not None and call.version > 2**63 - 1:
        raise ServingError("INVALID_ARGUMENT", f"version {call.version} is out of range")
    verb, metadata = found["verb"], found["metadata"]
    if call.method == "POST" and verb and not metadata:
        if verb.lower() != "predict":
            raise ServingError(
                "UNIMPLEMENTED", f"sat-serve answers :predict; :{verb} is not implemented"
            )
        call.api = "predict"
        return _predict(manager, call, environ, timeout_seconds, limit)
    if call.method == "GET" and not verb:
        version = call.version
        if call.label is not None:
            version = manager.resolve(call.name, call.label)
        if metadata:
            call.api = "get_model_metadata"
            with manager.servable(call.name, version) as servable:
                response = reports.metadata_response(
                    call.name, servable.version, servable.signature_defs
                )
        else:
            call.api = "get_model_status"
            response = reports.status_response(manager.status(call.name, version))
        return rest_codec.dumps(reports.as_json(response))
    raise ServingError("INVALID_ARGUMENT", f"Malformed request: {call.method} {call.path}")


def _predict(manager, call, environ, timeout_seconds, limit) -> bytes:
    import orjson

    length = int(environ.get("CONTENT_LENGTH") or 0)
    try:
        body = orjson.loads(environ["wsgi.input"].read(length))
    except orjson.JSONDecodeError as e:
        raise ServingError("INVALID_ARGUMENT", f"the body is not JSON: {e}") from None
    deadline = None
    if timeout_seconds > 0:
        deadline = batching.Deadline.after(timeout_seconds, limit)
    with manager.servable(call.name, call.version, call.label) as servable:
        request = rest_codec.parse_predict(body, servable.input_numpy_dtypes)
        call.examples = servable_lib.examples(request.inputs)
        outputs = servable.predict(request.signature, request.inputs, deadline)
    return rest_codec.dumps(rest_codec.predict_answer(outputs, request.rows))
