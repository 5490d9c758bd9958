"""--model_config_file_poll_wait_seconds: a changed file reaches the manager, a bad one
keeps the config being served and is logged once, a refused one is offered again."""

import logging
import threading
import time

import pytest

from sat_tf.server import model_config
from sat_tf.server.config_poller import ConfigPoller

ONE = 'model_config_list { config { name: "a" base_path: "/m/a" model_platform: "tensorflow" } }'
TWO = ONE.replace(
    " } }", ' } config { name: "b" base_path: "/m/b" model_platform: "tensorflow" } }'
)


class Manager:
    """Takes configs as a manager's reload would, refusing while `refuse` is set."""

    def __init__(self):
        self.taken, self.offered, self.refuse = [], 0, None
        self.changed = threading.Event()

    def reload(self, config):
        self.offered += 1
        if self.refuse:
            raise model_config.ConfigError(self.refuse, "FAILED_PRECONDITION")
        self.taken.append([m.name for m in config.model_config_list.config])
        self.changed.set()


@pytest.fixture
def started(tmp_path):
    path = tmp_path / "models.config"
    path.write_text(ONE)
    manager = Manager()
    served = model_config.read_model_server_config(str(path))
    return path, manager, ConfigPoller(str(path), 60, manager.reload, served)


def test_a_changed_file_is_taken_and_an_unchanged_one_is_not(started):
    path, manager, poller = started
    assert poller.poll() is False and manager.offered == 0
    path.write_text(TWO)
    assert poller.poll() is True
    assert poller.poll() is False
    assert manager.taken == [["a", "b"]] and manager.offered == 1


def test_a_bad_file_keeps_the_config_and_is_logged_once(started, caplog):
    path, manager, poller = started
    path.write_text(TWO.replace("base_path", "base_pth", 1))
    with caplog.at_level(logging.ERROR, logger="sat_tf.server.config_poller"):
        assert [poller.poll(), poller.poll(), poller.poll()] == [False] * 3
    assert manager.offered == 0
    (record,) = caplog.records
    assert record.getMessage() == (
        f"{path}: kept the config being served: {path}:1:40: Message type "
        '"tensorflow.serving.ModelConfig" has no field named "base_pth".'
    )
    path.write_text(TWO)
    assert poller.poll() is True and manager.taken == [["a", "b"]]


def test_a_refused_config_is_offered_again_until_taken(started, caplog):
    path, manager, poller = started
    manager.refuse = "Request to assign label to version 2 of model a, which is not ..."
    path.write_text(TWO)
    with caplog.at_level(logging.ERROR, logger="sat_tf.server.config_poller"):
        assert [poller.poll(), poller.poll()] == [False, False]
    assert manager.offered == 2 and len(caplog.records) == 1
    manager.refuse = None
    assert poller.poll() is True and manager.taken == [["a", "b"]]


def test_the_thread_polls_at_its_interval_and_stops(tmp_path):
    path = tmp_path / "models.config"
    path.write_text(ONE)
    manager = Manager()
    served = model_config.read_model_server_config(str(path))
    poller = ConfigPoller(str(path), 0.05, manager.reload, served)
    poller.start()
    try:
        path.write_text(TWO)
        assert manager.changed.wait(timeout=30)
        assert manager.taken == [["a", "b"]]
    finally:
        poller.stop()
    assert not poller._thread.is_alive()


def test_no_interval_reads_nothing(started):
    path, manager, poller = started
    poller = ConfigPoller(str(path), 0, manager.reload, poller._taken)
    poller.start()
    path.write_text(TWO)
    time.sleep(0.2)
    poller.stop()
    assert poller._thread is None and manager.offered == 0
