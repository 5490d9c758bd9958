"""Tests for sat_tf.training.optimizers: the fused updates against Keras's own Adam and
RMSProp over several steps (dense and sparse gradients, clipping, a learning-rate
schedule, XLA, a distribution strategy), the optimizer variables they keep, and the
configuration `build` makes."""

import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

from sat_tf.config import Config
from sat_tf.training import optimizers

# Uneven shapes; "embedding" gets the sparse gradient of a lookup, as the decoder's does.
SHAPES = {"embedding": (11, 6), "kernel": (6, 13), "bias": (13,)}
STEPS = 4
# Large enough that where epsilon enters (outside the square root or inside) shows.
EPSILON = 0.1


def _variables():
    rng = np.random.default_rng(0)
    return {
        name: keras.Variable(rng.normal(size=shape).astype("float32"), name=name)
        for name, shape in SHAPES.items()
    }


def _train(optimizer, steps=STEPS, jit_compile=False):
    """Runs `steps` updates of a small model with `optimizer`; returns its variables and
    the optimizer's (by their names: its own name is per instance), as arrays."""
    variables = _variables()
    optimizer.build(list(variables.values()))
    rng = np.random.default_rng(1)
    ids = tf.constant(rng.integers(0, 11, size=(steps, 5)), tf.int32)
    targets = tf.constant(rng.normal(size=(steps, 5, 13)), tf.float32)

    def body(ids, target):
        with tf.GradientTape() as tape:
            rows = tf.gather(variables["embedding"].value, ids)  # IndexedSlices gradient
            out = tf.tanh(rows @ variables["kernel"] + variables["bias"])
            loss = tf.reduce_sum(tf.square(out - target)) * 3.0  # gradients over the clip
        weights = list(variables.values())
        optimizer.apply(tape.gradient(loss, weights), weights)

    strategy = tf.distribute.get_strategy()  # the test's, or the default one

    @tf.function(jit_compile=jit_compile)
    def step(ids, target):
        strategy.run(body, args=(ids, target))

    for t in range(steps):
        step(ids[t], targets[t])
    state = {v.path: v.numpy() for v in variables.values()}
    state.update({f"optimizer/{v.name}": v.numpy() for v in optimizer.variables})
    return state


class FusedUpdateTest(tf.test.TestCase):
    def assertSameState(self, got, want):
        self.assertEqual(sorted(got), sorted(want))
        for path, value in want.items():
            self.assertAllClose(got[path], value, rtol=1e-4, atol=1e-6, msg=path)
        # The updates moved the weights: the comparison is not of two unchanged states.
        self.assertGreater(np.abs(want["kernel"] - _variables()["kernel"].numpy()).max(), 1e-3)

    def test_adam_is_kerass_adam(self):
        for clip in (None, 1.0):
            with self.subTest(clip=clip):
                got = _train(optimizers.FusedAdam(0.01, epsilon=EPSILON, global_clipnorm=clip))
                want = _train(keras.optimizers.Adam(0.01, epsilon=EPSILON, global_clipnorm=clip))
                self.assertSameState(got, want)

    def test_adam_under_a_schedule_and_xla(self):
        def rate():
            return keras.optimizers.schedules.CosineDecay(0.02, 6)

        got = _train(optimizers.FusedAdam(rate(), global_clipnorm=1.0), jit_compile=True)
        want = _train(keras.optimizers.Adam(rate(), global_clipnorm=1.0))
        self.assertSameState(got, want)

    def test_rmsprop_is_kerass_rmsprop(self):
        for centered in (True, False):
            with self.subTest(centered=centered):
                kwargs = dict(rho=0.95, momentum=0.9, epsilon=EPSILON, centered=centered)
                got = _train(optimizers.FusedRMSprop(0.01, **kwargs))
                want = _train(keras.optimizers.RMSprop(0.01, **kwargs))
                self.assertSameState(got, want)

    def test_settings_the_kernels_do_not_cover_run_kerass_update(self):
        got = _train(optimizers.FusedAdam(0.01, amsgrad=True))
        self.assertSameState(got, _train(keras.optimizers.Adam(0.01, amsgrad=True)))
        got = _train(optimizers.FusedRMSprop(0.01, momentum=0.0))
        self.assertSameState(got, _train(keras.optimizers.RMSprop(0.01, momentum=0.0)))
        with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
            got = _train(optimizers.FusedAdam(0.01))
        self.assertSameState(got, _train(keras.optimizers.Adam(0.01)))

    def test_the_fused_kernel_runs(self):
        optimizer = optimizers.FusedAdam(0.01)
        variable = keras.Variable(np.ones((3,), "float32"))
        optimizer.build([variable])
        graph = tf.function(lambda: optimizer.apply([tf.ones((3,))], [variable]))
        ops = {op.type for op in graph.get_concrete_function().graph.get_operations()}
        self.assertIn("ResourceApplyAdam", ops)


class BuildTest(tf.test.TestCase):
    def test_rmsprop_is_the_original_codes_variant(self):
        config = Config(optimizer="rmsprop", learning_rate=1e-4, lr_schedule="constant")
        optimizer = optimizers.build(config)
        self.assertIsInstance(optimizer, optimizers.FusedRMSprop)
        got = optimizer.get_config()
        self.assertAllClose(
            [got["learning_rate"], got["rho"], got["momentum"], got["epsilon"]],
            [1e-4, 0.95, 0.9, 1e-4],
        )
        self.assertTrue(got["centered"])

    def test_adam_with_clipping(self):
        config = Config(optimizer="adam", learning_rate=2e-4, clip_norm=5.0, lr_schedule="constant")
        optimizer = optimizers.build(config)
        self.assertIsInstance(optimizer, optimizers.FusedAdam)
        self.assertAllClose(optimizer.get_config()["global_clipnorm"], 5.0)
        self.assertIs(type(optimizers.build(config, fused=False)), keras.optimizers.Adam)

    def test_cosine_schedule_decays_to_zero_over_the_run(self):
        config = Config(learning_rate=1e-3, lr_schedule="cosine")
        optimizer = optimizers.build(config, total_steps=100)
        rate = optimizer._get_current_learning_rate
        self.assertAllClose(float(rate()), 1e-3)
        optimizer.iterations.assign(50)
        self.assertAllClose(float(rate()), 0.5e-3)  # (1 + cos(pi / 2)) / 2
        optimizer.iterations.assign(100)
        self.assertAllClose(float(rate()), 0.0, atol=1e-9)
        with self.assertRaisesRegex(ValueError, "cosine needs the number of training steps"):
            optimizers.build(config)

    def test_a_saved_model_file_loads_the_optimizer_back(self):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=optimizers.build(Config(lr_schedule="constant")), loss="mse")
        model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
        path = os.path.join(tempfile.mkdtemp(), "model.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
        self.assertIsInstance(loaded.optimizer, optimizers.FusedAdam)
        for a, b in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
            self.assertAllClose(a, b)
