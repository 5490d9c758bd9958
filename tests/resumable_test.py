"""Tests for sat_tf.model.resumable on a small model of its own: the random generators'
states saved with the weights and restored (so that draws after a reload are the draws
after the save), a file of another configuration refused, a file without states loaded,
sublayer configs without build shapes, the optimizer built without a batch, and the logs
(resumed runs of the captioner: train_lib_test.py, distribute_test.py)."""

import os

import h5py
import keras
import tensorflow as tf

from sat_tf.model.resumable import ResumableModel


class _Noisy(ResumableModel):
    """Two variables of its own (`extra` more), a Dense sublayer and a seed generator."""

    def __init__(self, extra=0, **kwargs):
        super().__init__(**kwargs)
        self.extra = extra
        self.dense = keras.layers.Dense(2, name="dense")
        self.seed_generator = keras.random.SeedGenerator(7)

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")
        self.count = self.add_weight(shape=(), initializer="zeros", trainable=False, name="n")
        self.more = [self.add_weight(shape=(), name=f"more{i}") for i in range(self.extra)]
        self.dense.build(input_shape)

    def call(self, x):
        return self.scale * self.dense(x)

    def draw(self):
        return keras.random.uniform([4], seed=self.seed_generator).numpy()


def _built(extra=0):
    model = _Noisy(extra)
    model.build((None, 3))
    return model


class RandomStateTest(tf.test.TestCase):
    def test_draws_after_a_reload_are_the_draws_after_the_save(self):
        model = _built()
        model.draw()
        path = os.path.join(self.get_temp_dir(), "m.weights.h5")
        model.save_weights(path)
        after_save = [model.draw(), model.draw()]
        model.scale.assign(5.0)
        model.load_weights(path)
        self.assertEqual(float(model.scale), 1.0)
        self.assertAllEqual([model.draw(), model.draw()], after_save)
        # Another model of the same configuration continues the same way.
        other = _built()
        other.load_weights(path)
        self.assertAllEqual(other.draw(), after_save[0])

    def test_the_file_holds_the_state_beside_the_own_variables(self):
        model = _built()
        path = os.path.join(self.get_temp_dir(), "m.weights.h5")
        model.save_weights(path)
        with h5py.File(path, "r") as f:
            own = set(f["vars"].keys())
        self.assertEqual(own, {"0", "1", "random_state_0"})

    def test_a_file_of_another_configuration_is_refused(self):
        path = os.path.join(self.get_temp_dir(), "m.weights.h5")
        _built().save_weights(path)
        with self.assertRaisesRegex(
            ValueError,
            "the file holds 2 variables of the model itself, the model has 3: it was saved "
            "from another configuration",
        ):
            _built(extra=1).load_weights(path)

    def test_a_file_without_states_loads_and_keeps_the_generator(self):
        model = _built()
        path = os.path.join(self.get_temp_dir(), "m.weights.h5")
        model.save_weights(path)
        with h5py.File(path, "a") as f:
            del f["vars"]["random_state_0"]
        model.draw()
        state = model.seed_generator.state.numpy()
        model.load_weights(path)
        self.assertAllEqual(model.seed_generator.state.numpy(), state)


class KerasSeamsTest(tf.test.TestCase):
    def test_sublayer_config_has_no_build_config(self):
        layer = keras.layers.Dense(3, name="d")
        layer.build((None, 4))
        config = ResumableModel.sublayer_config(layer)
        self.assertNotIn("build_config", config)
        self.assertIn("build_config", keras.saving.serialize_keras_object(layer))
        self.assertEqual(config["config"]["units"], 3)
        rebuilt = keras.saving.deserialize_keras_object(config)
        self.assertEqual((rebuilt.units, rebuilt.built), (3, False))

    def test_the_optimizer_is_built_without_a_batch(self):
        model = _built()
        model.compile(optimizer=keras.optimizers.Adam())
        self.assertFalse(model.optimizer.built)
        model._maybe_symbolic_build()
        self.assertTrue(model.optimizer.built)
        # Adam's two moments for each trainable variable (scale, the kernel, the bias),
        # beside its step count and learning rate.
        moments = [
            tuple(v.shape)
            for v in model.optimizer.variables
            if v.name not in ("iteration", "learning_rate")
        ]
        self.assertEqual(sorted(moments), sorted([(), (), (3, 2), (3, 2), (2,), (2,)]))

    def test_logs_are_scalars_on_one_worker(self):
        mean = keras.metrics.Mean(name="loss")
        mean.update_state([1.0, 2.0, 6.0])
        logs = _built()._logs([mean])
        self.assertEqual(list(logs), ["loss"])
        self.assertEqual(logs["loss"].shape, ())
        self.assertAllClose(logs["loss"], 3.0)


if __name__ == "__main__":
    tf.test.main()
