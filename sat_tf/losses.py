"""Training objectives (paper §4.1, §4.2.1).

All functions return one value per sequence, shape (B,); the model averages them over
the global batch. `mask` is 1.0 for real target words (including `<end>`), 0.0 for pad.
"""

import tensorflow as tf


def sequence_log_likelihood(logits, targets, mask):
    """`log p(y | a) = sum_t log p(y_t | ...)` over unmasked steps.

    Args:
      logits: (B, T, V) unnormalised output scores.
      targets: (B, T) int32 target words.
      mask: (B, T) float32.

    Returns:
      (B,) log-likelihood of each caption.
    """
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    return -tf.reduce_sum(nll * mask, axis=1)  # (B,)


def doubly_stochastic_penalty(alpha, mask):
    """`sum_i (1 - sum_t alpha_ti)^2` with padded steps left out (paper eq. 14, tau = 1).

    Args:
      alpha: (B, T, L) attention weights.
      mask: (B, T) float32.

    Returns:
      (B,) penalty per caption.
    """
    coverage = tf.reduce_sum(alpha * mask[:, :, None], axis=1)  # (B, L)
    return tf.reduce_sum(tf.square(1.0 - coverage), axis=1)  # (B,)


def reinforce_surrogate(
    log_likelihood, log_p_s, entropy, mask, sampled, baseline, reinforce_weight, entropy_weight
):
    """Surrogate whose gradient is the paper's estimate of `-dL_s/dW` (eq. 12 with 4.1's
    variance reduction).

    Minimising it follows
      d log p(y|s,a)/dW + lambda_r (r - b) d log p(s|a)/dW + lambda_e dH[s]/dW,
    with reward `r = log p(y | s, a)`; the reward and baseline carry no gradient.

    Args:
      log_likelihood: (B,) `log p(y | s, a)` under the sampled locations.
      log_p_s: (B, T) `log alpha_t` at the sampled locations.
      entropy: (B, T) entropy of alpha_t.
      mask: (B, T) float32.
      sampled: (B,) float32, 1.0 for sequences that used a sample, 0.0 for those that
        used the expected context (they carry no score-function term).
      baseline: moving-average baseline b, a scalar or one value per sequence (B,).
      reinforce_weight: lambda_r.
      entropy_weight: lambda_e.

    Returns:
      (B,) loss per sequence.
    """
    advantage = tf.stop_gradient(log_likelihood - baseline)  # (B,)
    log_p_path = tf.reduce_sum(log_p_s * mask, axis=1)  # (B,)
    total_entropy = tf.reduce_sum(entropy * mask, axis=1)  # (B,)
    score_term = reinforce_weight * sampled * advantage * log_p_path
    return -(log_likelihood + score_term + entropy_weight * sampled * total_entropy)
