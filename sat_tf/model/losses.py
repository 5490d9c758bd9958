"""Training objectives (paper §4.1, §4.2.1), and REINFORCE for hard attention (§4.1).

Functions return one value per sequence, shape (B,), unless they say otherwise; the model
averages them over the global batch. `mask` is 1.0 for real target words (including
`<end>`), 0.0 for pad.

Hard attention: per sampled trajectory s the reward is `r = log p(y | s, a)` (or, per
step, the reward to go); a baseline b is subtracted; with probability `hard_mix_prob` per
caption the expected context replaces the sample (and that caption has no score-function
term). The model keeps the state (the moving averages and the random generator); the
functions here read and update it.

Self-critical sequence training (not in the paper) is `sat_tf.model.self_critical`.
"""

import dataclasses

import keras
import tensorflow as tf

from sat_tf import config as config_lib
from sat_tf.config import Config


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


# One moving-average baseline per number of words a reward covers, up to this many.
BASELINE_SLOTS = 128


@dataclasses.dataclass(frozen=True)
class Settings:
    """How hard attention is trained: the fields of `Config` of the same names, and
    their defaults (BUILD_NOTES.md gives why they are not all the paper's).

    Attributes:
      reinforce_weight: lambda_r of the score-function term.
      entropy_weight: lambda_e of the entropy term.
      reinforce_reward: "sequence" (the caption's log-likelihood for every s_t, paper
        §4.1) or "to_go" (the words from t on, `reinforce_reward`).
      reinforce_baseline: "moving_average" (paper §4.1): one moving average per number
        of words the reward covers (rewards of captions of different lengths differ by
        far more than the samples make them differ, and batches hold one length);
        "argmax": the reward of the same caption decoded with every location at
        `argmax alpha` (the path captioning takes), without gradient; it does not depend
        on the samples, so the estimate stays unbiased.
      baseline_decay: decay d of the moving averages.
      hard_mix_prob: chance that a caption uses the expected context.
      hard_warmup_steps: every caption uses the expected context for this many
        optimizer steps; sampling and the REINFORCE term start after them.
    """

    reinforce_weight: float = Config.reinforce_weight
    entropy_weight: float = Config.entropy_weight
    reinforce_reward: str = Config.reinforce_reward
    reinforce_baseline: str = Config.reinforce_baseline
    baseline_decay: float = Config.baseline_decay
    hard_mix_prob: float = Config.hard_mix_prob
    hard_warmup_steps: int = Config.hard_warmup_steps

    def __post_init__(self):
        config_lib.check_choice("reinforce_reward", self.reinforce_reward)
        config_lib.check_choice("reinforce_baseline", self.reinforce_baseline)

    @property
    def to_go(self) -> bool:
        return self.reinforce_reward == "to_go"


def sample_noise(seed_generator, features, steps, mix_prob):
    """Gumbel noise fixing s_t for every step, and the per-caption mixing choice.

    Under a `tf.distribute` strategy the noise is drawn for the global batch and each
    replica keeps its own rows: replicas sample independently, and a step draws the
    same samples on any number of replicas.

    Args:
      seed_generator: the model's `keras.random.SeedGenerator`.
      features: (B, L, D) annotation vectors (for the shape).
      steps: T.
      mix_prob: scalar, the chance of the expected context.

    Returns:
      ((B, T, L) standard Gumbel noise, (B,) bool: captions that use the expected context).
    """
    batch, length = tf.shape(features)[0], tf.shape(features)[1]
    replicas, replica = 1, 0
    context = tf.distribute.get_replica_context()
    if context is not None:
        replicas = context.num_replicas_in_sync
        replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    rows = replica * batch + tf.range(batch)
    shape = tf.stack([replicas * batch, steps, length])
    u = keras.random.uniform(shape, minval=1e-9, maxval=1.0, seed=seed_generator)
    mix = keras.random.uniform([replicas * batch], seed=seed_generator)
    u, mix = tf.gather(u, rows), tf.gather(mix, rows) < mix_prob
    return -tf.math.log(-tf.math.log(u)), mix


def mix_prob(settings: Settings, optimizer=None):
    """The chance of the expected context at the optimizer's step (1 in the warm-up)."""
    prob = tf.constant(settings.hard_mix_prob, tf.float32)
    if settings.hard_warmup_steps > 0 and optimizer is not None:
        prob = tf.where(optimizer.iterations < settings.hard_warmup_steps, 1.0, prob)
    return prob


def baseline_slots(words, mask=None):
    """Moving-average slot of each reward: the number of words it covers (capped).

    Args:
      words: (B,) target words per caption.
      mask: None for one reward per caption (slots (B,)); (B, T) for rewards to go,
        where step t's reward covers `words - t` words (slots (B, T)).
    """
    covered = words if mask is None else tf.math.cumsum(mask, axis=1, reverse=True)
    return tf.minimum(tf.cast(covered, tf.int32), BASELINE_SLOTS - 1)


def argmax_reward(decoder, features, captions, mask, to_go, state=None):
    """The reward of each caption with every location at `argmax alpha`, without dropout
    and without gradient: the "argmax" baseline. `state`: the sampled pass's initial
    state (the same with or without dropout, which only the output layer has), reused
    instead of computed again."""
    if state is not None:
        state = tf.nest.map_structure(tf.stop_gradient, state)
    features = tf.stop_gradient(features)
    outputs = decoder(features, captions[:, :-1], training=False, state=state)
    word_ll = word_log_likelihood(outputs["logits"], captions[:, 1:], mask)
    return tf.stop_gradient(reinforce_reward(word_ll, to_go))


def sampled_argmax_reward(decoder, features, captions, mask, to_go, sampled, reward, state):
    """`argmax_reward` of the captions that used a sample, 0 for the others: shaped like
    `reward` ((B,) or (B, T)).

    Only sampled captions read their baseline (`reinforce_surrogate` weighs the
    advantage by `sampled`), so the second pass decodes those rows alone: with
    `hard_mix_prob` 0.5 about half the batch, and none in the warm-up. Each row of the
    pass depends on its own row only (no dropout, no batch statistics), so the rows it
    returns equal those of the whole batch's pass.
    """
    rows = tf.where(sampled > 0)[:, 0]  # (S,) int64

    def decode():
        def pick(x):
            return tf.gather(x, rows)

        picked = None if state is None else tf.nest.map_structure(pick, state)
        values = argmax_reward(decoder, pick(features), pick(captions), pick(mask), to_go, picked)
        return tf.scatter_nd(rows[:, None], values, tf.shape(reward, out_type=tf.int64))

    return tf.cond(tf.size(rows) > 0, decode, lambda: tf.zeros_like(reward))


def hard_terms(
    settings, decoder, baselines, features, captions, mask, word_ll, outputs, sampled, state=None
):
    """The hard-attention objective and what moves the moving averages.

    Args:
      settings: `Settings`.
      decoder: the `AttentionDecoder` (for the argmax baseline).
      baselines: the moving averages b (BASELINE_SLOTS,).
      features: (B, L, D); captions: (B, T + 1) int32; mask: (B, T) float32.
      word_ll: (B, T) `log p(y_t | s, a)` under the sampled locations.
      outputs: the decoder's teacher-forced outputs (`log_p_s`, `entropy`).
      sampled: (B,) float32, 1.0 for captions that used a sample.
      state: the decoder's `initial_state(features)` of the sampled pass, which the
        argmax baseline reuses; None computes it again.

    Returns:
      dict of tensors: "objective" (B,), and for `update_baselines` "step_reward"
      ((B,) or (B, T)), "baseline_slot" and "baseline_weight" of the same shape.
    """
    log_likelihood = tf.reduce_sum(word_ll, axis=1)
    reward = reinforce_reward(word_ll, settings.to_go)
    words = tf.reduce_sum(mask, axis=1)
    slots = baseline_slots(words, mask if settings.to_go else None)
    if settings.reinforce_baseline == "argmax":
        baseline = sampled_argmax_reward(
            decoder, features, captions, mask, settings.to_go, sampled, reward, state
        )
    else:
        baseline = tf.gather(baselines, slots)
    objective = reinforce_surrogate(
        log_likelihood,
        outputs["log_p_s"],
        outputs["entropy"],
        mask,
        sampled,
        baseline,
        settings.reinforce_weight,
        settings.entropy_weight,
        reward=reward,
    )
    # The moving averages are kept with either baseline.
    return {
        "objective": objective,
        "step_reward": reward,
        "baseline_slot": slots,
        "baseline_weight": sampled[:, None] * mask if settings.to_go else sampled,
    }


def update_baselines(baselines, seen, decay, reward, slots, weight):
    """`b_n <- d b_n + (1 - d) mean(r)` for every number of words n in the batch.

    The mean is over the rewards of captions that used a sampled location (`weight`
    1.0; for rewards to go also 0.0 at padded steps): the baseline estimates the reward
    of a sampled trajectory (paper §4.1), which the expected-context captions would
    inflate. The first batch of a slot sets it. Means are over the global batch under a
    `tf.distribute` strategy.
    """
    reward, slots, weight = (tf.reshape(x, [-1]) for x in (reward, slots, weight))
    sums = tf.math.unsorted_segment_sum(reward * weight, slots, BASELINE_SLOTS)
    counts = tf.math.unsorted_segment_sum(weight, slots, BASELINE_SLOTS)
    context = tf.distribute.get_replica_context()
    if context is not None:
        sums, counts = context.all_reduce("sum", [sums, counts])
    present = counts > 0
    mean = sums / tf.maximum(counts, 1.0)
    moved = tf.where(seen > 0, decay * baselines + (1 - decay) * mean, mean)
    baselines.assign(tf.where(present, moved, baselines))
    seen.assign(tf.maximum(seen, tf.cast(present, tf.float32)))
