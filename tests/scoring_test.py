"""Tests for sat_tf.training.scoring: the references of a split, the names of its result
files, and the folders evaluation refuses to write into."""

import os

import tensorflow as tf

from sat_tf.config import Config
from sat_tf.data.records import Record
from sat_tf.training import scoring

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ScoringTest(tf.test.TestCase):
    def test_references_are_the_tokenized_captions_of_each_image(self):
        records = [
            Record("7", "a.jpg", ("A Dog, running!", "two  dogs"), "test"),
            Record("9", "b.jpg", ("The man's hat.",), "test"),
        ]
        self.assertEqual(
            scoring.references(records),
            {"7": ["a dog running", "two dogs"], "9": ["the man s hat"]},
        )

    def test_result_names(self):
        config = Config(beam_size=3)
        self.assertEqual(scoring.result_name("metrics", "test", config), "metrics_test.json")
        overrides = {"length_penalty": 1.0, "hard_decoding": "argmax"}
        self.assertEqual(
            scoring.result_name("table", "val", config, 5, ".md", overrides),
            "table_val_beam5_lp1_argmax.md",
        )
        blocking = {"block_repeats": False, "block_bad_endings": True}
        self.assertEqual(
            scoring.result_name("captions", "test", config, None, ".json", blocking),
            "captions_test_repeats_nobadendings.json",
        )
        tags = {"tags": False, "tag_threshold": 0.5}
        self.assertEqual(
            scoring.result_name("metrics", "test", config, None, ".json", tags),
            "metrics_test_notags_tag0.5.json",
        )

    def test_results_are_never_written_into_the_data_or_the_package(self):
        data = self.get_temp_dir()
        config = Config(data_dir=data)
        for inside in (data, os.path.join(data, "runs"), os.path.join(ROOT, "sat_tf", "x")):
            with self.assertRaisesRegex(ValueError, f"output folder {inside} lies in the"):
                scoring.check_output_dir(inside, config)
        scoring.check_output_dir(os.path.join(os.path.dirname(data), "elsewhere"), config)


if __name__ == "__main__":
    tf.test.main()
