"""`ResumableModel`: a `keras.Model` whose training resumes exactly from its weights file,
and the work-arounds on Keras internals that this and `tf.distribute` need. Kept apart
from the captioner so that it reads as the model only."""

import keras
import tensorflow as tf


class ResumableModel(keras.Model):
    """A `keras.Model` with its random states in its weights file, that trains under every
    `tf.distribute` strategy. Subclasses create all variables in `build()` and compile no
    losses or metrics."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Builds the optimizer only: `build()` made every variable, and no losses or
        metrics are compiled. Keras's own version first reduces a dict batch across
        replicas, which fails under `MultiWorkerMirroredStrategy` (keras-team/keras#20329).
        """
        if self.optimizer is not None and not self.optimizer.built:
            with self.distribute_strategy.scope():
                self.optimizer.build(self.trainable_variables)

    def _random_states(self):
        """The state of every random generator in the model (hard-attention samples,
        dropout masks), in a fixed order."""
        return [
            generator.state
            for layer in self._flatten_layers(include_self=True)
            for generator in getattr(layer, "_seed_generators", ())
        ]

    def save_own_variables(self, store):
        """Saves the random generators' states with the weights, so that a run resumed
        from a backup draws the random numbers an uninterrupted run draws (Keras saves
        no generator state by itself)."""
        super().save_own_variables(store)
        for i, state in enumerate(self._random_states()):
            store[f"random_state_{i}"] = state

    def load_own_variables(self, store):
        own = self._trainable_variables + self._non_trainable_variables
        numbered = [k for k in store.keys() if k.isdigit()]
        if len(numbered) != len(own):
            raise ValueError(
                f"the file holds {len(numbered)} variables of the model itself, the model has "
                f"{len(own)}: it was saved from another configuration"
            )
        for i, variable in enumerate(own):
            variable.assign(store[f"{i}"])
        states = self._random_states()
        keys = [f"random_state_{i}" for i in range(len(states))]
        if all(k in store.keys() for k in keys):
            for key, state in zip(keys, states, strict=True):
                state.assign(store[key])

    @staticmethod
    def sublayer_config(layer):
        """A sublayer's serialized config for `get_config`, without its build config:
        the model's `build()` builds its sublayers, and their build shapes would not
        survive JSON."""
        return {
            k: v
            for k, v in keras.saving.serialize_keras_object(layer).items()
            if k != "build_config"
        }

    def _logs(self, metrics):
        """{name: result}; shape (1,) across workers, where Keras averages the logs
        of the replicas along axis 0 (keras-team/keras#20585), else scalars."""
        strategy = tf.distribute.get_strategy()
        multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
            strategy.extended._in_multi_worker_mode()
        )
        return {m.name: tf.reshape(m.result(), [1] if multi_worker else []) for m in metrics}
