"""The TFLite file of a captioner: its whole decoding in builtin ops (docs/design.md §7.3).

One photo, already resized and cropped, goes in; the encoder, the preset's own decoding
(greedy or beam search with its length penalty and blocking rules, a confident ImageNet
tag made to be said: `ShowAttendTell.generate`, as the SavedModel runs it) and the
off-world score run inside, and every field of a caption comes out, with the beam's K
hypotheses best first. Builtin ops only (no Flex ops, which no Python runtime here can
run), so LiteRT runs it in a process that never loads TensorFlow
(`sat_tf.serving.litert`); `sat-export --tflite` writes it beside the SavedModel, and
the LiteRT runtime builds it once into the cache (`sat_tf.serving.litert_cache`).

Input: `image` float32 (1, S, S, 3), pixels in [0, 255]. Outputs (T = max_length,
K = the beam size, 1 for greedy):

  tokens int32 (1, T), words string (1, T), length int32 (1,), log_prob float32 (1,),
  attention float32 (1, T, H, W)            the caption (`search.DecodeResult`)
  tag int32 (1,), tag_word string (1,),     the tag the caption was made to say (-1 and
  tag_prob float32 (1,)                     "" for none), its photo's tag's probability
  nbest_tokens int32 (1, K, T), nbest_words string (1, K, T), nbest_length int32 (1, K),
  log_probs float32 (1, K), nbest_attention float32 (1, K, T, H, W)
                                            the K hypotheses, best first (-inf: none)
  off_world_score float32 (1,), off_world bool (1,)   with off-world statistics only

Joining the words is left to the app. `--quantize=dynamic` adds a copy with int8
weights (`float_depthwise_filters`).
"""

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf
from tensorflow.lite.tools import flatbuffer_utils

from sat_tf.config import QUANTIZATIONS
from sat_tf.model.search import DecodeResult
from sat_tf.serving import off_world as off_world_lib
from sat_tf.utils import files

TFLITE_FILE = "caption.tflite"
TFLITE_INT8_FILE = "caption_int8.tflite"
# The file's outputs (the module docstring), the off-world ones with statistics only.
OUTPUTS = (
    "tokens",
    "words",
    "length",
    "log_prob",
    "attention",
    "tag",
    "tag_word",
    "tag_prob",
    "nbest_tokens",
    "nbest_words",
    "nbest_length",
    "log_probs",
    "nbest_attention",
)
OFF_WORLD_OUTPUTS = ("off_world_score", "off_world")


def _expanded(result):
    """A `DecodeResult` of one hypothesis per image with the hypothesis axis."""
    return DecodeResult(*(tf.expand_dims(x, 1) for x in result))


def caption_function(model, encoder, vocab, spec):
    """A `tf.function` captioning one resized image as the export's spec decodes, for
    the TFLite converter (the module docstring lists its outputs).

    The weights enter the graph as constants (a `keras.StatelessScope`): TFLite does not
    freeze variables read inside the decoding loop.

    Args:
      model: a `ShowAttendTell` (its `tagger` used with `spec.tag_threshold`).
      encoder: the `ImageEncoder` whose features it reads.
      vocab: its `Vocab`.
      spec: `exporting.ExportSpec`: image size, grid, the decoding, off-world statistics.
    """
    size, k = spec.image_size, spec.beam_size
    weights = {id(v): v for v in model.weights + encoder.weights}.values()
    values = [(v, v.numpy()) for v in weights]
    words = np.array([*vocab.words, ""], dtype=object)  # "" at -1: no tag

    @tf.function(
        input_signature=[tf.TensorSpec([1, size, size, 3], tf.float32, name="image")],
        autograph=False,
    )
    def caption(image):
        constants = [(v, tf.constant(value)) for v, value in values]
        with keras.StatelessScope(state_mapping=constants):
            features = encoder(image, training=False)
            generated = model.generate(
                {"features": features},
                spec.tag_threshold,
                max_length=spec.max_length,
                beam_size=k,
                length_penalty=spec.length_penalty,
                block_repeats=spec.block_repeats,
                bad_ending_ids=spec.bad_ending_ids,
                hard_decoding=spec.hard_decoding,
                num_return=k,
            )
        table = tf.constant(words, tf.string)
        nbest = DecodeResult(*generated[:4])
        nbest = _expanded(nbest) if k == 1 else nbest
        maps = tf.reshape(nbest.attention, [1, k, spec.max_length, *spec.grid])  # (1, K, T, H, W)
        outputs = {
            "tokens": nbest.tokens[:, 0],
            "words": tf.gather(table, nbest.tokens[:, 0]),
            "length": nbest.length[:, 0],
            "log_prob": nbest.log_prob[:, 0],
            "attention": maps[:, 0],
            "tag": generated.tag,
            "tag_word": tf.gather(table, tf.where(generated.tag >= 0, generated.tag, len(vocab))),
            "tag_prob": generated.tag_prob,
            "nbest_tokens": nbest.tokens,
            "nbest_words": tf.gather(table, nbest.tokens),
            "nbest_length": nbest.length,
            "log_probs": nbest.log_prob,
            "nbest_attention": maps,
        }
        if spec.off_world is not None:
            score, flag = off_world_lib.score(features, spec.off_world)
            outputs["off_world_score"], outputs["off_world"] = score, flag
        return outputs

    return caption


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


def check_quantize(quantize):
    """Raises ValueError for a quantization other than None and `QUANTIZATIONS`."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(
            f"--quantize={quantize!r} is not one of {', '.join(map(repr, QUANTIZATIONS))}"
        )


def convert(function, quantize=None) -> bytes:
    """The TFLite flatbuffer of a `caption_function`, builtin ops only.

    Args:
      function: its `tf.function`.
      quantize: None for float32 weights, or one of `QUANTIZATIONS`: "dynamic" quantizes
        the weights to int8 (dynamic-range quantization, float activations) and keeps
        the depthwise convolution filters float (`float_depthwise_filters`).
    """
    check_quantize(quantize)
    holder = tf.Module()
    holder.caption = function
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [function.get_concrete_function()], holder
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize != "dynamic":
        return converter.convert()
    # Without a representative dataset, `Optimize.DEFAULT` is dynamic-range
    # quantization: int8 weights, float inputs, outputs and activations.
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return float_depthwise_filters(converter.convert())


def info(name, flatbuffer, spec, quantize=None) -> dict:
    """The entry of a TFLite file in `sat_tf_export.json` (and the LiteRT cache's)."""
    size = spec.image_size
    entry = {
        "file": name,
        "bytes": len(flatbuffer),
        "input": {"image": [1, size, size, 3], "dtype": "float32", "range": [0, 255]},
        "decoding": "greedy" if spec.beam_size == 1 and spec.tag_threshold is None else "beam",
        "beam_size": spec.beam_size,
        "max_length": spec.max_length,
        "grid": list(spec.grid),
        "tags": spec.tag_threshold is not None,
        "off_world": spec.off_world is not None,
        "outputs": list(OUTPUTS) + (list(OFF_WORLD_OUTPUTS) if spec.off_world is not None else []),
    }
    if quantize:
        entry.update(
            quantization=quantize,
            weights="int8",
            float_weights="depthwise convolution filters (float_depthwise_filters)",
            activations="float32",
        )
    return entry


def write(folder, model, encoder, vocab, spec, quantize=None, greedy=False) -> dict:
    """Writes `TFLITE_FILE` (and with `quantize` `TFLITE_INT8_FILE`) into `folder`.

    Args:
      folder: where the files go.
      model, encoder, vocab, spec: as for `caption_function`.
      quantize: None or one of `QUANTIZATIONS`.
      greedy: decode greedily without tags, whatever the spec's beam size.

    Returns:
      {"tflite": entry, "tflite_int8": entry or None} (`info`).
    """
    if greedy:
        spec = dataclasses.replace(spec, beam_size=1, tag_threshold=None)
    function = caption_function(model, encoder, vocab, spec)
    written = {"tflite": None, "tflite_int8": None}
    kinds = [("tflite", TFLITE_FILE, None)]
    if quantize:
        kinds.append(("tflite_int8", TFLITE_INT8_FILE, quantize))
    for key, name, kind in kinds:
        flatbuffer = convert(function, kind)
        files.write_bytes(os.path.join(folder, name), flatbuffer)
        written[key] = info(name, flatbuffer, spec, kind)
    return written
