"""The training loop: `train_and_evaluate(config, workdir)` trains a model as the config
says, keeps the best by validation BLEU-4 (paper §4.3; or CIDEr, `--selection_metric`),
and returns its test metrics.
"""

import dataclasses
import math
import os
import sys
import time
from collections.abc import Collection

import keras
import tensorflow as tf
from absl import logging

import sat_tf
from sat_tf.config import Config, derived_dir
from sat_tf.data import feature_cache, image_io, input_pipeline
from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation import cider
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference, tags
from sat_tf.training import callbacks as callbacks_lib
from sat_tf.training import decoding_choice, extract, optimizers
from sat_tf.training import workdir as workdir_lib
from sat_tf.training.prepare import cached_features, prepare_data, read_records
from sat_tf.training.scoring import evaluate
from sat_tf.utils import files, filesystem


def _strategy(config: Config):
    if config.strategy == "mirrored":
        return tf.distribute.MirroredStrategy()
    if config.strategy == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def _callbacks(config, workdir, data, val, grid, done):
    """The callbacks of `fit`, in order, and the early stopper (or None).

    Validation captioning runs before the checkpoint, which selects on its
    `--selection_metric` score, and the backup runs last, so that an epoch is backed up
    only once it is evaluated and checkpointed. An interrupted run's history is replayed
    into the best score so far and into the early stopper.
    """
    log_dir = os.path.join(workdir, "tensorboard")
    callbacks, stopper = [callbacks_lib.StopOnNonFinite(workdir)], None
    if val:
        history_path = os.path.join(workdir, workdir_lib.HISTORY_FILE)
        history = workdir_lib.read_history(history_path)
        key, best_so_far = config.selection_key, None
        if os.path.exists(os.path.join(workdir, inference.BEST_WEIGHTS)):
            best_so_far = max((h[key] for h in history if key in h), default=None)
        callbacks.append(
            callbacks_lib.EvaluationCallback(
                val, data.vocab, config, data.objects, grid, log_dir, history_path
            )
        )
        callbacks.append(callbacks_lib.BestCheckpoint(workdir, data.vocab, best_so_far, key))
        if config.early_stopping_patience:
            backed_up = [h for h in history if h["epoch"] <= done]
            stopper = callbacks_lib.EarlyStoppingOnScore(
                config.early_stopping_patience, backed_up, key
            )
            callbacks.append(stopper)
    callbacks.append(keras.callbacks.TensorBoard(log_dir, update_freq=50))
    backup = os.path.join(workdir, "backup")
    callbacks.append(
        keras.callbacks.BackupAndRestore(backup, double_checkpoint=True, delete_checkpoint=False)
    )
    return callbacks, stopper


def _train_jit(config):
    """Whether XLA compiles the train step: only with `--jit_compile` and a GPU. On every
    CPU measured, XLA made both kinds of step slower (bench/run.py's `_jit` cases,
    BUILD_NOTES "Training speed"), so there the flag compiles captioning only."""
    if not config.jit_compile:
        return False
    if tf.config.list_physical_devices("GPU"):
        return True
    logging.info("--jit_compile: captioning is compiled with XLA, the train step is not (CPU)")
    return False


def _warn_about_the_allocator():
    if sat_tf.cpu_allocator() == "default":
        logging.warning(
            "TensorFlow allocates CPU memory with its malloc allocator "
            "(TF_CPU_ALLOCATOR_USE_BFC=%s and oneDNN off, or TensorFlow ran ops before "
            "sat_tf was imported): paper-scale training steps ran slower than with the "
            "BFC allocator on the build machine (BUILD_NOTES.md, 'The CPU allocator')",
            os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"),
        )


def cider_rewarder(config: Config, train, vocab) -> cider.Rewarder:
    """The CIDEr-D reward of self-critical training over the training images `train`.

    References are the vocabulary's ids (`<unk>` for words outside it) followed by
    `<end>`; their document frequencies, one document per image, are counted once and
    kept beside the features (or in the dataset's derived folder) as
    `cider_df_<vocabulary fingerprint>_<records fingerprint>.npz`.
    """
    texts = [c for r in train for c in r.captions]
    words = iter(vocab_lib.tokenize_py(texts))
    refs = [[vocab.ids(next(words)) + [vocab_lib.END_ID] for _ in r.captions] for r in train]
    folder = (
        feature_cache.feature_dir_of(config) if config.use_feature_cache else derived_dir(config)
    )
    name = f"cider_df_{vocab.fingerprint}_{feature_cache.records_fingerprint(train)}.npz"
    start = time.time()
    scorer = cider.cached(os.path.join(folder, name), refs)
    rewarder = cider.Rewarder(scorer, refs, vocab_lib.END_ID)
    logging.info(
        "CIDEr-D reward: %d training images, %d n-grams (%s), ready in %.1fs",
        *(
            len(train),
            len(scorer.document_frequency),
            os.path.join(folder, name),
            time.time() - start,
        ),
    )
    return rewarder


# Below this many images a split's scores say little: on the 12 validation photos of the
# COCO worked example, CIDEr moved by 0.1 from one epoch to the next (BUILD_NOTES.md,
# "Your own photos").
FEW_IMAGES = {"train": 500, "val": 100, "test": 100}


def _warn_about_small_splits(splits):
    for split, few in FEW_IMAGES.items():
        if 0 < len(splits[split]) < few:
            logging.warning(
                "only %d %s images (fewer than %d): %s",
                len(splits[split]),
                split,
                few,
                "the captioner learns little beyond its start"
                if split == "train"
                else "its scores vary much with the photos chosen",
            )


def _set_up(config: Config, workdir: str):
    """The run's data, training dataset and model, checked before anything is written
    but the workdir's `config.json` and `vocab.txt`; with `--use_feature_cache`, the
    features are extracted first where their folder has none (`extract.extract_for_config`,
    undecodable images skipped and counted), from the records the run then trains on.

    Returns:
      (data, steps per epoch, training dataset, compiled model, epochs backed up).
    """
    workdir_lib.check_workdir(config, workdir)
    feature_dir = feature_cache.feature_dir_of(config) if config.use_feature_cache else ""
    # shapes is generated by `prepare_data`; its features are extracted by the command.
    missing = feature_dir and not os.path.exists(
        os.path.join(feature_dir, feature_cache.INDEX_FILE)
    )
    records = None  # read once: the extraction's are the run's
    if missing and config.dataset != "shapes":
        logging.info("features: none in %s yet; extracting them once", feature_dir)
        records = read_records(config)
        extract.extract_for_config(config, records, skip_bad_images=True)
    keras.utils.set_random_seed(config.seed)
    if config.mixed_precision:
        keras.mixed_precision.set_global_policy(config.mixed_precision)
    data = prepare_data(config, workdir, records=records)
    if config.dataset == "folder":
        _warn_about_small_splits(data.splits)
    train = data.splits["train"]
    cached, feature_shape = cached_features(config, train)
    checked = data.splits["val"] if config.use_feature_cache else train + data.splits["val"]
    image_io.check_image_files([r.image_path for r in checked])
    grid = None
    if config.use_feature_cache:
        index = feature_cache.read_index(feature_dir)
        workdir_lib.write_features_info(workdir, feature_dir, index)
        grid = tuple(index["grid"])
    num_captions = sum(len(r.captions) for r in train)
    done = workdir_lib.backed_up_epoch(workdir)
    common = dict(
        image_size=config.image_size,
        crop_fraction=config.effective_crop_fraction,
        seed=config.seed,
        features=cached,
        first_epoch=min(done, config.epochs - 1),
        epochs=config.epochs,
    )
    if config.scst:
        # --batch_size counts sampled captions: K for each image.
        images = config.batch_size // config.scst_samples
        steps = config.steps_per_epoch or math.ceil(len(train) / images)
        train_ds = input_pipeline.image_batches(
            train, batch_size=images, steps_per_epoch=steps, **common
        )
    else:
        steps = config.steps_per_epoch or math.ceil(num_captions / config.batch_size)
        train_ds = input_pipeline.train_dataset(
            train,
            data.vocab,
            batch_size=config.batch_size,
            max_words=config.max_caption_length,
            steps_per_epoch=steps,
            **common,
        )
    with _strategy(config).scope():
        model = build_model(config, len(data.vocab), feature_shape, grid)
        model.compile(
            optimizer=optimizers.build(config, config.epochs * steps),
            jit_compile=_train_jit(config),
        )
        if config.init_from and not done:  # a resumed run restores its own backup
            workdir_lib.load_initial_weights(model, config, data.vocab, config.init_from)
            logging.info("starting from the best weights of %s", config.init_from)
    if config.init_from and workdir_lib.copy_tag_table(config.init_from, workdir):
        # Validation, the decoding choice and the test scores caption as users will.
        model.tagger = tags.load_tagger(workdir, data.vocab, config.encoder)
    if config.scst:
        model.rewarder = cider_rewarder(config, train, data.vocab)
    return data, steps, train_ds, model, done


def train_and_evaluate(config: Config, workdir: str, given: Collection[str] = ()) -> dict:
    """Trains a model as `config` says, keeps the best by its validation score
    (`--selection_metric`), chooses its decoding on the validation images
    (`decoding_choice`, but for the settings named in `given`, the flags given
    explicitly), and returns its test-split metrics with that decoding.

    The workdir's config records its folders as absolute paths, so that every command
    finds the data and the cache from any working directory; a feature cache elsewhere
    (`s3://`, `gs://`) is read from its local copy (`feature_cache.local_copy`), which
    the config names. A run refused before
    training starts (bad data, a source of another model, ...) leaves the workdir as it
    found it. Re-running the same command after an interruption resumes from
    `workdir/backup`.
    """
    config = workdir_lib.resolved_config(config, given)
    feature_dir = feature_cache.feature_dir_of(config)
    if config.use_feature_cache and filesystem.is_remote(feature_dir):  # read from a copy
        local = feature_cache.local_copy(feature_dir, config.cache_dir)
        config = dataclasses.replace(config, feature_dir=local)
    with files.undone_on_failure(workdir):
        data, steps, train_ds, model, done = _set_up(config, workdir)
    train = data.splits["train"]
    num_captions = sum(len(r.captions) for r in train)
    val = data.splits["val"][: config.eval_images or None]
    callbacks, stopper = _callbacks(config, workdir, data, val, model.grid, done)
    _warn_about_the_allocator()
    logging.info(
        "training on %d images (%d captions), %d steps per epoch, vocabulary %d",
        *(len(train), num_captions, steps, len(data.vocab)),
    )
    if stopper is not None and stopper.exhausted:
        logging.info(
            "the run in %s stopped early (no better validation %s for %d epochs); "
            "evaluating its best checkpoint",
            *(workdir, config.selection_key, config.early_stopping_patience),
        )
    else:
        model.fit(
            train_ds,
            epochs=config.epochs,
            steps_per_epoch=steps,
            callbacks=callbacks,
            verbose=1 if sys.stdout.isatty() else 2,  # off a terminal: a plain line an epoch
        )
    best = os.path.join(workdir, inference.BEST_WEIGHTS)
    if os.path.exists(best):
        model.load_weights(best)
    else:
        workdir_lib.save_weights_atomically(model, best)
        workdir_lib.write_best_info(workdir, data.vocab, epoch=config.epochs)
    config = decoding_choice.choose_and_keep(model, data, config, workdir, given)
    if not data.splits["test"]:
        return {}
    return evaluate(model, data, config, workdir, "test")
