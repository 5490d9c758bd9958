"""TF Serving's metrics page: its names, labels and buckets, read back by
prometheus-client's own parser."""

import os
import re
import threading

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sat_tf.server import model_config, prometheus
from sat_tf.server.prometheus import ServerMetrics


def _families(metrics):
    return {f.name: f for f in text_string_to_metric_families(metrics.page().decode("utf-8"))}


def _samples(family, name, **labels):
    return [s for s in family.samples if s.name == name and labels.items() <= s.labels.items()]


def _value(family, name, **labels):
    (sample,) = _samples(family, name, **labels)
    return sample.value


def test_buckets_are_tf_servings_exponential_buckets_to_six_digits():
    # 10 * 1.8**i by hand: 10, 18, 32.4, 58.32, 104.976, 188.9568 (188.957 to six digits).
    latency = prometheus.LATENCY_BUCKETS
    assert latency[:6] == (10, 18, 32.4, 58.32, 104.976, 188.957)
    # The last: 10 * 1.8**32 = 10 * (1.8**8)**4 = 10 * 110.19961**4 = 1.47476e9 (~25 min).
    assert len(latency) == 33 and latency[-1] == pytest.approx(1.47476e9, rel=1e-5)
    assert prometheus.EXAMPLE_BUCKETS == tuple(2.0**i for i in range(15))  # 1 .. 16384
    assert prometheus.BATCH_BUCKETS == tuple(2.0**i for i in range(14))  # 1 .. 8192
    queuing = prometheus.QUEUING_BUCKETS  # 100 * 1.2**i: 100, 120, 144, 172.8, 207.36
    assert queuing[:5] == (100, 120, 144, 172.8, 207.36) and len(queuing) == 52
    assert queuing[-1] == pytest.approx(100 * 1.2**51, rel=1e-5)  # ~1 s in microseconds


def test_names_are_tf_servings_as_its_exporter_writes_them():
    assert prometheus.exposed_name("request_count") == ":tensorflow:serving:request_count"
    assert (
        prometheus.exposed_name("batching_session/queuing_latency")
        == ":tensorflow:serving:batching_session:queuing_latency"
    )


def test_five_predicts_show_their_count_and_latency_histogram():
    metrics = ServerMetrics()
    for seconds in (0.00025, 0.00025, 0.001, 0.001, 0.5):
        metrics.request("a", "predict", "REST", "OK", seconds, 2)
    families = _families(metrics)
    count = families[":tensorflow:serving:request_count"]
    assert count.type == "counter"
    # The parser names a counter's samples with "_total" whether or not the page does.
    assert _value(count, count.name + "_total", model_name="a", status="OK") == 5
    latency = families[":tensorflow:serving:request_latency"]
    assert latency.type == "histogram"
    labels = {"model_name": "a", "API": "predict", "entrypoint": "REST"}
    buckets = _samples(latency, latency.name + "_bucket", **labels)
    assert len(buckets) == 34  # 33 bounds and +Inf
    cumulative = {s.labels["le"]: s.value for s in buckets}
    # Bounds 10 * 1.8**i to six digits: 250 us lies between i = 5 (188.957) and 6
    # (340.122); 1000 us between 7 (612.220) and 8 (1101.996, shown 1102); 500,000 us
    # between 18 (393,464.08) and 19 (708,235.35).
    assert (cumulative["188.957"], cumulative["340.122"]) == (0, 2)
    assert (cumulative["612.22"], cumulative["1102"]) == (2, 4)
    assert (cumulative["393464"], cumulative["708235"], cumulative["+Inf"]) == (4, 5, 5)
    assert _value(latency, latency.name + "_count", **labels) == 5
    assert _value(latency, latency.name + "_sum", **labels) == pytest.approx(502500)
    examples = families[":tensorflow:serving:request_example_counts"]
    assert _value(examples, examples.name + "_sum", model="a") == 10
    assert _value(examples, examples.name + "_count", model="a") == 5
    # The parser drops a counter's "_total" from the family's name, not from its samples.
    total = families[":tensorflow:serving:request_example_count"]
    assert _value(total, total.name + "_total", model="a") == 10


def test_the_page_reads_as_tf_servings_line_by_line():
    metrics = ServerMetrics()
    for _ in range(5):
        metrics.request("a", "Predict", "GRPC", "OK", 0.002)
    metrics.request("a", "predict", "REST", "NOT_FOUND", 0.001)
    metrics.request("b", "Predict", "GRPC", "OK", 0.000001)
    metrics.request("b", "Predict", "GRPC", "OK", 0.000001, 3)
    metrics.request("b", "", "REST", "OK", 0.000001, 0)  # a GET: no examples
    lines = metrics.page().decode("utf-8").splitlines()
    assert "# TYPE :tensorflow:serving:request_count counter" in lines
    assert ':tensorflow:serving:request_count{model_name="a",status="OK"} 5' in lines
    assert ':tensorflow:serving:request_count{model_name="a",status="NOT_FOUND"} 1' in lines
    assert "# TYPE :tensorflow:serving:request_latency histogram" in lines
    grpc_a = 'model_name="a",API="Predict",entrypoint="GRPC"'
    assert f':tensorflow:serving:request_latency_bucket{{{grpc_a},le="10"}} 0' in lines
    # 2000 us: above 10 * 1.8**9 = 1983.59, below 10 * 1.8**10 = 3570.47.
    assert f':tensorflow:serving:request_latency_bucket{{{grpc_a},le="1983.59"}} 0' in lines
    assert f':tensorflow:serving:request_latency_bucket{{{grpc_a},le="3570.47"}} 5' in lines
    assert f":tensorflow:serving:request_latency_count{{{grpc_a}}} 5" in lines
    assert f":tensorflow:serving:request_latency_sum{{{grpc_a}}} 10000" in lines
    assert ':tensorflow:serving:request_example_count_total{model="b"} 3' in lines
    # A failed request counts, but its latency does not (TF Serving's http_server.cc).
    assert not [line for line in lines if 'API="predict"' in line]
    assert not [line for line in lines if "_created" in line]
    assert [line for line in lines if "_total" in line] == [
        "# HELP :tensorflow:serving:request_example_count_total Examples received.",
        "# TYPE :tensorflow:serving:request_example_count_total counter",
        ':tensorflow:serving:request_example_count_total{model="b"} 3',
    ]


def test_batches_and_warm_ups_are_recorded_as_tf_serving_records_them():
    metrics = ServerMetrics()
    metrics.batch("a", "serving_default", (1, 2), 1, (0.001, 0.0005))
    metrics.batch("a", "serving_default", (8,), 0, (0.0002,), thread_pool_name="pool")
    metrics.warmup("a", 1, "/models/a/1/assets.extra/tf_serving_warmup_requests", "OK", 0.25, 16)
    metrics.warmup("a", 2, "gs://b/a/2", "DATA_LOSS", 0.001, 0)
    families = _families(metrics)
    batching = ":tensorflow:serving:batching_session:"
    inputs = families[batching + "input_batch_size"]
    assert (_value(inputs, inputs.name + "_count"), _value(inputs, inputs.name + "_sum")) == (3, 11)
    processed = families[batching + "processed_batch_size"]  # 1 + 2 + 1 padding, and 8
    assert _value(processed, processed.name + "_sum") == 12
    assert _value(processed, processed.name + "_bucket", le="4") == 1
    padding = families[batching + "padding_size"]
    assert _value(padding, padding.name + "_sum", execution_batch_size="4") == 1
    assert _value(padding, padding.name + "_sum", execution_batch_size="8") == 0
    queuing = families[batching + "queuing_latency"]
    assert _value(queuing, queuing.name + "_count", thread_pool_name="batch_threads") == 2
    assert _value(
        queuing, queuing.name + "_sum", thread_pool_name="batch_threads"
    ) == pytest.approx(1500)
    assert _value(queuing, queuing.name + "_sum", thread_pool_name="pool") == pytest.approx(200)
    warmup = families[":tensorflow:serving:model_warmup_latency"]
    assert _value(warmup, warmup.name + "_sum", model_path="/models/a/1", status="OK") == 250000
    assert _value(warmup, warmup.name + "_count", model_path="gs://b/a/2", status="DATA_LOSS") == 1
    records = families[":tensorflow:serving:model_warmup_records_read"]
    assert _value(records, records.name + "_total", model_path="/models/a/1", status="OK") == 16


def test_label_values_are_escaped_and_read_back():
    metrics = ServerMetrics()
    odd = 'a "quoted"\\name\nwith a newline'
    metrics.request(odd, "predict", "REST", "OK", 0.001)
    count = _families(metrics)[":tensorflow:serving:request_count"]
    assert _value(count, count.name + "_total", model_name=odd) == 1


def test_each_server_keeps_its_own_registry():
    first, second = ServerMetrics(), ServerMetrics()
    first.request("a", "predict", "REST", "OK", 0.001)
    count = _families(second)[":tensorflow:serving:request_count"]
    assert count.samples == []
    assert b":tensorflow:" not in prometheus_client.generate_latest()  # the global registry
    assert b"request_count" in prometheus_client.generate_latest(first.registry)


def test_requests_counted_from_many_threads_add_up():
    metrics = ServerMetrics()

    def work():
        for _ in range(500):
            metrics.request("a", "Predict", "GRPC", "OK", 0.001, 1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    families = _families(metrics)
    count = families[":tensorflow:serving:request_count"]
    assert _value(count, count.name + "_total", model_name="a", status="OK") == 4000
    latency = families[":tensorflow:serving:request_latency"]
    assert _value(latency, latency.name + "_count", model_name="a") == 4000


def test_the_example_scrape_reads_the_page_the_example_config_serves():
    examples = os.path.join(os.path.dirname(os.path.dirname(__file__)), "export", "serving")
    examples = os.path.join(examples, "examples")
    config = model_config.read_monitoring_config(os.path.join(examples, "monitoring.config"))
    with open(os.path.join(examples, "prometheus.yml"), encoding="utf-8") as f:
        (scraped,) = re.findall(r"^\s*metrics_path:\s*(\S+)\s*$", f.read(), re.M)
    assert scraped == model_config.prometheus_path(config) == "/monitoring/prometheus/metrics"


def test_the_servers_observer_speaks_tf_servings_terms():
    metrics = ServerMetrics()
    watcher = prometheus.MetricsObserver(metrics, "pool")
    watcher.request("a", "predict", "GRPC", "OK", 0.001, 2)
    watcher.request("a", "get_model_metadata", "GRPC", "OK", 0.001, 0)  # not recorded
    watcher.request("a", "predict", "REST", "NOT_FOUND", 0.001, 0)
    watcher.request("a", "get_model_status", "REST", "OK", 0.001, 0)
    watcher.batch("a", "serving_default", [3], 1, [0.002])
    watcher.warmup("a", 1, "/m/a/1/assets.extra/tf_serving_warmup_requests", "OK", 0.5, 2)
    families = _families(metrics)
    count = families[":tensorflow:serving:request_count"]
    assert _value(count, count.name + "_total", status="OK") == 2
    assert _value(count, count.name + "_total", status="NOT_FOUND") == 1
    latency = families[":tensorflow:serving:request_latency"]
    apis = {
        (s.labels["API"], s.labels["entrypoint"]): s.value
        for s in _samples(latency, latency.name + "_count")
    }
    assert apis == {("Predict", "GRPC"): 1, ("", "REST"): 1}
    queuing = families[":tensorflow:serving:batching_session:queuing_latency"]
    assert _value(queuing, queuing.name + "_count", thread_pool_name="pool") == 1
    warmup = families[":tensorflow:serving:model_warmup_latency"]
    assert _value(warmup, warmup.name + "_count", model_path="/m/a/1", status="OK") == 1
