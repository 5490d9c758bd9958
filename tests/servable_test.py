"""Tests for sat_tf.server.servable over the tiny export: its signatures answer as called
directly, batched or not; bad inputs are refused in the caller's thread (no batch ever
sees them); a corrupt saved_model.pb or warm-up file fails before any model is loaded,
with DATA_LOSS; the warm-up runs through the batch queues, and a warm-up request that
fails names the file and the request; errors of serving_default name each image by its
index in the request."""

import os
import shutil
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf
from fixtures import encode, scenes, tiny_export
from tensorflow_serving.apis import prediction_log_pb2

from sat_tf.server import batching, servable
from sat_tf.server.errors import ServingError
from sat_tf.serving import warmup


def copy_export(root, name="1"):
    path = os.path.join(root, name)
    shutil.copytree(tiny_export(), path)
    return path


class ServableTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.params = batching.BatchingParameters(
            max_batch_size=8, batch_timeout_micros=0, num_batch_threads=1
        )
        cls.servable = servable.Servable(tiny_export(), 1, cls.params, "sat")
        cls.addClassCleanup(cls.servable.close)
        cls.direct = tf.saved_model.load(tiny_export()).signatures
        cls.images = np.array([encode(x, "PNG") for x in scenes(0, 3)], dtype=object)

    def test_signatures_and_their_answers(self):
        self.assertEqual(
            sorted(self.servable.signature_defs),
            ["caption_features", "caption_images", "serving_default"],
        )
        self.assertEqual(sorted(self.servable.batchers), sorted(self.servable.signature_defs))
        got = self.servable.predict("", {"image_bytes": self.images})
        want = self.direct["serving_default"](image_bytes=tf.constant(self.images))
        self.assertAllEqual(got["caption"], want["caption"].numpy())
        self.assertAllEqual(got["tokens"], want["tokens"].numpy())
        self.assertEqual(self.servable.input_numpy_dtypes(""), {"image_bytes": np.dtype(object)})
        self.assertEqual(servable.examples({"image_bytes": self.images}), 3)

    def test_bad_inputs_are_refused_before_batching(self):
        calls = {k: b.calls for k, b in self.servable.batchers.items()}
        features = self.servable.signature_defs["caption_features"].inputs["features"]
        length, depth = (d.size for d in features.tensor_shape.dim[1:])
        cases = [
            ("nope", {"image_bytes": self.images}, 'Serving signature name: "nope" not found'),
            ("", {"images": self.images}, "takes inputs ['image_bytes'], got ['images']"),
            ("", {"image_bytes": np.array([1, 2])}, "input image_bytes of signature "),
            ("", {"image_bytes": self.images[None]}, "takes shape [-1], got [1, 3]"),
            (
                "caption_features",
                {"features": np.zeros((2, length, depth + 1), np.float32)},
                f"takes shape [-1, {length}, {depth}], got [2, {length}, {depth + 1}]",
            ),
            (
                "caption_features",
                {"features": np.zeros((2, length, depth))},
                "takes float32, got float64",
            ),
            ("", {"image_bytes": np.array(b"one", dtype=object)}, "takes shape [-1], got []"),
        ]
        for signature, inputs, message in cases:
            with self.assertRaises(ServingError) as raised:
                self.servable.predict(signature, inputs)
            self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
            self.assertIn(message, raised.exception.message)
        self.assertEqual({k: b.calls for k, b in self.servable.batchers.items()}, calls)

    def test_bytes_arrays_of_fixed_width_are_strings_too(self):
        got = self.servable.predict("", {"image_bytes": self.images.astype(bytes)})
        self.assertLen(got["caption"], 3)

    def test_unbatched(self):
        alone = servable.Servable(tiny_export(), 1, None)
        self.assertEqual(alone.batchers, {})
        got = alone.predict("serving_default", {"image_bytes": self.images[:1]})
        want = self.direct["serving_default"](image_bytes=tf.constant(self.images[:1]))
        self.assertAllEqual(got["caption"], want["caption"].numpy())

    def test_the_warm_up_runs_through_the_batch_queues(self):
        fresh = servable.Servable(tiny_export(), 1, self.params)
        self.addCleanup(fresh.close)
        self.assertLen(fresh.warmup_requests, len(warmup.BATCH_SIZES))
        self.assertEqual(fresh.warm_up(), 2)
        # 1 image, then 16 in batches of at most 8
        self.assertEqual(fresh.batchers["serving_default"].calls, 3)
        self.assertEqual(fresh.warm_up(iterations=2), 2)
        self.assertEqual(fresh.batchers["serving_default"].calls, 9)


class BrokenVersionTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(dir=self.get_temp_dir())
        self.path = copy_export(self.root)

    def load(self):
        with mock.patch.object(tf.saved_model, "load", wraps=tf.saved_model.load) as load:
            with self.assertRaises(ServingError) as raised:
                servable.Servable(self.path, 1, batching.SERVE_DEFAULTS)
        return raised.exception, load

    def test_a_corrupt_saved_model_is_data_loss_before_any_load(self):
        with open(os.path.join(self.path, "saved_model.pb"), "wb") as f:
            f.write(b"\x0a\xff\xff\xff\xff not a SavedModel")
        error, load = self.load()
        self.assertEqual(error.code, "DATA_LOSS")
        self.assertIn(f"{self.path}/saved_model.pb is not a SavedModel", error.message)
        load.assert_not_called()

    def test_a_corrupt_warm_up_file_is_data_loss_before_any_load(self):
        with open(os.path.join(self.path, warmup.WARMUP_FILE), "r+b") as f:
            f.seek(12)
            f.write(b"\x00" * 16)
        error, load = self.load()
        self.assertEqual(error.code, "DATA_LOSS")
        self.assertIn(os.path.join(self.path, warmup.WARMUP_FILE), error.message)
        load.assert_not_called()

    def test_a_failing_warm_up_request_names_the_file_and_the_request(self):
        log = prediction_log_pb2.PredictionLog()
        log.predict_log.request.model_spec.signature_name = "serving_default"
        log.predict_log.request.inputs["pixels"].CopyFrom(tf.make_tensor_proto([1.0]))
        path = os.path.join(self.path, warmup.WARMUP_FILE)
        with tf.io.TFRecordWriter(path) as writer:
            writer.write(log.SerializeToString())
        loaded = servable.Servable(self.path, 1, batching.SERVE_DEFAULTS)
        self.addCleanup(loaded.close)
        with self.assertRaises(ServingError) as raised:
            loaded.warm_up()
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertStartsWith(raised.exception.message, f"warm-up request 0 of {path}: ")

    def test_a_missing_variables_file_is_the_loads_error(self):
        shutil.rmtree(os.path.join(self.path, "variables"))
        error, load = self.load()
        load.assert_called_once()
        self.assertEqual(error.code, "NOT_FOUND")
        self.assertIn(os.path.join(self.path, "variables"), error.message)


class PerModelBatchingTest(tf.test.TestCase):
    """--enable_per_model_batching_parameters: the version folder's batching_params.pbtxt."""

    def test_the_folders_file_batches_it(self):
        root = self.get_temp_dir()
        path = copy_export(root, "own")
        common = batching.BatchingParameters(max_batch_size=8, num_batch_threads=3)
        unbatched = servable.Servable(path, 1, common, "sat", per_model=True)
        self.assertEqual(unbatched.batchers, {})
        unbatched.close()
        file = os.path.join(path, batching.VERSION_FILE)
        with open(file, "w") as f:
            f.write("max_batch_size { value: 2 } num_batch_threads { value: 9 }")
        own = servable.Servable(path, 1, common, "sat", per_model=True)
        try:
            parameters = {b.parameters for b in own.batchers.values()}
            self.assertEqual(
                [(p.max_batch_size, p.num_batch_threads) for p in parameters], [(2, 3)]
            )
        finally:
            own.close()
        with open(file, "w") as f:
            f.write("max_batch_size { value: 2 } nonsense: 1")
        with self.assertRaises(ServingError) as raised:
            servable.Servable(path, 1, common, "sat", per_model=True)
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertStartsWith(raised.exception.message, file)


class RenameErrorsTest(tf.test.TestCase):
    def test_indices_move_by_the_shift(self):
        rows = {
            "error": np.array(
                [b"", b"image_bytes[0] is empty (0 bytes)", b"image_bytes[12]: too big"],
                dtype=object,
            ),
            "status": np.array([0, 1, 4]),
        }
        got = servable.rename_errors(rows, 5)
        self.assertEqual(
            got["error"].tolist(),
            [b"", b"image_bytes[5] is empty (0 bytes)", b"image_bytes[17]: too big"],
        )
        self.assertIs(servable.rename_errors(rows, 0), rows)
        self.assertIs(
            servable.rename_errors({"caption": rows["status"]}, 3)["caption"], rows["status"]
        )


if __name__ == "__main__":
    tf.test.main()
