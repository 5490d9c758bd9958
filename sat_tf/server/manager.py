"""The manager: which versions of which models are loaded, and which requests they get
(TF Serving's ServerCore over an AspiredVersionsManager with the availability-preserving
policy).

The models come as TF Serving's `ModelServerConfig` (`model_config_list`: name,
base_path, model_version_policy, version_labels); `--model_name` and `--model_base_path`
make a one-model config, as in TF Serving, and `reload_config` swaps the whole config
live. One thread does the work: every `poll_wait_seconds` it lists each base path
(`versions`), marks the versions the policy aspires, and takes the policy's actions
(`availability`) one by one: a load (the servable with its batch queues, then its warm-up
requests through them) or an unload (once the requests holding the version have
finished, its batch queues run dry and close). A load that fails is tried again
`max_num_load_retries` times, `load_retry_interval_seconds` apart, its state LOADING with
the last error; then END with it, and not tried again until the version leaves the
aspired set and comes back (TF Serving's rule). A failed load keeps nothing: its threads
stop and its objects are freed. Every version the manager tried stays listed by `status`
with its state and error.

Requests take a version with `servable(...)` (the newest AVAILABLE one, a numbered one,
or a label's), held until the request ends: an unload waits for them, so a request never
meets a closed version. Listeners (`observer.Listener`) hear every state change and the
start of a drain.
"""

import contextlib
import dataclasses
import gc
import logging
import math
import threading
import time

from sat_tf.server import availability, batching, model_config, observer, versions
from sat_tf.server.errors import ServingError, from_exception
from sat_tf.server.servable import Servable

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ManagerOptions:
    """How the manager loads versions (TF Serving's flags of the same names).

    Attributes:
      parameters: `batching.BatchingParameters` of every servable, None for no batching.
      poll_wait_seconds: seconds between looks at the base paths; 0 or less looks once.
      max_num_load_retries: loads tried again after a failed one.
      load_retry_interval_seconds: seconds between those tries.
      warmup_iterations: times each warm-up request runs; 0 skips the warm-up.
      allow_version_labels_for_unavailable_models: a label may name a version that is
        not AVAILABLE (else the config is refused).
      per_model_batching_parameters: a version's batching_params.pbtxt batches it
        (`batching.version_parameters`).
    """

    parameters: batching.BatchingParameters | None = batching.SERVE_DEFAULTS
    poll_wait_seconds: float = 1.0
    max_num_load_retries: int = 5
    load_retry_interval_seconds: float = 60.0
    warmup_iterations: int = 1
    allow_version_labels_for_unavailable_models: bool = False
    per_model_batching_parameters: bool = False


def check_config(config) -> None:
    """Raises `model_config.ConfigError` (a ServingError, INVALID_ARGUMENT) for a
    `ModelServerConfig` sat-serve cannot serve (`model_config.check_model_server_config`)."""
    model_config.check_model_server_config(config, "the model config")


class _Version:
    """What the manager knows of one version."""

    def __init__(self, version, path):
        self.version, self.path, self.aspired = version, path, True
        self.state, self.code, self.message = "START", "OK", ""
        self.servable, self.attempts, self.retry_at, self.handles = None, 0, 0.0, 0


class _Model:
    """A model's config, the versions the manager knows and its labels."""

    def __init__(self, config):
        self.config, self.versions, self.labels, self.removed = config, {}, {}, False

    def available(self):
        return [v for v in self.versions.values() if v.state == "AVAILABLE"]

    def aspire(self, aspired: dict, moved):
        """Marks `aspired` ({version: folder}) the versions to serve: a version that left
        stops its tries (`moved(record, "END")`), a new one or one back after it left
        starts anew (`moved(record, "START")`)."""
        for record in self.versions.values():
            if record.aspired and record.version not in aspired:
                record.aspired = False
                if record.state == "LOADING":  # between tries: the tries end here
                    moved(record, "END")
        for version, path in aspired.items():
            record = self.versions.get(version)
            if record is None or (not record.aspired and record.state == "END"):
                record = self.versions[version] = _Version(version, path)
                moved(record, "START")
            record.aspired = True

    def next_action(self, now):
        """("load" | "unload", record) to do next, or None: a retry that is due, else the
        availability-preserving policy's choice."""
        for record in self.versions.values():
            if record.state == "LOADING" and record.aspired and record.retry_at <= now:
                return "load", record
        snapshots = [
            availability.Snapshot(v.version, v.state, v.aspired) for v in self.versions.values()
        ]
        action = availability.next_action(snapshots)
        return action and (action[0], self.versions[action[1]])

    def retry_times(self):
        return [v.retry_at for v in self.versions.values() if v.state == "LOADING" and v.aspired]


class Manager:
    """Serves the models of a `ModelServerConfig`.

    Args:
      config: a `ModelServerConfig` (`model_config.single_model_config` for one model).
      options: `ManagerOptions`.
      watcher: an `observer.Observer` told of warm-ups and batches (None: nobody).

    Raises:
      ServingError: INVALID_ARGUMENT for a config it cannot serve (`check_config`).
    """

    def __init__(self, config, options=ManagerOptions(), watcher=None):
        check_config(config)
        self.options, self.observer = options, watcher or observer.Observer()
        self.draining = threading.Event()
        self._config = config
        self._models = {m.name: _Model(m) for m in config.model_config_list.config}
        self._listeners, self._events = [], []
        self._cond = threading.Condition()
        self._reloading = threading.Lock()  # one config change at a time
        self._stopping = False
        # Config changes asked for, and the last one whose versions have all settled
        # (AVAILABLE or END): `start` and `reload_config` wait for theirs.
        self._asked, self._settled = 0, -1
        self._poll_now, self._next_poll = True, 0.0
        self._thread = threading.Thread(target=self._loop, name="version-manager", daemon=True)

    @property
    def config(self):
        """The `ModelServerConfig` being served."""
        return self._config

    def add_listener(self, listener: observer.Listener) -> None:
        """`listener` hears every state change from now on."""
        with self._cond:
            self._listeners.append(listener)

    def start(self) -> None:
        """Loads what the config aspires, then keeps watching in a thread.

        Raises:
          ServingError: UNKNOWN naming each model that has versions none of which loaded
            (TF Serving's start), FAILED_PRECONDITION for a label of a version that is not
            AVAILABLE.
        """
        self._thread.start()
        self._wait_settled()
        if self._stopping:
            return
        failed = []
        with self._cond:
            for model in self._models.values():
                tried = [v for v in model.versions.values() if v.aspired]
                if tried and not model.available():
                    errors = "; ".join(f"version {v.version}: {v.code}: {v.message}" for v in tried)
                    failed.append(f"model {model.config.name} did not become available ({errors})")
        if failed:
            raise ServingError("UNKNOWN", "; ".join(failed))
        self._install_labels(self._config)

    def reload_config(self, config) -> None:
        """Serves `config` from now on: new models are loaded (this waits for them), models
        left out are unloaded, policies, base paths and labels change. One change at a
        time; the listeners hear it (`config_changed`) whether the labels were taken or not.

        Raises:
          ServingError: INVALID_ARGUMENT for a config it cannot serve, FAILED_PRECONDITION
            for a label of a version that is not AVAILABLE (the models change; the
            labels stay as they were).
        """
        check_config(config)
        wanted = {m.name: m for m in config.model_config_list.config}
        with self._reloading:
            with self._cond:
                for name, model in self._models.items():
                    model.config, model.removed = wanted.get(name, model.config), name not in wanted
                for name, given in wanted.items():
                    self._models.setdefault(name, _Model(given))
                self._config = config
                self._asked += 1
                self._poll_now = True
                self._cond.notify_all()
            try:
                self._wait_settled()
                self._install_labels(config)
            finally:
                for listener in self._listening():
                    observer.tell("a listener", listener.config_changed, config)

    def _install_labels(self, config):
        with self._cond:
            labels = {
                m.name: model_config.assign_labels(
                    m.name,
                    dict(m.version_labels),
                    {v.version for v in self._models[m.name].available()},
                    self._models[m.name].labels,
                    self.options.allow_version_labels_for_unavailable_models,
                )
                for m in config.model_config_list.config
            }
            for name, model in self._models.items():
                model.labels = labels.get(name, {})

    def _wait_settled(self):
        with self._cond:
            asked = self._asked
            self._cond.wait_for(lambda: self._settled >= asked or self._stopping)

    def stop(self, patience_seconds: float = 10.0) -> None:
        """Stops watching and unloads every version, their queued batches run first.
        A load under way, or a request still holding a version, is waited for at most
        `patience_seconds` each."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(patience_seconds)
        for model in list(self._models.values()):
            for record in list(model.versions.values()):
                if record.state == "AVAILABLE":
                    self._unload(model, record, patience_seconds)
        self._flush_events()

    def drain(self) -> None:
        """Marks the server draining and tells the listeners (it serves on)."""
        self.draining.set()
        for listener in self._listening():
            observer.tell("a listener", listener.draining)

    def _listening(self):
        with self._cond:
            return list(self._listeners)

    # Requests.

    @contextlib.contextmanager
    def servable(self, name: str, version: int | None = None, label: str | None = None):
        """The `Servable` a request of model `name` gets, held until the block ends: the
        `version`, else the one `label` names, else the newest AVAILABLE one.

        Raises:
          ServingError: NOT_FOUND when there is no such model or version AVAILABLE,
            INVALID_ARGUMENT for an unknown label.
        """
        with self._cond:
            record = self._find(name, version, label)
            record.handles += 1
        try:
            yield record.servable
        finally:
            with self._cond:
                record.handles -= 1
                if record.state == "UNLOADING" and not record.handles:
                    self._cond.notify_all()

    def _find(self, name, version, label):
        model = self._models.get(name)
        if model is not None and model.removed:
            model = None
        if label is not None and version is None:
            if model is None or label not in model.labels:
                raise ServingError(
                    "INVALID_ARGUMENT", f"Unrecognized servable version label: {label}"
                )
            version = model.labels[label]
        if model is not None:
            if version is None:
                available = model.available()
                if available:
                    return max(available, key=lambda v: v.version)
            elif version in model.versions and model.versions[version].state == "AVAILABLE":
                return model.versions[version]
        request = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        raise ServingError("NOT_FOUND", f"Servable not found for request: {request}")

    def resolve(self, name: str, label: str) -> int:
        """The version `label` names for model `name`.

        Raises:
          ServingError: INVALID_ARGUMENT for an unknown model or label.
        """
        with self._cond:
            model = self._models.get(name)
            if model is None or label not in model.labels:
                raise ServingError(
                    "INVALID_ARGUMENT", f"Unrecognized servable version label: {label}"
                )
            return model.labels[label]

    def status(self, name: str, version: int | None = None) -> list[observer.VersionStatus]:
        """Every version of `name` the manager tried (or the one `version`), newest first.

        Raises:
          ServingError: NOT_FOUND when there is none.
        """
        with self._cond:
            model = self._models.get(name)
            found = [] if model is None or model.removed else list(model.versions.values())
            if version is not None:
                found = [v for v in found if v.version == version]
            statuses = [self._status(name, v) for v in found]
        if not statuses:
            if version is None:
                raise ServingError("NOT_FOUND", f"Could not find any versions of model {name}")
            raise ServingError("NOT_FOUND", f"Could not find version {version} of model {name}")
        return sorted(statuses, key=lambda s: -s.version)

    @staticmethod
    def _status(name, record):
        return observer.VersionStatus(
            name, record.version, record.state, record.code, record.message
        )

    # The manager's thread.

    def _loop(self):
        while True:
            with self._cond:
                wake = self._next_wake()
                while not (self._stopping or self._poll_now or time.monotonic() >= wake):
                    self._cond.wait(None if wake == math.inf else wake - time.monotonic())
                    wake = self._next_wake()
                if self._stopping:
                    return
                poll, self._poll_now = self._poll_now or time.monotonic() >= self._next_poll, False
                asked = self._asked
            try:
                self._tick(poll, asked)
            except Exception:  # noqa: BLE001 - the manager goes on; the log has it
                _log.exception("the version manager's step failed")
            self._flush_events()

    def _next_wake(self):
        return min([self._next_poll, *(t for m in self._models.values() for t in m.retry_times())])

    def _tick(self, poll, asked):
        if poll:
            wait = self.options.poll_wait_seconds
            self._next_poll = time.monotonic() + wait if wait > 0 else math.inf
            for model in list(self._models.values()):
                self._poll(model)
        for model in list(self._models.values()):
            self._act(model)
        with self._cond:
            for name in [n for n, m in self._models.items() if m.removed and not m.available()]:
                del self._models[name]
            if not any(
                v.state in ("START", "LOADING") and v.aspired
                for m in self._models.values()
                for v in m.versions.values()
            ):
                self._settled = asked
            self._cond.notify_all()

    def _poll(self, model):
        name = model.config.name
        if model.removed:
            found = {}
        else:
            try:
                found = versions.list_versions(model.config.base_path)
            except Exception as e:  # noqa: BLE001 - keeps what it has; the log says why
                _log.warning("cannot list %s of model %s: %s", model.config.base_path, name, e)
                return
        aspired = versions.aspired_versions(model.config.model_version_policy, found, name)
        with self._cond:
            model.aspire(aspired, lambda record, state: self._set(model, record, state))

    def _act(self, model):
        while not self._stopping:
            with self._cond:
                action = model.next_action(time.monotonic())
            if action is None:
                return
            kind, record = action
            if kind == "load":
                self._load(model, record)
            else:
                self._unload(model, record)
            self._flush_events()

    def _load(self, model, record):
        name = model.config.name
        with self._cond:
            record.attempts += 1
            self._set(model, record, "LOADING")
        self._flush_events()
        servable = error = None
        try:
            servable = Servable(
                record.path,
                record.version,
                self.options.parameters,
                name,
                self.observer,
                self.options.per_model_batching_parameters,
            )
            self._warm_up(name, servable)
        except Exception as e:  # noqa: BLE001 - the load failed; its error is kept
            error = from_exception(e, f"loading version {record.version} of {name}", load=True)
            if servable is not None:
                servable.close()
            servable = None
            gc.collect()
        with self._cond:
            if error is None:
                record.servable, record.code, record.message = servable, "OK", ""
                self._set(model, record, "AVAILABLE")
                _log.info("serving version %d of %s (%s)", record.version, name, record.path)
                return
            record.code, record.message = error.code, error.message
            tries = f"try {record.attempts} of {self.options.max_num_load_retries + 1}"
            _log.error("version %d of %s did not load (%s): %s", record.version, name, tries, error)
            if record.attempts <= self.options.max_num_load_retries and record.aspired:
                interval = max(0.0, self.options.load_retry_interval_seconds)
                record.retry_at = time.monotonic() + interval
                self._set(model, record, "LOADING")
            else:
                self._set(model, record, "END")

    def _warm_up(self, name, servable):
        if not self.options.warmup_iterations or not servable.warmup_requests:
            return
        start, code = time.monotonic(), "OK"
        try:
            servable.warm_up(self.options.warmup_iterations)
        except ServingError as e:
            code = e.code
            raise
        finally:
            observer.tell(
                "the warm-up report",
                self.observer.warmup,
                name,
                servable.version,
                servable.warmup_path,
                code,
                time.monotonic() - start,
                len(servable.warmup_requests),
            )

    def _unload(self, model, record, patience_seconds=math.inf):
        """Unloads `record` once no request holds it (or after `patience_seconds`)."""
        with self._cond:
            self._set(model, record, "UNLOADING")
        self._flush_events()
        deadline = time.monotonic() + patience_seconds
        with self._cond:
            while record.handles and time.monotonic() < deadline:
                if not self._cond.wait(min(30, deadline - time.monotonic())):
                    _log.warning(
                        "version %d of %s waits for %d requests to unload",
                        record.version,
                        model.config.name,
                        record.handles,
                    )
            servable, record.servable = record.servable, None
        servable.close()
        del servable
        gc.collect()
        with self._cond:
            self._set(model, record, "END")
        _log.info("unloaded version %d of %s", record.version, model.config.name)

    def _set(self, model, record, state):
        """Moves `record` to `state` and queues the event (under the lock)."""
        record.state = state
        self._events.append([*self._listeners, self._status(model.config.name, record)])

    def _flush_events(self):
        with self._cond:
            events, self._events = self._events, []
        for *listeners, status in events:
            for listener in listeners:
                observer.tell("a listener", listener.version_changed, status)
