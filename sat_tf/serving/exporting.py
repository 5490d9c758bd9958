"""Exports a trained captioner as a SavedModel (TF Serving, other TF code) and TFLite.

The SavedModel (written with `keras.export.ExportArchive`) has three signatures, and an
export of a beam (beam size K > 1) a fourth,

  serving_default       image_bytes string (N,)        JPEG / PNG / GIF / BMP / WebP bytes
  caption_images        images uint8 (N, H, W, 3)      pixels of any size
  caption_features      features float32 (N, L, D)     encoder output (annotation vectors)
  caption_alternatives  image_bytes string (N,)        as serving_default

each returning caption string (N,), tokens int32 (N, T), length int32 (N,),
log_prob float32 (N,) and attention float32 (N, T, H, W) on the encoder's grid: the
fields of `search.DecodeResult`, T the export's max_length; captions string (N, K) and
log_probs float32 (N, K), the beam's K best captions (K the export's beam size, 1 for
greedy) best first, their first column `caption` and `log_prob`, "" and -inf where a
photo has fewer (a tag constraint keeps only the hypotheses that say the tag);
caption_alternatives adds attentions float32 (N, K, T, H, W), the attention of each
of them (a page that shows where the model looked for each); and tag string (N,), the
ImageNet tag the caption was made to say ("" for none), with tag_prob float32 (N,), the
photo's most probable tag's probability (0 for a model without a tag table;
`sat_tf.serving.tags`, exported with the model's --tags and --tag_threshold); for a model
with off-world statistics (`sat_tf.serving.off_world`) also off_world_score float32 (N,)
and off_world bool (N,), how unlike its training photos each photo is. The two signatures
of image bytes also return status int32 (N,) and error string (N,) per image: 0 and ''
for a caption, else 1 empty, 2 not an image, 3 truncated or corrupt, 4 more pixels than the export's
max_image_pixels (read from the header, so nothing is allocated), with a one-line reason
and blank outputs (caption '', zeros); one bad image never fails the request. Decoding
(repeats blocked as the config says), resizing
(`input_pipeline`, paper §5.4), the encoder, greedy or beam search (paper §4) and the
id -> word lookup all run in the graph as core TensorFlow ops, so the export loads with
`tf.saved_model.load` alone; the vocabulary is a constant of the graph. The TFLite file
(`sat_tf.serving.tflite`) captions one resized image with builtin ops, decoding as the
export does; `--quantize=dynamic` adds a copy with int8 weights.
"""

import dataclasses
import os

import keras
import tensorflow as tf

from sat_tf.data import graph_admission, image_io
from sat_tf.data import vocab as vocab_lib
from sat_tf.serving import inference
from sat_tf.serving import off_world as off_world_lib
from sat_tf.serving import tflite as tflite_lib
from sat_tf.serving.inference import feature_encoder
from sat_tf.serving.tflite import (  # noqa: F401 (the export's TFLite files, named here too)
    TFLITE_FILE,
    TFLITE_INT8_FILE,
    float_depthwise_filters,
)
from sat_tf.utils import files

EXPORT_INFO = "sat_tf_export.json"
VOCAB_FILE = "vocab.txt"
SIGNATURES = ("serving_default", "caption_images", "caption_features")
# The signature an export of a beam (K > 1) adds: serving_default's outputs and attentions.
ALTERNATIVES = "caption_alternatives"
# The fields of `search.DecodeResult` that hold one caption's; the others are the photo's.
_PER_CAPTION = ("tokens", "length", "log_prob", "attention")
FORMATS = image_io.FORMATS_TEXT


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    """What an export computes; everything is fixed when the graph is traced. The
    settings of the model's config have no defaults here: `export_spec` gives them all.

    Attributes:
      image_size: side S of the square encoder input.
      crop_fraction: see `image_io.resize_and_crop`.
      grid: (H, W) of the attention grid, L = H * W.
      feature_dim: D of the annotation vectors.
      max_length: T, tokens decoded per caption (`<end>` included).
      beam_size: 1 for greedy decoding, else beam search.
      length_penalty: GNMT length penalty exponent of beam search.
      tag_threshold: the probability a photo's ImageNet tag needs before its caption
        must say it (`ShowAttendTell.generate`); None: no tags (--notags, or a model
        without a tag table).
      block_repeats: no word a third time in a row, no trigram twice.
      bad_ending_ids: words a caption may not end on.
      hard_decoding: hard attention's context ("argmax", "expected"); None for the
        other models.
      max_image_pixels: `serving_default` refuses images over it (`image_io.admit`).
      off_world: the model's `off_world.Stats`; with them the signatures also return
        off_world_score float32 (N,) and off_world bool (N,).
    """

    image_size: int
    crop_fraction: float
    grid: tuple[int, int]
    feature_dim: int
    max_length: int
    beam_size: int
    length_penalty: float
    tag_threshold: float | None
    block_repeats: bool
    bad_ending_ids: tuple[int, ...]
    hard_decoding: str | None
    max_image_pixels: int = image_io.MAX_IMAGE_PIXELS
    off_world: off_world_lib.Stats | None = dataclasses.field(default=None, compare=False)

    @property
    def num_locations(self) -> int:
        return self.grid[0] * self.grid[1]


def _require_batch(inputs, name):
    """Fails with InvalidArgumentError when a request holds no images."""
    check = tf.debugging.Assert(
        tf.shape(inputs)[0] > 0, [f"{name} holds no images: send at least one"]
    )
    with tf.control_dependencies([check]):
        return tf.identity(inputs)


def decode_images(
    image_bytes, image_size, crop_fraction, max_image_pixels=image_io.MAX_IMAGE_PIXELS
):
    """A batch of encoded images -> (pixels (N, S, S, 3) float32, status int32 (N,),
    error string (N,)): `graph_admission.decode_images_admitted`. Each image is admitted from
    its header and decoded on its own, so a request may mix sizes and formats and one
    bad image (zeros, its status and reason) does not fail the others."""
    return graph_admission.decode_images_admitted(
        image_bytes, image_size, crop_fraction, max_image_pixels
    )


def blank_refused(outputs, status):
    """`outputs` with the rows of refused images (status != 0) blanked: '' for strings,
    zeros for numbers."""
    ok = tf.equal(status, image_io.OK)
    blank = {}
    for name, value in outputs.items():
        row = tf.reshape(ok, tf.concat([[-1], tf.ones([tf.rank(value) - 1], tf.int32)], 0))
        blank[name] = tf.where(row, value, tf.zeros_like(value))
    return blank


def resize_images(images, image_size, crop_fraction):
    """(N, H, W, 3) pixels of any size -> (N, S, S, 3) float32, as `decode_image` resizes."""
    height, width = tf.shape(images)[1], tf.shape(images)[2]
    check = tf.debugging.Assert(
        tf.logical_and(height > 0, width > 0),
        [
            tf.strings.format(
                "images have size {}x{}; both sides must be at least 1", (height, width)
            )
        ],
    )
    with tf.control_dependencies([check]):
        images = tf.identity(images)
    return image_io.resize_and_crop(images, image_size, crop_fraction)


def join_words(words, tokens, length):
    """Caption strings from token ids.

    Args:
      words: string (V,), the vocabulary in id order.
      tokens: int32 (N, T) ids.
      length: int32 (N,) words per caption; later tokens (`<end>`, `<pad>`) are dropped.

    Returns:
      string (N,): the first `length` words of each row joined by single spaces.
    """
    ragged = tf.RaggedTensor.from_tensor(tf.gather(words, tokens), lengths=length)
    return tf.strings.reduce_join(ragged, axis=1, separator=" ")


def _decode(model, features, spec, num_return=1):
    return model.generate(
        {"features": features},
        spec.tag_threshold,
        max_length=spec.max_length,
        beam_size=spec.beam_size,
        length_penalty=spec.length_penalty,
        block_repeats=spec.block_repeats,
        bad_ending_ids=spec.bad_ending_ids,
        hard_decoding=spec.hard_decoding,
        num_return=num_return,
    )


def _serving_outputs(result, words, spec, features, alternatives=False):
    """The outputs of `_decode`'s K = beam_size best captions (fields (N, K, ...), or
    (N, ...) for K = 1); `alternatives` adds the attention of each."""
    if spec.beam_size == 1:
        result = result._replace(**{k: getattr(result, k)[:, None] for k in _PER_CAPTION})
    tokens = tf.reshape(result.tokens, [-1, spec.max_length])  # (N K, T)
    found = result.log_prob > float("-inf")  # (N, K)
    joined = tf.reshape(
        join_words(words, tokens, tf.reshape(result.length, [-1])), [-1, spec.beam_size]
    )
    attention = tf.reshape(result.attention, [-1, spec.beam_size, spec.max_length, *spec.grid])
    outputs = {
        "caption": joined[:, 0],
        "tokens": result.tokens[:, 0],
        "length": result.length[:, 0],
        "log_prob": result.log_prob[:, 0],
        "attention": attention[:, 0],  # (N, T, H, W)
        "tag": tf.where(result.tag >= 0, tf.gather(words, tf.maximum(result.tag, 0)), ""),
        "tag_prob": result.tag_prob,
        "captions": tf.where(found, joined, ""),  # (N, K)
        "log_probs": result.log_prob,  # (N, K)
    }
    if alternatives:
        outputs["attentions"] = attention  # (N, K, T, H, W)
    if spec.off_world is not None:
        outputs["off_world_score"], outputs["off_world"] = off_world_lib.score(
            features, spec.off_world
        )
    return outputs


def serving_functions(model, encoder, vocab, spec):
    """The signatures as Python functions with their input signatures: `SIGNATURES`, and
    for a beam (spec.beam_size > 1) `ALTERNATIVES`.

    Args:
      model: a built `ShowAttendTell`.
      encoder: the `ImageEncoder` whose features the model reads (`model.encoder`, or
        the one that produced a feature cache).
      vocab: the model's `Vocab`.
      spec: `ExportSpec`.

    Returns:
      {signature name: (function, [tf.TensorSpec])}, in `SIGNATURES` order, then
      `ALTERNATIVES`.
    """
    size, crop = spec.image_size, spec.crop_fraction

    def caption(features, alternatives=False):
        words = tf.constant(vocab.words, tf.string)
        result = _decode(model, features, spec, spec.beam_size)
        return _serving_outputs(result, words, spec, features, alternatives)

    def caption_features(features):
        return caption(_require_batch(features, "features"))

    def caption_images(images):
        images = resize_images(_require_batch(images, "images"), size, crop)
        return caption(encoder(images, training=False))

    def caption_bytes(image_bytes, alternatives):
        image_bytes = _require_batch(image_bytes, "image_bytes")
        images, status, error = decode_images(image_bytes, size, crop, spec.max_image_pixels)
        outputs = caption(encoder(images, training=False), alternatives)
        return {**blank_refused(outputs, status), "status": status, "error": error}

    def serving_default(image_bytes):
        return caption_bytes(image_bytes, alternatives=False)

    def caption_alternatives(image_bytes):
        return caption_bytes(image_bytes, alternatives=True)

    shape = [None, spec.num_locations, spec.feature_dim]
    image_bytes = [tf.TensorSpec([None], tf.string, name="image_bytes")]
    alternatives = {ALTERNATIVES: (caption_alternatives, image_bytes)} if spec.beam_size > 1 else {}
    return {
        "serving_default": (serving_default, image_bytes),
        "caption_images": (
            caption_images,
            [tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")],
        ),
        "caption_features": (
            caption_features,
            [tf.TensorSpec(shape, tf.float32, name="features")],
        ),
        **alternatives,
    }


def export_spec(
    model,
    encoder,
    config,
    beam_size=None,
    max_length=None,
    max_image_pixels=image_io.MAX_IMAGE_PIXELS,
    vocab=None,
    off_world=None,
) -> ExportSpec:
    """The `ExportSpec` of a model and its config; None means the config's setting. The
    `vocab` is needed with `config.block_bad_endings`; `off_world` statistics add the
    off-world outputs."""
    height, width, depth = encoder.feature_grid()
    if off_world is not None and off_world.feature_dim != depth:
        raise ValueError(
            f"off-world statistics of {off_world.feature_dim}-wide features; the encoder "
            f"gives {depth}"
        )
    decoding = inference.decoding_arguments(config, vocab, beam_size)
    del decoding["num_return"]  # the signatures return the beam's beam_size best
    if model.tagger is None:
        decoding["tag_threshold"] = None
    spec = ExportSpec(
        image_size=config.image_size,
        crop_fraction=config.effective_crop_fraction,
        grid=(int(height), int(width)),
        feature_dim=int(depth),
        **{**decoding, "max_length": max_length or decoding["max_length"]},
        max_image_pixels=max_image_pixels,
        off_world=off_world,
    )
    for name in ("max_length", "beam_size", "max_image_pixels"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--{name}={value!r} must be a positive integer")
    return spec


def export_archive(model, encoder, vocab, spec) -> keras.export.ExportArchive:
    """An `ExportArchive` holding the model's variables and the three signatures."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    if encoder is not model.encoder:
        archive.track(encoder)
    for name, (fn, signature) in serving_functions(model, encoder, vocab, spec).items():
        # Keras traces the endpoint with autograph=False, as `make_caption_fn` is traced.
        archive.add_endpoint(name, fn, input_signature=signature)
    return archive


def _is_export(path):
    return any(os.path.exists(os.path.join(path, f)) for f in (EXPORT_INFO, "saved_model.pb"))


def export(
    model,
    vocab,
    config,
    output,
    *,
    beam_size=None,
    max_length=None,
    tflite=False,
    quantize=None,
    tflite_greedy=False,
    overwrite=False,
    max_image_pixels=image_io.MAX_IMAGE_PIXELS,
    off_world=None,
) -> dict:
    """Writes the SavedModel (and optionally the TFLite files) of a trained model.

    The directory is assembled next to `output` and renamed into place when complete,
    so a reader (a model server watching the folder) never sees a partial export. It
    holds the SavedModel, `vocab.txt`, `sat_tf_export.json` (the returned info), with
    `tflite` `caption.tflite`, and with `quantize` also `caption_int8.tflite`.

    Args:
      model: a built `ShowAttendTell` with trained weights.
      vocab: its `Vocab`.
      config: the `Config` it was trained with.
      output: the export directory, e.g. `exports/sat/1` for TF Serving.
      beam_size, max_length: decoding settings fixed in the graph; None takes
        `config.beam_size` / `config.max_decode_length`.
      tflite: also write the TFLite file (`sat_tf.serving.tflite`): the export's own
        decoding (beam size, tags, off-world score), its K hypotheses too.
      quantize: with `tflite`, one of `QUANTIZATIONS`: also write the TFLite model with
        quantized weights (`tflite.convert`).
      tflite_greedy: with `tflite`, decode greedily without tags in the TFLite files
        (the SavedModel keeps the export's decoding).
      overwrite: replace an earlier export at `output`.
      max_image_pixels: `serving_default` gives status 4 (and no caption) for images
        over it, read from their headers before anything is decoded.
      off_world: the model's `off_world.Stats` (`off_world.load_from` its preset or
        workdir); the SavedModel's signatures then return off_world_score and off_world.

    Returns:
      the info dict written to `sat_tf_export.json`.

    Raises:
      ValueError: for a bad setting, or when `output` exists and may not be replaced.
    """
    if len(vocab) != model.vocab_size:
        raise ValueError(f"the vocabulary has {len(vocab)} words but the model {model.vocab_size}")
    tflite_lib.check_quantize(quantize)
    if quantize and not tflite:
        raise ValueError(f"--quantize={quantize} quantizes the TFLite model: add --tflite")
    if tflite_greedy and not tflite:
        raise ValueError("--tflite_greedy sets the TFLite model's decoding: add --tflite")
    output = os.path.abspath(output)
    if os.path.exists(output):
        if not overwrite:
            raise ValueError(f"{output} exists; pass --overwrite to replace it")
        if not _is_export(output):
            raise ValueError(f"{output} exists and is not an export; refusing to replace it")
    encoder = feature_encoder(model, config)
    spec = export_spec(
        model,
        encoder,
        config,
        beam_size,
        max_length,
        max_image_pixels,
        vocab=vocab,
        off_world=off_world,
    )
    with files.staged_dir(output) as tmp:
        export_archive(model, encoder, vocab, spec).write_out(tmp, verbose=False)
        vocab.save(os.path.join(tmp, VOCAB_FILE))
        info = {
            "signatures": [*SIGNATURES, *([ALTERNATIVES] if spec.beam_size > 1 else [])],
            "vocab_size": len(vocab),
            "vocab_fingerprint": vocab.fingerprint,
            "vocab_file": VOCAB_FILE,
            "grid": list(spec.grid),
            "feature_dim": spec.feature_dim,
            "image_size": spec.image_size,
            "crop_fraction": spec.crop_fraction,
            "beam_size": spec.beam_size,
            "max_length": spec.max_length,
            "length_penalty": spec.length_penalty,
            "max_image_pixels": spec.max_image_pixels,
            "block_repeats": spec.block_repeats,
            "bad_ending_ids": list(spec.bad_ending_ids),
            "off_world": None
            if off_world is None
            else {"threshold": off_world.threshold, "quantile": off_world.quantile},
            "special_tokens": dict(zip(vocab_lib.SPECIALS, range(4), strict=True)),
            "tflite": None,
            "tflite_int8": None,
            "config": dataclasses.asdict(config),
        }
        if tflite:
            info.update(tflite_lib.write(tmp, model, encoder, vocab, spec, quantize, tflite_greedy))
        try:
            from sat_tf.serving import warmup

            info["warmup_requests"] = os.path.relpath(warmup.write_warmup(tmp), tmp)
        except ImportError:  # tensorflow-serving-api (the export extra) is not installed
            info["warmup_requests"] = None
        files.write_json(os.path.join(tmp, EXPORT_INFO), info, indent=2, sort_keys=True)
    return info
