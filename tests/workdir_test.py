"""Tests for sat_tf.training.workdir: a workdir that holds another model is refused, and a
run starts from another workdir's weights only where they are this model's."""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from sat_tf.config import Config
from sat_tf.data.vocab import SPECIALS, Vocab
from sat_tf.model.show_attend_tell import build_model
from sat_tf.training import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CheckWorkdirTest(tf.test.TestCase):
    """The gate changes the weights of hard attention only."""

    def _workdir(self, config):
        workdir = self.get_temp_dir()
        workdir_lib.check_workdir(config, workdir)
        return workdir

    def test_hard_gate_must_match(self):
        workdir = self._workdir(Config(attention="hard", hard_gate=False))
        with self.assertRaisesRegex(ValueError, "--hard_gate: workdir has False, this run True"):
            workdir_lib.check_workdir(Config(attention="hard"), workdir)
        workdir_lib.check_workdir(Config(attention="hard", hard_gate=False), workdir)

    def test_hard_gate_is_ignored_for_soft(self):
        workdir = self._workdir(Config(hard_gate=False))
        workdir_lib.check_workdir(Config(), workdir)


# A model on cached (4, 6) features of a 2 x 2 grid, small enough to build in a moment.
SMALL = Config(use_feature_cache=True, embed_dim=8, hidden_dim=16, attention_dim=8)
VOCAB = Vocab([*SPECIALS, "a", "red", "square"])


def _model(config, seed):
    model = build_model(config, len(VOCAB), feature_shape=(4, 6), grid=(2, 2))
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    return model


class LoadInitialWeightsTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.source = self.get_temp_dir()
        workdir_lib.check_workdir(SMALL, self.source)  # writes config.json
        self.trained = _model(SMALL, seed=1)
        workdir_lib.save_weights_atomically(
            self.trained, os.path.join(self.source, workdir_lib.BEST_WEIGHTS)
        )
        workdir_lib.write_best_info(self.source, VOCAB, epoch=2)

    def test_gated_hard_attention_starts_from_soft_weights(self):
        config = dataclasses.replace(SMALL, attention="hard")
        model = _model(config, seed=2)
        workdir_lib.load_initial_weights(model, config, VOCAB, self.source)
        self.assertEqual(len(model.weights), len(self.trained.weights))
        for got, want in zip(model.weights, self.trained.weights, strict=True):
            self.assertEqual(got.path.split("/", 1)[1], want.path.split("/", 1)[1])
            self.assertAllEqual(got, want)

    def test_other_layers_are_refused(self):
        cases = [
            (
                dataclasses.replace(SMALL, attention="hard", hard_gate=False),
                "--attention: .*, this run hard: their",
            ),
            (dataclasses.replace(SMALL, attention="none"), "--attention: .*, this run none: their"),
            (dataclasses.replace(SMALL, hidden_dim=32), "--hidden_dim: .* has 16, this run 32"),
        ]
        for config, message in cases:
            model = _model(config, seed=3)
            with self.assertRaisesRegex(ValueError, f"holds another model:\\n  {message}"):
                workdir_lib.load_initial_weights(model, config, VOCAB, self.source)

    def test_another_vocabulary_is_refused(self):
        other = Vocab([*SPECIALS, "a", "blue", "circle"])
        model = _model(SMALL, seed=4)
        with self.assertRaisesRegex(
            ValueError, r"trained with another vocabulary.*this run's vocabulary has 7 words"
        ):
            workdir_lib.load_initial_weights(model, SMALL, other, self.source)

    def test_unfinished_workdir_is_named(self):
        os.remove(os.path.join(self.source, workdir_lib.BEST_WEIGHTS))
        with self.assertRaisesRegex(
            ValueError, f"--init_from={self.source} is not a finished workdir: best.weights.h5"
        ):
            workdir_lib.load_initial_weights(_model(SMALL, 5), SMALL, VOCAB, self.source)


if __name__ == "__main__":
    tf.test.main()
