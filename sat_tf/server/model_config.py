"""The operators' files, as TF Serving's `tensorflow_model_server` reads them: a
ModelServerConfig (--model_config_file), a MonitoringConfig (--monitoring_config_file) and
an SSLConfig (--ssl_config_file), each a text protobuf parsed with `text_format` into its
message and checked once, so that a bad file ends the start with one line naming the file
and the field. Also TF Serving's rule for version labels (server_core.cc
`UpdateModelVersionLabelMap`), which the manager applies at every config it takes.

Files are read through `tf.io.gfile`, so gs:// and local paths take the same road.
"""

import os
import re

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from sat_tf.server.errors import ServingError
from sat_tf.server.protos import monitoring_config_pb2, ssl_config_pb2

# Where TF Serving serves the metrics page when prometheus_config.path is empty
# (PrometheusExporter::kPrometheusPath).
DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"
PLATFORM = "tensorflow"  # the one model_platform TF Serving's default build (and sat-serve) serves
TENSORFLOW_MODEL_TYPE = model_server_config_pb2.TENSORFLOW  # the deprecated model_type's spelling
# What TF Serving takes as an absolute path or a URI (`UriIsRelativePath` is false).
_ABSOLUTE = re.compile(r"^(/|[A-Za-z][A-Za-z0-9+.-]*://)")


class ConfigError(ServingError, ValueError):
    """A file or message that cannot be served, with one line naming it and the field;
    `code` is the canonical error code TF Serving answers it with."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT"):
        super().__init__(code, message)

    def __str__(self):
        return self.message


def read_text(path: str) -> str:
    """The UTF-8 text of the file at `path` (local or a URI `tf.io.gfile` reads)."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    except tf.errors.OpError as e:
        code = "NOT_FOUND" if isinstance(e, tf.errors.NotFoundError) else "INVALID_ARGUMENT"
        raise ConfigError(f"{path}: cannot be read: {e.message}", code) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None


def parse(text: str, message, source: str):
    """`message` filled from the text protobuf `text`, or a ConfigError whose line names
    `source`, the line and column, and the field text_format stopped at."""
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as e:
        what = str(e).split(" : ", 1)[-1] if e.GetLine() else str(e)
        where = f"{source}:{e.GetLine()}:{e.GetColumn()}" if e.GetLine() else source
        raise ConfigError(" ".join(f"{where}: {what}".split())) from None


def read_model_server_config(path: str) -> model_server_config_pb2.ModelServerConfig:
    """The ModelServerConfig of --model_config_file, checked (`check_model_server_config`)."""
    config = parse(read_text(path), model_server_config_pb2.ModelServerConfig(), path)
    check_model_server_config(config, path)
    return config


def read_monitoring_config(path: str) -> monitoring_config_pb2.MonitoringConfig:
    """The MonitoringConfig of --monitoring_config_file; an enabled page's path must be
    one a URL can hold (it starts with "/")."""
    config = parse(read_text(path), monitoring_config_pb2.MonitoringConfig(), path)
    prometheus = config.prometheus_config
    if prometheus.enable and prometheus.path and not prometheus.path.startswith("/"):
        raise ConfigError(
            f"{path}: prometheus_config.path: {prometheus.path!r} does not start with /"
        )
    return config


def prometheus_path(config: monitoring_config_pb2.MonitoringConfig) -> str | None:
    """The REST path of the metrics page, or None when the config does not enable it."""
    prometheus = config.prometheus_config
    return (prometheus.path or DEFAULT_PROMETHEUS_PATH) if prometheus.enable else None


def read_ssl_config(path: str) -> ssl_config_pb2.SSLConfig:
    """The SSLConfig of --ssl_config_file, as parsed; `tls.server_credentials` checks its
    PEM text."""
    return parse(read_text(path), ssl_config_pb2.SSLConfig(), path)


def single_model_config(name: str, base_path: str) -> model_server_config_pb2.ModelServerConfig:
    """The config --model_name and --model_base_path stand for (TF Serving's
    `BuildSingleModelConfig`): one model, the "tensorflow" platform, the default policy.
    A relative local path is taken from the working directory, where TF Serving refuses
    it."""
    if not _ABSOLUTE.match(base_path):
        base_path = os.path.abspath(base_path)
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name=name, base_path=base_path, model_platform=PLATFORM)
    return config


def check_model_server_config(config, source: str) -> None:
    """Raises a ConfigError naming `source` (a file, or the request that carried the
    message) and the field, for the first thing in `config` sat-serve cannot serve: a
    custom_model_config, a model without a name or listed twice, a base_path that is
    empty or relative, a platform other than "tensorflow", a logging_config, a version
    policy that names no version or a negative one, or a label that is empty, names a
    negative version or one a `specific` policy never loads."""
    if config.WhichOneof("config") == "custom_model_config":
        raise ConfigError(f"{source}: custom_model_config: not supported; use model_config_list")
    seen = set()
    for i, model in enumerate(config.model_config_list.config):
        where = f"{source}: model_config_list.config[{i}]"
        if not model.name:
            raise ConfigError(f"{where}.name: empty; each model needs a name")
        where += f' (model "{model.name}")'
        if model.name in seen:
            raise ConfigError(f"{where}.name: the model is listed twice")
        seen.add(model.name)
        _check_model(model, where)


def _check_model(model, where: str) -> None:
    if not model.base_path:
        raise ConfigError(f"{where}.base_path: empty; it names the folder of the versions")
    if not _ABSOLUTE.match(model.base_path):
        raise ConfigError(
            f"{where}.base_path: {model.base_path!r} is relative; TF Serving takes an "
            "absolute path or a URI"
        )
    if model.model_type and model.model_platform:
        raise ConfigError(f"{where}.model_type: set beside model_platform; keep model_platform")
    if model.model_type and model.model_type != TENSORFLOW_MODEL_TYPE:
        raise ConfigError(f"{where}.model_type: only TENSORFLOW is served")
    if not model.model_type and model.model_platform != PLATFORM:
        given = repr(model.model_platform) if model.model_platform else "empty"
        raise ConfigError(f'{where}.model_platform: {given}; sat-serve serves "{PLATFORM}"')
    if model.HasField("logging_config"):
        raise ConfigError(f"{where}.logging_config: request logging is not supported")
    policy = model.model_version_policy
    specific = (
        policy.specific.versions if policy.WhichOneof("policy_choice") == "specific" else None
    )
    if specific is not None and not specific:
        raise ConfigError(f"{where}.model_version_policy.specific: names no version")
    if specific is not None and min(specific) < 0:
        raise ConfigError(
            f"{where}.model_version_policy.specific.versions: {min(specific)} is negative"
        )
    for label, version in sorted(model.version_labels.items()):
        if not label:
            raise ConfigError(f"{where}.version_labels: a label is empty")
        if version < 0:
            raise ConfigError(f'{where}.version_labels["{label}"]: version {version} is negative')
        if specific is not None and version not in specific:
            raise ConfigError(
                f'{where}.version_labels["{label}"]: version {version} is not among '
                f"model_version_policy.specific.versions {sorted(set(specific))}"
            )


def check_base_paths(config, source: str) -> None:
    """Raises a ConfigError (NOT_FOUND) naming `source` and the field for the first model
    whose base_path is not a folder `tf.io.gfile` finds (TF Serving's source refuses the
    config for it)."""
    import tensorflow as tf

    for i, model in enumerate(config.model_config_list.config):
        if not tf.io.gfile.isdir(model.base_path):
            raise ConfigError(
                f'{source}: model_config_list.config[{i}] (model "{model.name}").base_path: '
                f"{model.base_path} is not a folder",
                "NOT_FOUND",
            )


def assign_labels(
    model: str,
    labels: dict,
    available,
    current: dict,
    allow_unavailable: bool = False,
) -> dict:
    """The labels a config gives `model` ({label: version}), as TF Serving assigns them.

    A label may name only a version that is AVAILABLE now (`available`), unless
    `allow_unavailable` (--allow_version_labels_for_unavailable_models) and the label is
    new or keeps its version (`current` holds the model's labels before this config):
    then a version that is still loading may be named, but a label is never moved to a
    version that cannot answer yet.

    Raises:
        ConfigError: FAILED_PRECONDITION, with TF Serving's message, for the first label
            (by name) that may not be assigned.
    """
    for label, version in sorted(labels.items()):
        keeps_or_new = current.get(label, version) == version
        if version not in available and not (allow_unavailable and keeps_or_new):
            raise ConfigError(
                f"Request to assign label to version {version} of model {model}, which is "
                f'not currently available for inference (version_labels["{label}"])',
                "FAILED_PRECONDITION",
            )
    return dict(labels)
