"""Training objectives (paper §4.1, §4.2.1).

Functions return one value per sequence, shape (B,), unless they say otherwise; the model
averages them over the global batch. `mask` is 1.0 for real target words (including
`<end>`), 0.0 for pad.
"""

import tensorflow as tf


def word_log_likelihood(logits, targets, mask):
    """`log p(y_t | ...)` of every target word, 0 at padded steps.

    Args:
      logits: (B, T, V) unnormalised output scores.
      targets: (B, T) int32 target words.
      mask: (B, T) float32.

    Returns:
      (B, T) log-likelihood of each word.
    """
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    return -nll * mask


def sequence_log_likelihood(logits, targets, mask):
    """`log p(y | a) = sum_t log p(y_t | ...)` over unmasked steps: (B,) log-likelihood
    of each caption, with the arguments of `word_log_likelihood`."""
    return tf.reduce_sum(word_log_likelihood(logits, targets, mask), axis=1)  # (B,)


def reinforce_reward(word_log_likelihood, to_go):
    """The reward credited to each sampled location s_t.

    The paper credits every s_t with the whole caption's `log p(y | s, a)`. The sample
    s_t cannot change the words before t, so crediting it with `sum_{t' >= t} log p(y_t'
    | ...)` only ("reward to go") leaves the expected gradient unchanged and removes the
    earlier words' noise from it.

    Args:
      word_log_likelihood: (B, T) `log p(y_t | ...)`, 0 at padded steps.
      to_go: False for the paper's reward, True for the reward to go.

    Returns:
      (B,) the caption's log-likelihood, or (B, T) the reward to go of every step.
    """
    if to_go:
        return tf.math.cumsum(word_log_likelihood, axis=1, reverse=True)
    return tf.reduce_sum(word_log_likelihood, axis=1)


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
    log_likelihood,
    log_p_s,
    entropy,
    mask,
    sampled,
    baseline,
    reinforce_weight,
    entropy_weight,
    reward=None,
):
    """Surrogate whose gradient is the paper's estimate of `-dL_s/dW` (eq. 12 with 4.1's
    variance reduction).

    Minimising it follows
      d log p(y|s,a)/dW + lambda_r sum_t (r_t - b_t) d log p(s_t|a)/dW + lambda_e dH[s]/dW,
    with the paper's reward `r_t = log p(y | s, a)` for every t unless `reward` gives
    one per step (`reinforce_reward`); the reward and baseline carry no gradient.

    Args:
      log_likelihood: (B,) `log p(y | s, a)` under the sampled locations.
      log_p_s: (B, T) `log alpha_t` at the sampled locations.
      entropy: (B, T) entropy of alpha_t.
      mask: (B, T) float32.
      sampled: (B,) float32, 1.0 for sequences that used a sample, 0.0 for those that
        used the expected context (they carry no score-function term).
      baseline: baseline b, broadcastable to the reward: a scalar, (B,) or (B, T).
      reinforce_weight: lambda_r.
      entropy_weight: lambda_e.
      reward: None for `log_likelihood`, or (B, T) a reward per step.

    Returns:
      (B,) loss per sequence.
    """
    if reward is None:
        reward = log_likelihood
    advantage = tf.stop_gradient(reward - baseline)
    if advantage.shape.rank == 1:
        advantage = advantage[:, None]  # the same for every step
    credited = tf.reduce_sum(advantage * log_p_s * mask, axis=1)  # (B,)
    total_entropy = tf.reduce_sum(entropy * mask, axis=1)  # (B,)
    score_term = reinforce_weight * sampled * credited
    return -(log_likelihood + score_term + entropy_weight * sampled * total_entropy)
