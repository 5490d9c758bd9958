"""What the operators' files of tensorflow_model_server add to sat-serve, read once at
start: the models (--model_config_file, or the one model of --model_name and
--model_base_path), the metrics page (--monitoring_config_file) with the observer that
fills it, and the gRPC port's TLS (--ssl_config_file). A file that cannot be served ends
the start with one line naming the file and the field (`model_config.ConfigError`).
With --model_config_file_poll_wait_seconds the model config file is read again while the
server runs (`config_poller`).

Every file and base path is read through `tf.io.gfile`, as TF Serving reads them through
TensorFlow's Env: a local path or a URI of a file system TensorFlow has (gs://). The
SavedModels under a base path are loaded by TensorFlow from where they are; nothing is
copied.
"""

import dataclasses

from sat_tf.server import model_config


@dataclasses.dataclass(frozen=True)
class Additions:
    """What the files add.

    Attributes:
      config: the `ModelServerConfig` to serve.
      source: where it comes from (the file, or --model_base_path), for start errors.
      watcher: an `observer.Observer` filling the metrics, or None.
      routes: {path: WSGI app} of the REST port's other pages (the metrics page).
      credentials: `grpc.ServerCredentials` of the gRPC port, or None (insecure).
    """

    config: object
    source: str
    watcher: object = None
    routes: dict = dataclasses.field(default_factory=dict)
    credentials: object = None


def read_model_config(path: str):
    """The ModelServerConfig of --model_config_file, checked as a whole: its fields
    (`model_config.read_model_server_config`) and every base path a folder.

    Raises:
      model_config.ConfigError: naming `path` and the field.
    """
    config = model_config.read_model_server_config(path)
    model_config.check_base_paths(config, path)
    return config


def thread_pool_name(options, parameters) -> str:
    """The batch threads' name in the metrics, as TF Serving names them: the batching
    parameters' thread_pool_name, else TF's default "batch_threads" for a batching file
    and "model_server_batch_threads" without one."""
    if parameters is not None and parameters.thread_pool_name:
        return parameters.thread_pool_name
    return "batch_threads" if options.batching_parameters_file else "model_server_batch_threads"


def read(options, parameters=None) -> Additions:
    """The `Additions` of `options` (`options.ServerOptions`), batching with
    `parameters` (`batching.BatchingParameters`, for the metrics' thread pool name).

    Raises:
      model_config.ConfigError: for a file that cannot be served.
    """
    if options.model_config_file:
        source = options.model_config_file
        config = read_model_config(source)
    else:
        source = options.model_base_path
        config = model_config.single_model_config(options.model_name, options.model_base_path)
    watcher, routes, credentials = None, {}, None
    if options.monitoring_config_file:
        path = model_config.prometheus_path(
            model_config.read_monitoring_config(options.monitoring_config_file)
        )
        if path is not None:
            from sat_tf.server import prometheus

            metrics = prometheus.ServerMetrics()
            watcher = prometheus.MetricsObserver(metrics, thread_pool_name(options, parameters))
            routes[path] = metrics.page_app
    if options.ssl_config_file:
        from sat_tf.server import tls

        credentials = tls.read_credentials(options.ssl_config_file)
    return Additions(config, source, watcher, routes, credentials)


def config_poller(options, manager):
    """The started `config_poller.ConfigPoller` of --model_config_file every
    --model_config_file_poll_wait_seconds, handing each new config to `manager`; None
    without a file or with a wait of 0 (the file is read once, at start)."""
    if not options.model_config_file or options.model_config_file_poll_wait_seconds <= 0:
        return None
    from sat_tf.server.config_poller import ConfigPoller

    poller = ConfigPoller(
        options.model_config_file,
        options.model_config_file_poll_wait_seconds,
        manager.reload_config,
        manager.config,
        read=read_model_config,
    )
    poller.start()
    return poller
