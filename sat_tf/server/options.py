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
        "", "Folder of the model's numbered version folders (exports), local or gs://."
    )
    port: int = _setting(8500, "Port of the gRPC API; 0 picks a free one.")
    rest_api_port: int = _setting(8501, "Port of the REST API; 0 picks a free one.")
    host: str = _setting("0.0.0.0", "Address both APIs listen on ('::' for IPv6).")
    rest_api_num_threads: int = _setting(
        48, "Threads answering REST requests; the gRPC server gets as many."
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
    drain_seconds: float = _setting(
        20.0,
        "After SIGTERM, the most seconds spent finishing the requests accepted before it "
        "(TF Serving does not drain).",
    )
