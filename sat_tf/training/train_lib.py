"""Where data and model meet: training, evaluation and loading a trained workdir.

A workdir holds `config.json`, `vocab.txt`, `best.weights.h5` (best validation BLEU-4,
paper §4.3), `backup/` (the state `BackupAndRestore` resumes from), `tensorboard/`, and
the evaluation outputs `captions_<split>.json` and `metrics_<split>.json`; a run on cached
features (`--use_feature_cache`) also keeps `features.json`, the settings of its features.

The vocabulary of a downloaded dataset is built once and kept with its other derived
files as `<cache_dir>/<dataset>-<hash>/vocab_<vocab_size>.txt` (never in the data
folder); each workdir gets a copy.
"""

import dataclasses
import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

import sat_tf
from sat_tf.config import Config, derived_dir
from sat_tf.data import datasets, image_io, input_pipeline, shapes
from sat_tf.data import feature_cache as features
from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation import grounding, metrics, visualize
from sat_tf.model.captioner import build_model
from sat_tf.model.encoder import crop_fraction_of

CONFIG_FILE, VOCAB_FILE, BEST_WEIGHTS = "config.json", "vocab.txt", "best.weights.h5"
BEST_INFO = "best.json"
HISTORY_FILE = "val_history.json"
FEATURES_FILE = "features.json"
MODEL_FIELDS = (
    "dataset",
    "vocab_size",
    "encoder",
    "image_size",
    "use_feature_cache",
    "attention",
    "attention_score",
    "embed_dim",
    "hidden_dim",
    "attention_dim",
)


@dataclasses.dataclass
class Data:
    """Records per split, the vocabulary, and shapes object metadata (None elsewhere)."""

    splits: dict
    vocab: vocab_lib.Vocab
    objects: dict | None


def write_text(path, text):
    """Writes a text file atomically (temp file + rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _write_json(path, value):
    write_text(path, json.dumps(value, indent=2, sort_keys=True))


def check_workdir(config: Config, workdir: str) -> None:
    """Creates the workdir, or checks that its saved config builds the same model.

    Raises:
      ValueError: naming each setting that differs, with both values, or when the
        workdir cannot be written.
    """
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write_test{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"workdir {workdir!r} is not writable: {e}") from e
    path = os.path.join(workdir, CONFIG_FILE)
    if os.path.exists(path):
        saved = Config.load(path)
        fields = MODEL_FIELDS + (("hard_gate",) if config.attention == "hard" else ())
        diff = [
            f"--{k}: workdir has {getattr(saved, k)!r}, this run {getattr(config, k)!r}"
            for k in fields
            if getattr(saved, k) != getattr(config, k)
        ]
        if diff:
            raise ValueError(
                f"workdir {workdir} holds a different model; use another workdir or the "
                "same settings:\n  " + "\n  ".join(diff)
            )
    config.save(path)


def dataset_vocab(config: Config, train_records) -> vocab_lib.Vocab:
    """The `config.vocab_size` most frequent training words (paper §5.1).

    For a downloaded dataset it is built once and kept as
    `<derived_dir>/vocab_<vocab_size>.txt` (`config.derived_dir`); shapes, regenerated
    when its settings change, builds it afresh.
    """
    captions = (c for r in train_records for c in r.captions)
    if config.dataset == "shapes":
        return vocab_lib.Vocab.build(captions, max_words=config.vocab_size)
    path = os.path.join(derived_dir(config), f"vocab_{config.vocab_size}.txt")
    if os.path.exists(path):
        return vocab_lib.Vocab.load(path)
    vocab = vocab_lib.Vocab.build(captions, max_words=config.vocab_size)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        vocab.save(path)
    except OSError as e:
        logging.warning("cannot keep the vocabulary in %s (%s); the workdir has it", path, e)
    return vocab


def prepare_data(config: Config, workdir: str) -> Data:
    """Reads (for shapes: first generates) the dataset and loads or builds the vocabulary.

    With `--use_feature_cache`, images that feature extraction skipped are left out.
    """
    objects = None
    if config.dataset == "shapes":
        json_path = shapes.generate(
            config.data_dir,
            seed=config.seed,
            num_train=config.num_train,
            num_val=config.num_val,
            num_test=config.num_test,
            image_size=config.image_size,
        )
        objects = shapes.load_objects(json_path)
    records = datasets.load_records(config.dataset, config.data_dir, on_missing=config.on_missing)
    if config.use_feature_cache:
        if config.fine_tune_encoder:
            raise ValueError(
                "--fine_tune_encoder trains the encoder, which needs images: "
                "set --use_feature_cache=false"
            )
        records = features.drop_skipped(records, features.feature_dir_of(config))
    splits = {s: [r for r in records if r.split == s] for s in ("train", "val", "test")}
    if not splits["train"]:
        raise ValueError(f"dataset {config.dataset} in {config.data_dir} has no training images")
    vocab_path = os.path.join(workdir, VOCAB_FILE)
    if os.path.exists(vocab_path):
        vocab = vocab_lib.Vocab.load(vocab_path)
    else:
        vocab = dataset_vocab(config, splits["train"])
        vocab.save(vocab_path)
    return Data(splits, vocab, objects)


def references(records):
    """{image_id: [tokenized reference, ...]} as space-joined lowercase words."""
    texts = [c for r in records for c in r.captions]
    words = iter(vocab_lib.tokenize_py(texts))
    return {r.image_id: [" ".join(next(words)) for _ in r.captions] for r in records}


def make_caption_fn(model, config: Config, beam_size=None):
    """A `tf.function` that captions a batch dict; see `ShowAttendTell.generate`.

    With `--jit_compile` XLA compiles it too, once per batch shape: it fuses the decoding
    step's small ops (greedy decoding at batch 1 0.63-0.96 x the time, BUILD_NOTES.md).
    """
    beam = beam_size or config.beam_size

    @tf.function(reduce_retracing=True, jit_compile=config.jit_compile)
    def caption(batch):
        return model.generate(
            batch,
            max_length=config.max_decode_length,
            beam_size=beam,
            length_penalty=config.length_penalty,
        )

    return caption


def cached_features(config: Config, records):
    """(dataset of (L, D) features in record order, (L, D)) from the feature cache when
    `config.use_feature_cache`, else (None, None)."""
    if not config.use_feature_cache:
        return None, None
    return features.feature_dataset_for(config, records)


def caption_records(model, records, vocab, config: Config, beam_size=None, batch_size=100):
    """Captions every record's image (its cached features with `--use_feature_cache`).

    Returns:
      list of dicts {"words": [...], "alpha": (n_words + 1, L) array (the last row made
      `<end>`; n_words rows when the caption reached the length limit without `<end>`),
      "log_prob": float}, in record order.
    """
    cached, _ = cached_features(config, records)
    ds = input_pipeline.eval_dataset(
        records,
        image_size=config.image_size,
        crop_fraction=crop_fraction_of(config),
        batch_size=batch_size,
        features=cached,
    )
    key = "image" if cached is None else "features"
    caption = make_caption_fn(model, config, beam_size)
    results = []
    for batch in ds:
        out = caption({key: batch[key]})
        tokens, lengths = out.tokens.numpy(), out.length.numpy()
        for i in range(len(tokens)):
            n = int(lengths[i])
            results.append(
                {
                    "words": vocab.decode(tokens[i][:n]),
                    "alpha": out.attention[i, : n + 1].numpy(),
                    "log_prob": float(out.log_prob[i]),
                }
            )
    return results


def score_captions(records, results, objects=None, grid=(14, 14), image_size=112, full=False):
    """Metrics of generated captions against the records' references.

    Args:
      records: the captioned records.
      results: output of `caption_records`.
      objects: shapes object metadata keyed by image id, for pointing / location
        accuracy (DESIGN.md §2).
      grid, image_size: attention grid and image size for pointing accuracy.
      full: all coco-caption metrics (Java for METEOR) instead of BLEU-4 alone.

    Returns:
      dict of metric name -> value.
    """
    refs = references(records)
    hyps = {r.image_id: " ".join(res["words"]) for r, res in zip(records, results, strict=True)}
    if full:
        scores = metrics.coco_scores(refs, hyps)
        scores.update(metrics.paper_bleu(refs, hyps))
    else:
        scores = {"BLEU-4": metrics.bleu4(refs, hyps)}
    if objects is not None:
        words = [res["words"] for res in results]
        objs = [objects[r.image_id] for r in records]
        alphas = [res["alpha"] for res in results]
        scores.update(
            grounding.pointing_accuracy(words, alphas, objs, grid=grid, image_size=image_size)
        )
        scores.update(grounding.location_accuracy(words, objs))
    return scores


class EvaluationCallback(keras.callbacks.Callback):
    """Captions validation images after each epoch and logs `val_bleu4` (paper §4.3).

    Runs before `BestCheckpoint` in the callback list, so the checkpoint selects on it.
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

    def on_epoch_end(self, epoch, logs=None):
        start = time.time()
        results = caption_records(self.model, self.records, self.vocab, self.config)
        scores = score_captions(
            self.records, results, self.objects, self.grid, self.config.image_size
        )
        logs["val_bleu4"] = scores["BLEU-4"]
        for key in ("pointing_accuracy", "phrase_pointing_accuracy", "location_accuracy"):
            if key in scores:
                logs[f"val_{key}"] = scores[key]
        history = [h for h in read_history(self.history_path) if h["epoch"] != epoch + 1]
        history.append(
            {"epoch": epoch + 1, **{k: v for k, v in logs.items() if k.startswith("val_")}}
        )
        _write_json(self.history_path, history)
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
            "epoch %d: val BLEU-4 %.4f %s (%.1fs); e.g. %r",
            epoch + 1,
            scores["BLEU-4"],
            {k: round(v, 4) for k, v in scores.items() if k.endswith("accuracy")},
            time.time() - start,
            " ".join(results[0]["words"]),
        )

    def _picture(self, record, res):
        data = tf.io.read_file(record.image_path)
        crop = crop_fraction_of(self.config)
        image = image_io.decode_image(data, self.config.image_size, crop)
        image = np.clip(image.numpy(), 0, 255).astype(np.uint8)
        hard = self.config.attention == "hard"
        words, points = visualize.caption_panels(res["words"], res["alpha"], hard)
        return visualize.attention_figure(image, words, res["alpha"], self.grid, hard_points=points)


def save_weights_atomically(model, path):
    """`model.save_weights(path)` through a temporary file and a rename, so that a kill
    never leaves a half-written file under `path`."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".tmp{os.getpid()}-{name}")
    model.save_weights(tmp)
    os.replace(tmp, path)


class BestCheckpoint(keras.callbacks.Callback):
    """Keeps the weights of the epoch with the best `val_bleu4` (paper §4.3).

    Writes `best.weights.h5` atomically, then `best.json` with the epoch, the score and
    the fingerprint of the vocabulary the weights were trained with, which
    `load_trained` checks against the workdir's `vocab.txt`.

    Args:
      workdir: where the files go.
      vocab: the training vocabulary.
      best: the score to beat (from an interrupted run), or None.
    """

    def __init__(self, workdir, vocab, best=None):
        super().__init__()
        self.workdir = workdir
        self.vocab = vocab
        self.best = best

    def on_epoch_end(self, epoch, logs=None):
        score = (logs or {}).get("val_bleu4")
        if score is None or (self.best is not None and score <= self.best):
            return
        self.best = score
        save_weights_atomically(self.model, os.path.join(self.workdir, BEST_WEIGHTS))
        write_best_info(self.workdir, self.vocab, epoch=epoch + 1, val_bleu4=score)


def write_best_info(workdir, vocab, **values):
    """Writes `best.json`: what `best.weights.h5` was trained with (and `values`)."""
    info = {"vocab_fingerprint": vocab.fingerprint, "vocab_words": len(vocab), **values}
    _write_json(os.path.join(workdir, BEST_INFO), info)


def read_history(path):
    """Per-epoch validation scores written by `EvaluationCallback` ([] if none yet)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def backed_up_epoch(workdir):
    """Epochs finished by the run whose state `BackupAndRestore` keeps in workdir/backup.

    Keras resumes `fit` at this epoch; the training data is made to start there too.
    """
    path = os.path.join(workdir, "backup", "training_metadata.json")
    if not os.path.exists(path):
        return 0
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["epoch"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read the training backup {path}: {e}") from e


class EarlyStoppingOnBleu(keras.callbacks.Callback):
    """Stops training when `val_bleu4` has not improved for `patience` epochs (§4.3).

    Unlike `keras.callbacks.EarlyStopping`, it counts the epochs of an interrupted run:
    `history` (the entries of `val_history.json` for the epochs the backup holds) is
    replayed first, so a resumed run stops where the uninterrupted one would have.

    Args:
      patience: epochs without a better score before stopping.
      history: earlier epochs' entries, each with "epoch" and "val_bleu4".
    """

    def __init__(self, patience, history=()):
        super().__init__()
        self.patience = patience
        self.best = None
        self.wait = 0
        for entry in sorted(history, key=lambda h: h["epoch"]):
            self._see(entry["val_bleu4"])

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
        score = (logs or {}).get("val_bleu4")
        if score is None:
            return
        self._see(score)
        if self.exhausted:
            logging.info(
                "early stopping after epoch %d: validation BLEU-4 has not improved on "
                "%.4f for %d epochs",
                epoch + 1,
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
                f"{os.path.join(self.workdir, BEST_WEIGHTS)}"
            )


def _optimizer(config: Config, total_steps=None):
    """The optimizer of `config`; `total_steps` (epochs x steps) sets the cosine decay."""
    clip = config.clip_norm or None
    rate = config.learning_rate
    if config.lr_schedule == "cosine":
        if not total_steps:
            raise ValueError("--lr_schedule=cosine needs the number of training steps")
        rate = keras.optimizers.schedules.CosineDecay(config.learning_rate, total_steps)
    if config.optimizer == "rmsprop":
        # The original code's RMSProp (Graves 2013: centred, momentum 0.9, decay 0.95,
        # epsilon 1e-4 inside the square root, as Keras puts it); BUILD_NOTES.md.
        return keras.optimizers.RMSprop(
            rate,
            rho=0.95,
            momentum=0.9,
            epsilon=1e-4,
            centered=True,
            global_clipnorm=clip,
        )
    return keras.optimizers.Adam(rate, global_clipnorm=clip)


def _strategy(config: Config):
    if config.strategy == "mirrored":
        return tf.distribute.MirroredStrategy()
    if config.strategy == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def load_trained(workdir: str):
    """Rebuilds the model of a workdir with its best (else latest backup) weights.

    Returns:
      (model, vocab, config).

    Raises:
      ValueError: when the workdir lacks its files or the weights do not fit.
    """
    config_path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(config_path):
        raise ValueError(f"{workdir} is not a sat_tf workdir: {CONFIG_FILE} is missing")
    config = Config.load(config_path)
    vocab = vocab_lib.Vocab.load(os.path.join(workdir, VOCAB_FILE))
    feature_shape = grid = None
    if config.use_feature_cache:
        features_path = os.path.join(workdir, FEATURES_FILE)
        if not os.path.exists(features_path):
            raise ValueError(f"{workdir} trained on cached features lacks {FEATURES_FILE}")
        with open(features_path, encoding="utf-8") as f:
            stored = json.load(f)
        feature_shape = tuple(stored["feature_shape"])
        grid = tuple(stored["grid"]) if "grid" in stored else None
    info_path = os.path.join(workdir, BEST_INFO)
    if os.path.exists(info_path):
        with open(info_path, encoding="utf-8") as f:
            info = json.load(f)
        if info.get("vocab_fingerprint") != vocab.fingerprint:
            raise ValueError(
                f"{VOCAB_FILE} of {workdir} is not the vocabulary its weights were trained "
                f"with: the weights had {info.get('vocab_words')} words (fingerprint "
                f"{info.get('vocab_fingerprint')}), {VOCAB_FILE} has {len(vocab)} words "
                f"(fingerprint {vocab.fingerprint})"
            )
    model = build_model(config, len(vocab), feature_shape, grid, load_encoder_weights=False)
    for path in (
        os.path.join(workdir, BEST_WEIGHTS),
        os.path.join(workdir, "backup", "latest.weights.h5"),
    ):
        if os.path.exists(path):
            try:
                model.load_weights(path)
            except ValueError as e:
                raise ValueError(
                    f"weights {path} do not fit the model of {config_path} with a "
                    f"vocabulary of {len(vocab)} words: {e}"
                ) from e
            return model, vocab, config
    raise ValueError(f"{workdir} holds no trained weights ({BEST_WEIGHTS} or backup/)")


def evaluate(model, data: Data, config: Config, workdir: str, split="test", beam_size=None):
    """Captions a split, scores it with every metric, and writes the results to workdir."""
    records = data.splits[split]
    if not records:
        raise ValueError(f"the {split} split of {config.dataset} is empty")
    results = caption_records(model, records, data.vocab, config, beam_size)
    grid = model.grid or (14, 14)
    scores = score_captions(records, results, data.objects, grid, config.image_size, full=True)
    captions = {r.image_id: " ".join(res["words"]) for r, res in zip(records, results, strict=True)}
    _write_json(os.path.join(workdir, f"captions_{split}.json"), metrics.to_coco_results(captions))
    _write_json(os.path.join(workdir, f"metrics_{split}.json"), scores)
    return scores


def train_and_evaluate(config: Config, workdir: str) -> dict:
    """Trains a model as `config` says, keeps the best by validation BLEU-4, and returns
    its test-split metrics.

    Re-running the same command after an interruption resumes from `workdir/backup`.
    """
    check_workdir(config, workdir)
    keras.utils.set_random_seed(config.seed)
    if config.mixed_precision:
        keras.mixed_precision.set_global_policy(config.mixed_precision)
    data = prepare_data(config, workdir)
    train = data.splits["train"]
    cached, feature_shape = cached_features(config, train)
    checked = data.splits["val"] if config.use_feature_cache else train + data.splits["val"]
    image_io.check_image_files([r.image_path for r in checked])
    grid = None
    if config.use_feature_cache:
        index = features.read_index(features.feature_dir_of(config))
        grid = tuple(index["grid"])
        keys = ("feature_dir", "encoder", "encoder_weights", "image_size", "feature_shape", "grid")
        index["feature_dir"] = os.path.abspath(features.feature_dir_of(config))
        _write_json(os.path.join(workdir, FEATURES_FILE), {k: index[k] for k in keys})
    num_captions = sum(len(r.captions) for r in train)
    done = backed_up_epoch(workdir)
    steps = config.steps_per_epoch or math.ceil(num_captions / config.batch_size)
    train_ds = input_pipeline.train_dataset(
        train,
        data.vocab,
        image_size=config.image_size,
        crop_fraction=crop_fraction_of(config),
        batch_size=config.batch_size,
        max_length=config.max_caption_length,
        seed=config.seed,
        features=cached,
        steps_per_epoch=steps,
        first_epoch=min(done, config.epochs - 1),
        epochs=config.epochs,
    )
    strategy = _strategy(config)
    with strategy.scope():
        model = build_model(config, len(data.vocab), feature_shape, grid)
        model.compile(
            optimizer=_optimizer(config, config.epochs * steps), jit_compile=config.jit_compile
        )
    val = data.splits["val"][: config.eval_images or None]
    log_dir = os.path.join(workdir, "tensorboard")
    callbacks = [StopOnNonFinite(workdir)]
    stopper = None
    if val:
        history_path = os.path.join(workdir, HISTORY_FILE)
        history = read_history(history_path)
        best_so_far = None
        if os.path.exists(os.path.join(workdir, BEST_WEIGHTS)):
            best_so_far = max((h["val_bleu4"] for h in history), default=None)
        callbacks.append(
            EvaluationCallback(
                val, data.vocab, config, data.objects, model.grid, log_dir, history_path
            )
        )
        callbacks.append(BestCheckpoint(workdir, data.vocab, best_so_far))
        if config.early_stopping_patience:
            backed_up = [h for h in history if h["epoch"] <= done]
            stopper = EarlyStoppingOnBleu(config.early_stopping_patience, backed_up)
            callbacks.append(stopper)
    callbacks.append(keras.callbacks.TensorBoard(log_dir, update_freq=50))
    # Last, so that an epoch is backed up only once it is evaluated and checkpointed.
    callbacks.append(
        keras.callbacks.BackupAndRestore(
            os.path.join(workdir, "backup"), double_checkpoint=True, delete_checkpoint=False
        )
    )
    if sat_tf.cpu_allocator() == "default":
        logging.warning(
            "TensorFlow allocates CPU memory with its malloc allocator "
            "(TF_CPU_ALLOCATOR_USE_BFC=%s and oneDNN off, or TensorFlow ran ops before "
            "sat_tf was imported): paper-scale training steps ran slower than with the "
            "BFC allocator on the build machine (BUILD_NOTES.md, 'The CPU allocator')",
            os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"),
        )
    logging.info(
        "training on %d images (%d captions), %d steps per epoch, vocabulary %d",
        len(train),
        num_captions,
        steps,
        len(data.vocab),
    )
    if stopper is not None and stopper.exhausted:
        logging.info(
            "the run in %s stopped early (no better validation BLEU-4 for %d epochs); "
            "evaluating its best checkpoint",
            workdir,
            config.early_stopping_patience,
        )
    else:
        model.fit(train_ds, epochs=config.epochs, steps_per_epoch=steps, callbacks=callbacks)
    if os.path.exists(os.path.join(workdir, BEST_WEIGHTS)):
        model.load_weights(os.path.join(workdir, BEST_WEIGHTS))
    else:
        save_weights_atomically(model, os.path.join(workdir, BEST_WEIGHTS))
        write_best_info(workdir, data.vocab, epoch=config.epochs)
    if not data.splits["test"]:
        return {}
    return evaluate(model, data, config, workdir, "test")
