"""Dynamic batching as TF Serving's BatchingSession does it: concurrent requests run as one
call of a signature.

A request hands the `Batcher` its inputs (arrays whose first axis counts images) and
waits for its rows of the outputs. A batch thread takes the oldest request, waits up to
`batch_timeout_micros` for others until a batch is full, runs the function once on the
joined inputs and hands each request its rows. The parameters are TF Serving's
`BatchingParameters` (`--batching_parameters_file`, read by `read_parameters` into the
message of sat_tf/server/protos/session_bundle_config.proto); a field left out takes TF
Serving's default:

- `max_batch_size` (1000): the largest batch run, or with `enable_large_batch_splitting`
  the largest request taken whole. A larger request is cut into pieces of this size (TF
  Serving refuses it; without batching it answers it, and sat-serve batches by default).
- `enable_large_batch_splitting` (false), `max_execution_batch_size` (`max_batch_size`):
  with splitting, batches run at most `max_execution_batch_size` images and a request is
  cut where the open batch ends, its head filling that batch.
- `batch_timeout_micros` (0): how long the oldest request of an open batch waits.
- `max_enqueued_batches` (10): batches that may wait to run. A request is taken when
  the queue has room for its first batch (so one larger than the whole queue still runs,
  the queue holding it alone until it has); otherwise it is refused at once with
  UNAVAILABLE (REST 503), never held.
- `num_batch_threads` (the machine's cores): threads that run batches; they live as long
  as the batcher, whatever a batch raises.
- `allowed_batch_sizes`: a batch is padded (with copies of its first image) up to the
  smallest allowed size that holds it; the last must be the largest batch run.
- `thread_pool_name` names the threads; `pad_variable_length_inputs` is read and unused:
  requests whose images differ in shape beyond the first axis wait for batches of their
  own shape instead.

A request may carry a `Deadline`: if it passes while the request waits in the queue, the
request leaves it with RESOURCE_EXHAUSTED (REST 429; a gRPC deadline DEADLINE_EXCEEDED);
if it passes while its batch runs, DEADLINE_EXCEEDED (504), the batch running on for the
others. A batch that fails fails
its requests with the error's canonical code (`errors.from_exception`), and only them.
"""

import bisect
import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from sat_tf.server import errors, observer

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching parameters, its defaults (`thread_pool_name` "" names the
    threads "batch"; `max_execution_batch_size` 0 is `max_batch_size`).

    Raises:
      ValueError: for a value TF Serving refuses.
    """

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    allowed_batch_sizes: tuple[int, ...] = ()
    thread_pool_name: str = ""
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int = 0
    pad_variable_length_inputs: bool = False

    def __post_init__(self):
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"batching parameter {name} is {getattr(self, name)}; need >= 1")
        for name in ("batch_timeout_micros", "max_execution_batch_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"batching parameter {name} is {getattr(self, name)}; need >= 0")
        if self.enable_large_batch_splitting and self.execution_batch_size > self.max_batch_size:
            raise ValueError(
                f"max_execution_batch_size {self.max_execution_batch_size} is over "
                f"max_batch_size {self.max_batch_size}"
            )
        sizes = list(self.allowed_batch_sizes)
        if sizes and (
            sizes != sorted(set(sizes)) or sizes[0] < 1 or sizes[-1] != self.execution_batch_size
        ):
            largest = (
                "max_execution_batch_size"
                if self.enable_large_batch_splitting
                else "max_batch_size"
            )
            raise ValueError(
                f"allowed_batch_sizes {sizes} must increase and end at {largest} "
                f"({self.execution_batch_size})"
            )

    @property
    def execution_batch_size(self) -> int:
        """The most images one call of the function gets."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size:
            return self.max_execution_batch_size
        return self.max_batch_size


# sat-serve's parameters without --batching_parameters_file, as in
# export/serving/batching_parameters.txt; BUILD_NOTES.md gives the measurements.
SERVE_DEFAULTS = BatchingParameters(
    max_batch_size=16, batch_timeout_micros=20_000, max_enqueued_batches=16, num_batch_threads=1
)
# A version folder's own batching parameters (--enable_per_model_batching_parameters).
VERSION_FILE = "batching_params.pbtxt"
_WRAPPED = (
    "max_batch_size",
    "batch_timeout_micros",
    "max_enqueued_batches",
    "num_batch_threads",
    "thread_pool_name",
    "enable_large_batch_splitting",
    "max_execution_batch_size",
)


def parse_parameters(text: str, source: str = "batching parameters") -> BatchingParameters:
    """`BatchingParameters` from TF Serving's text format (`max_batch_size { value: 16 }`).

    Raises:
      ValueError: naming `source` when the text does not parse or a value is out of range.
    """
    from google.protobuf import text_format

    from sat_tf.server.protos import session_bundle_config_pb2

    proto = session_bundle_config_pb2.BatchingParameters()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as e:
        raise ValueError(f"{source}: {e}") from None
    values = {name: getattr(proto, name).value for name in _WRAPPED if proto.HasField(name)}
    try:
        return BatchingParameters(
            **values,
            allowed_batch_sizes=tuple(proto.allowed_batch_sizes),
            pad_variable_length_inputs=proto.pad_variable_length_inputs,
        )
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def read_parameters(path: str) -> BatchingParameters:
    """`parse_parameters` of a file (`--batching_parameters_file`), local or remote."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "r") as f:
            text = f.read()
    except (tf.errors.OpError, UnicodeDecodeError) as e:
        reason = getattr(e, "message", None) or str(e)
        raise ValueError(f"cannot read batching parameters {path!r}: {reason}") from None
    return parse_parameters(text, path)


def version_parameters(path: str, common: BatchingParameters | None):
    """The parameters of the version folder `path` under
    --enable_per_model_batching_parameters (TF Serving's `GetPerModelBatchingParams`):
    its `VERSION_FILE` with the batch threads of `common` (num_batch_threads and
    thread_pool_name: TF Serving's models share one pool); None, no batching, for a
    version without the file or when batching is off (`common` None).

    Raises:
      ValueError: naming the file when it cannot be read or parsed.
    """
    import tensorflow as tf

    file = os.path.join(path, VERSION_FILE)
    if common is None or not tf.io.gfile.exists(file):
        return None
    own = read_parameters(file)
    return dataclasses.replace(
        own, num_batch_threads=common.num_batch_threads, thread_pool_name=common.thread_pool_name
    )


@dataclasses.dataclass(frozen=True)
class Deadline:
    """When a request must be answered (`time.monotonic()`), what set it (for errors), and
    the code of a request still queued when it passes: RESOURCE_EXHAUSTED as TF Serving's
    batching answers it, DEADLINE_EXCEEDED for a gRPC deadline (which the client's own
    clock ends with that code anyway)."""

    at: float
    what: str
    queued_code: str = "RESOURCE_EXHAUSTED"

    @classmethod
    def after(cls, seconds: float, what: str, queued_code="RESOURCE_EXHAUSTED") -> "Deadline":
        return cls(time.monotonic() + seconds, what, queued_code)


class _Request:
    """One caller's inputs and what its pieces brought back."""

    __slots__ = ("inputs", "key", "deadline", "enqueued", "parts", "pending", "started")
    __slots__ += ("error", "done")

    def __init__(self, inputs, deadline):
        self.inputs, self.deadline = inputs, deadline
        # Requests join a batch only with others of the same shape beyond the first axis.
        self.key = tuple((k, v.shape[1:], v.dtype) for k, v in inputs.items())
        self.enqueued = time.monotonic()
        self.parts, self.pending, self.started = [], 0, False
        self.error, self.done = None, threading.Event()


class _Piece:
    """Rows [start, stop) of a request, as they wait in the queue."""

    __slots__ = ("request", "start", "stop")

    def __init__(self, request, start, stop):
        self.request, self.start, self.stop = request, start, stop

    @property
    def size(self):
        return self.stop - self.start


def _join(pieces, pad_to):
    """The pieces' inputs joined along axis 0, padded with the first image to `pad_to`."""
    joined = {}
    for name in pieces[0].request.inputs:
        parts = [p.request.inputs[name][p.start : p.stop] for p in pieces]
        rows = sum(len(p) for p in parts)
        if pad_to > rows:
            parts.append(np.repeat(parts[0][:1], pad_to - rows, axis=0))
        joined[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return joined


class Batcher:
    """Runs `fn` on batches gathered from concurrent `__call__`s.

    Args:
      fn: {input name: array (N, ...)} -> {output name: array (N, ...)}.
      parameters: `BatchingParameters`.
      rebase: optional (one piece's rows of the outputs, shift) -> those rows, for
        outputs that name an image by its index: index k in the batch is k + shift in
        the request.
      report: optional function of (piece sizes, padding rows, seconds each piece
        waited), called after each batch (`observer.Observer.batch`).
    """

    def __init__(
        self,
        fn: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
        parameters: BatchingParameters = SERVE_DEFAULTS,
        rebase: Callable | None = None,
        report: Callable | None = None,
    ):
        self.fn, self.parameters, self.rebase, self.report = fn, parameters, rebase, report
        self.calls = 0  # batches run, for tests and benchmarks
        self._step = parameters.execution_batch_size
        self._capacity = parameters.max_enqueued_batches * self._step
        self._queue = collections.deque()
        self._queued = 0  # images in the queue
        self._cond = threading.Condition()
        self._closed = False
        name = parameters.thread_pool_name or "batch"
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
            for i in range(parameters.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def threads_alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def __call__(
        self, inputs: Mapping[str, np.ndarray], deadline: Deadline | None = None
    ) -> dict[str, np.ndarray]:
        """The outputs `fn` gives for `inputs`, run batched with other callers' inputs.

        Raises:
          errors.ServingError: UNAVAILABLE when the queue has no room or the batcher is
            closed, RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED when `deadline` passes while
            queued / running, or the error of the batch that ran the request.
        """
        inputs = {k: np.asarray(v) for k, v in inputs.items()}
        n = len(next(iter(inputs.values())))
        if n == 0:
            try:
                return dict(self.fn(inputs))
            except Exception as e:  # noqa: BLE001 - the error's code goes to the caller
                raise errors.from_exception(e, "an empty request") from None
        request = _Request(inputs, deadline)
        cut = self.parameters.max_batch_size
        pieces = [_Piece(request, i, min(i + cut, n)) for i in range(0, n, cut)]
        with self._cond:
            if self._closed:
                raise errors.ServingError("UNAVAILABLE", "the version is being unloaded; retry")
            if self._queued and self._queued + min(n, self._step) > self._capacity:
                raise errors.ServingError(
                    "UNAVAILABLE",
                    f"the batch queue is full ({self._queued} images wait in "
                    f"max_enqueued_batches {self.parameters.max_enqueued_batches} batches of "
                    f"{self._step}); retry later",
                )
            request.pending = len(pieces)
            self._queue.extend(pieces)
            self._queued += n
            self._cond.notify_all()
        self._wait(request)
        if request.error is not None:
            raise errors.ServingError(request.error.code, request.error.message)
        parts = [rows for _, rows in sorted(request.parts, key=lambda part: part[0])]
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _wait(self, request):
        deadline = request.deadline
        left = None if deadline is None else max(0.0, deadline.at - time.monotonic())
        if request.done.wait(left):
            return
        with self._cond:
            if request.done.is_set():
                return
            if request.started:
                error = errors.ServingError(
                    "DEADLINE_EXCEEDED", f"{deadline.what} passed while the request's batch ran"
                )
            else:
                error = errors.ServingError(
                    deadline.queued_code,
                    f"{deadline.what} passed while the request waited in the batch queue",
                )
            self._finish(request, error)

    def _finish(self, request, error):
        """Ends `request` with `error` and takes its pieces out of the queue (under the
        lock)."""
        if request.done.is_set():
            return
        request.error = error
        request.done.set()
        left = [p.size for p in self._queue if p.request is request]
        if left:
            self._queue = collections.deque(p for p in self._queue if p.request is not request)
            self._queued -= sum(left)

    def close(self) -> None:
        """Runs what is queued, then stops the batch threads; later calls are refused."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def _next_batch(self):
        """(the next batch's pieces, when they left the queue), waiting for the first and
        then up to the timeout; None once closed and empty."""
        timeout = self.parameters.batch_timeout_micros / 1e6
        with self._cond:
            while True:
                if self._queue:
                    left = self._queue[0].request.enqueued + timeout - time.monotonic()
                    if self._closed or self._queued >= self._step or left <= 0:
                        return self._take(), time.monotonic()
                    self._cond.wait(left)
                elif self._closed:
                    return None
                else:
                    self._cond.wait()

    def _take(self):
        """Pieces of one shape from the queue, oldest first, up to a batch (under the
        lock); pieces of other shapes keep their places. A request whose deadline passed
        while queued ends here."""
        pieces, size, now = [], 0, time.monotonic()
        key, passed = self._queue[0].request.key, collections.deque()
        while self._queue and size < self._step:
            piece = self._queue.popleft()
            request, room = piece.request, self._step - size
            if request.key != key:
                passed.append(piece)
                continue
            self._queued -= piece.size
            if request.deadline is not None and now > request.deadline.at:
                error = errors.ServingError(
                    request.deadline.queued_code,
                    f"{request.deadline.what} passed while the request waited in the batch queue",
                )
                self._finish(request, error)
                continue
            if piece.size > room:
                if not self.parameters.enable_large_batch_splitting:
                    self._queued += piece.size
                    passed.append(piece)
                    break
                rest = _Piece(request, piece.start + room, piece.stop)
                self._queued += rest.size
                passed.append(rest)
                piece = _Piece(request, piece.start, piece.start + room)
                request.pending += 1
            request.started = True
            pieces.append(piece)
            size += piece.size
        if passed:
            passed.extend(self._queue)
            self._queue = passed
        return pieces

    def _loop(self):
        while (taken := self._next_batch()) is not None:
            pieces, dequeued = taken
            if not pieces:
                continue
            try:
                self._run(pieces)
            except Exception as e:  # noqa: BLE001 - the thread goes on; the batch fails
                error = errors.from_exception(e, f"a batch of {len(pieces)} pieces")
                with self._cond:
                    for piece in pieces:
                        self._finish(piece.request, error)
            if self.report is not None:
                observer.tell(
                    "the batch report",
                    self.report,
                    tuple(p.size for p in pieces),
                    self._pad_to(sum(p.size for p in pieces)) - sum(p.size for p in pieces),
                    tuple(dequeued - p.request.enqueued for p in pieces),
                )

    def _pad_to(self, size):
        sizes = self.parameters.allowed_batch_sizes
        return sizes[bisect.bisect_left(sizes, size)] if sizes else size

    def _run(self, pieces):
        pad_to = self._pad_to(sum(p.size for p in pieces))
        outputs = {k: np.asarray(v) for k, v in self.fn(_join(pieces, pad_to)).items()}
        for name, value in outputs.items():
            if value.ndim == 0 or len(value) != pad_to:
                message = (
                    f"output {name} of shape {list(value.shape)} has no batch axis of {pad_to}"
                )
                _log.error("a batch failed: %s", message)
                raise errors.ServingError("INTERNAL", message)
        start, done = 0, []
        for piece in pieces:
            rows = {k: v[start : start + piece.size] for k, v in outputs.items()}
            if self.rebase is not None:
                rows = self.rebase(rows, piece.start - start)
            done.append((piece, rows))
            start += piece.size
        with self._cond:
            self.calls += 1
            for piece, rows in done:
                request = piece.request
                if request.done.is_set():
                    continue
                request.parts.append((piece.start, rows))
                request.pending -= 1
                if request.pending == 0:
                    request.done.set()
