"""Attention scores f_att and the soft / hard context (paper §4).

A score layer splits into `project(a)`, which does not depend on t and runs once per
image, and `score(projected, h)`, which runs every step. `call(a, h)` does both.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="sat_tf")
class AdditiveScore(keras.layers.Layer):
    """Bahdanau score `e_i = v^T tanh(W_a a_i + U_a h)`.

    Args:
      units: width of the hidden layer of the score MLP.
    """

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.w_a = keras.layers.Dense(units, name="W_a")
        self.u_a = keras.layers.Dense(units, use_bias=False, name="U_a")
        self.v = keras.layers.Dense(1, use_bias=False, name="v")

    def build(self, features_shape, hidden_shape=None):
        self.w_a.build(features_shape)
        if hidden_shape is not None:
            self.u_a.build(hidden_shape)
        self.v.build((None, None, self.units))

    def project(self, features):
        """(B, L, D) annotation vectors -> (B, L, units) `W_a a`."""
        return self.w_a(features)

    def score(self, projected, hidden):
        """(B, L, units) projection and (B, n) state -> (B, L) scores."""
        pre = tf.tanh(projected + self.u_a(hidden)[:, None, :])  # (B, L, units)
        return tf.squeeze(self.v(pre), -1)  # (B, L)

    def call(self, features, hidden):
        return self.score(self.project(features), hidden)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package="sat_tf")
class DotScore(keras.layers.Layer):
    """Multiplicative score `e_i = a_i^T W_a h` (Luong "general").

    `project` computes `a W_a` once per image, so a step costs one batched dot product.

    Args:
      units: size of the decoder state h that the score is taken against.
    """

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.w_a = keras.layers.Dense(units, use_bias=False, name="W_a")

    def build(self, features_shape, hidden_shape=None):
        self.w_a.build(features_shape)

    def project(self, features):
        """(B, L, D) -> (B, L, units) `a W_a`."""
        return self.w_a(features)

    def score(self, projected, hidden):
        """(B, L, units) and (B, units) -> (B, L) scores."""
        return tf.einsum("blu,bu->bl", projected, hidden)

    def call(self, features, hidden):
        return self.score(self.project(features), hidden)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


SCORES = {"additive": AdditiveScore, "dot": DotScore}


def soft_context(alpha, features):
    """Expected context `sum_i alpha_i a_i` (paper eq. 13).

    Args:
      alpha: (B, L) attention weights.
      features: (B, L, D) annotation vectors.

    Returns:
      (B, D) context.
    """
    return tf.einsum("bl,bld->bd", alpha, features)


def hard_context(locations, features):
    """Context `a_{s}` at sampled locations (paper §4.1).

    Args:
      locations: (B,) int32 location index s per sequence.
      features: (B, L, D).

    Returns:
      (B, D) the annotation vector at each location.
    """
    return tf.gather(features, locations, axis=1, batch_dims=1)


def gumbel_sample(log_alpha, gumbel_noise):
    """Samples `s ~ Multinoulli(alpha)` by the Gumbel-max trick.

    Args:
      log_alpha: (B, L) log attention weights (or unnormalised scores).
      gumbel_noise: (B, L) standard Gumbel noise, drawn once per batch for all steps.

    Returns:
      (B,) int32 sampled locations.
    """
    return tf.argmax(log_alpha + gumbel_noise, axis=-1, output_type=tf.int32)
