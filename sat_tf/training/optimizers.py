"""The training optimizers (paper §4.3: RMSProp for Flickr8k, Adam for Flickr30k and COCO):
`build` makes the one a config names, as Keras's Adam and RMSProp with each variable's
update made by TensorFlow's fused kernel (`FusedAdam`, `FusedRMSprop`).

Keras writes the update of a variable as a chain of element-wise ops (Adam: ten passes
over the variable, its two moments and temporaries of its size), each a pass over
memory. TensorFlow's `ResourceApplyAdam` / `ResourceApplyRMSProp` /
`ResourceApplyCenteredRMSProp` kernels make the same update in one pass, threaded over the
CPU's cores. The math is Keras's to the rounding: Adam's step size
lr √(1 − β₂ᵗ) / (1 − β₁ᵗ) and ε outside the square root, RMSProp's ε inside it. The
optimizer's variables, their names and therefore its checkpoints are Keras's own; the
gradient clip, weight decay, loss scaling and the rest of `apply` stay Keras's too. Where
the fused kernel does not fit (Adam with `amsgrad`, RMSProp without momentum, a variable
under a distribution strategy, the sparse gradient of a lookup: `_fusable`) the Keras
update runs instead.

bench/run.py times the step with each (`soft_additive_keras_adam`); BUILD_NOTES.md has
the decision ("Optimizers") and the measured speed-up ("Training speed").
"""

import keras
import tensorflow as tf


def _fusable(gradient, variable):
    """Whether `variable` (a `tf.Variable` in the TensorFlow backend's update step) can be
    updated through its resource handle by one kernel on this replica, by a dense
    `gradient`.

    A lookup's gradient (`tf.IndexedSlices`: the word embedding's) keeps Keras's update,
    because Keras squares its rows before adding repeated words up: the second moment of
    a word that occurs k times in a batch gets the sum of k squared gradients, where the
    kernels, given the dense gradient, would take the square of their sum. Fusing it
    would change the training, not only its speed (BUILD_NOTES.md)."""
    return (
        not isinstance(gradient, tf.IndexedSlices)
        and isinstance(variable, tf.Variable)
        and hasattr(variable, "handle")
        and not tf.distribute.has_strategy()
    )


def _handle(slot):
    """The resource handle of an optimizer slot (a Keras variable)."""
    return slot.value.handle


@keras.saving.register_keras_serializable(package="sat_tf")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam`, each variable updated by `ResourceApplyAdam`."""

    def __init__(self, *args, name="adam", **kwargs):  # Keras's name: the same paths
        super().__init__(*args, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or not _fusable(gradient, variable):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        return tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )


@keras.saving.register_keras_serializable(package="sat_tf")
class FusedRMSprop(keras.optimizers.RMSprop):
    """`keras.optimizers.RMSprop` with momentum, each variable updated by
    `ResourceApplyRMSProp` (or `ResourceApplyCenteredRMSProp` when centred)."""

    def __init__(self, *args, name="rmsprop", **kwargs):
        super().__init__(*args, name=name, **kwargs)

    def update_step(self, gradient, variable, learning_rate):
        if self.momentum <= 0 or not _fusable(gradient, variable):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        common = dict(
            var=variable.handle,
            ms=_handle(self._velocities[index]),
            mom=_handle(self._momentums[index]),
            lr=tf.cast(learning_rate, dtype),
            rho=tf.cast(self.rho, dtype),
            momentum=tf.cast(self.momentum, dtype),
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )
        if self.centered:
            return tf.raw_ops.ResourceApplyCenteredRMSProp(
                mg=_handle(self._average_gradients[index]), **common
            )
        return tf.raw_ops.ResourceApplyRMSProp(**common)


def build(config, total_steps=None, fused=True):
    """The optimizer of `config`; `total_steps` (epochs x steps) sets the cosine decay.

    `fused=False` gives Keras's own classes (the benchmark's baseline)."""
    clip = config.clip_norm or None
    rate = config.learning_rate
    if config.lr_schedule == "cosine":
        if not total_steps:
            raise ValueError("--lr_schedule=cosine needs the number of training steps")
        rate = keras.optimizers.schedules.CosineDecay(config.learning_rate, total_steps)
    if config.optimizer == "rmsprop":
        # The original code's RMSProp (Graves 2013: centred, momentum 0.9, decay 0.95,
        # epsilon 1e-4 inside the square root, as Keras puts it); BUILD_NOTES.md.
        rmsprop = FusedRMSprop if fused else keras.optimizers.RMSprop
        return rmsprop(
            rate,
            rho=0.95,
            momentum=0.9,
            epsilon=1e-4,
            centered=True,
            global_clipnorm=clip,
        )
    adam = FusedAdam if fused else keras.optimizers.Adam
    return adam(rate, global_clipnorm=clip)
