"""Dynamic batching: concurrent requests run as one call of a signature.

A request hands the batcher its inputs (arrays whose first axis counts images) and waits
for its rows of the outputs. A batch thread takes the oldest request, waits up to
`batch_timeout_micros` for more until `max_batch_size` images are gathered, runs the
function once on the concatenated inputs and hands each request its own rows. The
parameters mean what TF Serving's `BatchingParameters` mean (its `--batching_parameters_file`
is read by `read_parameters`; `pad_variable_length_inputs` and `thread_pool_name` are
accepted and not used):

- `max_batch_size`: most images in one call; a larger request is split into calls of
  this size.
- `batch_timeout_micros`: how long an open batch waits for more requests.
- `max_enqueued_batches`: batches that may wait; a request that would need more is
  refused with `QueueFullError` (HTTP 503, gRPC UNAVAILABLE) instead of growing the queue.
- `num_batch_threads`: batches run at once.
- `allowed_batch_sizes`: when given, a batch is padded (with copies of its first image) up
  to the smallest allowed size that holds it; the last must equal `max_batch_size`.

A call that fails as a whole (e.g. an `INVALID_ARGUMENT` of one request) is retried one
request at a time, so one request's failure never becomes another's.
"""

import bisect
import collections
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

_INDEX = re.compile(rb"^image_bytes\[(\d+)\]")


def rename_errors(outputs: dict, shift: int) -> dict:
    """`serving_default`'s rows with each `error` naming its image by its index in the
    request (`image_bytes[k]` of the batch is `image_bytes[k + shift]`); a `Batcher`'s
    `rebase`."""
    if "error" not in outputs:
        return outputs
    errors = [
        _INDEX.sub(lambda m: b"image_bytes[%d]" % (int(m.group(1)) + shift), e)
        for e in outputs["error"]
    ]
    return {**outputs, "error": np.array(errors, dtype=object)}


class QueueFullError(RuntimeError):
    """The batch queue holds `max_enqueued_batches` batches; try again later."""


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching parameters (session_bundle_config.proto), its defaults."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 100
    num_batch_threads: int = 1
    allowed_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"batching parameter {name} is {getattr(self, name)}; need >= 1")
        if self.batch_timeout_micros < 0:
            raise ValueError(f"batch_timeout_micros is {self.batch_timeout_micros}; need >= 0")
        sizes = self.allowed_batch_sizes
        if sizes and (list(sizes) != sorted(set(sizes)) or sizes[-1] != self.max_batch_size):
            raise ValueError(
                f"allowed_batch_sizes {list(sizes)} must increase and end at "
                f"max_batch_size ({self.max_batch_size})"
            )


# sat-serve's parameters without --batching_parameters_file, as in
# export/serving/batching_parameters.txt; BUILD_NOTES.md gives the measurements.
SERVE_DEFAULTS = BatchingParameters(
    max_batch_size=16, batch_timeout_micros=20_000, max_enqueued_batches=16, num_batch_threads=1
)


def _proto_class():
    """TF Serving's `BatchingParameters` message (session_bundle_config.proto, fields 1-7),
    built here: the tensorflow-serving-api wheel leaves out its generated module."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    file = descriptor_pb2.FileDescriptorProto(
        name="sat_tf/batching_parameters.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=[wrappers_pb2.DESCRIPTOR.name],
    )
    message = file.message_type.add(name="BatchingParameters")
    field = descriptor_pb2.FieldDescriptorProto
    wrapped = [
        ("max_batch_size", "Int64Value"),
        ("batch_timeout_micros", "Int64Value"),
        ("max_enqueued_batches", "Int64Value"),
        ("num_batch_threads", "Int64Value"),
        ("thread_pool_name", "StringValue"),
    ]
    for number, (name, kind) in enumerate(wrapped, 1):
        message.field.add(
            name=name, number=number, type=field.TYPE_MESSAGE, type_name=f".google.protobuf.{kind}"
        )
    message.field.add(
        name="allowed_batch_sizes", number=6, type=field.TYPE_INT64, label=field.LABEL_REPEATED
    )
    message.field.add(name="pad_variable_length_inputs", number=7, type=field.TYPE_BOOL)
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    )


def parse_parameters(text: str, source: str = "batching parameters") -> BatchingParameters:
    """`BatchingParameters` from TF Serving's text format (`max_batch_size { value: 16 }`).

    Raises:
      ValueError: naming `source` when the text does not parse or a value is out of range.
    """
    from google.protobuf import text_format

    proto = _proto_class()()
    try:
        text_format.Parse(text, proto)
    except text_format.ParseError as e:
        raise ValueError(f"{source}: {e}") from None
    values = {
        f.name: getattr(proto, f.name).value
        for f in dataclasses.fields(BatchingParameters)
        if f.name != "allowed_batch_sizes" and proto.HasField(f.name)
    }
    try:
        return BatchingParameters(**values, allowed_batch_sizes=tuple(proto.allowed_batch_sizes))
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def read_parameters(path: str) -> BatchingParameters:
    """`parse_parameters` of a file (`--batching_parameters_file`)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot read batching parameters {path!r}: {e.strerror}") from None
    return parse_parameters(text, path)


class _Task:
    """A piece of one request: its inputs, and where its outputs go when done."""

    def __init__(self, inputs, size, offset):
        self.inputs, self.size, self.offset = inputs, size, offset
        self.enqueued = time.monotonic()
        self.outputs, self.error = None, None
        self.done = threading.Event()


def _concat(tasks, pad_to):
    """The tasks' inputs joined along axis 0, padded with the first image to `pad_to`."""
    joined = {}
    for name in tasks[0].inputs:
        parts = [t.inputs[name] for t in tasks]
        rows = sum(len(p) for p in parts)
        if pad_to > rows:
            parts.append(np.repeat(parts[0][:1], pad_to - rows, axis=0))
        joined[name] = np.concatenate(parts)
    return joined


class Batcher:
    """Runs `fn` on batches gathered from concurrent `__call__`s.

    Args:
      fn: {input name: array (N, ...)} -> {output name: array (N, ...)}.
      parameters: `BatchingParameters`.
      rebase: optional (one request's rows of the outputs, shift) -> those rows, for
        outputs that name an image by its index: index k in the batch is k + shift in
        the request.
    """

    def __init__(
        self,
        fn: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
        parameters: BatchingParameters = BatchingParameters(),
        rebase: Callable | None = None,
    ):
        self.fn, self.parameters, self.rebase = fn, parameters, rebase
        self.calls = 0  # batches run, for tests and benchmarks
        self._queue = collections.deque()
        self._queued_images = 0
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._loop, name=f"batcher-{i}", daemon=True)
            for i in range(parameters.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs `fn` gives for `inputs`, run batched with other callers' inputs.

        Raises:
          QueueFullError: when the queue has no room for the request.
          RuntimeError: when the batcher is closed.
          whatever `fn` raises for this request alone.
        """
        inputs = {k: np.asarray(v) for k, v in inputs.items()}
        n = len(next(iter(inputs.values())))
        if n == 0:
            return self.fn(inputs)
        step = self.parameters.max_batch_size
        tasks = [
            _Task({k: v[i : i + step] for k, v in inputs.items()}, min(step, n - i), i)
            for i in range(0, n, step)
        ]
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            capacity = self.parameters.max_enqueued_batches * step
            if self._queued_images + n > capacity:
                raise QueueFullError(
                    f"the batch queue is full ({self.parameters.max_enqueued_batches} batches "
                    f"of {step} images); retry later"
                )
            self._queue.extend(tasks)
            self._queued_images += n
            self._cond.notify_all()
        for task in tasks:
            task.done.wait()
        for task in tasks:
            if task.error is not None:
                raise task.error
        if len(tasks) == 1:
            return tasks[0].outputs
        return {k: np.concatenate([t.outputs[k] for t in tasks]) for k in tasks[0].outputs}

    def close(self) -> None:
        """Runs what is queued, then stops the batch threads."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def _gather(self):
        """The next batch's tasks, waiting for the first and then up to the timeout."""
        step = self.parameters.max_batch_size
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return []
            deadline = self._queue[0].enqueued + self.parameters.batch_timeout_micros / 1e6
            while not self._closed:
                queued = sum(t.size for t in self._queue)
                left = deadline - time.monotonic()
                if queued >= step or left <= 0:
                    break
                self._cond.wait(left)
            tasks, size = [], 0
            while self._queue and size + self._queue[0].size <= step:
                task = self._queue.popleft()
                tasks.append(task)
                size += task.size
            self._queued_images -= size
            return tasks

    def _loop(self):
        while tasks := self._gather():
            self._run(tasks)

    def _run(self, tasks):
        size = sum(t.size for t in tasks)
        sizes = self.parameters.allowed_batch_sizes
        pad_to = sizes[bisect.bisect_left(sizes, size)] if sizes else size
        try:
            outputs = self.fn(_concat(tasks, pad_to))
            with self._cond:
                self.calls += 1
        except Exception as e:  # noqa: BLE001 - handed to the requests, one by one
            if len(tasks) == 1:
                tasks[0].error = e
                tasks[0].done.set()
                return
            for task in tasks:
                self._run([task])
            return
        start = 0
        for task in tasks:
            part = {k: np.asarray(v)[start : start + task.size] for k, v in outputs.items()}
            task.outputs = self.rebase(part, task.offset - start) if self.rebase else part
            start += task.size
            task.done.set()
