"""Tests for sat_tf.server.http_server over raw sockets and http.client on 127.0.0.1: a
body over the limit is 413 in JSON (Content-Length or chunked), a body of exactly the
limit reaches the app, waitress's other refusals are JSON too; and a drain refuses new
connections while the open ones are answered (with Connection: close) and a request in
flight finishes."""

import http.client
import json
import socket
import threading
import time

from absl.testing import absltest

from sat_tf.server.http_server import RestServer

LIMIT = 1000


class Echo:
    """A WSGI app answering the size of the body it read; `hold` keeps it from answering
    a body of b"wait" until `release` is set."""

    def __init__(self):
        self.release, self.holding = threading.Event(), threading.Event()

    def __call__(self, environ, start_response):
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        if body == b"wait":
            self.holding.set()
            self.release.wait(30)
        data = json.dumps({"bytes": len(body)}).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [data]


def raw(port, data):
    """The status line, headers and body of the answer to raw request bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.decode(), body


class RestServerTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.app = Echo()
        self.addCleanup(self.app.release.set)
        self.server = RestServer(self.app, "127.0.0.1", 0, 4, LIMIT)
        self.addCleanup(self.server.stop, 5)

    def connection(self):
        return http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)

    def post(self, connection, body):
        connection.request("POST", "/v1/models/m:predict", body)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Connection"), answer.read()

    def test_a_body_of_the_limit_is_taken_one_over_is_413_in_json(self):
        status, _, body = self.post(self.connection(), b"x" * LIMIT)
        self.assertEqual((status, json.loads(body)), (200, {"bytes": LIMIT}))
        head, body = raw(
            self.server.port,
            f"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT + 1}"
            "\r\n\r\n".encode(),
        )
        self.assertTrue(head.startswith("HTTP/1.1 413 Request Entity Too Large"), head)
        self.assertIn("Content-Type: application/json", head)
        self.assertEqual(
            json.loads(body), {"error": "the request body is over --max_body_bytes (1000 bytes)"}
        )

    def test_a_chunked_body_over_the_limit(self):
        chunk = b"x" * 600
        head, body = raw(
            self.server.port,
            b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2
            + b"0\r\n\r\n",
        )
        self.assertTrue(head.startswith("HTTP/1.1 413"), head)
        self.assertIn("--max_body_bytes", json.loads(body)["error"])

    def test_waitress_refusals_are_json(self):
        head, body = raw(self.server.port, b"GARBAGE\r\n\r\n")
        self.assertTrue(head.startswith("HTTP/1.0 400 Bad Request"), head)  # no version given
        self.assertIn("Content-Type: application/json", head)
        self.assertStartsWith(json.loads(body)["error"], "Bad Request: ")

    def test_a_drain_answers_what_it_accepted_and_refuses_new_connections(self):
        kept = self.connection()
        self.assertEqual(self.post(kept, b"ab")[:2], (200, None))  # kept alive
        held = self.connection()
        answers = []
        thread = threading.Thread(target=lambda: answers.append(self.post(held, b"wait")))
        thread.start()
        self.assertTrue(self.app.holding.wait(10))
        self.server.stop_accepting()
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.server.port), timeout=5)
        status, connection, body = self.post(kept, b"abc")
        self.assertEqual((status, connection, json.loads(body)), (200, "close", {"bytes": 3}))
        self.app.release.set()
        thread.join(30)
        self.assertEqual(answers[0][0], 200)
        start = time.monotonic()
        self.server.stop(10)
        self.assertLess(time.monotonic() - start, 5)


if __name__ == "__main__":
    absltest.main()
