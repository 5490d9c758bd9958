"""Tests for bench/flops.py's count of the per-word passes and its share bound: against
hand-computed values, and the fused recurrence's count against the passes its traced
while loops make, enumerated op by op; and its decoding and encoder FLOP counts against
hand counts."""

import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import function_def_to_graph

from sat_tf.model.decoder import AttentionDecoder

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
import flops  # noqa: E402

# Sizes whose products B L A and B L D differ from every other tensor's size.
BATCH, STEPS, LOCATIONS, FEATURES, ATTENTION, HIDDEN, EMBED, VOCAB = 3, 5, 7, 11, 13, 4, 2, 17
# Ops that move no data (arguments, views, and the TensorArray reads and writes, which
# keep references), and hard attention's gather, which reads only the rows it picks.
NO_PASS = ("Placeholder", "Reshape", "Squeeze", "ExpandDims", "Identity", "Shape", "GatherV2")


def _shape(attention="soft", score="additive"):
    return flops.Shape(
        LOCATIONS, FEATURES, EMBED, HIDDEN, ATTENTION, VOCAB, attention, score, hard_gate=True
    )


def test_pass_bytes_by_hand():
    # additive: 2 L D + 4 L A = 2*7*11 + 4*7*13 = 154 + 364 = 518 values (minimal), and
    # 154 + 14*7*13 = 154 + 1274 = 1428 as the recurrence runs it; 4 bytes, B T = 15.
    assert flops.train_step_pass_bytes(_shape(), BATCH, STEPS) == {
        "minimal": 4 * 15 * 518,
        "fused_recurrence": 4 * 15 * 1428,
    }
    # dot: 2 L D + 2 L n = 154 + 56 = 210, either way.
    dot = flops.train_step_pass_bytes(_shape(score="dot"), BATCH, STEPS)
    assert dot == {"minimal": 4 * 15 * 210, "fused_recurrence": 4 * 15 * 210}
    none = flops.train_step_pass_bytes(_shape(attention="none"), BATCH, STEPS)
    assert none == {"minimal": 0, "fused_recurrence": 0}


def test_share_bound_by_hand():
    # 2 GFLOP at 100 GFLOP/s: 0.02 s; 0.3 GB at 10 GB/s: 0.03 s; 0.02 / 0.05.
    assert flops.share_bound(2e9, 3e8, 100.0, 10.0) == pytest.approx(0.4)
    assert flops.share_bound(2e9, 0, 100.0, 10.0) == pytest.approx(1.0)


def test_share_bound_with_the_products_timed_by_hand():
    # 2 GFLOP at 100 GFLOP/s is 0.02 s of the yardstick; the products took 0.04 s and the
    # passes 0.3 GB at 10 GB/s 0.03 s: 0.02 / 0.07.
    got = flops.share_bound(2e9, 3e8, 100.0, 10.0, product_seconds=0.04)
    assert got == pytest.approx(0.02 / 0.07)


@pytest.mark.parametrize("score", ["additive", "dot"])
def test_step_products_are_the_counted_products_but_the_passes(score):
    """The listed products add up to the train step's counted product FLOPs (three times
    the forward's), less what is not a product a schedule must make: the gradients of
    the annotations (inputs) through the start state and W_a a, and the score and
    context reads of every word, forward and backward (memory passes)."""
    shape = _shape(score=score)
    listed = flops.train_step_products(shape, BATCH, STEPS)
    total = sum(2 * r * k * c * calls for _, r, k, c, _, _, calls in listed)
    L, D, n, A, T = LOCATIONS, FEATURES, HIDDEN, ATTENTION, STEPS
    width = A if score == "additive" else n
    counted = flops.train_step_flops(shape, BATCH, T)["forward_matmul"]
    not_products = BATCH * (2 * 2 * D * n + 2 * L * D * width)
    not_products += 3 * BATCH * T * (2 * L * width + 2 * L * D)
    assert total == 3 * counted - not_products


def test_step_products_by_hand():
    listed = {p[0]: p[1:] for p in flops.train_step_products(_shape(), BATCH, STEPS)}
    W = flops.HiddenLayout(4 * HIDDEN, ATTENTION, True).width
    # One product a word on B rows, its input gradient too; its weight gradient once,
    # over all B T rows, from the stored (B T, n) inputs, transposed.
    assert listed["hidden projection"] == (BATCH, HIDDEN, W, False, False, STEPS)
    assert listed["hidden projection dX"] == (BATCH, W, HIDDEN, False, True, STEPS)
    assert listed["hidden projection dW"] == (HIDDEN, BATCH * STEPS, W, True, False, 1)
    assert listed["W_a a"] == (BATCH * LOCATIONS, FEATURES, ATTENTION, False, False, 1)
    assert "W_a a dX" not in listed and "init_h, init_c dX" not in listed
    assert listed["L_o dX"] == (BATCH * STEPS, VOCAB, EMBED, False, True, 1)
    none = {p[0] for p in flops.train_step_products(_shape("none"), BATCH, STEPS)}
    assert "W_a a" not in none and "context gates" in none


def test_decode_flops_by_hand():
    # L=7, D=11, m=2, n=4, A=13, V=17, soft additive (gated): W = 4n + A + 1 = 30.
    got = flops.decode_flops(_shape())
    # Per image: init_h, init_c 2*2*11*4 = 176, W_a a 2*7*11*13 = 2002; mean of a 77,
    # init 4n = 16, W_a bias 91.
    assert (got["per_image_matmul"], got["per_image_elementwise"]) == (2178, 184)
    # Per step: h [U | U_a | w_beta] 2*4*30 = 240, Z z 2*11*16 = 352, v^T tanh 2*7*13 = 182,
    # context 2*7*11 = 154, L_h 16, L_z 44, L_o 68, embedding gates 2*2*16 = 64.
    assert got["step_matmul"] == 240 + 352 + 182 + 154 + 16 + 44 + 68 + 64
    # Gate sums 32 and cell 36, score add + tanh 182, softmax 28, beta 12, deep output
    # 8 + 17 + 4*17 = 93, embedding gates' bias 16.
    assert got["step_elementwise"] == 32 + 36 + 182 + 28 + 12 + 93 + 16
    assert got["step"] == got["step_matmul"] + got["step_elementwise"]


def test_encoder_flops_by_hand():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, strides=2, padding="same")(inputs)  # (4, 4, 4)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2)(x)  # (4, 4, 8)
    x = keras.Sequential([keras.layers.Conv2D(5, 1)])(x)  # nested: (4, 4, 5)
    x = keras.layers.Conv2D(10, 3, groups=5)(x)  # (2, 2, 10)
    got = flops.encoder_flops(keras.Model(inputs, x))
    # 1x1: 2*4*4*5*8 = 1280. Others: 2*4*4*4*9*3 = 3456 and, 1 input channel per group,
    # 2*2*2*10*9*1 = 720. Depthwise: 2*4*4*8*9 = 2304 (4 channels, multiplier 2).
    assert got == {"conv_1x1": 1280, "conv_other": 4176, "depthwise": 2304, "total": 7760}
    dense = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    with pytest.raises(ValueError, match="Dense"):
        flops.encoder_flops(dense)


def _loop_bodies(graph_def):
    """(name, FuncGraph) of every while-loop body in `graph_def` and its functions, with
    the static shapes its While op gives the loop variables."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    nodes = list(graph_def.node) + [n for f in functions.values() for n in f.node_def]
    bodies = []
    for node in nodes:
        if node.op not in ("While", "StatelessWhile"):
            continue
        body = node.attr["body"].func.name
        shapes = [tf.TensorShape(s) for s in node.attr["output_shapes"].list.shape]
        graph = function_def_to_graph.function_def_to_graph(functions[body], input_shapes=shapes)
        bodies.append((body, graph))
    return bodies


def _per_word_values(graph):
    """How many (B, L, A) and (B, L, D) tensors the ops of `graph` read or write: its
    passes, as {"LA": passes over L A values a caption, "LD": over L D values}."""
    sizes = {BATCH * LOCATIONS * ATTENTION: "LA", BATCH * LOCATIONS * FEATURES: "LD"}
    counts = {"LA": 0, "LD": 0}
    for op in graph.get_operations():
        if op.type in NO_PASS or op.type.startswith("TensorList"):
            continue
        for tensor in list(op.inputs) + list(op.outputs):
            if tensor.shape.is_fully_defined() and tensor.shape.num_elements() in sizes:
                counts[sizes[tensor.shape.num_elements()]] += 1
    return counts


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_fused_recurrence_makes_the_passes_it_is_charged(attention, compiled):
    # The score as TensorFlow ops is charged "fused_recurrence", as its compiled op the
    # fewest passes, "minimal".
    sizes = {"embed_dim": EMBED, "hidden_dim": HIDDEN, "attention_dim": ATTENTION}
    decoder = AttentionDecoder(VOCAB, attention=attention, dropout=0.0, hard_gate=True, **sizes)
    decoder.fused_hard = True
    decoder.compiled_score = compiled
    decoder.build((None, LOCATIONS, FEATURES))
    rng = np.random.default_rng(0)
    features = tf.constant(rng.normal(size=(BATCH, LOCATIONS, FEATURES)), tf.float32)
    captions = tf.constant(rng.integers(1, VOCAB, size=(BATCH, STEPS)), tf.int32)
    noise = tf.constant(rng.gumbel(size=(BATCH, STEPS, LOCATIONS)), tf.float32)
    extra = {"gumbel_noise": noise, "use_expected": tf.constant([True, False, True])}

    @tf.function
    def gradients(features, captions):
        with tf.GradientTape() as tape:
            outputs = decoder(features, captions, **(extra if attention == "hard" else {}))
            loss = tf.reduce_sum(outputs["logits"]) + tf.reduce_sum(outputs["alpha"] ** 2)
        return tape.gradient(loss, decoder.trainable_variables)

    graph_def = gradients.get_concrete_function(features, captions).graph.as_graph_def()
    bodies = _loop_bodies(graph_def)
    assert len(bodies) == 2, [name for name, _ in bodies]  # forward and backward loops
    total = {"LA": 0, "LD": 0}
    for _, graph in bodies:
        for key, count in _per_word_values(graph).items():
            total[key] += count
    assert total == {"LA": 4 if compiled else 14, "LD": 2}
    schedule = "minimal" if compiled else "fused_recurrence"
    charged = flops.train_step_pass_bytes(_shape(attention), BATCH, STEPS)[schedule]
    enumerated = total["LA"] * LOCATIONS * ATTENTION + total["LD"] * LOCATIONS * FEATURES
    assert charged == 4 * BATCH * STEPS * enumerated
