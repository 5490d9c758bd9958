"""TF Serving's warm-up file: `assets.extra/tf_serving_warmup_requests` in a SavedModel, a
TFRecord file of `PredictionLog`s whose requests a model server runs before it calls a
version AVAILABLE, so that the first user does not wait for the graphs to be traced.

`write_warmup` is what `exporting.export` puts in every export (`serving_default` on
generated PNGs at `BATCH_SIZES`); `read_warmup` is how sat-serve reads one, with TF
Serving's limit of `MAX_RECORDS` records. Both go through TensorFlow's file system layer,
so an export on gs:// reads as a local one.
"""

import os

import numpy as np
import tensorflow as tf

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
DEFAULT_SIGNATURE = "serving_default"
# One image, and the batch sat-serve runs at once with its shipped batching parameters
# (export/serving/batching_parameters.txt; tests/batching_test.py holds the two equal).
BATCH_SIZES = (1, 16)
# TF Serving refuses a warm-up file with more records (saved_model_warmup_util.cc).
MAX_RECORDS = 1000


class WarmupError(ValueError):
    """A warm-up file that cannot be read: `code` is the canonical code of what is wrong
    (DATA_LOSS for a corrupt record, INVALID_ARGUMENT for a record sat-serve cannot run)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def read_warmup(path: str) -> list:
    """The `PredictRequest`s of a warm-up file, in its order.

    Raises:
      WarmupError: naming `path` and the record, for a corrupt file, a record that is
        not a `PredictionLog` of a predict request, or more than `MAX_RECORDS` records.
    """
    from google.protobuf import message
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    records = iter(tf.data.TFRecordDataset(path))
    while True:
        try:
            record = next(records)
        except StopIteration:
            return requests
        except tf.errors.OpError as e:
            raise WarmupError("DATA_LOSS", f"warm-up file {path}: {e.message}") from None
        if len(requests) == MAX_RECORDS:
            raise WarmupError(
                "INVALID_ARGUMENT",
                f"warm-up file {path} holds more than {MAX_RECORDS} records (TF Serving's limit)",
            )
        try:
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        except message.DecodeError:
            raise WarmupError(
                "DATA_LOSS", f"warm-up file {path}: record {len(requests)} is not a PredictionLog"
            ) from None
        kind = log.WhichOneof("log_type")
        if kind != "predict_log":
            raise WarmupError(
                "INVALID_ARGUMENT",
                f"warm-up file {path}: record {len(requests)} is a {kind or 'empty'} log; "
                "sat-serve runs predict logs",
            )
        requests.append(log.predict_log.request)


def write_warmup(export_dir: str, batch_sizes=BATCH_SIZES) -> str:
    """Writes `WARMUP_FILE` into `export_dir`: one `serving_default` predict request of
    generated 64 x 64 PNG images per batch size. Returns the file's path."""
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    rng = np.random.default_rng(0)
    path = os.path.join(export_dir, WARMUP_FILE)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for size in batch_sizes:
            pixels = rng.integers(0, 256, (size, 64, 64, 3), dtype=np.uint8)
            images = [tf.io.encode_png(p).numpy() for p in pixels]
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = DEFAULT_SIGNATURE
            request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(images, tf.string))
            log = prediction_log_pb2.PredictionLog()
            log.predict_log.request.CopyFrom(request)
            writer.write(log.SerializeToString())
    return path
