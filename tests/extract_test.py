"""Tests for sat_tf.training.extract: the features of a tiny Flickr8k folder written to
float16 shards equal to the encoder's output, an extraction resumed from a killed shard,
other settings refused, an undecodable image named or skipped."""

import json
import os
import shutil

import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from feature_cache_test import DEPTH, GRID, IMAGE_SIZE, _Extracted, read_shard

from sat_tf.data import datasets, feature_cache, image_io
from sat_tf.model.encoder import ImageEncoder


class ExtractTest(_Extracted, tf.test.TestCase, parameterized.TestCase):
    def test_shards_hold_the_encoder_output_in_float16(self):
        index = self.index
        self.assertEqual(self._extract(), index)  # complete: nothing more to extract
        names = [f"shard-0000{i}-of-00003.tfrecord" for i in range(3)]
        self.assertEqual(self._shards(), names)
        self.assertEqual(index["feature_shape"], [16, DEPTH])
        self.assertEqual(index["grid"], list(GRID))
        self.assertEqual(
            [s["image_ids"] for s in index["shards"]],
            [["1", "4"], ["3", "0"], ["2", "5"]],
        )
        stored = {}
        for name in names:
            stored.update(read_shard(os.path.join(self.out, name)))
        encoder = ImageEncoder("shapes_cnn", IMAGE_SIZE, self.weights)
        pixels = [image_io.load_image_file(r.image_path, IMAGE_SIZE, 1.0) for r in self.records]
        expected = encoder(tf.stack(pixels)).numpy()
        self.assertEqual(expected.shape, (6, 16, DEPTH))
        got = np.stack([stored[r.image_id] for r in self.records]).astype(np.float32)
        self.assertAllClose(got, expected, rtol=2e-3, atol=1e-4)
        self.assertGreater(np.abs(expected).max(), 0.1)
        streamed, shape = self._features(self.records)
        self.assertEqual(shape, (16, DEPTH))
        self.assertEqual(streamed.dtype, np.float32)
        self.assertAllEqual(streamed, got)

    def test_resume_rewrites_only_the_unfinished_shard(self):
        paths = [os.path.join(self.out, n) for n in self._shards()]
        complete = [read_shard(p) for p in paths]
        mtimes = [os.stat(p).st_mtime_ns for p in paths]
        # A kill while writing shard 2: its temp file is left, the index never listed it.
        os.rename(paths[2], paths[2] + ".tmp4242")
        index_path = os.path.join(self.out, feature_cache.INDEX_FILE)
        with open(index_path) as f:
            index = json.load(f)
        index["shards"][2] = None
        with open(index_path, "w") as f:
            json.dump(index, f)
        with self.assertRaisesRegex(ValueError, "unfinished \\(2 of 3 shards\\)"):
            feature_cache.feature_dataset(self.out, self.records)
        self._extract()
        self.assertEqual(self._shards(), [os.path.basename(p) for p in paths])
        self.assertEqual([os.stat(p).st_mtime_ns for p in paths[:2]], mtimes[:2])
        for path, before in zip(paths, complete, strict=True):
            after = read_shard(path)
            self.assertEqual(list(after), list(before))
            for key in before:
                self.assertAllEqual(after[key], before[key])
        again = [os.stat(p).st_mtime_ns for p in paths]
        self._extract()
        self.assertEqual([os.stat(p).st_mtime_ns for p in paths], again)

    @parameterized.parameters(
        ({"encoder": "vgg19"}, "encoder: the cache has 'shapes_cnn', this run 'vgg19'"),
        ({"image_size": 64}, "image_size: the cache has 32, this run 64"),
        ({"weights": ""}, "encoder_weights: the cache has '.*encoder.weights.h5', this run ''"),
        ({"shard_size": 3}, "shard_size: the cache has 2, this run 3"),
        ({"records": slice(1, None)}, "from 6 images \\(fingerprint \\w+\\), this run has 5"),
    )
    def test_other_settings_refuse(self, change, message):
        if "records" in change:
            change = {"records": self.records[change["records"]]}
        with self.assertRaisesRegex(ValueError, message):
            self._extract(**change)

    def test_undecodable_image_is_named_and_finished_shards_stay(self):
        # A folder of its own, whose last image is cut, extracted from the start.
        root = self.get_temp_dir()
        shutil.rmtree(self.out)
        shutil.copytree(os.path.join(self.root, "Flicker8k_Dataset"), f"{root}/Flicker8k_Dataset")
        shutil.copy(os.path.join(self.root, "dataset_flickr8k.json"), root)
        records = datasets.load_records("flickr8k", root)
        self.records = sorted(records, key=lambda r: feature_cache.SPLIT_ORDER[r.split])
        bad = self.records[5]
        with open(bad.image_path, "rb") as f:
            data = f.read()
        with open(bad.image_path, "wb") as f:
            f.write(data[: len(data) // 2])
        reason = rf"{bad.image_path} \(\d+ bytes\) is a truncated or corrupt \w+ file"
        with self.assertRaisesRegex(ValueError, f"cannot be decoded:\n  {reason}"):
            self._extract()
        self.assertEqual(
            self._shards(), ["shard-00000-of-00003.tfrecord", "shard-00001-of-00003.tfrecord"]
        )
        self.assertEqual(feature_cache.read_index(self.out)["shards"][2], None)
        index = self._extract(skip_bad_images=True)
        self.assertEqual(index["shards"][2]["image_ids"], [self.records[4].image_id])
        self.assertEqual([s["image_id"] for s in index["shards"][2]["skipped"]], [bad.image_id])
        with self.assertRaisesRegex(ValueError, "skipped at extraction as undecodable"):
            feature_cache.feature_dataset(self.out, self.records)
        kept = feature_cache.drop_skipped(self.records, self.out)
        self.assertEqual(kept, self.records[:5])
        self.assertLen(self._features(kept)[0], 5)


if __name__ == "__main__":
    tf.test.main()
