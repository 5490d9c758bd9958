"""A local web page to try a captioner: upload or drop a photo, read its caption and see
where the model looked for every word (paper Fig. 3).

The page is driven by exported SavedModels (`exporting`), each loaded once with
`tf.saved_model.load`: a caption comes from the `serving_default` signature — the
outputs TF Serving would return — and never from a second path through the Python
model; a beam export's page shows the beam's other captions under it with their
probabilities, from `caption_alternatives` (serving_default's outputs and the attention
of each), and the attention of the one clicked. Beam size is fixed in a SavedModel when
it is exported, so the page offers one decoding per export (`export_decodings` writes a
greedy and a beam-3 export of a trained model). Each export is a
`model_server.Servable`, as sat-serve loads it: concurrent requests for one decoding run
as one call of the signature (`batching.Batcher`, sat-serve's `batching.SERVE_DEFAULTS`),
and the export's warm-up requests run before the page is served. Per-word pictures are
`visualize.upsample_attention` and `visualize.overlay_attention` of the signature's
`attention` over the centre crop the model saw (`image_io.decode_image`).

`create_app` returns a Flask app; `serve` runs it on 127.0.0.1 with Werkzeug's
threaded server. Nothing here reads flags or writes files.
"""

import base64
import dataclasses
import io
import json
import logging
import math
import os
import socket
import time
from collections.abc import Sequence
from importlib import resources

import flask
import numpy as np
import tensorflow as tf
from PIL import Image
from werkzeug import exceptions, serving

from sat_tf.data import image_io
from sat_tf.evaluation import visualize
from sat_tf.server import batching
from sat_tf.server import servable as model_server
from sat_tf.serving import exporting

HOST = "127.0.0.1"
ASSETS = {"index.html": "text/html", "demo.js": "text/javascript", "demo.css": "text/css"}
SAMPLE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
MAX_SAMPLES = 8
# Side of the pictures on the page: the paper's Fig. 3 scale (x16 for a 14 x 14 grid).
DISPLAY_SIZE = 224
# Room for the multipart headers around the image in an upload.
_FORM_OVERHEAD = 64 * 1024
# A first call of a signature (or of the eager decoding of the page's pictures) is several
# times slower than later ones, so an export without warm-up requests captions this 1 x 1
# PNG once at load.
_WARM_UP_IMAGE = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNgYGAAAAAEAAH2FzhVAAAAAElFTkSuQmCC"
)

_log = logging.getLogger(__name__)


class ImageError(ValueError):
    """An upload the demo cannot caption; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the demo accepts, checked before the model runs.

    Attributes:
      max_bytes: largest upload. A 12-megapixel phone JPEG is 3-6 MB and the model sees
        it at a few hundred pixels, so larger files only cost upload and decode time.
      max_pixels: most pixels (width x height) of a decoded image; 48-megapixel phone
        photos pass, a small file that decodes to gigabytes (a "decompression bomb")
        does not.
      max_aspect: longest side / shortest side. The model captions the centre square
        (paper §5.4), so at 4:1 it already sees only a quarter of the image.
    """

    max_bytes: int = 10 * 2**20
    max_pixels: int = image_io.MAX_IMAGE_PIXELS
    max_aspect: float = 4.0


def _megabytes(size):
    return f"{size / 2**20:.1f} MB"


def decoding_name(beam_size: int) -> str:
    """ "greedy" for beam size 1, else "beam <k>"."""
    return "greedy" if beam_size == 1 else f"beam {beam_size}"


class ExportedCaptioner:
    """The `serving_default` signature of one export, loaded once and batched.

    Attributes:
      path: the export directory.
      info: its `sat_tf_export.json` (`exporting.export` returns the same dict).
      beam_size: the beam size fixed in the graph; 1 is greedy.
      name: `decoding_name(beam_size)`.
      warmup_requests: how many of the export's warm-up requests ran at load (0 for an
        export without them: it captions a 1 x 1 PNG instead).
      servable: the `model_server.Servable` (its `batchers` count the signature's calls).
      signature: the signature the page calls: `caption_alternatives` for an export of
        a beam (its K > 1 captions), else `serving_default`.
    """

    def __init__(
        self, path: str, parameters: batching.BatchingParameters = batching.SERVE_DEFAULTS
    ):
        """Loads the SavedModel in `path` and warms it up.

        Args:
          path: the export directory.
          parameters: how concurrent requests are batched (sat-serve's defaults).

        Raises:
          ValueError: when `path` is not a directory written by `exporting.export`.
        """
        self.path = os.path.abspath(path)
        info_path = os.path.join(self.path, exporting.EXPORT_INFO)
        if not os.path.isdir(self.path):
            raise ValueError(f"export {path!r} is not a directory")
        if not os.path.exists(info_path):
            raise ValueError(
                f"export {path!r} has no {exporting.EXPORT_INFO}: "
                "give a folder written by export/export.py"
            )
        with open(info_path, encoding="utf-8") as f:
            self.info = json.load(f)
        self.beam_size = int(self.info["beam_size"])
        self.name = decoding_name(self.beam_size)
        self.servable = model_server.Servable(self.path, 1, parameters)
        self.signature = model_server.DEFAULT_SIGNATURE
        if exporting.ALTERNATIVES in self.servable.signature_defs:
            self.signature = exporting.ALTERNATIVES
        try:
            self.warmup_requests = self.servable.warm_up()
        except ImportError:  # the file is read with tensorflow-serving-api (the export extra)
            self.warmup_requests = 0
        # The warm-up requests are serving_default's.
        if not self.warmup_requests or self.signature != model_server.DEFAULT_SIGNATURE:
            self(_WARM_UP_IMAGE, "the warm-up image")

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.info["grid"])

    @property
    def hard(self) -> bool:
        """Whether the model reads one cell per word: hard attention decoded at argmax α
        (an export made before `hard_decoding` existed always was)."""
        config = self.info.get("config", {})
        return (
            config.get("attention") == "hard" and config.get("hard_decoding", "argmax") == "argmax"
        )

    def __call__(self, data: bytes, name: str) -> dict:
        """Captions one encoded image with `serving_default`.

        Args:
          data: the image file's bytes.
          name: the file's name, used in errors.

        Returns:
          {caption: str, tokens: int32 (T,), length: int, log_prob: float,
          attention: float32 (T, H, W), tag: the ImageNet tag the caption was made to say
          ("" for none, or an export without tags), alternatives: the beam's captions,
          best first (the caption first; only it for a greedy export or one without
          `caption_alternatives`), each {caption, length, log_prob, attention}}, and
          off_world_score: float and off_world: bool for an export with off-world
          statistics.

        Raises:
          ImageError: naming `name` when the signature gives no caption (its `status`
            and `error` outputs; an older export fails instead): empty, not an image,
            truncated or corrupt, too many pixels.
        """
        try:
            out = self.servable.predict(
                self.signature, {"image_bytes": np.array([data], dtype=object)}
            )
        except model_server.ServingError as e:
            if e.code != "INVALID_ARGUMENT":
                raise
            raise ImageError(e.message.replace("image_bytes[0]", name, 1)) from None
        if "status" in out and int(out["status"][0]) != 0:  # exports since the status output
            reason = out["error"][0].decode("utf-8")
            raise ImageError(reason.replace("image_bytes[0]", name, 1))
        result = {
            "caption": out["caption"][0].decode("utf-8"),
            "tokens": out["tokens"][0],
            "length": int(out["length"][0]),
            "log_prob": float(out["log_prob"][0]),
            "attention": out["attention"][0],
            "tag": out["tag"][0].decode("utf-8") if "tag" in out else "",
            **{k: out[k][0].item() for k in ("off_world_score", "off_world") if k in out},
        }
        first = {k: result[k] for k in ("caption", "length", "log_prob", "attention")}
        result["alternatives"] = [first]
        if "attentions" in out:
            pairs = zip(out["captions"][0], out["log_probs"][0], out["attentions"][0], strict=True)
            result["alternatives"] += [
                {
                    "caption": text.decode("utf-8"),
                    "length": len(text.split()),
                    "log_prob": float(log_prob),
                    "attention": attention,
                }
                for text, log_prob, attention in list(pairs)[1:]
                if log_prob > -np.inf
            ]
        return result

    def close(self) -> None:
        """Stops the batch threads (after what is queued)."""
        self.servable.close()


def load_captioners(
    paths: Sequence[str], parameters: batching.BatchingParameters = batching.SERVE_DEFAULTS
) -> list[ExportedCaptioner]:
    """Loads one or two exports, each offering the decoding it was exported with.

    Args:
      paths: export directories.
      parameters: how each one batches concurrent requests.

    Returns:
      their `ExportedCaptioner`s, by beam size.

    Raises:
      ValueError: for no path or more than two, a folder that is not an export, two
        exports with the same beam size, or exports of different vocabularies.
    """
    if not 1 <= len(paths) <= 2:
        raise ValueError(f"give one or two export folders, got {len(paths)}: {list(paths)}")
    captioners = sorted(
        (ExportedCaptioner(p, parameters) for p in paths), key=lambda c: c.beam_size
    )
    if len(captioners) == 2:
        first, second = captioners
        if first.beam_size == second.beam_size:
            raise ValueError(
                f"exports {first.path} and {second.path} both decode with beam size "
                f"{first.beam_size}; give exports with different --beam_size"
            )
        fingerprints = {c.info.get("vocab_fingerprint") for c in captioners}
        if len(fingerprints) > 1:
            raise ValueError(
                f"exports {first.path} and {second.path} have different vocabularies: "
                "give two exports of one trained model"
            )
    return captioners


def export_decodings(
    trained, folder: str, beam_sizes: Sequence[int] = (1, 3), off_world=None
) -> list[str]:
    """Exports a trained model once per beam size, for `load_captioners`.

    Args:
      trained: `(model, vocab, config)` of a workdir (`inference.load_workdir`) or a preset
        (`inference.load_preset`).
      folder: where the exports go, one subfolder per beam size (a temporary folder).
      beam_sizes: the decodings to offer.
      off_world: the model's `off_world.Stats`, for the off-world score on the page.

    Returns:
      the export directories, in `beam_sizes` order.
    """
    model, vocab, config = trained
    paths = []
    for beam_size in beam_sizes:
        path = os.path.join(folder, decoding_name(beam_size).replace(" ", ""))
        exporting.export(model, vocab, config, path, beam_size=beam_size, off_world=off_world)
        paths.append(path)
    return paths


def find_samples(folder: str, limit: int = MAX_SAMPLES) -> list[str]:
    """The first `limit` image files (by name) in `folder`, offered as samples.

    Raises:
      ValueError: when `folder` is not a directory or holds no image file.
    """
    if not os.path.isdir(folder):
        raise ValueError(f"samples folder {folder!r} is not a directory")
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(SAMPLE_SUFFIXES))
    if not names:
        raise ValueError(f"samples folder {folder!r} holds no {'/'.join(SAMPLE_SUFFIXES)} file")
    return [os.path.join(folder, n) for n in names[:limit]]


def check_image(data: bytes, name: str, limits: Limits) -> None:
    """Refuses an upload that breaks `limits`, reading only the image's header: the
    package's admission rule (`image_io.admit`) with the demo's pixel limit, then the
    demo's own aspect limit.

    Raises:
      ImageError: naming `name` and what is wrong (empty, not an image, a damaged
        header), or its size and the limit it breaks.
    """
    if len(data) > limits.max_bytes:
        raise ImageError(
            f"{name} is {_megabytes(len(data))}; the demo takes images up to "
            f"{_megabytes(limits.max_bytes)}"
        )
    limit = f"{limits.max_pixels / 1e6:g} megapixels"
    try:
        header = image_io.admit(data, name, limits.max_pixels)
    except image_io.ImageError as e:
        if e.status != image_io.TOO_MANY_PIXELS:
            raise ImageError(str(e)) from None
        _, header = image_io.read_header(data)
        raise ImageError(
            f"{name} is {header.width} x {header.height} pixels "
            f"({header.pixels / 1e6:.0f} megapixels); the demo takes up to {limit}"
        ) from None
    width, height = header.width, header.height
    aspect = max(width, height) / min(width, height)
    if aspect > limits.max_aspect:
        raise ImageError(
            f"{name} is {width} x {height} pixels, {aspect:.0f}:1; the model captions the "
            f"centre square of an image, so the demo takes sides up to "
            f"{limits.max_aspect:g}:1 (crop it first)"
        )


def _data_url(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=92)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def display_pixels(
    data: bytes, captioner: ExportedCaptioner, size: int = DISPLAY_SIZE
) -> np.ndarray:
    """(size, size, 3) uint8: the centre crop the model captions, at `size` pixels.

    `image_io.decode_image` with the export's crop fraction, so the picture covers
    exactly the region the attention grid covers.
    """
    crop = captioner.info["crop_fraction"]
    pixels = image_io.decode_image(tf.constant(data), size, crop).numpy()
    return np.clip(np.round(pixels), 0, 255).astype(np.uint8)


def attention_panels(pixels: np.ndarray, result: dict, hard: bool) -> dict:
    """Titles, pictures and (for hard attention) cells of the caption's panels.

    Args:
      pixels: (h, w, 3) uint8, the picture the overlays are drawn on.
      result: a `ExportedCaptioner` result.
      hard: mark the argmax cell of each map (hard attention, paper §4.1).

    Returns:
      {words: panel titles (the caption's words, then `<end>` when it has a map),
      attention: one JPEG data URL per panel, cells: [row, col] per panel or None}.
    """
    grid = result["attention"].shape[1:]
    words = result["caption"].split(" ") if result["caption"] else []
    alphas = result["attention"][: result["length"] + 1].reshape(-1, grid[0] * grid[1])
    titles, points = visualize.caption_panels(words, alphas, hard)
    overlays = [
        _data_url(
            visualize.overlay_attention(
                pixels, visualize.upsample_attention(alpha, grid, pixels.shape[:2])
            )
        )
        for alpha in alphas[: len(titles)]
    ]
    cells = None if points is None else [list(divmod(int(p), grid[1])) for p in points]
    return {"words": titles, "attention": overlays, "cells": cells}


def caption_page(captioner: ExportedCaptioner, data: bytes, name: str, limits: Limits) -> dict:
    """Everything the page shows for one upload.

    Args:
      captioner: the decoding asked for.
      data: the image file's bytes.
      name: its file name, for messages.
      limits: the `Limits` to check first.

    Returns:
      a JSON-able dict: file, decoding, beam_size, caption, log_prob, length, tag,
      off_world_score, off_world and off_world_threshold (None for an export without
      off-world statistics), image (the
      crop as a data URL), grid, words, attention, cells (see `attention_panels`),
      alternatives (the beam's captions, best first, the caption first: each caption,
      log_prob, probability (e to the log_prob), length, words, attention and cells),
      model_ms (the signature call, with its wait for a batch) and total_ms.

    Raises:
      ImageError: naming `name` and what is wrong with it.
    """
    start = time.perf_counter()
    check_image(data, name, limits)
    model_start = time.perf_counter()
    result = captioner(data, name)
    model_ms = 1e3 * (time.perf_counter() - model_start)
    pixels = display_pixels(data, captioner)
    alternatives = [
        {
            "caption": each["caption"],
            "log_prob": each["log_prob"],
            "probability": math.exp(each["log_prob"]),
            "length": each["length"],
            **attention_panels(pixels, each, captioner.hard),
        }
        for each in result["alternatives"]
    ]
    page = {
        "file": name,
        "decoding": captioner.name,
        "beam_size": captioner.beam_size,
        "caption": result["caption"],
        "log_prob": result["log_prob"],
        "length": result["length"],
        "tag": result["tag"],
        "off_world_score": result.get("off_world_score"),
        "off_world": result.get("off_world"),
        "off_world_threshold": (captioner.info.get("off_world") or {}).get("threshold"),
        "image": _data_url(pixels),
        "grid": list(captioner.grid),
        **{k: alternatives[0][k] for k in ("words", "attention", "cells")},
        "alternatives": alternatives,
        "model_ms": round(model_ms, 2),
    }
    page["total_ms"] = round(1e3 * (time.perf_counter() - start), 2)
    return page


def _upload_name(filename: str | None) -> str:
    name = os.path.basename((filename or "").replace("\\", "/")).strip()
    return (name or "the upload")[:120]


def _asset(name: str) -> bytes:
    return (resources.files("sat_tf.server") / "demo_assets" / name).read_bytes()


def _error(message, status):
    """A JSON error answer: `{"error": message}` with the HTTP status."""
    return flask.jsonify(error=message), status


def _info(captioners, limits, samples):
    """The body of `GET /api/info`: the decodings, limits, samples and model."""
    first = captioners[0]
    return {
        "decodings": [
            {"beam_size": c.beam_size, "name": c.name, "export": c.path}
            for c in sorted(captioners, key=lambda c: c.beam_size)
        ],
        "limits": dataclasses.asdict(limits),
        "samples": [
            {"name": os.path.basename(p), "url": f"/samples/{i}"} for i, p in enumerate(samples)
        ],
        "model": {
            "image_size": first.info["image_size"],
            "grid": list(first.grid),
            "attention": first.info.get("config", {}).get("attention"),
            "vocab_size": first.info["vocab_size"],
        },
    }


def _handle_errors(app, limits):
    """Makes every error of `app` one JSON line with a 4xx or 5xx status: a refused
    image 400, an upload over `limits.max_bytes` 413, a full batch queue 503, other HTTP
    errors their own, and anything else 500 (logged)."""

    @app.errorhandler(ImageError)
    def bad_image(e):
        return _error(str(e), 400)

    @app.errorhandler(model_server.ServingError)
    def busy(e):
        return _error(e.message, e.http_status)

    @app.errorhandler(exceptions.RequestEntityTooLarge)
    def too_large(e):
        size = flask.request.content_length
        got = f" is {_megabytes(size)}" if size else " is too large"
        return _error(
            f"the upload{got}; the demo takes images up to {_megabytes(limits.max_bytes)}", 413
        )

    @app.errorhandler(exceptions.HTTPException)
    def http_error(e):
        return _error(f"{e.code} {e.name}: {flask.request.method} {flask.request.path}", e.code)

    @app.errorhandler(Exception)
    def internal_error(e):
        _log.exception("demo request %s failed", flask.request.path)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return _error(f"internal error: {type(e).__name__}: {first}", 500)


def create_app(
    captioners: Sequence[ExportedCaptioner],
    samples: Sequence[str] = (),
    *,
    limits: Limits = Limits(),
) -> flask.Flask:
    """The demo as a Flask app.

    Routes: `/` (the page, with `/demo.js` and `/demo.css`), `GET /api/info` (the
    decodings, limits and samples), `POST /api/caption` (form fields `image`, a file,
    and `beam_size`; answers `caption_page` as JSON), `/samples/<i>` (the sample
    images). Every error is JSON `{"error": one line}` with a 4xx or 5xx status, and the
    server goes on serving.

    Args:
      captioners: the loaded exports, one per decoding (`load_captioners`).
      samples: image files to offer as samples (`find_samples`).
      limits: what an upload may be.

    Returns:
      the app.
    """
    by_beam = {c.beam_size: c for c in captioners}
    if not by_beam:
        raise ValueError("the demo needs at least one export")
    samples = list(samples)
    display_pixels(_WARM_UP_IMAGE, captioners[0])
    assets = {name: _asset(name) for name in ASSETS}
    app = flask.Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = limits.max_bytes + _FORM_OVERHEAD

    @app.get("/")
    def index():
        return flask.Response(assets["index.html"], mimetype=ASSETS["index.html"])

    @app.get("/<any(demo.js, demo.css):name>")
    def asset(name):
        return flask.Response(assets[name], mimetype=ASSETS[name])

    @app.get("/favicon.ico")
    def favicon():
        return "", 204

    @app.get("/api/info")
    def info():
        return flask.jsonify(_info(captioners, limits, samples))

    @app.get("/samples/<int:index>")
    def sample(index):
        if index >= len(samples):
            return _error(f"there is no sample {index}; the demo has {len(samples)}", 404)
        return flask.send_file(os.path.abspath(samples[index]))

    @app.post("/api/caption")
    def caption():
        upload = flask.request.files.get("image")
        if upload is None:
            raise ImageError("the request holds no image: send the file as form field 'image'")
        beam = flask.request.form.get("beam_size", str(min(by_beam)))
        if not beam.isdigit() or int(beam) not in by_beam:
            offered = ", ".join(f"{c.name} (beam_size={k})" for k, c in sorted(by_beam.items()))
            raise ImageError(f"beam_size={beam!r} is not offered; this demo has {offered}")
        name = _upload_name(upload.filename)
        page = caption_page(by_beam[int(beam)], upload.read(), name, limits)
        return flask.jsonify(page)

    _handle_errors(app, limits)
    return app


def serve(app: flask.Flask, port: int = 8000) -> serving.BaseWSGIServer:
    """A threaded Werkzeug server for `app` on 127.0.0.1, bound but not yet serving.

    Call `serve_forever()` on it (and `shutdown()` from another thread to stop it);
    its `port` attribute is the port, useful with `port=0` (any free port).

    Raises:
      ValueError: when the port cannot be bound (e.g. in use).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ValueError(
            f"cannot serve on {HOST}:{port}: {e.strerror}; pass another --port, "
            "or --port=0 for any free one"
        ) from None
    try:
        return serving.make_server(HOST, port, app, threaded=True, fd=sock.fileno())
    finally:
        sock.close()
