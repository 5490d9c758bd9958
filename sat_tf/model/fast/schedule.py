"""The decoder's faster teacher-forced schedule, taken at one seam: `AttentionDecoder.call`
calls `teacher_forced`, which runs the same step (`step.attention_step`) as the decoder's
reference loop (`AttentionDecoder.teacher_forced_loop`), faster where it applies:

- the fused recurrence (`recurrence.py`), whose hand-written backward pass computes the
  kernel gradients once over all steps, with the projections of h_{t-1} as one product
  over the fused kernel (`layout.HiddenLayout`): soft attention, and hard attention gated
  by beta (`hard_gate`) unless `decoder.fused_hard` is unset, in float32 or bfloat16;
- the additive score through its compiled op (`fused_score.py`) in float32 on a CPU where
  the op builds, unless `decoder.compiled_score` is unset: in the recurrence, or else in
  the reference loop.

Everything else (ungated hard attention, the no-attention ablation, float16) runs the
reference loop. Decoding never runs this module, so exported graphs hold only
TensorFlow's own ops. tests/recurrence_test.py and tests/fused_score_test.py hold both
pieces equal to the reference loop, outputs and gradients.
"""

import tensorflow as tf

from sat_tf.model.fast import fused_score, recurrence
from sat_tf.model.fast.layout import HiddenLayout


def hidden_layout(decoder) -> HiddenLayout:
    """The columns of `decoder`'s fused kernel applied to h_{t-1}."""
    score = 0
    if decoder.f_att is not None:
        score = sum(k.shape[1] for k in decoder.f_att.hidden_kernels())
    return HiddenLayout(4 * decoder.hidden_dim, score, decoder.beta is not None)


def fused_hidden_kernel(decoder):
    """`[U | S | w_beta]` in the order of `hidden_layout`, in the compute dtype."""
    kernels = [decoder.lstm_hidden.kernel]
    if decoder.f_att is not None:
        kernels += decoder.f_att.hidden_kernels()
    if decoder.beta is not None:
        kernels.append(decoder.beta.kernel)
    return tf.concat([decoder.read(k) for k in kernels], axis=1)


def uses_recurrence(decoder):
    """Whether `teacher_forced` runs `recurrence.attention_recurrence`: soft attention, or
    hard attention gated by beta (`hard_gate`) unless `fused_hard` is unset, in float32
    or bfloat16 (`mixed_bfloat16`). float16 keeps the reference loop."""
    fused_hard = decoder.attention == "hard" and decoder.hard_gate and decoder.fused_hard
    attention = decoder.attention == "soft" or fused_hard
    return attention and decoder.compute_dtype in ("float32", "bfloat16")


def uses_compiled_score(decoder):
    """Whether `teacher_forced` runs the additive score's compiled op (either way)."""
    additive = decoder.f_att is not None and decoder.attention_score == "additive"
    return decoder.compiled_score and additive and fused_score.applies(decoder.compute_dtype)


def _compiled_score(decoder):
    """The additive score's per-step function through the compiled op."""
    kernels = [decoder.read(k) for k in decoder.f_att.step_kernels()]
    return lambda projected, score_in, h: (fused_score.scores(projected, score_in, *kernels), None)


def teacher_forced(decoder, embedded, word_gates, state, training, gumbel_noise, use_expected):
    """`AttentionDecoder.call`'s outputs by the fastest schedule that applies.

    Args:
      decoder: the `AttentionDecoder`.
      embedded: (B, T, m) embedded input words.
      word_gates: (T, B, 4n) the word half of the gates, time-major.
      state: `decoder.initial_state(features)`.
      training: enables dropout.
      gumbel_noise: hard attention only: (T, B, L) float32 Gumbel noise, or None.
      use_expected: hard attention only: (B,) bool.
    """
    if not uses_recurrence(decoder):
        score = _compiled_score(decoder) if uses_compiled_score(decoder) else None
        return decoder.teacher_forced_loop(
            embedded, word_gates, state, training, gumbel_noise, use_expected, score=score
        )
    hard = decoder.attention == "hard"
    read = decoder.read  # one dtype for every input, also under a mixed policy
    hs, zs, alphas, *wheres = recurrence.attention_recurrence(
        read(word_gates),
        read(state["projected"]),
        state["features"],  # cast by `initial_state`
        read(state["h"]),
        read(state["c"]),
        fused_hidden_kernel(decoder),
        read(decoder.lstm_context.kernel),
        read(decoder.beta.bias),
        *[read(k) for k in decoder.f_att.step_kernels()],
        hard=hard,
        gumbel_noise=gumbel_noise,
        use_expected=use_expected,
        compiled_score=uses_compiled_score(decoder),
    )
    outputs = decoder.outputs(embedded, hs, zs, alphas, state, training)
    if hard:
        # log alpha at the attended locations and the entropy of alpha, from the alphas
        # (their gradient reaches the scores through the recurrence's).
        alpha = outputs["alpha"]  # (B, T, L)
        where = tf.transpose(wheres[0])  # (B, T)
        chosen = tf.gather(alpha, where, axis=2, batch_dims=2)
        outputs["log_p_s"] = tf.math.log(chosen)
        outputs["entropy"] = -tf.reduce_sum(tf.math.xlogy(alpha, alpha), axis=-1)
    return outputs
