"""Errors as they travel through the server: a canonical code (gRPC's and TensorFlow's
status codes) from where a request fails to the edge, where gRPC passes it through and
`HTTP_STATUS`, the one table, turns it into the REST answer's status as TF Serving's REST
server does (model_servers/http_server.cc).

`from_exception` gives any exception its code: a `ServingError` keeps its own, a
TensorFlow `OpError` carries the canonical code it was raised with (out of memory is
RESOURCE_EXHAUSTED, a failed assertion INVALID_ARGUMENT), Python's MemoryError is
RESOURCE_EXHAUSTED; anything else is a bug of the server, logged with its traceback and
answered INTERNAL with a message that carries none of its text.
"""

import logging
import re

# The canonical codes in the order of their numbers (google.rpc.Code, tensorflow.error.Code).
CODES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
# Canonical code -> HTTP status of the REST answer; a code not listed is 500.
HTTP_STATUS = {
    "OK": 200,
    "CANCELLED": 499,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "UNAUTHENTICATED": 401,
}
INTERNAL_MESSAGE = "internal error of the server; its log has the details"
# How a failed tf.debugging.Assert reads inside TensorFlow's error message.
_ASSERTION = re.compile(r"assertion failed: \[(.*?)\]\n", re.S)

_log = logging.getLogger(__name__)


class ServingError(Exception):
    """A request the server cannot answer: its canonical `code` and a `message` for the
    client.

    Raises:
      ValueError: for a code that is not one of `CODES`.
    """

    def __init__(self, code: str, message: str):
        if code not in CODES:
            raise ValueError(f"{code!r} is not a canonical status code")
        super().__init__(message)
        self.code, self.message = code, message

    @property
    def http_status(self) -> int:
        """The REST answer's status for this error."""
        return http_status(self.code)

    def __str__(self):
        return f"{self.code}: {self.message}"


def http_status(code: str) -> int:
    """The HTTP status of a canonical code (`HTTP_STATUS`, else 500)."""
    return HTTP_STATUS.get(code, 500)


def error_line(e: Exception) -> str:
    """One line for a refused call: the text of a failed assertion (how exports made
    before `serving_default`'s `status` output refuse a bad image), else the first line."""
    message = getattr(e, "message", None) or str(e)
    found = _ASSERTION.search(message)
    return ((found.group(1) if found else message).strip().splitlines() or [""])[0]


def from_exception(e: BaseException, what: str = "the request", load: bool = False) -> ServingError:
    """`e` as a `ServingError` with its canonical code (a missing file NOT_FOUND, one not
    allowed PERMISSION_DENIED). Another exception is logged with its traceback (naming
    `what` failed) and becomes INTERNAL without its text, or for a `load` (whose error
    the version's status shows) UNKNOWN with its first line."""
    if isinstance(e, ServingError):
        return e
    code = getattr(e, "error_code", None)
    if isinstance(code, int) and 0 < code < len(CODES) and _is_op_error(e):
        return ServingError(CODES[code], error_line(e))
    if isinstance(e, MemoryError):
        return ServingError("RESOURCE_EXHAUSTED", "out of memory")
    if isinstance(e, (FileNotFoundError, PermissionError)):
        code = "NOT_FOUND" if isinstance(e, FileNotFoundError) else "PERMISSION_DENIED"
        return ServingError(code, error_line(e))
    _log.error("%s failed", what, exc_info=(type(e), e, e.__traceback__))
    if load:
        return ServingError("UNKNOWN", f"{type(e).__name__}: {error_line(e)}")
    return ServingError("INTERNAL", INTERNAL_MESSAGE)


def _is_op_error(e) -> bool:
    import tensorflow as tf

    return isinstance(e, tf.errors.OpError)
