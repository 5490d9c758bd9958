"""Tests for sat_tf.model.losses: hand-computed values and the REINFORCE estimator (paper §4.1).

The key test enumerates every attention trajectory of a tiny hard-attention decoder to
get the exact gradient of the lower bound `L_s = sum_s p(s|a) log p(y|s,a)` (eq. 10), and
checks that the mean of the surrogate's gradient over sampled trajectories matches it.
"""

import itertools

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model import losses
from sat_tf.model.decoder import AttentionDecoder


class SequenceLogLikelihoodTest(tf.test.TestCase):
    def test_hand_computed(self):
        logits = np.array(
            [
                [
                    np.log([0.5, 0.25, 0.125, 0.125]),
                    [0.0, 0.0, 0.0, 0.0],
                    [0.0, 10.0, 0.0, 0.0],
                ],
                [
                    np.log([0.1, 0.2, 0.3, 0.4]),
                    np.log([0.25, 0.25, 0.25, 0.25]) + 5.0,
                    np.log([0.7, 0.1, 0.1, 0.1]),
                ],
            ],
            np.float32,
        )
        targets = np.array([[0, 3, 0], [3, 2, 1]], np.int32)
        mask = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], np.float32)
        # Row 0: log 0.5 + log 0.25 (the third step is padding) = log 0.125.
        # Row 1: log 0.4 + log 0.25 + log 0.1 = log 0.01.
        expected = [np.log(0.125), np.log(0.01)]
        self.assertAllClose(
            losses.sequence_log_likelihood(logits, targets, mask), expected, atol=1e-6
        )


class DoublyStochasticPenaltyTest(tf.test.TestCase):
    def test_padding_is_left_out(self):
        alpha = np.array([[[0.7, 0.3], [0.4, 0.6], [0.9, 0.1]]], np.float32)
        mask = np.array([[1.0, 1.0, 0.0]], np.float32)
        # Coverage over the two real steps: (0.7 + 0.4, 0.3 + 0.6) = (1.1, 0.9);
        # (1 - 1.1)^2 + (1 - 0.9)^2 = 0.01 + 0.01 = 0.02. With the padded step it would be
        # (1 - 2.0)^2 + (1 - 1.0)^2 = 1.
        self.assertAllClose(losses.doubly_stochastic_penalty(alpha, mask), [0.02], atol=1e-6)

    def test_batch(self):
        alpha = np.array(
            [
                [[0.7, 0.3], [0.4, 0.6], [0.9, 0.1]],
                [[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]],
            ],
            np.float32,
        )
        mask = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], np.float32)
        # Row 1: coverage (1.5, 1.5); 0.25 + 0.25 = 0.5.
        self.assertAllClose(losses.doubly_stochastic_penalty(alpha, mask), [0.02, 0.5], atol=1e-6)


class ReinforceSurrogateTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.log_likelihood = tf.constant([-2.0, -3.0, -1.0])
        self.log_p_s = tf.constant([[-0.5, -1.0], [-1.2, -0.1], [-0.2, -0.7]])
        self.entropy = tf.constant([[1.0, 0.5], [0.9, 0.9], [0.8, 0.3]])
        self.mask = tf.constant([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
        self.sampled = tf.constant([1.0, 0.0, 1.0])
        self.baseline = tf.Variable(-2.5)
        self.reinforce_weight, self.entropy_weight = 0.5, 0.1

    def _surrogate(self):
        return losses.reinforce_surrogate(
            self.log_likelihood,
            self.log_p_s,
            self.entropy,
            self.mask,
            self.sampled,
            self.baseline,
            self.reinforce_weight,
            self.entropy_weight,
        )

    def test_value(self):
        # Row 0: r - b = 0.5, log p(s) = -1.5, H = 1.5:
        #   -(-2 + 0.5 * 0.5 * -1.5 + 0.1 * 1.5) = -(-2 - 0.375 + 0.15) = 2.225.
        # Row 1 used the expected context: -(-3) = 3.
        # Row 2: r - b = 1.5, log p(s) = -0.2 and H = 0.8 (step 2 is padding):
        #   -(-1 + 0.5 * 1.5 * -0.2 + 0.1 * 0.8) = -(-1 - 0.15 + 0.08) = 1.07.
        self.assertAllClose(self._surrogate(), [2.225, 3.0, 1.07], atol=1e-6)

    def test_gradients(self):
        inputs = [self.log_likelihood, self.log_p_s, self.entropy]
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            total = tf.reduce_sum(self._surrogate())
        d_ll, d_log_p_s, d_entropy, d_baseline = tape.gradient(total, [*inputs, self.baseline])
        # The reward r = log p(y|s,a) in (r - b) carries no gradient.
        self.assertAllClose(d_ll, [-1.0, -1.0, -1.0])
        # -lambda_r * sampled * (r - b) * mask.
        self.assertAllClose(d_log_p_s, [[-0.25, -0.25], [0.0, 0.0], [-0.75, 0.0]])
        # -lambda_e * sampled * mask.
        self.assertAllClose(d_entropy, [[-0.1, -0.1], [0.0, 0.0], [-0.1, 0.0]])
        self.assertTrue(d_baseline is None or float(d_baseline) == 0.0)

    def test_reward_to_go(self):
        words = tf.constant([[-1.0, -2.0, -0.5], [-0.25, -1.0, 0.0]])
        self.assertAllClose(losses.reinforce_reward(words, to_go=False), [-3.5, -1.25])
        # Step t is credited with words t.. only; padding (0) adds nothing.
        self.assertAllClose(
            losses.reinforce_reward(words, to_go=True), [[-3.5, -2.5, -0.5], [-1.25, -1.0, 0.0]]
        )

    def test_reward_per_step(self):
        reward = tf.constant([[-2.0, -1.5], [-3.0, -1.0], [-1.0, -0.5]])
        baseline = tf.constant([[-1.0, -1.0], [0.0, 0.0], [-2.0, 0.5]])
        with tf.GradientTape() as tape:
            tape.watch(self.log_p_s)
            value = losses.reinforce_surrogate(
                self.log_likelihood,
                self.log_p_s,
                self.entropy,
                self.mask,
                self.sampled,
                baseline,
                self.reinforce_weight,
                self.entropy_weight,
                reward=reward,
            )
        # Row 0: advantages (-1, -0.5) against log p(s_t) (-0.5, -1): 0.5 + 0.5 = 1.0;
        #   -(-2 + 0.5 * 1.0 + 0.1 * 1.5) = 1.35. Row 1: expected context, 3.
        # Row 2: advantage 1 at step 1 (step 2 is padding): 1 * -0.2 = -0.2;
        #   -(-1 + 0.5 * -0.2 + 0.1 * 0.8) = 1.02.
        self.assertAllClose(value, [1.35, 3.0, 1.02], atol=1e-6)
        # d/d log p(s_t) = -lambda_r * sampled * (r_t - b_t) * mask.
        self.assertAllClose(
            tape.gradient(value, self.log_p_s), [[0.5, 0.25], [0.0, 0.0], [-0.5, 0.0]]
        )


LOCATIONS, STEPS, VOCAB, WIDTH = 3, 2, 6, 4
CAPTION = [1, 4, 2]  # <start> w <end>: two targets, so two attention steps.
GROUPS, GROUP_SIZE = 40, 100


def _flat(grads, variables):
    return np.concatenate(
        [
            np.zeros(v.shape).ravel() if g is None else tf.convert_to_tensor(g).numpy().ravel()
            for g, v in zip(grads, variables, strict=True)
        ]
    )


class ReinforceEstimatorTest(tf.test.TestCase, parameterized.TestCase):
    """The hard-attention gradient estimate against the exact gradient of L_s.

    With L = 3 locations and T = 2 steps there are 9 trajectories s. Gumbel noise of 1e4
    at s_t forces the decoder to attend at s_t, which gives log p(s|a) (the sum of
    log_p_s) and log p(y|s,a) for each, hence the exact bound and its gradient.
    """

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        keras.utils.set_random_seed(0)
        cls.decoder = AttentionDecoder(
            VOCAB,
            embed_dim=WIDTH,
            hidden_dim=WIDTH,
            attention_dim=WIDTH,
            attention="hard",
            dropout=0.0,
            hard_gate=False,
        )
        cls.decoder.build((None, LOCATIONS, WIDTH))
        rng = np.random.default_rng(0)
        # Large weights and features make log p(y|s,a) depend strongly on s.
        for w in cls.decoder.weights:
            w.assign(rng.normal(size=w.shape).astype(np.float32))
        cls.features = 2.0 * rng.normal(size=(1, LOCATIONS, WIDTH)).astype(np.float32)
        cls.variables = cls.decoder.trainable_variables
        cls.paths = np.array(list(itertools.product(range(LOCATIONS), repeat=STEPS)))
        forcing = 1e4 * np.eye(LOCATIONS, dtype=np.float32)[cls.paths]  # (9, T, L)
        with tf.GradientTape() as tape:
            cls.outputs, cls.log_likelihood, _ = cls._run(forcing)
            cls.p_s = tf.exp(tf.reduce_sum(cls.outputs["log_p_s"], axis=1))  # (9,)
            cls.bound = tf.reduce_sum(cls.p_s * cls.log_likelihood)
        cls.exact = _flat(tape.gradient(cls.bound, cls.variables), cls.variables)

        def surrogate_gradient(to_go):
            @tf.function
            def gradient(noise, baseline, reinforce_weight):
                with tf.GradientTape() as tape:
                    outputs, log_likelihood, words = cls._run(noise)
                    n = tf.shape(noise)[0]
                    surrogate = losses.reinforce_surrogate(
                        log_likelihood,
                        outputs["log_p_s"],
                        outputs["entropy"],
                        tf.ones([n, STEPS]),
                        tf.ones([n]),
                        baseline,
                        reinforce_weight,
                        0.0,
                        reward=losses.reinforce_reward(words, to_go),
                    )
                    objective = -tf.reduce_mean(surrogate)
                return tape.gradient(objective, cls.variables), tf.reduce_mean(log_likelihood)

            return gradient

        cls.surrogate_gradient = {to_go: surrogate_gradient(to_go) for to_go in (False, True)}

    @classmethod
    def _run(cls, noise):
        """Decoder outputs, log p(y|s,a) and log p(y_t|...) (B, T) for the caption tiled
        once per noise row; noise None attends at argmax alpha."""
        n = 1 if noise is None else tf.shape(noise)[0]
        captions = tf.tile(tf.constant([CAPTION], tf.int32), [n, 1])
        features = tf.tile(cls.features, [n, 1, 1])
        outputs = cls.decoder(
            features,
            captions[:, :-1],
            training=False,
            gumbel_noise=noise,
            use_expected=tf.zeros([n], tf.bool),
        )
        words = losses.word_log_likelihood(outputs["logits"], captions[:, 1:], tf.ones([n, STEPS]))
        return outputs, tf.reduce_sum(words, axis=1), words

    def _estimate(self, baseline, reinforce_weight, seed=1, to_go=False):
        """Mean of the per-sample gradient over GROUPS * GROUP_SIZE trajectories, and its
        standard error from the spread of the group means."""
        rng = np.random.default_rng(seed)
        grads, rewards = [], []
        for _ in range(GROUPS):
            uniform = rng.uniform(1e-9, 1.0, size=(GROUP_SIZE, STEPS, LOCATIONS))
            noise = tf.constant(-np.log(-np.log(uniform)), tf.float32)
            grad, reward = self.surrogate_gradient[to_go](
                noise, tf.constant(baseline, tf.float32), tf.constant(reinforce_weight)
            )
            grads.append(_flat(grad, self.variables))
            rewards.append(float(reward))
        grads = np.stack(grads)
        standard_error = grads.std(axis=0, ddof=1) / np.sqrt(GROUPS)
        return grads.mean(axis=0), standard_error, np.array(rewards)

    def _within(self, mean, standard_error):
        """Coordinates where |mean - exact| <= 5 standard errors (+ float32 slack)."""
        return np.abs(mean - self.exact) <= 5.0 * standard_error + 1e-4

    def test_enumeration_is_exact(self):
        # The 9 forced trajectories are the whole sample space of s.
        self.assertAllClose(tf.reduce_sum(self.p_s), 1.0, atol=1e-5)
        log_alpha = np.log(self.outputs["alpha"].numpy())  # (9, T, L)
        forced = np.take_along_axis(log_alpha, self.paths[..., None], axis=-1)[..., 0]
        self.assertAllClose(self.outputs["log_p_s"], forced, atol=1e-5)
        # log p(y|s,a) varies with s, so the score-function term matters.
        self.assertGreater(np.ptp(self.log_likelihood.numpy()), 1.0)
        self.assertGreater(np.abs(self.exact).max(), 0.5)

    @parameterized.parameters(0.0, -5.0)
    def test_estimate_matches_exact_gradient(self, baseline):
        mean, standard_error, rewards = self._estimate(baseline, 1.0)
        self.assertTrue(self._within(mean, standard_error).all())
        # The mean reward estimates the bound itself.
        reward_error = rewards.std(ddof=1) / np.sqrt(GROUPS)
        self.assertLess(abs(rewards.mean() - float(self.bound)), 5.0 * reward_error)

    def test_baseline_does_not_move_the_mean(self):
        mean_0, error_0, _ = self._estimate(0.0, 1.0, seed=2)
        mean_5, error_5, _ = self._estimate(-5.0, 1.0, seed=2)
        # Same samples: the difference is 5 * mean(d log p(s|a)/dW), whose expectation is 0.
        self.assertAllLessEqual(np.abs(mean_0 - mean_5) - 5.0 * (error_0 + error_5) - 1e-4, 0.0)

    @parameterized.parameters(([0.0, 0.0],), ([-5.0, -2.0],), ("argmax",))
    def test_reward_to_go_matches_exact_gradient(self, baseline):
        if baseline == "argmax":
            # The rewards to go of the caption decoded at argmax alpha: no sample in it.
            _, _, words = self._run(None)
            baseline = tf.math.cumsum(words[0], reverse=True).numpy()
        mean, standard_error, _ = self._estimate(baseline, 1.0, to_go=True)
        self.assertTrue(self._within(mean, standard_error).all())

    def test_reward_to_go_baselines_do_not_move_the_mean(self):
        mean_0, error_0, _ = self._estimate([0.0, 0.0], 1.0, seed=3, to_go=True)
        mean_b, error_b, _ = self._estimate([-5.0, 3.0], 1.0, seed=3, to_go=True)
        self.assertAllLessEqual(np.abs(mean_0 - mean_b) - 5.0 * (error_0 + error_b) - 1e-4, 0.0)

    def test_reward_to_go_with_argmax_baseline_has_lower_variance(self):
        # The same samples under the paper's estimator (whole-caption reward, baseline 0)
        # and under reward to go with the argmax baseline.
        _, paper_error, _ = self._estimate(0.0, 1.0, seed=4)
        _, _, words = self._run(None)
        argmax = tf.math.cumsum(words[0], reverse=True).numpy()
        _, default_error, _ = self._estimate(argmax, 1.0, seed=4, to_go=True)
        self.assertLess(np.square(default_error).sum(), 0.5 * np.square(paper_error).sum())

    def test_without_score_function_term_is_biased(self):
        mean, standard_error, _ = self._estimate(0.0, 0.0)
        outside = ~self._within(mean, standard_error)
        self.assertGreater(outside.sum(), 10)
        self.assertGreater(np.abs(mean - self.exact).max(), 0.1)


if __name__ == "__main__":
    tf.test.main()
