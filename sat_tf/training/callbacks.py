"""The callbacks of the training loop: validation captions, BLEU-4 and CIDEr each epoch,
the best checkpoint and early stopping on one of them (`--selection_metric`), and
stopping at a non-finite loss."""

import math
import os
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from sat_tf.config import SELECTION_METRICS
from sat_tf.data import image_io
from sat_tf.evaluation import metrics, visualize
from sat_tf.serving import inference
from sat_tf.training import workdir as workdir_lib
from sat_tf.training.scoring import caption_records, score_captions


class EvaluationCallback(keras.callbacks.Callback):
    """Captions validation images after each epoch and logs `val_bleu4` (paper §4.3) and
    `val_cider`.

    Runs before `BestCheckpoint` in the callback list, so the checkpoint selects on them.
    Also writes attention pictures of a few images to TensorBoard.
    """

    def __init__(
        self, records, vocab, config, objects, grid, log_dir, history_path, num_pictures=3
    ):
        super().__init__()
        self.history_path = history_path
        self.records = records
        self.vocab = vocab
        self.config = config
        self.objects = objects
        self.grid = grid
        self.writer = tf.summary.create_file_writer(os.path.join(log_dir, "captions"))
        self.num_pictures = num_pictures
        self.caption = None

    def on_epoch_end(self, epoch, logs=None):
        start = time.time()
        if self.caption is None:  # traced once, for the weights of every epoch
            self.caption = inference.make_caption_fn(self.model, self.config, vocab=self.vocab)
        results = caption_records(
            self.model, self.records, self.vocab, self.config, caption=self.caption
        )
        scores = score_captions(
            self.records, results, self.objects, self.grid, self.config.image_size
        )
        logs["val_bleu4"] = scores["BLEU-4"]
        logs["val_cider"] = scores["CIDEr"]
        grounding = ("pointing_accuracy", "phrase_pointing_accuracy", "location_accuracy")
        for key in grounding + metrics.CAPTION_STATISTICS:
            if key in scores:
                logs[f"val_{key}"] = scores[key]
        history = [
            h for h in workdir_lib.read_history(self.history_path) if h["epoch"] != epoch + 1
        ]
        history.append(
            {"epoch": epoch + 1, **{k: v for k, v in logs.items() if k.startswith("val_")}}
        )
        workdir_lib.write_json(self.history_path, history)
        with self.writer.as_default(step=epoch):
            for key, value in logs.items():
                if key.startswith("val_"):
                    tf.summary.scalar(key, value)
            for i, (record, res) in enumerate(zip(self.records, results, strict=True)):
                if i == self.num_pictures:
                    break
                picture = self._picture(record, res)
                tf.summary.image(f"attention/{record.image_id}", picture[None], max_outputs=1)
                tf.summary.text(f"caption/{record.image_id}", " ".join(res["words"]))
        logging.info(
            "epoch %d: val BLEU-4 %.4f CIDEr %.4f, bad endings %.3f, %d distinct words, "
            "mean length %.2f%s (%.1fs); e.g. %r",
            epoch + 1,
            scores["BLEU-4"],
            scores["CIDEr"],
            scores["bad_ending_rate"],
            scores["distinct_words"],
            scores["mean_length"],
            "".join(f", {k} {v:.4f}" for k, v in scores.items() if k.endswith("accuracy")),
            time.time() - start,
            " ".join(results[0]["words"]),
        )

    def _picture(self, record, res):
        data = tf.io.read_file(record.image_path)
        crop = self.config.effective_crop_fraction
        image = image_io.decode_image(data, self.config.image_size, crop)
        image = np.clip(image.numpy(), 0, 255).astype(np.uint8)
        words, points = visualize.caption_panels(
            res["words"], res["alpha"], self.config.decodes_at_a_cell
        )
        return visualize.attention_figure(image, words, res["alpha"], self.grid, hard_points=points)


class BestCheckpoint(keras.callbacks.Callback):
    """Keeps the weights of the epoch with the best validation score `key` (`val_bleu4`,
    paper §4.3, or `val_cider`).

    Writes `best.weights.h5` atomically, then `best.json` with the epoch, its validation
    scores and the fingerprint of the vocabulary the weights were trained with, which
    `inference.load_workdir` checks against the workdir's `vocab.txt`.

    Args:
      workdir: where the files go.
      vocab: the training vocabulary.
      best: the score to beat (from an interrupted run), or None.
      key: the score in the epoch logs that selects.
    """

    def __init__(self, workdir, vocab, best=None, key="val_bleu4"):
        super().__init__()
        self.workdir = workdir
        self.vocab = vocab
        self.best = best
        self.key = key

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        score = logs.get(self.key)
        if score is None or (self.best is not None and score <= self.best):
            return
        self.best = score
        workdir_lib.save_weights_atomically(
            self.model, os.path.join(self.workdir, inference.BEST_WEIGHTS)
        )
        scores = {k: logs[k] for k in SELECTION_METRICS.values() if k in logs}
        workdir_lib.write_best_info(
            self.workdir, self.vocab, epoch=epoch + 1, selected_on=self.key, **scores
        )


class EarlyStoppingOnScore(keras.callbacks.Callback):
    """Stops training when the validation score `key` has not improved for `patience`
    epochs (§4.3).

    Unlike `keras.callbacks.EarlyStopping`, it counts the epochs of an interrupted run:
    `history` (the entries of `val_history.json` for the epochs the backup holds) is
    replayed first, so a resumed run stops where the uninterrupted one would have.
    Entries without the score (written before it was logged) are passed over.

    Args:
      patience: epochs without a better score before stopping.
      history: earlier epochs' entries, each with "epoch" and scores such as "val_bleu4".
      key: the score in the epoch logs that counts.
    """

    def __init__(self, patience, history=(), key="val_bleu4"):
        super().__init__()
        self.patience = patience
        self.key = key
        self.best = None
        self.wait = 0
        for entry in sorted(history, key=lambda h: h["epoch"]):
            if key in entry:
                self._see(entry[key])

    @property
    def exhausted(self):
        """True once `patience` epochs in a row brought no better score."""
        return self.wait >= self.patience

    def _see(self, score):
        if self.best is None or score > self.best:
            self.best, self.wait = score, 0
        else:
            self.wait += 1

    def on_epoch_end(self, epoch, logs=None):
        score = (logs or {}).get(self.key)
        if score is None:
            return
        self._see(score)
        if self.exhausted:
            logging.info(
                "early stopping after epoch %d: validation %s has not improved on "
                "%.4f for %d epochs",
                epoch + 1,
                self.key,
                self.best,
                self.patience,
            )
            self.model.stop_training = True


class TrainingDiverged(ValueError):
    """The loss became NaN or infinite."""


class StopOnNonFinite(keras.callbacks.Callback):
    """Stops training at the first non-finite loss, before anything saves that state.

    Raising (rather than `stop_training`) skips the end-of-epoch backup, so
    `backup/` and `best.weights.h5` keep the last good weights.
    """

    def __init__(self, workdir):
        super().__init__()
        self.workdir = workdir

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            step = int(self.model.optimizer.iterations.numpy())
            raise TrainingDiverged(
                f"training diverged at step {step}: the loss is {float(loss)}; the last good "
                f"state is kept in {os.path.join(self.workdir, 'backup')} and "
                f"{os.path.join(self.workdir, inference.BEST_WEIGHTS)}"
            )
