"""Tests for sat_tf.data.records: Karpathy's JSON read into records (read_karpathy), its
splits, captions, missing images, duplicates, undecodable text, schema errors and bad
options."""

import json
import os

import tensorflow as tf
from absl.testing import parameterized
from fixtures import karpathy_entry, write_file, write_jpegs, write_karpathy

from sat_tf.data import datasets
from sat_tf.data.datasets import DatasetError, Record


class KarpathyTest(tf.test.TestCase, parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()

    def test_flickr_style(self):
        write_jpegs(self.root, "a.jpg", "b.jpg", "c.jpg")
        path = write_karpathy(
            os.path.join(self.root, "dataset_flickr8k.json"),
            [
                karpathy_entry("a.jpg", 0, "train", [f"a dog {k} ." for k in range(6)]),
                karpathy_entry("b.jpg", 1, "val", ["  b one\n", "b two"]),
                karpathy_entry("c.jpg", 2, "test", ["c one"]),
            ],
        )
        records = datasets.read_karpathy(path, self.root)
        self.assertEqual(
            records,
            [
                Record(
                    "0",
                    os.path.join(self.root, "a.jpg"),
                    ("a dog 0 .", "a dog 1 .", "a dog 2 .", "a dog 3 .", "a dog 4 ."),
                    "train",
                ),
                Record("1", os.path.join(self.root, "b.jpg"), ("b one", "b two"), "val"),
                Record("2", os.path.join(self.root, "c.jpg"), ("c one",), "test"),
            ],
        )
        self.assertEqual(datasets.split_counts(records), {"train": 1, "val": 1, "test": 1})
        two = datasets.read_karpathy(path, self.root, max_captions=2)
        self.assertEqual(two[0].captions, ("a dog 0 .", "a dog 1 ."))

    def test_coco_style_filepath_cocoid_restval(self):
        write_jpegs(self.root, "train2014/t1.jpg", "val2014/v1.jpg", "val2014/v2.jpg")
        path = write_karpathy(
            os.path.join(self.root, "dataset_coco.json"),
            [
                karpathy_entry("v1.jpg", 0, "restval", ["r"], filepath="val2014", cocoid=391895),
                karpathy_entry("t1.jpg", 1, "train", ["t"], filepath="train2014", cocoid=9),
                karpathy_entry("v2.jpg", 2, "val", ["v"], filepath="val2014", cocoid=42),
            ],
            name="coco",
        )
        train = datasets.read_karpathy(path, self.root, splits=["train"])
        self.assertEqual(
            train,
            [
                Record("391895", os.path.join(self.root, "val2014", "v1.jpg"), ("r",), "train"),
                Record("9", os.path.join(self.root, "train2014", "t1.jpg"), ("t",), "train"),
            ],
        )
        val = datasets.read_karpathy(path, self.root, splits="val")
        self.assertEqual([r.image_id for r in val], ["42"])

    def _with_missing(self, num_missing):
        write_jpegs(self.root, "there.jpg")
        entries = [karpathy_entry("there.jpg", 0, "train", ["x"])] + [
            karpathy_entry(f"gone{i}.jpg", i + 1, "test", ["y"]) for i in range(num_missing)
        ]
        return write_karpathy(os.path.join(self.root, "d.json"), entries)

    def test_missing_images_error_names_file_count_and_paths(self):
        path = self._with_missing(2)
        with self.assertRaises(DatasetError) as cm:
            datasets.read_karpathy(path, self.root)
        message = str(cm.exception)
        self.assertIn(path, message)
        self.assertIn("2 of 3 images", message)
        self.assertIn(os.path.join(self.root, "gone0.jpg"), message)
        self.assertIn(os.path.join(self.root, "gone1.jpg"), message)
        self.assertNotIn("there.jpg", message)

    def test_missing_images_preview_is_capped(self):
        path = self._with_missing(7)
        with self.assertRaisesRegex(DatasetError, r"7 of 8 images .*gone4\.jpg, \.\.\. \(2 more\)"):
            datasets.read_karpathy(path, self.root)

    def test_missing_image_dir_is_named(self):
        path = self._with_missing(1)
        image_dir = os.path.join(self.root, "nowhere")
        with self.assertRaisesRegex(DatasetError, f"image directory {image_dir} does not exist"):
            datasets.read_karpathy(path, image_dir)

    def test_missing_images_skip(self):
        path = self._with_missing(2)
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = datasets.read_karpathy(path, self.root, on_missing="skip")
        self.assertEqual([r.image_id for r in records], ["0"])
        self.assertIn("2 of 3 images", logs.output[0])
        self.assertIn(path, logs.output[0])

    def test_missing_images_outside_requested_splits_are_ignored(self):
        path = self._with_missing(2)
        records = datasets.read_karpathy(path, self.root, splits=["train"])
        self.assertEqual([r.image_id for r in records], ["0"])

    def test_duplicate_id_same_file_merges_captions(self):
        write_jpegs(self.root, "a.jpg")
        path = write_karpathy(
            os.path.join(self.root, "d.json"),
            [
                karpathy_entry("a.jpg", 7, "train", ["a0", "a1", "a2"]),
                karpathy_entry("a.jpg", 7, "train", ["b0", "b1", "b2"]),
            ],
        )
        (record,) = datasets.read_karpathy(path, self.root)
        self.assertEqual(record.captions, ("a0", "a1", "a2", "b0", "b1"))

    @parameterized.named_parameters(
        ("other_file", "b.jpg", "train", "b.jpg"),
        ("other_split", "a.jpg", "test", "split test"),
    )
    def test_duplicate_id_conflict(self, filename, split, expected):
        write_jpegs(self.root, "a.jpg", "b.jpg")
        path = write_karpathy(
            os.path.join(self.root, "d.json"),
            [karpathy_entry("a.jpg", 7, "train", ["a"]), karpathy_entry(filename, 7, split, ["b"])],
        )
        with self.assertRaises(DatasetError) as cm:
            datasets.read_karpathy(path, self.root)
        message = str(cm.exception)
        for part in (path, "'7'", "images[0]", "images[1]", expected):
            self.assertIn(part, message)

    def test_non_utf8_names_file_and_line(self):
        text = json.dumps({"images": [karpathy_entry("a.jpg", 0, "train", ["MARK"])]}, indent=1)
        line = text.split("\n").index(next(x for x in text.split("\n") if "MARK" in x)) + 1
        self.assertGreater(line, 3)
        path = write_file(
            os.path.join(self.root, "d.json"), text.encode().replace(b"MARK", b"caf\xe9", 1)
        )
        with self.assertRaisesRegex(DatasetError, f"{path}, line {line}: .*not valid UTF-8"):
            datasets.read_karpathy(path, self.root)

    def test_empty_captions_skipped_and_uncaptioned_images_dropped(self):
        write_jpegs(self.root, "a.jpg", "b.jpg")
        path = write_karpathy(
            os.path.join(self.root, "d.json"),
            [
                karpathy_entry("a.jpg", 0, "train", ["", "  ", "ok", "\t\n"]),
                karpathy_entry("b.jpg", 1, "train", [" ", ""]),
            ],
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = datasets.read_karpathy(path, self.root)
        self.assertEqual(records, [Record("0", os.path.join(self.root, "a.jpg"), ("ok",), "train")])
        self.assertLen(logs.output, 2)
        self.assertIn("skipped 5 empty", logs.output[0])
        self.assertIn("dropped 1 image", logs.output[1])
        self.assertIn("1 (images[1])", logs.output[1])

    @parameterized.named_parameters(
        ("not_an_object", [1, 2], "the top-level object should be a JSON object"),
        ("no_images", {"dataset": "x"}, "the top-level object has no key 'images'"),
        ("no_filename", {"images": [{"x": 1}]}, "images[0] has no key 'filename'"),
        ("no_raw", {"images": [{"filename": "a", "split": "train", "imgid": 0,
                                "sentences": [{"raw": "ok"}, {"tokens": []}]}]},
         "images[0]['sentences'][1] has no key 'raw'"),
        ("no_imgid", {"images": [{"filename": "a", "split": "train", "sentences": []}]},
         "images[0] has no key 'imgid'"),
        ("raw_not_str", {"images": [{"filename": "a", "split": "train", "imgid": 0,
                                     "sentences": [{"raw": None}]}]},
         "images[0]['sentences'][0]['raw'] should be str, got NoneType"),
        ("bad_split", {"images": [{"filename": "a", "split": "training", "imgid": 0,
                                   "sentences": []}]},
         "images[0] has split 'training'"),
    )  # fmt: skip
    def test_schema_errors(self, data, expected):
        path = write_file(os.path.join(self.root, "d.json"), json.dumps(data))
        with self.assertRaises(DatasetError) as cm:
            datasets.read_karpathy(path, self.root)
        self.assertIn(path, str(cm.exception))
        self.assertIn(expected, str(cm.exception))

    def test_invalid_json_and_absent_file(self):
        path = write_file(os.path.join(self.root, "d.json"), '{"images": [\n{"filename": }]}')
        with self.assertRaisesRegex(DatasetError, f"{path}: not valid JSON .*line 2, column 14"):
            datasets.read_karpathy(path, self.root)
        absent = os.path.join(self.root, "absent.json")
        with self.assertRaisesRegex(DatasetError, f"{absent}: cannot read file"):
            datasets.read_karpathy(absent, self.root)

    @parameterized.named_parameters(
        ("on_missing", {"on_missing": "ignore"}, "on_missing"),
        ("split", {"splits": ["restval"]}, "unknown split"),
        ("max_captions", {"max_captions": 0}, "max_captions"),
    )
    def test_bad_options(self, kwargs, expected):
        path = write_karpathy(os.path.join(self.root, "d.json"), [])
        with self.assertRaisesRegex(ValueError, expected):
            datasets.read_karpathy(path, self.root, **kwargs)


if __name__ == "__main__":
    tf.test.main()
