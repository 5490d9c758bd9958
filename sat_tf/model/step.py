"""One step of the attention decoder (paper §3.1.2, §4): the only place its math is written.

Given the word half of the gates x_t = W_e E y_{t-1} + b, the state (h_{t-1}, c_{t-1})
and the annotations a with their hoisted projection W_a a:

  P_t = h_{t-1} [U | S | w_beta]                S: the score's slice (U_a, or none)
  e_t = score(W_a a, P_t^S, h_{t-1});  alpha_t = softmax(e_t)
  z_t = beta_t attend(alpha_t, a),  beta_t = sigmoid(P_t^beta + b_beta)  (when gated)
  c_t, h_t = LSTM(x_t + P_t^U + Z z_t, c_{t-1})

The decoder runs `attention_step` one word at a time when decoding
(`AttentionDecoder.step`) and in its teacher-forced loop (`AttentionDecoder.teacher_forced_loop`);
the fast schedule (`fast/`) runs it inside a recurrence with a hand-written backward pass,
with P_t as one product over the fused kernel. Every function here takes tensors, never
variables, so that the fused recurrence can run it inside `tf.custom_gradient`.
"""

from typing import NamedTuple

import tensorflow as tf


def lstm_cell(gates, c):
    """The LSTM cell (paper eq. 1-3); returns h, c and the activated gates (i, f, o, g)."""
    i, f, o, g = tf.split(gates, 4, axis=-1)
    i, f, o, g = tf.sigmoid(i), tf.sigmoid(f), tf.sigmoid(o), tf.tanh(g)
    c = f * c + i * g
    return o * tf.tanh(c), c, (i, f, o, g)


class StepOutputs(NamedTuple):
    """What one step computes. `alpha`, `log_alpha`: (B, L), float32 or wider; `context`: (B, D)
    before the gate; `beta`: (B, 1) or None; `gates`: (B, 4n) before activation;
    `score_hidden`: what the score computed on the way (or None); `where`: (B,) the
    attended location of hard attention (or None)."""

    h: tf.Tensor
    c: tf.Tensor
    z: tf.Tensor
    alpha: tf.Tensor
    log_alpha: tf.Tensor | None
    context: tf.Tensor
    beta: tf.Tensor | None
    gates: tf.Tensor
    score_hidden: tf.Tensor | None
    where: tf.Tensor | None


def attention_step(
    word_gates, h, c, projected_h, features, projected, context_kernel, score, attend
) -> StepOutputs:
    """One decoder step from the projections of h_{t-1} (paper §3.1.2, §4).

    Args:
      word_gates: (B, 4n) x_t, the word half of the gates with their bias.
      h, c: (B, n) the previous state.
      projected_h: (gates (B, 4n), score input (B, S) or None, gate logit (B, 1) or
        None): the projections of h_{t-1}.
      features: (B, L, D) annotation vectors a.
      projected: (B, L, P) the score's `W_a a`; None without attention.
      context_kernel: (D, 4n) Z.
      score: `score(projected, score_in, h) -> (scores (B, L), what the score computed
        on the way)`, from a score layer's `step_scores`; None for the no-attention
        ablation (z_t = mean_i a_i).
      attend: `attention.soft_attend` or `attention.hard_attend(...)`; unused without
        attention.

    Returns:
      `StepOutputs`.
    """
    gates_h, score_in, gate_logit = projected_h
    score_hidden = log_alpha = where = beta = None
    if score is None:
        alpha = uniform_alpha(features)
        context = tf.reduce_mean(features, axis=1)  # (B, D)
    else:
        scores, score_hidden = score(projected, score_in, h)
        if scores.dtype in (tf.float16, tf.bfloat16):  # the softmax stays float32
            scores = tf.cast(scores, tf.float32)
        log_alpha = tf.nn.log_softmax(scores)
        alpha = tf.exp(log_alpha)
        context, where = attend(alpha, log_alpha, features)
    z = context
    if gate_logit is not None:
        beta = tf.sigmoid(gate_logit)
        z = beta * context
    gates = word_gates + gates_h + tf.matmul(z, context_kernel)
    h, c, _ = lstm_cell(gates, c)
    return StepOutputs(h, c, z, alpha, log_alpha, context, beta, gates, score_hidden, where)


def uniform_alpha(features):
    """(B, L) float32 weights 1/L: the "attention" of the no-attention ablation."""
    return tf.ones(tf.shape(features)[:2]) / tf.cast(tf.shape(features)[1], tf.float32)
