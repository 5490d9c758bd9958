"""Tests for sat_tf.cli.serve (`python scripts/serve.py`): one server process on
127.0.0.1 over a tiny export, the two clients of export/serving/ run as scripts against
it unchanged, clients that disconnect mid-request costing nothing, its memory flat under
sustained load, and SIGTERM finishing the request in flight and exiting 0."""

import base64
import concurrent.futures
import json
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

import numpy as np
import requests
import tensorflow as tf
from fixtures import encode, run_main, scenes, tiny_model

from sat_tf.cli import serve
from sat_tf.serving import exporting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT}
LOAD_REQUESTS = 80
RSS_GROWTH_MB = 10


def rss_mb(pid):
    """The resident memory of process `pid` in MB (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def predict_body(data):
    """A REST predict body of one image, row form."""
    b64 = base64.b64encode(data).decode()
    return json.dumps({"instances": [{"image_bytes": {"b64": b64}}]}).encode()


class ServeTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        model, vocab, config = tiny_model()
        exporting.export(model, vocab, config, os.path.join(cls.root, "sat", "1"))
        png = encode(scenes(0, 1)[0], "PNG")
        cls.photo = os.path.join(cls.root, "photo.png")
        with open(cls.photo, "wb") as f:
            f.write(png)
        cls.bad = os.path.join(cls.root, "bad.jpg")
        with open(cls.bad, "wb") as f:
            f.write(b"not a photo")
        out = tf.saved_model.load(os.path.join(cls.root, "sat", "1")).signatures["serving_default"](
            image_bytes=tf.constant([png])
        )
        cls.caption = out["caption"].numpy()[0].decode()
        cls.want = [
            f"{cls.photo}: {cls.caption}  (log p = ",
            f"{cls.bad}: error: image_bytes[1] (11 bytes) is not a JPEG, PNG, GIF, BMP or WebP",
        ]
        cls.body = predict_body(png)
        # A batch waits 1.5 s for company: time to send SIGTERM while a request is in flight.
        cls.parameters = os.path.join(cls.root, "batching.txt")
        with open(cls.parameters, "w") as f:
            f.write("max_batch_size { value: 4 }\nbatch_timeout_micros { value: 1500000 }\n")
        cls.stderr = open(os.path.join(cls.root, "stderr.txt"), "w+")  # noqa: SIM115
        cls.addClassCleanup(cls.stderr.close)
        cls.server = subprocess.Popen(
            [
                sys.executable,
                os.path.join(ROOT, "scripts", "serve.py"),
                f"--model_base_path={os.path.join(cls.root, 'sat')}",
                "--rest_api_port=0",
                "--port=0",
                "--host=127.0.0.1",
                f"--batching_parameters_file={cls.parameters}",
            ],
            stdout=subprocess.PIPE,
            stderr=cls.stderr,
            text=True,
            env=ENV,
        )
        cls.addClassCleanup(cls.server.kill)
        line = cls.server.stdout.readline()
        found = re.search(r"REST on 127.0.0.1:(\d+), gRPC on 127.0.0.1:(\d+)", line)
        assert found, line
        cls.rest, cls.grpc = found.groups()

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
        url = f"http://127.0.0.1:{self.rest}/v1/models/sat:predict"
        return requests.post(url, data=self.body if body is None else body, timeout=60)

    def test_clients(self):
        for name, server in (
            ("rest_client", f"http://127.0.0.1:{self.rest}"),
            ("grpc_client", f"127.0.0.1:{self.grpc}"),
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
                with socket.create_connection(("127.0.0.1", int(self.rest)), timeout=10) as sock:
                    sock.sendall(sent)
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
        if not os.path.exists(f"/proc/{self.server.pid}/status"):
            self.skipTest("no /proc: the server's memory is read from /proc/<pid>/status")
        # Noise does not compress: a 260 KB body, twice RSS_GROWTH_MB / LOAD_REQUESTS, so
        # keeping any request's body (or its pixels) would show.
        noise = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
        body = predict_body(encode(noise, "PNG"))
        bad = predict_body(b"not an image")
        bodies = [bad if i % 10 == 9 else body for i in range(LOAD_REQUESTS)]

        def load():
            with concurrent.futures.ThreadPoolExecutor(4) as pool:  # a batch is 4 images
                answers = list(pool.map(self.predict, bodies))
            for body, answer in zip(bodies, answers, strict=True):
                self.assertEqual(answer.status_code, 200, answer.text[:300])
                status = answer.json()["predictions"][0]["status"]
                self.assertEqual(status, 2 if body is bad else 0)
            return rss_mb(self.server.pid)

        load()  # TensorFlow's pools and the threads' buffers reach their size
        after_n = load()
        after_2n = load()
        self.assertLess(
            after_2n - after_n,
            RSS_GROWTH_MB,
            f"sat-serve's RSS {after_n:.1f} MB after {LOAD_REQUESTS} requests (past the first "
            f"{LOAD_REQUESTS}), {after_2n:.1f} MB after {2 * LOAD_REQUESTS}",
        )

    def test_sigterm_finishes_the_request_in_flight(self):
        # Named to run last (unittest orders a class's tests by name): it stops the server.
        answers = []
        thread = threading.Thread(
            target=lambda: answers.append(
                self.client("rest_client", f"http://127.0.0.1:{self.rest}")
            )
        )
        thread.start()
        time.sleep(1.0)
        self.server.send_signal(signal.SIGTERM)
        thread.join(60)
        self.assertEqual(self.server.wait(30), 0)
        self.assertEqual(answers[0].returncode, 0, msg=answers[0].stderr)
        self.assertStartsWith(answers[0].stdout, self.want[0])
        self.assertEqual(self.server.stdout.read().strip(), "stopped")
        self.stderr.seek(0)
        self.assertNotIn("Traceback", self.stderr.read())

    def test_missing_base_path(self):
        code, _, err = run_main(serve.main, "sat-serve", "--model_base_path=/nonexistent/sat")
        self.assertEqual(code, 1)
        self.assertIn("--model_base_path '/nonexistent/sat' is not a folder", err)
