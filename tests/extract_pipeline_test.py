"""Tests for sat_tf.pipelines.extract_pipeline on the DirectRunner's batch engine, on a tiny
COCO folder in the official format (`CocoCache`): the cache equal to
`extract.extract_features`' (index, shard files, every record's features), a rerun that
encodes no finished shard (also after a run that did not write its index, but not from a
folder without one), and an undecodable photo stopping its shard only, or skipped as
`extract_features` skips it (the command: extract_features_beam_test.py)."""

import json
import os
import shutil
import tempfile
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from apache_beam.options.pipeline_options import PipelineOptions
from feature_cache_test import IMAGE_SIZE, encoder_weights, read_shard, write_coco

from sat_tf.config import Config
from sat_tf.data import feature_cache
from sat_tf.pipelines import extract_pipeline
from sat_tf.training import extract

OPTIONS = ["--runner=FnApiRunner", "--direct_running_mode=in_memory"]
# The six images of `write_coco` in shards of two: three shards, val and test first.
SHARDS = [f"shard-0000{i}-of-00003.tfrecord" for i in range(3)]


class CocoCache:
    """On one tiny COCO folder (`data_dir`, its `records`) whose features
    `extract.extract_features` writes once a class into `serial`. A mixin of the tests
    here and of extract_features_beam_test.py's."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.data_dir = os.path.join(cls.root, "coco")
        write_coco(cls.data_dir, official=True)
        cls.weights = encoder_weights(os.path.join(cls.root, "encoder.weights.h5"))
        cls.records = extract.records_of(Config(dataset="coco", data_dir=cls.data_dir))
        cls.serial = os.path.join(cls.root, "serial")
        cls._serial(cls.records, cls.serial)

    @classmethod
    def _serial(cls, records, out, **kwargs):
        return extract.extract_features(
            records,
            "shapes_cnn",
            cls.weights,
            IMAGE_SIZE,
            out,
            **cls._sizes(),
            **kwargs,
            progress=False,
        )

    @staticmethod
    def _sizes():
        return {"shard_size": 2, "batch_size": 2}

    def _mtimes(self, feature_dir):
        return {n: os.stat(os.path.join(feature_dir, n)).st_mtime_ns for n in SHARDS}

    def assertSameCache(self, got, expected):
        """The two folders hold the same index and shards, record for record."""
        self.assertEqual(sorted(os.listdir(got)), sorted(os.listdir(expected)))
        self.assertEqual(feature_cache.read_index(got), feature_cache.read_index(expected))
        for name in os.listdir(expected):
            if name.startswith("shard-"):
                have, want = (
                    read_shard(os.path.join(got, name)),
                    read_shard(os.path.join(expected, name)),
                )
                self.assertEqual(list(have), list(want))
                for image_id in want:
                    self.assertAllEqual(have[image_id], want[image_id])


@pytest.mark.long(11)
class ExtractPipelineTest(CocoCache, tf.test.TestCase):
    def _run(self, out, records=None, **kwargs):
        return extract_pipeline.run(
            self.records if records is None else records,
            "shapes_cnn",
            self.weights,
            IMAGE_SIZE,
            out,
            PipelineOptions(OPTIONS),
            **self._sizes(),
            **kwargs,
        )

    def test_the_cache_is_extract_features_cache(self):
        out = os.path.join(self.get_temp_dir(), "beam")
        index, found = self._run(out)
        self.assertEqual(found, {"encoded": 3, "found": 0, "refused": 0})
        self.assertSameCache(out, self.serial)
        self.assertEqual(index, feature_cache.read_index(out))
        self.assertEqual(sorted(os.listdir(out)), sorted([*SHARDS, feature_cache.INDEX_FILE]))
        features = [f for name in SHARDS for f in read_shard(os.path.join(out, name)).values()]
        self.assertLen(features, 6)
        self.assertGreater(np.abs(np.stack(features).astype(np.float32)).max(), 0.1)

    def test_a_rerun_encodes_no_finished_shard(self):
        out = os.path.join(self.get_temp_dir(), "rerun")
        shutil.copytree(self.serial, out)  # extract_features' cache is this one's
        index = feature_cache.read_index(out)
        mtimes = self._mtimes(out)
        with mock.patch.object(extract, "_write_shard") as write:
            self.assertEqual(self._run(out), (index, None))
        write.assert_not_called()
        # A run that did not finish: shard 1 written but not in the index, shard 2 neither.
        unfinished = json.loads(json.dumps(index))
        unfinished["shards"][1] = unfinished["shards"][2] = None
        feature_cache.write_index(out, unfinished)
        os.remove(os.path.join(out, SHARDS[2]))
        _, found = self._run(out)
        self.assertEqual(found, {"encoded": 1, "found": 1, "refused": 0})
        self.assertSameCache(out, self.serial)
        after = self._mtimes(out)
        self.assertEqual([after[n] == mtimes[n] for n in SHARDS], [True, True, False])

    def test_shards_in_a_folder_without_an_index_are_written_again(self):
        out = os.path.join(self.get_temp_dir(), "no_index")
        shutil.copytree(self.serial, out)
        os.remove(os.path.join(out, feature_cache.INDEX_FILE))
        _, found = self._run(out)
        self.assertEqual(found, {"encoded": 3, "found": 0, "refused": 0})
        self.assertSameCache(out, self.serial)

    def test_an_undecodable_photo_stops_its_shard_only(self):
        data_dir = os.path.join(self.get_temp_dir(), "coco")
        shutil.copytree(self.data_dir, data_dir)
        records = extract.records_of(Config(dataset="coco", data_dir=data_dir))
        bad = records[5]  # the last shard's second image
        with open(bad.image_path, "rb") as f:
            data = f.read()
        with open(bad.image_path, "wb") as f:
            f.write(data[: len(data) // 2])
        out = os.path.join(self.get_temp_dir(), "bad")
        reason = rf"{bad.image_path} \(\d+ bytes\) is a truncated or corrupt \w+ file"
        with self.assertRaisesRegex(
            ValueError,
            f"^1 image\\(s\\) of shard {SHARDS[2]} cannot be decoded:\n  {reason}\nthe 2 "
            f"finished shard\\(s\\) in {out} are kept; .*--skip_bad_images",
        ):
            self._run(out, records)
        self.assertEqual(sorted(n for n in os.listdir(out) if n.startswith("shard-")), SHARDS[:2])
        self.assertIsNone(feature_cache.read_index(out)["shards"][2])
        _, found = self._run(out, records, skip_bad_images=True)
        self.assertEqual(found, {"encoded": 1, "found": 0, "refused": 0})
        serial = os.path.join(self.get_temp_dir(), "serial")
        index = self._serial(records, serial, skip_bad_images=True)
        self.assertEqual([s["image_id"] for s in index["shards"][2]["skipped"]], [bad.image_id])
        self.assertSameCache(out, serial)


if __name__ == "__main__":
    tf.test.main()
