"""Tests for sat_tf.server.lifecycle in this process: a port that cannot be bound ends the
start with one line naming its flag and leaves the other port free; `run` over the tiny
export announces its ports, answers (with another page and gRPC service added, its
listeners hearing the versions and the drain), drains on SIGTERM and returns 0; a model that never
loads ends `run` with the reason; `manager_of` reads the batching, warm-up and label flags."""

import os
import shutil
import signal
import socket
import threading

import requests
import tensorflow as tf
from fixtures import tiny_export
from server_process import serve_in_process

from sat_tf.server import batching, lifecycle, observer, options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Heard(observer.Listener):
    def __init__(self):
        self.events = []

    def version_changed(self, status):
        self.events.append(f"{status.version} {status.state}")

    def draining(self):
        self.events.append("draining")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bindable(port):
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class LifecycleTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.base, cls.manager, cls.server = serve_in_process(cls)
        cls.root = os.path.dirname(cls.base)

    def settings(self, **values):
        base = {"host": "127.0.0.1", "rest_api_num_threads": 4, "model_base_path": self.base}
        return options.ServerOptions(**{**base, **values})

    def test_a_grpc_port_taken(self):
        rest = free_port()
        settings = self.settings(port=self.server.grpc_port, rest_api_port=rest)
        with self.assertRaises(lifecycle.StartError) as raised:
            lifecycle.Server(self.manager, settings)
        self.assertStartsWith(
            str(raised.exception),
            f"cannot serve gRPC on 127.0.0.1:{self.server.grpc_port} (--port)",
        )
        self.assertTrue(bindable(rest))

    def test_a_rest_port_taken(self):
        grpc_port = free_port()
        settings = self.settings(port=grpc_port, rest_api_port=self.server.rest_port)
        with self.assertRaises(lifecycle.StartError) as raised:
            lifecycle.Server(self.manager, settings)
        self.assertEqual(
            str(raised.exception),
            f"cannot serve REST on 127.0.0.1:{self.server.rest_port} (--rest_api_port): "
            "Address already in use",
        )
        self.assertTrue(bindable(grpc_port))

    def test_run_serves_until_sigterm(self):
        lines, answers, added = [], [], []
        heard = Heard()

        def hello(environ, start_response):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"hello"]

        def announce(line):
            lines.append(line)
            if line.startswith("serving"):
                port = line.split("REST on 127.0.0.1:")[1].split(",")[0]
                url = f"http://127.0.0.1:{port}"

                def use_then_stop():
                    answers.append(requests.get(url + "/v1/models/sat", timeout=30).status_code)
                    answers.append(requests.get(url + "/hello", timeout=30).text)
                    os.kill(os.getpid(), signal.SIGTERM)

                threading.Thread(target=use_then_stop).start()

        settings = self.settings(port=0, rest_api_port=0, drain_seconds=5)
        before = signal.getsignal(signal.SIGTERM)
        code = lifecycle.run(
            settings,
            announce,
            listeners=[heard],
            routes={"/hello": hello},
            grpc_services=[added.append],
        )
        self.assertEqual(code, 0)
        self.assertEqual(answers, [200, "hello"])
        self.assertLen(added, 1)  # the gRPC server, to add services to
        self.assertEqual(len(lines), 2)
        self.assertStartsWith(lines[0], f"serving sat from {self.base}: REST on 127.0.0.1:")
        self.assertEqual(lines[1], "stopped")
        self.assertIs(signal.getsignal(signal.SIGTERM), before)
        self.assertEqual(heard.events[:3], ["1 START", "1 LOADING", "1 AVAILABLE"])
        self.assertEqual(heard.events[3:], ["draining", "1 UNLOADING", "1 END"])

    def test_a_model_that_never_loads_ends_the_start(self):
        base = os.path.join(self.root, "broken")
        shutil.copytree(tiny_export(), os.path.join(base, "5"))
        os.remove(os.path.join(base, "5", "saved_model.pb"))
        with open(os.path.join(base, "5", "saved_model.pb"), "wb") as f:
            f.write(b"\x0a\xff\xff\xff")
        settings = self.settings(
            model_base_path=base, port=0, rest_api_port=0, max_num_load_retries=0
        )
        with self.assertRaises(lifecycle.StartError) as raised:
            lifecycle.run(settings, lambda line: None)
        self.assertStartsWith(
            str(raised.exception), "model sat did not become available (version 5: DATA_LOSS: "
        )

    def test_the_manager_of_the_flags(self):
        off = lifecycle.manager_of(self.settings(enable_batching=False))
        self.assertIsNone(off.options.parameters)
        default = lifecycle.manager_of(self.settings(load_retry_interval_micros=1500))
        self.assertEqual(default.options.parameters, batching.SERVE_DEFAULTS)
        self.assertEqual(default.options.load_retry_interval_seconds, 0.0015)
        path = os.path.join(self.root, "batching.txt")
        with open(path, "w") as f:
            f.write("max_batch_size { value: 4 } num_batch_threads { value: 2 }")
        read = lifecycle.manager_of(self.settings(batching_parameters_file=path))
        self.assertEqual(read.options.parameters.max_batch_size, 4)
        (model,) = read.config.model_config_list.config
        self.assertEqual((model.name, model.base_path), ("sat", self.base))
        self.assertEqual(read.options.warmup_iterations, 1)
        self.assertFalse(read.options.per_model_batching_parameters)
        self.assertFalse(read.options.allow_version_labels_for_unavailable_models)
        flags = lifecycle.manager_of(
            self.settings(
                num_request_iterations_for_warmup=3,
                enable_per_model_batching_parameters=True,
                allow_version_labels_for_unavailable_models=True,
            )
        )
        self.assertEqual(flags.options.warmup_iterations, 3)
        self.assertTrue(flags.options.per_model_batching_parameters)
        self.assertTrue(flags.options.allow_version_labels_for_unavailable_models)
        off = lifecycle.manager_of(self.settings(enable_model_warmup=False))
        self.assertEqual(off.options.warmup_iterations, 0)
        zero = lifecycle.manager_of(self.settings(num_request_iterations_for_warmup=0))
        self.assertEqual(zero.options.warmup_iterations, 1)


if __name__ == "__main__":
    tf.test.main()
