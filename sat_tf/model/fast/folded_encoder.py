"""The encoder's inference schedule: each batch norm folded into the convolution before it.

In inference a batch norm is an affine map per channel, `y = s (x - mu) + beta` with
`s = gamma / sqrt(var + eps)`. A convolution `x = w * u (+ b)` followed by it is the same
convolution with every output channel's kernel scaled by `s` and a bias
`(b - mu) s + beta`, so the batch norm's pass over the activations disappears, and
TensorFlow's CPU graph optimiser fuses the convolution, its bias and a ReLU or ReLU6
after it into one kernel (`_FusedConv2D`, `_FusedDepthwiseConv2dNative`), which keeps the
activations in cache between the three. The folded kernels are computed from the layers'
variables at each call, so a fine-tuned encoder's folding follows its weights.

`ImageEncoder.call` runs the net through `call`, which takes this schedule in inference in
float32 (`applies`); training and other compute dtypes run the Keras layers.
tests/folded_encoder_test.py holds it equal to the layers within float32 rounding.
"""

import functools

import keras
import tensorflow as tf

_CONVOLUTIONS = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)


def _single_consumer(layer):
    """The one layer that reads `layer`'s output, or None."""
    nodes = layer._outbound_nodes
    if len(nodes) != 1 or len(layer._inbound_nodes) != 1:
        return None
    consumer = nodes[0].operation
    return consumer if len(consumer._inbound_nodes) == 1 else None


def folding_plan(net: keras.Model) -> dict:
    """{convolution name: batch norm layer} for every linear, channels-last `Conv2D` or
    `DepthwiseConv2D` of the functional `net` read only by a batch norm over its channels."""
    plan = {}
    for layer in net.layers:
        if type(layer) not in _CONVOLUTIONS or layer.data_format != "channels_last":
            continue
        if getattr(layer, "groups", 1) != 1 or layer.activation is not keras.activations.linear:
            continue
        norm = _single_consumer(layer)
        if isinstance(norm, keras.layers.BatchNormalization) and norm.axis in (-1, 3):
            plan[layer.name] = norm
    return plan


def _inference_plan(net, training) -> dict:
    """`folding_plan(net)` where `run` computes `net(x, training=training)`: in
    inference, float32; else {}."""
    if training or not isinstance(net, keras.Model) or net.compute_dtype != "float32":
        return {}
    return folding_plan(net)


def applies(net: keras.Model, training) -> bool:
    """Whether `run` computes `net(x, training=training)`: in inference, float32, with
    something to fold."""
    return bool(_inference_plan(net, training))


def _folded(conv, norm):
    """The convolution of `conv` then `norm` in inference as one convolution and a bias."""
    scale = tf.math.rsqrt(norm.moving_variance + norm.epsilon)
    if norm.scale:
        scale *= norm.gamma
    bias = -norm.moving_mean * scale
    if conv.use_bias:
        bias += conv.bias * scale
    if norm.center:
        bias += norm.beta
    if isinstance(conv, keras.layers.DepthwiseConv2D):
        kernel = conv.kernel * tf.reshape(scale, [1, 1, *conv.kernel.shape[2:]])  # (k, k, C, M)
        convolve = functools.partial(tf.nn.depthwise_conv2d, filter=kernel)
    else:
        kernel = conv.kernel * scale  # (k, k, C_in, C_out)
        convolve = functools.partial(tf.nn.conv2d, filters=kernel)
    convolve = functools.partial(
        convolve, strides=(1, *conv.strides, 1), padding=conv.padding.upper()
    )

    def call(x, *args, **kwargs):
        if _phases_apply(conv, x):
            rate = conv.dilation_rate[0]
            return _on_phases(rate, x, lambda x: tf.nn.bias_add(convolve(x), bias))
        return tf.nn.bias_add(convolve(x, dilations=conv.dilation_rate), bias)

    return call


def _phases_apply(conv, x) -> bool:
    """Whether `conv`, dilated by d, is an undilated convolution of each of the d x d
    phases of `x` (every d-th row and column from an offset): stride 1, "same" padding,
    odd kernel sides, and height and width that d divides."""
    rate = conv.dilation_rate[0]
    return (
        rate > 1
        and tuple(conv.dilation_rate) == (rate, rate)
        and tuple(conv.strides) == (1, 1)
        and conv.padding == "same"
        and all(k % 2 == 1 for k in conv.kernel_size)
        and all(side is not None and side % rate == 0 for side in x.shape[1:3])
    )


def _on_phases(rate, x, convolve):
    """`convolve` (undilated) of each phase, put back in place: a kernel dilated by `rate`
    over `x` reads only the pixels of the phase of the one it computes, and its zero
    padding is the phase's own. TensorFlow's dilated convolution does the same with a
    padded `VALID` convolution, several times slower on a CPU."""
    corners = [[0, 0], [0, 0]]
    phases = tf.space_to_batch(x, [rate, rate], corners)  # (rate^2 B, H / rate, W / rate, C)
    return tf.batch_to_space(convolve(phases), [rate, rate], corners)


def _relu6(layer):
    """Whether a `keras.layers.ReLU` computes min(max(x, 0), 6)."""
    return (
        layer.max_value is not None
        and float(layer.max_value) == 6.0
        and not layer.negative_slope
        and not layer.threshold
    )


def run(net: keras.Model, x, plan=None):
    """`net(x, training=False)` with its batch norms folded (see the module's docstring).

    Args:
      net: a functional Keras model; layers that fold are replaced, the others run as
        they are (dropout as the identity).
      x: its input.
      plan: `folding_plan(net)`, if the caller has it.

    Returns:
      what `net` returns, within float32 rounding.
    """
    plan = folding_plan(net) if plan is None else plan
    norms = {norm.name for norm in plan.values()}
    replaced = {}
    for layer in net.layers:
        if layer.name in plan:
            replaced[layer.name] = _folded(layer, plan[layer.name])
        elif layer.name in norms or isinstance(layer, keras.layers.Dropout):
            replaced[layer.name] = lambda x, *args, **kwargs: x
        elif isinstance(layer, keras.layers.ReLU) and _relu6(layer):
            replaced[layer.name] = lambda x, *args, **kwargs: tf.nn.relu6(x)
    # Keras walks its graph and calls each operation; the replaced ones are these.
    return net._run_through_graph(x, operation_fn=lambda op: replaced.get(op.name, op))


def call(net: keras.Model, x, training=False):
    """`net(x, training=training)`, through `run` where it `applies`."""
    plan = _inference_plan(net, training)
    return run(net, x, plan) if plan else net(x, training=training)
