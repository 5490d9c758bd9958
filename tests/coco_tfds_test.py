"""Tests for sat_tf.data.coco_tfds: TFDS coco_captions written to JPEGs and an index once,
read into records."""

import os

import fixtures
import tensorflow as tf
from fixtures import jpeg_bytes, write_file

from sat_tf.data import datasets
from sat_tf.data.datasets import DatasetError, Record

_TFDS_SPLITS = {"train": (1, 2), "restval": (3,), "val": (4,), "test": (5,)}


def _tfds_captions(image_id):
    if image_id == 1:
        return ["one 0", "  ", "one 1", "one 2", "one 3", "one 4", "one 5"]
    return [f"image {image_id}"]


class TfdsTest(tf.test.TestCase):
    """TFDS `coco_captions` through `tfds.testing.mock_data` (see `fixtures.mock_coco_captions`)."""

    def setUp(self):
        super().setUp()
        self.data_dir = self.get_temp_dir()
        self.jpegs = {i: jpeg_bytes((50 * i, 0, 0)) for i in range(1, 6)}
        self.calls = []

    def _mock(self):
        examples = {
            split: [(i, self.jpegs[i], _tfds_captions(i)) for i in ids]
            for split, ids in _TFDS_SPLITS.items()
        }
        return fixtures.mock_coco_captions(examples, calls=self.calls)

    def _path(self, image_id):
        return os.path.join(self.data_dir, "coco_captions_images", f"{image_id}.jpg")

    def test_writes_images_and_reads_captions(self):
        with self._mock():
            records = datasets.read_tfds("train", data_dir=self.data_dir)
        self.assertEqual(
            records,
            [
                Record("1", self._path(1), ("one 0", "one 1", "one 2", "one 3", "one 4"), "train"),
                Record("2", self._path(2), ("image 2",), "train"),
            ],
        )
        for image_id in (1, 2):
            with open(self._path(image_id), "rb") as f:
                self.assertEqual(f.read(), self.jpegs[image_id])

    def test_index_reused_and_resumes(self):
        write_file(self._path(4), b"kept")
        with self._mock():
            first = datasets.read_tfds("val", data_dir=self.data_dir)
            second = datasets.read_tfds("val", data_dir=self.data_dir)
            self.assertEqual(self.calls, ["val"])
            self.assertEqual(first, second)
            with open(self._path(4), "rb") as f:
                self.assertEqual(f.read(), b"kept")
            os.remove(self._path(4))
            datasets.read_tfds("val", data_dir=self.data_dir)
        self.assertEqual(self.calls, ["val", "val"])
        with open(self._path(4), "rb") as f:
            self.assertEqual(f.read(), self.jpegs[4])

    def test_restval_is_train(self):
        with self._mock():
            (record,) = datasets.read_tfds("restval", data_dir=self.data_dir)
        self.assertEqual(record, Record("3", self._path(3), ("image 3",), "train"))

    def test_load_records(self):
        with self._mock():
            train = datasets.load_records("coco_captions_tfds", self.data_dir, splits=["train"])
            everything = datasets.load_records("coco_captions_tfds", self.data_dir)
        self.assertEqual([r.image_id for r in train], ["1", "2", "3"])
        self.assertEqual([r.image_id for r in everything], ["1", "2", "3", "4", "5"])
        self.assertEqual(datasets.split_counts(everything), {"train": 3, "val": 1, "test": 1})

    def test_not_prepared(self):
        with self.assertRaises(DatasetError) as cm:
            datasets.read_tfds("val", data_dir=self.data_dir)
        message = str(cm.exception)
        prepared = os.path.join(self.data_dir, "coco_captions", "2014", "")
        self.assertStartsWith(message, f"TFDS coco_captions/val: no prepared data in {prepared}")
        self.assertEndsWith(
            message,
            f": run `tfds build coco_captions --data_dir={self.data_dir}` once (it downloads COCO "
            "2014, about 38 GB), or read COCO's own files with --dataset=coco",
        )

    def test_bad_split(self):
        with self.assertRaisesRegex(ValueError, "unknown TFDS coco_captions split 'validation'"):
            datasets.read_tfds("validation", data_dir=self.data_dir)


if __name__ == "__main__":
    tf.test.main()
