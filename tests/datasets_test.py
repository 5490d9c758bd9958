"""Tests for sat_tf.data.datasets (load_records choosing each dataset's reader) and the COCO
readers of sat_tf.data.coco, on tiny fixtures written in their on-disk formats; the other
readers are records_test.py's, flickr_test.py's and coco_tfds_test.py's."""

import collections
import json
import os
import shutil
from unittest import mock

import fixtures
import tensorflow as tf
from absl.testing import parameterized
from fixtures import jpeg_bytes, karpathy_entry, write_file, write_jpegs, write_karpathy

from sat_tf.data import coco, datasets
from sat_tf.data.datasets import DatasetError, Record


class CocoOfficialTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()
        self.image_dir = os.path.join(self.root, "val2014")
        write_jpegs(
            self.image_dir, "COCO_val2014_5.jpg", "COCO_val2014_7.jpg", "COCO_val2014_9.jpg"
        )

    def _write(self, annotations, images=None):
        images = images or [
            {"id": 7, "file_name": "COCO_val2014_7.jpg", "height": 8},
            {"id": 5, "file_name": "COCO_val2014_5.jpg"},
            {"id": 9, "file_name": "COCO_val2014_9.jpg"},
        ]
        data = {"info": {}, "images": images, "annotations": annotations}
        return write_file(os.path.join(self.root, "captions_val2014.json"), json.dumps(data))

    def test_reads_images_and_annotations(self):
        path = self._write(
            [
                {"image_id": 5, "id": 1, "caption": "five a\n"},
                {"image_id": 7, "id": 2, "caption": "seven a"},
                {"image_id": 5, "id": 3, "caption": "five b"},
            ]
            + [{"image_id": 7, "id": 10 + k, "caption": f"seven {k}"} for k in range(5)]
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = datasets.read_coco(path, self.image_dir, split="val")
        self.assertEqual(
            records,
            [
                Record(
                    "7",
                    os.path.join(self.image_dir, "COCO_val2014_7.jpg"),
                    ("seven a", "seven 0", "seven 1", "seven 2", "seven 3"),
                    "val",
                ),
                Record(
                    "5",
                    os.path.join(self.image_dir, "COCO_val2014_5.jpg"),
                    ("five a", "five b"),
                    "val",
                ),
            ],
        )
        self.assertIn("dropped 1 image(s) with no non-empty caption: 9 (images[2])", logs.output[0])

    def test_unknown_image_id(self):
        path = self._write([{"image_id": 5, "caption": "ok"}, {"image_id": 6, "caption": "?"}])
        with self.assertRaisesRegex(DatasetError, r"annotations\[1\] refers to image_id 6"):
            datasets.read_coco(path, self.image_dir, split="train")

    def test_missing_key(self):
        path = self._write([{"image_id": 5, "caption": "ok"}, {"image_id": 5}])
        with self.assertRaisesRegex(DatasetError, r"annotations\[1\] has no key 'caption'"):
            datasets.read_coco(path, self.image_dir, split="train")
        path = self._write([], images=[{"file_name": "x.jpg"}])
        with self.assertRaisesRegex(DatasetError, r"images\[0\] has no key 'id'"):
            datasets.read_coco(path, self.image_dir, split="train")

    def test_duplicate_image_with_other_file(self):
        images = [{"id": 5, "file_name": "a.jpg"}, {"id": 5, "file_name": "b.jpg"}]
        path = self._write([], images=images)
        with self.assertRaisesRegex(DatasetError, r"image id '5' appears at images\[0\]"):
            datasets.read_coco(path, self.image_dir, split="train")


class LoadRecordsTest(tf.test.TestCase, parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()

    @parameterized.named_parameters(
        ("shapes", "shapes", "", "images"),
        ("flickr8k", "flickr8k", "Flicker8k_Dataset", ""),
        ("flickr8k_images", "flickr8k", "Images", ""),
        ("flickr30k", "flickr30k", "flickr30k-images", ""),
        ("flickr30k_underscore", "flickr30k", "flickr30k_images", ""),
        ("coco", "coco", "", "val2014"),
    )
    def test_karpathy_layouts(self, dataset, folder, filepath):
        write_jpegs(os.path.join(self.root, folder, filepath), "x.jpg", "y.jpg")
        if dataset == "coco":
            os.makedirs(os.path.join(self.root, "train2014"))
        extra = {"filepath": filepath} if filepath else {}
        entries = [
            karpathy_entry("x.jpg", 0, "train", ["x"], **extra),
            karpathy_entry("y.jpg", 1, "test", ["y"], **extra),
        ]
        write_karpathy(os.path.join(self.root, f"dataset_{dataset}.json"), entries, name=dataset)
        records = datasets.load_records(dataset, self.root, splits=["test"])
        expected = os.path.join(self.root, folder, filepath, "y.jpg")
        self.assertEqual(records, [Record("1", expected, ("y",), "test")])

    def test_flickr8k_prefers_karpathy_json_then_raw_files(self):
        image_dir = os.path.join(self.root, "Flicker8k_Dataset")
        write_jpegs(image_dir, "a_1.jpg")
        write_file(os.path.join(self.root, "Flickr8k.token.txt"), "a_1.jpg#0\traw caption\n")
        for name, files in (("train", "a_1.jpg\n"), ("dev", ""), ("test", "")):
            write_file(os.path.join(self.root, f"Flickr_8k.{name}Images.txt"), files)
        raw = datasets.load_records("flickr8k", self.root)
        self.assertEqual(
            raw, [Record("a_1", os.path.join(image_dir, "a_1.jpg"), ("raw caption",), "train")]
        )
        write_karpathy(
            os.path.join(self.root, "dataset_flickr8k.json"),
            [karpathy_entry("a_1.jpg", 0, "val", ["karpathy caption"])],
        )
        (record,) = datasets.load_records("flickr8k", self.root)
        self.assertEqual((record.captions, record.split), (("karpathy caption",), "val"))

    def test_missing_files(self):
        with self.assertRaisesRegex(DatasetError, "found neither .*dataset_flickr8k.json nor"):
            datasets.load_records("flickr8k", self.root)
        with self.assertRaisesRegex(DatasetError, "dataset_shapes.json not found"):
            datasets.load_records("shapes", self.root)

    def test_on_missing_is_passed(self):
        for folder in ("train2014", "val2014"):
            os.makedirs(os.path.join(self.root, folder))
        write_karpathy(
            os.path.join(self.root, "dataset_coco.json"),
            [karpathy_entry("z.jpg", 0, "train", ["z"], filepath="train2014", cocoid=3)],
        )
        with self.assertRaisesRegex(DatasetError, "1 of 1 images"):
            datasets.load_records("coco", self.root)
        with self.assertLogs(logger="absl", level="WARNING"):
            self.assertEqual(datasets.load_records("coco", self.root, on_missing="skip"), [])

    def test_unknown_dataset(self):
        with self.assertRaisesRegex(ValueError, "unknown dataset 'mnist'"):
            datasets.load_records("mnist", self.root)


# val2014 of the official-layout fixture in file order; by id: val 5, 42; test 73, 74; the
# rest train. In string order "1000" and "133" would come first.
_VAL2014_IDS = (391895, 42, 73, 5, 1000, 74, 133)
_VAL2014_SPLITS = {
    5: "val",
    42: "val",
    73: "test",
    74: "test",
    133: "train",
    1000: "train",
    391895: "train",
}


class CocoOfficialLayoutTest(tf.test.TestCase):
    """`load_records("coco", ...)` from `annotations/captions_{train,val}2014.json`."""

    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()

    def _write(self, val_ids=_VAL2014_IDS, missing=()):
        train = {9: [f"nine {k}" for k in range(6)], 25: ["twenty-five"]}
        val = {i: [f"image {i}"] for i in val_ids}
        for folder, captions in (("train2014", train), ("val2014", val)):
            jpegs = {i: jpeg_bytes((i % 256, 0, 0)) for i in captions if i not in missing}
            fixtures.write_coco_captions(self.root, folder, captions, jpegs)

    def _path(self, folder, image_id):
        return os.path.join(self.root, folder, fixtures.coco_file_name(folder, image_id))

    def test_reads_official_files_when_no_karpathy_json(self):
        self._write()
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = datasets.load_records("coco", self.root)
        self.assertEqual(
            records[:3],
            [
                Record(
                    "9",
                    self._path("train2014", 9),
                    ("nine 0", "nine 1", "nine 2", "nine 3", "nine 4"),
                    "train",
                ),
                Record("25", self._path("train2014", 25), ("twenty-five",), "train"),
                Record("391895", self._path("val2014", 391895), ("image 391895",), "train"),
            ],
        )
        self.assertEqual(
            [(r.image_id, r.split) for r in records[2:]],
            [(str(i), _VAL2014_SPLITS[i]) for i in _VAL2014_IDS],
        )
        self.assertEqual(datasets.split_counts(records), {"train": 5, "val": 2, "test": 2})
        self.assertIn("the official COCO 2014 caption files", logs.output[0])
        self.assertIn("not its images", logs.output[0])
        test = datasets.load_records("coco", self.root, splits=["test"])
        self.assertEqual([r.image_id for r in test], ["73", "74"])

    def test_split_is_by_image_id_not_file_order(self):
        self._write(val_ids=sorted(_VAL2014_IDS, reverse=True))
        records = datasets.load_records("coco", self.root, splits=["val", "test"])
        self.assertEqual(
            {r.image_id: r.split for r in records},
            {"5": "val", "42": "val", "73": "test", "74": "test"},
        )

    def test_split_sizes(self):
        ids = [str(i) for i in range(40504, 0, -1)]
        split_of = datasets.split_by_image_id(ids)
        self.assertEqual(
            collections.Counter(split_of.values()), {"train": 30504, "val": 5000, "test": 5000}
        )
        self.assertEqual({int(i) for i, s in split_of.items() if s == "val"}, set(range(1, 5001)))
        self.assertEqual(split_of["5001"], "test")
        self.assertEqual(split_of["10000"], "test")
        self.assertEqual(split_of["10001"], "train")
        # Fewer than 15,000 images: a third (rounded down) each.
        small = datasets.split_by_image_id(str(i) for i in range(14999))
        self.assertEqual(
            collections.Counter(small.values()), {"train": 5001, "val": 4999, "test": 4999}
        )
        self.assertEqual(datasets.split_by_image_id(["3", "1"]), {"1": "train", "3": "train"})
        self._write()
        with (
            mock.patch.object(coco, "COCO_VAL_IMAGES", 1),
            mock.patch.object(coco, "COCO_TEST_IMAGES", 2),
        ):
            records = datasets.load_records("coco", self.root, splits=["val", "test"])
        self.assertEqual(
            [(r.image_id, r.split) for r in records], [("42", "test"), ("73", "test"), ("5", "val")]
        )

    def test_karpathy_json_is_preferred(self):
        self._write()
        name = fixtures.coco_file_name("val2014", 5)
        entry = karpathy_entry(name, 0, "test", ["karpathy"], filepath="val2014", cocoid=5)
        write_karpathy(os.path.join(self.root, "dataset_coco.json"), [entry], name="coco")
        records = datasets.load_records("coco", self.root)
        self.assertEqual(records, [Record("5", self._path("val2014", 5), ("karpathy",), "test")])

    def test_absent_files_are_named(self):
        with self.assertRaisesRegex(DatasetError, "holds no COCO layout: expected dataset_coco"):
            datasets.load_records("coco", self.root)
        self._write()
        val = os.path.join(self.root, "annotations", "captions_val2014.json")
        os.remove(val)
        with self.assertRaises(DatasetError) as cm:
            datasets.load_records("coco", self.root)
        self.assertEqual(
            str(cm.exception),
            f"coco: found {os.path.join(self.root, 'val2014')} but not {val}, the other half "
            "of COCO 2014 val",
        )

    def test_image_in_both_files(self):
        self._write(val_ids=(5, 9, 42))
        with self.assertRaisesRegex(
            DatasetError, r"image id\(s\) 9 are listed in both .*captions_train2014.json and"
        ):
            datasets.load_records("coco", self.root)

    def test_missing_images(self):
        self._write(missing=(73, 1000))
        val = os.path.join(self.root, "annotations", "captions_val2014.json")
        with self.assertRaises(DatasetError) as cm:
            datasets.load_records("coco", self.root)
        message = str(cm.exception)
        self.assertIn(f"{val}: 2 of 7 images listed are missing on disk", message)
        self.assertIn(self._path("val2014", 73), message)
        self.assertIn(self._path("val2014", 1000), message)
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = datasets.load_records("coco", self.root, on_missing="skip")
        self.assertIn("2 of 7 images", logs.output[0])
        # The images left keep the splits they have with all images present.
        self.assertEqual(
            {r.image_id: r.split for r in records if r.image_id not in ("9", "25")},
            {str(i): s for i, s in _VAL2014_SPLITS.items() if i not in (73, 1000)},
        )
        val = datasets.load_records("coco", self.root, splits=["val"])
        self.assertEqual([r.image_id for r in val], ["42", "5"])


class CocoLayoutTest(tf.test.TestCase):
    """Which COCO release and source `load_records("coco", ...)` finds, and what it refuses."""

    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()

    def _official(self, folder, ids):
        captions = {i: [f"{folder} image {i}", f"second {i}"] for i in ids}
        jpegs = {i: jpeg_bytes((i % 256, 0, 0)) for i in ids}
        return fixtures.write_coco_captions(self.root, folder, captions, jpegs)

    def _path(self, folder, name):
        return os.path.join(self.root, folder, name)

    def test_file_names_of_both_releases(self):
        self.assertEqual(coco.image_file_name("val2014", 42), "COCO_val2014_000000000042.jpg")
        self.assertEqual(coco.image_file_name("train2017", "391895"), "000000391895.jpg")

    def test_2017_official_files(self):
        self._official("train2017", [30, 9])
        self._official("val2017", [139, 285, 632, 724, 776, 785])
        with self.assertLogs(logger="absl", level="INFO") as logs:
            records = datasets.load_records("coco", self.root)
        self.assertEqual(
            records[0],
            Record(
                "30",
                self._path("train2017", "000000000030.jpg"),
                ("train2017 image 30", "second 30"),
                "train",
            ),
        )
        # val2017 by id: a third of 6 to val (139, 285), to test (632, 724), the rest train.
        self.assertEqual(
            {r.image_id: r.split for r in records},
            {
                "30": "train",
                "9": "train",
                "139": "val",
                "285": "val",
                "632": "test",
                "724": "test",
                "776": "train",
                "785": "train",
            },
        )
        (line,) = [m for m in logs.output if "coco:" in m]
        self.assertIn(
            "the official COCO 2017 caption files annotations/captions_train2017.json"
            " and annotations/captions_val2017.json with train2017/ and val2017/",
            line,
        )
        self.assertIn("val2017 by image id", line)
        self.assertIn("train2017 -> train", line)

    def test_2017_train_alone_is_split_by_image_id(self):
        self._official("train2017", [544238, 790, 30752, 37666, 54718, 63217, 551757])
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = datasets.load_records("coco", self.root)
        self.assertEqual(
            {r.image_id: r.split for r in records},
            {
                "790": "val",
                "30752": "val",
                "37666": "test",
                "54718": "test",
                "63217": "train",
                "544238": "train",
                "551757": "train",
            },
        )
        self.assertIn("annotations/captions_train2017.json with train2017/ in", logs.output[0])
        self.assertIn("Splits: train2017 by image id", logs.output[0])
        self.assertEqual(datasets.split_counts(records), {"train": 3, "val": 2, "test": 2})

    def test_karpathy_split_with_2017_folders(self):
        # Karpathy's entries keep their 2014 names; the photo is found by its cocoid in
        # val2017/ or, if not there, in train2017/.
        write_jpegs(self._path("val2017", ""), "000000000042.jpg")
        write_jpegs(self._path("train2017", ""), "000000000009.jpg", "000000391895.jpg")
        entries = [
            karpathy_entry(
                "COCO_val2014_000000391895.jpg", 0, "test", ["a"], filepath="val2014", cocoid=391895
            ),
            karpathy_entry(
                "COCO_val2014_000000000042.jpg", 1, "val", ["b"], filepath="val2014", cocoid=42
            ),
            karpathy_entry(
                "COCO_train2014_000000000009.jpg",
                2,
                "restval",
                ["c"],
                filepath="train2014",
                cocoid=9,
            ),
        ]
        write_karpathy(os.path.join(self.root, "dataset_coco.json"), entries, name="coco")
        with self.assertLogs(logger="absl", level="INFO") as logs:
            records = datasets.load_records("coco", self.root)
        self.assertEqual(
            records,
            [
                Record("391895", self._path("train2017", "000000391895.jpg"), ("a",), "test"),
                Record("42", self._path("val2017", "000000000042.jpg"), ("b",), "val"),
                Record("9", self._path("train2017", "000000000009.jpg"), ("c",), "train"),
            ],
        )
        (line,) = [m for m in logs.output if "coco:" in m]
        self.assertIn(
            "Karpathy's dataset_coco.json with the COCO 2017 images train2017/ and val2017/",
            line,
        )

    def test_karpathy_split_with_2014_folders_is_logged(self):
        write_jpegs(self._path("val2014", ""), "COCO_val2014_000000000042.jpg")
        os.makedirs(self._path("train2014", ""))
        entry = karpathy_entry(
            "COCO_val2014_000000000042.jpg", 0, "val", ["b"], filepath="val2014", cocoid=42
        )
        write_karpathy(os.path.join(self.root, "dataset_coco.json"), [entry], name="coco")
        with self.assertLogs(logger="absl", level="INFO") as logs:
            (record,) = datasets.load_records("coco", self.root)
        self.assertEqual(record.image_path, self._path("val2014", "COCO_val2014_000000000042.jpg"))
        self.assertIn("COCO 2014 images train2014/ and val2014/", "".join(logs.output))

    def test_a_mix_of_releases_is_refused(self):
        self._official("train2014", [9])
        self._official("val2014", [42])
        os.makedirs(self._path("val2017", ""))
        with self.assertRaises(DatasetError) as cm:
            datasets.load_records("coco", self.root)
        self.assertEqual(
            str(cm.exception),
            f"coco: {self.root} mixes files of two releases (COCO 2014: train2014, "
            "annotations/captions_train2014.json, val2014, annotations/captions_val2014.json; "
            "COCO 2017: val2017); the releases hold the same photos under other names: keep "
            "one release's files in the folder",
        )
        write_karpathy(os.path.join(self.root, "dataset_coco.json"), [], name="coco")
        with self.assertRaisesRegex(
            DatasetError,
            r"mixes files of two releases \(COCO 2014: train2014, val2014; COCO "
            r"2017: val2017\)",
        ):
            datasets.load_records("coco", self.root)

    def test_a_missing_half_is_named(self):
        self._official("train2017", [9])
        captions = self._official("val2017", [42])
        shutil.rmtree(self._path("val2017", ""))
        with self.assertRaises(DatasetError) as cm:
            datasets.load_records("coco", self.root)
        self.assertEqual(
            str(cm.exception),
            f"coco: found {captions} but not {self._path('val2017', '')[:-1]}, the other "
            "half of COCO 2017 val",
        )
        write_karpathy(os.path.join(self.root, "dataset_coco.json"), [], name="coco")
        karpathy = os.path.join(self.root, "dataset_coco.json")
        with self.assertRaises(DatasetError) as cm:
            datasets.load_records("coco", self.root)
        self.assertEqual(
            str(cm.exception),
            f"coco: {karpathy} takes images from both train2017/ and val2017/, but "
            f"{self._path('val2017', '')[:-1]} does not exist",
        )
        shutil.rmtree(self._path("train2017", ""))
        with self.assertRaisesRegex(DatasetError, "found .*dataset_coco.json but no image folder"):
            datasets.load_records("coco", self.root)


if __name__ == "__main__":
    tf.test.main()
