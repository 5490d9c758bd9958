"""The sat-serve process: the manager, the REST and gRPC ports over it, and its end.

`run` loads the models (a model none of whose versions loads ends the start, as in TF
Serving), binds both ports (a port that cannot be bound ends it with one line, nothing
left open), prints where it listens and serves until SIGTERM or SIGINT. Then it drains,
which TF Serving does not (tensorflow/serving#1853: Kubernetes waits for SIGKILL): the
manager is marked draining (its listeners, e.g. a health service, hear it), both ports
stop taking connections (gRPC refuses new calls), every request already accepted and
every queued batch is finished, and the process exits 0 within `drain_seconds`.
"""

import concurrent.futures
import logging
import signal
import threading

from sat_tf.server import grpc_api
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

    Raises:
      StartError: naming the port that cannot be bound (neither port is left open).
    """

    def __init__(self, manager, options, routes=None, grpc_services=(), grpc_credentials=None):
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self.manager = manager
        self._grpc = grpc.server(
            concurrent.futures.ThreadPoolExecutor(options.rest_api_num_threads, "grpc"),
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
        app = rest_app(manager, options.rest_api_timeout_in_ms / 1000, routes)
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
        """Stops taking connections, finishes what was accepted (at most
        `grace_seconds`), then stops the manager (its queued batches run first)."""
        self.manager.drain()
        self._rest.stop_accepting()
        grpc_done = self._grpc.stop(grace_seconds)
        self._rest.stop(grace_seconds)
        grpc_done.wait(grace_seconds)
        self.manager.stop()


def _address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def manager_of(options, watcher=None, config=None):
    """The `manager.Manager` of `options` (not started): the models of `config` (a
    `ModelServerConfig`; None: the one model of --model_name / --model_base_path),
    batched with --batching_parameters_file's parameters (sat-serve's without it) unless
    batching is off, `watcher` (an `observer.Observer`) told of its work.

    Raises:
      ValueError: for a batching file that cannot be read or parsed.
    """
    from sat_tf.server import batching, manager

    parameters = None
    if options.enable_batching:
        parameters = batching.SERVE_DEFAULTS
        if options.batching_parameters_file:
            parameters = batching.read_parameters(options.batching_parameters_file)
    manager_options = manager.ManagerOptions(
        parameters=parameters,
        poll_wait_seconds=options.file_system_poll_wait_seconds,
        max_num_load_retries=options.max_num_load_retries,
        load_retry_interval_seconds=options.load_retry_interval_micros / 1e6,
    )
    if config is None:
        config = manager.one_model_config(options.model_name, options.model_base_path)
    return manager.Manager(config, manager_options, watcher)


def run(options, announce=print, *, config=None, watcher=None, listeners=(), **server) -> int:
    """Serves until SIGTERM or SIGINT, then drains; the exit status (0). A signal while
    the models load ends the load and the process.

    Args:
      options: `options.ServerOptions`.
      announce: called with the line saying where it listens, and with "stopped".
      config, watcher: `manager_of`'s.
      listeners: `observer.Listener`s added to the manager before it starts.
      **server: `Server`'s routes, grpc_services and grpc_credentials.

    Raises:
      StartError: when a model does not become available or a port cannot be bound.
      ValueError: for a batching file that cannot be read.
    """
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        manager = manager_of(options, watcher, config)
        for listener in listeners:
            manager.add_listener(listener)
        served = _start(manager, options, stop, server)
        if served is not None:
            announce(
                f"serving {options.model_name} from {options.model_base_path}: REST on "
                f"{_address(options.host, served.rest_port)}, gRPC on "
                f"{_address(options.host, served.grpc_port)}"
            )
            stop.wait()
            _log.info("draining: finishing what was accepted (at most %s s)", options.drain_seconds)
            served.drain(options.drain_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    announce("stopped")
    return 0


def _start(manager, options, stop, server):
    """The `Server` once the manager has loaded its models, or None when `stop` was set
    first (the manager then stopped)."""
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
            raise StartError(outcome[0].message)
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
