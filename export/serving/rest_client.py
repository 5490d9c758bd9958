"""Captions image files with a sat_tf export served by TF Serving, over its REST API.

  python export/serving/rest_client.py --server=http://localhost:8501 photo.jpg
  python export/serving/rest_client.py --write_body=request.json photo.jpg   # for curl

The body is TF Serving's row format with the bytes base64-encoded:
  {"signature_name": "serving_default", "instances": [{"image_bytes": {"b64": "..."}}]}
Needs only the standard library and absl-py, so it runs without TensorFlow.
"""

import base64
import json
import sys
import urllib.error
import urllib.request

from absl import app, flags

FLAGS = flags.FLAGS


def request_body(images, signature_name="serving_default"):
    """The JSON body (as a dict) of a predict request for encoded images."""
    instances = [
        {"image_bytes": {"b64": base64.b64encode(data).decode("ascii")}} for data in images
    ]
    return {"signature_name": signature_name, "instances": instances}


def predict(url, body, timeout=30.0):
    """POSTs `body` to a `:predict` URL and returns the decoded JSON answer.

    Raises:
      RuntimeError: with the server's error message when it refuses the request.
    """
    request = urllib.request.Request(
        url, data=json.dumps(body).encode("utf-8"), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read().decode('utf-8', 'replace')}") from None


def describe(path, prediction):
    """The line printed for one image: its caption, or why it has none (`status` 1
    empty, 2 not an image, 3 truncated or corrupt, 4 too many pixels; `error` says it)."""
    if prediction.get("status", 0):
        return f"{path}: error: {prediction['error']}"
    return f"{path}: {prediction['caption']}  (log p = {prediction['log_prob']:.3f})"


def define_flags():
    """Command-line flags; defined only when run as a script, not on import."""
    flags.DEFINE_string("server", "http://localhost:8501", "Base URL of the REST API.")
    flags.DEFINE_string("model_name", "sat", "Model name in models.config.")
    flags.DEFINE_string("write_body", "", "Write the request body to this file instead of sending.")
    flags.DEFINE_float("timeout", 30.0, "Seconds to wait for the answer.")


def main(argv):
    paths = argv[1:]
    if not paths:
        sys.exit("error: give one or more image files")
    images = []
    for path in paths:
        with open(path, "rb") as f:
            images.append(f.read())
    body = request_body(images)
    if FLAGS.write_body:
        with open(FLAGS.write_body, "w", encoding="utf-8") as f:
            json.dump(body, f)
        print(f"wrote {FLAGS.write_body}")
        return
    url = f"{FLAGS.server.rstrip('/')}/v1/models/{FLAGS.model_name}:predict"
    try:
        answer = predict(url, body, FLAGS.timeout)
    except (RuntimeError, urllib.error.URLError) as e:
        sys.exit(f"error: {e}")
    for path, prediction in zip(paths, answer["predictions"], strict=True):
        print(describe(path, prediction))


if __name__ == "__main__":
    define_flags()
    app.run(main)
