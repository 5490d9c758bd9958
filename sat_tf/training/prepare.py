"""The data of a run: the records of each split, the vocabulary, the cached features."""

import dataclasses
import os

from absl import logging

from sat_tf.config import Config, derived_dir
from sat_tf.data import datasets, feature_cache, shapes
from sat_tf.data import vocab as vocab_lib
from sat_tf.serving.inference import VOCAB_FILE
from sat_tf.training import workdir as workdir_lib


@dataclasses.dataclass
class Data:
    """Records per split, the vocabulary, and shapes object metadata (None elsewhere)."""

    splits: dict
    vocab: vocab_lib.Vocab
    objects: dict | None


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


def grown_vocab(config: Config, train_records) -> vocab_lib.Vocab:
    """The vocabulary of the model `config.init_from` names, grown with the words of the
    training captions it lacks that occur `config.new_word_min_count` times or more
    (`Vocab.grow`): the source's words keep their ids, so its weights start the run."""
    source = workdir_lib.source_vocab(config.init_from)
    vocab = source.grow((c for r in train_records for c in r.captions), config.new_word_min_count)
    logging.info(
        "vocabulary: %s words of %s + %s new (seen >= %d times)",
        f"{len(source):,}",
        config.init_from,
        f"{len(vocab) - len(source):,}",
        config.new_word_min_count,
    )
    return vocab


def read_records(config: Config):
    """The records of `config.dataset` (`datasets.load_records`; shapes must have been
    generated)."""
    return datasets.load_records(
        config.dataset, config.data_dir, captions=config.captions, on_missing=config.on_missing
    )


def prepare_data(
    config: Config, workdir: str, vocab: vocab_lib.Vocab | None = None, records=None
) -> Data:
    """Reads (for shapes: first generates) the dataset and loads or builds the vocabulary.

    With `--use_feature_cache`, images that feature extraction skipped are left out.

    Args:
      config: the settings of the run.
      workdir: where the vocabulary is kept (`vocab.txt`, written when absent: the
        training words', or with `--init_from` the source's grown by them,
        `grown_vocab`).
      vocab: the model's vocabulary (a preset's); then none is read or written.
      records: the dataset's records (`read_records`) when the caller has read them
        already, so that they are read once (not for shapes, which is generated here);
        None reads them.
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
    if records is None:
        records = read_records(config)
    if config.use_feature_cache:
        if config.fine_tune_encoder:
            raise ValueError(
                "--fine_tune_encoder trains the encoder, which needs images: "
                "set --use_feature_cache=false"
            )
        records = feature_cache.drop_skipped(records, feature_cache.feature_dir_of(config))
    splits = {s: [r for r in records if r.split == s] for s in ("train", "val", "test")}
    if vocab is None and not splits["train"]:  # a given vocabulary needs no training split
        raise ValueError(f"dataset {config.dataset} in {config.data_dir} has no training images")
    if vocab is None:
        vocab_path = os.path.join(workdir, VOCAB_FILE)
        if os.path.exists(vocab_path):
            vocab = vocab_lib.Vocab.load(vocab_path)
        else:
            make = grown_vocab if config.init_from else dataset_vocab
            vocab = make(config, splits["train"])
            vocab.save(vocab_path)
    return Data(splits, vocab, objects)


def cached_features(config: Config, records):
    """(dataset of (L, D) features in record order, (L, D)) from the feature cache when
    `config.use_feature_cache`, else (None, None)."""
    if not config.use_feature_cache:
        return None, None
    return feature_cache.feature_dataset_for(config, records)
