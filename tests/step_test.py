"""Tests for sat_tf.model.step against NumPy: the LSTM cell (paper eq. 1-3) and one
attention step (§3.1.2, §4) without attention, with a score and the gate beta."""

import numpy as np
import tensorflow as tf

from sat_tf.model import attention
from sat_tf.model.step import StepOutputs, attention_step, lstm_cell, uniform_alpha

BATCH, LOCATIONS, FEATURES, HIDDEN, PROJECTED = 2, 4, 3, 5, 6


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _numpy_lstm(gates, c):
    """h, c and the activated gates (i, f, o, g) of paper eq. 1-3, in float64."""
    i, f, o, g = np.split(gates.astype(np.float64), 4, axis=-1)
    i, f, o, g = _sigmoid(i), _sigmoid(f), _sigmoid(o), np.tanh(g)
    c = f * c + i * g
    return o * np.tanh(c), c, (i, f, o, g)


def _inputs(seed):
    """Fixed random inputs of `attention_step` (no gate logit: `gate_logit` adds one)."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.normal(size=shape).astype(np.float32)

    return {
        "word_gates": normal(BATCH, 4 * HIDDEN),
        "h": normal(BATCH, HIDDEN),
        "c": normal(BATCH, HIDDEN),
        "gates_h": normal(BATCH, 4 * HIDDEN),
        "score_in": normal(BATCH, PROJECTED),
        "gate_logit": normal(BATCH, 1),
        "features": normal(BATCH, LOCATIONS, FEATURES),
        "projected": normal(BATCH, LOCATIONS, PROJECTED),
        "context_kernel": normal(FEATURES, 4 * HIDDEN),
    }


def _dot_score(projected, score_in, h):
    """A score of `attention_step`: e_i = (W_a a_i) . P^S, with what it computed on the
    way (the products before the sum)."""
    del h
    products = projected * score_in[:, None, :]
    return tf.reduce_sum(products, axis=-1), products


def _step(x, score, attend, gate_logit=None):
    """`attention_step` of `_inputs` with a score (None: the no-attention ablation, which
    has no score input nor projection), an attend function and a gate logit or none."""
    attended = score is not None
    return attention_step(
        x["word_gates"],
        x["h"],
        x["c"],
        (x["gates_h"], x["score_in"] if attended else None, gate_logit),
        x["features"],
        x["projected"] if attended else None,
        x["context_kernel"],
        score=score,
        attend=attend,
    )


class LstmCellTest(tf.test.TestCase):
    def test_matches_the_equations(self):
        rng = np.random.default_rng(0)
        gates = rng.normal(scale=2.0, size=(BATCH, 4 * HIDDEN)).astype(np.float32)
        c = rng.normal(size=(BATCH, HIDDEN)).astype(np.float32)
        h, c_next, activated = lstm_cell(tf.constant(gates), tf.constant(c))
        want_h, want_c, want_gates = _numpy_lstm(gates, c)
        self.assertAllClose(h, want_h, atol=1e-6)
        self.assertAllClose(c_next, want_c, atol=1e-6)
        self.assertLen(activated, 4)
        for got, want in zip(activated, want_gates, strict=True):
            self.assertAllClose(got, want, atol=1e-6)
        # The gates are read in the order i, f, o, g: another order gives another state.
        i, f, o, g = np.split(gates, 4, axis=-1)
        swapped, _ = _numpy_lstm(np.concatenate([f, i, o, g], -1), c)[:2]
        self.assertNotAllClose(h, swapped, atol=1e-3)


class AttentionStepTest(tf.test.TestCase):
    def test_without_a_score_alpha_is_uniform_and_z_the_mean(self):
        x = _inputs(seed=1)
        out = _step(x, score=None, attend=None)
        self.assertIsInstance(out, StepOutputs)
        self.assertEqual(out.alpha.dtype, tf.float32)
        self.assertAllClose(out.alpha, np.full((BATCH, LOCATIONS), 1.0 / LOCATIONS))
        self.assertAllClose(uniform_alpha(x["features"]), out.alpha)
        mean = x["features"].astype(np.float64).mean(axis=1)
        self.assertAllClose(out.context, mean, atol=1e-6)
        self.assertAllClose(out.z, mean, atol=1e-6)
        for name in ("log_alpha", "beta", "score_hidden", "where"):
            self.assertIsNone(getattr(out, name), name)
        self._check_gates_and_state(out, x, mean)

    def test_with_a_score_alpha_is_its_softmax_and_beta_scales_z(self):
        x = _inputs(seed=2)
        out = _step(x, _dot_score, attention.soft_attend, x["gate_logit"])
        scores = np.einsum("blp,bp->bl", x["projected"], x["score_in"]).astype(np.float64)
        alpha = np.exp(scores - scores.max(-1, keepdims=True))
        alpha /= alpha.sum(-1, keepdims=True)
        self.assertAllClose(out.alpha, alpha, atol=1e-6)
        self.assertAllClose(out.log_alpha, np.log(alpha), atol=1e-5)
        self.assertAllClose(out.score_hidden, x["projected"] * x["score_in"][:, None, :])
        self.assertIsNone(out.where)
        context = np.einsum("bl,bld->bd", alpha, x["features"])
        self.assertAllClose(out.context, context, atol=1e-6)
        beta = _sigmoid(x["gate_logit"].astype(np.float64))
        self.assertAllClose(out.beta, beta, atol=1e-6)
        self.assertAllClose(out.z, beta * context, atol=1e-6)
        self.assertNotAllClose(out.z, out.context, atol=1e-3)  # the gate is not 1 here
        self._check_gates_and_state(out, x, beta * context)

    def _check_gates_and_state(self, out, x, z):
        """The gates x_t + U h + Z z and the LSTM's h, c of them, by numpy."""
        gates = x["word_gates"] + x["gates_h"] + z @ x["context_kernel"]
        self.assertAllClose(out.gates, gates, atol=1e-5)
        want_h, want_c, _ = _numpy_lstm(gates, x["c"])
        self.assertAllClose(out.h, want_h, atol=1e-5)
        self.assertAllClose(out.c, want_c, atol=1e-5)

    def test_hard_attention_attends_at_the_argmax(self):
        x = _inputs(seed=3)
        out = _step(x, _dot_score, attention.hard_attend())
        scores = np.einsum("blp,bp->bl", x["projected"], x["score_in"])
        where = scores.argmax(-1)
        self.assertAllEqual(out.where, where)
        picked = x["features"][np.arange(BATCH), where]
        self.assertAllClose(out.context, picked)
        self.assertAllClose(out.z, picked)
        self.assertIsNone(out.beta)
        gates = x["word_gates"] + x["gates_h"] + picked @ x["context_kernel"]
        self.assertAllClose(out.h, _numpy_lstm(gates, x["c"])[0], atol=1e-5)

    def test_half_precision_scores_get_a_float32_softmax(self):
        x = _inputs(seed=4)

        def half_score(projected, score_in, h):
            scores, hidden = _dot_score(projected, score_in, h)
            return tf.cast(scores, tf.float16), hidden

        out = _step(x, half_score, attention.soft_attend)
        self.assertEqual((out.alpha.dtype, out.log_alpha.dtype), (tf.float32, tf.float32))
        scores = np.einsum("blp,bp->bl", x["projected"], x["score_in"])
        scores = scores.astype(np.float16).astype(np.float64)
        alpha = np.exp(scores - scores.max(-1, keepdims=True))
        self.assertAllClose(out.alpha, alpha / alpha.sum(-1, keepdims=True), atol=1e-6)


if __name__ == "__main__":
    tf.test.main()
