"""gRPC health (grpc.health.v1.Health) for --enable_grpc_healthcheck_service, following
the models' state.

TF Serving sets "ModelService" and "PredictionService" to SERVING once at start and never
changes them. Here every name answers from the server's state, and Watch streams each
change:
- a model's name: SERVING while one of its versions is AVAILABLE and the server is not
  draining, NOT_SERVING otherwise; a model that leaves the config becomes unknown
  (Check: NOT_FOUND; Watch: SERVICE_UNKNOWN);
- "" (the whole server), "ModelService" and "PredictionService" (TF Serving's names) and
  their full names "tensorflow.serving.ModelService" and
  "tensorflow.serving.PredictionService": SERVING while some model has an AVAILABLE
  version and the server is not draining. A probe that must wait for one model asks for
  that model's name.

The state comes from a `ServingState` (`ManagerState` reads it from the manager);
whoever changes it calls `HealthService.refresh()`. The service is one of the manager's
listeners: a version's change, a new config and the drain refresh it. At the end of a
drain, `close()` ends every Watch stream (they would hold the gRPC server's stop for its
whole grace period).
"""

import threading
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sat_tf.server import observer
from sat_tf.server.errors import ServingError

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
# The names that answer for the whole server.
SERVER_NAMES = (
    health.OVERALL_HEALTH,
    "ModelService",
    "PredictionService",
    "tensorflow.serving.ModelService",
    "tensorflow.serving.PredictionService",
)


class ServingState(Protocol):
    """What health reads of the server."""

    def available(self) -> dict[str, bool]:
        """{model name: whether one of its versions is AVAILABLE} for every model of the
        config being served."""

    def draining(self) -> bool:
        """Whether the server has stopped taking requests (a SIGTERM's drain)."""


class ManagerState:
    """The `ServingState` of a `manager.Manager`: its config's models and its drain."""

    def __init__(self, manager):
        self._manager = manager

    def available(self) -> dict[str, bool]:
        return {m.name: self._serves(m.name) for m in self._manager.config.model_config_list.config}

    def _serves(self, name):
        try:
            return any(s.state == "AVAILABLE" for s in self._manager.status(name))
        except ServingError:  # no version yet
            return False

    def draining(self) -> bool:
        return self._manager.draining.is_set()


def statuses(available: dict[str, bool], draining: bool) -> dict[str, int]:
    """{service name: HealthCheckResponse status} for the server's names and each model's."""
    serving = {name: ok and not draining for name, ok in available.items()}
    server = any(serving.values())
    answers = {name: SERVING if server else NOT_SERVING for name in SERVER_NAMES}
    answers.update({name: SERVING if ok else NOT_SERVING for name, ok in serving.items()})
    return answers


class HealthService(health.HealthServicer, observer.Listener):
    """grpc-health-checking's servicer, its statuses set from `state` at each `refresh`.

    Add it to a server with `add_to_server`. Watch streams are non-blocking (they hold no
    server thread) and send a status only when it changes.
    """

    def __init__(self, state: ServingState):
        super().__init__()
        self._state = state
        self._shown: dict[str, int] = {health.OVERALL_HEALTH: SERVING}
        self._refresh_lock = threading.Lock()
        self._streams, self._streams_lock, self._closed = set(), threading.Lock(), False
        self.refresh()

    def refresh(self):
        """Reads the state and sends every status that changed to its watchers."""
        with self._refresh_lock:
            now = statuses(self._state.available(), self._state.draining())
            for name in sorted(set(self._shown) - set(now)):
                self.set(name, SERVICE_UNKNOWN)
            for name, status in sorted(now.items()):
                if self._shown.get(name) != status:
                    self.set(name, status)
            self._shown = now

    def version_changed(self, status):
        """A version changed its state: the statuses are read again."""
        self.refresh()

    def config_changed(self, config):
        """Models may have come or gone: the statuses are read again."""
        self.refresh()

    def draining(self):
        """The drain started: the statuses are read again."""
        self.refresh()

    def Watch(self, request, context, send_response_callback=None):  # noqa: N802
        """grpc-health-checking's Watch, each stream kept so that `close` can end it."""
        if send_response_callback is None:  # a server without non-blocking streams
            return super().Watch(request, context)
        ended = threading.Event()

        def send(response):
            with self._streams_lock:
                if ended.is_set():
                    return
                if response is None:
                    ended.set()
                    self._streams.discard(send)
            send_response_callback(response)

        with self._streams_lock:
            if self._closed:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
            self._streams.add(send)
        return super().Watch(request, context, send)

    def close(self):
        """Ends every Watch stream (its last status sent) and every one that comes."""
        with self._streams_lock:
            self._closed = True
            streams = list(self._streams)
        for send in streams:
            send(None)

    def Check(self, request, context):  # noqa: N802 - the proto's name
        answer = super().Check(request, context)
        if answer.status == SERVICE_UNKNOWN:  # a model that left the config
            context.set_code(grpc.StatusCode.NOT_FOUND)
            return health_pb2.HealthCheckResponse()
        return answer

    def add_to_server(self, server):
        health_pb2_grpc.add_HealthServicer_to_server(self, server)
