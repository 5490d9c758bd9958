"""Tests for sat_tf.model.decoding_rules, each rule alone on hand-made steps: the words
never emitted, repeat and bad-ending blocking against a plain-Python walk of the caption,
and the two states of constrained beam search against a numpy selection (search_test.py
runs them inside the searches)."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model import decoding_rules

END = 2
NEG_INF = float("-inf")


def _banned_by_walk(history, t, block_repeats, bad_endings):
    """The words a caption `history[:t]` may not take at step t, walking it word by word."""
    caption = list(history[:t])
    banned = set()
    if block_repeats and len(caption) >= 2:
        if caption[-1] == caption[-2]:
            banned.add(caption[-1])
        last_pair = (caption[-2], caption[-1])
        for i in range(len(caption) - 2):
            if (caption[i], caption[i + 1]) == last_pair:
                banned.add(caption[i + 2])
    if caption and caption[-1] in bad_endings:
        banned.add(END)
    return banned


class NeverEmittedTest(tf.test.TestCase):
    def test_pad_start_and_unk_are_penalised_and_nothing_else(self):
        penalty = decoding_rules.never_emitted_penalty(6)
        self.assertEqual(penalty.dtype, np.float32)
        self.assertAllEqual(penalty, [-1e9, -1e9, 0.0, -1e9, 0.0, 0.0])

    def test_the_step_adds_the_penalty_and_keeps_its_state_and_attention(self):
        log_probs = np.log(np.full([2, 5], 0.2, np.float32))

        def step(tokens, state):
            return log_probs, state + 1, "alpha"

        out, state, alpha = decoding_rules.never_emitting(step, 5)(None, 10)
        self.assertEqual((state, alpha), (11, "alpha"))
        self.assertAllClose(out[:, [2, 4]], log_probs[:, [2, 4]])
        self.assertAllClose(out[:, [0, 1, 3]], log_probs[:, [0, 1, 3]] - 1e9)


class BlockTest(tf.test.TestCase, parameterized.TestCase):
    def _block(self, history, t, block_repeats, bad_endings=()):
        history = np.asarray(history, np.int32)
        tokens = history[:, t - 1] if t > 0 else np.ones(len(history), np.int32)
        log_probs = np.zeros([len(history), 6], np.float32)
        out = decoding_rules.block(
            tf.constant(log_probs),
            tf.constant(tokens),
            tf.constant(history),
            tf.constant(t, tf.int32),
            block_repeats=block_repeats,
            bad_ending_ids=bad_endings,
            end_id=END,
        )
        return [set(np.flatnonzero(row == NEG_INF).tolist()) for row in out.numpy()]

    def test_by_hand(self):
        # "a b a b": the pair "a b" was followed by "a" before, so "a" would repeat a
        # trigram; "a b b": a third "b" in a row; "c a" with "a" a bad ending: no <end>.
        a, b, c = 3, 4, 5
        self.assertEqual(self._block([[a, b, a, b, 0]], 4, True), [{a}])
        self.assertEqual(self._block([[a, b, a, b, 0]], 4, False), [set()])
        self.assertEqual(self._block([[a, b, b, 0]], 3, True), [{b}])
        self.assertEqual(self._block([[a, b, b, 0]], 2, True), [set()])
        self.assertEqual(self._block([[c, a, 0]], 2, True, bad_endings=[a]), [{END}])
        self.assertEqual(self._block([[c, a, 0]], 2, True, bad_endings=[c]), [set()])

    def test_nothing_is_blocked_at_the_first_step(self):
        # The word fed is <start>; the history's columns are not the caption's yet.
        self.assertEqual(self._block([[3, 3, 3]], 0, True, bad_endings=[3]), [set()])

    @parameterized.parameters(0, 1, 2)
    def test_random_captions_match_the_walk(self, seed):
        # Four words over nine steps repeat pairs often.
        rng = np.random.default_rng(seed)
        history = rng.integers(2, 6, size=[16, 9]).astype(np.int32)
        for t in range(1, 10):
            for block_repeats, bad in ((True, ()), (False, (4, 5)), (True, (3,))):
                got = self._block(history, t, block_repeats, bad)
                expected = [_banned_by_walk(row, t, block_repeats, bad) for row in history]
                self.assertEqual(got, expected, (t, block_repeats, bad))


class ConstrainedTest(tf.test.TestCase, parameterized.TestCase):
    def test_start_slot_is_zero_unless_the_image_has_no_word(self):
        constraint = tf.constant([[False, True, False], [False, False, False]])
        self.assertAllEqual(decoding_rules.constrained_start(constraint, 4), [0, 4])

    @parameterized.parameters(0, 1, 2)
    def test_top_k_keeps_the_best_of_each_state(self, seed):
        rng = np.random.default_rng(seed)
        k, vocab = 3, 7
        scores = rng.normal(size=[2, 2 * k, vocab]).astype(np.float32)
        scores[0, 1:k] = NEG_INF  # the first state held one hypothesis
        constraint = rng.random([2, vocab]) < 0.3
        constraint[1] = False  # an image with no word: only the second state holds words
        got_scores, got_index = decoding_rules.constrained_top_k(
            tf.constant(scores), k, tf.constant(constraint)
        )
        for b in range(2):
            without, with_word = [], []
            for s in range(2 * k):
                for v in range(vocab):
                    holds = s >= k or constraint[b, v]
                    (with_word if holds else without).append((scores[b, s, v], s * vocab + v))
            expected = []
            for group in (without, with_word):
                expected += sorted(group, key=lambda pair: -pair[0])[:k]
            self.assertAllClose(got_scores[b], [score for score, _ in expected])
            finite = np.isfinite([score for score, _ in expected])
            self.assertAllEqual(
                got_index.numpy()[b][finite], np.array([i for _, i in expected])[finite]
            )

    def test_best_prefers_the_hypotheses_holding_a_word(self):
        final = tf.constant(
            [[-1.0, -2.0, -5.0, NEG_INF], [-1.0, -2.0, NEG_INF, NEG_INF]], tf.float32
        )
        self.assertAllEqual(
            decoding_rules.constrained_best(final, 2),
            [[NEG_INF, NEG_INF, -5.0, NEG_INF], [-1.0, -2.0, NEG_INF, NEG_INF]],
        )


if __name__ == "__main__":
    tf.test.main()
