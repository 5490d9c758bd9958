"""Where data and model meet: training, evaluation and loading a trained workdir.

A workdir holds `config.json`, `vocab.txt`, `best.weights.h5` (best validation BLEU-4,
paper §4.3), `backup/` (the state `BackupAndRestore` resumes from), `tensorboard/`, and
the evaluation outputs `captions_<split>.json` and `metrics_<split>.json`.
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

from sat_tf import datasets, input_pipeline, metrics, shapes, visualize
from sat_tf import vocab as vocab_lib
from sat_tf.config import Config
from sat_tf.encoder import get_spec
from sat_tf.model import build_model

CONFIG_FILE, VOCAB_FILE, BEST_WEIGHTS = "config.json", "vocab.txt", "best.weights.h5"
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
        diff = [
            f"--{k}: workdir has {getattr(saved, k)!r}, this run {getattr(config, k)!r}"
            for k in MODEL_FIELDS
            if getattr(saved, k) != getattr(config, k)
        ]
        if diff:
            raise ValueError(
                f"workdir {workdir} holds a different model; use another workdir or the "
                "same settings:\n  " + "\n  ".join(diff)
            )
    config.save(path)


def prepare_data(config: Config, workdir: str) -> Data:
    """Reads (for shapes: first generates) the dataset and loads or builds the vocabulary."""
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
    splits = {s: [r for r in records if r.split == s] for s in ("train", "val", "test")}
    if not splits["train"]:
        raise ValueError(f"dataset {config.dataset} in {config.data_dir} has no training images")
    vocab_path = os.path.join(workdir, VOCAB_FILE)
    if os.path.exists(vocab_path):
        vocab = vocab_lib.Vocab.load(vocab_path)
    else:
        captions = (c for r in splits["train"] for c in r.captions)
        vocab = vocab_lib.Vocab.build(captions, max_words=config.vocab_size)
        vocab.save(vocab_path)
    return Data(splits, vocab, objects)


def references(records):
    """{image_id: [tokenized reference, ...]} as space-joined lowercase words."""
    texts = [c for r in records for c in r.captions]
    words = iter(vocab_lib.tokenize_py(texts))
    return {r.image_id: [" ".join(next(words)) for _ in r.captions] for r in records}


def make_caption_fn(model, config: Config, beam_size=None):
    """A `tf.function` that captions a batch dict; see `ShowAttendTell.generate`."""
    beam = beam_size or config.beam_size

    @tf.function(reduce_retracing=True)
    def caption(batch):
        return model.generate(
            batch,
            max_length=config.max_decode_length,
            beam_size=beam,
            length_penalty=config.length_penalty,
        )

    return caption


def caption_records(model, records, vocab, config: Config, beam_size=None, batch_size=100):
    """Captions every record's image.

    Returns:
      list of dicts {"words": [...], "alpha": (n_words + 1, L) array (the last row made
      `<end>`), "log_prob": float}, in record order.
    """
    spec = get_spec(config.encoder)
    ds = input_pipeline.eval_dataset(
        records,
        image_size=config.image_size,
        crop_fraction=spec.crop_fraction,
        batch_size=batch_size,
    )
    caption = make_caption_fn(model, config, beam_size)
    results = []
    for batch in ds:
        out = caption({"image": batch["image"]})
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
            shapes.pointing_accuracy(words, alphas, objs, grid=grid, image_size=image_size)
        )
        scores.update(shapes.location_accuracy(words, objs))
    return scores


class EvaluationCallback(keras.callbacks.Callback):
    """Captions validation images after each epoch and logs `val_bleu4` (paper §4.3).

    Runs before `ModelCheckpoint` in the callback list, so the checkpoint selects on it.
    Also writes attention pictures of a few images to TensorBoard.
    """

    def __init__(self, records, vocab, config, objects, grid, log_dir, num_pictures=3):
        super().__init__()
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
        for key in ("pointing_accuracy", "location_accuracy"):
            if key in scores:
                logs[f"val_{key}"] = scores[key]
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
        spec = get_spec(self.config.encoder)
        data = tf.io.read_file(record.image_path)
        image = input_pipeline.decode_image(data, self.config.image_size, spec.crop_fraction)
        image = np.clip(image.numpy(), 0, 255).astype(np.uint8)
        words = res["words"] + [vocab_lib.END]
        return visualize.attention_figure(image, words, res["alpha"], self.grid)


def _optimizer(config: Config):
    clip = config.clip_norm or None
    if config.optimizer == "rmsprop":
        return keras.optimizers.RMSprop(config.learning_rate, global_clipnorm=clip)
    return keras.optimizers.Adam(config.learning_rate, global_clipnorm=clip)


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
    model = build_model(config, len(vocab))
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
    spec = get_spec(config.encoder)
    input_pipeline.check_image_files([r.image_path for r in train + data.splits["val"]])
    num_captions = sum(len(r.captions) for r in train)
    steps = config.steps_per_epoch or math.ceil(num_captions / config.batch_size)
    train_ds = input_pipeline.train_dataset(
        train,
        data.vocab,
        image_size=config.image_size,
        crop_fraction=spec.crop_fraction,
        batch_size=config.batch_size,
        max_length=config.max_caption_length,
        seed=config.seed,
    )
    strategy = _strategy(config)
    with strategy.scope():
        model = build_model(config, len(data.vocab))
        model.compile(optimizer=_optimizer(config), jit_compile=config.jit_compile)
    val = data.splits["val"][: config.eval_images or None]
    log_dir = os.path.join(workdir, "tensorboard")
    callbacks = [
        keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup"), double_checkpoint=True),
        keras.callbacks.TerminateOnNaN(),
    ]
    if val:
        grid = model.grid
        callbacks.append(EvaluationCallback(val, data.vocab, config, data.objects, grid, log_dir))
        callbacks.append(
            keras.callbacks.ModelCheckpoint(
                os.path.join(workdir, BEST_WEIGHTS),
                monitor="val_bleu4",
                mode="max",
                save_best_only=True,
                save_weights_only=True,
            )
        )
        if config.early_stopping_patience:
            callbacks.append(
                keras.callbacks.EarlyStopping(
                    "val_bleu4", mode="max", patience=config.early_stopping_patience
                )
            )
    callbacks.append(keras.callbacks.TensorBoard(log_dir, update_freq=50))
    logging.info(
        "training on %d images (%d captions), %d steps per epoch, vocabulary %d",
        len(train),
        num_captions,
        steps,
        len(data.vocab),
    )
    model.fit(train_ds, epochs=config.epochs, steps_per_epoch=steps, callbacks=callbacks)
    if os.path.exists(os.path.join(workdir, BEST_WEIGHTS)):
        model.load_weights(os.path.join(workdir, BEST_WEIGHTS))
    else:
        model.save_weights(os.path.join(workdir, BEST_WEIGHTS))
    if not data.splits["test"]:
        return {}
    return evaluate(model, data, config, workdir, "test")
