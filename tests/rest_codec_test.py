"""Tests for sat_tf.server.rest_codec: row and columnar bodies give the same inputs, named
or bare, bytes as {"b64"} or text; bad bodies are INVALID_ARGUMENT naming what is wrong;
outputs read back from the JSON as the signature gave them (float32 exactly, strings as
text or {"b64"} when not UTF-8); an answer takes the form of its request."""

import base64
import json

import numpy as np
import tensorflow as tf

from sat_tf.server import rest_codec
from sat_tf.server.errors import ServingError

ONE = {"image_bytes": np.dtype(object)}
TWO = {"images": np.dtype(np.uint8), "scale": np.dtype(np.float32)}


def b64(data):
    return {"b64": base64.b64encode(data).decode()}


class ParseTest(tf.test.TestCase):
    def parse(self, body, dtypes=ONE):
        return rest_codec.parse_predict(body, lambda signature: dtypes)

    def test_row_and_columnar_forms_give_the_same_inputs(self):
        forms = [
            {"instances": [{"image_bytes": b64(b"\x89PNG")}, {"image_bytes": "text"}]},
            {"instances": [b64(b"\x89PNG"), "text"]},
            {"inputs": {"image_bytes": [b64(b"\x89PNG"), "text"]}},
            {"inputs": [b64(b"\x89PNG"), "text"]},
        ]
        for body in forms:
            got = self.parse(body)
            self.assertEqual(got.inputs["image_bytes"].tolist(), [b"\x89PNG", b"text"])
            self.assertEqual(got.inputs["image_bytes"].dtype, object)
            self.assertEqual(got.rows, "instances" in body)
            self.assertEqual(got.signature, "")

    def test_several_inputs_and_their_dtypes(self):
        got = self.parse(
            {
                "signature_name": "caption_images",
                "instances": [{"images": [[1, 2]], "scale": 0.5}, {"images": [[3, 4]], "scale": 2}],
            },
            TWO,
        )
        self.assertEqual(got.signature, "caption_images")
        self.assertAllEqual(got.inputs["images"], np.array([[[1, 2]], [[3, 4]]], np.uint8))
        self.assertEqual(got.inputs["images"].dtype, np.uint8)
        self.assertAllEqual(got.inputs["scale"], np.array([0.5, 2.0], np.float32))

    def test_bad_bodies(self):
        cases = [
            ([], '"instances" or "inputs"'),
            ({"instances": [], "inputs": {}}, '"instances" or "inputs"'),
            ({"instances": []}, "non-empty list"),
            ({"instances": {"image_bytes": "x"}}, "non-empty list"),
            ({"instances": [{"images": "x"}]}, "takes inputs ['image_bytes']"),
            ({"inputs": {"other": ["x"]}}, "takes inputs ['image_bytes']"),
            ({"instances": [{"b64": "%%"}]}, "input image_bytes: "),
            ({"instances": [3]}, "input image_bytes: expected a string or {'b64': ...}, got int"),
            ({"instances": ["x"], "signature_name": 3}, '"signature_name" must be a string'),
        ]
        for body, message in cases:
            with self.assertRaises(ServingError) as raised:
                self.parse(body)
            self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
            self.assertIn(message, raised.exception.message)
        with self.assertRaisesRegex(ServingError, "input images: "):
            self.parse({"instances": [{"images": "x", "scale": 1}]}, TWO)


class AnswerTest(tf.test.TestCase):
    outputs = {
        "caption": np.array([b"a dog", b"\xff\xfe"], dtype=object),
        "length": np.array([2, 0], np.int32),
    }

    def test_the_answer_takes_the_requests_form(self):
        rows = json.loads(rest_codec.dumps(rest_codec.predict_answer(self.outputs, True)))
        self.assertEqual(
            rows,
            {
                "predictions": [
                    {"caption": "a dog", "length": 2},
                    {"caption": {"b64": base64.b64encode(b"\xff\xfe").decode()}, "length": 0},
                ]
            },
        )
        columns = json.loads(rest_codec.dumps(rest_codec.predict_answer(self.outputs, False)))
        self.assertEqual(columns["outputs"]["length"], [2, 0])
        single = rest_codec.predict_answer({"length": self.outputs["length"]}, True)
        self.assertEqual(json.loads(rest_codec.dumps(single)), {"predictions": [2, 0]})
        single = rest_codec.predict_answer({"length": self.outputs["length"]}, False)
        self.assertEqual(json.loads(rest_codec.dumps(single)), {"outputs": [2, 0]})
        self.assertEqual(json.loads(rest_codec.error_body("no")), {"error": "no"})

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
        got = json.loads(rest_codec.dumps(rest_codec.predict_answer(outputs, True)))["predictions"]
        for i in range(2):
            self.assertAllEqual(np.float32(got[i]["attention"]), outputs["attention"][i])
            self.assertEqual(np.float32(got[i]["log_prob"]), outputs["log_prob"][i])
            self.assertEqual(got[i]["tokens"], outputs["tokens"][i].tolist())
            self.assertIs(got[i]["off_world"], bool(outputs["off_world"][i]))


if __name__ == "__main__":
    tf.test.main()
