"""--model_config_file_poll_wait_seconds: the model config file read again every few
seconds and handed to the manager when it changed, as TF Serving's
`Server::PollFilesystemAndReloadConfig` does. A file that does not parse or check, or a
config the manager refuses, keeps the config being served, and the log says why."""

import logging
import threading

from sat_tf.server import model_config

_log = logging.getLogger(__name__)


class ConfigPoller:
    """Reads `path` every `interval` seconds and calls `reload(config)` with each
    ModelServerConfig that differs from the last one `reload` took.

    A config `reload` refused is offered again at the next poll (so a label that named a
    version still loading is assigned once the version is AVAILABLE, as TF Serving's
    poll does), and a config taken from elsewhere (a HandleReloadConfigRequest) stands
    until the file changes. Each distinct failure is logged once.

    Args:
        path: the --model_config_file.
        interval: seconds between reads; 0 or less reads nothing (TF Serving reads the
            file once, at start).
        reload: the manager's reload: takes a checked ModelServerConfig and raises on a
            config it cannot take.
        served: the config read at start (what `reload` took last).
        read: reads and checks the file (`model_config.read_model_server_config`).
    """

    def __init__(
        self,
        path: str,
        interval: float,
        reload,
        served,
        read=model_config.read_model_server_config,
    ):
        self.path, self.interval, self._reload, self._read = path, interval, reload, read
        self._taken = served
        self._last_error = None
        self._stop = threading.Event()
        self._thread = None

    def poll(self) -> bool:
        """Reads the file once; whether `reload` took a new config from it."""
        try:
            config = self._read(self.path)
            if config == self._taken:
                self._last_error = None
                return False
            self._reload(config)
        except Exception as e:  # the poll thread outlives any bad file or refusal
            line = " ".join(str(e).split()) or type(e).__name__
            if line != self._last_error:
                _log.error("%s: kept the config being served: %s", self.path, line)
            self._last_error = line
            return False
        self._taken, self._last_error = config, None
        _log.info("%s: serving its new config", self.path)
        return True

    def start(self):
        """Polls in a daemon thread until `stop`; nothing when `interval` <= 0."""
        if self.interval > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="config-poll", daemon=True)
            self._thread.start()

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.poll()

    def stop(self, timeout: float = 10.0):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
