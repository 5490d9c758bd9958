"""Tests for sat_tf.model.sampling on hand-made distributions: the nucleus against sets
worked out by hand, draws against their probabilities counted over many rows, the
Gumbel-max perturbation against the distribution it must draw from, and the ranking of
samples against a Python sort (search_test.py runs them inside the searches)."""

from typing import NamedTuple

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model import sampling

NEG_INF = float("-inf")
# Probabilities that sum exactly in float32: 1/2, 1/4, 1/8, 1/8.
HALVES = np.array([0.5, 0.25, 0.125, 0.125])


def _log(probs):
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(probs, np.float32))


def _frequencies(words, vocab_size):
    return np.bincount(np.asarray(words).reshape(-1), minlength=vocab_size) / np.size(words)


class NucleusTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(
        # The fewest most likely words whose probability reaches top_p; the last two are
        # tied, so they are kept or dropped together.
        (0.3, {0}),
        (0.5, {0}),
        (0.6, {0, 1}),
        (0.75, {0, 1}),
        (0.8, {0, 1, 2, 3}),
        (1.0, {0, 1, 2, 3}),
    )
    def test_the_words_kept_by_hand(self, top_p, kept):
        # Two rows, the second the same words in another order: rows are cut alone.
        order = np.array([2, 0, 3, 1])
        logits = _log(np.stack([HALVES, HALVES[order]]))
        got = sampling.nucleus(tf.constant(logits), top_p).numpy()
        for row, words in (
            (got[0], kept),
            (got[1], {int(np.where(order == w)[0][0]) for w in kept}),
        ):
            self.assertEqual({w for w in range(4) if row[w] > NEG_INF}, words)
        self.assertAllEqual(got[0][sorted(kept)], logits[0][sorted(kept)])

    def test_blocked_words_stay_out(self):
        # -inf (blocked) and -1e9 (never emitted) have probability 0: cut or left as
        # they are, never raised.
        logits = np.array([[NEG_INF, -1e9, 0.0, -1.0]], np.float32)
        for top_p in (0.5, 1.0):
            got = sampling.nucleus(tf.constant(logits), top_p).numpy()[0]
            self.assertEqual(got[0], NEG_INF)
            self.assertLessEqual(got[1], -1e9)
            self.assertEqual(got[2], 0.0)
        self.assertEqual(got[3], -1.0)


class DrawTest(tf.test.TestCase):
    def test_without_temperature_or_nucleus_the_categorical_draw(self):
        # Self-critical training's samples are those it drew before the temperature existed.
        logits = tf.constant(_log(np.tile(HALVES, (64, 1))))
        seed, t = tf.constant([3, 4]), tf.constant(5)
        folded = tf.random.experimental.stateless_fold_in(seed, t)
        want = tf.random.stateless_categorical(logits, 1, folded, dtype=tf.int32)[:, 0]
        self.assertAllEqual(sampling.draw(logits, sampling.Drawing(seed), t), want)
        self.assertNotAllEqual(sampling.draw(logits, sampling.Drawing(seed), t + 1), want)

    def test_draws_follow_the_tempered_nucleus(self):
        rows = 40_000
        logits = tf.constant(_log(np.tile(HALVES, (rows, 1))))
        cases = {
            (None, None): HALVES,
            (2.0, None): np.sqrt(HALVES) / np.sqrt(HALVES).sum(),
            (0.5, None): HALVES**2 / (HALVES**2).sum(),
            (None, 0.6): np.array([2 / 3, 1 / 3, 0, 0]),
        }
        for (temperature, top_p), want in cases.items():
            drawing = sampling.Drawing(tf.constant([1, 2]), temperature, top_p)
            words = sampling.draw(logits, drawing, 0)
            # Standard error of a share over 40,000 rows: at most 0.0025.
            self.assertAllClose(_frequencies(words, 4), want, atol=0.012, msg=(temperature, top_p))

    def test_near_zero_temperature_takes_the_most_likely_word(self):
        rng = np.random.default_rng(0)
        log_probs = tf.nn.log_softmax(rng.normal(size=(500, 30)).astype(np.float32))
        words = sampling.draw(log_probs, sampling.Drawing(tf.constant([5, 6]), 1e-6), 0)
        self.assertAllEqual(words, tf.argmax(log_probs, axis=-1, output_type=tf.int32))

    def test_blocked_words_are_never_drawn(self):
        log_probs = _log(np.tile([0.4, 0.1, 0.3, 0.2], (5_000, 1)))
        log_probs[:, 0] = NEG_INF
        log_probs[:, 2] += -1e9
        drawing = sampling.Drawing(tf.constant([0, 1]), 3.0)
        words = sampling.draw(tf.constant(log_probs), drawing, 0).numpy()
        self.assertEqual(set(words.tolist()), {1, 3})


class PerturbTest(tf.test.TestCase):
    def test_the_best_perturbed_extension_is_a_draw_of_the_step(self):
        # One hypothesis of log-probability -2 per row: its best perturbed extension is
        # drawn from softmax(step / temperature), the prefix changing nothing.
        rows = 40_000
        step = _log(np.tile(HALVES, (rows, 1, 1)))  # (B, S = 1, V)
        for temperature, top_p, want in (
            (None, None, HALVES),
            (2.0, None, np.sqrt(HALVES) / np.sqrt(HALVES).sum()),
            (1.0, 0.6, np.array([2 / 3, 1 / 3, 0, 0])),
        ):
            drawing = sampling.Drawing(tf.constant([7, 8]), temperature, top_p)
            perturbed = sampling.perturb(step - 2.0, step, drawing, 0)
            words = tf.argmax(perturbed[:, 0], axis=-1)
            self.assertAllClose(_frequencies(words, 4), want, atol=0.012, msg=(temperature, top_p))

    def test_two_hypotheses_draw_by_their_joint_probability(self):
        # Hypotheses of probability 0.6 and 0.4, each with two words: the extension is
        # drawn with probability prefix x word, across both.
        rows = 40_000
        prefix = np.log(np.array([0.6, 0.4], np.float32))
        step = _log(np.tile([[0.5, 0.5], [0.75, 0.25]], (rows, 1, 1)))  # (B, 2, 2)
        drawing = sampling.Drawing(tf.constant([1, 1]))
        perturbed = sampling.perturb(prefix[None, :, None] + step, step, drawing, 0)
        chosen = tf.argmax(tf.reshape(perturbed, [rows, 4]), axis=-1)
        self.assertAllClose(_frequencies(chosen, 4), [0.3, 0.3, 0.3, 0.1], atol=0.012)

    def test_near_zero_temperature_keeps_the_ranking(self):
        rng = np.random.default_rng(1)
        candidates = rng.normal(size=(50, 3, 20)).astype(np.float32)
        drawing = sampling.Drawing(tf.constant([2, 3]), 1e-6)
        perturbed = sampling.perturb(candidates, candidates, drawing, 0)
        self.assertAllEqual(
            tf.argmax(tf.reshape(perturbed, [50, 60]), axis=-1),
            np.argmax(candidates.reshape(50, 60), axis=-1),
        )


class Result(NamedTuple):
    tokens: tf.Tensor
    log_prob: tf.Tensor


class RankedTest(tf.test.TestCase):
    def test_repeat_puts_each_images_samples_in_a_row(self):
        state = {"h": tf.constant([[1.0], [2.0]]), "none": None}
        got = sampling.repeat(state, 3)
        self.assertAllEqual(got["h"][:, 0], [1, 1, 1, 2, 2, 2])
        self.assertIsNone(got["none"])

    def test_each_images_samples_most_likely_first(self):
        log_prob = np.array([-3.0, -1.0, -2.0, -1.0, -5.0, -1.0], np.float32)  # 2 images x 3
        tokens = np.arange(12, dtype=np.int32).reshape(6, 2)
        got = sampling.ranked(Result(tf.constant(tokens), tf.constant(log_prob)), 3)
        self.assertEqual(got.tokens.shape, (2, 3, 2))
        for image in range(2):
            rows = list(range(3 * image, 3 * image + 3))
            # Python's sort is stable: ties stay in drawing order.
            order = sorted(rows, key=lambda r: -log_prob[r])
            self.assertAllEqual(got.log_prob[image], log_prob[order])
            self.assertAllEqual(got.tokens[image], tokens[order])
        same = Result(tf.constant(tokens), tf.constant(log_prob))
        self.assertIs(sampling.ranked(same, 1), same)


if __name__ == "__main__":
    tf.test.main()
