"""sat-serve with TF Serving's operators' files, as an operator meets it: live server
processes on 127.0.0.1 (and ::) over copies of the tiny export, with real clients:
tensorflow-serving-api's stubs over TLS (version_label, HandleReloadConfigRequest), HTTP
to the /labels/ routes, prometheus-client's parser on the metrics page, grpc.health.v1's
stub (Check and Watch across a SIGTERM drain), mutual TLS with certificates made here by
`cryptography`.

The default run holds the starts that must end with one line naming the file and the
field, and --version. The live servers are slow tests (`-m slow`): the example
models.config (two models, a specific policy, labels stable and canary) with the example
monitoring.config, TLS, health and CORS; and a server on :: with mutual TLS, per-model
batching parameters and the rest of TF Serving's flags.
"""

import concurrent.futures
import os
import shutil
import signal
import tempfile
import threading
import time

import grpc
import pytest
import requests
import tensorflow as tf
from fixtures import encode, run_main, scenes, wait_until
from google.protobuf import text_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from serve_test import grpc_client
from server_process import ROOT, SatServe, add_version, predict_body
from tensorflow_serving.apis import (
    model_management_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)
from tensorflow_serving.config import model_server_config_pb2
from tls_test import Authority

from sat_tf.cli import serve
from sat_tf.server.protos import ssl_config_pb2

EXAMPLES = os.path.join(ROOT, "export", "serving", "examples")
DEADLINE = 60  # seconds any call may take
METRICS = "/monitoring/prometheus/metrics"


def example_models(root):
    """export/serving/examples/models.config with its base paths under `root`: model sat
    (versions 1 and 2, stable=1, canary=2) and sat_coco (version 1)."""
    with open(os.path.join(EXAMPLES, "models.config")) as f:
        text = f.read().replace('"/models/', f'"{root}/')
    add_version(os.path.join(root, "sat"), 1)
    add_version(os.path.join(root, "sat"), 2)
    add_version(os.path.join(root, "sat_coco"), 1)
    return write(os.path.join(root, "models.config"), text)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def ssl_config(path, server, ca=None):
    """An SSLConfig file for `server` ((key, certificate) PEM); with `ca` (PEM), clients
    must present a certificate it signed."""
    key, certificate = server
    config = ssl_config_pb2.SSLConfig(
        server_key=key, server_cert=certificate, custom_ca=ca or "", client_verify=bool(ca)
    )
    return write(path, text_format.MessageToString(config))


def secure_channel(port, ca, client=None):
    key, chain = client or (None, None)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.encode(),
        private_key=key and key.encode(),
        certificate_chain=chain and chain.encode(),
    )
    return grpc.secure_channel(f"127.0.0.1:{port}", credentials)


def predict(stub, png, **spec):
    request = grpc_client().predict_request([png])
    for key, value in spec.items():
        setattr(request.model_spec, key, value)
    return stub.Predict(request, timeout=DEADLINE)


class BadFilesTest(tf.test.TestCase):
    """Starts that end with one line naming the file and the field, in this process."""

    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(dir=self.get_temp_dir())

    def start(self, *flags):
        code, out, err = run_main(
            serve.main, "sat-serve", "--host=127.0.0.1", "--port=0", "--rest_api_port=0", *flags
        )
        self.assertEqual(code, 1, out)
        self.assertNotIn("Traceback", err)
        (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
        return line

    def test_a_bad_model_config(self):
        path = write(
            os.path.join(self.root, "models.config"),
            'model_config_list {\n  config {\n    name: "a"\n    base_pat: "/a"\n  }\n}\n',
        )
        self.assertEqual(
            self.start(f"--model_config_file={path}"),
            f'error: {path}:4:5: Message type "tensorflow.serving.ModelConfig" has no field '
            'named "base_pat".',
        )
        write(
            path,
            f'model_config_list {{ config {{ name: "a" base_path: "{self.root}" '
            'model_platform: "tensorflow" model_version_policy { specific { versions: 1 } } '
            'version_labels { key: "canary" value: 2 } } }',
        )
        self.assertEqual(
            self.start(f"--model_config_file={path}"),
            f'error: {path}: model_config_list.config[0] (model "a").version_labels["canary"]: '
            "version 2 is not among model_version_policy.specific.versions [1]",
        )

    def test_a_label_naming_a_missing_version(self):
        base = os.path.join(self.root, "a")
        add_version(base, 1)
        path = write(
            os.path.join(self.root, "models.config"),
            f'model_config_list {{ config {{ name: "a" base_path: "{base}" '
            'model_platform: "tensorflow" version_labels { key: "canary" value: 2 } } }',
        )
        self.assertEqual(
            self.start(f"--model_config_file={path}"),
            f"error: {path}: Request to assign label to version 2 of model a, which is not "
            'currently available for inference (version_labels["canary"])',
        )

    def test_a_key_that_is_not_the_certificates_and_a_bad_monitoring_path(self):
        authority = Authority("test CA")
        key, _ = authority.issue("localhost")
        _, certificate = authority.issue("localhost")
        path = ssl_config(os.path.join(self.root, "ssl.config"), (key, certificate))
        flags = (f"--model_base_path={self.root}", f"--ssl_config_file={path}")
        self.assertEqual(
            self.start(*flags),
            f"error: {path}: server_key: not the key of the certificate in server_cert",
        )
        monitoring = write(
            os.path.join(self.root, "monitoring.config"),
            'prometheus_config { enable: true path: "metrics" }',
        )
        self.assertEqual(
            self.start(f"--model_base_path={self.root}", f"--monitoring_config_file={monitoring}"),
            f"error: {monitoring}: prometheus_config.path: 'metrics' does not start with /",
        )

    def test_version(self):
        code, out, _ = run_main(serve.main, "sat-serve", "--version")
        self.assertEqual(code, 0)
        self.assertEqual(out, f"sat-serve: 0.1.0\nTensorFlow Library: {tf.__version__}\n")


@pytest.mark.slow
class OperatorsTest(tf.test.TestCase):
    """One server: the example models.config (polled every second), the example
    monitoring.config, TLS on gRPC, health, CORS; a batch waits 1 s for company."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.models = example_models(cls.root)
        cls.authority = Authority("test CA")
        ssl = ssl_config(os.path.join(cls.root, "ssl.config"), cls.authority.issue("localhost"))
        batching = write(
            os.path.join(cls.root, "batching.txt"),
            "max_batch_size { value: 4 }\nbatch_timeout_micros { value: 1000000 }\n",
        )
        cls.png = encode(scenes(0, 1)[0], "PNG")
        cls.body = predict_body([cls.png])
        cls.server = SatServe(
            cls.root,
            f"--model_config_file={cls.models}",
            "--model_config_file_poll_wait_seconds=1",
            f"--monitoring_config_file={os.path.join(EXAMPLES, 'monitoring.config')}",
            f"--ssl_config_file={ssl}",
            f"--batching_parameters_file={batching}",
            "--enable_grpc_healthcheck_service",
            "--rest_api_enable_cors_support",
            stderr_path=os.path.join(cls.root, "stderr.txt"),
        )
        cls.addClassCleanup(cls.server.kill)
        cls.channel = secure_channel(cls.server.grpc, cls.authority.pem)
        cls.addClassCleanup(cls.channel.close)
        cls.predictions = prediction_service_pb2_grpc.PredictionServiceStub(cls.channel)
        cls.health = health_pb2_grpc.HealthStub(cls.channel)
        cls.rest = f"http://127.0.0.1:{cls.server.rest}"

    def post(self, path):
        return requests.post(f"{self.rest}/v1/models/{path}:predict", data=self.body, timeout=60)

    def check(self, name):
        request = health_pb2.HealthCheckRequest(service=name)
        return self.health.Check(request, timeout=DEADLINE).status

    def grpc_version(self, **spec):
        return predict(self.predictions, self.png, **spec).model_spec.version.value

    def test_labels_versions_and_models(self):
        paths = ("sat/labels/stable", "sat/labels/canary", "sat/versions/1", "sat_coco", "sat")
        with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
            answers = list(pool.map(self.post, paths))
        for path, answer in zip(paths, answers, strict=True):
            self.assertEqual(answer.status_code, 200, f"{path}: {answer.text[:300]}")
        self.assertEqual(answer.headers["Access-Control-Allow-Origin"], "*")
        self.assertEqual(self.post("sat/labels/beta").status_code, 400)
        status = requests.get(f"{self.rest}/v1/models/sat/labels/canary", timeout=60).json()
        self.assertEqual(status["model_version_status"][0]["version"], "2")
        self.assertEqual(self.grpc_version(name="sat", version_label="canary"), 2)
        self.assertEqual(self.grpc_version(name="sat", version_label="stable"), 1)
        self.assertEqual(self.grpc_version(name="sat_coco"), 1)

    def test_an_insecure_channel_fails(self):
        with grpc.insecure_channel(f"127.0.0.1:{self.server.grpc}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            with self.assertRaises(grpc.RpcError) as raised:
                predict(stub, self.png, name="sat")
        self.assertEqual(raised.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_cors_preflight(self):
        url = f"{self.rest}/v1/models/sat:predict"
        answer = requests.options(url, headers={"Origin": "http://example.com"}, timeout=60)
        self.assertEqual(answer.status_code, 200)
        self.assertEqual(answer.headers["Access-Control-Allow-Methods"], "POST, GET")
        self.assertEqual(requests.options(url, timeout=60).status_code, 400)

    def test_metrics_after_five_predicts(self):
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda _: self.post("sat_coco"), range(5)))
        self.assertEqual([a.status_code for a in answers], [200] * 5)
        page = requests.get(self.rest + METRICS, timeout=60)
        self.assertEqual(page.status_code, 200)
        families = {f.name: f for f in text_string_to_metric_families(page.text)}

        def value(family, sample_name, **labels):
            return sum(
                s.value
                for s in families[family].samples
                if s.name == sample_name and labels.items() <= s.labels.items()
            )

        # The page writes counters as TF Serving does, without _total; the parser adds it.
        count = ":tensorflow:serving:request_count"
        self.assertIn(f'\n{count}{{model_name="sat_coco",status="OK"}} ', page.text)
        ok = value(count, count + "_total", model_name="sat_coco", status="OK")
        self.assertGreaterEqual(ok, 5)
        latency = ":tensorflow:serving:request_latency"
        self.assertEqual(families[latency].type, "histogram")
        labels = {"model_name": "sat_coco", "API": "predict", "entrypoint": "REST"}
        self.assertGreaterEqual(value(latency, latency + "_count", **labels), 5)
        self.assertGreaterEqual(value(latency, latency + "_bucket", le="+Inf", **labels), 5)
        examples = ":tensorflow:serving:request_example_counts"
        self.assertGreaterEqual(value(examples, examples + "_sum", model="sat_coco"), 5)
        processed = ":tensorflow:serving:batching_session:processed_batch_size"
        self.assertGreater(value(processed, processed + "_count"), 0)
        queuing = ":tensorflow:serving:batching_session:queuing_latency"
        self.assertGreater(value(queuing, queuing + "_count", thread_pool_name="batch_threads"), 0)
        warmup = ":tensorflow:serving:model_warmup_latency"
        self.assertEqual(value(warmup, warmup + "_count", status="OK"), 3)  # three versions

    def test_health_check(self):
        for name in ("", "ModelService", "PredictionService", "sat", "sat_coco"):
            self.assertEqual(self.check(name), health_pb2.HealthCheckResponse.SERVING, name)
        with self.assertRaises(grpc.RpcError) as raised:
            self.check("no_such_model")
        self.assertEqual(raised.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_reload_request_and_the_polled_file(self):
        models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        config = model_server_config_pb2.ModelServerConfig()
        with open(self.models) as f:
            text_format.Parse(f.read(), config)
        request = model_management_pb2.ReloadConfigRequest(config=config)
        sat = request.config.model_config_list.config[0]
        sat.version_labels["stable"], sat.version_labels["canary"] = 2, 1
        self.assertEqual(
            models.HandleReloadConfigRequest(request, timeout=DEADLINE).status.error_code, 0
        )
        self.assertEqual(self.grpc_version(name="sat", version_label="canary"), 1)
        sat.version_labels["canary"] = 7
        with self.assertRaises(grpc.RpcError) as raised:
            models.HandleReloadConfigRequest(request, timeout=DEADLINE)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(
            'version_labels["canary"]: version 7 is not among', raised.exception.details()
        )
        self.assertEqual(self.grpc_version(name="sat", version_label="canary"), 1)
        # A bad file keeps the config being served, and the log says why.
        with open(self.models) as f:
            good = f.read()
        write(self.models, good.replace("model_platform", "model_platfrom", 1))
        wait_until(
            lambda: "kept the config being served" in self.server.errors(), 30, "the logged refusal"
        )
        line = good[: good.index("model_platform")].count("\n") + 1
        self.assertIn(
            f'{self.models}:{line}:5: Message type "tensorflow.serving.ModelConfig" has no field '
            'named "model_platfrom"',
            self.server.errors(),
        )
        self.assertEqual(self.grpc_version(name="sat", version_label="canary"), 1)
        # A new file is served at the next poll.
        write(self.models, good.replace('key: "canary"', 'key: "beta"'))
        wait_until(lambda: self.post("sat/labels/beta").status_code == 200, 30, "label beta")
        self.assertEqual(self.grpc_version(name="sat", version_label="beta"), 2)
        write(self.models, good)
        wait_until(lambda: self.post("sat/labels/canary").status_code == 200, 30, "label canary")

    def test_zz_sigterm_drain(self):
        # Named to run last (unittest orders a class's tests by name): it stops the server.
        seen, answers = [], []
        watch = self.health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=DEADLINE)
        watcher = threading.Thread(target=lambda: seen.extend(r.status for r in watch))
        watcher.start()
        wait_until(lambda: seen, 10, "the first status")
        poster = threading.Thread(target=lambda: answers.append(self.post("sat")))
        poster.start()
        time.sleep(0.3)  # the request waits in its batch for a second
        self.server.process.send_signal(signal.SIGTERM)
        wait_until(
            lambda: self.check("") == health_pb2.HealthCheckResponse.NOT_SERVING,
            10,
            "NOT_SERVING while draining",
        )
        poster.join(60)
        watcher.join(60)
        self.assertEqual(answers[0].status_code, 200, answers[0].text[:300])
        serving, not_serving = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        )
        self.assertEqual(seen, [serving, not_serving])
        self.assertEqual(self.server.process.wait(60), 0)
        self.assertNotIn("Traceback", self.server.errors())


@pytest.mark.slow
class MutualTlsTest(tf.test.TestCase):
    """One model on :: (IPv6 and IPv4) with client_verify: only a client with a
    certificate the CA signed is answered; its version folder's batching_params.pbtxt
    batches it, without a warm-up."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        version = add_version(os.path.join(cls.root, "sat"), 1)
        write(
            os.path.join(version, "batching_params.pbtxt"),
            "max_batch_size { value: 2 }\nbatch_timeout_micros { value: 0 }\n",
        )
        cls.authority, other = Authority("test CA"), Authority("another CA")
        cls.client, cls.stranger = cls.authority.issue("a client"), other.issue("a stranger")
        ssl = ssl_config(
            os.path.join(cls.root, "ssl.config"),
            cls.authority.issue("localhost"),
            cls.authority.pem,
        )
        cls.server = SatServe(
            os.path.join(cls.root, "sat"),
            "--host=::",
            f"--ssl_config_file={ssl}",
            # The rest of TF Serving's flags, each taken.
            "--enable_per_model_batching_parameters",
            "--enable_model_warmup=false",
            "--num_request_iterations_for_warmup=2",
            "--grpc_max_threads=4",
            "--allow_version_labels_for_unavailable_models",
        )
        cls.addClassCleanup(cls.server.kill)
        cls.png = encode(scenes(0, 1)[0], "PNG")

    def call(self, channel):
        with channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            return predict(stub, self.png, name="sat").model_spec.version.value

    def test_only_a_client_the_ca_signed_is_answered(self):
        self.assertEqual(
            self.call(secure_channel(self.server.grpc, self.authority.pem, self.client)), 1
        )
        for channel in (
            secure_channel(self.server.grpc, self.authority.pem),
            secure_channel(self.server.grpc, self.authority.pem, self.stranger),
            grpc.insecure_channel(f"127.0.0.1:{self.server.grpc}"),
        ):
            with self.assertRaises(grpc.RpcError) as raised:
                self.call(channel)
            self.assertEqual(raised.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_rest_on_ipv6(self):
        url = f"http://[::1]:{self.server.rest}/v1/models/sat"
        answer = requests.get(url, timeout=60)
        self.assertEqual(answer.status_code, 200)
        self.assertEqual(answer.json()["model_version_status"][0]["state"], "AVAILABLE")
        # Three images in batches of at most 2 (the folder's file) come back whole.
        images = [encode(x, "PNG") for x in scenes(0, 3)]
        answer = requests.post(url + ":predict", data=predict_body(images), timeout=60)
        self.assertEqual(answer.status_code, 200, answer.text[:300])
        self.assertEqual([p["status"] for p in answer.json()["predictions"]], [0, 0, 0])
        self.assertEqual(self.server.stop(), 0)


if __name__ == "__main__":
    tf.test.main()
