"""Self-critical sequence training (Rennie et al., 2017): REINFORCE on the words, with
the CIDEr-D of sampled captions as the reward and the reward of other captions of the
same image as the baseline.

Per image, K captions are sampled in the graph from the model's own decoding step
(`search.greedy_decode` with a seed); each is scored against the image's references by
a reward function outside the graph (`evaluation.cider.Rewarder`, through
`tf.numpy_function`); and the loss is `-(r - b) log p(sample)`
(`losses.self_critical_surrogate`, beside hard attention's REINFORCE), with `log p` from
a teacher-forced pass over the samples, so that its gradient comes from the training
schedule (the fused recurrence) rather than through the sampling loop. The policy is the
model as it captions: no dropout, and hard attention attends as `hard_decoding` says, so
that the words are the only samples and the estimate is the exact score-function
gradient of the expected reward of captioning.
"""

import dataclasses

import keras
import tensorflow as tf

from sat_tf.data import vocab as vocab_lib
from sat_tf.model import losses, search

BASELINES = ("mean", "greedy")


@dataclasses.dataclass(frozen=True)
class Settings:
    """How self-critical training runs; the `Config` fields `scst_samples` and
    `scst_baseline`.

    Attributes:
      samples: K, captions sampled per image.
      baseline: "mean": the mean reward of the image's other K - 1 samples (the "new
        self-critical" baseline of self-critical.pytorch); "greedy": the reward of the
        image's greedy caption (Rennie et al.'s).
      max_length: the most tokens a sample holds, `<end>` included.
    """

    samples: int = 5
    baseline: str = "mean"
    max_length: int = 20

    def __post_init__(self):
        if self.baseline not in BASELINES:
            raise ValueError(f"scst_baseline={self.baseline!r} is not one of {BASELINES}")
        minimum = 2 if self.baseline == "mean" else 1
        if self.samples < minimum:
            raise ValueError(
                f"scst_samples={self.samples}: the {self.baseline} baseline needs at least "
                f"{minimum}"
            )


def sample_seed(seed_generator):
    """A stateless (2,) int32 seed for this step's samples, from the model's generator
    (saved with its weights, so a resumed run draws the same samples); each replica of a
    `tf.distribute` strategy folds in its id so that replicas sample independently."""
    seed = keras.random.randint([2], 0, 2**30, seed=seed_generator, dtype="int32")
    context = tf.distribute.get_replica_context()
    if context is not None:
        replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
        seed = tf.random.experimental.stateless_fold_in(seed, replica)
    return seed


def _reward(rewarder, tokens, image_index):
    reward = tf.numpy_function(rewarder, [tokens, image_index], tf.float32, stateful=False)
    return tf.ensure_shape(reward, [None])


def terms(settings: Settings, decoder, step_fn, features, image_index, seed, rewarder):
    """The self-critical objective of a batch of images.

    Args:
      settings: `Settings`.
      decoder: the `AttentionDecoder`.
      step_fn: the decoding step (`search.StepFn`) that captioning uses.
      features: (B, L, D) annotation vectors.
      image_index: (B,) int32, each image's index in the rewarder's reference list.
      seed: the (2,) stateless seed of the samples (`sample_seed`).
      rewarder: `rewarder(tokens (N, T) int32, image_index (N,)) -> (N,) float32`.

    Returns:
      dict of (B K,) tensors, image by image: "objective", "reward" (of the samples),
      "baseline", "log_likelihood" (of the samples), "words" (their tokens, `<end>`
      included).
    """
    k = settings.samples
    features = tf.repeat(features, k, axis=0)  # (B K, L, D)
    index = tf.repeat(image_index, k, axis=0)
    common = dict(
        start_id=vocab_lib.START_ID,
        end_id=vocab_lib.END_ID,
        max_length=settings.max_length,
        num_locations=int(features.shape[1]),
    )
    state = decoder.initial_state(features)
    sampled = search.greedy_decode(
        step_fn,
        tf.nest.map_structure(tf.stop_gradient, state),
        batch_size=tf.shape(features)[0],
        sample_seed=seed,
        **common,
    )
    tokens = tf.stop_gradient(sampled.tokens)  # (B K, T): words, <end>, then <pad>
    reward = _reward(rewarder, tokens, index)
    if settings.baseline == "mean":
        baseline = losses.leave_one_out_baseline(reward, k)
    else:
        first = features[::k]
        greedy = search.greedy_decode(
            step_fn,
            tf.nest.map_structure(lambda s: tf.stop_gradient(s[::k]), state),
            batch_size=tf.shape(first)[0],
            **common,
        )
        baseline = tf.repeat(_reward(rewarder, greedy.tokens, image_index), k, axis=0)
    mask = tf.cast(tf.not_equal(tokens, vocab_lib.PAD_ID), tf.float32)
    inputs = tf.concat([tf.fill([tf.shape(tokens)[0], 1], vocab_lib.START_ID), tokens], axis=1)
    hard = decoder.attention == "hard" and decoder.hard_decoding == "expected"
    outputs = decoder(
        features,
        inputs[:, :-1],
        training=False,
        gumbel_noise=tf.zeros(tf.concat([tf.shape(tokens), tf.shape(features)[1:2]], 0))
        if hard
        else None,
        use_expected=tf.ones(tf.shape(tokens)[:1], tf.bool) if hard else None,
        state=state,
    )
    log_likelihood = losses.sequence_log_likelihood(outputs["logits"], tokens, mask)
    return {
        "objective": losses.self_critical_surrogate(log_likelihood, reward, baseline),
        "reward": reward,
        "baseline": baseline,
        "log_likelihood": log_likelihood,
        "words": tf.reduce_sum(mask, axis=1),
    }
