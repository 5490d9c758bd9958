"""Tests for sat_tf.serving.warmup: the file an export carries reads back as the requests
written (their images decode to the pixels generated), and every broken file is refused
with its canonical code and the file named: corrupt bytes, a record that is no
PredictionLog, a log of another kind, more records than TF Serving reads."""

import os
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from sat_tf.serving import warmup


def write_records(path, records):
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)


class WarmupTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(dir=self.get_temp_dir())
        self.path = os.path.join(self.dir, warmup.WARMUP_FILE)

    def test_written_requests_read_back(self):
        path = warmup.write_warmup(self.dir, batch_sizes=(1, 3))
        self.assertEqual(path, self.path)
        requests = warmup.read_warmup(path)
        self.assertLen(requests, 2)
        rng = np.random.default_rng(0)
        for request, size in zip(requests, (1, 3), strict=True):
            self.assertEqual(request.model_spec.signature_name, "serving_default")
            images = tf.make_ndarray(request.inputs["image_bytes"])
            self.assertEqual(images.shape, (size,))
            want = rng.integers(0, 256, (size, 64, 64, 3), dtype=np.uint8)
            got = np.stack([tf.io.decode_png(x).numpy() for x in images])
            self.assertAllEqual(got, want)  # PNG is lossless

    def test_the_default_sizes(self):
        requests = warmup.read_warmup(warmup.write_warmup(self.dir))
        got = [len(r.inputs["image_bytes"].string_val) for r in requests]
        self.assertEqual(got, list(warmup.BATCH_SIZES))

    def test_corrupt_bytes_are_data_loss(self):
        warmup.write_warmup(self.dir, batch_sizes=(2,))
        with open(self.path, "r+b") as f:
            f.seek(20)
            f.write(b"\xff" * 8)
        with self.assertRaises(warmup.WarmupError) as raised:
            warmup.read_warmup(self.path)
        self.assertEqual(raised.exception.code, "DATA_LOSS")
        self.assertIn(self.path, str(raised.exception))

    def test_a_record_that_is_no_prediction_log(self):
        write_records(self.path, [b"\x0a\xff\xff\xff"])
        with self.assertRaisesRegex(warmup.WarmupError, "record 0 is not a PredictionLog"):
            warmup.read_warmup(self.path)

    def test_a_log_of_another_kind(self):
        log = prediction_log_pb2.PredictionLog()
        log.classify_log.request.model_spec.name = "sat"
        write_records(self.path, [log.SerializeToString()])
        with self.assertRaises(warmup.WarmupError) as raised:
            warmup.read_warmup(self.path)
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("record 0 is a classify_log log", str(raised.exception))

    def test_more_records_than_tf_serving_reads(self):
        log = prediction_log_pb2.PredictionLog()
        log.predict_log.request.model_spec.signature_name = "serving_default"
        record = log.SerializeToString()
        write_records(self.path, [record] * warmup.MAX_RECORDS)
        self.assertLen(warmup.read_warmup(self.path), warmup.MAX_RECORDS)
        write_records(self.path, [record] * (warmup.MAX_RECORDS + 1))
        with self.assertRaisesRegex(warmup.WarmupError, "more than 1000 records"):
            warmup.read_warmup(self.path)


if __name__ == "__main__":
    tf.test.main()
