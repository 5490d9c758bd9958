"""Exports a trained captioner as a SavedModel (TF Serving, other TF code) and TFLite.

The SavedModel (written with `keras.export.ExportArchive`) has three signatures,

  serving_default   image_bytes string (N,)        JPEG / PNG / GIF / BMP / WebP bytes
  caption_images    images uint8 (N, H, W, 3)      pixels of any size
  caption_features  features float32 (N, L, D)     encoder output (annotation vectors)

each returning caption string (N,), tokens int32 (N, T), length int32 (N,),
log_prob float32 (N,) and attention float32 (N, T, H, W) on the encoder's grid: the
fields of `search.DecodeResult`, T the export's max_length; and tag string (N,), the
ImageNet tag the caption was made to say ("" for none), with tag_prob float32 (N,), the
photo's most probable tag's probability (0 for a model without a tag table;
`sat_tf.serving.tags`, exported with the model's --tags and --tag_threshold); for a model
with off-world statistics (`sat_tf.serving.off_world`) also off_world_score float32 (N,) and
off_world bool (N,), how unlike its training photos each photo is. `serving_default` also
returns status int32 (N,) and error string (N,) per image: 0 and '' for a caption, else
1 empty, 2 not an image, 3 truncated or corrupt, 4 more pixels than the export's
max_image_pixels (read from the header, so nothing is allocated), with a one-line reason
and blank outputs (caption '', zeros); one bad image never fails the request. Decoding
(repeats blocked as the config says), resizing
(`input_pipeline`, paper §5.4), the encoder, greedy or beam search (paper §4) and the
id -> word lookup all run in the graph as core TensorFlow ops, so the export loads with
`tf.saved_model.load` alone; the vocabulary is a constant of the graph. The TFLite file
captions one resized image with builtin ops: greedy tokens and words out, joining them
is left to the app; `--quantize=dynamic` adds a copy with int8 weights.
"""

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf
from tensorflow.lite.tools import flatbuffer_utils

from sat_tf.config import QUANTIZATIONS
from sat_tf.data import graph_admission, image_io
from sat_tf.data import vocab as vocab_lib
from sat_tf.serving import inference
from sat_tf.serving import off_world as off_world_lib
from sat_tf.serving.inference import feature_encoder
from sat_tf.utils import files

EXPORT_INFO = "sat_tf_export.json"
VOCAB_FILE = "vocab.txt"
TFLITE_FILE = "caption.tflite"
TFLITE_INT8_FILE = "caption_int8.tflite"
SIGNATURES = ("serving_default", "caption_images", "caption_features")
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


def _decode(model, features, spec):
    return model.generate(
        {"features": features},
        spec.tag_threshold,
        max_length=spec.max_length,
        beam_size=spec.beam_size,
        length_penalty=spec.length_penalty,
        block_repeats=spec.block_repeats,
        bad_ending_ids=spec.bad_ending_ids,
        hard_decoding=spec.hard_decoding,
    )


def _serving_outputs(result, words, spec, features):
    attention = tf.reshape(result.attention, [-1, spec.max_length, *spec.grid])  # (N, T, H, W)
    outputs = {
        "caption": join_words(words, result.tokens, result.length),
        "tokens": result.tokens,
        "length": result.length,
        "log_prob": result.log_prob,
        "attention": attention,
        "tag": tf.where(result.tag >= 0, tf.gather(words, tf.maximum(result.tag, 0)), ""),
        "tag_prob": result.tag_prob,
    }
    if spec.off_world is not None:
        outputs["off_world_score"], outputs["off_world"] = off_world_lib.score(
            features, spec.off_world
        )
    return outputs


def serving_functions(model, encoder, vocab, spec):
    """The three signatures as Python functions with their input signatures.

    Args:
      model: a built `ShowAttendTell`.
      encoder: the `ImageEncoder` whose features the model reads (`model.encoder`, or
        the one that produced a feature cache).
      vocab: the model's `Vocab`.
      spec: `ExportSpec`.

    Returns:
      {signature name: (function, [tf.TensorSpec])}, in `SIGNATURES` order.
    """
    size, crop = spec.image_size, spec.crop_fraction

    def caption(features):
        words = tf.constant(vocab.words, tf.string)
        return _serving_outputs(_decode(model, features, spec), words, spec, features)

    def caption_features(features):
        return caption(_require_batch(features, "features"))

    def caption_images(images):
        images = resize_images(_require_batch(images, "images"), size, crop)
        return caption(encoder(images, training=False))

    def serving_default(image_bytes):
        image_bytes = _require_batch(image_bytes, "image_bytes")
        images, status, error = decode_images(image_bytes, size, crop, spec.max_image_pixels)
        outputs = blank_refused(caption(encoder(images, training=False)), status)
        return {**outputs, "status": status, "error": error}

    shape = [None, spec.num_locations, spec.feature_dim]
    return {
        "serving_default": (
            serving_default,
            [tf.TensorSpec([None], tf.string, name="image_bytes")],
        ),
        "caption_images": (
            caption_images,
            [tf.TensorSpec([None, None, None, 3], tf.uint8, name="images")],
        ),
        "caption_features": (
            caption_features,
            [tf.TensorSpec(shape, tf.float32, name="features")],
        ),
    }


def tflite_function(model, encoder, vocab, spec):
    """A `tf.function` captioning one resized image greedily, for the TFLite converter.

    The weights enter the graph as constants (a `keras.StatelessScope`): TFLite does not
    freeze variables read inside the decoding loop.

    Input: image float32 (1, S, S, 3), pixels in [0, 255] already resized and cropped.
    Outputs: tokens int32 (1, T), words string (1, T), length int32 (1,), log_prob
    float32 (1,), attention float32 (1, T, H, W).
    """
    size = spec.image_size
    greedy = dataclasses.replace(spec, beam_size=1, tag_threshold=None)
    weights = {id(v): v for v in model.weights + encoder.weights}.values()
    values = [(v, v.numpy()) for v in weights]

    @tf.function(
        input_signature=[tf.TensorSpec([1, size, size, 3], tf.float32, name="image")],
        autograph=False,
    )
    def caption(image):
        constants = [(v, tf.constant(value)) for v, value in values]
        with keras.StatelessScope(state_mapping=constants):
            result = _decode(model, encoder(image, training=False), greedy)
        words = tf.constant(vocab.words, tf.string)
        attention = tf.reshape(result.attention, [1, spec.max_length, *spec.grid])  # (1, T, H, W)
        return {
            "tokens": result.tokens,
            "words": tf.gather(words, result.tokens),
            "length": result.length,
            "log_prob": result.log_prob,
            "attention": attention,
        }

    return caption


def _tflite_holder(model, encoder, vocab, spec):
    holder = tf.Module()
    holder.caption = tflite_function(model, encoder, vocab, spec)
    return holder


def float_depthwise_filters(flatbuffer: bytes) -> bytes:
    """A dynamic-range TFLite model with its depthwise convolutions' int8 filters turned
    back into float32 (the int8 values times their scales).

    LiteRT's XNNPACK delegate has no depthwise convolution with int8 filters and float
    inputs: each such op runs on a slow reference kernel outside the delegate and splits
    the delegated graph around it. Depthwise filters hold few of a CNN's weights, so the
    file hardly grows (BUILD_NOTES.md has the sizes and times).
    """
    schema = flatbuffer_utils.schema_fb
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(flatbuffer))
    depthwise = schema.BuiltinOperator.DEPTHWISE_CONV_2D
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if flatbuffer_utils.schema_util.get_builtin_code_from_operator_code(code) != depthwise:
                continue
            tensor = subgraph.tensors[op.inputs[1]]
            if tensor.type != schema.TensorType.INT8:
                continue
            buffer = model.buffers[tensor.buffer]
            values = np.frombuffer(bytes(buffer.data), np.int8).reshape(tensor.shape)
            scale_shape = [1] * values.ndim
            scale_shape[tensor.quantization.quantizedDimension] = -1
            scale = np.asarray(tensor.quantization.scale, np.float32)
            if scale.size > 1:
                scale = scale.reshape(scale_shape)
            filters = values.astype(np.float32) * scale
            buffer.data = np.frombuffer(filters.tobytes(), np.uint8)
            tensor.type, tensor.quantization = schema.TensorType.FLOAT32, None
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _convert(holder, quantize):
    concrete = holder.caption.get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], holder)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize != "dynamic":
        return converter.convert()
    # Without a representative dataset, `Optimize.DEFAULT` is dynamic-range
    # quantization: int8 weights, float inputs, outputs and activations.
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return float_depthwise_filters(converter.convert())


def _check_quantize(quantize):
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(
            f"--quantize={quantize!r} is not one of {', '.join(map(repr, QUANTIZATIONS))}"
        )


def convert_tflite(model, encoder, vocab, spec, quantize=None) -> bytes:
    """A TFLite flatbuffer of `tflite_function` with builtin ops only (no Flex ops).

    Args:
      model, encoder, vocab, spec: as for `tflite_function`.
      quantize: None for float32 weights, or one of `QUANTIZATIONS`; "dynamic" keeps
        depthwise convolution filters float (`float_depthwise_filters`).
    """
    _check_quantize(quantize)
    return _convert(_tflite_holder(model, encoder, vocab, spec), quantize)


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


def _write_tflite(folder, name, flatbuffer, spec, quantize=None):
    """Writes a TFLite file into `folder`; returns its entry of `sat_tf_export.json`."""
    files.write_bytes(os.path.join(folder, name), flatbuffer)
    size = spec.image_size
    info = {
        "file": name,
        "bytes": len(flatbuffer),
        "input": {"image": [1, size, size, 3], "dtype": "float32", "range": [0, 255]},
        "decoding": "greedy",
    }
    if quantize:
        info.update(
            quantization=quantize,
            weights="int8",
            float_weights="depthwise convolution filters (float_depthwise_filters)",
            activations="float32",
        )
    return info


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
      tflite: also write the TFLite file (greedy decoding).
      quantize: with `tflite`, one of `QUANTIZATIONS`: also write the TFLite model with
        quantized weights (`convert_tflite`).
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
    _check_quantize(quantize)
    if quantize and not tflite:
        raise ValueError(f"--quantize={quantize} quantizes the TFLite model: add --tflite")
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
            "signatures": list(SIGNATURES),
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
            holder = _tflite_holder(model, encoder, vocab, spec)
            info["tflite"] = _write_tflite(tmp, TFLITE_FILE, _convert(holder, None), spec)
            if quantize:
                info["tflite_int8"] = _write_tflite(
                    tmp, TFLITE_INT8_FILE, _convert(holder, quantize), spec, quantize
                )
        try:
            from sat_tf.serving import warmup

            info["warmup_requests"] = os.path.relpath(warmup.write_warmup(tmp), tmp)
        except ImportError:  # tensorflow-serving-api (the export extra) is not installed
            info["warmup_requests"] = None
        files.write_json(os.path.join(tmp, EXPORT_INFO), info, indent=2, sort_keys=True)
    return info
