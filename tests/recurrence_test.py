"""Tests for sat_tf.model.fast.recurrence: the hand-written backward pass of the attention
recurrence (soft, and hard with its samples) against autodiff of the decoder's loop, and
against finite differences."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model.decoder import AttentionDecoder
from sat_tf.model.fast import recurrence, schedule

# Uneven sizes, so that a transposed or misplaced axis cannot go unnoticed.
BATCH, STEPS, LOCATIONS = 3, 5, 7
VOCAB, EMBED, HIDDEN, ATTENTION, FEATURES = 11, 5, 8, 4, 6
SCORES = ("additive", "dot", "scaled_dot")


def _decoder(
    score,
    seed=0,
    dtype=None,
    attention="soft",
    hard_gate=True,
    global_context=False,
    location_prior=False,
    compiled=False,
):
    """A built decoder with random weights (biases too); `dtype` a Keras dtype policy
    name (None: float32); `compiled`: the additive score through its compiled op."""
    decoder = AttentionDecoder(
        VOCAB,
        embed_dim=EMBED,
        hidden_dim=HIDDEN,
        attention_dim=ATTENTION,
        attention=attention,
        attention_score=score,
        dropout=0.0,
        hard_gate=hard_gate,
        global_context=global_context,
        location_prior=location_prior,
        dtype=dtype,
    )
    decoder.fused_hard = True  # this file tests the fused recurrence, hard attention's too
    decoder.compiled_score = compiled
    decoder.build((None, LOCATIONS, FEATURES))
    rng = np.random.default_rng(seed)
    for w in decoder.weights:
        w.assign(0.5 * rng.normal(size=w.shape).astype(np.float32))
    return decoder


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    features = tf.constant(rng.normal(size=(BATCH, LOCATIONS, FEATURES)), tf.float32)
    captions = tf.constant(rng.integers(1, VOCAB, size=(BATCH, STEPS)), tf.int32)
    return features, captions


def bfloat16_product_roundoff():
    """The unit roundoff of `tf.matmul` in bfloat16 on this CPU: 2^-8 where its float32
    sums are rounded to the nearest bfloat16 (oneDNN on CPUs with AVX-512 BF16 or AMX),
    2^-7 where they are rounded toward zero (Eigen's conversion, on CPUs without native
    bfloat16 arithmetic). Raises AssertionError for any other rounding."""
    # Small integers: every sum is exact in float32 whatever the order of its terms, and
    # most need more than bfloat16's 8 significant bits.
    rng = np.random.default_rng(0)
    a = tf.cast(rng.integers(-15, 16, size=(BATCH, 64)), tf.bfloat16)
    b = tf.cast(rng.integers(-15, 16, size=(64, 4 * HIDDEN)), tf.bfloat16)
    exact = tf.matmul(tf.cast(a, tf.float32), tf.cast(b, tf.float32)).numpy()
    got = tf.cast(tf.matmul(a, b), tf.float32).numpy()
    if np.array_equal(got, tf.cast(tf.cast(exact, tf.bfloat16), tf.float32).numpy()):
        return 2.0**-8
    toward_zero = (exact.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    if np.array_equal(got, toward_zero):
        return 2.0**-7
    raise AssertionError("bfloat16 products rounded neither to nearest nor toward zero")


def _loss(outputs, use_alpha):
    """Uses hs and zs (through the logits) and, with `use_alpha`, alpha, like the soft
    objective with its doubly stochastic penalty (paper §4.2.1)."""
    log_probs = tf.nn.log_softmax(outputs["logits"])
    weights = tf.reshape(tf.range(VOCAB, dtype=tf.float32) / VOCAB, [1, 1, VOCAB])
    loss = -tf.reduce_sum(log_probs * weights)
    if use_alpha:
        loss += 3.0 * tf.reduce_sum(tf.square(1.0 - tf.reduce_sum(outputs["alpha"], 1)))
    return loss


def _gradients(decoder, features, captions, autodiff, use_alpha=True, function=False):
    """Outputs and gradients (features first, then every trainable variable)."""

    def run(features, captions):
        with tf.GradientTape() as tape:
            tape.watch(features)
            outputs = decoder(features, captions, autodiff=autodiff)
            loss = _loss(outputs, use_alpha)
        grads = tape.gradient(loss, [features] + decoder.trainable_variables)
        return outputs, [tf.convert_to_tensor(g) for g in grads]

    if function:
        run = tf.function(run)
    return run(features, captions)


@pytest.mark.long(4)
class SoftAttentionRecurrenceTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(score=SCORES, function=(False, True))
    def test_forward_is_the_autodiff_loop(self, score, function):
        features, captions = _inputs(seed=1)
        decoder = _decoder(score, seed=1)
        old, _ = _gradients(decoder, features, captions, autodiff=True, function=function)
        new, _ = _gradients(decoder, features, captions, autodiff=False, function=function)
        # The reference loop makes one product per kernel with h_{t-1}, the recurrence one
        # over the fused kernel (and Grappler rewrites the graphs): a few float32 ulps.
        self.assertAllClose(new["logits"], old["logits"], atol=1e-6, rtol=0.0)
        self.assertAllClose(new["alpha"], old["alpha"], atol=1e-7, rtol=0.0)

    @parameterized.product(function=(False, True))
    def test_compiled_score_forward_is_the_autodiff_loop(self, function):
        # The op sums v . tanh in another order than the tensordot: float32 rounding.
        features, captions = _inputs(seed=1)
        decoder = _decoder("additive", seed=1, compiled=True)
        self.assertTrue(schedule.uses_compiled_score(decoder))
        old, _ = _gradients(decoder, features, captions, autodiff=True, function=function)
        new, _ = _gradients(decoder, features, captions, autodiff=False, function=function)
        self.assertAllClose(new["logits"], old["logits"], atol=1e-6, rtol=0.0)
        self.assertAllClose(new["alpha"], old["alpha"], atol=1e-7, rtol=0.0)

    @parameterized.parameters(
        *[(score, f, a, False) for score in SCORES for f in (False, True) for a in (True, False)],
        *[("additive", f, a, True) for f in (False, True) for a in (True, False)],
    )
    def test_gradients_match_autodiff_loop(self, score, function, use_alpha, compiled):
        features, captions = _inputs(seed=2)
        decoder = _decoder(score, seed=2, compiled=compiled)
        self.assertEqual(schedule.uses_compiled_score(decoder), compiled)
        names = ["features"] + [v.path for v in decoder.trainable_variables]
        _, old = _gradients(decoder, features, captions, True, use_alpha, function)
        _, new = _gradients(decoder, features, captions, False, use_alpha, function)
        self._assert_gradients_match(names, old, new)

    def _assert_gradients_match(self, names, expected, actual):
        """Every gradient within 1e-5 of the autodiff loop's (relative to its largest
        entry when above 1), and none of them zero."""
        self.assertLen(actual, len(expected))
        for name, want, got in zip(names, expected, actual, strict=True):
            scale = max(1.0, float(np.abs(want).max()))
            self.assertAllClose(got, want, atol=1e-5 * scale, rtol=0.0, msg=name)
            self.assertGreater(np.abs(want).max(), 0.0, name)

    @parameterized.parameters(*SCORES)
    def test_gradients_with_global_context_match_autodiff_loop(self, score):
        # G abar joins the word half of the gates, which the recurrence returns the
        # gradient of: G's gradient and the features' through abar come from it.
        features, captions = _inputs(seed=9)
        decoder = _decoder(score, seed=9, global_context=True)
        names = ["features"] + [v.path for v in decoder.trainable_variables]
        self.assertTrue(any("/G/" in name for name in names), names)
        _, old = _gradients(decoder, features, captions, autodiff=True)
        _, new = _gradients(decoder, features, captions, autodiff=False)
        self._assert_gradients_match(names, old, new)

    @parameterized.parameters(*[(score, False) for score in SCORES], ("additive", True))
    def test_gradients_with_location_prior_match_autodiff_loop(self, score, compiled):
        # The per-cell vectors join the projection W_a a, whose gradient the recurrence
        # returns: theirs comes from it, and must not be zero.
        features, captions = _inputs(seed=10)
        decoder = _decoder(score, seed=10, location_prior=True, compiled=compiled)
        self.assertEqual(schedule.uses_compiled_score(decoder), compiled)
        names = ["features"] + [v.path for v in decoder.trainable_variables]
        self.assertTrue(any(name.endswith("/location") for name in names), names)
        _, old = _gradients(decoder, features, captions, autodiff=True)
        _, new = _gradients(decoder, features, captions, autodiff=False)
        self._assert_gradients_match(names, old, new)

    @parameterized.parameters(*SCORES)
    def test_jacobian_matches_finite_differences(self, score):
        # float64 and sizes of 2 or 3, so that every output (hs, zs and alphas) is
        # differentiated with respect to every input element.
        rng = np.random.default_rng(3)
        batch, steps, locations, dim, hidden, units = 2, 3, 3, 2, 2, 3

        def normal(*shape):
            return tf.constant(0.7 * rng.normal(size=shape), tf.float64)

        additive = score == "additive"
        width = 4 * hidden + (units if additive else 0) + 1
        inputs = [
            normal(steps, batch, 4 * hidden),
            normal(batch, locations, units if additive else hidden),
            normal(batch, locations, dim),
            normal(batch, hidden),
            normal(batch, hidden),
            normal(hidden, width),
            normal(dim, 4 * hidden),
            normal(1),
        ]
        if additive:
            inputs.append(normal(units, 1))

        @tf.function
        def flat(*args):
            outputs = recurrence.attention_recurrence(*args)
            return tf.concat([tf.reshape(x, [-1]) for x in outputs], 0)

        theoretical, numerical = tf.test.compute_gradient(flat, inputs, delta=1e-6)
        for i, (jac, num) in enumerate(zip(theoretical, numerical, strict=True)):
            self.assertGreater(np.abs(num).max(), 1e-3, f"input {i}")
            self.assertAllClose(jac, num, atol=1e-7, rtol=1e-6, msg=f"input {i}")

    def test_the_bfloat16_product_rounds_to_nearest_or_toward_zero(self):
        # The two roundings `bfloat16_product_roundoff` tells apart, on products whose
        # float32 value holds more than bfloat16's 8 significant bits (no ties).
        a = tf.constant([[1.0 + 2.0**-7]], tf.float32)
        b = tf.constant([[1.5 + 2.0**-7]], tf.float32)
        # (1 + 2^-7)(1.5 + 2^-7) = 1.5 + 2^-6 + 2^-8 + 2^-14: nearest 1.5 + 2^-6 + 2^-7,
        # toward zero 1.5 + 2^-6.
        product = tf.matmul(tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16))
        got = float(tf.cast(product, tf.float32)[0, 0])
        unit = bfloat16_product_roundoff()
        self.assertEqual(got, {2.0**-8: 1.5 + 2.0**-6 + 2.0**-7, 2.0**-7: 1.5 + 2.0**-6}[unit])

    @parameterized.parameters(*SCORES)
    def test_bfloat16_recurrence_is_as_close_to_float32_as_the_autodiff_loop(self, score):
        # Reference: float32 autodiff of the same weights. The bfloat16 autodiff loop's
        # distance from it is what bfloat16 costs; the fused recurrence in bfloat16 must
        # not cost more than twice that, plus two unit roundoffs u of the gradient's scale
        # for what one comparison of a few entries (the gate bias is one scalar) leaves to
        # chance. u is that of the CPU's bfloat16 products (`bfloat16_product_roundoff`):
        # 2^-8 where they round to nearest, 2^-7 where they round toward zero.
        unit = bfloat16_product_roundoff()
        features, captions = _inputs(seed=4)
        reference = _gradients(_decoder(score, seed=4), features, captions, True)
        # As training builds it: under the global policy, so that every sublayer is mixed.
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        try:
            mixed = _decoder(score, seed=4)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        self.assertTrue(schedule.uses_recurrence(mixed))
        fused = _gradients(mixed, features, captions, False)
        looped = _gradients(mixed, features, captions, True)
        names = ["features"] + [v.path for v in mixed.trainable_variables]
        for key in ("logits", "alpha"):
            self.assertEqual(fused[0][key].dtype, tf.float32, key)
            expected = reference[0][key].numpy()
            fused_error = np.abs(fused[0][key].numpy() - expected).max()
            loop_error = np.abs(looped[0][key].numpy() - expected).max()
            self.assertLessEqual(fused_error, 2 * loop_error + 1e-2, key)
        for name, want, got, loop in zip(names, reference[1], fused[1], looped[1], strict=True):
            want = want.numpy().astype(np.float64)
            scale = np.abs(want).max()
            self.assertGreater(scale, 0.0, name)
            fused_error = np.abs(got.numpy().astype(np.float64) - want).max() / scale
            loop_error = np.abs(loop.numpy().astype(np.float64) - want).max() / scale
            self.assertLessEqual(fused_error, 2 * loop_error + 2 * unit, name)
            self.assertLess(fused_error, 0.1, name)


class HardAttentionRecurrenceTest(tf.test.TestCase, parameterized.TestCase):
    """Hard attention through the recurrence against the decoder's autodiff loop, with the
    same Gumbel noise and the same captions taking the expected context."""

    def _run(self, decoder, features, captions, autodiff, noise, expected, function):
        def run(features, captions):
            with tf.GradientTape() as tape:
                tape.watch(features)
                outputs = decoder(
                    features, captions, gumbel_noise=noise, use_expected=expected, autodiff=autodiff
                )
                # Every output the hard objective reads: the words (through the logits),
                # log alpha at the samples (REINFORCE) and alpha's entropy.
                loss = _loss(outputs, use_alpha=False)
                loss += tf.reduce_sum(outputs["log_p_s"] * tf.range(1.0, STEPS + 1.0))
                loss -= 0.3 * tf.reduce_sum(outputs["entropy"])
            grads = tape.gradient(loss, [features] + decoder.trainable_variables)
            return outputs, [tf.convert_to_tensor(g) for g in grads]

        return (tf.function(run) if function else run)(features, captions)

    def _assert_schedules_match(self, decoder, features, captions, noise, expected, function):
        """`call` against `call(autodiff=True)`: the outputs the hard objective reads, and
        every gradient within 1e-5 of the reference's (relative to its largest entry when
        above 1)."""
        old = self._run(decoder, features, captions, True, noise, expected, function)
        new = self._run(decoder, features, captions, False, noise, expected, function)
        for key in ("logits", "alpha", "log_p_s", "entropy"):
            self.assertAllClose(new[0][key], old[0][key], atol=2e-5, rtol=1e-5, msg=key)
        names = ["features"] + [v.path for v in decoder.trainable_variables]
        for name, expected_grad, actual in zip(names, old[1], new[1], strict=True):
            scale = max(1.0, float(np.abs(expected_grad).max()))
            self.assertAllClose(actual, expected_grad, atol=1e-5 * scale, rtol=0.0, msg=name)

    @parameterized.parameters(
        *[(score, False, mix, False) for score in SCORES for mix in ("some", "none", "all")],
        *[(score, True, "some", False) for score in SCORES],  # in a graph too
        *[("additive", function, "some", True) for function in (False, True)],
    )
    def test_outputs_and_gradients_match_autodiff_loop(self, score, function, mix, compiled):
        features, captions = _inputs(seed=5)
        decoder = _decoder(score, seed=5, attention="hard", compiled=compiled)
        self.assertEqual(schedule.uses_compiled_score(decoder), compiled)
        self.assertTrue(schedule.uses_recurrence(decoder))
        rng = np.random.default_rng(5)
        noise = tf.constant(rng.gumbel(size=(BATCH, STEPS, LOCATIONS)), tf.float32)
        expected = tf.constant(
            {"some": [True, False, True], "none": [False] * 3, "all": [True] * 3}[mix]
        )
        self._assert_schedules_match(decoder, features, captions, noise, expected, function)

    @parameterized.parameters(False, True)
    def test_autodiff_loop_with_the_compiled_score_matches_the_reference(self, function):
        # Hard attention's training schedule: the autodiff loop with the additive score
        # through its compiled op and the gradient fused_score registers for it.
        features, captions = _inputs(seed=6)
        decoder = _decoder("additive", seed=6, attention="hard", compiled=True)
        decoder.fused_hard = False
        self.assertFalse(schedule.uses_recurrence(decoder))
        self.assertTrue(schedule.uses_compiled_score(decoder))
        rng = np.random.default_rng(6)
        noise = tf.constant(rng.gumbel(size=(BATCH, STEPS, LOCATIONS)), tf.float32)
        expected = tf.constant([True, False, True])
        self._assert_schedules_match(decoder, features, captions, noise, expected, function)

    def test_samples_follow_the_noise_and_argmax_without_it(self):
        features, captions = _inputs(seed=6)
        decoder = _decoder("additive", seed=6, attention="hard")
        # Noise that dwarfs the scores picks its own argmax: the attended locations are
        # known, and so is log alpha there.
        rng = np.random.default_rng(6)
        where = rng.integers(0, LOCATIONS, size=(BATCH, STEPS))
        noise = tf.constant(1e4 * np.eye(LOCATIONS)[where], tf.float32)
        outputs = decoder(features, captions, gumbel_noise=noise)
        alpha = outputs["alpha"].numpy()
        chosen = np.take_along_axis(alpha, where[..., None], axis=2)[..., 0]
        self.assertAllClose(outputs["log_p_s"], np.log(chosen), rtol=1e-5)
        greedy = decoder(features, captions)
        self.assertAllClose(greedy["log_p_s"], np.log(greedy["alpha"].numpy().max(-1)), rtol=1e-5)
        reference = decoder(features, captions, autodiff=True)
        self.assertAllClose(greedy["logits"], reference["logits"], atol=1e-6, rtol=0.0)


if __name__ == "__main__":
    tf.test.main()
