"""`ShowAttendTell`: encoder + attention decoder with its own train / test step.

Batches are dicts: {"image": (B, S, S, 3) float pixels in [0, 255]} or
{"features": (B, L, D)} for cached encoder features, plus "caption": (B, T + 1) int32
ids `<start> w1 .. wn <end>` padded with 0.
"""

import dataclasses
from typing import NamedTuple

import keras
import tensorflow as tf

from sat_tf import config as config_lib
from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.model import decoding_rules, per_image, sampling, search
from sat_tf.model import losses as losses_lib
from sat_tf.model import self_critical as scst
from sat_tf.model.decoder import AttentionDecoder
from sat_tf.model.encoder import ImageEncoder
from sat_tf.model.resumable import ResumableModel


class Generated(NamedTuple):
    """Captions of a batch (`ShowAttendTell.generate`).

    Attributes:
      tokens, length, log_prob, attention: as `search.DecodeResult`.
      tag: int32 (B,), the vocabulary id of the tag the caption was made to say, -1
        where none was (no tagger, tags off, or a tag below the threshold).
      tag_prob: float32 (B,), the photo's most probable tag's probability (0 without a
        tagger or with tags off).
    """

    tokens: tf.Tensor
    length: tf.Tensor
    log_prob: tf.Tensor
    attention: tf.Tensor
    tag: tf.Tensor
    tag_prob: tf.Tensor


@keras.saving.register_keras_serializable(package="sat_tf")
class ShowAttendTell(ResumableModel):
    """Show, Attend and Tell (Xu et al., 2015).

    Args:
      decoder: the `AttentionDecoder` (or its serialized config).
      encoder: the `ImageEncoder` (or its serialized config), trained when it is
        trainable; None when the model reads cached features.
      feature_dim: D of cached features (only without an encoder).
      grid: (H, W) of cached features (only without an encoder), for attention maps.
      alpha_c: weight of the doubly stochastic penalty (soft attention, §4.2.1).
      reinforce: dict of `losses.Settings` fields (hard attention, §4.1); those left
        out (all for None) take `Config`'s defaults.
      seed: seed of the hard-attention samples and of self-critical training's.
      self_critical: dict of `self_critical.SelfCriticalSettings` fields to train by
        self-critical sequence training (its rewards come from `rewarder`, set before
        training); None for the cross-entropy objective.
    """

    def __init__(
        self,
        decoder,
        encoder=None,
        feature_dim=None,
        grid=None,
        alpha_c=Config.alpha_c,
        reinforce=None,
        seed=Config.seed,
        self_critical=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(encoder, dict):
            encoder = keras.saving.deserialize_keras_object(encoder)
        if isinstance(decoder, dict):
            decoder = keras.saving.deserialize_keras_object(decoder)
        self.alpha_c = alpha_c
        self.reinforce = dict(reinforce or {})
        # Hard attention's training settings (checked here); a soft model never reads them.
        self.settings = None
        if decoder.attention == "hard":
            self.settings = losses_lib.Settings(**self.reinforce)
        self.seed = seed
        self.self_critical = None
        if self_critical is not None:
            self.self_critical = scst.SelfCriticalSettings(**self_critical)
        # `rewarder(tokens, image_index) -> rewards`, numpy in and out (`cider.Rewarder`):
        # the reward of self-critical training, given by the training loop.
        self.rewarder = None
        self.encoder = encoder
        if encoder is not None:
            height, width, self.feature_dim = encoder.feature_grid()
            self.grid = (height, width)
        elif feature_dim is None:
            raise ValueError("a model without an encoder needs feature_dim")
        else:
            self.feature_dim = feature_dim
            self.grid = tuple(grid) if grid else None
        self.decoder = decoder
        # A preset's `tags.Tagger` (`sat_tf.serving.inference.load` sets it; not a weight).
        self.tagger = None
        # Hard attention's moving-average baselines b (and whether each was set): state
        # of the model, saved with its weights (every model has them: one weights layout).
        self.baseline, self.baseline_seen = (
            self.add_weight(
                shape=(losses_lib.BASELINE_SLOTS,),
                initializer="zeros",
                trainable=False,
                aggregation="only_first_replica",
                name=name,
            )
            for name in ("reinforce_baseline", "reinforce_baseline_seen")
        )
        self.seed_generator = keras.random.SeedGenerator(seed, name="hard_attention_seed")
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.nll_tracker = keras.metrics.Mean(name="nll_per_word")
        self.reward_tracker = keras.metrics.Mean(name="reward")

    @property
    def vocab_size(self):
        return self.decoder.vocab_size

    @property
    def attention(self):
        return self.decoder.attention

    @property
    def metrics(self):
        trackers = [self.loss_tracker, self.nll_tracker]
        if self.attention == "hard" or self.self_critical is not None:
            trackers.append(self.reward_tracker)
        return trackers

    def build(self, input_shape=None):
        if self.encoder is not None:
            size = self.encoder.image_size
            self.encoder.build((None, size, size, 3))
        cells = self.grid[0] * self.grid[1] if self.grid else None
        self.decoder.build((None, cells, self.feature_dim))
        self.built = True

    def encode(self, batch, training=False):
        """(B, L, D) annotation vectors of a batch (from "image" or "features")."""
        if "features" in batch:
            return tf.cast(batch["features"], tf.float32)
        if self.encoder is None:
            raise ValueError("this model reads cached features; the batch has no 'features'")
        # A pretrained encoder being fine-tuned keeps its batch-normalisation statistics
        # (inference mode): batches of a few photos, each repeated for its captions, would
        # replace the ImageNet statistics its weights were trained with.
        learns_statistics = self.encoder.trainable and not self.encoder.pretrained
        return self.encoder(batch["image"], training=training and learns_statistics)

    def call(self, batch, training=False):
        """Teacher-forced outputs (see `AttentionDecoder.call`) for batch["caption"]."""
        features = self.encode(batch, training=training)
        return self.decoder(features, batch["caption"][:, :-1], training=training)

    def hard_noise(self, features, steps):
        """`losses.sample_noise` from the model's generator, at the optimizer's step."""
        prob = losses_lib.mix_prob(self.settings, getattr(self, "optimizer", None))
        return losses_lib.sample_noise(self.seed_generator, features, steps, prob)

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
          "sampled" (1.0 where a sample was used) and what moves the moving averages
          (`losses.hard_terms`).
        """
        captions = batch["caption"]
        targets = captions[:, 1:]
        mask = tf.cast(tf.not_equal(targets, vocab_lib.PAD_ID), tf.float32)
        features = self.encode(batch, training=training)
        hard = self.attention == "hard" and training
        if hard and gumbel_noise is None:
            gumbel_noise, use_expected = self.hard_noise(features, tf.shape(targets)[1])
        # Hard attention's argmax baseline decodes the same features again: both passes
        # start from this state (no dropout before the output layer).
        state = self.decoder.initial_state(features) if hard else None
        outputs = self.decoder(
            features,
            captions[:, :-1],
            training=training,
            gumbel_noise=gumbel_noise if hard else None,
            use_expected=use_expected if hard else None,
            state=state,
        )
        word_ll = losses_lib.word_log_likelihood(outputs["logits"], targets, mask)
        log_likelihood = tf.reduce_sum(word_ll, axis=1)
        terms = {"log_likelihood": log_likelihood, "words": tf.reduce_sum(mask, axis=1)}
        terms["loss"] = -log_likelihood
        if hard:
            sampled = 1.0 - tf.cast(use_expected, tf.float32)
            terms.update(
                losses_lib.hard_terms(
                    self.settings,
                    self.decoder,
                    self.baseline,
                    features,
                    captions,
                    mask,
                    word_ll,
                    outputs,
                    sampled,
                    state,
                )
            )
            terms["reward"] = log_likelihood
            terms["sampled"] = sampled
        else:
            if self.attention == "soft" and self.alpha_c > 0:
                penalty = losses_lib.doubly_stochastic_penalty(outputs["alpha"], mask)
                terms["loss"] += self.alpha_c * penalty
            terms["objective"] = terms["loss"]
        return terms

    def self_critical_terms(self, batch):
        """The self-critical objective of a batch of images {"features" or "image",
        "image_index"}: `self_critical.batch_terms`."""
        return scst.batch_terms(self, batch)

    def _update_trackers(self, terms):
        """Means over every caption (and word) seen, summed across replicas."""
        self.loss_tracker.update_state(terms["loss"])
        words = terms["words"]
        nll = tf.math.divide_no_nan(-terms["log_likelihood"], words)
        self.nll_tracker.update_state(nll, sample_weight=words)
        if "reward" in terms:
            self.reward_tracker.update_state(terms["reward"])

    def train_step(self, batch):
        batch, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        with tf.GradientTape() as tape:
            if self.self_critical is not None:
                terms = self.self_critical_terms(batch)
            else:
                terms = self.loss_terms(batch, training=True)
            loss = tf.nn.compute_average_loss(terms["objective"])
            scaled = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        grads = tape.gradient(scaled, variables)
        self.optimizer.apply(grads, variables)
        if self.attention == "hard" and self.self_critical is None:
            losses_lib.update_baselines(
                self.baseline,
                self.baseline_seen,
                self.settings.baseline_decay,
                terms["step_reward"],
                terms["baseline_slot"],
                terms["baseline_weight"],
            )
        self._update_trackers(terms)
        return self._logs(self.metrics)

    def test_step(self, batch):
        batch, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        self._update_trackers(self.loss_terms(batch, training=False))
        return self._logs([self.loss_tracker, self.nll_tracker])

    def generate(self, batch, tag_threshold=None, **decoding) -> "Generated":
        """Captions a batch in the graph: the one decoding of captioning (the API,
        evaluation, the export): `decode` from the initial state of its images, made to
        say each photo's tag where the model has a `tagger` (a preset's, set by
        `sat_tf.serving.inference.load`) and the tag's probability reaches
        `tag_threshold` (constrained beam search; `sat_tf.serving.tags`).

        Args:
          batch: dict with "image" or "features" (`encode`).
          tag_threshold: the probability a tag needs; None turns tags off.
          **decoding: `decode`'s arguments after the state (max_length, beam_size,
            length_penalty, block_repeats, bad_ending_ids, hard_decoding, num_return,
            and to draw captions sample_seed, temperature, top_p).

        Returns:
          `Generated`: `decode`'s `search.DecodeResult` with each photo's tag; with
          num_return n > 1 its fields are (B, n, ...), the tag's (B,).
        """
        features = self.encode(batch)
        if self.tagger is not None and tag_threshold is not None:
            constraint, tag, prob = self.tagger.constraint(features, tag_threshold)
        else:
            batch_size = tf.shape(features)[0]
            tag, prob, constraint = tf.fill([batch_size], -1), tf.zeros([batch_size]), None
        state = self.decoder.initial_state(features)
        return Generated(*self.decode(state, constraint=constraint, **decoding), tag, prob)

    def decode(
        self,
        state,
        max_length=40,
        beam_size=1,
        length_penalty=0.0,
        block_repeats=False,
        bad_ending_ids=(),
        constraint=None,
        sample_seed=None,
        hard_decoding=None,
        compact=True,
        num_return=1,
        temperature=None,
        top_p=None,
    ):
        """Captions from the decoder's state: greedy for beam_size 1, else beam search.

        `block_repeats` and `bad_ending_ids` (`decoding_rules.block`): no word a third
        time in a row, no trigram twice; no caption ending on one of those word ids.
        `constraint`, bool (B, V), makes each caption hold one of its row's words
        (`search.beam_search`; with beam_size 1, a beam of one per state). `num_return`
        n: the n best of the beam (n <= beam_size). `sample_seed` draws each word instead
        of taking the most likely (beam_size 1; with a constraint, a beam of one per
        state draws), at `temperature` from the `top_p` nucleus (`sampling`): n captions
        drawn per image, ranked by log-probability. `hard_decoding` ("argmax",
        "expected"; None: the decoder's own) is hard attention's context.
        `compact=False` keeps beam search's tensors at B rows, as XLA needs
        (`search.beam_search`).

        Args:
          state: `AttentionDecoder.initial_state` of (B, L, D) annotation vectors.

        Returns:
          `search.DecodeResult` with tokens (B, T), length (B,), log_prob (B,) and
          attention (B, T, L); for n > 1 each with an axis of n after B, best first.
        """
        draws = 1 if sample_seed is None else num_return
        features = state["features"]
        common = dict(
            batch_size=tf.shape(features)[0] * draws,
            start_id=vocab_lib.START_ID,
            end_id=vocab_lib.END_ID,
            max_length=max_length,
            num_locations=int(features.shape[1]),
            block_repeats=block_repeats,
            bad_ending_ids=tuple(bad_ending_ids),
        )
        step_fn = self.decoding_step(hard_decoding)
        if sample_seed is not None:
            if beam_size != 1:
                raise ValueError(f"sample_seed draws with no beam; beam_size={beam_size}")
            common["drawing"] = sampling.Drawing(sample_seed, temperature, top_p)
            (state, constraint), num_return = sampling.repeat((state, constraint), draws), 1
        if beam_size == 1 and constraint is None and num_return == 1:
            found = search.greedy_decode(step_fn, state, **common)
            return found if draws == 1 else sampling.ranked(found, draws)
        state, constants = per_image.constants_apart(state)
        found = search.beam_search(
            step_fn,
            state,
            beam_size=beam_size,
            num_return=num_return,
            length_penalty=length_penalty,
            constraint=constraint,
            constants=constants,
            compact=compact,
            **common,
        )
        return found if draws == 1 else sampling.ranked(found, draws)

    def decoding_step(self, hard_decoding=None):
        """The decoder's step as captioning runs it (`search.StepFn`): the words of
        `vocab.NEVER_EMITTED` are never emitted (`decoding_rules.never_emitting`); hard
        attention attends as `hard_decoding` says (None: the decoder's own)."""

        def step(tokens, state, images=None):
            return self.decoder.step(tokens, state, hard_decoding, images)

        return decoding_rules.never_emitting(step, self.vocab_size)

    def get_config(self):
        serialize = self.sublayer_config
        return {
            **super().get_config(),
            "decoder": serialize(self.decoder),
            "encoder": serialize(self.encoder) if self.encoder is not None else None,
            "feature_dim": self.feature_dim if self.encoder is None else None,
            "grid": self.grid if self.encoder is None else None,
            "alpha_c": self.alpha_c,
            "reinforce": self.reinforce,
            "seed": self.seed,
            "self_critical": dataclasses.asdict(self.self_critical)
            if self.self_critical is not None
            else None,
        }


def build_model(config, vocab_size, feature_shape=None, grid=None, load_encoder_weights=True):
    """Builds a `ShowAttendTell` from a `Config`.

    Args:
      config: `sat_tf.config.Config`.
      vocab_size: number of words including the special tokens.
      feature_shape: (L, D) of cached features when config.use_feature_cache.
      grid: (H, W) of cached features (from their index); None takes a square grid.
      load_encoder_weights: read `config.encoder_weights`; False when trained weights
        are loaded next anyway (no download, no need for the original file).

    Returns:
      a built, uncompiled model.
    """
    self_critical = scst.SelfCriticalSettings.from_config(config) if config.scst else None
    kwargs = dict(
        alpha_c=config.alpha_c,
        reinforce=config_lib.arguments(losses_lib.Settings, config),
        seed=config.seed,
        self_critical=dataclasses.asdict(self_critical) if self_critical else None,
    )
    # The encoder is made before the decoder, whose initializers draw their seeds after
    # the encoder's: runs started from the same --seed begin from the same weights.
    encoder = None
    if not config.use_feature_cache:
        weights = config.encoder_weights or None
        encoder = ImageEncoder(
            config.encoder,
            config.image_size,
            weights if load_encoder_weights else None,
            name="encoder",
        )
        encoder.trainable = config.fine_tune_encoder or weights is None
    # The decoder's `vocab_size` counts the words of the vocabulary built, special
    # tokens included; --vocab_size is how many training words it keeps.
    settings = config_lib.arguments(AttentionDecoder, config, leave_out=("vocab_size",))
    decoder = AttentionDecoder(vocab_size, name="decoder", **settings)
    if config.use_feature_cache:
        if grid is None:
            side = int(round(feature_shape[0] ** 0.5))
            grid = (side, feature_shape[0] // side)
        model = ShowAttendTell(decoder, feature_dim=feature_shape[-1], grid=grid, **kwargs)
    else:
        model = ShowAttendTell(decoder, encoder=encoder, **kwargs)
    model.build()
    return model
