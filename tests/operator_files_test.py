"""Tests for sat_tf.server.operator_files: what --model_config_file, --monitoring_config_file
and --ssl_config_file add to a start, read through tf.io.gfile (here from TensorFlow's
ram:// file system, the road gs:// takes, with a model served from it), and the config
file polled while the server runs."""

import os
import time

import pytest
import tensorflow as tf
from fixtures import tiny_export, wait_until
from prometheus_client.parser import text_string_to_metric_families

from sat_tf.server import manager, model_config, operator_files, prometheus
from sat_tf.server.model_config import ConfigError
from sat_tf.server.options import ServerOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "export", "serving", "examples")


def _write(path, text):
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text)
    return path


def _copy_tree(source, target):
    for folder, _, files in tf.io.gfile.walk(source):
        relative = os.path.relpath(folder, source)
        here = target if relative == "." else f"{target}/{relative}"
        tf.io.gfile.makedirs(here)
        for name in files:
            tf.io.gfile.copy(os.path.join(folder, name), f"{here}/{name}", overwrite=True)


def _models(*names_and_paths, labels=""):
    configs = "".join(
        f'config {{ name: "{n}" base_path: "{p}" model_platform: "tensorflow" {labels} }} '
        for n, p in names_and_paths
    )
    return f"model_config_list {{ {configs}}}"


def test_one_model_without_files(tmp_path):
    files = operator_files.read(ServerOptions(model_name="m", model_base_path=str(tmp_path)))
    (model,) = files.config.model_config_list.config
    assert (model.name, model.base_path, model.model_platform) == ("m", str(tmp_path), "tensorflow")
    assert (files.source, files.watcher, files.routes, files.credentials) == (
        str(tmp_path),
        None,
        {},
        None,
    )


def test_a_config_file_on_another_file_system():
    # ram:// is a file system of TensorFlow's as gs:// is: read by tf.io.gfile, not open().
    base = "ram://operator_files/a"
    tf.io.gfile.makedirs(base)
    path = _write("ram://operator_files/models.config", _models(("a", base)))
    files = operator_files.read(ServerOptions(model_config_file=path))
    assert files.source == path
    assert [m.base_path for m in files.config.model_config_list.config] == [base]
    missing = _write(
        "ram://operator_files/missing.config", _models(("a", base), ("b", "ram://nowhere/b"))
    )
    with pytest.raises(ConfigError) as caught:
        operator_files.read(ServerOptions(model_config_file=missing))
    assert str(caught.value) == (
        f'{missing}: model_config_list.config[1] (model "b").base_path: ram://nowhere/b is not '
        "a folder"
    )
    assert caught.value.code == "NOT_FOUND"


def test_a_model_served_from_another_file_system():
    base = "ram://operator_files/served"
    _copy_tree(tiny_export(), base + "/3")
    served = manager.Manager(
        model_config.single_model_config("sat", base),
        manager.ManagerOptions(poll_wait_seconds=0, max_num_load_retries=0),
    )
    served.start()
    try:
        (status,) = served.status("sat")
        assert (status.version, status.state) == (3, "AVAILABLE")
        with served.servable("sat") as servable:
            assert servable.path == base + "/3"
    finally:
        served.stop()


def test_the_example_monitoring_config_serves_the_metrics_page(tmp_path):
    options = ServerOptions(
        model_base_path=str(tmp_path),
        monitoring_config_file=os.path.join(EXAMPLES, "monitoring.config"),
    )
    files = operator_files.read(options)
    assert list(files.routes) == ["/monitoring/prometheus/metrics"]
    assert isinstance(files.watcher, prometheus.MetricsObserver)
    assert files.watcher.thread_pool_name == "model_server_batch_threads"
    files.watcher.request("sat", "predict", "REST", "OK", 0.002, 3)
    files.watcher.request("sat", "get_model_status", "GRPC", "OK", 0.001, 0)  # not recorded
    started = []
    page = b"".join(
        files.routes["/monitoring/prometheus/metrics"]({}, lambda *a: started.append(a))
    )
    assert started == [
        (
            "200 OK",
            [("Content-Type", prometheus.CONTENT_TYPE), ("Content-Length", str(len(page)))],
        )
    ]
    families = {f.name: f for f in text_string_to_metric_families(page.decode())}
    (sample,) = families[":tensorflow:serving:request_count"].samples
    assert (sample.labels, sample.value) == ({"model_name": "sat", "status": "OK"}, 1.0)


def test_a_disabled_page_and_the_thread_pool_name(tmp_path):
    off = _write(str(tmp_path / "off.config"), "prometheus_config { enable: false }")
    files = operator_files.read(ServerOptions(model_base_path=".", monitoring_config_file=off))
    assert (files.watcher, files.routes) == (None, {})
    options = ServerOptions(batching_parameters_file="b.txt")
    assert operator_files.thread_pool_name(options, None) == "batch_threads"
    assert operator_files.thread_pool_name(ServerOptions(), None) == "model_server_batch_threads"


class Reloads:
    def __init__(self, config):
        self.config, self.taken = config, []

    def reload_config(self, config):
        self.taken.append(config)


def test_the_config_file_is_polled_only_when_asked(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    path = _write(str(tmp_path / "models.config"), _models(("a", str(a))))
    first = operator_files.read_model_config(path)
    assert operator_files.config_poller(ServerOptions(model_config_file=path), None) is None
    assert operator_files.config_poller(ServerOptions(model_base_path=str(a)), None) is None
    served = Reloads(first)
    options = ServerOptions(model_config_file=path, model_config_file_poll_wait_seconds=1)
    poller = operator_files.config_poller(options, served)
    try:
        time.sleep(1.5)
        assert served.taken == []  # the same config
        _write(path, _models(("a", str(a)), ("b", str(b))))
        wait_until(lambda: served.taken, 10, "the new config")
        assert [m.name for m in served.taken[0].model_config_list.config] == ["a", "b"]
    finally:
        poller.stop()
