"""Tests for sat_tf.training.prepare, the data of a run: the dataset's vocabulary built once
and kept, the source's vocabulary grown by the training words (--init_from), and the
settings that cannot read the data refused."""

import dataclasses
import os

import tensorflow as tf
from finetune_test import (
    CAPTIONS,
    SMALL,
    SOURCE,
    _fine_tuning,
    _random_weights,
    _write_flickr8k,
)

from sat_tf.config import Config, derived_dir
from sat_tf.data.vocab import SPECIALS, Vocab
from sat_tf.model.show_attend_tell import build_model
from sat_tf.training import prepare


class PrepareDataTest(tf.test.TestCase):
    def test_the_sources_vocabulary_grown_by_the_training_words(self):
        root = self.get_temp_dir()
        trained = _random_weights(build_model(SMALL, len(SOURCE), (4, 6), (2, 2)), seed=1)
        config = Config(**_fine_tuning(root, SMALL, trained))
        source = config.init_from
        workdir = os.path.join(root, "run")
        os.makedirs(workdir)
        with self.assertLogs("absl", "INFO") as logs:
            data = prepare.prepare_data(config, workdir)
        self.assertEqual(data.vocab.words, [*SOURCE.words, "dog", "blue", "circle", "the"])
        self.assertIn(f"vocabulary: 9 words of {source} + 4 new (seen >= 2 times)", logs.output[-1])
        self.assertEqual(Vocab.load(os.path.join(workdir, "vocab.txt")).words, data.vocab.words)
        # A resumed run reads its own vocab.txt.
        os.remove(os.path.join(source, "vocab.txt"))
        self.assertEqual(prepare.prepare_data(config, workdir).vocab.words, data.vocab.words)

    def test_the_datasets_vocabulary_is_built_once_and_kept(self):
        # dog 4, blue 3, then a, circle and the 2 each (ties alphabetical): the first four.
        root = self.get_temp_dir()
        data_dir = os.path.join(root, "data")
        _write_flickr8k(data_dir, CAPTIONS)
        config = Config(
            dataset="flickr8k",
            data_dir=data_dir,
            cache_dir=os.path.join(root, "cache"),
            vocab_size=4,
        )
        workdir = os.path.join(root, "run")
        os.makedirs(workdir)
        data = prepare.prepare_data(config, workdir)
        self.assertEqual(data.vocab.words, [*SPECIALS, "dog", "blue", "a", "circle"])
        self.assertEqual(len(data.splits["train"]), 3)
        self.assertEqual((data.splits["val"], data.splits["test"], data.objects), ([], [], None))
        kept = os.path.join(derived_dir(config), "vocab_4.txt")
        self.assertEqual(Vocab.load(kept).words, data.vocab.words)
        # Another run on the same folder reads the kept file, whatever its records say.
        records = [dataclasses.replace(r, captions=("cat cat cat",)) for r in data.splits["train"]]
        self.assertEqual(prepare.dataset_vocab(config, records).words, data.vocab.words)
        fresh = dataclasses.replace(config, vocab_size=1)
        self.assertEqual(prepare.dataset_vocab(fresh, records).words, [*SPECIALS, "cat"])

    def test_a_given_vocabulary_is_neither_read_nor_written(self):
        root = self.get_temp_dir()
        data_dir = os.path.join(root, "data")
        _write_flickr8k(data_dir, CAPTIONS)
        config = Config(dataset="flickr8k", data_dir=data_dir, cache_dir=os.path.join(root, "c"))
        workdir = os.path.join(root, "run")
        os.makedirs(workdir)
        self.assertIs(prepare.prepare_data(config, workdir, vocab=SOURCE).vocab, SOURCE)
        self.assertEqual(os.listdir(workdir), [])
        self.assertFalse(os.path.exists(config.cache_dir))

    def test_images_are_needed_to_fine_tune_the_encoder(self):
        root = self.get_temp_dir()
        _write_flickr8k(os.path.join(root, "data"), CAPTIONS)
        config = Config(
            dataset="flickr8k",
            data_dir=os.path.join(root, "data"),
            use_feature_cache=True,
            fine_tune_encoder=True,
        )
        with self.assertRaisesRegex(ValueError, "--fine_tune_encoder trains the encoder"):
            prepare.prepare_data(config, root)
        self.assertEqual(prepare.cached_features(Config(), []), (None, None))


if __name__ == "__main__":
    tf.test.main()
