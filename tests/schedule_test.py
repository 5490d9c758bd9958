"""Tests for sat_tf.model.fast.schedule: which decoders take the fused recurrence and the
compiled score, and the fused kernel on h_{t-1} whose columns its layout splits (the
recurrence and the compiled score against the reference loop: recurrence_test.py,
fused_score_test.py)."""

import numpy as np
import tensorflow as tf
from recurrence_test import ATTENTION, HIDDEN, VOCAB, _decoder

from sat_tf.model.decoder import AttentionDecoder
from sat_tf.model.fast import schedule
from sat_tf.model.fast.layout import HiddenLayout


class ScheduleChoiceTest(tf.test.TestCase):
    def test_bfloat16_runs_the_recurrence_and_float16_the_autodiff_loop(self):
        self.assertTrue(schedule.uses_recurrence(_decoder("additive")))
        # Gated hard attention by default; not where `fused_hard` is unset, nor ungated.
        gated = AttentionDecoder(VOCAB, attention="hard", hard_gate=True)
        self.assertTrue(schedule.uses_recurrence(gated))
        gated.fused_hard = False
        self.assertFalse(schedule.uses_recurrence(gated))
        self.assertTrue(schedule.uses_recurrence(_decoder("additive", attention="hard")))
        self.assertFalse(
            schedule.uses_recurrence(_decoder("additive", attention="hard", hard_gate=False))
        )
        self.assertTrue(schedule.uses_recurrence(AttentionDecoder(VOCAB, dtype="mixed_bfloat16")))
        self.assertFalse(schedule.uses_recurrence(AttentionDecoder(VOCAB, dtype="mixed_float16")))

    def test_the_compiled_score_is_the_additive_scores_where_asked(self):
        for score in ("dot", "scaled_dot"):
            self.assertFalse(schedule.uses_compiled_score(_decoder(score, compiled=True)))
        self.assertFalse(schedule.uses_compiled_score(_decoder("additive", compiled=False)))
        none = AttentionDecoder(VOCAB, attention="none")
        none.compiled_score = True
        self.assertFalse(schedule.uses_compiled_score(none))


class FusedKernelTest(tf.test.TestCase):
    def test_the_layout_by_hand(self):
        # The LSTM's U is 4n wide; the additive score adds U_a (A columns), the dot
        # scores nothing; soft attention and gated hard attention add w_beta.
        gates = 4 * HIDDEN
        self.assertEqual(
            schedule.hidden_layout(_decoder("additive")), HiddenLayout(gates, ATTENTION, True)
        )
        self.assertEqual(schedule.hidden_layout(_decoder("dot")), HiddenLayout(gates, 0, True))
        ungated = _decoder("additive", attention="hard", hard_gate=False)
        self.assertEqual(schedule.hidden_layout(ungated), HiddenLayout(gates, ATTENTION, False))

    def test_the_split_product_is_each_layers_own(self):
        # h_{t-1} through the fused kernel, split by the layout: U h, U_a h and w_beta h,
        # each as its own layer's kernel gives it.
        decoder = _decoder("additive", seed=3)
        layout = schedule.hidden_layout(decoder)
        kernel = schedule.fused_hidden_kernel(decoder)
        self.assertEqual(kernel.shape, (HIDDEN, layout.width))
        h = tf.constant(np.random.default_rng(1).normal(size=(2, HIDDEN)), tf.float32)
        gates, score_in, gate_logit = layout.split(h @ kernel, decoder.beta.bias)
        self.assertAllClose(gates, h @ decoder.lstm_hidden.kernel)
        self.assertAllClose(score_in, h @ decoder.f_att.u_a.kernel)
        self.assertAllClose(gate_logit, h @ decoder.beta.kernel + decoder.beta.bias)


if __name__ == "__main__":
    tf.test.main()
