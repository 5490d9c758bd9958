"""Tests for sat_tf.model.fast.folded_encoder: the encoder with its batch norms folded
gives the Keras layers' features, on small nets and EfficientNet-Lite0 at output stride 16."""

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.backbones import efficientnet_lite
from sat_tf.model.encoder import ImageEncoder
from sat_tf.model.fast import folded_encoder


def _randomise_norms(net, seed=0):
    """Batch norm statistics and affine weights away from their initial 0 and 1."""
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.set_weights(
                [
                    w + rng.uniform(0.5, 1.5, w.shape).astype("float32")
                    if "variance" in v.path or "gamma" in v.path
                    else rng.normal(0.0, 0.5, w.shape).astype("float32")
                    for v, w in zip(layer.weights, layer.get_weights(), strict=True)
                ]
            )


def _small_net(dilation=2, size=8, center=True, scale=True):
    """Conv (bias) + BN + ReLU6; dilated depthwise + BN (no centre or scale) + ReLU; a
    convolution read by a BN and an addition (not folded); an unfolded BN."""
    inputs = keras.Input((size, size, 3))
    x = keras.layers.Conv2D(6, 3, padding="same", name="conv_a")(inputs)
    x = keras.layers.BatchNormalization(name="bn_a")(x)
    x = keras.layers.ReLU(max_value=6.0, name="relu6_a")(x)
    x = keras.layers.DepthwiseConv2D(
        3, padding="same", dilation_rate=dilation, use_bias=False, depth_multiplier=2, name="dw"
    )(x)
    x = keras.layers.BatchNormalization(center=center, scale=scale, name="bn_dw")(x)
    x = keras.layers.ReLU(name="relu_dw")(x)
    shared = keras.layers.Conv2D(12, 1, use_bias=False, name="conv_shared")(x)
    y = keras.layers.BatchNormalization(name="bn_shared")(shared)
    x = keras.layers.Add(name="add")([y, shared])
    x = keras.layers.BatchNormalization(name="bn_alone")(x)
    return keras.Model(inputs, x)


class FoldedEncoderTest(tf.test.TestCase, parameterized.TestCase):
    def test_plan_folds_each_convolution_read_only_by_its_batch_norm(self):
        plan = folded_encoder.folding_plan(_small_net())
        self.assertEqual({k: v.name for k, v in plan.items()}, {"conv_a": "bn_a", "dw": "bn_dw"})

    @parameterized.parameters(
        dict(dilation=1, size=8),
        dict(dilation=2, size=8),
        dict(dilation=2, size=7),  # 2 does not divide 7: TensorFlow's dilated convolution
        dict(dilation=2, size=8, center=False, scale=False),
    )
    def test_small_net_equals_its_layers(self, **settings):
        net = _small_net(**{k: v for k, v in settings.items()})
        _randomise_norms(net)
        x = tf.random.stateless_normal((2, settings["size"], settings["size"], 3), (1, 2))
        want = net(x, training=False)
        self.assertAllClose(folded_encoder.run(net, x), want, rtol=1e-5, atol=1e-5)

    def test_dilated_convolution_of_the_phases_is_exact(self):
        net = _small_net()
        x = tf.random.stateless_normal((2, 8, 8, 6), (3, 4))
        dw = net.get_layer("dw")
        direct = tf.nn.depthwise_conv2d(x, dw.kernel, (1, 1, 1, 1), "SAME", dilations=(2, 2))
        phased = folded_encoder._on_phases(
            2, x, lambda p: tf.nn.depthwise_conv2d(p, dw.kernel, (1, 1, 1, 1), "SAME")
        )
        self.assertTrue(folded_encoder._phases_apply(dw, x))
        self.assertAllEqual(phased, direct)

    def test_efficientnet_lite0_at_stride_16_equals_its_layers(self):
        net = efficientnet_lite.build_efficientnet_lite(
            include_top=False, input_shape=(64, 64, 3), output_stride=16
        )
        _randomise_norms(net, seed=1)
        norms = [x for x in net.layers if isinstance(x, keras.layers.BatchNormalization)]
        self.assertLen(folded_encoder.folding_plan(net), len(norms))
        x = tf.random.stateless_uniform((2, 64, 64, 3), (5, 6), -1.0, 1.0)
        want = net(x, training=False)
        got = tf.function(lambda x: folded_encoder.run(net, x))(x)
        self.assertAllClose(got, want, rtol=1e-4, atol=1e-4 * float(tf.reduce_max(tf.abs(want))))

    def test_the_encoder_takes_it_in_inference_in_float32_only(self):
        encoder = ImageEncoder("shapes_cnn", 32)
        self.assertTrue(folded_encoder.applies(encoder.net, training=False))
        self.assertTrue(folded_encoder.applies(encoder.net, training=None))
        self.assertFalse(folded_encoder.applies(encoder.net, training=True))
        _randomise_norms(encoder.net, seed=2)
        images = tf.random.stateless_uniform((2, 32, 32, 3), (7, 8), maxval=255.0)
        reference = tf.reshape(encoder.net(images / 255.0, training=False), (2, -1, 50))
        self.assertAllClose(encoder(images, training=False), reference, rtol=1e-5, atol=1e-5)
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            half = ImageEncoder("shapes_cnn", 32)
            self.assertFalse(folded_encoder.applies(half.net, training=False))
        finally:
            keras.mixed_precision.set_global_policy("float32")


if __name__ == "__main__":
    tf.test.main()
