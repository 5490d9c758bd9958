"""Tests for sat_tf.serving.model_server on loopback: one in-process server (REST and
gRPC on ephemeral ports of 127.0.0.1) over a tiny export. Row and columnar predictions
equal the signature called directly, TF Serving's clients in export/serving/ caption
through it, status and metadata answer as TF Serving does, errors get its codes, a full
queue is 503, an oversized body 413, and a new version folder is picked up."""

import base64
import concurrent.futures
import importlib.util
import json
import os
import shutil
import tempfile

import grpc
import numpy as np
import requests
import tensorflow as tf
from fixtures import encode, scenes, tiny_model
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

from sat_tf.server import batching
from sat_tf.server import manager as model_server
from sat_tf.serving import exporting, warmup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BODY = 2**20


def client(name):
    """export/serving/<name>.py as a module, unchanged."""
    path = os.path.join(ROOT, "export", "serving", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"serving_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ModelServerTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.base = os.path.join(cls.root, "sat")
        model, vocab, config = tiny_model()
        exporting.export(model, vocab, config, os.path.join(cls.base, "1"))
        os.makedirs(os.path.join(cls.base, ".2.tmpabc"))  # staged: never a version
        params = batching.BatchingParameters(max_batch_size=8, batch_timeout_micros=300_000)
        cls.manager = model_server.ModelManager("sat", cls.base, params, poll_wait_seconds=0)
        cls.manager.start()
        cls.server = model_server.serve(cls.manager, 0, 0, "127.0.0.1", 8, MAX_BODY)
        cls.addClassCleanup(cls.server.stop, 5)
        cls.url = f"http://127.0.0.1:{cls.server.rest_port}/v1/models/sat"
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.server.grpc_port}")
        cls.addClassCleanup(cls.channel.close)
        signature = tf.saved_model.load(os.path.join(cls.base, "1")).signatures
        cls.direct = signature["serving_default"]
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

    def post(self, body, path=":predict"):
        return requests.post(self.url + path, data=json.dumps(body), timeout=60)

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

    def test_grpc_client_predicts(self):
        grpc_client = client("grpc_client")
        stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        response = stub.Predict(grpc_client.predict_request(self.images), 60)
        results = grpc_client.parse_response(response)
        want = self.want(self.images)
        self.assertEqual([r["caption"] for r in results], [c.decode() for c in want["caption"]])
        self.assertEqual([r["status"] for r in results], want["status"].tolist())
        self.assertEqual(response.model_spec.version.value, 1)

    def test_concurrent_requests_share_calls(self):
        rest_client = client("rest_client")
        servable = self.manager.servable
        before = servable.batchers["serving_default"].calls
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(
                pool.map(
                    lambda i: self.post(rest_client.request_body([self.images[i % 4]])).json(),
                    range(6),
                )
            )
        for i, answer in enumerate(answers):
            self.assertRowsMatch(answer["predictions"], self.want([self.images[i % 4]]))
        self.assertLess(servable.batchers["serving_default"].calls - before, 6)

    def test_status_and_metadata(self):
        status = requests.get(self.url, timeout=10).json()
        self.assertEqual(
            status["model_version_status"],
            [
                {
                    "version": "1",
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ],
        )
        metadata = requests.get(self.url + "/versions/1/metadata", timeout=10).json()
        self.assertEqual(
            metadata["model_spec"], {"name": "sat", "signature_name": "", "version": "1"}
        )
        defs = metadata["metadata"]["signature_def"]["signature_def"]
        self.assertEqual(sorted(defs), ["caption_features", "caption_images", "serving_default"])
        self.assertEqual(defs["serving_default"]["inputs"]["image_bytes"]["dtype"], "DT_STRING")

    def test_grpc_status_and_metadata(self):
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "sat"
        status = model_service_pb2_grpc.ModelServiceStub(self.channel).GetModelStatus(request, 10)
        self.assertEqual(status.model_version_status[0].version, 1)
        self.assertEqual(
            status.model_version_status[0].state, get_model_status_pb2.ModelVersionStatus.AVAILABLE
        )
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = "sat"
        stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        signatures = get_model_metadata_pb2.SignatureDefMap()
        stub.GetModelMetadata(request, 10).metadata["signature_def"].Unpack(signatures)
        self.assertEqual(
            signatures.signature_def["serving_default"].method_name, "tensorflow/serving/predict"
        )
        request.model_spec.name = "other"
        with self.assertRaises(grpc.RpcError) as raised:
            stub.GetModelMetadata(request, 10)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_errors(self):
        b64 = [{"image_bytes": {"b64": base64.b64encode(self.images[0]).decode()}}]
        cases = [
            ({"instances": b64}, ":predict", 404, "Servable not found", "/v1/models/other"),
            ({"instances": b64}, "/versions/7:predict", 404, "name: sat version: 7", None),
            ({"instances": []}, ":predict", 400, "non-empty list", None),
            ({"instances": b64, "signature_name": "x"}, ":predict", 400, 'key "x" not found', None),
            ({"inputs": {"images": [1]}}, ":predict", 400, "takes inputs ['image_bytes']", None),
            ({"rows": 1}, ":predict", 400, '"instances" or "inputs"', None),
            ({"instances": b64}, ":classify", 404, "Malformed request", None),
        ]
        for body, path, code, message, url in cases:
            base = self.url if url is None else f"http://127.0.0.1:{self.server.rest_port}{url}"
            answer = requests.post(base + path, data=json.dumps(body), timeout=30)
            self.assertEqual(answer.status_code, code, msg=path)
            self.assertIn(message, answer.json()["error"])
        answer = requests.post(self.url + ":predict", data=b"{not json", timeout=10)
        self.assertEqual(answer.status_code, 400)
        self.assertStartsWith(answer.json()["error"], "the body is not JSON")
        empty = self.post({"instances": [{"image_bytes": ""}]}).json()["predictions"]
        self.assertEqual(empty[0]["error"], "image_bytes[0] is empty (0 bytes)")

    def test_warmup_file_runs_through_the_signature(self):
        path = os.path.join(self.base, "1", warmup.WARMUP_FILE)
        requests_ = warmup.read_warmup(path)
        self.assertEqual([len(r.inputs["image_bytes"].string_val) for r in requests_], [1, 16])
        for request in requests_:
            self.assertEqual(request.model_spec.signature_name, "serving_default")
            images = tf.make_ndarray(request.inputs["image_bytes"])
            out = self.direct(image_bytes=tf.constant(images))
            self.assertAllEqual(out["status"], [0] * len(images))
        self.assertEqual(self.manager.servable.warm_up(), 2)

    def test_oversized_body_is_413(self):
        answer = requests.post(self.url + ":predict", data=b"x" * (MAX_BODY + 1), timeout=10)
        self.assertEqual(answer.status_code, 413)

    def test_full_queue_is_503(self):
        servable = self.manager.servable
        run = servable._run["serving_default"]

        def full(inputs):
            raise batching.QueueFullError("the batch queue is full")

        servable._run["serving_default"] = full
        self.addCleanup(servable._run.__setitem__, "serving_default", run)
        answer = self.post({"instances": [{"image_bytes": ""}]})
        self.assertEqual(answer.status_code, 503)
        self.assertEqual(answer.json(), {"error": "the batch queue is full"})

    def test_new_version_picked_up(self):
        base = os.path.join(self.root, "versions")
        shutil.copytree(os.path.join(self.base, "1"), os.path.join(base, "3"))
        manager = model_server.ModelManager("sat", base, None, poll_wait_seconds=0)
        manager.start()
        self.addCleanup(manager.stop)
        self.assertEqual(manager.get("sat").version, 3)
        self.assertFalse(manager.poll())
        os.makedirs(os.path.join(base, "4"))  # no saved_model.pb yet
        self.assertFalse(manager.poll())
        shutil.copytree(os.path.join(self.base, "1"), os.path.join(base, ".5.tmp"))
        os.rename(os.path.join(base, ".5.tmp"), os.path.join(base, "5"))
        self.assertTrue(manager.poll())
        self.assertEqual(manager.get("sat").version, 5)
        with self.assertRaisesRegex(model_server.ServingError, "version: 3"):
            manager.get("sat", 3)
        self.assertEqual(model_server.find_versions(base), [3, 5])
        inputs = {"image_bytes": np.array(self.images[:1], dtype=object)}
        got = manager.get("sat").predict("", inputs)
        self.assertEqual(got["caption"][0], self.want(self.images[:1])["caption"][0])


class ErrorLineTest(tf.test.TestCase):
    def test_an_assertion_gives_its_text_and_others_their_first_line(self):
        @tf.function
        def refuse(n):
            with tf.control_dependencies([tf.debugging.Assert(n > 0, ["image_bytes[0] is empty"])]):
                return n + 1

        with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
            refuse(tf.constant(0))
        self.assertStartsWith(raised.exception.message, "Graph execution error:")
        self.assertEqual(model_server.error_line(raised.exception), "image_bytes[0] is empty")
        self.assertEqual(model_server.error_line(ValueError("bad shape\n  more")), "bad shape")
        self.assertEqual(model_server.error_line(ValueError("")), "")


class AnswerJsonTest(tf.test.TestCase):
    def test_outputs_read_back_as_the_signature_gave_them(self):
        rng = np.random.default_rng(0)
        attention = rng.random((2, 3, 4, 5), dtype=np.float32) ** 8  # down to ~1e-9
        outputs = {
            "attention": attention[:, :, :, ::2],  # not contiguous
            "log_prob": np.array([-1.25, -3.0e-7], np.float32),
            "tokens": np.array([[3, 4], [5, 0]], np.int32),
            "off_world": np.array([True, False]),
            "caption": np.array([b"a dog", b"\xff\xfe"], dtype=object),
        }
        rows = {k: model_server._jsonable(v) for k, v in outputs.items()}
        answer = {"predictions": [{k: v[i] for k, v in rows.items()} for i in range(2)]}
        got = json.loads(model_server._dumps(answer))["predictions"]
        for i in range(2):
            self.assertAllEqual(np.float32(got[i]["attention"]), outputs["attention"][i])
            self.assertEqual(np.float32(got[i]["log_prob"]), outputs["log_prob"][i])
            self.assertEqual(got[i]["tokens"], outputs["tokens"][i].tolist())
            self.assertIs(got[i]["off_world"], bool(outputs["off_world"][i]))
        self.assertEqual(got[0]["caption"], "a dog")
        self.assertEqual(got[1]["caption"], {"b64": base64.b64encode(b"\xff\xfe").decode()})
