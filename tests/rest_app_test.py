"""Tests for sat_tf.server.rest_app over HTTP on 127.0.0.1: an in-process server over the
tiny export answers row and columnar predictions as the signature answers, the REST
client of export/serving/ captions through it, status and metadata are TF Serving's JSON
(a broken version listed with its error), every error is JSON with the HTTP status of
its canonical code, CORS headers and preflights as TF Serving answers them; and over a
gated fake, a predict past --rest_api_timeout_in_ms gets 504 (running) or 429 (queued)
naming the deadline, the next request answered."""

import base64
import importlib.util
import json
import os
import shutil
import threading
import wsgiref.util

import numpy as np
import requests
import tensorflow as tf
from fixtures import encode, scenes, tiny_export, wait_until
from server_process import serve_in_process

from sat_tf.server import batching, observer
from sat_tf.server.http_server import RestServer
from sat_tf.server.rest_app import CORS_HEADERS, rest_app

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def client(name):
    """export/serving/<name>.py as a module, unchanged."""
    path = os.path.join(ROOT, "export", "serving", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"serving_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RestAppTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.base, cls.manager, cls.server = serve_in_process(cls)
        cls.root = os.path.dirname(cls.base)
        cls.url = f"http://127.0.0.1:{cls.server.rest_port}/v1/models/sat"
        cls.direct = tf.saved_model.load(tiny_export()).signatures["serving_default"]
        cls.images = [encode(x, "PNG") for x in scenes(0, 3)] + [b"not an image"]

    def want(self, images):
        out = self.direct(image_bytes=tf.constant(images))
        return {k: v.numpy() for k, v in out.items()}

    def assertRowsMatch(self, rows, want):
        self.assertLen(rows, len(want["caption"]))
        for i, row in enumerate(rows):
            self.assertEqual(sorted(row), sorted(want))
            self.assertEqual(row["caption"], want["caption"][i].decode())
            self.assertEqual(row["error"], want["error"][i].decode())
            for name in ("tokens", "length", "status"):
                self.assertAllEqual(row[name], want[name][i], msg=name)
            self.assertAllClose(row["attention"], want["attention"][i], atol=1e-5)
            self.assertAllClose(row["log_prob"], want["log_prob"][i], rtol=1e-5, atol=1e-5)
            self.assertEqual(row["captions"], [c.decode() for c in want["captions"][i]])
            self.assertAllClose(row["log_probs"], want["log_probs"][i], rtol=1e-5, atol=1e-5)

    def post(self, body, path=":predict", url=None):
        return requests.post((url or self.url) + path, data=json.dumps(body), timeout=60)

    def test_row_predict_equals_the_signature(self):
        rest_client = client("rest_client")
        answer = rest_client.predict(self.url + ":predict", rest_client.request_body(self.images))
        self.assertRowsMatch(answer["predictions"], self.want(self.images))
        self.assertEqual(answer["predictions"][3]["status"], 2)
        versioned = self.post(rest_client.request_body(self.images[:1]), "/versions/1:predict")
        self.assertRowsMatch(versioned.json()["predictions"], self.want(self.images[:1]))

    def test_columnar_predict(self):
        b64 = [{"b64": base64.b64encode(x).decode()} for x in self.images]
        outputs = self.post({"inputs": {"image_bytes": b64}}).json()["outputs"]
        rows = [{k: v[i] for k, v in outputs.items()} for i in range(len(self.images))]
        self.assertRowsMatch(rows, self.want(self.images))
        bare = self.post({"inputs": b64[:1]}).json()["outputs"]
        self.assertEqual(bare["caption"], [self.want(self.images[:1])["caption"][0].decode()])

    def test_a_request_larger_than_the_queue(self):
        b64 = {"b64": base64.b64encode(self.images[0]).decode()}
        answer = self.post({"instances": [{"image_bytes": b64}] * 300})
        self.assertEqual(answer.status_code, 200, answer.text[:300])
        predictions = answer.json()["predictions"]
        self.assertLen(predictions, 300)
        self.assertEqual(
            {p["caption"] for p in predictions}, {self.want(self.images[:1])["caption"][0].decode()}
        )

    def test_status_and_metadata(self):
        status = requests.get(self.url + "/versions/1", timeout=10)
        self.assertEqual(status.headers["Content-Type"], "application/json")
        listed = requests.get(self.url, timeout=10).json()["model_version_status"]
        self.assertEqual(listed[-1], status.json()["model_version_status"][0])
        self.assertEqual(
            status.json(),
            {
                "model_version_status": [
                    {
                        "version": "1",
                        "state": "AVAILABLE",
                        "status": {"error_code": "OK", "error_message": ""},
                    }
                ]
            },
        )
        metadata = requests.get(self.url + "/versions/1/metadata", timeout=10).json()
        self.assertEqual(
            metadata["model_spec"], {"name": "sat", "signature_name": "", "version": "1"}
        )
        signature_defs = metadata["metadata"]["signature_def"]
        self.assertEqual(
            signature_defs["@type"], "type.googleapis.com/tensorflow.serving.SignatureDefMap"
        )
        defs = signature_defs["signature_def"]
        self.assertEqual(sorted(defs), ["caption_features", "caption_images", "serving_default"])
        self.assertEqual(defs["serving_default"]["inputs"]["image_bytes"]["dtype"], "DT_STRING")

    def test_a_broken_version_is_listed_with_its_error(self):
        staged = os.path.join(self.root, "broken")
        shutil.copytree(tiny_export(), staged)
        with open(os.path.join(staged, "saved_model.pb"), "wb") as f:
            f.write(b"\x0a\xff\xff\xff\xff")
        os.rename(staged, os.path.join(self.base, "2"))
        self.addCleanup(shutil.rmtree, os.path.join(self.base, "2"))

        def listed():
            return requests.get(self.url, timeout=10).json()["model_version_status"]

        wait_until(lambda: listed()[0]["state"] == "END", 60, "version 2 END")
        two, one = listed()
        self.assertEqual((two["version"], two["status"]["error_code"]), ("2", "DATA_LOSS"))
        self.assertIn(
            f"{self.base}/2/saved_model.pb is not a SavedModel", two["status"]["error_message"]
        )
        self.assertEqual((one["version"], one["state"]), ("1", "AVAILABLE"))
        only = requests.get(self.url + "/versions/2", timeout=10).json()["model_version_status"]
        self.assertEqual(only, [two])
        self.assertEqual(self.post({"instances": [{"image_bytes": ""}]}).status_code, 200)

    def call(self, app, method, path, **headers):
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, **headers}
        wsgiref.util.setup_testing_defaults(environ)
        started = []
        body = b"".join(app(environ, lambda status, h: started.append((status, dict(h)))))
        return started[0][0], started[0][1], body

    def test_cors(self):
        plain, cors = rest_app(self.manager), rest_app(self.manager, cors=True)
        status, headers, _ = self.call(plain, "GET", "/v1/models/sat")
        self.assertEqual(status, "200 OK")
        self.assertNotIn("Access-Control-Allow-Origin", headers)
        status, headers, _ = self.call(cors, "GET", "/v1/models/sat")
        self.assertEqual(status, "200 OK")
        self.assertEqual(
            {k: v for k, v in headers.items() if k.startswith("Access-Control")},
            dict(CORS_HEADERS),
        )
        origin = {"HTTP_ORIGIN": "https://example.com"}
        status, headers, body = self.call(cors, "OPTIONS", "/v1/models/sat:predict", **origin)
        self.assertEqual((status, body), ("200 OK", b""))
        self.assertEqual(headers["Access-Control-Allow-Methods"], "POST, GET")
        status, _, body = self.call(cors, "OPTIONS", "/v1/models/sat:predict")
        self.assertEqual(status, "400 Bad Request")
        self.assertIn(b"Origin header is missing", body)

    def test_errors_are_json_with_their_codes(self):
        b64 = [{"image_bytes": {"b64": base64.b64encode(self.images[0]).decode()}}]
        other = f"http://127.0.0.1:{self.server.rest_port}/v1/models/other"
        cases = [
            (
                {"instances": b64},
                ":predict",
                other,
                404,
                "Servable not found for request: Latest(other)",
            ),
            ({"instances": b64}, "/versions/7:predict", None, 404, "Specific(sat, 7)"),
            (
                {"instances": b64},
                "/labels/x:predict",
                None,
                400,
                "Unrecognized servable version label: x",
            ),
            ({"instances": []}, ":predict", None, 400, "non-empty list"),
            ({"instances": b64, "signature_name": "x"}, ":predict", None, 400, '"x" not found'),
            ({"inputs": {"images": [1]}}, ":predict", None, 400, "takes inputs ['image_bytes']"),
            ({"rows": 1}, ":predict", None, 400, '"instances" or "inputs"'),
            (
                {"instances": [{"image_bytes": {"b64": "%%"}}]},
                ":predict",
                None,
                400,
                "input image_bytes",
            ),
            ({"instances": b64}, ":classify", None, 501, ":classify is not implemented"),
            ({"instances": b64}, "/versions/x:predict", None, 400, "Malformed request: POST"),
        ]
        for body, path, url, code, message in cases:
            answer = self.post(body, path, url)
            self.assertEqual(answer.status_code, code, msg=path)
            self.assertEqual(answer.headers["Content-Type"], "application/json")
            self.assertIn(message, answer.json()["error"])
        answer = requests.post(self.url + ":predict", data=b"{not json", timeout=10)
        self.assertEqual(answer.status_code, 400)
        self.assertStartsWith(answer.json()["error"], "the body is not JSON")
        answer = requests.get(f"http://127.0.0.1:{self.server.rest_port}/healthz", timeout=10)
        self.assertEqual(
            (answer.status_code, answer.json()), (404, {"error": "no page at /healthz"})
        )
        empty = self.post({"instances": [{"image_bytes": ""}]}).json()["predictions"]
        self.assertEqual(empty[0]["error"], "image_bytes[0] is empty (0 bytes)")


class Gated:
    """A manager of one model whose version runs a gated fake through a `Batcher`: the
    batch waits for `gate` before answering {"y": 2 x}."""

    observer = observer.Observer()

    def __init__(self):
        self.gate, self.running = threading.Event(), threading.Event()
        self.batcher = batching.Batcher(
            self.run, batching.BatchingParameters(max_batch_size=1, num_batch_threads=1)
        )
        self.version, self.signature_defs = 1, {}

    def run(self, inputs):
        self.running.set()
        self.gate.wait(30)
        return {"y": 2 * inputs["x"]}

    def input_numpy_dtypes(self, signature):
        return {"x": np.dtype(np.float32)}

    def predict(self, signature, inputs, deadline=None):
        return self.batcher(inputs, deadline)

    def servable(self, name, version=None, label=None):
        import contextlib

        return contextlib.nullcontext(self)


class DeadlineTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.fake = Gated()
        self.addCleanup(self.fake.batcher.close)
        self.addCleanup(self.fake.gate.set)
        app = rest_app(self.fake, timeout_seconds=0.3)
        self.server = RestServer(app, "127.0.0.1", 0, 4, 2**20)
        self.addCleanup(self.server.stop, 5)
        self.url = f"http://127.0.0.1:{self.server.port}/v1/models/sat:predict"

    def post(self, x):
        return requests.post(self.url, json={"instances": [x]}, timeout=30)

    def test_running_past_the_deadline_is_504_and_the_next_is_answered(self):
        answer = self.post(1.5)
        self.assertEqual(answer.status_code, 504)
        self.assertEqual(
            answer.json(),
            {
                "error": "the deadline of --rest_api_timeout_in_ms (300 ms) passed while the "
                "request's batch ran"
            },
        )
        self.fake.gate.set()
        self.assertEqual(self.post(2.0).json(), {"predictions": [4.0]})

    def test_queued_past_the_deadline_is_429(self):
        results = []
        thread = threading.Thread(target=lambda: results.append(self.post(1.0)))
        thread.start()
        self.fake.running.wait(10)  # the first holds the one batch thread
        answer = self.post(3.0)
        self.assertEqual(answer.status_code, 429)
        self.assertIn("passed while the request waited in the batch queue", answer.json()["error"])
        thread.join(30)
        self.assertEqual(results[0].status_code, 504)
        self.fake.gate.set()
        self.assertEqual(self.post(4.0).json(), {"predictions": [8.0]})


if __name__ == "__main__":
    tf.test.main()
