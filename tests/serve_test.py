"""Tests for sat_tf.cli.serve (`python scripts/serve.py`): one server process on
127.0.0.1 over a tiny export, the two clients of export/serving/ run as scripts against
it unchanged, and SIGTERM finishing the request in flight and exiting 0."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import tensorflow as tf
from fixtures import encode, run_main, scenes, tiny_model

from sat_tf.cli import serve
from sat_tf.serving import exporting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT}


class ServeTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        model, vocab, config = tiny_model()
        exporting.export(model, vocab, config, os.path.join(cls.root, "sat", "1"))
        cls.photo = os.path.join(cls.root, "photo.png")
        with open(cls.photo, "wb") as f:
            f.write(encode(scenes(0, 1)[0], "PNG"))
        cls.bad = os.path.join(cls.root, "bad.jpg")
        with open(cls.bad, "wb") as f:
            f.write(b"not a photo")
        out = tf.saved_model.load(os.path.join(cls.root, "sat", "1")).signatures["serving_default"](
            image_bytes=tf.constant([encode(scenes(0, 1)[0], "PNG")])
        )
        cls.caption = out["caption"].numpy()[0].decode()
        # A batch waits 1.5 s for company: time to send SIGTERM while a request is in flight.
        cls.parameters = os.path.join(cls.root, "batching.txt")
        with open(cls.parameters, "w") as f:
            f.write("max_batch_size { value: 4 }\nbatch_timeout_micros { value: 1500000 }\n")
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

    def test_clients_and_sigterm(self):
        want = [
            f"{self.photo}: {self.caption}  (log p = ",
            f"{self.bad}: error: image_bytes[1] (11 bytes) is not a JPEG, PNG, GIF, BMP or WebP",
        ]
        for name, server in (
            ("rest_client", f"http://127.0.0.1:{self.rest}"),
            ("grpc_client", f"127.0.0.1:{self.grpc}"),
        ):
            done = self.client(name, server)
            self.assertEqual(done.returncode, 0, msg=done.stderr)
            lines = done.stdout.splitlines()
            self.assertLen(lines, 2)
            for line, start in zip(lines, want, strict=True):
                self.assertStartsWith(line, start)
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
        self.assertStartsWith(answers[0].stdout, want[0])
        self.assertEqual(self.server.stdout.read().strip(), "stopped")

    def test_missing_base_path(self):
        code, _, err = run_main(serve.main, "sat-serve", "--model_base_path=/nonexistent/sat")
        self.assertEqual(code, 1)
        self.assertIn("--model_base_path '/nonexistent/sat' is not a folder", err)
