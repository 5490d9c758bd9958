"""The training optimizers (paper §4.3: RMSProp for Flickr8k, Adam for Flickr30k and COCO),
each variable's update made by TensorFlow's fused kernel (`sat_tf.model.fast.optimizers`).
"""

import keras

from sat_tf.model.fast.optimizers import FusedAdam, FusedRMSprop


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
