"""Tests for sat_tf.training.callbacks: stopping at a non-finite loss, early stopping on
validation BLEU-4 across an interruption, selecting on CIDEr instead (one short run)."""

import json
import os
from unittest import mock

import keras
import numpy as np
import tensorflow as tf
from fixtures import TINY

from sat_tf.config import Config
from sat_tf.serving import inference
from sat_tf.training import callbacks as callbacks_lib
from sat_tf.training import scoring, train_lib
from sat_tf.training import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class StopOnNonFiniteTest(tf.test.TestCase):
    def test_names_the_step_and_keeps_the_backup(self):
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.optimizer.iterations.assign(17)
        callback = callbacks_lib.StopOnNonFinite("/runs/x")
        callback.set_model(model)
        callback.on_train_batch_end(0, {"loss": 1.5})  # finite: nothing happens
        with self.assertRaisesRegex(
            callbacks_lib.TrainingDiverged, r"step 17.*nan.*/runs/x/backup"
        ):
            callback.on_train_batch_end(1, {"loss": float("nan")})

    def test_diverging_fit_stops_at_the_first_bad_step(self):
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(1e30), loss="mse")
        x = np.full((64, 1), 1e10, np.float32)
        with self.assertRaises(callbacks_lib.TrainingDiverged) as caught:
            model.fit(
                x,
                x,
                batch_size=8,
                epochs=3,
                verbose=0,
                callbacks=[callbacks_lib.StopOnNonFinite("w")],
            )
        step = int(str(caught.exception).split("step ")[1].split(":")[0])
        self.assertBetween(step, 1, 3)


class EarlyStoppingTest(tf.test.TestCase):
    def _callback(self, patience, history):
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        callback = callbacks_lib.EarlyStoppingOnScore(patience, history)
        callback.set_model(model)
        return callback, model

    def test_history_of_the_interrupted_run_counts(self):
        # Epoch order, not file order: 0.5, 0.6 (best), 0.55 -> one epoch without gain.
        history = [{"epoch": e, "val_bleu4": s} for e, s in ((3, 0.55), (1, 0.5), (2, 0.6))]
        callback, model = self._callback(2, history)
        self.assertEqual((callback.best, callback.wait, callback.exhausted), (0.6, 1, False))
        model.stop_training = False
        callback.on_epoch_end(3, {"val_bleu4": 0.6})  # equal is not better: the second
        self.assertTrue(model.stop_training)

    def test_a_better_score_restarts_the_count(self):
        callback, model = self._callback(2, [{"epoch": 1, "val_bleu4": 0.5}])
        model.stop_training = False
        for score in (0.4, 0.7, 0.6):
            callback.on_epoch_end(0, {"val_bleu4": score})
        self.assertEqual((callback.best, callback.wait), (0.7, 1))
        self.assertFalse(model.stop_training)
        callback.on_epoch_end(0, {})  # no score (no validation images): nothing changes
        self.assertEqual(callback.wait, 1)


class WeightsAtEpochEnd(keras.callbacks.Callback):
    """Keeps a copy of the model's weights at the end of each epoch (counted from 1)."""

    def __init__(self):
        super().__init__()
        self.weights = {}

    def on_epoch_end(self, epoch, logs=None):
        self.weights[epoch + 1] = [w.numpy().copy() for w in self.model.weights]


class SelectionOnCiderTest(tf.test.TestCase):
    def test_early_stopping_counts_the_chosen_score_and_passes_over_older_entries(self):
        # The first entry predates val_cider; of the others 0.4, 0.6 (best), 0.5.
        history = [
            {"epoch": 1, "val_bleu4": 0.9},
            {"epoch": 2, "val_bleu4": 0.1, "val_cider": 0.4},
            {"epoch": 3, "val_bleu4": 0.2, "val_cider": 0.6},
            {"epoch": 4, "val_bleu4": 0.8, "val_cider": 0.5},
        ]
        callback = callbacks_lib.EarlyStoppingOnScore(2, history, key="val_cider")
        callback.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
        self.assertEqual((callback.best, callback.wait), (0.6, 1))
        callback.model.stop_training = False
        callback.on_epoch_end(4, {"val_bleu4": 0.95, "val_cider": 0.55})
        self.assertTrue(callback.model.stop_training)

    def test_a_run_keeps_the_epoch_of_the_best_cider_stops_and_is_not_trained_again(self):
        root = self.get_temp_dir()
        config = Config(
            data_dir=os.path.join(root, "data"),
            # One step an epoch, two validation images and no test split: the validation
            # scores are the mock's, BLEU-4 falling where CIDEr rises, and what is checked
            # is which epochs were trained and which was kept.
            **{**TINY, "epochs": 5, "early_stopping_patience": 2, "steps_per_epoch": 1}
            | {"eval_images": 2, "num_test": 0, "selection_metric": "cider"},
        )
        workdir = os.path.join(root, "run")
        real = scoring.score_captions
        val_scores = iter([(0.9, 0.5), (0.1, 0.7), (0.95, 0.6), (0.99, 0.65)])

        def scores(*args, full=False, **kwargs):
            result = real(*args, full=full, **kwargs)
            if full:
                return result
            bleu4, cider = next(val_scores)  # a fifth validation would stop the run
            return {**result, "BLEU-4": bleu4, "CIDEr": cider}

        expected = [(0.9, 0.5), (0.1, 0.7), (0.95, 0.6), (0.99, 0.65)]
        recorder, real_callbacks = WeightsAtEpochEnd(), train_lib._callbacks

        def callbacks(*args, **kwargs):
            found, stopper = real_callbacks(*args, **kwargs)
            return [*found, recorder], stopper

        with (
            mock.patch.object(callbacks_lib, "score_captions", side_effect=scores),
            mock.patch.object(train_lib, "_callbacks", callbacks),
        ):
            train_lib.train_and_evaluate(config, workdir)
            history = workdir_lib.read_history(os.path.join(workdir, "val_history.json"))
            self.assertEqual([(h["val_bleu4"], h["val_cider"]) for h in history], expected)
            # The same command again (a "resume" of a finished run) trains nothing.
            train_lib.train_and_evaluate(config, workdir)
        history = workdir_lib.read_history(os.path.join(workdir, "val_history.json"))
        self.assertEqual([(h["val_bleu4"], h["val_cider"]) for h in history], expected)
        with open(os.path.join(workdir, inference.BEST_INFO), encoding="utf-8") as f:
            best = json.load(f)
        self.assertEqual(
            {k: best[k] for k in ("epoch", "selected_on", "val_bleu4", "val_cider")},
            {"epoch": 2, "selected_on": "val_cider", "val_bleu4": 0.1, "val_cider": 0.7},
        )
        self.assertEqual(workdir_lib.backed_up_epoch(workdir), 4)
        # best.weights.h5 holds the weights the model had at the end of epoch 2 (each
        # epoch's step changed them), not the last epoch's.
        self.assertEqual(sorted(recorder.weights), [1, 2, 3, 4])
        best_model, _, _ = inference.load_workdir(workdir)
        kept = [w.numpy() for w in best_model.weights]
        for epoch, weights in recorder.weights.items():
            same = all(np.array_equal(a, b) for a, b in zip(kept, weights, strict=True))
            self.assertEqual(same, epoch == 2, f"best.weights.h5 against epoch {epoch}")


if __name__ == "__main__":
    tf.test.main()
