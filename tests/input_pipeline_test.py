"""Tests for sat_tf.data.input_pipeline: caption ids and batches of one caption length."""

import collections
import os

import fixtures
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from PIL import Image

from sat_tf.data import input_pipeline
from sat_tf.data.datasets import Record
from sat_tf.data.vocab import Vocab

FILLER = ("thing", "here", "on", "the", "floor")


def _captions(i, colour):
    """Three captions of image i with 1..6 words, each naming the colour first."""
    lengths = (i % 6 + 1, (i + 2) % 6 + 1, (i + 4) % 6 + 1)
    return tuple(" ".join((colour.capitalize(),) + FILLER[: n - 1]) + "." for n in lengths)


class DatasetTest(tf.test.TestCase, parameterized.TestCase):
    def setUp(self):
        super().setUp()
        folder = self.get_temp_dir()
        self.records = []
        for i, (colour, rgb) in enumerate(fixtures.COLOURS.items()):
            path = os.path.join(folder, f"{colour}.png")
            Image.new("RGB", (8, 8), rgb).save(path, "PNG")
            self.records.append(Record(str(i), path, _captions(i, colour), "train"))
        texts = [c for r in self.records for c in r.captions]
        self.vocab = Vocab.build(texts)

    def _expected_ids(self, caption, max_words=None):
        words = caption.lower().rstrip(".").split()[:max_words]
        return [1] + self.vocab.ids(words) + [2]

    def _image_index(self, image):
        """Index of the record whose solid colour fills `image` exactly."""
        matches = [
            i
            for i, rgb in enumerate(fixtures.COLOURS.values())
            if np.all(image == np.array(rgb, np.float32))
        ]
        self.assertLen(matches, 1)
        return matches[0]

    def _train(self, **kwargs):
        args = dict(image_size=8, crop_fraction=1.0, batch_size=3, max_words=10, seed=0)
        args.update(kwargs)
        return input_pipeline.train_dataset(self.records, self.vocab, **args)

    def _pairs(self, batches, key="image"):
        """(record index, caption tuple) for every row of every batch."""
        pairs = []
        for batch in batches:
            for x, caption in zip(batch[key], batch["caption"], strict=True):
                if key == "image":
                    index = self._image_index(x)
                else:
                    self.assertAllEqual(x, np.full_like(x, x[0, 0]))
                    index = int(x[0, 0])
                pairs.append((index, tuple(caption.tolist())))
        return pairs

    def test_epochs_depend_only_on_seed_and_epoch(self):
        # What a resumed run relies on: epoch e's batches are the same whether the
        # dataset starts at epoch 0 or at e, each epoch has its own order, and the pairs
        # of image and caption stay right.
        steps = 7

        def epochs(first, seed=0):
            ds = self._train(steps_per_epoch=steps, first_epoch=first, epochs=3, seed=seed)
            batches = list(ds.as_numpy_iterator())
            self.assertLen(batches, steps * (3 - first))
            return [self._pairs(batches[i : i + steps]) for i in range(0, len(batches), steps)]

        whole = epochs(0)
        self.assertEqual(epochs(1), whole[1:])
        self.assertEqual(epochs(2), whole[2:])
        self.assertNotEqual(whole[0], whole[1])
        self.assertNotEqual(epochs(0, seed=1), whole)
        with self.assertRaisesRegex(ValueError, "finished 3 of 3"):
            self._train(steps_per_epoch=steps, first_epoch=3, epochs=3)
        with self.assertRaisesRegex(ValueError, "steps_per_epoch needs epochs"):
            self._train(steps_per_epoch=steps)

    @parameterized.parameters(True, False)
    def test_batches_hold_one_caption_length_and_pair_captions_with_images(self, cache_images):
        batches = list(self._train(cache_images=cache_images).take(60).as_numpy_iterator())
        lengths = collections.Counter()
        for batch in batches:
            self.assertEqual(set(batch), {"image", "caption"})
            self.assertEqual(batch["image"].shape, (3, 8, 8, 3))
            self.assertEqual(batch["image"].dtype, np.float32)
            caption = batch["caption"]
            self.assertEqual(caption.dtype, np.int32)
            self.assertEqual(caption.shape[0], 3)
            self.assertAllEqual(caption[:, 0], [1, 1, 1])
            self.assertAllEqual(caption[:, -1], [2, 2, 2])
            self.assertTrue(np.all(caption[:, 1:-1] > 3), caption)
            lengths[caption.shape[1]] += 1
        self.assertEqual(set(lengths), {3, 4, 5, 6, 7, 8})

        expected = {
            (i, tuple(self._expected_ids(c)))
            for i, r in enumerate(self.records)
            for c in r.captions
        }
        pairs = self._pairs(batches)
        self.assertLen(expected, 24)
        self.assertEqual(set(pairs), expected)
        counts = collections.Counter(pairs)
        self.assertBetween(min(counts.values()), 3, 8)
        self.assertBetween(max(counts.values()), 7, 12)

    def test_lengths_are_interleaved(self):
        lengths = [b["caption"].shape[1] for b in self._train().take(12).as_numpy_iterator()]
        self.assertGreater(len(set(lengths)), 2, lengths)
        self.assertNotEqual(lengths, sorted(lengths))

    @parameterized.parameters(1, 4)
    def test_batch_size(self, batch_size):
        for batch in self._train(batch_size=batch_size).take(10).as_numpy_iterator():
            self.assertEqual(batch["caption"].shape[0], batch_size)
            self.assertEqual(batch["image"].shape[0], batch_size)

    def test_captions_are_cut_to_max_length_words(self):
        expected = {
            (i, tuple(self._expected_ids(c, max_words=2)))
            for i, r in enumerate(self.records)
            for c in r.captions
        }
        batches = list(self._train(max_words=2).take(30).as_numpy_iterator())
        self.assertEqual({b["caption"].shape[1] for b in batches}, {3, 4})
        self.assertEqual(set(self._pairs(batches)), expected)

    def test_shuffle_is_deterministic_given_the_seed(self):
        def first(seed, n=30):
            return self._pairs(self._train(seed=seed).take(n).as_numpy_iterator())

        run = first(0)
        self.assertEqual(run, first(0))
        self.assertNotEqual(run, first(1))
        self.assertNotEqual(run[:45], run[45:])

    def test_features_replace_images(self):
        features = np.arange(8, dtype=np.float32)[:, None, None] * np.ones((8, 2, 5), np.float32)
        records = [
            Record(r.image_id, "/no/such/file.png", r.captions, r.split) for r in self.records
        ]
        ds = input_pipeline.train_dataset(
            records,
            self.vocab,
            image_size=8,
            crop_fraction=1.0,
            batch_size=2,
            max_words=10,
            features=tf.data.Dataset.from_tensor_slices(features),
        )
        batches = list(ds.take(40).as_numpy_iterator())
        for batch in batches:
            self.assertEqual(set(batch), {"features", "caption"})
            self.assertEqual(batch["features"].shape, (2, 2, 5))
        expected = {
            (i, tuple(self._expected_ids(c)))
            for i, r in enumerate(self.records)
            for c in r.captions
        }
        self.assertContainsSubset(set(self._pairs(batches, key="features")), expected)

    def test_eval_dataset_keeps_record_order(self):
        ds = input_pipeline.eval_dataset(
            self.records, image_size=8, crop_fraction=1.0, batch_size=3
        )
        batches = list(ds.as_numpy_iterator())
        self.assertEqual([len(b["index"]) for b in batches], [3, 3, 2])
        index = np.concatenate([b["index"] for b in batches])
        self.assertAllEqual(index, np.arange(8))
        images = np.concatenate([b["image"] for b in batches])
        self.assertEqual([self._image_index(x) for x in images], list(range(8)))

    def test_eval_dataset_with_features(self):
        features = tf.data.Dataset.from_tensor_slices(np.arange(8, dtype=np.float32)[:, None] * 10)
        ds = input_pipeline.eval_dataset(
            self.records, image_size=8, crop_fraction=1.0, batch_size=5, features=features
        )
        batches = list(ds.as_numpy_iterator())
        self.assertEqual(set(batches[0]), {"features", "index"})
        self.assertAllEqual(np.concatenate([b["index"] for b in batches]), np.arange(8))
        self.assertAllEqual(
            np.concatenate([b["features"] for b in batches])[:, 0], np.arange(8) * 10.0
        )

    def test_teacher_forced_dataset_pads_every_caption_in_order(self):
        ds = input_pipeline.teacher_forced_dataset(
            self.records, self.vocab, image_size=8, crop_fraction=1.0, batch_size=5, max_words=4
        )
        batches = list(ds.as_numpy_iterator())
        self.assertEqual([len(b["caption"]) for b in batches], [5, 5, 5, 5, 4])

        expected = [
            (i, self._expected_ids(c, 4)) for i, r in enumerate(self.records) for c in r.captions
        ]
        for k, batch in enumerate(batches):
            rows = expected[5 * k : 5 * k + 5]
            width = max(len(ids) for _, ids in rows)
            padded = np.array([ids + [0] * (width - len(ids)) for _, ids in rows], np.int32)
            self.assertAllEqual(batch["caption"], padded)
            self.assertEqual([self._image_index(x) for x in batch["image"]], [i for i, _ in rows])
