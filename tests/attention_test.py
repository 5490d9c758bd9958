"""Tests for sat_tf.model.attention against NumPy versions of the paper's formulas (§4)."""

import fixtures
import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf import config
from sat_tf.model import attention

BATCH, LOCATIONS, FEATURES, HIDDEN, UNITS = 2, 4, 8, 6, 8


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(BATCH, LOCATIONS, FEATURES)).astype(np.float32)
    h = rng.normal(size=(BATCH, HIDDEN)).astype(np.float32)
    return features, h


def _make(score):
    """A built score layer with inputs; the state has HIDDEN != UNITS entries."""
    if score == "additive":
        layer = attention.AdditiveScore(UNITS, name="f_att")
    else:
        layer = attention.SCORES[score](HIDDEN, name="f_att")
    features, h = _inputs()
    layer(features, h)
    return layer, features, h


def _numpy_scores(layer, features, h):
    """`v^T tanh(W_a a_i + U_a h)`, `a_i^T W_a h` or that over sqrt(n), from the layer's
    own weights."""
    if isinstance(layer, attention.AdditiveScore):
        w, b = layer.w_a.kernel.numpy(), layer.w_a.bias.numpy()
        u, v = layer.u_a.kernel.numpy(), layer.v.kernel.numpy()
        pre = np.tanh(features @ w + b + (h @ u)[:, None, :])
        return (pre @ v)[..., 0]
    w = layer.w_a.kernel.numpy()
    scale = 1 / np.sqrt(h.shape[-1]) if isinstance(layer, attention.ScaledDotScore) else 1.0
    return scale * np.einsum("bld,du,bu->bl", features, w, h)


def _scale(layer):
    """The factor `project` puts on `a W_a`: 1 / sqrt(units) for the scaled dot score."""
    return 1 / np.sqrt(layer.units) if isinstance(layer, attention.ScaledDotScore) else 1.0


def _copy_weights(source, target):
    for src, dst in zip(source.weights, target.weights, strict=True):
        dst.assign(src)


class ScoreTest(tf.test.TestCase, parameterized.TestCase):
    def setUp(self):
        super().setUp()
        keras.utils.set_random_seed(0)

    @parameterized.parameters("additive", "dot", "scaled_dot")
    def test_output_shape(self, score):
        layer, features, h = _make(score)
        self.assertEqual(layer(features, h).shape, (BATCH, LOCATIONS))

    @parameterized.parameters(
        # W_a: D*A + A (kernel and bias), U_a: n*A, v: A.
        ("additive", 4, FEATURES * UNITS + UNITS + HIDDEN * UNITS + UNITS),
        # W_a: D*n, no bias.
        ("dot", 1, FEATURES * HIDDEN),
        ("scaled_dot", 1, FEATURES * HIDDEN),
    )
    def test_weight_count(self, score, num_tensors, num_params):
        layer, _, _ = _make(score)
        self.assertLen(layer.trainable_weights, num_tensors)
        self.assertEqual(sum(int(np.prod(w.shape)) for w in layer.weights), num_params)

    @parameterized.parameters("additive", "dot", "scaled_dot")
    def test_scores_match_numpy(self, score):
        layer, features, h = _make(score)
        # Nonzero biases so that a dropped bias would show.
        for w in layer.weights:
            w.assign(np.random.default_rng(1).normal(size=w.shape).astype(np.float32))
        expected = _numpy_scores(layer, features, h)
        self.assertAllClose(layer(features, h), expected, atol=1e-5)

    @parameterized.parameters("additive", "dot", "scaled_dot")
    def test_project_then_score_equals_call(self, score):
        layer, features, h = _make(score)
        projected = layer.project(features)
        self.assertEqual(projected.shape, (BATCH, LOCATIONS, layer.units))
        self.assertAllClose(layer.score(projected, h), layer(features, h), atol=1e-6)

    @parameterized.parameters("additive", "dot", "scaled_dot")
    def test_config_round_trip(self, score):
        layer, features, h = _make(score)
        self.assertEqual(layer.get_config()["units"], layer.units)
        fixtures.check_round_trip(self, layer, features, h)

    @parameterized.parameters("additive", "dot", "scaled_dot")
    def test_keras_save_load(self, score):
        layer, features, h = _make(score)
        feature_input = keras.Input((LOCATIONS, FEATURES))
        hidden_input = keras.Input((h.shape[-1],))
        wrapper = keras.Model(
            [feature_input, hidden_input], layer(feature_input, hidden_input), name="wrapper"
        )
        expected = _numpy_scores(layer, features, h)
        loaded = fixtures.check_saved_model_file(self, wrapper, [features, h], expected, 1e-5)
        self.assertIsInstance(loaded.get_layer("f_att"), type(layer))

    @parameterized.parameters("additive", "dot", "scaled_dot")
    def test_location_vectors_join_the_projection(self, score):
        # p (L, units) adds to W_a a_i inside the score: the scores are the reference's
        # on the projection plus p, and the layer has L * units more numbers.
        plain, features, h = _make(score)
        layer = type(plain)(plain.units, location=True, name="f_att")
        layer(features, h)
        self.assertEqual(
            sum(int(np.prod(w.shape)) for w in layer.weights),
            sum(int(np.prod(w.shape)) for w in plain.weights) + LOCATIONS * plain.units,
        )
        self.assertAllEqual(layer.location_embedding, np.zeros((LOCATIONS, plain.units)))
        rng = np.random.default_rng(3)
        for w in layer.weights:
            w.assign(rng.normal(size=w.shape).astype(np.float32))
        place = layer.location_embedding.numpy()
        projected = layer.project(features)
        self.assertAllClose(
            projected - layer.w_a(features) * _scale(layer),
            np.tile(place, (BATCH, 1, 1)),
            atol=1e-5,
        )
        if score == "additive":
            w, b = layer.w_a.kernel.numpy(), layer.w_a.bias.numpy()
            u, v = layer.u_a.kernel.numpy(), layer.v.kernel.numpy()
            expected = (np.tanh(features @ w + b + place + (h @ u)[:, None, :]) @ v)[..., 0]
        else:
            keys = features @ layer.w_a.kernel.numpy() * _scale(layer)
            expected = np.einsum("blu,bu->bl", keys + place, h)
        self.assertAllClose(layer(features, h), expected, atol=1e-4)
        self.assertTrue(layer.get_config()["location"])
        fixtures.check_round_trip(self, layer, features, h)

    def test_config_offers_every_score(self):
        # `Config` lists the names without importing the model; the two lists must agree.
        self.assertEqual(config.ATTENTION_SCORES, tuple(attention.SCORES))

    def test_scaled_dot_is_dot_over_sqrt_units(self):
        dot, features, h = _make("dot")
        scaled, _, _ = _make("scaled_dot")
        _copy_weights(dot, scaled)
        # HIDDEN = 6: the scores differ by the factor 1 / sqrt(6) exactly.
        self.assertAllClose(scaled(features, h), dot(features, h) / np.sqrt(6.0), atol=1e-6)


class ContextTest(tf.test.TestCase):
    def test_soft_context(self):
        rng = np.random.default_rng(0)
        features = rng.normal(size=(BATCH, LOCATIONS, FEATURES)).astype(np.float32)
        alpha = rng.dirichlet(np.ones(LOCATIONS), size=BATCH).astype(np.float32)
        expected = np.stack([alpha[b] @ features[b] for b in range(BATCH)])
        self.assertAllClose(attention.soft_context(alpha, features), expected, atol=1e-6)

    def test_soft_context_by_hand(self):
        features = np.array([[[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]]], np.float32)
        alpha = np.array([[0.5, 0.25, 0.25]], np.float32)
        # 0.5 * (1, 0) + 0.25 * (0, 2) + 0.25 * (4, 4) = (1.5, 1.5).
        self.assertAllClose(attention.soft_context(alpha, features), [[1.5, 1.5]])

    def test_hard_context(self):
        features = np.arange(BATCH * LOCATIONS * 3, dtype=np.float32).reshape(BATCH, LOCATIONS, 3)
        locations = np.array([3, 1], np.int32)
        # Row b, location s starts at 12 b + 3 s.
        self.assertAllEqual(
            attention.hard_context(locations, features), [[9.0, 10.0, 11.0], [15.0, 16.0, 17.0]]
        )


class GumbelSampleTest(tf.test.TestCase):
    def test_fixed_noise(self):
        log_alpha = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]], np.float32))
        noise = np.array([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]], np.float32)
        # Row 0: log 0.1 + 2 = -0.30 beats log 0.4 = -0.92.
        # Row 1: log 0.1 + 1 = -1.30 loses to log 0.7 = -0.36.
        self.assertAllEqual(attention.gumbel_sample(log_alpha, noise), [0, 0])
        noise[1, 2] = 2.0
        # Row 1: log 0.1 + 2 = -0.30 now beats log 0.7.
        self.assertAllEqual(attention.gumbel_sample(log_alpha, noise), [0, 2])

    def test_frequencies_match_alpha(self):
        samples = 20000
        alpha = np.array([0.05, 0.15, 0.3, 0.5])
        rng = np.random.default_rng(0)
        uniform = rng.uniform(1e-12, 1.0, size=(samples, LOCATIONS))
        noise = (-np.log(-np.log(uniform))).astype(np.float32)
        log_alpha = np.tile(np.log(alpha), (samples, 1)).astype(np.float32)
        where = attention.gumbel_sample(log_alpha, noise)
        counts = np.bincount(where.numpy(), minlength=LOCATIONS)
        frequencies = counts / samples
        # Binomial standard deviation of each frequency; 5 sigma.
        tolerance = 5 * np.sqrt(alpha * (1 - alpha) / samples)
        self.assertAllLessEqual(np.abs(frequencies - alpha) - tolerance, 0.0)
        # Unnormalised scores (log alpha + const) sample the same distribution.
        shifted = attention.gumbel_sample(log_alpha + 3.0, noise)
        self.assertAllEqual(shifted, where)


if __name__ == "__main__":
    tf.test.main()
