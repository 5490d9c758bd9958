"""Tests for the SavedModel's per-image `status` and `error` outputs: a batch mixing good
images, a bomb, text, a truncated file and an empty string gives each its status and
one-line reason, the good ones their captions; the same through TF Serving's session
loader and its clients; a bomb refused in the graph in seconds and under a gigabyte."""

import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import tensorflow as tf
from admission_test import encode, png_bomb
from fixtures import tiny_model

from sat_tf.data import image_io

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "export", "serving"))

import grpc_client  # noqa: E402
import rest_client  # noqa: E402

from sat_tf.serving import exporting  # noqa: E402


class ServingStatusTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = tempfile.mkdtemp()
        model, vocab, config = tiny_model()
        cls.export = os.path.join(cls.dir, "export")
        cls.info = exporting.export(model, vocab, config, cls.export)
        cls.good = encode("PNG", 50, 40)
        cls.batch = [
            cls.good,
            png_bomb(),
            b"text",
            encode("JPEG", 64, 64)[:300],
            b"",
            cls.good,
        ]

    def test_each_image_gets_its_status_and_the_good_ones_their_caption(self):
        serve = tf.saved_model.load(self.export).signatures["serving_default"]
        out = {k: v.numpy() for k, v in serve(image_bytes=tf.constant(self.batch)).items()}
        alone = serve(image_bytes=tf.constant([self.good]))
        self.assertEqual(out["status"].tolist(), [0, 4, 2, 3, 1, 0])
        self.assertEqual(out["status"].dtype, np.int32)
        self.assertEqual(
            [e.decode() for e in out["error"]],
            [
                "",
                "image_bytes[1]: 529,000,000 pixels (23000 x 23000) is over the limit of "
                "50,000,000; max_image_pixels (--max_image_pixels) sets it",
                "image_bytes[2] (4 bytes) is not a JPEG, PNG, GIF, BMP or WebP image",
                "image_bytes[3] (300 bytes) is a truncated or corrupt JPEG file",
                "image_bytes[4] is empty (0 bytes)",
                "",
            ],
        )
        want = alone["caption"].numpy()[0]
        self.assertNotEqual(want, b"")
        self.assertEqual(out["caption"].tolist(), [want, b"", b"", b"", b"", want])
        self.assertAllEqual(out["length"][1:5], [0] * 4)
        self.assertAllEqual(out["attention"][1:5], np.zeros_like(out["attention"][1:5]))
        want_log_prob = alone["log_prob"].numpy()[0]  # at batch 1: rounded differently
        self.assertAllClose(out["log_prob"][0], want_log_prob, rtol=1e-5, atol=1e-5)
        self.assertEqual(self.info["max_image_pixels"], image_io.MAX_IMAGE_PIXELS)

    def test_the_session_loader_path_and_its_clients(self):
        from export_test import session_predict, session_rest_predict

        with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
            meta_graph = tf.compat.v1.saved_model.loader.load(
                session, [tf.saved_model.SERVING], self.export
            )
            request = grpc_client.predict_request(self.batch, model_name="sat")
            results = grpc_client.parse_response(session_predict(session, meta_graph, request))
            body = rest_client.request_body(self.batch)
            predictions = session_rest_predict(session, meta_graph, body)["predictions"]
        self.assertEqual([r["status"] for r in results], [0, 4, 2, 3, 1, 0])
        self.assertEqual([p["status"] for p in predictions], [0, 4, 2, 3, 1, 0])
        self.assertEqual(
            grpc_client.describe("bomb.png", results[1]),
            "bomb.png: error: image_bytes[1]: 529,000,000 pixels (23000 x 23000) is over the "
            "limit of 50,000,000; max_image_pixels (--max_image_pixels) sets it",
        )
        self.assertEqual(
            rest_client.describe("cut.jpg", predictions[3]),
            "cut.jpg: error: image_bytes[3] (300 bytes) is a truncated or corrupt JPEG file",
        )
        self.assertStartsWith(grpc_client.describe("a.png", results[0]), "a.png: ")
        self.assertIn("(log p = ", rest_client.describe("a.png", predictions[0]))

    def test_a_bomb_is_refused_in_seconds_and_under_a_gigabyte(self):
        script = textwrap.dedent(
            """
            import resource, sys, time
            import tensorflow as tf
            sys.path.insert(0, "tests")
            from admission_test import png_bomb
            serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
            serve(image_bytes=tf.constant([png_bomb(8, 8)]))
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            start = time.perf_counter()
            out = serve(image_bytes=tf.constant([png_bomb()]))
            seconds = time.perf_counter() - start
            assert int(out["status"][0]) == 4, out
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            print(seconds, grown // 1024)
            """
        )
        env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run(
            [sys.executable, "-c", script, self.export],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        seconds, grown_mb = done.stdout.split()[-2:]
        self.assertLess(float(seconds), 5)
        self.assertLess(int(grown_mb), 1024)


if __name__ == "__main__":
    tf.test.main()
