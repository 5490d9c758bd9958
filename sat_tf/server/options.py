"""sat-serve's settings, each with its default and help once: TF Serving's flags
(tensorflow_model_server, model_servers/main.cc) under their names, with their defaults
where sat-serve does what they do and its own where it differs (`model_name`, batching
on), and the few settings TF Serving lacks. `sat_tf/cli/serve.py` makes its flags from
these fields; nothing here imports TensorFlow.
"""

import dataclasses


def _setting(default, help_text):
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """What sat-serve runs with; each field's `metadata["help"]` is its flag's help."""

    model_name: str = _setting(
        "sat", "Name of the model in URLs and requests (TF Serving's default: 'default')."
    )
    model_base_path: str = _setting(
        "",
        "Folder of the model's numbered version folders (exports), local or gs://; "
        "ignored with --model_config_file.",
    )
    model_config_file: str = _setting(
        "",
        "TF Serving's ModelServerConfig in text format: several models, their version "
        "policies and labels (then --model_name and --model_base_path are ignored).",
    )
    model_config_file_poll_wait_seconds: int = _setting(
        0, "Seconds between reads of --model_config_file; 0 reads it once, at start."
    )
    allow_version_labels_for_unavailable_models: bool = _setting(
        False,
        "A label may name a version that is not AVAILABLE yet (a label already in use still "
        "moves only to an AVAILABLE one).",
    )
    port: int = _setting(8500, "Port of the gRPC API; 0 picks a free one.")
    rest_api_port: int = _setting(8501, "Port of the REST API; 0 picks a free one.")
    host: str = _setting("0.0.0.0", "Address both APIs listen on ('::' for IPv6).")
    rest_api_num_threads: int = _setting(48, "Threads answering REST requests.")
    grpc_max_threads: int = _setting(
        48, "Threads answering gRPC calls (TF Serving's default: 4 per core)."
    )
    rest_api_enable_cors_support: bool = _setting(
        False, "REST answers carry CORS headers (any origin, POST and GET, Content-Type)."
    )
    rest_api_timeout_in_ms: int = _setting(
        30_000,
        "Deadline of a REST predict in ms: past it the answer is 429 while queued, 504 "
        "while running; 0: none.",
    )
    enable_batching: bool = _setting(
        True, "Batch concurrent requests into one call (TF Serving's default: off)."
    )
    batching_parameters_file: str = _setting(
        "",
        "TF Serving's BatchingParameters in text format; empty: "
        "export/serving/batching_parameters.txt's values.",
    )
    enable_per_model_batching_parameters: bool = _setting(
        False,
        "A version folder's batching_params.pbtxt batches its requests (the batch threads "
        "as --batching_parameters_file says); a version without one is not batched.",
    )
    enable_model_warmup: bool = _setting(
        True, "Run a version's assets.extra/tf_serving_warmup_requests before it serves."
    )
    num_request_iterations_for_warmup: int = _setting(
        0, "Times each warm-up request runs; used only if > 0 (else once)."
    )
    monitoring_config_file: str = _setting(
        "",
        "TF Serving's MonitoringConfig in text format: prometheus_config serves TF Serving's "
        "metrics on the REST port.",
    )
    ssl_config_file: str = _setting(
        "",
        "TF Serving's SSLConfig in text format (PEM text inline): TLS on the gRPC port, "
        "mutual with client_verify.",
    )
    enable_grpc_healthcheck_service: bool = _setting(
        False,
        "gRPC's grpc.health.v1.Health for the server, ModelService, PredictionService and "
        "each model, following their versions and the drain.",
    )
    file_system_poll_wait_seconds: float = _setting(
        1.0, "Seconds between looks for new or removed versions; 0 looks once."
    )
    max_num_load_retries: int = _setting(
        5, "Times a version that failed to load or warm up is tried again."
    )
    load_retry_interval_micros: int = _setting(
        60_000_000,
        "Microseconds between the tries of a version that failed to load (TF Serving's: 1 minute).",
    )
    max_body_bytes: int = _setting(
        64 * 2**20, "REST bodies and gRPC messages over this size are refused (413)."
    )
    version: bool = _setting(False, "Print sat-serve's and TensorFlow's versions and exit.")
    drain_seconds: float = _setting(
        20.0,
        "After SIGTERM, the most seconds spent finishing the requests accepted before it "
        "(TF Serving does not drain).",
    )
