"""Captions image files with a sat_tf export served by TF Serving, over gRPC.

  python export/serving/grpc_client.py --server=localhost:8500 photo.jpg other.png

Sends the encoded bytes to the `serving_default` signature (decoding, resizing and
captioning run in the server) and prints one caption per image.
"""

import sys

import tensorflow as tf
from absl import app, flags
from tensorflow_serving.apis import predict_pb2

FLAGS = flags.FLAGS


def predict_request(images, model_name="sat", signature_name="serving_default"):
    """A `PredictRequest` carrying encoded images as the `image_bytes` input.

    Args:
      images: list of bytes, each a JPEG / PNG / GIF / BMP / WebP file's content.
      model_name: the model's name on the server.
      signature_name: "serving_default" (the only signature that takes bytes).

    Returns:
      `predict_pb2.PredictRequest`.
    """
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(list(images), tf.string))
    return request


def parse_response(response):
    """One dict per image from a `PredictResponse`.

    Returns:
      list of {"caption": str, "tokens": [int] (the caption's words and `<end>` if
      emitted), "log_prob": float, "attention": (T, H, W) array, "status": int (0 for a
      caption; 1 empty, 2 not an image, 3 truncated or corrupt, 4 too many pixels: the
      caption is then empty), "error": str ('' or the reason, one line)}. An export
      made before the status outputs gives status 0 and error ''.
    """
    out = {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}
    results = []
    for i, caption in enumerate(out["caption"]):
        n = int(out["length"][i])
        results.append(
            {
                "caption": caption.decode("utf-8"),
                "tokens": out["tokens"][i][: n + 1].tolist(),
                "log_prob": float(out["log_prob"][i]),
                "attention": out["attention"][i],
                "status": int(out["status"][i]) if "status" in out else 0,
                "error": out["error"][i].decode("utf-8") if "error" in out else "",
            }
        )
    return results


def describe(path, result):
    """The line printed for one image: its caption, or why it has none."""
    if result["status"]:
        return f"{path}: error: {result['error']}"
    return f"{path}: {result['caption']}  (log p = {result['log_prob']:.3f})"


def define_flags():
    """Command-line flags; defined only when run as a script, not on import."""
    flags.DEFINE_string("server", "localhost:8500", "host:port of the model server's gRPC API.")
    flags.DEFINE_string("model_name", "sat", "Model name in models.config.")
    flags.DEFINE_float("timeout", 30.0, "Seconds to wait for the answer.")


def main(argv):
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    paths = argv[1:]
    if not paths:
        sys.exit("error: give one or more image files")
    images = []
    for path in paths:
        with open(path, "rb") as f:
            images.append(f.read())
    channel = grpc.insecure_channel(FLAGS.server)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
        response = stub.Predict(predict_request(images, FLAGS.model_name), FLAGS.timeout)
    except grpc.RpcError as e:
        sys.exit(f"error: {e.code().name}: {e.details()}")
    for path, result in zip(paths, parse_response(response), strict=True):
        print(describe(path, result))


if __name__ == "__main__":
    define_flags()
    app.run(main)
