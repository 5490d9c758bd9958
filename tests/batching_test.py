"""Tests for sat_tf.serving.batching: TF Serving's parameter file, batches gathered from
concurrent callers, each caller's rows equal to its call alone (a fake function with
hand-known answers, and the tiny export's serving_default with bad images), the bounded
queue, and a failing request that harms no other."""

import concurrent.futures
import os
import shutil
import tempfile
import threading

import numpy as np
import tensorflow as tf
from fixtures import encode, scenes, tiny_model

from sat_tf.server import batching
from sat_tf.serving import exporting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Recorder:
    """fn(x) = {"y": 3 x + 1}, remembering each batch's size; fails on a negative x."""

    def __init__(self, gate=None):
        self.sizes, self.gate = [], gate

    def __call__(self, inputs):
        if self.gate is not None:
            self.gate.wait(10)
        self.sizes.append(len(inputs["x"]))
        if (inputs["x"] < 0).any():
            raise ValueError("negative x")
        return {"y": 3 * inputs["x"] + 1}


def run_together(batcher, requests):
    """Each request from its own thread, all started together; outputs or exceptions."""
    barrier = threading.Barrier(len(requests))

    def one(inputs):
        barrier.wait(10)
        try:
            return batcher(inputs)
        except Exception as e:  # noqa: BLE001
            return e

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


class ParametersTest(tf.test.TestCase):
    def test_text_format(self):
        got = batching.parse_parameters(
            "max_batch_size { value: 8 }\nbatch_timeout_micros { value: 2000 }\n"
            "allowed_batch_sizes: 4\nallowed_batch_sizes: 8\n"
        )
        self.assertEqual(got, batching.BatchingParameters(8, 2000, 100, 1, (4, 8)))

    def test_shipped_file(self):
        path = os.path.join(ROOT, "export", "serving", "batching_parameters.txt")
        self.assertEqual(batching.read_parameters(path), batching.SERVE_DEFAULTS)

    def test_bad_files_named(self):
        with self.assertRaisesRegex(ValueError, "f.txt: 1:1 : Message type"):
            batching.parse_parameters("max_batch { value: 8 }", "f.txt")
        with self.assertRaisesRegex(ValueError, "must increase and end at max_batch_size"):
            batching.parse_parameters("max_batch_size { value: 8 } allowed_batch_sizes: 4")
        with self.assertRaisesRegex(ValueError, "num_batch_threads is 0"):
            batching.parse_parameters("num_batch_threads { value: 0 }")
        with self.assertRaisesRegex(ValueError, "cannot read batching parameters"):
            batching.read_parameters("/nonexistent/b.txt")


class FakeBatcherTest(tf.test.TestCase):
    def test_concurrent_requests_share_calls(self):
        fn = Recorder()
        params = batching.BatchingParameters(max_batch_size=8, batch_timeout_micros=500_000)
        batcher = batching.Batcher(fn, params)
        self.addCleanup(batcher.close)
        requests = [{"x": np.arange(i, i + 1 + i % 2)} for i in range(8)]
        got = run_together(batcher, requests)
        for request, out in zip(requests, got, strict=True):
            self.assertAllEqual(out["y"], 3 * request["x"] + 1)
        self.assertEqual(sum(fn.sizes), 12)
        self.assertLessEqual(max(fn.sizes), 8)
        self.assertLess(len(fn.sizes), 8)

    def test_large_request_split_and_padded(self):
        fn = Recorder()
        params = batching.BatchingParameters(max_batch_size=4, allowed_batch_sizes=(2, 4))
        batcher = batching.Batcher(fn, params)
        self.addCleanup(batcher.close)
        x = np.arange(11)
        self.assertAllEqual(batcher({"x": x})["y"], 3 * x + 1)
        self.assertEqual(fn.sizes, [4, 4, 4])
        self.assertAllEqual(batcher({"x": x[:1]})["y"], [1])
        self.assertEqual(fn.sizes[-1], 2)

    def test_a_failing_request_harms_no_other(self):
        fn = Recorder()
        params = batching.BatchingParameters(max_batch_size=8, batch_timeout_micros=500_000)
        batcher = batching.Batcher(fn, params)
        self.addCleanup(batcher.close)
        got = run_together(batcher, [{"x": np.array([1])}, {"x": np.array([-1])}])
        self.assertAllEqual(got[0]["y"], [4])
        self.assertIsInstance(got[1], ValueError)

    def test_queue_full(self):
        gate = threading.Event()
        fn = Recorder(gate)
        params = batching.BatchingParameters(max_batch_size=2, max_enqueued_batches=2)
        batcher = batching.Batcher(fn, params)
        self.addCleanup(batcher.close)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            running = pool.submit(batcher, {"x": np.array([0, 1])})
            while not batcher._queued_images == 0 or not running.running():
                pass
            waiting = [pool.submit(batcher, {"x": np.array([i])}) for i in range(4)]
            while batcher._queued_images < 4:
                pass
            with self.assertRaisesRegex(batching.QueueFullError, "queue is full"):
                batcher({"x": np.array([9])})
            gate.set()
            self.assertAllEqual(running.result(10)["y"], [1, 4])
            self.assertEqual([f.result(10)["y"][0] for f in waiting], [1, 4, 7, 10])


class ExportBatcherTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, root, ignore_errors=True)
        model, vocab, config = tiny_model()
        exporting.export(model, vocab, config, os.path.join(root, "1"))
        cls.serve = tf.saved_model.load(os.path.join(root, "1")).signatures["serving_default"]

    def call(self, inputs):
        return {k: v.numpy() for k, v in self.serve(image_bytes=inputs["image_bytes"]).items()}

    def test_each_request_gets_what_it_gets_alone(self):
        good = [encode(x, "PNG") for x in scenes(0, 5)]
        truncated = good[0][: len(good[0]) // 2]
        requests = [[good[0]], [b"not an image", good[1]], [good[2], truncated], [b""], good[3:]]
        params = batching.BatchingParameters(max_batch_size=16, batch_timeout_micros=1_000_000)
        batcher = batching.Batcher(self.call, params, rebase=batching.rename_errors)
        self.addCleanup(batcher.close)
        got = run_together(batcher, [{"image_bytes": np.array(r, dtype=object)} for r in requests])
        self.assertLess(batcher.calls, len(requests))
        statuses = []
        for request, out in zip(requests, got, strict=True):
            alone = self.call({"image_bytes": tf.constant(request)})
            self.assertEqual(sorted(out), sorted(alone))
            for name, value in alone.items():
                if value.dtype.kind in "f":
                    # float32 matmuls of another batch size round differently
                    self.assertAllClose(out[name], value, atol=1e-5, msg=name)
                else:
                    self.assertAllEqual(out[name], value, msg=name)
            statuses += out["status"].tolist()
        self.assertEqual(statuses, [0, 2, 0, 0, 3, 1, 0, 0])
