"""The sat-serve process: the manager, the REST and gRPC ports over it, and its end.

`run` reads the operators' files (`operator_files`: the models, the metrics page, the
gRPC port's TLS), loads the models (a model none of whose versions loads ends the start,
as in TF Serving), binds both ports (a port that cannot be bound ends it with one line,
nothing left open), adds the gRPC health service when asked, polls the model config file
when asked, prints where it listens and serves until SIGTERM or SIGINT. Then it drains,
which TF Serving does not (tensorflow/serving#1853: Kubernetes waits for SIGKILL): the
manager is marked draining (its listeners hear it: health answers NOT_SERVING), the REST
port stops taking connections and gRPC refuses new predicts with UNAVAILABLE while it
still answers health checks; once the REST requests already accepted are answered, the
Watch streams end and the gRPC port closes after its calls under way; every queued batch
is finished, and the process exits 0 within `drain_seconds`.
"""

import concurrent.futures
import logging
import signal
import threading
import time

from sat_tf.server import grpc_api, operator_files
from sat_tf.server.http_server import RestServer
from sat_tf.server.rest_app import rest_app

_log = logging.getLogger(__name__)


class StartError(ValueError):
    """The server cannot start; the message says why in one line."""


class Server:
    """The REST and gRPC ports over a started manager.

    Args:
      manager: the `manager.Manager`.
      options: `options.ServerOptions` (ports, host, threads, limits).
      routes: {path: WSGI app} of other pages on the REST port.
      grpc_services: functions of the `grpc.Server` that add other services to it.
      grpc_credentials: `grpc.ServerCredentials` for the gRPC port; None for none.
      health: the `health.HealthService` added to the gRPC port (its Watch streams end
        with the drain), or None.

    Raises:
      StartError: naming the port that cannot be bound (neither port is left open).
    """

    def __init__(
        self, manager, options, routes=None, grpc_services=(), grpc_credentials=None, health=None
    ):
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self.manager, self._health = manager, health
        self._grpc = grpc.server(
            concurrent.futures.ThreadPoolExecutor(options.grpc_max_threads, "grpc"),
            options=[
                ("grpc.max_receive_message_length", options.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                # A port another process holds is an error, never a shared port.
                ("grpc.so_reuseport", 0),
            ],
        )
        prediction, models = grpc_api.servicers(manager)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(prediction, self._grpc)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(models, self._grpc)
        for add in grpc_services:
            add(self._grpc)
        if health is not None:
            health.add_to_server(self._grpc)
        app = rest_app(
            manager,
            options.rest_api_timeout_in_ms / 1000,
            routes,
            options.rest_api_enable_cors_support,
        )
        try:
            self._rest = RestServer(
                app,
                options.host,
                options.rest_api_port,
                options.rest_api_num_threads,
                options.max_body_bytes,
            )
        except OSError as e:
            address = _address(options.host, options.rest_api_port)
            raise StartError(
                f"cannot serve REST on {address} (--rest_api_port): {e.strerror}"
            ) from None
        address = _address(options.host, options.port)
        try:
            if grpc_credentials is None:
                self.grpc_port = self._grpc.add_insecure_port(address)
            else:
                self.grpc_port = self._grpc.add_secure_port(address, grpc_credentials)
        except RuntimeError as e:
            self._rest.stop_accepting()
            self._rest.stop(0)
            raise StartError(f"cannot serve gRPC on {address} (--port): {e}") from None
        self.rest_port = self._rest.port
        self._grpc.start()

    def drain(self, grace_seconds: float) -> None:
        """Stops taking requests, finishes what was accepted (at most `grace_seconds`),
        then stops the manager (its queued batches run first). The gRPC port stays open
        (health answers, new predicts refused) until the REST requests are answered."""
        deadline = time.monotonic() + grace_seconds
        self.manager.drain()
        self._rest.stop_accepting()
        self._rest.stop(grace_seconds)
        if self._health is not None:
            self._health.close()
        left = max(0.0, deadline - time.monotonic())
        self._grpc.stop(left).wait(left + 1)
        self.manager.stop()


def _address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def batching_parameters(options):
    """The `batching.BatchingParameters` of the flags: --batching_parameters_file's,
    sat-serve's own without it, None when batching is off.

    Raises:
      ValueError: for a batching file that cannot be read or parsed.
    """
    from sat_tf.server import batching

    if not options.enable_batching:
        return None
    if options.batching_parameters_file:
        return batching.read_parameters(options.batching_parameters_file)
    return batching.SERVE_DEFAULTS


def warmup_iterations(options) -> int:
    """Times each warm-up request runs: 0 with --enable_model_warmup=false, else
    --num_request_iterations_for_warmup when above 0, else once."""
    if not options.enable_model_warmup:
        return 0
    return max(1, options.num_request_iterations_for_warmup)


def manager_of(options, watcher=None, config=None, parameters=None):
    """The `manager.Manager` of `options` (not started): the models of `config` (a
    `ModelServerConfig`; None: the one model of --model_name / --model_base_path),
    batched with `parameters` (None: as `batching_parameters` reads them from the
    flags), `watcher` (an `observer.Observer`) told of its work.

    Raises:
      ValueError: for a batching file that cannot be read or parsed.
    """
    from sat_tf.server import manager, model_config

    manager_options = manager.ManagerOptions(
        parameters=parameters or batching_parameters(options),
        poll_wait_seconds=options.file_system_poll_wait_seconds,
        max_num_load_retries=options.max_num_load_retries,
        load_retry_interval_seconds=options.load_retry_interval_micros / 1e6,
        warmup_iterations=warmup_iterations(options),
        allow_version_labels_for_unavailable_models=(
            options.allow_version_labels_for_unavailable_models
        ),
        per_model_batching_parameters=options.enable_per_model_batching_parameters,
    )
    if config is None:
        config = model_config.single_model_config(options.model_name, options.model_base_path)
    return manager.Manager(config, manager_options, watcher)


def run(options, announce=print, *, listeners=(), **server) -> int:
    """Serves until SIGTERM or SIGINT, then drains; the exit status (0). A signal while
    the models load ends the load and the process.

    Args:
      options: `options.ServerOptions`.
      announce: called with the line saying where it listens, and with "stopped".
      listeners: `observer.Listener`s added to the manager before it starts.
      **server: `Server`'s routes, grpc_services and grpc_credentials, added to what
        the operators' files give.

    Raises:
      StartError: when a model does not become available or a port cannot be bound.
      ValueError: for a batching file that cannot be read, or an operator's file that
        cannot be served (`model_config.ConfigError`, naming the file and the field).
    """
    parameters = batching_parameters(options)  # the batching file, read once
    files = operator_files.read(options, parameters)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    poller = None
    try:
        manager = manager_of(options, files.watcher, files.config, parameters)
        server = _server_settings(options, manager, files, server)
        for listener in [*listeners, *filter(None, [server["health"]])]:
            manager.add_listener(listener)
        served = _start(manager, options, stop, server, files.source)
        if served is not None:
            poller = operator_files.config_poller(options, manager)
            models = ", ".join(m.name for m in manager.config.model_config_list.config)
            announce(
                f"serving {models} from {files.source}: REST on "
                f"{_address(options.host, served.rest_port)}, gRPC on "
                f"{_address(options.host, served.grpc_port)}"
            )
            stop.wait()
            _log.info("draining: finishing what was accepted (at most %s s)", options.drain_seconds)
            if poller is not None:
                poller.stop()
            served.drain(options.drain_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    announce("stopped")
    return 0


def _server_settings(options, manager, files, server):
    """`Server`'s keywords: the files' pages and credentials with the caller's, and the
    health service under --enable_grpc_healthcheck_service."""
    health = None
    if options.enable_grpc_healthcheck_service:
        from sat_tf.server.health import HealthService, ManagerState

        health = HealthService(ManagerState(manager))
    return {
        "routes": {**files.routes, **server.get("routes", {})},
        "grpc_services": server.get("grpc_services", ()),
        "grpc_credentials": server.get("grpc_credentials", files.credentials),
        "health": health,
    }


def _start(manager, options, stop, server, source):
    """The `Server` once the manager has loaded its models, or None when `stop` was set
    first (the manager then stopped). A label the config cannot give ends the start with
    `source` (the config file) named."""
    from sat_tf.server.errors import ServingError

    outcome = []
    starter = threading.Thread(
        target=lambda: outcome.append(_outcome(manager.start)), name="start", daemon=True
    )
    starter.start()
    while starter.is_alive() and not stop.wait(0.2):
        pass
    if stop.is_set() and starter.is_alive():
        manager.stop()
        starter.join()
        return None
    starter.join()
    try:
        if isinstance(outcome[0], ServingError):
            label = outcome[0].code == "FAILED_PRECONDITION"
            raise StartError(f"{source}: {outcome[0].message}" if label else outcome[0].message)
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return Server(manager, options, **server)
    except BaseException:
        manager.stop()
        raise


def _outcome(call):
    """What `call()` returned, or the exception it raised."""
    try:
        return call()
    except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
        return e
