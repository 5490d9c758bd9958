"""What the server tells those who watch it, as two interfaces whose methods do nothing
here: a `Listener` follows the state of every model version, each new config and the
start of a drain (a health service answers from them), an `Observer` is told of every
request, batch and warm-up as it happens (a metrics exporter counts them). Both are
called from the server's own threads and must return at once; an exception they raise
is logged and goes no further.

`VersionStatus` is one version's state as TF Serving's `GetModelStatusResponse` gives it
(ModelVersionStatus: START, LOADING, AVAILABLE, UNLOADING, END, with the status of its
last load).
"""

import dataclasses
import logging

STATES = ("START", "LOADING", "AVAILABLE", "UNLOADING", "END")

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """One version of one model.

    Attributes:
      model: the model's name.
      version: the version number (its folder's name).
      state: one of `STATES`.
      error_code: the canonical code of its last load ("OK", or why it failed).
      error_message: the error's text ("" for OK).
    """

    model: str
    version: int
    state: str
    error_code: str = "OK"
    error_message: str = ""


class Listener:
    """Follows the manager's versions, its config and the drain (`Manager.add_listener`)."""

    def version_changed(self, status: VersionStatus) -> None:
        """A version entered a state (`status.state`), or its status changed."""

    def config_changed(self, config) -> None:
        """A new `ModelServerConfig` is served (`Manager.reload_config` ended, its labels
        taken or not); models may have come or gone without a version changing."""

    def draining(self) -> None:
        """The server stopped taking new connections and finishes what it accepted."""


class Observer:
    """Told of the server's work as it happens (the server's `observer`).

    Labels follow TF Serving's metrics: `api` is the method ("predict",
    "get_model_status", "get_model_metadata"), `entrypoint` "REST" or "GRPC", `code` the
    canonical code of the answer.
    """

    def request(
        self, model: str, api: str, entrypoint: str, code: str, seconds: float, examples: int
    ) -> None:
        """A request was answered in `seconds`; `examples` is the images it held (0 for
        a request without inputs; `model` is "" when the request named none)."""

    def batch(
        self,
        model: str,
        signature: str,
        sizes: tuple[int, ...],
        padding: int,
        queued_seconds: tuple[float, ...],
    ) -> None:
        """A batch ran: the sizes of the pieces of requests it joined (their sum is the
        processed batch size without padding), the padding rows added for
        `allowed_batch_sizes`, and how long each piece waited in the queue."""

    def warmup(
        self, model: str, version: int, path: str, code: str, seconds: float, records: int
    ) -> None:
        """A version's warm-up file (`path`) ran `records` requests in `seconds`, ending
        with `code` ("OK" or why it failed)."""


def tell(what: str, call, *args) -> None:
    """Calls `call(*args)` (a listener's or observer's method); logs what it raises."""
    try:
        call(*args)
    except Exception:  # noqa: BLE001 - a watcher never breaks the server
        _log.exception("%s failed", what)
