"""`ShowAttendTell`: encoder + attention decoder with its own train / test step.

Batches are dicts: {"image": (B, S, S, 3) float pixels in [0, 255]} or
{"features": (B, L, D)} for cached encoder features, plus "caption": (B, T + 1) int32
ids `<start> w1 .. wn <end>` padded with 0.
"""

import keras
import numpy as np
import tensorflow as tf

from sat_tf.data import vocab as vocab_lib
from sat_tf.model import decoding
from sat_tf.model import losses as losses_lib
from sat_tf.model.decoder import AttentionDecoder
from sat_tf.model.encoder import ImageEncoder

BASELINE_SLOTS = 128


@keras.saving.register_keras_serializable(package="sat_tf")
class ShowAttendTell(keras.Model):
    """Show, Attend and Tell (Xu et al., 2015).

    Args:
      vocab_size, embed_dim, hidden_dim, attention_dim, attention, attention_score,
        dropout: see `AttentionDecoder`.
      encoder: backbone name in `encoder.REGISTRY`, or None when the model reads cached
        features.
      image_size: encoder input size.
      encoder_weights: see `ImageEncoder`; like there, not kept in `get_config`.
      train_encoder: update the encoder's weights too.
      feature_dim: D of cached features (only without an encoder).
      grid: (H, W) of cached features (only without an encoder), for attention maps.
      alpha_c: weight of the doubly stochastic penalty (soft attention, §4.2.1).
      reinforce_weight, entropy_weight: lambda_r, lambda_e of the hard objective (§4.1).
      reward_to_go: credit s_t with the log-likelihood of words t.. only, not the
        whole caption's (`losses.reinforce_reward`).
      reinforce_baseline: "moving_average" (paper 4.1): one moving average per number
        of words the reward covers (rewards `log p(y|s,a)` of captions of different
        lengths differ by far more than the samples make them differ, and batches hold
        one length); "argmax": the reward of the same caption decoded with every
        location at `argmax alpha` (the path captioning takes), computed without
        gradient; it does not depend on the samples, so the estimate stays unbiased,
        and it removes how hard each image's caption is from the advantage.
      baseline_decay: decay of the moving-average baselines.
      hard_mix_prob: chance that a sequence uses the expected context (hard attention).
      hard_warmup_steps: hard attention: every sequence uses the expected context for the
        first this many optimizer steps; sampling and the REINFORCE term start after it.
      hard_gate: see `AttentionDecoder`.
      seed: seed of the hard-attention samples.
    """

    def __init__(
        self,
        vocab_size,
        embed_dim=64,
        hidden_dim=256,
        attention_dim=64,
        attention="soft",
        attention_score="additive",
        dropout=0.2,
        encoder="shapes_cnn",
        image_size=112,
        encoder_weights=None,
        train_encoder=True,
        feature_dim=None,
        grid=None,
        alpha_c=0.0,
        reinforce_weight=1.0,
        entropy_weight=0.002,
        reward_to_go=False,
        reinforce_baseline="moving_average",
        baseline_decay=0.9,
        hard_mix_prob=0.5,
        hard_warmup_steps=0,
        hard_gate=False,
        seed=0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.hidden_dim = hidden_dim
        self.attention_dim = attention_dim
        self.attention = attention
        self.attention_score = attention_score
        self.dropout = dropout
        self.encoder_name = encoder
        self.image_size = image_size
        self.encoder_weights = encoder_weights
        self.train_encoder = train_encoder
        self.feature_dim = feature_dim
        self.alpha_c = alpha_c
        self.reinforce_weight = reinforce_weight
        self.entropy_weight = entropy_weight
        self.reward_to_go = reward_to_go
        if reinforce_baseline not in ("moving_average", "argmax"):
            raise ValueError(f"reinforce_baseline={reinforce_baseline!r} is not a baseline")
        self.reinforce_baseline = reinforce_baseline
        self.baseline_decay = baseline_decay
        self.hard_mix_prob = hard_mix_prob
        self.hard_warmup_steps = hard_warmup_steps
        self.seed = seed

        self.encoder = None
        if encoder:
            self.encoder = ImageEncoder(encoder, image_size, encoder_weights, name="encoder")
            self.encoder.trainable = train_encoder
            height, width, self.feature_dim = self.encoder.feature_grid()
            self.grid = (height, width)
        elif feature_dim is None:
            raise ValueError("a model without an encoder needs feature_dim")
        else:
            self.grid = tuple(grid) if grid else None
        self.decoder = AttentionDecoder(
            vocab_size,
            embed_dim=embed_dim,
            hidden_dim=hidden_dim,
            attention_dim=attention_dim,
            attention=attention,
            attention_score=attention_score,
            dropout=dropout,
            hard_gate=hard_gate,
            name="decoder",
        )
        self.baseline = self.add_weight(
            shape=(BASELINE_SLOTS,),
            initializer="zeros",
            trainable=False,
            aggregation="only_first_replica",
            name="reinforce_baseline",
        )
        self.baseline_seen = self.add_weight(
            shape=(BASELINE_SLOTS,),
            initializer="zeros",
            trainable=False,
            aggregation="only_first_replica",
            name="reinforce_baseline_seen",
        )
        self.seed_generator = keras.random.SeedGenerator(seed, name="hard_attention_seed")
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.nll_tracker = keras.metrics.Mean(name="nll_per_word")
        self.reward_tracker = keras.metrics.Mean(name="reward")

    @property
    def metrics(self):
        trackers = [self.loss_tracker, self.nll_tracker]
        if self.attention == "hard":
            trackers.append(self.reward_tracker)
        return trackers

    def build(self, input_shape=None):
        if self.encoder is not None:
            size = self.image_size
            self.encoder.build((None, size, size, 3))
        self.decoder.build((None, None, self.feature_dim))
        self.built = True

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Builds the optimizer only: `build()` made every variable, and no losses or
        metrics are compiled. Keras's own version first reduces a dict batch across
        replicas, which fails under `MultiWorkerMirroredStrategy` (keras-team/keras#20329).
        """
        if self.optimizer is not None and not self.optimizer.built:
            with self.distribute_strategy.scope():
                self.optimizer.build(self.trainable_variables)

    def _random_states(self):
        """The state of every random generator in the model (hard-attention samples,
        dropout masks), in a fixed order."""
        return [
            generator.state
            for layer in self._flatten_layers(include_self=True)
            for generator in getattr(layer, "_seed_generators", ())
        ]

    def save_own_variables(self, store):
        """Saves the baselines and the random generators' states with the weights, so
        that a run resumed from a backup draws the random numbers an uninterrupted run
        draws (Keras saves neither generator state by itself)."""
        super().save_own_variables(store)
        for i, state in enumerate(self._random_states()):
            store[f"random_state_{i}"] = state

    def load_own_variables(self, store):
        own = self._trainable_variables + self._non_trainable_variables
        numbered = [k for k in store.keys() if k.isdigit()]
        if len(numbered) != len(own):
            raise ValueError(
                f"the file holds {len(numbered)} variables of the model itself, the model has "
                f"{len(own)}: it was saved from another configuration"
            )
        for i, variable in enumerate(own):
            variable.assign(store[f"{i}"])
        states = self._random_states()
        keys = [f"random_state_{i}" for i in range(len(states))]
        if all(k in store.keys() for k in keys):
            for key, state in zip(keys, states, strict=True):
                state.assign(store[key])

    def encode(self, batch, training=False):
        """(B, L, D) annotation vectors of a batch (from "image" or "features")."""
        if "features" in batch:
            return tf.cast(batch["features"], tf.float32)
        if self.encoder is None:
            raise ValueError("this model reads cached features; the batch has no 'features'")
        return self.encoder(batch["image"], training=training and self.train_encoder)

    def call(self, batch, training=False):
        """Teacher-forced outputs (see `AttentionDecoder.call`) for batch["caption"]."""
        features = self.encode(batch, training=training)
        return self.decoder(features, batch["caption"][:, :-1], training=training)

    def _hard_noise(self, features, steps):
        """Gumbel noise fixing s_t for every step and the per-sequence mixing choice.

        Under a `tf.distribute` strategy the noise is drawn for the global batch and each
        replica keeps its own rows: replicas sample independently, and a step draws the
        same samples on any number of replicas.
        """
        batch, length = tf.shape(features)[0], tf.shape(features)[1]
        replicas, replica = 1, 0
        context = tf.distribute.get_replica_context()
        if context is not None:
            replicas = context.num_replicas_in_sync
            replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
        rows = replica * batch + tf.range(batch)
        shape = tf.stack([replicas * batch, steps, length])
        u = keras.random.uniform(shape, minval=1e-9, maxval=1.0, seed=self.seed_generator)
        mix = keras.random.uniform([replicas * batch], seed=self.seed_generator)
        mix_prob = tf.constant(self.hard_mix_prob, tf.float32)
        if self.hard_warmup_steps > 0 and getattr(self, "optimizer", None) is not None:
            warming_up = self.optimizer.iterations < self.hard_warmup_steps
            mix_prob = tf.where(warming_up, 1.0, mix_prob)
        u, mix = tf.gather(u, rows), tf.gather(mix, rows) < mix_prob
        return -tf.math.log(-tf.math.log(u)), mix

    def loss_terms(self, batch, training=True, gumbel_noise=None, use_expected=None):
        """Per-sequence objective and its parts.

        Args:
          batch: dict with "caption" and "image" or "features".
          training: dropout on, and for hard attention sample locations.
          gumbel_noise, use_expected: hard attention only; drawn here when None.

        Returns:
          dict of (B,) tensors: "objective" (what is minimised), "loss" (the reported
          loss: -log p(y|a), plus the penalty for soft attention), "log_likelihood",
          "words" (unmasked targets), and for hard attention "reward" (log p(y|s,a)),
          "sampled" (1.0 where a sample was used) and what moves the moving averages:
          "step_reward" ((B,) or (B, T) rewards to go), "baseline_slot", "baseline_weight".
        """
        captions = batch["caption"]
        targets = captions[:, 1:]
        mask = tf.cast(tf.not_equal(targets, vocab_lib.PAD_ID), tf.float32)
        features = self.encode(batch, training=training)
        hard = self.attention == "hard" and training
        if hard and gumbel_noise is None:
            gumbel_noise, use_expected = self._hard_noise(features, tf.shape(targets)[1])
        outputs = self.decoder(
            features,
            captions[:, :-1],
            training=training,
            gumbel_noise=gumbel_noise if hard else None,
            use_expected=use_expected if hard else None,
        )
        word_ll = losses_lib.word_log_likelihood(outputs["logits"], targets, mask)
        log_likelihood = tf.reduce_sum(word_ll, axis=1)
        terms = {"log_likelihood": log_likelihood, "words": tf.reduce_sum(mask, axis=1)}
        if hard:
            sampled = 1.0 - tf.cast(use_expected, tf.float32)
            reward = losses_lib.reinforce_reward(word_ll, self.reward_to_go)
            slots = self._baseline_slots(terms["words"], mask if self.reward_to_go else None)
            if self.reinforce_baseline == "argmax":
                # Skipped when no caption sampled (the warm-up): nothing would use it.
                baseline = tf.cond(
                    tf.reduce_any(sampled > 0),
                    lambda: self._argmax_reward(features, captions, mask),
                    lambda: tf.zeros_like(reward),
                )
            else:
                baseline = tf.gather(self.baseline, slots)
            terms["objective"] = losses_lib.reinforce_surrogate(
                log_likelihood,
                outputs["log_p_s"],
                outputs["entropy"],
                mask,
                sampled,
                baseline,
                self.reinforce_weight,
                self.entropy_weight,
                reward=reward,
            )
            # The moving averages are kept with either baseline.
            terms["step_reward"] = reward
            terms["baseline_slot"] = slots
            terms["baseline_weight"] = sampled[:, None] * mask if self.reward_to_go else sampled
            terms["reward"] = log_likelihood
            terms["sampled"] = sampled
            terms["loss"] = -log_likelihood
        else:
            loss = -log_likelihood
            if self.attention == "soft" and self.alpha_c > 0:
                penalty = losses_lib.doubly_stochastic_penalty(outputs["alpha"], mask)
                loss += self.alpha_c * penalty
            terms["loss"] = terms["objective"] = loss
        return terms

    def _update_trackers(self, terms):
        """Means over every caption (and word) seen, summed across replicas."""
        self.loss_tracker.update_state(terms["loss"])
        words = terms["words"]
        nll = tf.math.divide_no_nan(-terms["log_likelihood"], words)
        self.nll_tracker.update_state(nll, sample_weight=words)
        if "reward" in terms:
            self.reward_tracker.update_state(terms["reward"])

    @staticmethod
    def _baseline_slots(words, mask=None):
        """Moving-average slot of each reward: the number of words it covers (capped).

        Args:
          words: (B,) target words per caption.
          mask: None for one reward per caption (slots (B,)); (B, T) for rewards to go,
            where step t's reward covers `words - t` words (slots (B, T)).
        """
        covered = words if mask is None else tf.math.cumsum(mask, axis=1, reverse=True)
        return tf.minimum(tf.cast(covered, tf.int32), BASELINE_SLOTS - 1)

    def _argmax_reward(self, features, captions, mask):
        """The reward of each caption with every location at `argmax alpha`, without
        dropout and without gradient: the "argmax" baseline."""
        outputs = self.decoder(tf.stop_gradient(features), captions[:, :-1], training=False)
        word_ll = losses_lib.word_log_likelihood(outputs["logits"], captions[:, 1:], mask)
        return tf.stop_gradient(losses_lib.reinforce_reward(word_ll, self.reward_to_go))

    def _update_baseline(self, reward, slots, weight):
        """`b_n <- d b_n + (1 - d) mean(r)` for every number of words n in the batch.

        The mean is over the rewards of captions that used a sampled location (`weight`
        1.0; for rewards to go also 0.0 at padded steps): the baseline estimates the
        reward of a sampled trajectory (paper §4.1), which the expected-context captions
        would inflate. The first batch of a slot sets it. Means are over the global batch
        under a `tf.distribute` strategy.
        """
        reward, slots, weight = (tf.reshape(x, [-1]) for x in (reward, slots, weight))
        sums = tf.math.unsorted_segment_sum(reward * weight, slots, BASELINE_SLOTS)
        counts = tf.math.unsorted_segment_sum(weight, slots, BASELINE_SLOTS)
        context = tf.distribute.get_replica_context()
        if context is not None:
            sums, counts = context.all_reduce("sum", [sums, counts])
        present = counts > 0
        mean = sums / tf.maximum(counts, 1.0)
        decay = self.baseline_decay
        moved = tf.where(self.baseline_seen > 0, decay * self.baseline + (1 - decay) * mean, mean)
        self.baseline.assign(tf.where(present, moved, self.baseline))
        self.baseline_seen.assign(tf.maximum(self.baseline_seen, tf.cast(present, tf.float32)))

    def train_step(self, batch):
        batch, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        with tf.GradientTape() as tape:
            terms = self.loss_terms(batch, training=True)
            loss = tf.nn.compute_average_loss(terms["objective"])
            scaled = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        grads = tape.gradient(scaled, variables)
        self.optimizer.apply(grads, variables)
        if self.attention == "hard":
            self._update_baseline(
                terms["step_reward"], terms["baseline_slot"], terms["baseline_weight"]
            )
        self._update_trackers(terms)
        return self._logs(self.metrics)

    def test_step(self, batch):
        batch, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        self._update_trackers(self.loss_terms(batch, training=False))
        return self._logs([self.loss_tracker, self.nll_tracker])

    def _logs(self, metrics):
        """{name: result}; shape (1,) across workers, where Keras averages the logs
        of the replicas along axis 0 (keras-team/keras#20585), else scalars."""
        strategy = tf.distribute.get_strategy()
        multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
            strategy.extended._in_multi_worker_mode()
        )
        return {m.name: tf.reshape(m.result(), [1] if multi_worker else []) for m in metrics}

    def generate(self, batch, max_length=40, beam_size=1, length_penalty=0.0):
        """Captions a batch in the graph: greedy for beam_size 1, else beam search.

        Returns:
          `decoding.DecodeResult` with tokens (B, T), length (B,), log_prob (B,) and
          attention (B, T, L).
        """
        features = self.encode(batch)
        state = self.decoder.initial_state(features)
        common = dict(
            batch_size=tf.shape(features)[0],
            start_id=vocab_lib.START_ID,
            end_id=vocab_lib.END_ID,
            max_length=max_length,
            num_locations=int(features.shape[1]),
        )
        decoder_step = self.decoder.step
        # `<pad>` and `<start>` are never emitted: the words and the attention rows of a
        # caption would no longer line up. Their log-probabilities are not renormalised.
        banned = np.zeros([self.vocab_size], np.float32)
        banned[[vocab_lib.PAD_ID, vocab_lib.START_ID]] = -1e9

        def step_fn(tokens, state):
            log_probs, state, alpha = decoder_step(tokens, state)
            return log_probs + banned, state, alpha

        if beam_size == 1:
            return decoding.greedy_decode(step_fn, state, **common)
        return decoding.beam_search(
            step_fn,
            state,
            beam_size=beam_size,
            length_penalty=length_penalty,
            **common,
        )

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
            "hidden_dim": self.hidden_dim,
            "attention_dim": self.attention_dim,
            "attention": self.attention,
            "attention_score": self.attention_score,
            "dropout": self.dropout,
            "encoder": self.encoder_name,
            "image_size": self.image_size,
            "encoder_weights": None,
            "train_encoder": self.train_encoder,
            "feature_dim": self.feature_dim if self.encoder is None else None,
            "grid": self.grid if self.encoder is None else None,
            "alpha_c": self.alpha_c,
            "reinforce_weight": self.reinforce_weight,
            "entropy_weight": self.entropy_weight,
            "reward_to_go": self.reward_to_go,
            "reinforce_baseline": self.reinforce_baseline,
            "baseline_decay": self.baseline_decay,
            "hard_mix_prob": self.hard_mix_prob,
            "hard_warmup_steps": self.hard_warmup_steps,
            "hard_gate": self.decoder.hard_gate,
            "seed": self.seed,
        }


def build_model(config, vocab_size, feature_shape=None, load_encoder_weights=True):
    """Builds a `ShowAttendTell` from a `Config`.

    Args:
      config: `sat_tf.config.Config`.
      vocab_size: number of words including the special tokens.
      feature_shape: (L, D) of cached features when config.use_feature_cache.
      load_encoder_weights: read `config.encoder_weights`; False when trained weights
        are loaded next anyway (no download, no need for the original file).

    Returns:
      a built, uncompiled model.
    """
    weights = config.encoder_weights or None
    kwargs = dict(
        vocab_size=vocab_size,
        embed_dim=config.embed_dim,
        hidden_dim=config.hidden_dim,
        attention_dim=config.attention_dim,
        attention=config.attention,
        attention_score=config.attention_score,
        dropout=config.dropout,
        alpha_c=config.alpha_c,
        reinforce_weight=config.reinforce_weight,
        entropy_weight=config.entropy_weight,
        reward_to_go=config.reinforce_reward == "to_go",
        reinforce_baseline=config.reinforce_baseline,
        baseline_decay=config.baseline_decay,
        hard_mix_prob=config.hard_mix_prob,
        hard_warmup_steps=config.hard_warmup_steps,
        hard_gate=config.hard_gate,
        seed=config.seed,
    )
    if config.use_feature_cache:
        side = int(round(feature_shape[0] ** 0.5))
        grid = (side, feature_shape[0] // side)
        model = ShowAttendTell(encoder=None, feature_dim=feature_shape[-1], grid=grid, **kwargs)
    else:
        model = ShowAttendTell(
            encoder=config.encoder,
            image_size=config.image_size,
            encoder_weights=weights if load_encoder_weights else None,
            train_encoder=config.fine_tune_encoder or weights is None,
            **kwargs,
        )
    model.build()
    return model
