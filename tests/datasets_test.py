"""Tests for sat_tf.data.datasets: every reader on tiny fixtures written in its on-disk format."""

import collections
import io
import json
import os
import shutil
from unittest import mock

import fixtures
import tensorflow as tf
from absl.testing import parameterized
from PIL import Image

from sat_tf.data import coco, datasets
from sat_tf.data.datasets import DatasetError, Record


def _jpeg_bytes(color) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, "JPEG")
    return buffer.getvalue()


def _write(path: str, data) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _images(root: str, *names: str) -> None:
    for i, name in enumerate(names):
        _write(os.path.join(root, name), _jpeg_bytes((40 * i, 100, 200)))


def _entry(filename, imgid, split, captions, **extra):
    sentences = [
        {"raw": c, "tokens": c.split(), "imgid": imgid, "sentid": 10 * imgid + k}
        for k, c in enumerate(captions)
    ]
    return {
        "filename": filename,
        "imgid": imgid,
        "split": split,
        "sentids": [s["sentid"] for s in sentences],
        "sentences": sentences,
        **extra,
    }


def _karpathy(path: str, entries, name="flickr8k") -> str:
    return _write(path, json.dumps({"dataset": name, "images": entries}, indent=1))


class KarpathyTest(tf.test.TestCase, parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()

    def test_flickr_style(self):
        _images(self.root, "a.jpg", "b.jpg", "c.jpg")
        path = _karpathy(
            os.path.join(self.root, "dataset_flickr8k.json"),
            [
                _entry("a.jpg", 0, "train", [f"a dog {k} ." for k in range(6)]),
                _entry("b.jpg", 1, "val", ["  b one\n", "b two"]),
                _entry("c.jpg", 2, "test", ["c one"]),
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
        _images(self.root, "train2014/t1.jpg", "val2014/v1.jpg", "val2014/v2.jpg")
        path = _karpathy(
            os.path.join(self.root, "dataset_coco.json"),
            [
                _entry("v1.jpg", 0, "restval", ["r"], filepath="val2014", cocoid=391895),
                _entry("t1.jpg", 1, "train", ["t"], filepath="train2014", cocoid=9),
                _entry("v2.jpg", 2, "val", ["v"], filepath="val2014", cocoid=42),
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
        _images(self.root, "there.jpg")
        entries = [_entry("there.jpg", 0, "train", ["x"])] + [
            _entry(f"gone{i}.jpg", i + 1, "test", ["y"]) for i in range(num_missing)
        ]
        return _karpathy(os.path.join(self.root, "d.json"), entries)

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
        _images(self.root, "a.jpg")
        path = _karpathy(
            os.path.join(self.root, "d.json"),
            [
                _entry("a.jpg", 7, "train", ["a0", "a1", "a2"]),
                _entry("a.jpg", 7, "train", ["b0", "b1", "b2"]),
            ],
        )
        (record,) = datasets.read_karpathy(path, self.root)
        self.assertEqual(record.captions, ("a0", "a1", "a2", "b0", "b1"))

    @parameterized.named_parameters(
        ("other_file", "b.jpg", "train", "b.jpg"),
        ("other_split", "a.jpg", "test", "split test"),
    )
    def test_duplicate_id_conflict(self, filename, split, expected):
        _images(self.root, "a.jpg", "b.jpg")
        path = _karpathy(
            os.path.join(self.root, "d.json"),
            [_entry("a.jpg", 7, "train", ["a"]), _entry(filename, 7, split, ["b"])],
        )
        with self.assertRaises(DatasetError) as cm:
            datasets.read_karpathy(path, self.root)
        message = str(cm.exception)
        for part in (path, "'7'", "images[0]", "images[1]", expected):
            self.assertIn(part, message)

    def test_non_utf8_names_file_and_line(self):
        text = json.dumps({"images": [_entry("a.jpg", 0, "train", ["MARK"])]}, indent=1)
        line = text.split("\n").index(next(x for x in text.split("\n") if "MARK" in x)) + 1
        self.assertGreater(line, 3)
        path = _write(
            os.path.join(self.root, "d.json"), text.encode().replace(b"MARK", b"caf\xe9", 1)
        )
        with self.assertRaisesRegex(DatasetError, f"{path}, line {line}: .*not valid UTF-8"):
            datasets.read_karpathy(path, self.root)

    def test_empty_captions_skipped_and_uncaptioned_images_dropped(self):
        _images(self.root, "a.jpg", "b.jpg")
        path = _karpathy(
            os.path.join(self.root, "d.json"),
            [
                _entry("a.jpg", 0, "train", ["", "  ", "ok", "\t\n"]),
                _entry("b.jpg", 1, "train", [" ", ""]),
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
        path = _write(os.path.join(self.root, "d.json"), json.dumps(data))
        with self.assertRaises(DatasetError) as cm:
            datasets.read_karpathy(path, self.root)
        self.assertIn(path, str(cm.exception))
        self.assertIn(expected, str(cm.exception))

    def test_invalid_json_and_absent_file(self):
        path = _write(os.path.join(self.root, "d.json"), '{"images": [\n{"filename": }]}')
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
        path = _karpathy(os.path.join(self.root, "d.json"), [])
        with self.assertRaisesRegex(ValueError, expected):
            datasets.read_karpathy(path, self.root, **kwargs)


class Flickr8kRawTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()
        self.image_dir = os.path.join(self.root, "Flicker8k_Dataset")
        _images(self.image_dir, "a_1.jpg", "b_2.jpg", "c_3.jpg", "e_5.jpg", "d_4.jpg")
        self._splits(["a_1.jpg"], ["b_2.jpg"], ["c_3.jpg", "e_5.jpg"])

    def _splits(self, train, dev, test):
        for name, files in (("train", train), ("dev", dev), ("test", test)):
            _write(os.path.join(self.root, f"Flickr_8k.{name}Images.txt"), "\n".join(files) + "\n")

    def _tokens(self, data) -> str:
        return _write(os.path.join(self.root, "Flickr8k.token.txt"), data)

    def test_reads_splits_and_caps_captions(self):
        lines = [f"a_1.jpg#{k}\tA dog number {k} ." for k in range(6)]
        lines += [
            "c_3.jpg#0\tC zero .\r",
            "d_4.jpg#0\tnot in any split",
            "a_1.jpg.1#0\tthe stray line of the real file",
            "",
            "b_2.jpg#0\tB zero .",
            "c_3.jpg#1\tC one .",
        ]
        token_file = self._tokens("\n".join(lines) + "\n")
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = datasets.read_flickr8k(token_file, self.root, self.image_dir)
        self.assertEqual(
            records,
            [
                Record(
                    "a_1",
                    os.path.join(self.image_dir, "a_1.jpg"),
                    tuple(f"A dog number {k} ." for k in range(5)),
                    "train",
                ),
                Record(
                    "c_3", os.path.join(self.image_dir, "c_3.jpg"), ("C zero .", "C one ."), "test"
                ),
                Record("b_2", os.path.join(self.image_dir, "b_2.jpg"), ("B zero .",), "val"),
            ],
        )
        self.assertIn("dropped 2 image(s) that no split file", logs.output[0])
        self.assertIn("dropped 1 image(s) with no non-empty caption: e_5", logs.output[1])
        val = datasets.read_flickr8k(token_file, self.root, self.image_dir, splits=["val"])
        self.assertEqual([r.image_id for r in val], ["b_2"])

    def test_bad_lines(self):
        token_file = self._tokens("a_1.jpg#0\tok\na_1.jpg#1 no tab here\n")
        with self.assertRaisesRegex(DatasetError, f"{token_file}, line 2: has no tab"):
            datasets.read_flickr8k(token_file, self.root, self.image_dir)
        self._tokens("a_1.jpg\tno hash\n")
        with self.assertRaisesRegex(DatasetError, "line 1: does not start with <image name>#<n>"):
            datasets.read_flickr8k(token_file, self.root, self.image_dir)

    def test_non_utf8_names_file_and_line(self):
        token_file = self._tokens(b"a_1.jpg#0\tok\n\na_1.jpg#1\tna\xefve caf\xe9\n")
        with self.assertRaisesRegex(DatasetError, f"{token_file}, line 3: .*not valid UTF-8"):
            datasets.read_flickr8k(token_file, self.root, self.image_dir)

    def test_image_in_two_split_files(self):
        self._splits(["a_1.jpg"], ["a_1.jpg"], [])
        token_file = self._tokens("a_1.jpg#0\tok\n")
        with self.assertRaisesRegex(DatasetError, r"a_1\.jpg is listed at .*trainImages.* and at"):
            datasets.read_flickr8k(token_file, self.root, self.image_dir)

    def test_split_file_lists_images_absent_from_the_folder(self):
        self._splits(["a_1.jpg", "x_8.jpg"], ["b_2.jpg"], ["y_9.jpg"])
        token_file = self._tokens("a_1.jpg#0\tA\nx_8.jpg#0\tX\nb_2.jpg#0\tB\ny_9.jpg#0\tY\n")
        with self.assertRaisesRegex(
            DatasetError, r"2 of 4 images listed are missing on disk: .*x_8\.jpg, .*y_9\.jpg"
        ) as caught:
            datasets.read_flickr8k(token_file, self.root, self.image_dir)
        self.assertIn(token_file, str(caught.exception))
        records = datasets.read_flickr8k(token_file, self.root, self.image_dir, on_missing="skip")
        self.assertEqual([r.image_id for r in records], ["a_1", "b_2"])

    def test_missing_split_file(self):
        os.remove(os.path.join(self.root, "Flickr_8k.devImages.txt"))
        token_file = self._tokens("a_1.jpg#0\tok\n")
        with self.assertRaisesRegex(DatasetError, "Flickr_8k.devImages.txt: cannot read file"):
            datasets.read_flickr8k(token_file, self.root, self.image_dir)


class CocoOfficialTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()
        self.image_dir = os.path.join(self.root, "val2014")
        _images(self.image_dir, "COCO_val2014_5.jpg", "COCO_val2014_7.jpg", "COCO_val2014_9.jpg")

    def _write(self, annotations, images=None):
        images = images or [
            {"id": 7, "file_name": "COCO_val2014_7.jpg", "height": 8},
            {"id": 5, "file_name": "COCO_val2014_5.jpg"},
            {"id": 9, "file_name": "COCO_val2014_9.jpg"},
        ]
        data = {"info": {}, "images": images, "annotations": annotations}
        return _write(os.path.join(self.root, "captions_val2014.json"), json.dumps(data))

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
        self.jpegs = {i: _jpeg_bytes((50 * i, 0, 0)) for i in range(1, 6)}
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
        _write(self._path(4), b"kept")
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
        _images(os.path.join(self.root, folder, filepath), "x.jpg", "y.jpg")
        if dataset == "coco":
            os.makedirs(os.path.join(self.root, "train2014"))
        extra = {"filepath": filepath} if filepath else {}
        entries = [
            _entry("x.jpg", 0, "train", ["x"], **extra),
            _entry("y.jpg", 1, "test", ["y"], **extra),
        ]
        _karpathy(os.path.join(self.root, f"dataset_{dataset}.json"), entries, name=dataset)
        records = datasets.load_records(dataset, self.root, splits=["test"])
        expected = os.path.join(self.root, folder, filepath, "y.jpg")
        self.assertEqual(records, [Record("1", expected, ("y",), "test")])

    def test_flickr8k_prefers_karpathy_json_then_raw_files(self):
        image_dir = os.path.join(self.root, "Flicker8k_Dataset")
        _images(image_dir, "a_1.jpg")
        _write(os.path.join(self.root, "Flickr8k.token.txt"), "a_1.jpg#0\traw caption\n")
        for name, files in (("train", "a_1.jpg\n"), ("dev", ""), ("test", "")):
            _write(os.path.join(self.root, f"Flickr_8k.{name}Images.txt"), files)
        raw = datasets.load_records("flickr8k", self.root)
        self.assertEqual(
            raw, [Record("a_1", os.path.join(image_dir, "a_1.jpg"), ("raw caption",), "train")]
        )
        _karpathy(
            os.path.join(self.root, "dataset_flickr8k.json"),
            [_entry("a_1.jpg", 0, "val", ["karpathy caption"])],
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
        _karpathy(
            os.path.join(self.root, "dataset_coco.json"),
            [_entry("z.jpg", 0, "train", ["z"], filepath="train2014", cocoid=3)],
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
            jpegs = {i: _jpeg_bytes((i % 256, 0, 0)) for i in captions if i not in missing}
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
        entry = _entry(name, 0, "test", ["karpathy"], filepath="val2014", cocoid=5)
        _karpathy(os.path.join(self.root, "dataset_coco.json"), [entry], name="coco")
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
        jpegs = {i: _jpeg_bytes((i % 256, 0, 0)) for i in ids}
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
        _images(self._path("val2017", ""), "000000000042.jpg")
        _images(self._path("train2017", ""), "000000000009.jpg", "000000391895.jpg")
        entries = [
            _entry(
                "COCO_val2014_000000391895.jpg", 0, "test", ["a"], filepath="val2014", cocoid=391895
            ),
            _entry("COCO_val2014_000000000042.jpg", 1, "val", ["b"], filepath="val2014", cocoid=42),
            _entry(
                "COCO_train2014_000000000009.jpg",
                2,
                "restval",
                ["c"],
                filepath="train2014",
                cocoid=9,
            ),
        ]
        _karpathy(os.path.join(self.root, "dataset_coco.json"), entries, name="coco")
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
        _images(self._path("val2014", ""), "COCO_val2014_000000000042.jpg")
        os.makedirs(self._path("train2014", ""))
        entry = _entry(
            "COCO_val2014_000000000042.jpg", 0, "val", ["b"], filepath="val2014", cocoid=42
        )
        _karpathy(os.path.join(self.root, "dataset_coco.json"), [entry], name="coco")
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
        _karpathy(os.path.join(self.root, "dataset_coco.json"), [], name="coco")
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
        _karpathy(os.path.join(self.root, "dataset_coco.json"), [], name="coco")
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


class Flickr30kRawTest(tf.test.TestCase):
    """Flickr30k from `results_20130124.token` and Flickr30k Entities' split files."""

    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()
        self.image_dir = os.path.join(self.root, "flickr30k-images")
        _images(self.image_dir, "1000092795.jpg", "10002456.jpg", "1000268201.jpg")
        # The token file as flickr30k.tar.gz has it: "<name>.jpg#<n>\t<caption>".
        _write(
            os.path.join(self.root, "results_20130124.token"),
            "1000092795.jpg#0\tTwo young guys with shaggy hair look at their hands .\n"
            "1000092795.jpg#1\tTwo young , White males are outside near many bushes .\n"
            "10002456.jpg#0\tSeveral men in hard hats are operating a giant pulley system .\n"
            "1000268201.jpg#0\tA child in a pink dress is climbing up a set of stairs .\n",
        )
        # Flickr30k Entities' split files: image ids without ".jpg", one a line.
        for split, ids in (
            ("train", "1000092795\n"),
            ("val", "10002456\n"),
            ("test", "1000268201"),
        ):
            _write(os.path.join(self.root, f"{split}.txt"), ids)

    def test_reads_token_file_and_entities_splits(self):
        records = datasets.load_records("flickr30k", self.root)
        self.assertEqual(
            records,
            [
                Record(
                    "1000092795",
                    os.path.join(self.image_dir, "1000092795.jpg"),
                    (
                        "Two young guys with shaggy hair look at their hands .",
                        "Two young , White males are outside near many bushes .",
                    ),
                    "train",
                ),
                Record(
                    "10002456",
                    os.path.join(self.image_dir, "10002456.jpg"),
                    ("Several men in hard hats are operating a giant pulley system .",),
                    "val",
                ),
                Record(
                    "1000268201",
                    os.path.join(self.image_dir, "1000268201.jpg"),
                    ("A child in a pink dress is climbing up a set of stairs .",),
                    "test",
                ),
            ],
        )

    def test_karpathy_json_is_preferred(self):
        _karpathy(
            os.path.join(self.root, "dataset_flickr30k.json"),
            [_entry("10002456.jpg", 7, "test", ["karpathy caption"])],
            name="flickr30k",
        )
        self.assertEqual(
            datasets.load_records("flickr30k", self.root),
            [
                Record(
                    "7", os.path.join(self.image_dir, "10002456.jpg"), ("karpathy caption",), "test"
                )
            ],
        )

    def test_absent_files_are_named(self):
        os.remove(os.path.join(self.root, "val.txt"))
        with self.assertRaises(DatasetError) as cm:
            datasets.load_records("flickr30k", self.root)
        self.assertEqual(
            str(cm.exception),
            f"flickr30k: found {os.path.join(self.root, 'results_20130124.token')} but not its "
            f"split file(s) {os.path.join(self.root, 'val.txt')} (from Flickr30k Entities); "
            f"or use Karpathy's {os.path.join(self.root, 'dataset_flickr30k.json')}",
        )
        os.remove(os.path.join(self.root, "results_20130124.token"))
        with self.assertRaisesRegex(
            DatasetError, "found neither .*dataset_flickr30k.json nor .*results_20130124.token"
        ):
            datasets.load_records("flickr30k", self.root)


if __name__ == "__main__":
    tf.test.main()
