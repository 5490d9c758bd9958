"""Tests for sat_tf.server.grpc_api with tensorflow-serving-api's stubs on 127.0.0.1: the
gRPC client of export/serving/ captions through an in-process server over the tiny
export; a version by number or label, output_filter, status and metadata answer as TF
Serving does; errors carry their canonical codes and never an exception's text; a 1 ms
deadline gets DEADLINE_EXCEEDED and the next call is answered; a predict while the server
drains is refused with UNAVAILABLE; HandleReloadConfigRequest refuses what it cannot
serve, naming the field."""

import importlib.util
import os
from unittest import mock

import grpc
import tensorflow as tf
from fixtures import encode, scenes, tiny_export
from server_process import serve_in_process
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def grpc_client():
    path = os.path.join(ROOT, "export", "serving", "grpc_client.py")
    spec = importlib.util.spec_from_file_location("serving_grpc_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class GrpcApiTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.base, cls.manager, cls.server = serve_in_process(cls, version=3)
        cls.manager._models["sat"].labels = {"stable": 3}
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.server.grpc_port}")
        cls.addClassCleanup(cls.channel.close)
        cls.predictions = prediction_service_pb2_grpc.PredictionServiceStub(cls.channel)
        cls.models = model_service_pb2_grpc.ModelServiceStub(cls.channel)
        direct = tf.saved_model.load(tiny_export()).signatures["serving_default"]
        cls.images = [encode(x, "PNG") for x in scenes(0, 3)] + [b"not an image"]
        cls.want = {k: v.numpy() for k, v in direct(image_bytes=tf.constant(cls.images)).items()}

    def test_the_client_captions(self):
        client = grpc_client()
        response = self.predictions.Predict(client.predict_request(self.images), 60)
        results = client.parse_response(response)
        want = [c.decode() for c in self.want["caption"]]
        self.assertEqual([r["caption"] for r in results], want)
        self.assertEqual([r["status"] for r in results], self.want["status"].tolist())
        self.assertEqual(response.model_spec.version.value, 3)
        self.assertEqual(response.model_spec.signature_name, "serving_default")

    def test_version_label_and_output_filter(self):
        request = grpc_client().predict_request(self.images[:1])
        request.model_spec.version_label = "stable"
        request.output_filter.append("caption")
        response = self.predictions.Predict(request, 60)
        self.assertEqual(list(response.outputs), ["caption"])
        self.assertEqual(response.model_spec.version.value, 3)
        request.model_spec.version.value = 3
        self.assertEqual(self.predictions.Predict(request, 60).model_spec.version.value, 3)

    def test_status_and_metadata(self):
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "sat"
        (status,) = self.models.GetModelStatus(request, 10).model_version_status
        self.assertEqual(status.version, 3)
        self.assertEqual(status.state, get_model_status_pb2.ModelVersionStatus.AVAILABLE)
        self.assertEqual(status.status.error_code, 0)
        request.model_spec.version_label = "stable"
        self.assertEqual(self.models.GetModelStatus(request, 10).model_version_status[0].version, 3)
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = "sat"
        signatures = get_model_metadata_pb2.SignatureDefMap()
        answer = self.predictions.GetModelMetadata(request, 10)
        answer.metadata["signature_def"].Unpack(signatures)
        self.assertEqual(answer.model_spec.version.value, 3)
        self.assertEqual(
            signatures.signature_def["serving_default"].method_name, "tensorflow/serving/predict"
        )

    def assertCode(self, call, request, code, message):
        with self.assertRaises(grpc.RpcError) as raised:
            call(request, 10)
        self.assertEqual(raised.exception.code(), code)
        self.assertIn(message, raised.exception.details())

    def test_errors_carry_their_codes(self):
        client = grpc_client()
        request = client.predict_request(self.images[:1], model_name="other")
        self.assertCode(
            self.predictions.Predict, request, grpc.StatusCode.NOT_FOUND, "Latest(other)"
        )
        request = client.predict_request(self.images[:1])
        request.model_spec.version.value = 9
        self.assertCode(
            self.predictions.Predict, request, grpc.StatusCode.NOT_FOUND, "Specific(sat, 9)"
        )
        request = client.predict_request(self.images[:1])
        request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([1.0, 2.0]))
        self.assertCode(
            self.predictions.Predict, request, grpc.StatusCode.INVALID_ARGUMENT, "takes strings"
        )
        request = client.predict_request(self.images[:1])
        request.output_filter.append("nope")
        self.assertCode(
            self.predictions.Predict, request, grpc.StatusCode.INVALID_ARGUMENT, "alias not found"
        )
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "sat"
        request.model_spec.version.value = 4
        self.assertCode(
            self.models.GetModelStatus, request, grpc.StatusCode.NOT_FOUND, "version 4 of model sat"
        )
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["other"])
        request.model_spec.name = "sat"
        self.assertCode(
            self.predictions.GetModelMetadata, request, grpc.StatusCode.INVALID_ARGUMENT, "exactly"
        )

    def test_a_predict_while_draining_and_reloads_it_refuses(self):
        request = grpc_client().predict_request(self.images[:1])
        self.manager.draining.set()
        try:
            self.assertCode(
                self.predictions.Predict, request, grpc.StatusCode.UNAVAILABLE, "draining"
            )
        finally:
            self.manager.draining.clear()
        self.assertEqual(self.predictions.Predict(request, 60).model_spec.version.value, 3)
        reload = model_management_pb2.ReloadConfigRequest()
        reload.config.custom_model_config.Pack(reload)
        self.assertCode(
            self.models.HandleReloadConfigRequest,
            reload,
            grpc.StatusCode.INVALID_ARGUMENT,
            "Only ModelConfigList is currently supported",
        )
        reload = model_management_pb2.ReloadConfigRequest()
        reload.config.model_config_list.config.add(
            name="sat", base_path=os.path.join(self.base, "nowhere"), model_platform="tensorflow"
        )
        self.assertCode(
            self.models.HandleReloadConfigRequest,
            reload,
            grpc.StatusCode.NOT_FOUND,
            'HandleReloadConfigRequest: model_config_list.config[0] (model "sat").base_path: ',
        )
        self.assertEqual(self.predictions.Predict(request, 60).model_spec.version.value, 3)

    def test_a_bug_is_internal_without_its_text(self):
        request = grpc_client().predict_request(self.images[:1])
        broken = mock.patch.object(predict_pb2, "PredictResponse", side_effect=KeyError("secret"))
        with broken, self.assertLogs("sat_tf.server.errors", "ERROR") as logs:
            with self.assertRaises(grpc.RpcError) as raised:
                self.predictions.Predict(request, 10)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INTERNAL)
        self.assertEqual(
            raised.exception.details(), "internal error of the server; its log has the details"
        )
        self.assertIn("KeyError: 'secret'", logs.output[0])

    def test_a_one_millisecond_deadline(self):
        request = grpc_client().predict_request(self.images)
        for _ in range(3):
            with self.assertRaises(grpc.RpcError) as raised:
                self.predictions.Predict(request, timeout=0.001)
            self.assertEqual(raised.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        response = self.predictions.Predict(request, 60)
        self.assertLen(response.outputs["caption"].string_val, 4)


if __name__ == "__main__":
    tf.test.main()
