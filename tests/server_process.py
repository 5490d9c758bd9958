"""A live `sat-serve` (`python scripts/serve.py`) on 127.0.0.1 for the tests that try it as
an operator would: started with flags, its ports read from the line it prints (within a
deadline), its threads and memory read from /proc, its end by a signal; and version
folders made from the tiny export, whole or broken, renamed into place as sat-export
does."""

import base64
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import requests
from fixtures import tiny_export
from tensorflow_serving.apis import prediction_service_pb2_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT}
START_SECONDS = 120


def add_version(base, version, broken=""):
    """A copy of the tiny export as `base/<version>`, renamed into place; `broken`:
    "model" corrupts its saved_model.pb, "warmup" its warm-up file's bytes, "warmup_request"
    leaves the file whole with a request the signature refuses (so the model loads and its
    warm-up fails when run)."""
    staged = os.path.join(base, f".{version}.staged")
    shutil.copytree(tiny_export(), staged)
    warmup_file = os.path.join(staged, "assets.extra", "tf_serving_warmup_requests")
    if broken == "model":
        with open(os.path.join(staged, "saved_model.pb"), "wb") as f:
            f.write(b"\x0a\xff\xff\xff\xff not a SavedModel")
    elif broken == "warmup":
        with open(warmup_file, "r+b") as f:
            f.seek(12)
            f.write(b"\x00" * 16)
    elif broken == "warmup_request":
        import tensorflow as tf
        from tensorflow_serving.apis import prediction_log_pb2

        log = prediction_log_pb2.PredictionLog()
        log.predict_log.request.model_spec.signature_name = "serving_default"
        log.predict_log.request.inputs["pixels"].CopyFrom(tf.make_tensor_proto([1.0]))
        with tf.io.TFRecordWriter(warmup_file) as writer:
            writer.write(log.SerializeToString())
    path = os.path.join(base, str(version))
    os.rename(staged, path)
    return path


def serve_in_process(test_class, version=1):
    """A copy of the tiny export as `version` of model sat, served in this process by a
    started manager and server on free ports of 127.0.0.1 (batches of up to 8 waiting 0.3
    s, a failed load not tried again), stopped and removed when `test_class`'s tests end:
    (base path, manager, server)."""
    from sat_tf.server import batching, lifecycle, manager, model_config, options

    root = tempfile.mkdtemp()
    test_class.addClassCleanup(shutil.rmtree, root, ignore_errors=True)
    base = os.path.join(root, "sat")
    shutil.copytree(tiny_export(), os.path.join(base, str(version)))
    parameters = batching.BatchingParameters(
        max_batch_size=8, batch_timeout_micros=300_000, num_batch_threads=1
    )
    served = manager.Manager(
        model_config.single_model_config("sat", base),
        manager.ManagerOptions(parameters, poll_wait_seconds=0.05, max_num_load_retries=0),
    )
    served.start()
    settings = {"port": 0, "rest_api_port": 0, "host": "127.0.0.1", "rest_api_num_threads": 8}
    server = lifecycle.Server(served, options.ServerOptions(**settings))
    test_class.addClassCleanup(server.drain, 5)
    return base, served, server


def predict_body(images):
    """A REST predict body (bytes) of encoded images, row form."""
    rows = [{"image_bytes": {"b64": base64.b64encode(d).decode()}} for d in images]
    return json.dumps({"instances": rows}).encode()


class SatServe:
    """One sat-serve process over `base` with `flags` (free ports, 127.0.0.1).

    Raises:
      AssertionError: when it does not print its ports within `START_SECONDS`.
    """

    def __init__(self, base, *flags, stderr_path=None):
        # Appended to (O_APPEND) and read through a file of its own: the child's writes
        # never land where a read moved a shared offset, over lines already written.
        self.stderr_path = stderr_path
        self.stderr = open(stderr_path or os.devnull, "a")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable,
                os.path.join(ROOT, "scripts", "serve.py"),
                f"--model_base_path={base}",
                "--rest_api_port=0",
                "--port=0",
                "--host=127.0.0.1",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=ENV,
        )
        line = self.read_line(START_SECONDS)
        found = re.search(r"REST on \S+:(\d+), gRPC on \S+:(\d+)", line)
        if not found:
            self.process.kill()
            raise AssertionError(f"sat-serve did not start: {line!r}, {self.errors()[-3000:]}")
        self.rest, self.grpc = (int(p) for p in found.groups())
        self.url = f"http://127.0.0.1:{self.rest}/v1/models/sat"
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc}")
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def read_line(self, timeout):
        """The next line it prints, "" when none comes within `timeout` seconds."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                return ""
        return self.process.stdout.readline()

    def errors(self):
        """What it has written to standard error ("" without `stderr_path`)."""
        if not self.stderr_path:
            return ""
        with open(self.stderr_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    @property
    def pid(self):
        return self.process.pid

    def status(self):
        return requests.get(self.url, timeout=30).json()["model_version_status"]

    def states(self):
        """[(version, state, error_code)] of GET /v1/models/sat, newest first."""
        try:
            listed = self.status()
        except KeyError:
            return []
        return [(int(s["version"]), s["state"], s["status"]["error_code"]) for s in listed]

    def rss_mb(self):
        with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
            return int(next(x for x in f if x.startswith("VmRSS:")).split()[1]) / 1024

    def threads(self):
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends `sig`; the exit status (the process killed after `timeout` seconds)."""
        self.channel.close()
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise
        finally:
            self.stderr.close()

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if not self.stderr.closed:
            self.stderr.close()


def elapsed(start):
    return time.monotonic() - start
