"""Tests for sat_tf.cli.serve (`python scripts/serve.py`) as an operator meets it: live
server processes on 127.0.0.1 over copies of the tiny export, with TF Serving's clients
(the scripts of export/serving/, tensorflow-serving-api's stubs) and plain HTTP.

The default run holds one server: both clients unchanged, clients that disconnect, memory
flat under load, 300 instances in one request, a body of exactly --max_body_bytes and one
over, a 1 ms gRPC deadline, SIGTERM with a request in flight; and starts that must end
with one line (a model that never loads, a warm-up that cannot run, a port taken, -v in a
flagfile). The slow tests (`-m slow`) hold the faults that take time: broken versions
retried and listed while threads and memory stay flat, a new version and a rollback
under load, small queues, four batch threads, REST and gRPC deadlines, SIGTERM under
load.
"""

import concurrent.futures
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from fixtures import encode, run_main, scenes, tiny_export, wait_until
from server_process import ENV, ROOT, SatServe, add_version, predict_body

from sat_tf.cli import serve

LOAD_REQUESTS = 80
RSS_GROWTH_MB = 10
MAX_BODY = 2**18


def grpc_client():
    sys.path.insert(0, os.path.join(ROOT, "export", "serving"))
    import grpc_client as client

    return client


class ServeTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        add_version(os.path.join(cls.root, "sat"), 1)
        png = encode(scenes(0, 1)[0], "PNG")
        cls.photo = os.path.join(cls.root, "photo.png")
        with open(cls.photo, "wb") as f:
            f.write(png)
        cls.bad = os.path.join(cls.root, "bad.jpg")
        with open(cls.bad, "wb") as f:
            f.write(b"not a photo")
        signature = tf.saved_model.load(tiny_export()).signatures["serving_default"]
        cls.caption = signature(image_bytes=tf.constant([png]))["caption"].numpy()[0].decode()
        cls.want = [
            f"{cls.photo}: {cls.caption}  (log p = ",
            f"{cls.bad}: error: image_bytes[1] (11 bytes) is not a JPEG, PNG, GIF, BMP or WebP",
        ]
        cls.png, cls.body = png, predict_body([png])
        # A batch waits 1.5 s for company: time to send SIGTERM while a request is in flight.
        parameters = os.path.join(cls.root, "batching.txt")
        with open(parameters, "w") as f:
            f.write("max_batch_size { value: 4 }\nbatch_timeout_micros { value: 1500000 }\n")
        cls.server = SatServe(
            os.path.join(cls.root, "sat"),
            f"--batching_parameters_file={parameters}",
            f"--max_body_bytes={MAX_BODY}",
            stderr_path=os.path.join(cls.root, "stderr.txt"),
        )
        cls.addClassCleanup(cls.server.kill)

    def client(self, name, server):
        script = os.path.join(ROOT, "export", "serving", f"{name}.py")
        return subprocess.run(
            [sys.executable, script, f"--server={server}", self.photo, self.bad],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
        )

    def predict(self, body=None):
        return requests.post(self.server.url + ":predict", data=body or self.body, timeout=60)

    def test_clients(self):
        for name, server in (
            ("rest_client", f"http://127.0.0.1:{self.server.rest}"),
            ("grpc_client", f"127.0.0.1:{self.server.grpc}"),
        ):
            done = self.client(name, server)
            self.assertEqual(done.returncode, 0, msg=done.stderr)
            lines = done.stdout.splitlines()
            self.assertLen(lines, 2)
            for line, start in zip(lines, self.want, strict=True):
                self.assertStartsWith(line, start)

    def test_a_client_that_disconnects_costs_nothing(self):
        head = (
            f"POST /v1/models/sat:predict HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(self.body)}\r\n\r\n"
        ).encode()
        # Half the body, then gone; the whole request, gone before the answer (the server
        # runs it, its batch waiting for company).
        for sent in (head + self.body[: len(self.body) // 2], head + self.body):
            for _ in range(6):
                with socket.create_connection(("127.0.0.1", self.server.rest), timeout=10) as s:
                    s.sendall(sent)
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: self.predict(), range(4)))
        for answer in answers:
            self.assertEqual(answer.status_code, 200, answer.text[:300])
            self.assertEqual(answer.json()["predictions"][0]["caption"], self.caption)
        # the deserted requests' batches may run first: 6 images, one full batch and one
        # waiting 1.5 s for company
        self.assertLess(time.monotonic() - start, 20)

    def test_memory_stays_flat_under_load(self):
        # Noise does not compress: a 260 KB body, twice RSS_GROWTH_MB / LOAD_REQUESTS, so
        # keeping any request's body (or its pixels) would show.
        noise = np.random.default_rng(0).integers(0, 256, (200, 200, 3), dtype=np.uint8)
        body = predict_body([encode(noise, "PNG")])
        self.assertLess(len(body), MAX_BODY)
        bad = predict_body([b"not an image"])
        bodies = [bad if i % 10 == 9 else body for i in range(LOAD_REQUESTS)]

        def load():
            with concurrent.futures.ThreadPoolExecutor(4) as pool:  # a batch is 4 images
                answers = list(pool.map(self.predict, bodies))
            for body, answer in zip(bodies, answers, strict=True):
                self.assertEqual(answer.status_code, 200, answer.text[:300])
                status = answer.json()["predictions"][0]["status"]
                self.assertEqual(status, 2 if body is bad else 0)
            return self.server.rss_mb()

        load()  # TensorFlow's pools and the threads' buffers reach their size
        after_n = load()
        after_2n = load()
        self.assertLess(
            after_2n - after_n,
            RSS_GROWTH_MB,
            f"sat-serve's RSS {after_n:.1f} MB after {LOAD_REQUESTS} requests (past the first "
            f"{LOAD_REQUESTS}), {after_2n:.1f} MB after {2 * LOAD_REQUESTS}",
        )

    def test_three_hundred_instances_in_one_request(self):
        # 300 images are 75 batches of 4; the queue holds 10 (TF Serving's default).
        answer = self.predict(predict_body([self.png] * 300))
        self.assertEqual(answer.status_code, 200, answer.text[:300])
        predictions = answer.json()["predictions"]
        self.assertLen(predictions, 300)
        self.assertEqual({p["caption"] for p in predictions}, {self.caption})

    def test_a_body_of_the_limit_and_one_byte_over(self):
        exact = self.body + b" " * (MAX_BODY - len(self.body))
        self.assertLen(exact, MAX_BODY)
        answer = self.predict(exact)
        self.assertEqual(answer.status_code, 200, answer.text[:300])
        answer = self.predict(exact + b" ")
        self.assertEqual(answer.status_code, 413)
        self.assertEqual(answer.headers["Content-Type"], "application/json")
        self.assertEqual(
            answer.json(),
            {"error": f"the request body is over --max_body_bytes ({MAX_BODY} bytes)"},
        )

    def test_a_one_millisecond_grpc_deadline(self):
        request = grpc_client().predict_request([self.png])
        with self.assertRaises(grpc.RpcError) as raised:
            self.server.predictions.Predict(request, timeout=0.001)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        response = self.server.predictions.Predict(request, timeout=60)
        self.assertEqual(response.outputs["caption"].string_val[0].decode(), self.caption)

    def test_zz_sigterm_finishes_the_request_in_flight(self):
        # Named to run last (unittest orders a class's tests by name): it stops the server.
        answers = []
        thread = threading.Thread(
            target=lambda: answers.append(
                self.client("rest_client", f"http://127.0.0.1:{self.server.rest}")
            )
        )
        thread.start()
        time.sleep(1.0)
        self.assertEqual(self.server.stop(), 0)
        thread.join(60)
        self.assertEqual(answers[0].returncode, 0, msg=answers[0].stderr)
        self.assertStartsWith(answers[0].stdout, self.want[0])
        self.assertEqual(self.server.process.stdout.read().strip(), "stopped")
        with open(os.path.join(self.root, "stderr.txt")) as f:
            self.assertNotIn("Traceback", f.read())


class StartTest(tf.test.TestCase):
    """Starts that end with one line and exit status 1, in this process."""

    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(dir=self.get_temp_dir())
        self.base = os.path.join(self.root, "sat")

    def start(self, *flags):
        return run_main(
            serve.main,
            "sat-serve",
            f"--model_base_path={self.base}",
            "--host=127.0.0.1",
            "--port=0",
            "--rest_api_port=0",
            "--max_num_load_retries=1",
            "--load_retry_interval_micros=1000",
            *flags,
        )

    def test_missing_base_path(self):
        code, _, err = run_main(serve.main, "sat-serve", "--model_base_path=/nonexistent/sat")
        self.assertEqual(code, 1)
        self.assertIn("--model_base_path '/nonexistent/sat' is not a folder", err)
        code, _, err = run_main(serve.main, "sat-serve")
        self.assertEqual(code, 1)
        self.assertIn("--model_base_path is required", err)

    def test_a_model_that_never_loads(self):
        add_version(self.base, 3, "model")
        code, out, err = self.start()
        self.assertEqual(code, 1)
        self.assertIn(
            "error: model sat did not become available (version 3: DATA_LOSS: "
            f"{self.base}/3/saved_model.pb is not a SavedModel",
            err,
        )
        self.assertNotIn("Traceback", err)
        self.assertNotIn("serving", out)

    def test_a_warm_up_that_cannot_run(self):
        add_version(self.base, 2, "warmup_request")
        code, _, err = self.start()
        self.assertEqual(code, 1)
        self.assertIn(
            "(version 2: INVALID_ARGUMENT: warm-up request 0 of "
            f"{self.base}/2/assets.extra/tf_serving_warmup_requests: signature serving_default "
            "takes inputs ['image_bytes'], got ['pixels'])",
            err,
        )

    def test_a_port_taken(self):
        add_version(self.base, 1)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            code, _, err = self.start(f"--rest_api_port={port}")
        self.assertEqual(code, 1)
        self.assertIn(
            f"error: cannot serve REST on 127.0.0.1:{port} (--rest_api_port): "
            "Address already in use",
            err,
        )
        self.assertNotIn("Traceback", err)

    def test_verbose_in_a_flagfile_and_tensorflows_error_lines(self):
        add_version(self.base, 3, "model")
        flagfile = os.path.join(self.root, "serve.flags")
        script = (
            "import os, sys\nfrom sat_tf.cli import serve\n"
            "code = serve.main(['sat-serve', *sys.argv[1:]])\n"
            "print(code, os.environ.get('TF_CPP_MIN_LOG_LEVEL'))\n"
        )
        env = {k: v for k, v in ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
        for verbose, want_level in ((False, "2"), (True, "None")):
            with open(flagfile, "w") as f:
                f.write(f"--model_base_path={self.base}\n--max_num_load_retries=0\n")
                f.write("-v\n" if verbose else "")
            done = subprocess.run(
                [sys.executable, "-c", script, f"--flagfile={flagfile}"],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
            )
            self.assertEqual(done.stdout.split(), ["1", want_level], done.stderr[-2000:])
            # TensorFlow's own INFO lines (`I0000 00:00:...`) show with -v only.
            informed = re.search(r"^I\d{4} ", done.stderr, re.M) is not None
            self.assertEqual(informed, verbose, done.stderr[-2000:])


def burst(count, send):
    """`send(i)` from `count` threads at once; their results or exceptions."""
    barrier = threading.Barrier(count)

    def one(i):
        barrier.wait(60)
        try:
            return send(i)
        except Exception as e:  # noqa: BLE001
            return e

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.slow
class BrokenVersionsTest(tf.test.TestCase):
    """Broken versions retried, listed with their errors and left out while version 1
    serves; then, for WATCH_SECONDS, broken versions that leave and come back (each time
    tried three times anew, one of them loading its model before its warm-up fails)
    while the threads and memory of the server stay flat."""

    WATCH_SECONDS = 75

    def test_broken_versions_leave_threads_and_memory_flat(self):
        root = tempfile.mkdtemp(dir=self.get_temp_dir())
        base, log = os.path.join(root, "sat"), os.path.join(root, "stderr.txt")
        add_version(base, 1)
        for name in ("٩", ".12.tmp", "12a"):  # never versions
            shutil.copytree(tiny_export(), os.path.join(base, name))
        server = SatServe(
            base,
            "--file_system_poll_wait_seconds=0.2",
            "--max_num_load_retries=2",
            "--load_retry_interval_micros=100000",
            stderr_path=log,
        )
        self.addCleanup(server.kill)
        png = encode(scenes(0, 1)[0], "PNG")

        def failed_loads():
            return server.errors().count(" did not load (try ")

        def tried(step):
            """Runs `step`, then waits for its version's three failed tries (each loads a
            SavedModel, slow beside the other slow tests on two cores)."""
            before = failed_loads()
            step()
            try:
                wait_until(lambda: failed_loads() >= before + 3, 180, "three failed tries")
            except AssertionError as e:
                tail = "\n".join(server.errors().splitlines()[-12:])
                raise AssertionError(f"{e}; the server's log ends:\n{tail}") from e

        listed = [(1, "AVAILABLE", "OK")]
        for version, broken, code in (
            (2, "model", "DATA_LOSS"),
            (3, "warmup", "DATA_LOSS"),
            (4, "warmup_request", "INVALID_ARGUMENT"),
        ):
            tried(lambda v=version, b=broken: add_version(base, v, b))
            listed = [(version, "END", code), *listed]
            wait_until(lambda want=listed: server.states() == want, 60, f"states {listed}")
        status = {int(s["version"]): s["status"] for s in server.status()}
        self.assertIn(f"{base}/2/saved_model.pb is not a SavedModel", status[2]["error_message"])
        self.assertIn(
            f"{base}/3/assets.extra/tf_serving_warmup_requests", status[3]["error_message"]
        )
        self.assertIn("warm-up request 0 of", status[4]["error_message"])
        threads, rss, loads = server.threads(), server.rss_mb(), failed_loads()

        def move(version, there):
            here = os.path.join(base, str(version))
            away = os.path.join(root, f"away{version}")
            os.rename(*((here, away) if there == "away" else (away, here)))
            time.sleep(0.5)  # the manager looks every 0.2 s

        start, cycles, peaks = time.monotonic(), 0, []
        while time.monotonic() - start < self.WATCH_SECONDS:
            # Each step changes the newest version the policy aspires, tried anew.
            tried(lambda: move(4, "away"))  # 3 again
            tried(lambda: move(3, "away"))  # 2 again
            tried(lambda: move(3, "back"))  # 3 again
            tried(lambda: move(4, "back"))  # 4 again: its model loads three times
            answer = requests.post(server.url + ":predict", data=predict_body([png]), timeout=60)
            self.assertEqual(answer.status_code, 200)
            peaks.append(server.rss_mb())
            cycles += 1
        self.assertGreaterEqual(failed_loads() - loads, 12 * cycles)
        self.assertEqual(server.states(), listed)
        self.assertLessEqual(server.threads() - threads, 2)
        # Memory swings as models load and go: the late peak against the early one.
        half = len(peaks) // 2
        growth = max(peaks[half:]) - max([rss, *peaks[:half]])
        self.assertLess(growth, 100, f"after {failed_loads() - loads} failed loads: {peaks}")
        self.assertEqual(server.stop(), 0)


def batching_file(root, text):
    path = os.path.join(root, "batching.txt")
    with open(path, "w") as f:
        f.write(text)
    return f"--batching_parameters_file={path}"


@pytest.mark.slow
class SwapUnderLoadTest(tf.test.TestCase):
    """Eight gRPC clients predicting while a new version arrives and then goes: every call
    answered, each client's versions 1, then 2, then 1 again, the new version serving
    within one poll plus its own load and warm-up (GET status watched every 20 ms)."""

    def test_a_new_version_and_a_rollback_under_load(self):
        root = tempfile.mkdtemp(dir=self.get_temp_dir())
        base = os.path.join(root, "sat")
        add_version(base, 1)
        server = SatServe(base, "--file_system_poll_wait_seconds=1")
        self.addCleanup(server.kill)
        request = grpc_client().predict_request([encode(scenes(0, 1)[0], "PNG")])
        stop, answers = threading.Event(), [[] for _ in range(8)]

        def client(mine):
            while not stop.is_set():
                try:
                    response = server.predictions.Predict(request, timeout=60)
                    mine.append((time.monotonic(), response.model_spec.version.value))
                except grpc.RpcError as e:
                    mine.append((time.monotonic(), e.code()))

        seen = {}

        def watch():
            while not stop.is_set():
                for version, state, _ in server.states():
                    seen.setdefault((version, state), time.monotonic())
                time.sleep(0.02)

        threads = [threading.Thread(target=client, args=(a,)) for a in answers]
        threads.append(threading.Thread(target=watch))
        for thread in threads:
            thread.start()
        try:
            time.sleep(3)
            added = time.monotonic()
            add_version(base, 2)
            wait_until(lambda: any(v == 2 for a in answers for _, v in a), 120, "version 2")
            first = min(t for a in answers for t, v in a if v == 2)
            time.sleep(2)
            removed = time.monotonic()
            shutil.rmtree(os.path.join(base, "2"))
            wait_until(lambda: any(t > removed and v == 1 for a in answers for t, v in a), 120)
            time.sleep(2)
        finally:
            stop.set()
            for thread in threads:
                thread.join(120)
        for mine in answers:
            versions = [v for _, v in mine]
            self.assertEqual(set(versions), {1, 2}, "every call answered by a version")
            changes = [b for a, b in zip(versions, versions[1:], strict=False) if a != b]
            self.assertEqual(changes, [2, 1])
        load = seen[(2, "AVAILABLE")] - seen.get((2, "LOADING"), seen[(2, "AVAILABLE")])
        # One poll (1 s), the load and warm-up, and what the watcher's own polling misses.
        self.assertLess(first - added, 1 + load + 3, f"load and warm-up {load:.2f} s")
        self.assertEqual(server.stop(), 0)


@pytest.mark.slow
class SmallQueueTest(tf.test.TestCase):
    """max_batch_size 4, max_enqueued_batches 2, one batch thread: the export's warm-up (16
    images) runs cut into batches, the server serves, a burst of 200 clients that keep
    their connections open is shed with 503 at once (JSON), and the request after the
    burst is answered."""

    def test_the_warm_up_and_a_burst(self):
        root = tempfile.mkdtemp(dir=self.get_temp_dir())
        base = os.path.join(root, "sat")
        add_version(base, 1)
        limits = "max_batch_size { value: 4 } max_enqueued_batches { value: 2 } "
        server = SatServe(base, batching_file(root, limits + "num_batch_threads { value: 1 }"))
        self.addCleanup(server.kill)
        self.assertEqual(server.states(), [(1, "AVAILABLE", "OK")])
        body = predict_body([encode(scenes(0, 1)[0], "PNG")])
        rss = server.rss_mb()

        def post(_):
            return requests.post(server.url + ":predict", data=body, timeout=120)

        answers = burst(200, post)
        codes = [getattr(a, "status_code", type(a).__name__) for a in answers]
        self.assertEqual(set(codes), {200, 503}, codes)
        for answer in answers:
            if answer.status_code == 503:
                self.assertEqual(answer.headers["Content-Type"], "application/json")
                self.assertIn("the batch queue is full", answer.json()["error"])
                self.assertLess(answer.elapsed.total_seconds(), 30)
        self.assertEqual(post(0).status_code, 200)
        self.assertLess(server.rss_mb() - rss, 150)
        self.assertEqual(server.stop(), 0)


@pytest.mark.slow
class BatchThreadsTest(tf.test.TestCase):
    """Four batch threads under 128 clients at once sending good, bad and malformed
    requests: every answer is its own, and no thread of the server ends."""

    def test_four_batch_threads_live_through_load(self):
        root = tempfile.mkdtemp(dir=self.get_temp_dir())
        base = os.path.join(root, "sat")
        add_version(base, 1)
        server = SatServe(
            base,
            batching_file(
                root,
                "max_batch_size { value: 4 } batch_timeout_micros { value: 2000 } "
                "num_batch_threads { value: 4 } max_enqueued_batches { value: 64 }",
            ),
        )
        self.addCleanup(server.kill)
        good = predict_body([encode(scenes(0, 1)[0], "PNG")])
        bodies = [good, predict_body([b"not an image"]), b'{"instances": [{"images": 1}]}']

        def post(i):
            answer = requests.post(server.url + ":predict", data=bodies[i % 3], timeout=120)
            return answer.status_code

        want = [(200, 200, 400)[i % 3] for i in range(32 * 4)]
        self.assertEqual(burst(32 * 4, post), want)  # threads and pools reach their size
        threads = server.threads()
        for _ in range(3):
            self.assertEqual(burst(32 * 4, post), want)
        # A batch thread that ended would show as one fewer; TensorFlow may start one more.
        self.assertBetween(server.threads(), threads, threads + 2)
        self.assertEqual(server.stop(), 0)


@pytest.mark.slow
class DeadlinesTest(tf.test.TestCase):
    """--rest_api_timeout_in_ms=1: a REST predict gets 429 (queued) or 504 (running) naming
    the deadline, and the batch thread serves the next call; gRPC's 1 ms deadline is
    DEADLINE_EXCEEDED and the next call is answered."""

    def test_rest_and_grpc_deadlines(self):
        root = tempfile.mkdtemp(dir=self.get_temp_dir())
        base = os.path.join(root, "sat")
        add_version(base, 1)
        server = SatServe(base, "--rest_api_timeout_in_ms=1")
        self.addCleanup(server.kill)
        png = encode(scenes(0, 1)[0], "PNG")
        request = grpc_client().predict_request([png])
        for _ in range(3):
            answer = requests.post(server.url + ":predict", data=predict_body([png]), timeout=60)
            self.assertIn(answer.status_code, (429, 504))
            self.assertIn("--rest_api_timeout_in_ms (1 ms) passed", answer.json()["error"])
            with self.assertRaises(grpc.RpcError) as raised:
                server.predictions.Predict(request, timeout=0.001)
            self.assertEqual(raised.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            response = server.predictions.Predict(request, timeout=60)
            self.assertLen(response.outputs["caption"].string_val, 1)
        self.assertEqual(requests.get(server.url, timeout=30).status_code, 200)
        self.assertEqual(server.stop(), 0)


@pytest.mark.slow
class SigtermUnderLoadTest(tf.test.TestCase):
    """SIGTERM while 16 clients post on keep-alive connections: no connection reset and no
    503 for any request the server accepted; new connections are refused; exit 0 within
    25 s."""

    def test_sigterm_under_load(self):
        root = tempfile.mkdtemp(dir=self.get_temp_dir())
        base = os.path.join(root, "sat")
        add_version(base, 1)
        server = SatServe(base)
        self.addCleanup(server.kill)
        body = predict_body([encode(scenes(0, 1)[0], "PNG")])
        results, refused = [[] for _ in range(16)], []

        def client(mine):
            connection = None
            while True:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", server.rest, timeout=60)
                    try:
                        connection.connect()
                    except ConnectionRefusedError:
                        refused.append(time.monotonic())
                        return
                try:
                    connection.request("POST", "/v1/models/sat:predict", body)
                    answer = connection.getresponse()
                    answer.read()
                    mine.append(answer.status)
                    if answer.getheader("Connection") == "close":
                        connection.close()
                        connection = None
                except (OSError, http.client.HTTPException) as e:
                    mine.append(type(e).__name__)
                    return

        threads = [threading.Thread(target=client, args=(r,)) for r in results]
        for thread in threads:
            thread.start()
        wait_until(lambda: sum(len(r) for r in results) > 50, 120, "50 answers")
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        self.assertEqual(server.process.wait(25), 0)
        self.assertLess(time.monotonic() - signalled, 25)
        for thread in threads:
            thread.join(60)
        self.assertEqual({s for r in results for s in r}, {200})
        self.assertLen(refused, 16)  # each client's next connection, after the drain
        self.assertEqual(server.process.stdout.read().strip(), "stopped")
