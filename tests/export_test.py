"""Round trips of the export: a fresh TensorFlow-only process, TF Serving's load-and-predict
path (emulated with the session loader), the TFLite interpreter, and the export CLI."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from fixtures import MAX_LENGTH, encode, scenes, tiny_model

from sat_tf.data import image_io
from sat_tf.serving import exporting, inference
from sat_tf.utils import files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "export", "serving"))

import rest_client  # noqa: E402  (urllib and absl only)

GRID = (14, 14)

FOREIGN = ("sat_tf", "keras", "tensorflow_text", "tf_keras")

# Runs with `python -S` in a fresh interpreter: imports TensorFlow, loads both exports with
# `tf.saved_model.load` and calls every signature, recording which modules of FOREIGN
# could be imported at the start and which were loaded after `import tensorflow` and at
# the end.
LOAD_SCRIPT = """
import importlib.util
import json
import sys

FOREIGN = tuple(json.loads(sys.argv[1]))


def loaded():
    return sorted(m for m in sys.modules if m.startswith(FOREIGN))


findable = [name for name in FOREIGN if importlib.util.find_spec(name) is not None]
import tensorflow as tf

after_import = loaded()
import numpy as np

exports, pngs = json.loads(sys.argv[2]), json.loads(sys.argv[3])
arrays, out = np.load(sys.argv[4]), sys.argv[5]
image_bytes = []
for path in pngs:
    with open(path, "rb") as f:
        image_bytes.append(f.read())
calls = {
    "serving_default": {"image_bytes": tf.constant(image_bytes)},
    "caption_images": {"images": tf.constant(arrays["images"])},
    "caption_features": {"features": tf.constant(arrays["features"])},
    "caption_alternatives": {"image_bytes": tf.constant(image_bytes)},
}
results = {}
for name, path in exports.items():
    signatures = tf.saved_model.load(path).signatures
    for signature, inputs in calls.items():
        if signature not in signatures:
            continue
        for key, value in signatures[signature](**inputs).items():
            value = value.numpy()
            if value.dtype == object:
                value = np.char.decode(value.astype(bytes), "utf-8")
            results[f"{name}/{signature}/{key}"] = value
results["modules/findable"] = np.array(findable, dtype=str)
results["modules/after_import"] = np.array(after_import, dtype=str)
results["modules/after_calls"] = np.array(loaded(), dtype=str)
np.savez(out, **results)
"""


# The `export` extra (pip install -e ".[export]") brings LiteRT and TF Serving's API: a
# test that runs one of them is skipped without it; the others run.
def litert_interpreter():
    """LiteRT's `Interpreter` class (skips the test without `ai_edge_litert`)."""
    return pytest.importorskip("ai_edge_litert.interpreter").Interpreter


def serving_api():
    """(`predict_pb2`, export/serving/grpc_client.py), which needs it (skips the test
    without `tensorflow_serving`)."""
    predict_pb2 = pytest.importorskip("tensorflow_serving.apis.predict_pb2")
    import grpc_client

    return predict_pb2, grpc_client


def installed_packages():
    """This interpreter's site-packages directories. On PYTHONPATH under `python -S` their
    `.pth` files are not read, so the editable install of this repo is not on the path."""
    return sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})


def packages_without(root, names):
    """A site-packages of symlinks to the installed packages except `names` (and their
    dist-info): TensorFlow installed without them. Returns it as a PYTHONPATH list."""
    view = os.path.join(root, "site-packages")
    os.makedirs(view)
    left_out = re.compile(rf"({'|'.join(names)})([-_.]|$)")
    for directory in installed_packages():
        for entry in os.listdir(directory):
            target = os.path.join(view, entry)
            if not left_out.match(entry.lower().replace("-", "_")) and not os.path.lexists(target):
                os.symlink(os.path.join(directory, entry), target)
    return [view]


def session_predict(session, meta_graph, request):
    """What the model server does with a `PredictRequest`: feed, run, `PredictResponse`."""
    predict_pb2, _ = serving_api()
    signature = meta_graph.signature_def[request.model_spec.signature_name or "serving_default"]
    feed = {signature.inputs[k].name: tf.make_ndarray(v) for k, v in request.inputs.items()}
    names = sorted(signature.outputs)
    values = session.run([signature.outputs[k].name for k in names], feed)
    response = predict_pb2.PredictResponse()
    response.model_spec.CopyFrom(request.model_spec)
    for name, value in zip(names, values, strict=True):
        response.outputs[name].CopyFrom(tf.make_tensor_proto(value))
    return predict_pb2.PredictResponse.FromString(response.SerializeToString())


def session_rest_predict(session, meta_graph, body):
    """What the model server does with a REST body in row format: JSON predictions."""
    signature = meta_graph.signature_def[body.get("signature_name", "serving_default")]
    columns = {name: [] for name in signature.inputs}
    for instance in body["instances"]:
        for name, value in instance.items():
            columns[name].append(base64.b64decode(value["b64"]) if "b64" in value else value)
    feed = {signature.inputs[k].name: np.array(v, dtype=object) for k, v in columns.items()}
    names = sorted(signature.outputs)
    values = session.run([signature.outputs[k].name for k in names], feed)
    rows = [
        {
            name: (
                np.char.decode(v[i : i + 1].astype(bytes))[0] if v.dtype == object else v[i]
            ).tolist()
            for name, v in zip(names, values, strict=True)
        }
        for i in range(len(body["instances"]))
    ]
    return json.loads(json.dumps({"predictions": rows}))


@pytest.mark.long(6)
class ExportTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.model, cls.vocab, cls.config = tiny_model()
        cls.workdir = os.path.join(cls.root, "workdir")
        os.makedirs(cls.workdir)
        cls.config.save(os.path.join(cls.workdir, inference.CONFIG_FILE))
        cls.vocab.save(os.path.join(cls.workdir, inference.VOCAB_FILE))
        cls.model.save_weights(os.path.join(cls.workdir, inference.BEST_WEIGHTS))
        cls.exports = os.path.join(cls.root, "exports", "sat")
        cls.greedy_dir = os.path.join(cls.exports, "1")
        cls.beam_dir = os.path.join(cls.exports, "2")
        model, vocab, config = inference.load_workdir(cls.workdir)
        cls.info = exporting.export(
            model, vocab, config, cls.greedy_dir, tflite=True, quantize="dynamic"
        )
        exporting.export(cls.model, cls.vocab, cls.config, cls.beam_dir, beam_size=2)

        cls.images = scenes(0, 4)
        cls.png = [encode(x, "PNG") for x in cls.images]
        cls.other_size = scenes(5, 4, 140, 120)
        pixels = cls.images.astype(np.float32)
        resized = image_io.resize_and_crop(cls.other_size, 112, 1.0)
        cls.features = cls.model.encoder(pixels).numpy()
        cls.want, cls.want_resized = {}, {}
        for beam in (1, 2):
            cls.want[beam] = cls.generate({"image": pixels}, beam)
            cls.want_resized[beam] = cls.generate({"image": resized}, beam)

    @classmethod
    def generate(cls, batch, beam_size):
        """`ShowAttendTell.generate` with NumPy fields (usable inside a v1 graph too)."""
        result = cls.model.generate(
            batch,
            max_length=MAX_LENGTH,
            beam_size=beam_size,
            block_repeats=cls.config.block_repeats,
        )
        return type(result)(*(x.numpy() for x in result))

    def captions(self, result):
        pairs = zip(result.tokens, result.length, strict=True)
        return [" ".join(self.vocab.decode(t[:n])) for t, n in pairs]

    def assertMatches(self, got, want, captions=True):
        self.assertAllEqual(got["tokens"], want.tokens)
        self.assertAllEqual(got["length"], want.length)
        self.assertAllClose(got["log_prob"], want.log_prob, atol=1e-4)
        attention = np.reshape(want.attention, [-1, MAX_LENGTH, *GRID])  # (N, T, H, W)
        self.assertAllClose(got["attention"], attention, atol=1e-5)
        if captions:
            got_captions = [c.decode() if isinstance(c, bytes) else c for c in got["caption"]]
            self.assertEqual(got_captions, self.captions(want))

    def run_fresh_process(self, python_path):
        """Runs LOAD_SCRIPT under `python -S` in an empty directory with only `python_path`
        on PYTHONPATH (so neither the cwd nor the repo is on the path); returns its results."""
        pngs = []
        for i, data in enumerate(self.png):
            pngs.append(os.path.join(self.root, f"image{i}.png"))
            with open(pngs[-1], "wb") as f:
                f.write(data)
        arrays = os.path.join(self.root, "inputs.npz")
        np.savez(arrays, images=self.other_size, features=self.features)
        cwd = tempfile.mkdtemp(dir=self.root)
        script, out = os.path.join(cwd, "load.py"), os.path.join(cwd, "outputs.npz")
        with open(script, "w") as f:
            f.write(LOAD_SCRIPT)
        exports = json.dumps({"greedy": self.greedy_dir, "beam": self.beam_dir})
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(
            PYTHONPATH=os.pathsep.join(python_path),
            TF_CPP_MIN_LOG_LEVEL="2",
            CUDA_VISIBLE_DEVICES="",
        )
        subprocess.run(
            [
                sys.executable,
                "-S",
                script,
                json.dumps(FOREIGN),
                exports,
                json.dumps(pngs),
                arrays,
                out,
            ],
            check=True,
            cwd=cwd,
            env=env,
        )
        return np.load(out)

    def assertFreshResults(self, results):
        for name, beam in (("greedy", 1), ("beam", 2)):
            for signature in [*exporting.SIGNATURES, *[exporting.ALTERNATIVES][: beam - 1]]:
                got = {
                    k.rsplit("/", 1)[1]: results[k]
                    for k in results.files
                    if k.startswith(f"{name}/{signature}/")
                }
                outputs = [
                    "caption",
                    "tokens",
                    "length",
                    "log_prob",
                    "attention",
                    "tag",
                    "tag_prob",
                ]
                outputs += ["captions", "log_probs"]
                if signature in ("serving_default", "caption_alternatives"):
                    outputs += ["status", "error"]
                    self.assertAllEqual(got["status"], np.zeros_like(got["status"]))
                    self.assertAllEqual(got["error"], [""] * len(got["error"]))
                if signature == "caption_alternatives":
                    outputs.append("attentions")
                    self.assertEqual(got["attentions"].shape, (4, beam, MAX_LENGTH, *GRID))
                    self.assertAllClose(got["attentions"][:, 0], got["attention"])
                self.assertCountEqual(got, outputs)
                want = self.want_resized if signature == "caption_images" else self.want
                self.assertMatches(got, want[beam])
                # The beam's `beam` best, the first the caption (their values: exporting_test).
                self.assertEqual(got["captions"].shape, (4, beam))
                self.assertAllEqual(got["captions"][:, 0], got["caption"])
                self.assertAllEqual(got["log_probs"][:, 0], got["log_prob"])
        # The greedy export's caption is its only one: no signature of alternatives.
        self.assertFalse([k for k in results.files if k.startswith("greedy/caption_alternatives")])

    def test_fresh_process_without_sat_tf_matches_generate(self):
        # TensorFlow without Keras, tensorflow-text or sat_tf installed: none of them is
        # importable, and none is loaded after loading and calling the exports.
        alone = self.run_fresh_process(packages_without(self.root, FOREIGN))
        self.assertEqual(alone["modules/findable"].tolist(), [])
        self.assertEqual(alone["modules/after_calls"].tolist(), [])
        self.assertFreshResults(alone)
        self.assertNotAllEqual(self.want[1].tokens, self.want[2].tokens)
        self.assertGreater(len(set(self.captions(self.want[1]))), 1)

    @pytest.mark.slow
    def test_fresh_process_with_the_installed_packages_imports_nothing_more(self):
        # Slow: a second fresh process, whose exports already load without these packages.
        # TensorFlow as pip installs it, with Keras (a dependency) and tensorflow-text.
        # `import tensorflow` itself imports Keras (TF 2.21's tensorflow/__init__.py runs
        # `importlib.import_module("keras.src.optimizers")`); loading and calling the
        # exports must import nothing more, and sat_tf must not even be importable.
        installed = self.run_fresh_process(installed_packages())
        self.assertNotIn("sat_tf", installed["modules/findable"].tolist())
        after_import = installed["modules/after_import"].tolist()
        self.assertEqual(installed["modules/after_calls"].tolist(), after_import)
        self.assertEqual([m for m in after_import if not m.startswith("keras")], [])
        self.assertFreshResults(installed)

    def test_model_server_load_and_predict_path(self):
        predict_pb2, grpc_client = serving_api()
        with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
            meta_graph = tf.compat.v1.saved_model.loader.load(
                session, [tf.saved_model.SERVING], self.greedy_dir
            )
            for name in exporting.SIGNATURES:
                method = meta_graph.signature_def[name].method_name
                self.assertEqual(method, "tensorflow/serving/predict")

            request = grpc_client.predict_request(self.png, model_name="sat")
            request = predict_pb2.PredictRequest.FromString(request.SerializeToString())
            results = grpc_client.parse_response(session_predict(session, meta_graph, request))
            want = self.want[1]
            for i, result in enumerate(results):
                n = int(want.length[i])
                self.assertEqual(result["tokens"], want.tokens[i][: n + 1].tolist())
                self.assertEqual(result["caption"], self.captions(want)[i])
                self.assertAllClose(result["log_prob"], want.log_prob[i], atol=1e-4)

            body = json.loads(json.dumps(rest_client.request_body(self.png)))
            self.assertEqual(body["signature_name"], "serving_default")
            predictions = session_rest_predict(session, meta_graph, body)["predictions"]
            columns = {k: np.array([p[k] for p in predictions]) for k in predictions[0]}
            self.assertMatches(columns, want)
            self.assertEqual(
                [p["captions"] for p in predictions], [[c] for c in self.captions(want)]
            )
            self.assertAllClose(columns["log_probs"][:, 0], want.log_prob, atol=1e-4)

            bad = grpc_client.predict_request([self.png[0], b"GIF87"], model_name="sat")
            results = grpc_client.parse_response(session_predict(session, meta_graph, bad))
            self.assertEqual([r["status"] for r in results], [0, 2])
            self.assertStartsWith(results[1]["error"], "image_bytes[1] (5 bytes) is not a JPEG")
            cut = grpc_client.predict_request([self.png[0], self.png[1][:100]], model_name="sat")
            results = grpc_client.parse_response(session_predict(session, meta_graph, cut))
            self.assertEqual([r["status"] for r in results], [0, 3])
            self.assertRegex(results[1]["error"], r"image_bytes\[1\].*PNG")
            self.assertEqual(results[0]["caption"], self.captions(want)[0])
            again = grpc_client.parse_response(session_predict(session, meta_graph, request))
            self.assertEqual([r["caption"] for r in again], self.captions(want))

    def test_bad_requests(self):
        serve = tf.saved_model.load(self.greedy_dir).signatures["serving_default"]
        good = self.png[0]
        jpeg = encode(self.images[1], "JPEG")
        corrupt = good[:60] + bytes(len(good) - 60)
        cases = [
            ([good, b"\x00garbage\x00"], 2, r"image_bytes\[1\] \(9 bytes\) is not a JPEG, PNG"),
            ([b""], 1, r"image_bytes\[0\] is empty"),
            ([good, good, b"not an image"], 2, r"image_bytes\[2\] \(12 bytes\)"),
            (
                [good, good[:100]],
                3,
                r"image_bytes\[1\] \(100 bytes\) is a truncated or corrupt PNG",
            ),
            (
                [good, good, jpeg[:-100]],
                3,
                rf"image_bytes\[2\] \({len(jpeg) - 100} bytes\) .* JPEG file",
            ),
            ([good, corrupt], 3, rf"image_bytes\[1\] \({len(good)} bytes\) .* PNG file"),
        ]
        want = serve(image_bytes=tf.constant([good]))["caption"].numpy()[0]
        for request, status, message in cases:
            out = serve(image_bytes=tf.constant(request, tf.string))
            self.assertEqual(int(out["status"][-1]), status)
            self.assertRegex(out["error"].numpy()[-1].decode(), message)
            self.assertEqual(out["caption"].numpy()[-1], b"")
            self.assertAllEqual(out["caption"].numpy()[:-1], [want] * (len(request) - 1))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r"image_bytes holds no images"):
            serve(image_bytes=tf.constant([], tf.string))

        rgba = np.concatenate([self.images[:2], np.full((2, 112, 112, 1), 99, np.uint8)], -1)
        gray_jpeg = encode(self.images[2], "JPEG", mode="L")
        got = serve(image_bytes=tf.constant([encode(x, "PNG") for x in rgba] + [gray_jpeg]))
        gray = image_io.decode_image(gray_jpeg, 112, 1.0)
        self.assertAllEqual(got["tokens"][:2], self.want[1].tokens[:2])
        self.assertAllEqual(got["tokens"][2:], self.generate({"image": gray[None]}, 1).tokens)

    def test_tflite_matches_saved_model(self):
        Interpreter = litert_interpreter()
        path = os.path.join(self.greedy_dir, exporting.TFLITE_FILE)
        self.assertEqual(os.path.getsize(path), self.info["tflite"]["bytes"])
        runner = Interpreter(model_path=path).get_signature_runner()
        caption_images = tf.saved_model.load(self.greedy_dir).signatures["caption_images"]
        words = np.array(self.vocab.words, dtype=object)
        for batch in (self.images, self.other_size):
            saved = {k: v.numpy() for k, v in caption_images(images=tf.constant(batch)).items()}
            self.assertGreater(len(set(saved["caption"])), 1)
            # The app's resize, as caption_images resizes inside the graph.
            pixels = image_io.resize_and_crop(batch, 112, 1.0).numpy()
            for i in range(len(batch)):
                out = runner(image=pixels[i : i + 1])
                self.assertAllEqual(out["tokens"], saved["tokens"][i : i + 1])
                self.assertAllEqual(out["length"], saved["length"][i : i + 1])
                self.assertAllClose(out["log_prob"], saved["log_prob"][i : i + 1], atol=1e-4)
                self.assertAllClose(out["attention"], saved["attention"][i : i + 1], atol=1e-5)
                want_words = [w.encode() for w in words[saved["tokens"][i]]]
                self.assertEqual(out["words"].tolist(), [want_words])
                caption = b" ".join(out["words"][0][: out["length"][0]])
                self.assertEqual(caption, saved["caption"][i])
        self.assertAllEqual(saved["tokens"], self.want_resized[1].tokens)

    def test_int8_tflite(self):
        Interpreter = litert_interpreter()
        paths = {
            name: os.path.join(self.greedy_dir, name)
            for name in (exporting.TFLITE_FILE, exporting.TFLITE_INT8_FILE)
        }
        info = self.info["tflite_int8"]
        self.assertEqual(os.path.getsize(paths[info["file"]]), info["bytes"])
        self.assertEqual(
            (info["quantization"], info["weights"], info["activations"]),
            ("dynamic", "int8", "float32"),
        )
        self.assertLess(info["bytes"], self.info["tflite"]["bytes"])
        interpreters = {name: Interpreter(model_path=path) for name, path in paths.items()}
        for name, interpreter in interpreters.items():
            ops = {op["op_name"] for op in interpreter._get_ops_details()}
            self.assertEqual([op for op in ops if "flex" in op.lower()], [], name)
            int8 = [t for t in interpreter.get_tensor_details() if t["dtype"] == np.int8]
            # The encoder's convolution kernels have >= 1024 weights: the converter
            # quantizes those (smaller tensors stay float).
            self.assertEqual(bool(int8), name == exporting.TFLITE_INT8_FILE, name)
        runners = {name: i.get_signature_runner() for name, i in interpreters.items()}
        pixels = image_io.resize_and_crop(scenes(0, 16), 112, 1.0).numpy()
        float_input = interpreters[exporting.TFLITE_FILE].get_input_details()[0]
        int8_input = interpreters[exporting.TFLITE_INT8_FILE].get_input_details()[0]
        self.assertEqual(float_input["dtype"], int8_input["dtype"])
        self.assertAllEqual(float_input["shape"], int8_input["shape"])
        same = 0
        for i in range(len(pixels)):
            outs = {name: run(image=pixels[i : i + 1]) for name, run in runners.items()}
            out = outs[exporting.TFLITE_INT8_FILE]
            self.assertTrue(np.all((out["tokens"] >= 0) & (out["tokens"] < len(self.vocab))))
            self.assertBetween(int(out["length"][0]), 0, MAX_LENGTH)
            want_words = [self.vocab.words[t].encode() for t in out["tokens"][0]]
            self.assertEqual(out["words"][0].tolist(), want_words)
            self.assertAllClose(np.sum(out["attention"][0], axis=(1, 2))[0], 1.0, atol=1e-4)
            float_out = outs[exporting.TFLITE_FILE]
            if np.array_equal(out["tokens"], float_out["tokens"]):
                same += 1
                # Weights rounded to 1/254 of their channel's largest move each word's
                # log-probability by hundredths of a nat, and the attention as little.
                words = int(out["length"][0]) + 1  # `<end>` too
                self.assertAllClose(out["log_prob"], float_out["log_prob"], atol=0.05 * words)
                self.assertAllClose(out["attention"], float_out["attention"], atol=0.1)
        # This untrained model's words are nearly tied at many steps, so the rounding
        # changes some captions; a wrong scale or a quantized activation changes most.
        self.assertGreaterEqual(same, 12, f"{same} of {len(pixels)} captions as the float model's")

    def test_float_depthwise_filters(self):
        Interpreter = litert_interpreter()
        # A depthwise and a 1x1 convolution, each with >= 1024 weights, so that
        # dynamic-range quantization makes both filters int8.
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6, 6, 128), batch_size=1)
        hidden = keras.layers.DepthwiseConv2D(3, padding="same")(inputs)
        net = keras.Model(inputs, keras.layers.Conv2D(16, 1)(hidden))
        converter = tf.lite.TFLiteConverter.from_keras_model(net)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        hybrid = converter.convert()
        fixed = exporting.float_depthwise_filters(hybrid)
        x = np.random.default_rng(1).normal(size=(1, 6, 6, 128)).astype(np.float32)
        outputs, kinds = [], []
        for flatbuffer in (hybrid, fixed):
            interpreter = Interpreter(model_content=flatbuffer)
            kinds.append(
                sorted(
                    (t["shape"].tolist(), t["dtype"].__name__)
                    for t in interpreter.get_tensor_details()
                    if t["shape"].tolist() in ([1, 3, 3, 128], [16, 1, 1, 128])
                )
            )
            interpreter.allocate_tensors()
            interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
            interpreter.invoke()
            outputs.append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))
        self.assertEqual(kinds[0], [([1, 3, 3, 128], "int8"), ([16, 1, 1, 128], "int8")])
        self.assertEqual(kinds[1], [([1, 3, 3, 128], "float32"), ([16, 1, 1, 128], "int8")])
        hybrid_out, fixed_out = outputs
        exact = net(x).numpy()
        # The hybrid kernel also rounds its input to int8; the float filters hold the
        # same int8 values times their scales, so only the weights' rounding is left.
        fixed_error = np.abs(fixed_out - exact).max()
        self.assertLess(fixed_error, 0.02 * np.abs(exact).max())
        self.assertLess(fixed_error, np.abs(hybrid_out - exact).max())

    def test_quantize_settings(self):
        with self.assertRaisesRegex(ValueError, r"--quantize=dynamic quantizes the TFLite"):
            exporting.export(self.model, self.vocab, self.config, "unused", quantize="dynamic")
        with self.assertRaisesRegex(ValueError, r"--quantize='int4' is not one of 'dynamic'"):
            exporting.export(
                self.model, self.vocab, self.config, "unused", tflite=True, quantize="int4"
            )
        self.assertFalse(os.path.exists("unused"))

    def test_export_directory(self):
        with open(os.path.join(self.greedy_dir, exporting.EXPORT_INFO)) as f:
            info = json.load(f)
        self.assertEqual(info, json.loads(json.dumps(self.info)))
        self.assertEqual(info["vocab_size"], len(self.vocab))
        self.assertEqual(info["vocab_fingerprint"], self.vocab.fingerprint)
        self.assertEqual((info["grid"], info["beam_size"], info["max_length"]), ([14, 14], 1, 8))
        self.assertEqual(info["config"]["hidden_dim"], 16)
        self.assertEqual(info["tflite_int8"]["file"], exporting.TFLITE_INT8_FILE)
        with open(os.path.join(self.beam_dir, exporting.EXPORT_INFO)) as f:
            beam_info = json.load(f)
        self.assertEqual(beam_info["beam_size"], 2)
        self.assertEqual((beam_info["tflite"], beam_info["tflite_int8"]), (None, None))
        saved = os.path.join(self.greedy_dir, exporting.VOCAB_FILE)
        self.assertEqual(self.vocab.load(saved).words, self.vocab.words)
        self.assertEqual(sorted(os.listdir(self.exports)), ["1", "2"])
        with self.assertRaisesRegex(ValueError, "exists; pass --overwrite"):
            exporting.export(self.model, self.vocab, self.config, self.greedy_dir)

    def test_failed_export_leaves_nothing_behind(self):
        class Broken:
            def write_out(self, path, **kwargs):
                with open(os.path.join(path, "saved_model.pb"), "w") as f:
                    f.write("partial")
                raise RuntimeError("disk full")

        before = sorted(os.listdir(self.beam_dir))
        original = exporting.export_archive
        exporting.export_archive = lambda *args: Broken()
        try:
            with self.assertRaisesRegex(RuntimeError, "disk full"):
                exporting.export(self.model, self.vocab, self.config, self.beam_dir, overwrite=True)
        finally:
            exporting.export_archive = original
        self.assertEqual(sorted(os.listdir(self.exports)), ["1", "2"])
        self.assertEqual(sorted(os.listdir(self.beam_dir)), before)

    def test_replace_dir(self):
        parent = tempfile.mkdtemp(dir=self.root)
        old, new = os.path.join(parent, "1"), os.path.join(parent, ".1.tmp")
        for folder, text in ((old, "old"), (new, "new")):
            os.makedirs(folder)
            with open(os.path.join(folder, "saved_model.pb"), "w") as f:
                f.write(text)
        files.replace_dir(new, old)
        self.assertEqual(os.listdir(parent), ["1"])
        with open(os.path.join(old, "saved_model.pb")) as f:
            self.assertEqual(f.read(), "new")

    @pytest.mark.slow
    def test_cli(self):
        script = os.path.join(REPO, "export", "export.py")
        output = os.path.join(self.root, "cli", "1")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}

        def run(*flags):
            return subprocess.run(
                [sys.executable, script, *flags], capture_output=True, text=True, env=env
            )

        done = run(f"--workdir={self.workdir}", f"--output={output}", "--beam_size=2")
        self.assertEqual(done.returncode, 0, done.stderr)
        printed = json.loads(done.stdout[done.stdout.index("{") :])
        self.assertEqual((printed["output"], printed["beam_size"]), (output, 2))
        self.assertTrue(os.path.exists(os.path.join(output, "saved_model.pb")))
        for flags, message in (
            ([f"--workdir={self.workdir}", f"--output={output}"], "exists; pass --overwrite"),
            ([f"--workdir={self.workdir}", "--output=x", "--beam_size=-1"], "--beam_size=-1"),
            ([f"--workdir={self.root}", "--output=x"], "config.json is missing"),
        ):
            failed = run(*flags)
            self.assertEqual(failed.returncode, 1)
            self.assertIn("error: ", failed.stderr)
            self.assertIn(message, failed.stderr)


if __name__ == "__main__":
    tf.test.main()
