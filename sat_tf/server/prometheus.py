"""TF Serving's metrics, under its names and labels, and the page
--monitoring_config_file serves them on.

TF Serving records each metric under a name like "/tensorflow/serving/request_count"; its
Prometheus exporter (util/prometheus_exporter.cc) turns every character outside
[a-zA-Z0-9_] into ":", so the page shows ":tensorflow:serving:request_count", a counter
without prometheus-client's "_total" suffix and without "_created" series, and bucket
bounds written with six significant digits. `page()` writes that page from
prometheus-client collectors held in a registry of their own, so the series an
operator's dashboards and alerts query are the ones TF Serving exposes.

`ServerMetrics` is told of the server's work through three methods, `request`, `batch`
and `warmup`, in TF Serving's terms (`MetricsObserver` tells it as the server's
`observer.Observer`), and records as TF Serving does:
- a request: request_count {model_name, status} for every request, status its canonical
  code ("OK", "NOT_FOUND", ...); request_latency {model_name, API, entrypoint} in
  microseconds only for a request answered OK. API is "Predict" and entrypoint "GRPC"
  over gRPC (prediction_service_impl.cc; TF Serving records no other gRPC method); over
  REST, API is the verb of the path ("predict"; empty for a GET) and entrypoint "REST"
  (http_server.cc);
- the examples of a request: request_example_counts and request_example_count_total
  {model}. TF Serving counts the tf.Examples of Classify, Regress and MultiInference;
  sat-serve, which has Predict only, counts a predict's instances (images);
- a batch run (batching_session.cc, batching_util.h): input_batch_size for each request
  it joined (its batch-axis length; TF Serving records a request larger than a batch
  once, whole, where here each piece it is split into counts), processed_batch_size
  (the size after padding to an allowed batch size), padding_size
  {execution_batch_size}, and queuing_latency {thread_pool_name} in microseconds for
  each request in it;
- a warm-up (saved_model_warmup_util.cc): model_warmup_latency {model_path, status} in
  microseconds and model_warmup_records_read {model_path, status}, model_path the
  version's folder.
"""

import math
import re

import prometheus_client

from sat_tf.server import observer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BATCH_THREADS = "batch_threads"  # TF's thread_pool_name when BatchingParameters names none
WARMUP_FOLDER = "assets.extra"  # a version's folder holds its warm-up file in this one


def exponential_buckets(scale: float, growth: float, count: int) -> tuple[float, ...]:
    """TF's `monitoring::Buckets::Exponential(scale, growth, count)` as Prometheus bounds:
    scale * growth**i for i < count, each to the six significant digits TF's exporter
    prints (the last bucket, to DBL_MAX, is prometheus-client's +Inf)."""
    return tuple(float(f"{scale * growth**i:.6g}") for i in range(count))


LATENCY_BUCKETS = exponential_buckets(10, 1.8, 33)  # microseconds, to ~25 minutes
QUEUING_BUCKETS = exponential_buckets(100, 1.2, 52)  # microseconds, to ~1 second
EXAMPLE_BUCKETS = exponential_buckets(1, 2, 15)
BATCH_BUCKETS = exponential_buckets(1, 2, 14)


# The metrics: (attribute, kind, TF Serving's name, what it counts, labels, buckets).
_METRICS = (
    ("request_count", "counter", "request_count", "Requests answered, by status.",
     ("model_name", "status"), None),
    ("request_latency", "histogram", "request_latency",
     "Microseconds from a request's arrival to its OK answer.",
     ("model_name", "API", "entrypoint"), LATENCY_BUCKETS),
    ("example_counts", "histogram", "request_example_counts", "Examples per request.",
     ("model",), EXAMPLE_BUCKETS),
    ("example_count_total", "counter", "request_example_count_total", "Examples received.",
     ("model",), None),
    ("queuing_latency", "histogram", "batching_session/queuing_latency",
     "Microseconds a request waited in the batching queue.", ("thread_pool_name",),
     QUEUING_BUCKETS),
    ("input_batch_size", "histogram", "batching_session/input_batch_size",
     "Instances per request entering the batching queue.", (), BATCH_BUCKETS),
    ("processed_batch_size", "histogram", "batching_session/processed_batch_size",
     "Instances per batch run, padding included.", (), BATCH_BUCKETS),
    ("padding_size", "histogram", "batching_session/padding_size",
     "Padding instances per batch run.", ("execution_batch_size",), BATCH_BUCKETS),
    ("warmup_latency", "histogram", "model_warmup_latency",
     "Microseconds a version's warm-up took.", ("model_path", "status"), LATENCY_BUCKETS),
    ("warmup_records", "counter", "model_warmup_records_read",
     "Warm-up records read.", ("model_path", "status"), None),
)  # fmt: skip


def exposed_name(name: str) -> str:
    """The name TF Serving's page shows the metric "/tensorflow/serving/<name>" under."""
    return re.sub(r"[^a-zA-Z0-9_]", ":", f"/tensorflow/serving/{name}")


class ServerMetrics:
    """The server's metrics in a registry of their own (`registry`), and their page.

    Thread-safe: the transports, batch threads and loader call it concurrently.
    """

    def __init__(self):
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        self._exposed = {}  # collector -> the name TF Serving's page shows it under
        kinds = {"counter": prometheus_client.Counter, "histogram": prometheus_client.Histogram}
        for attribute, kind, name, help_text, labels, buckets in _METRICS:
            extra = {"buckets": buckets} if buckets else {}
            collector = kinds[kind](
                exposed_name(name), help_text, labels, registry=self.registry, **extra
            )
            self._exposed[collector] = exposed_name(name)
            setattr(self, attribute, collector)
        # Each label set's child, kept: a request costs dictionary look-ups, not
        # prometheus-client's lock around its own.
        self._children = {}

    def _child(self, collector, *labels):
        key = (collector, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, collector.labels(*labels))
        return child

    def request(
        self,
        model: str,
        api: str,
        entrypoint: str,
        code: str,
        seconds: float,
        examples: int = 0,
    ):
        """A request answered with canonical `code` ("OK", ...) `seconds` after it
        arrived, holding `examples` instances (0: none, as a GET); its latency counts
        only when `code` is "OK"."""
        self._child(self.request_count, model, code).inc()
        if code == "OK":
            self._child(self.request_latency, model, api, entrypoint).observe(seconds * 1e6)
        if examples > 0:
            self._child(self.example_counts, model).observe(examples)
            self._child(self.example_count_total, model).inc(examples)

    def batch(
        self,
        model: str,
        signature: str,
        sizes,
        padding: int,
        queued_seconds,
        thread_pool_name: str = BATCH_THREADS,
    ):
        """A batch run of `model`'s `signature`: the instances of each request it joined
        (`sizes`), the padding added to reach an allowed batch size, and the seconds
        each request waited in the queue."""
        processed = sum(sizes) + padding
        for size in sizes:
            self.input_batch_size.observe(size)
        self.processed_batch_size.observe(processed)
        self._child(self.padding_size, str(processed)).observe(padding)
        queuing = self._child(self.queuing_latency, thread_pool_name)
        for wait in queued_seconds:
            queuing.observe(wait * 1e6)

    def warmup(self, model: str, version: int, path: str, code: str, seconds: float, records: int):
        """A version's warm-up: `path` its folder or its warm-up file (under the folder's
        assets.extra/), ended with `code` ("OK" or why it failed) after `seconds` and
        `records` records read."""
        folder = path.rsplit("/" + WARMUP_FOLDER + "/", 1)[0]
        self.warmup_latency.labels(folder, code).observe(seconds * 1e6)
        self.warmup_records.labels(folder, code).inc(records)

    def page_app(self, environ, start_response):
        """The page as a WSGI app (TF Serving answers any method on its path)."""
        page = self.page()
        start_response(
            "200 OK", [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(page)))]
        )
        return [page]

    def page(self) -> bytes:
        """The metrics in Prometheus's text format, as TF Serving's page shows them."""
        lines = []
        for collector, name in self._exposed.items():
            for family in collector.collect():
                lines.append(f"# HELP {name} {_escape(family.documentation, quote=False)}")
                lines.append(f"# TYPE {name} {family.type}")
                for sample in family.samples:
                    suffix = sample.name[len(family.name) :]
                    if suffix == "_created":
                        continue
                    shown = name if family.type == "counter" else name + suffix
                    lines.append(f"{shown}{_labels(sample.labels)} {_number(sample.value)}")
        return ("\n".join(lines) + "\n").encode("utf-8")


class MetricsObserver(observer.Observer):
    """The server's `observer.Observer` telling `metrics` (a `ServerMetrics`) of its work
    in TF Serving's terms: a gRPC Predict as API "Predict", a REST predict as "predict",
    a REST GET as "" (no verb), other gRPC methods not at all; batches under the batch
    threads' `thread_pool_name`."""

    def __init__(self, metrics: ServerMetrics, thread_pool_name: str = BATCH_THREADS):
        self.metrics, self.thread_pool_name = metrics, thread_pool_name

    def request(self, model, api, entrypoint, code, seconds, examples):
        if entrypoint == "GRPC":
            if api != "predict":
                return
            api = "Predict"
        elif api != "predict":
            api = ""
        self.metrics.request(model, api, entrypoint, code, seconds, examples)

    def batch(self, model, signature, sizes, padding, queued_seconds):
        self.metrics.batch(model, signature, sizes, padding, queued_seconds, self.thread_pool_name)

    def warmup(self, model, version, path, code, seconds, records):
        self.metrics.warmup(model, version, path, code, seconds, records)


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    pairs = (
        f'{k}="{_bound(v) if k == "le" else _escape(v, quote=True)}"' for k, v in labels.items()
    )
    return "{" + ",".join(pairs) + "}"


def _bound(le: str) -> str:
    """A bucket bound as TF's exporter writes it: six significant digits, or +Inf."""
    return le if le == "+Inf" else f"{float(le):.6g}"


def _number(value: float) -> str:
    if math.isfinite(value) and value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return prometheus_client.utils.floatToGoString(value)


def _escape(text: str, quote: bool) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if quote else text
