"""Tests for sat-extract-features-beam (sat_tf.cli.extract_features_beam; its pipeline:
extract_pipeline_test.py; its options: launch_test.py): the refusals before anything
runs (local paths for a remote runner among them), and on the DirectRunner's batch
engine in the command's default setting a cache equal to sat-extract-features'
(`extract.extract_features`, which it runs), which a rerun leaves as it is, sat-train's
reader reads and an epoch of training on it does not rewrite."""

import os
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from extract_pipeline_test import SHARDS, CocoCache
from feature_cache_test import DEPTH, IMAGE_SIZE, _bleu4_only
from fixtures import run_main

from sat_tf.cli import extract_features_beam
from sat_tf.config import Config
from sat_tf.data import feature_cache
from sat_tf.evaluation import metrics
from sat_tf.training import extract, train_lib


class FlagsTest(tf.test.TestCase):
    def test_refusals_before_anything_runs(self):
        out = os.path.join(self.get_temp_dir(), "refused")
        data = self.get_temp_dir()
        cases = {
            ("--direct_num_worker=2",): "unknown flag --direct_num_worker=2: not a flag of "
            "sat-extract-features-beam nor a Beam pipeline option; did you mean "
            "--direct_num_workers?",
            ("--shard_size=0",): "--shard_size=0 must be at least 1",
            ("--max_image_bytes=0",): "--max_image_bytes=0 must be at least 1",
            ("photos/",): "unexpected arguments: photos/",
            ("--dataset=coco", f"--data_dir={out}"): f"--dataset=coco: --data_dir={out} is not",
            ("--runner=FlinkRunner", "--dataset=coco", "--data_dir=s3://b/coco"): (
                f"--feature_dir={out} is a path on this machine, which the workers of "
                "FlinkRunner cannot read: give one on a filesystem they share"
            ),
            ("--runner=DataflowRunner", "--dataset=coco", f"--data_dir={data}"): (
                f"--data_dir={data} is a path on this machine, which the workers of "
                "DataflowRunner cannot read"
            ),
        }
        for flags, message in cases.items():
            code, stdout, stderr = run_main(
                extract_features_beam.main,
                "sat-extract-features-beam",
                f"--feature_dir={out}",
                *flags,
            )
            self.assertEqual((code, stdout), (1, ""), flags)
            self.assertStartsWith(stderr, f"error: {message}")
            self.assertEqual(stderr.count("\n"), 1, stderr)
        self.assertFalse(os.path.exists(out))

    def test_a_data_folder_elsewhere_needs_a_feature_folder(self):
        remote = ("--dataset=coco", "--data_dir=gs://b/coco")
        code, _, stderr = run_main(extract_features_beam.main, "sat-extract-features-beam", *remote)
        self.assertEqual(code, 1)
        self.assertStartsWith(
            stderr, "error: --data_dir=gs://b/coco is elsewhere: give --feature_dir too"
        )
        with mock.patch.object(extract_features_beam, "_main", return_value=0) as started:
            code, _, stderr = run_main(
                extract_features_beam.main,
                "sat-extract-features-beam",
                "--runner=DataflowRunner",
                *remote,
                "--feature_dir=gs://b/features",
            )
        self.assertEqual(code, 0, stderr)
        started.assert_called_once()


@pytest.mark.long(12)
class CommandTest(CocoCache, tf.test.TestCase):
    @classmethod
    def _flags(cls, feature_dir):
        return [
            "--dataset=coco",
            f"--data_dir={cls.data_dir}",
            f"--cache_dir={os.path.join(cls.root, 'cache')}",
            "--encoder=shapes_cnn",
            f"--encoder_weights={cls.weights}",
            f"--image_size={IMAGE_SIZE}",
            f"--feature_dir={feature_dir}",
            "--shard_size=2",
            "--extract_batch_size=2",
        ]

    def test_the_cache_is_sat_extract_features_cache_and_sat_train_reads_it(self):
        out = os.path.join(self.get_temp_dir(), "beam")
        code, stdout, err = run_main(
            extract_features_beam.main, "sat-extract-features-beam", *self._flags(out)
        )
        self.assertEqual(code, 0, err)
        summary = f"6 images, 16 x {DEPTH} float16 features in 3 shards: {out}\n"
        self.assertEqual(stdout, summary + "shards: 3 encoded, 0 complete from an earlier run\n")
        self.assertSameCache(out, self.serial)  # sat-extract-features' (extract_features)
        code, stdout, err = run_main(
            extract_features_beam.main, "sat-extract-features-beam", *self._flags(out)
        )
        self.assertEqual((code, stdout), (0, summary + "shards: all were complete already\n"))

        config = Config(
            dataset="coco",
            data_dir=self.data_dir,
            cache_dir=os.path.join(self.get_temp_dir(), "cache"),
            feature_dir=out,
            encoder="shapes_cnn",
            encoder_weights=self.weights,
            image_size=IMAGE_SIZE,
            use_feature_cache=True,
            vocab_size=12,
            max_caption_length=8,
            embed_dim=8,
            hidden_dim=16,
            attention_dim=8,
            batch_size=2,
            epochs=1,
            steps_per_epoch=2,
            eval_images=0,
            max_decode_length=5,
        )
        ds, shape = feature_cache.feature_dataset_for(config, self.records)
        self.assertEqual(shape, (16, DEPTH))
        expected, _ = feature_cache.feature_dataset(self.serial, self.records)
        self.assertAllEqual(
            np.stack(list(ds.as_numpy_iterator())), np.stack(list(expected.as_numpy_iterator()))
        )
        mtimes = self._mtimes(out)
        with mock.patch.object(extract, "_write_shard") as write:
            with mock.patch.object(metrics, "coco_scores", _bleu4_only):
                scores = train_lib.train_and_evaluate(
                    config, os.path.join(self.get_temp_dir(), "run")
                )
        write.assert_not_called()
        self.assertBetween(scores["BLEU-4"], 0.0, 1.0)
        self.assertEqual(self._mtimes(out), mtimes)
        self.assertEqual(sorted(n for n in os.listdir(out) if n.startswith("shard-")), SHARDS)


if __name__ == "__main__":
    tf.test.main()
