"""Self-critical sequence training (Rennie et al., 2017; not in the paper).

REINFORCE on the words, with the CIDEr-D of sampled captions as the reward and the
reward of other captions of the same image as the baseline. Per image, K captions are
sampled in the graph from the model's own decoding step (`ShowAttendTell.decode` with a
seed); each is scored against the image's references by a reward function outside the
graph (`evaluation.cider.Rewarder`, through `tf.numpy_function`); and the loss is
`-(r - b) log p(sample)`, with `log p` from a teacher-forced pass over the samples, so that
its gradient comes from the training schedule (the fused recurrence) rather than through
the sampling loop. The policy is the model as it captions: no dropout, hard attention
attends as `hard_decoding` says, and the words captioning never emits (`<pad>`, `<start>`,
`<unk>`) are left out of its softmax, so that the words are the only samples and the
estimate is the exact score-function gradient of the expected reward of captioning.
Left in, those words would take probability from every sample whose reward is below its
baseline and give none back (no sample holds them), and the decoder would drift onto
`<unk>`.

The model's training step calls `batch_terms` with the model itself; nothing here
imports the model.
"""

import dataclasses

import keras
import tensorflow as tf

from sat_tf import config as config_lib
from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.model import decoding_rules


@dataclasses.dataclass(frozen=True)
class SelfCriticalSettings:
    """How self-critical training runs; the `Config` fields `scst_samples`,
    `scst_baseline`, `max_caption_length` and `scst_entropy_weight` (`from_config`).

    Attributes:
      samples: K, captions sampled per image.
      baseline: "mean": the mean reward of the image's other K - 1 samples (the "new
        self-critical" baseline of self-critical.pytorch); "greedy": the reward of the
        image's greedy caption (Rennie et al.'s).
      max_length: the most tokens a sample holds, `<end>` included.
      entropy_weight: β of the entropy bonus: the objective less β times the entropy of
        the policy's word distributions summed over a sample's steps.
    """

    samples: int
    baseline: str
    max_length: int
    # A model's Keras config saved before the entropy bonus existed lacks the key.
    entropy_weight: float = Config.scst_entropy_weight

    def __post_init__(self):
        config_lib.check_choice("scst_baseline", self.baseline)
        minimum = 2 if self.baseline == "mean" else 1
        if self.samples < minimum:
            raise ValueError(
                f"scst_samples={self.samples}: the {self.baseline} baseline needs at least "
                f"{minimum}"
            )

    @classmethod
    def from_config(cls, config):
        """The settings of a `Config` with `scst` set; None without."""
        if not config.scst:
            return None
        return cls(
            config.scst_samples,
            config.scst_baseline,
            config.max_caption_length,
            config.scst_entropy_weight,
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


def leave_one_out_baseline(rewards, samples):
    """(N,) the mean reward of the other `samples - 1` captions of the same image, for
    rewards (N,) laid out image by image (N = images x samples)."""
    per_image = tf.reshape(rewards, [-1, samples])  # (B, K)
    others = (tf.reduce_sum(per_image, axis=1, keepdims=True) - per_image) / (samples - 1)
    return tf.reshape(others, [-1])


def self_critical_surrogate(log_likelihood, reward, baseline):
    """(N,) loss per sampled caption whose gradient is `-(r - b) d log p(sample)/dW`: the
    REINFORCE estimate on the words, the reward r and baseline b without gradient, as in
    `losses.reinforce_surrogate`."""
    return -tf.stop_gradient(reward - baseline) * log_likelihood


def _reward(rewarder, tokens, image_index):
    reward = tf.numpy_function(rewarder, [tokens, image_index], tf.float32, stateful=False)
    return tf.ensure_shape(reward, [None])


def _log_likelihood(decoder, features, tokens, state):
    """((N,) `log p(tokens)`, (N,) entropy, (N,) words) of the samples (N, T) from a
    teacher-forced pass of the decoder as it captions (no dropout; hard attention as
    `hard_decoding` says; the softmax over the words it may emit), from its `state` (with
    gradient); the entropy is the step distributions', summed over each sample's words."""
    mask = tf.cast(tf.not_equal(tokens, vocab_lib.PAD_ID), tf.float32)
    inputs = tf.concat([tf.fill([tf.shape(tokens)[0], 1], vocab_lib.START_ID), tokens], axis=1)
    expected = decoder.attention == "hard" and decoder.hard_decoding == "expected"
    outputs = decoder(
        features,
        inputs[:, :-1],
        training=False,
        gumbel_noise=tf.zeros(tf.concat([tf.shape(tokens), tf.shape(features)[1:2]], 0))
        if expected
        else None,
        use_expected=tf.ones(tf.shape(tokens)[:1], tf.bool) if expected else None,
        state=state,
    )
    logits = outputs["logits"]  # (N, T, V)
    logits += decoding_rules.never_emitted_penalty(logits.shape[-1])
    # The never-emitted words' probability is exactly 0 (exp of about -1e9), so they add
    # 0 * -1e9 = 0 to the entropy and get no gradient from it.
    log_probs = tf.nn.log_softmax(logits)
    chosen = tf.gather(log_probs, tokens, axis=2, batch_dims=2)
    entropy = -tf.reduce_sum(tf.exp(log_probs) * log_probs, axis=2)
    sums = [tf.reduce_sum(x * mask, axis=1) for x in (chosen, entropy, mask)]
    return tuple(sums)


def self_critical_terms(
    settings: SelfCriticalSettings, model, features, image_index, seed, rewarder
):
    """The self-critical objective of a batch of images.

    Args:
      settings: `SelfCriticalSettings`.
      model: the `ShowAttendTell` (its `decoder` and `decode`).
      features: (B, L, D) annotation vectors.
      image_index: (B,) int32, each image's index in the rewarder's reference list.
      seed: the (2,) stateless seed of the samples (`sample_seed`).
      rewarder: `rewarder(tokens (N, T) int32, image_index (N,)) -> (N,) float32`.

    Returns:
      dict of (B K,) tensors, image by image: "objective", "reward" (of the samples),
      "baseline", "log_likelihood" and "entropy" (of the samples, summed over their
      words), "words" (their tokens, `<end>` included).
    """
    k = settings.samples
    features = tf.repeat(features, k, axis=0)  # (B K, L, D)
    index = tf.repeat(image_index, k, axis=0)
    state = model.decoder.initial_state(features)
    frozen = tf.nest.map_structure(tf.stop_gradient, state)
    sampled = model.decode(frozen, settings.max_length, sample_seed=seed)
    tokens = tf.stop_gradient(sampled.tokens)  # (B K, T): words, <end>, then <pad>
    reward = _reward(rewarder, tokens, index)
    if settings.baseline == "mean":
        baseline = leave_one_out_baseline(reward, k)
    else:
        greedy = model.decode(tf.nest.map_structure(lambda s: s[::k], frozen), settings.max_length)
        baseline = tf.repeat(_reward(rewarder, greedy.tokens, image_index), k, axis=0)
    log_likelihood, entropy, words = _log_likelihood(model.decoder, features, tokens, state)
    objective = self_critical_surrogate(log_likelihood, reward, baseline)
    if settings.entropy_weight:
        objective -= settings.entropy_weight * entropy
    return {
        "objective": objective,
        "reward": reward,
        "baseline": baseline,
        "log_likelihood": log_likelihood,
        "entropy": entropy,
        "words": words,
    }


def batch_terms(model, batch):
    """`self_critical_terms` of a batch of images {"features" or "image", "image_index"}
    for the model's training step: K samples of each, rewarded by `model.rewarder`, with
    the seed drawn from the model's generator; "loss" (what is reported) is the objective.
    The encoder stays as it is (frozen, or not trained by this objective)."""
    if model.rewarder is None:
        raise ValueError("self-critical training needs model.rewarder (the CIDEr-D reward)")
    features = tf.stop_gradient(model.encode(batch))
    seed = sample_seed(model.seed_generator)
    terms = self_critical_terms(
        model.self_critical, model, features, batch["image_index"], seed, model.rewarder
    )
    return {**terms, "loss": terms["objective"]}
