"""Attention scores f_att and the soft / hard context (paper §4).

A score layer splits into `project(a)`, `W_a a`, which does not depend on t and runs
once per image, and `step_scores`, which runs every step on the score's slice of the
fused projection of h_{t-1} (`fast.layout.HiddenLayout`): each layer names its slice
(`hidden_kernels`) and the other weights its step reads (`step_kernels`).
`score(projected, h)` and `call(a, h)` run the same step from the layer's own weights.

With `location=True` (not in the paper) a layer also learns one vector per cell, p_i,
added to the projection (`W_a a_i + p_i`): `sat_tf.model.location_prior`.
"""

import keras
import tensorflow as tf

from sat_tf.model import location_prior


@keras.saving.register_keras_serializable(package="sat_tf")
class AdditiveScore(keras.layers.Layer):
    """Bahdanau score `e_i = v^T tanh(W_a a_i [+ p_i] + U_a h)`.

    Args:
      units: width of the hidden layer of the score MLP.
      location: also learn a vector p_i per cell (`sat_tf.model.location_prior`).
    """

    def __init__(self, units, location=False, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.location = bool(location)
        self.w_a = keras.layers.Dense(units, name="W_a")
        self.u_a = keras.layers.Dense(units, use_bias=False, name="U_a")
        self.v = keras.layers.Dense(1, use_bias=False, name="v")

    def build(self, features_shape, hidden_shape=None):
        self.w_a.build(features_shape)
        if hidden_shape is not None:
            self.u_a.build(hidden_shape)
        self.v.build((None, None, self.units))
        location_prior.build(self, features_shape)

    def project(self, features):
        """(B, L, D) annotation vectors -> (B, L, units) `W_a a [+ p]`."""
        return location_prior.add(self, self.w_a(features))

    def hidden_kernels(self):
        """Its slice of the fused kernel applied to h_{t-1}: [U_a]."""
        return [self.u_a.kernel]

    def step_kernels(self):
        """The other weights a step reads: [v]."""
        return [self.v.kernel]

    @staticmethod
    def step_scores(projected, score_in, hidden, v):
        """(B, L) scores from `W_a a` (B, L, A) and `U_a h` (B, A); also returns the tanh
        layer (B, L, A), which the hand-written backward pass needs. For S states of
        each image, `U_a h` (B, S, A): scores (B, S, L) and the layer (B, S, L, A)."""
        del hidden  # the additive score sees h only through U_a h
        if len(score_in.shape) == 3:
            projected = projected[:, None]  # (B, 1, L, A)
        pre = tf.tanh(projected + tf.expand_dims(score_in, -2))  # (B, L, A)
        return tf.squeeze(tf.tensordot(pre, v, [[-1], [0]]), -1), pre  # (B, L)

    def score(self, projected, hidden):
        """(B, L, units) projection and (B, n) state -> (B, L) scores."""
        return self.step_scores(projected, self.u_a(hidden), hidden, self.v.kernel)[0]

    def call(self, features, hidden):
        return self.score(self.project(features), hidden)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "location": self.location}


@keras.saving.register_keras_serializable(package="sat_tf")
class DotScore(keras.layers.Layer):
    """Multiplicative score `e_i = (a_i^T W_a [+ p_i]) h` (Luong "general").

    `project` computes `a W_a` once per image, so a step costs one batched dot product
    and has no slice of the fused projection of h.

    Args:
      units: size of the decoder state h that the score is taken against.
      location: also learn a vector p_i per cell (`sat_tf.model.location_prior`).
    """

    def __init__(self, units, location=False, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.location = bool(location)
        self.w_a = keras.layers.Dense(units, use_bias=False, name="W_a")

    def build(self, features_shape, hidden_shape=None):
        self.w_a.build(features_shape)
        location_prior.build(self, features_shape)

    def project(self, features):
        """(B, L, D) -> (B, L, units) `a W_a [+ p]`."""
        return location_prior.add(self, self.w_a(features))

    def hidden_kernels(self):
        return []

    def step_kernels(self):
        return []

    @staticmethod
    def step_scores(projected, score_in, hidden):
        """(B, L) scores from `a W_a` (B, L, n) and h (B, n); nothing else to keep. For S
        states of each image, h (B, S, n): scores (B, S, L)."""
        del score_in  # no slice of the fused projection
        return tf.einsum("blu,b...u->b...l", projected, hidden), None

    def score(self, projected, hidden):
        """(B, L, units) and (B, units) -> (B, L) scores."""
        return self.step_scores(projected, None, hidden)[0]

    def call(self, features, hidden):
        return self.score(self.project(features), hidden)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "location": self.location}


@keras.saving.register_keras_serializable(package="sat_tf")
class ScaledDotScore(DotScore):
    """Scaled multiplicative score `e_i = a_i^T W_a h / sqrt(units)`.

    The same weights and step as `DotScore`; `project` folds the scale into `a W_a`.
    Over 1280 ReLU6 channels of a frozen ImageNet network the unscaled score starts
    with a standard deviation of about 9 over the cells, so its softmax is nearly
    one-hot from the first step; divided by sqrt(n) it starts about as spread as the
    additive score's.

    Args:
      units: size of the decoder state h that the score is taken against.
    """

    def project(self, features):
        """(B, L, D) -> (B, L, units) `a W_a / sqrt(units) [+ p]`."""
        return location_prior.add(self, self.w_a(features) * (1.0 / self.units**0.5))


SCORES = {"additive": AdditiveScore, "dot": DotScore, "scaled_dot": ScaledDotScore}


def soft_context(alpha, features):
    """Expected context `sum_i alpha_i a_i` (paper eq. 13).

    Args:
      alpha: (B, L) attention weights (cast to the features' dtype), or (B, S, L) for S
        states of each image.
      features: (B, L, D) annotation vectors.

    Returns:
      (B, D) context, or (B, S, D).
    """
    return tf.einsum("b...l,bld->b...d", tf.cast(alpha, features.dtype), features)


def hard_context(locations, features):
    """Context `a_{s}` at sampled locations (paper §4.1).

    Args:
      locations: (B,) int32 location index s per sequence, or (B, S) for S states of
        each image.
      features: (B, L, D).

    Returns:
      (B, D) the annotation vector at each location, or (B, S, D).
    """
    return tf.gather(features, locations, axis=1, batch_dims=1)


def gumbel_sample(log_alpha, gumbel_noise):
    """Samples `s ~ Multinoulli(alpha)` by the Gumbel-max trick.

    Args:
      log_alpha: (B, L) log attention weights (or unnormalised scores).
      gumbel_noise: (B, L) standard Gumbel noise.

    Returns:
      (B,) int32 sampled locations.
    """
    return tf.argmax(log_alpha + gumbel_noise, axis=-1, output_type=tf.int32)


def soft_attend(alpha, log_alpha, features):
    """Soft attention's context (paper §4.2): the expected one; no location."""
    del log_alpha
    return soft_context(alpha, features), None


def hard_attend(gumbel_noise=None, use_expected=None):
    """Hard attention's context (paper §4.1) as `attend(alpha, log_alpha, features) ->
    (context (B, D), location (B,))`.

    Args:
      gumbel_noise: (B, L) noise that fixes the sample s_t; None attends at
        `argmax alpha` (inference).
      use_expected: (B,) bool, sequences that take the expected context instead of
        the sample; None for none.
    """

    def attend(alpha, log_alpha, features):
        if gumbel_noise is None:
            where = tf.argmax(log_alpha, axis=-1, output_type=tf.int32)
        else:
            where = gumbel_sample(log_alpha, gumbel_noise)
        context = hard_context(where, features)
        if use_expected is not None:
            context = tf.where(use_expected[:, None], soft_context(alpha, features), context)
        return context, where

    return attend
