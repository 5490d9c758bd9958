"""The operators' files: TF Serving's text protobufs parsed into their messages, each bad
file refused with one line naming the file and the field, and TF Serving's label rule."""

import os

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from sat_tf.server import model_config
from sat_tf.server.model_config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "export", "serving", "examples")

GOOD = """
model_config_list {
  config {
    name: "a"
    base_path: "/models/a"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
  }
  config {
    name: "b"
    base_path: "gs://bucket/models/b"
    model_platform: "tensorflow"
  }
}
"""


def _write(tmp_path, text, name="models.config"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _model(fields):
    return f"model_config_list {{ config {{ {fields} }} }}"


A = 'name: "a" base_path: "/models/a" model_platform: "tensorflow"'


def test_a_config_with_two_models_policy_and_labels_is_read_field_by_field(tmp_path):
    config = model_config.read_model_server_config(_write(tmp_path, GOOD))
    a, b = config.model_config_list.config
    assert (a.name, a.base_path, a.model_platform) == ("a", "/models/a", "tensorflow")
    assert list(a.model_version_policy.specific.versions) == [1, 2]
    assert dict(a.version_labels) == {"stable": 1, "canary": 2}
    assert (b.name, b.base_path) == ("b", "gs://bucket/models/b")
    assert b.model_version_policy.WhichOneof("policy_choice") is None  # TF's default: latest 1


def test_the_example_files_parse_as_tf_serving_reads_them():
    config = model_config.read_model_server_config(os.path.join(EXAMPLES, "models.config"))
    models = {m.name: m for m in config.model_config_list.config}
    assert sorted(models) == ["sat", "sat_coco"]
    assert dict(models["sat"].version_labels) == {"stable": 1, "canary": 2}
    assert list(models["sat"].model_version_policy.specific.versions) == [1, 2]
    assert models["sat_coco"].model_version_policy.latest.num_versions == 2
    monitoring = model_config.read_monitoring_config(os.path.join(EXAMPLES, "monitoring.config"))
    assert model_config.prometheus_path(monitoring) == "/monitoring/prometheus/metrics"
    ssl = model_config.read_ssl_config(os.path.join(EXAMPLES, "ssl.config"))
    assert ssl.server_key.startswith("-----BEGIN PRIVATE KEY-----\n")
    assert ssl.server_cert.startswith("-----BEGIN CERTIFICATE-----\n")
    assert ssl.custom_ca.startswith("-----BEGIN CERTIFICATE-----\n") and ssl.client_verify


def test_files_are_read_through_tensorflows_file_systems():
    import tensorflow as tf

    path = "ram://model_config_test/models.config"
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(GOOD)
    config = model_config.read_model_server_config(path)
    assert [m.name for m in config.model_config_list.config] == ["a", "b"]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            _model(A + ' nme: "x"'),
            ':1:92: Message type "tensorflow.serving.ModelConfig" has no field named "nme".',
        ),
        (
            _model('name: "a" base_path: "/m" model_platform: "pytorch"'),
            ": model_config_list.config[0] (model \"a\").model_platform: 'pytorch'; sat-serve "
            'serves "tensorflow"',
        ),
        (
            _model('name: "a" base_path: "/m"'),
            ': model_config_list.config[0] (model "a").model_platform: empty; sat-serve serves '
            '"tensorflow"',
        ),
        (
            f"model_config_list {{ config {{ {A} }} config {{ {A} }} }}",
            ': model_config_list.config[1] (model "a").name: the model is listed twice',
        ),
        (
            _model('name: "a" model_platform: "tensorflow"'),
            ': model_config_list.config[0] (model "a").base_path: empty; it names the folder '
            "of the versions",
        ),
        (
            _model('name: "a" base_path: "models/a" model_platform: "tensorflow"'),
            ": model_config_list.config[0] (model \"a\").base_path: 'models/a' is relative; "
            "TF Serving takes an absolute path or a URI",
        ),
        (
            _model('base_path: "/m" model_platform: "tensorflow"'),
            ": model_config_list.config[0].name: empty; each model needs a name",
        ),
        (
            _model(
                A + ' version_labels { key: "canary" value: 3 } '
                "model_version_policy { specific { versions: 2 versions: 1 } }"
            ),
            ': model_config_list.config[0] (model "a").version_labels["canary"]: version 3 is '
            "not among model_version_policy.specific.versions [1, 2]",
        ),
        (
            _model(A + ' version_labels { key: "old" value: -1 }'),
            ': model_config_list.config[0] (model "a").version_labels["old"]: version -1 is '
            "negative",
        ),
        (
            _model(A + ' version_labels { key: "" value: 1 }'),
            ': model_config_list.config[0] (model "a").version_labels: a label is empty',
        ),
        (
            _model(A + " model_version_policy { specific { } }"),
            ': model_config_list.config[0] (model "a").model_version_policy.specific: names no '
            "version",
        ),
        (
            _model(A + " model_version_policy { specific { versions: 3 versions: -2 } }"),
            ': model_config_list.config[0] (model "a").model_version_policy.specific.versions: '
            "-2 is negative",
        ),
        (
            _model(A + " model_version_policy { latest { num_versions: 1 } all { } }"),
            ':1:142: Field "all" is specified along with field "latest", another member of '
            'oneof "policy_choice" for message type '
            '"tensorflow.serving.FileSystemStoragePathSourceConfig.ServableVersionPolicy".',
        ),
        (
            _model('name: "a" base_path: "/m" model_type: OTHER'),
            ': model_config_list.config[0] (model "a").model_type: only TENSORFLOW is served',
        ),
        (
            _model(A + " model_type: TENSORFLOW"),
            ': model_config_list.config[0] (model "a").model_type: set beside model_platform; '
            "keep model_platform",
        ),
        (
            _model(A + " logging_config { sampling_config { sampling_rate: 1 } }"),
            ': model_config_list.config[0] (model "a").logging_config: request logging is not '
            "supported",
        ),
        (
            'custom_model_config { type_url: "x" }',
            ": custom_model_config: not supported; use model_config_list",
        ),
        (
            _model('name: 3 base_path: "/m"'),
            ":1:36: 'model_config_list { config { name: 3 base_path: \"/m\" } }': Expected "
            "string but found: '3'",
        ),
    ],
)
def test_a_bad_model_config_is_one_line_naming_the_file_and_the_field(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        model_config.read_model_server_config(path)
    assert str(caught.value) == path + message
    assert caught.value.code == "INVALID_ARGUMENT"


def test_a_config_over_several_lines_names_the_line_and_column(tmp_path):
    text = GOOD.replace('    base_path: "gs://', '    base_pth: "gs://')
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        model_config.read_model_server_config(path)
    assert str(caught.value) == (
        f'{path}:13:5: Message type "tensorflow.serving.ModelConfig" has no field named "base_pth".'
    )


def test_a_message_from_a_request_is_checked_as_a_file_is():
    config = text_format.Parse(
        f"model_config_list {{ config {{ {A} }} config {{ {A} }} }}",
        model_server_config_pb2.ModelServerConfig(),
    )
    with pytest.raises(ConfigError, match=r"^HandleReloadConfigRequest: model_config_list"):
        model_config.check_model_server_config(config, "HandleReloadConfigRequest")


def test_a_missing_or_undecodable_file_is_named(tmp_path):
    missing = str(tmp_path / "nowhere.config")
    with pytest.raises(ConfigError, match=rf"^{missing}: cannot be read: ") as caught:
        model_config.read_model_server_config(missing)
    assert caught.value.code == "NOT_FOUND" and "\n" not in str(caught.value)
    binary = tmp_path / "binary.config"
    binary.write_bytes(b"model_config_list {}\n\xff\xfe")
    with pytest.raises(ConfigError) as caught:
        model_config.read_model_server_config(str(binary))
    assert str(caught.value) == f"{binary}: not UTF-8 text (byte 21)"


def test_an_empty_file_serves_no_model_as_in_tf_serving(tmp_path):
    config = model_config.read_model_server_config(_write(tmp_path, ""))
    assert config.WhichOneof("config") is None and not config.model_config_list.config


def test_the_single_model_flags_make_a_config_that_checks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given, taken in [
        ("/models/sat", "/models/sat"),
        ("gs://bucket/sat", "gs://bucket/sat"),
        ("exports/sat", f"{tmp_path}/exports/sat"),
    ]:
        config = model_config.single_model_config("sat", given)
        (model,) = config.model_config_list.config
        assert (model.name, model.base_path, model.model_platform) == ("sat", taken, "tensorflow")
        model_config.check_model_server_config(config, "--model_base_path")


@pytest.mark.parametrize(
    "text, path",
    [
        ("", None),
        ("prometheus_config { enable: false path: '/m' }", None),
        ("prometheus_config { enable: true }", "/monitoring/prometheus/metrics"),
        ("prometheus_config { enable: true path: '/metrics' }", "/metrics"),
    ],
)
def test_the_monitoring_config_gives_the_pages_path(tmp_path, text, path):
    config = model_config.read_monitoring_config(_write(tmp_path, text, "monitoring.config"))
    assert model_config.prometheus_path(config) == path


def test_a_bad_monitoring_config_is_named(tmp_path):
    path = _write(tmp_path, "prometheus_config { enable: true path: 'metrics' }", "m.config")
    with pytest.raises(ConfigError) as caught:
        model_config.read_monitoring_config(path)
    assert str(caught.value) == f"{path}: prometheus_config.path: 'metrics' does not start with /"
    path = _write(tmp_path, "prometheus_config { enabled: true }", "m.config")
    with pytest.raises(ConfigError) as caught:
        model_config.read_monitoring_config(path)
    assert str(caught.value) == (
        f'{path}:1:21: Message type "sat_tf.server.PrometheusConfig" has no field named "enabled".'
    )


def test_an_ssl_config_takes_pem_text_on_one_line_or_in_adjacent_strings(tmp_path):
    one_line = 'server_key: "-----BEGIN PRIVATE KEY-----\\nAAAA\\n-----END PRIVATE KEY-----\\n"'
    lines = (
        'server_key: "-----BEGIN PRIVATE KEY-----\\n"\n'
        '  "AAAA\\n"\n'
        '  "-----END PRIVATE KEY-----\\n"\n'
        "client_verify: true\n"
    )
    first = model_config.read_ssl_config(_write(tmp_path, one_line, "one.config"))
    second = model_config.read_ssl_config(_write(tmp_path, lines, "lines.config"))
    key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    assert first.server_key == second.server_key == key
    assert (first.client_verify, second.client_verify) == (False, True)


# TF Serving's rule (server_core.cc UpdateModelVersionLabelMap), case by case: the
# version the label names, the AVAILABLE versions, the label's version before this
# config (None: a new label), --allow_version_labels_for_unavailable_models.
@pytest.mark.parametrize(
    "version, available, before, allow, allowed",
    [
        (1, {1}, None, False, True),  # an available version
        (2, {1}, None, False, False),  # a version still loading, no flag
        (2, {1}, None, True, True),  # still loading, a new label, the flag
        (2, {1}, 2, True, True),  # still loading, the label keeps its version
        (3, {1, 2}, 2, True, False),  # moved to a version still loading
        (1, {1, 2}, 2, True, True),  # moved to an available version
        (1, {1, 2}, 2, False, True),
        (2, set(), 2, False, False),  # kept, but its version is gone, no flag
    ],
)
def test_labels_follow_tf_servings_rule(version, available, before, allow, allowed):
    current = {} if before is None else {"canary": before}
    labels = {"stable": 1, "canary": version}
    available = available | {1}  # "stable" always names an AVAILABLE version
    if allowed:
        assert model_config.assign_labels("a", labels, available, current, allow) == labels
        return
    with pytest.raises(ConfigError) as caught:
        model_config.assign_labels("a", labels, available, current, allow)
    assert str(caught.value) == (
        f"Request to assign label to version {version} of model a, which is not currently "
        'available for inference (version_labels["canary"])'
    )
    assert caught.value.code == "FAILED_PRECONDITION"
