"""Tests for sat_tf.server.batching: TF Serving's parameter file with all its fields and
defaults; batches gathered from concurrent callers, each caller's rows equal to its call
alone (a fake function with hand-known answers, and the tiny export's serving_default
with bad images); large requests cut into batches that fit (and with TF Serving's
large-batch splitting, cut where the open batch ends); a full queue refused at once and a
request larger than the queue still run; deadlines while queued and while running; a
failing batch that fails only its own requests, batch threads that never die, and
requests of different shapes kept apart."""

import concurrent.futures
import os
import threading
import time

import numpy as np
import tensorflow as tf
from fixtures import encode, scenes, tiny_export, wait_until

from sat_tf.server import batching, errors, servable
from sat_tf.serving import warmup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Recorder:
    """fn(x) = {"y": 3 x + 1}, remembering each batch's x; waits for `gate` (when given)
    before answering; fails on a negative x."""

    def __init__(self, gate=None):
        self.batches, self.gate, self.running = [], gate, threading.Event()

    @property
    def sizes(self):
        return [len(x) for x in self.batches]

    def __call__(self, inputs):
        self.running.set()
        if self.gate is not None:
            self.gate.wait(30)
        self.batches.append(inputs["x"])
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


def parameters(**values):
    values.setdefault("num_batch_threads", 1)
    return batching.BatchingParameters(**values)


class ParametersTest(tf.test.TestCase):
    def test_every_field_of_tf_servings_file(self):
        got = batching.parse_parameters(
            "max_batch_size { value: 64 }\nbatch_timeout_micros { value: 2000 }\n"
            "max_enqueued_batches { value: 7 }\nnum_batch_threads { value: 3 }\n"
            'thread_pool_name { value: "pool" }\nenable_large_batch_splitting { value: true }\n'
            "max_execution_batch_size { value: 8 }\nallowed_batch_sizes: 4\n"
            "allowed_batch_sizes: 8\npad_variable_length_inputs: true\n"
        )
        want = batching.BatchingParameters(64, 2000, 7, 3, (4, 8), "pool", True, 8, True)
        self.assertEqual(got, want)
        self.assertEqual(got.execution_batch_size, 8)

    def test_tf_servings_defaults(self):
        got = batching.parse_parameters("")
        self.assertEqual(
            (got.max_batch_size, got.batch_timeout_micros, got.max_enqueued_batches),
            (1000, 0, 10),
        )
        self.assertEqual(got.num_batch_threads, os.cpu_count())
        self.assertFalse(got.enable_large_batch_splitting)
        self.assertEqual(got.execution_batch_size, 1000)

    def test_shipped_file(self):
        path = os.path.join(ROOT, "export", "serving", "batching_parameters.txt")
        self.assertEqual(batching.read_parameters(path), batching.SERVE_DEFAULTS)
        # The export's warm-up holds one full batch of sat-serve's.
        self.assertEqual(warmup.BATCH_SIZES[-1], batching.SERVE_DEFAULTS.execution_batch_size)

    def test_bad_files_named(self):
        with self.assertRaisesRegex(ValueError, "f.txt: 1:1 : Message type"):
            batching.parse_parameters("max_batch { value: 8 }", "f.txt")
        with self.assertRaisesRegex(ValueError, "must increase and end at max_batch_size"):
            batching.parse_parameters("max_batch_size { value: 8 } allowed_batch_sizes: 4")
        with self.assertRaisesRegex(ValueError, "end at max_execution_batch_size .4."):
            batching.parse_parameters(
                "max_batch_size { value: 8 } enable_large_batch_splitting { value: true } "
                "max_execution_batch_size { value: 4 } allowed_batch_sizes: 2 "
                "allowed_batch_sizes: 8"
            )
        with self.assertRaisesRegex(ValueError, "max_execution_batch_size 9 is over max_batch"):
            batching.parse_parameters(
                "max_batch_size { value: 8 } enable_large_batch_splitting { value: true } "
                "max_execution_batch_size { value: 9 }"
            )
        with self.assertRaisesRegex(ValueError, "num_batch_threads is 0"):
            batching.parse_parameters("num_batch_threads { value: 0 }")
        with self.assertRaisesRegex(ValueError, "cannot read batching parameters '/no/b.txt'"):
            batching.read_parameters("/no/b.txt")


class FakeBatcherTest(tf.test.TestCase):
    def batcher(self, fn, **values):
        batcher = batching.Batcher(fn, parameters(**values))
        self.addCleanup(batcher.close)
        return batcher

    def test_concurrent_requests_share_calls(self):
        fn = Recorder()
        batcher = self.batcher(fn, max_batch_size=8, batch_timeout_micros=500_000)
        requests = [{"x": np.arange(i, i + 1 + i % 2)} for i in range(8)]
        got = run_together(batcher, requests)
        for request, out in zip(requests, got, strict=True):
            self.assertAllEqual(out["y"], 3 * request["x"] + 1)
        self.assertEqual(sum(fn.sizes), 12)
        self.assertLessEqual(max(fn.sizes), 8)
        self.assertLess(len(fn.sizes), 8)

    def test_a_large_request_is_cut_and_padded(self):
        fn = Recorder()
        batcher = self.batcher(fn, max_batch_size=4, allowed_batch_sizes=(2, 4))
        x = np.arange(11)
        self.assertAllEqual(batcher({"x": x})["y"], 3 * x + 1)
        self.assertEqual(fn.sizes, [4, 4, 4])  # 4, 4, 3 padded to 4
        self.assertAllEqual(fn.batches[2], [8, 9, 10, 8])
        self.assertAllEqual(batcher({"x": x[:1]})["y"], [1])
        self.assertEqual(fn.sizes[-1], 2)

    def test_a_request_larger_than_the_queue_runs(self):
        fn = Recorder()
        batcher = self.batcher(fn, max_batch_size=2, max_enqueued_batches=2)
        x = np.arange(9)  # 5 batches, the queue holds 2
        self.assertAllEqual(batcher({"x": x})["y"], 3 * x + 1)
        self.assertEqual(fn.sizes, [2, 2, 2, 2, 1])

    def test_large_batch_splitting_fills_the_open_batch(self):
        gate = threading.Event()
        fn = Recorder(gate)
        batcher = self.batcher(
            fn, max_batch_size=8, enable_large_batch_splitting=True, max_execution_batch_size=4
        )
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            first = pool.submit(batcher, {"x": np.array([100])})
            fn.running.wait(10)
            second = pool.submit(batcher, {"x": np.arange(3)})
            wait_until(lambda: batcher._queued == 3, what="3 images queued")
            third = pool.submit(batcher, {"x": np.arange(10, 16)})
            wait_until(lambda: batcher._queued == 9, what="9 images queued")
            gate.set()
            self.assertAllEqual(first.result(10)["y"], [301])
            self.assertAllEqual(second.result(10)["y"], [1, 4, 7])
            self.assertAllEqual(third.result(10)["y"], 3 * np.arange(10, 16) + 1)
        self.assertEqual(fn.sizes, [1, 4, 4, 1])  # 3 + the head of 6, then 4, then 1
        self.assertAllEqual(fn.batches[1], [0, 1, 2, 10])

    def test_a_full_queue_refuses_at_once_and_the_next_request_runs(self):
        gate = threading.Event()
        fn = Recorder(gate)
        batcher = self.batcher(fn, max_batch_size=2, max_enqueued_batches=2)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            running = pool.submit(batcher, {"x": np.array([0, 1])})
            fn.running.wait(10)
            waiting = [pool.submit(batcher, {"x": np.array([i])}) for i in range(4)]
            wait_until(lambda: batcher._queued == 4, what="4 images queued")
            start = time.monotonic()
            with self.assertRaises(errors.ServingError) as raised:
                batcher({"x": np.array([9])})
            self.assertLess(time.monotonic() - start, 1)
            self.assertEqual(raised.exception.code, "UNAVAILABLE")
            self.assertIn("the batch queue is full", raised.exception.message)
            gate.set()
            self.assertAllEqual(running.result(10)["y"], [1, 4])
            self.assertEqual([f.result(10)["y"][0] for f in waiting], [1, 4, 7, 10])
        self.assertAllEqual(batcher({"x": np.array([9])})["y"], [28])

    def test_a_deadline_that_passes_in_the_queue(self):
        gate = threading.Event()
        fn = Recorder(gate)
        batcher = self.batcher(fn, max_batch_size=2)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = pool.submit(batcher, {"x": np.array([0])})
            fn.running.wait(10)
            deadline = batching.Deadline.after(0.2, "the test's deadline")
            with self.assertRaises(errors.ServingError) as raised:
                batcher({"x": np.array([5, 6])}, deadline)
            self.assertEqual(raised.exception.code, "RESOURCE_EXHAUSTED")
            self.assertEqual(
                raised.exception.message,
                "the test's deadline passed while the request waited in the batch queue",
            )
            self.assertEqual(batcher._queued, 0)  # it left the queue
            gate.set()
            self.assertAllEqual(running.result(10)["y"], [1])
        self.assertEqual(fn.sizes, [1])  # the expired request never ran
        self.assertAllEqual(batcher({"x": np.array([2])})["y"], [7])

    def test_a_deadline_that_passes_while_running(self):
        gate = threading.Event()
        fn = Recorder(gate)
        batcher = self.batcher(fn, max_batch_size=2)
        deadline = batching.Deadline.after(0.3, "the test's deadline")
        with self.assertRaises(errors.ServingError) as raised:
            batcher({"x": np.array([0])}, deadline)
        self.assertEqual(raised.exception.code, "DEADLINE_EXCEEDED")
        self.assertIn("passed while the request's batch ran", raised.exception.message)
        gate.set()
        self.assertAllEqual(batcher({"x": np.array([2])})["y"], [7])  # the slot is not lost
        self.assertEqual(batcher.threads_alive, 1)

    def test_a_failing_batch_fails_its_requests_and_the_threads_go_on(self):
        fn = Recorder()
        batcher = self.batcher(fn, max_batch_size=4, num_batch_threads=4)
        requests = [{"x": np.array([-1 if i % 5 == 0 else i])} for i in range(40)]
        with self.assertLogs("sat_tf.server.errors", "ERROR"):
            got = run_together(batcher, requests)
        for request, out in zip(requests, got, strict=True):
            if isinstance(out, Exception):
                self.assertIsInstance(out, errors.ServingError)
                self.assertEqual(out.code, "INTERNAL")
                self.assertNotIn("negative", out.message)
            else:
                self.assertAllEqual(out["y"], 3 * request["x"] + 1)
        failed = {
            int(r["x"][0]) for r, o in zip(requests, got, strict=True) if isinstance(o, Exception)
        }
        batches_with_a_negative = [set(b.tolist()) for b in fn.batches if (b < 0).any()]
        self.assertEqual(failed, set().union(*batches_with_a_negative))
        self.assertEqual(batcher.threads_alive, 4)

    def test_an_output_without_a_batch_axis_fails_the_batch_not_the_thread(self):
        calls = []

        def scalar_out(inputs):
            calls.append(len(inputs["x"]))
            return {"y": np.float32(len(calls))}

        batcher = self.batcher(scalar_out, max_batch_size=4)
        for _ in range(2):
            with self.assertLogs("sat_tf.server.batching", "ERROR"):
                with self.assertRaises(errors.ServingError) as raised:
                    batcher({"x": np.arange(3)})
            self.assertEqual(raised.exception.code, "INTERNAL")
            self.assertIn("output y of shape [] has no batch axis of 3", raised.exception.message)
        self.assertEqual(batcher.threads_alive, 1)

    def test_requests_of_other_shapes_wait_for_their_own_batch(self):
        fn = Recorder()
        batcher = self.batcher(fn, max_batch_size=8, batch_timeout_micros=300_000)
        requests = [{"x": np.full((1, 1 + i % 3), i)} for i in range(6)]
        got = run_together(batcher, requests)
        for request, out in zip(requests, got, strict=True):
            self.assertAllEqual(out["y"], 3 * request["x"] + 1)
        for batch in fn.batches:
            self.assertLen({row.shape for row in batch}, 1)
        self.assertLen(fn.batches, 3)

    def test_a_closed_batcher_refuses(self):
        batcher = batching.Batcher(Recorder(), parameters(max_batch_size=2))
        batcher.close()
        with self.assertRaises(errors.ServingError) as raised:
            batcher({"x": np.array([1])})
        self.assertEqual(raised.exception.code, "UNAVAILABLE")

    def test_each_batch_is_reported(self):
        reports = []
        gate = threading.Event()
        fn = Recorder(gate)
        batcher = batching.Batcher(
            fn,
            parameters(max_batch_size=4, allowed_batch_sizes=(2, 4)),
            report=lambda *a: reports.append(a),
        )
        self.addCleanup(batcher.close)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            first = pool.submit(batcher, {"x": np.arange(2)})
            fn.running.wait(10)
            later = [pool.submit(batcher, {"x": np.array([i])}) for i in (7, 8)]
            wait_until(lambda: batcher._queued == 2, what="2 images queued")
            time.sleep(0.1)
            gate.set()
            for future in (first, *later):
                future.result(10)
        (sizes, padding, waited), (sizes2, padding2, waited2) = reports
        self.assertEqual((sizes, padding), ((2,), 0))
        self.assertEqual((sorted(sizes2), padding2), ([1, 1], 0))
        self.assertGreater(min(waited2), 0.09)  # they waited behind the first batch


class ExportBatcherTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.serve = tf.saved_model.load(tiny_export()).signatures["serving_default"]

    def call(self, inputs):
        return {k: v.numpy() for k, v in self.serve(image_bytes=inputs["image_bytes"]).items()}

    def test_each_request_gets_what_it_gets_alone(self):
        good = [encode(x, "PNG") for x in scenes(0, 5)]
        truncated = good[0][: len(good[0]) // 2]
        requests = [[good[0]], [b"not an image", good[1]], [good[2], truncated], [b""], good[3:]]
        batcher = batching.Batcher(
            self.call,
            parameters(max_batch_size=16, batch_timeout_micros=1_000_000),
            rebase=servable.rename_errors,
        )
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


if __name__ == "__main__":
    tf.test.main()
