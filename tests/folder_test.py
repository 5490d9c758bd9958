"""Tests for sat_tf.data.folder: each layout on a tiny folder written in its format, the
hash split, and the bad-row policy.

Expected splits come from the sha256 of each path as coreutils' `sha256sum` prints it:
the first 16 hex digits as an integer n give the percentile n * 100 // 2**64 (below 80
train, below 90 val, else test). "a.png" 7f071235805fbf58 -> 49, "g.png" e1bfefa774fd09c8
-> 88, "photos/0015.jpg" -> 91, "photos/0029.jpg" -> 87; each is quoted where used.
"""

import io
import json
import os
import shutil
import tempfile

from absl.testing import absltest, parameterized
from PIL import Image

from sat_tf.data import datasets, folder
from sat_tf.data.records import DatasetError, Record


def _write(path: str, data) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _image(path: str, shade: int = 0) -> str:
    """A 4x4 image file, PNG or JPEG as its name says."""
    buffer = io.BytesIO()
    image_format = "PNG" if path.endswith(".png") else "JPEG"
    Image.new("RGB", (4, 4), (shade, 100, 200)).save(buffer, image_format)
    return _write(path, buffer.getvalue())


def _jsonl(*entries) -> str:
    return "".join(json.dumps(e) + "\n" for e in entries)


class FolderTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(prefix="folder_test_")
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def _images(self, *names: str) -> None:
        for i, name in enumerate(names):
            _image(self._path(name), 30 * i)

    def _record(self, image_id: str, captions, split: str) -> Record:
        return Record(image_id, self._path(*image_id.split("/")), tuple(captions), split)


class LayoutTest(FolderTest):
    def test_metadata_jsonl_with_string_and_list_captions(self):
        self._images("a.png", "b.png", "sub/c.png", "g.png")
        _write(
            self._path("metadata.jsonl"),
            _jsonl(
                {"file_name": "a.png", "text": "a red square"},
                {"file_name": "b.png", "text": ["two blue dots", "  dots on white "]},
                {"file_name": "sub/c.png", "caption": "a small circle", "width": 4},
                {"file_name": "g.png", "captions": ["one", "two", "three", "four", "5", "6"]},
            ),
        )
        self.assertEqual(
            folder.read_folder(self.root),
            [
                self._record("a.png", ["a red square"], "train"),  # 49
                self._record("b.png", ["two blue dots", "dots on white"], "train"),  # 37
                self._record("sub/c.png", ["a small circle"], "train"),  # 63
                self._record("g.png", ["one", "two", "three", "four", "5"], "val"),  # 88
            ],
        )
        self.assertEqual(
            folder.read_folder(self.root, max_captions=2, splits=["val"]),
            [self._record("g.png", ["one", "two"], "val")],
        )

    def test_metadata_csv_with_several_rows_per_file(self):
        self._images("a.png", "b.png")
        _write(
            self._path("metadata.csv"),
            'file_name,text\na.png,a red square\nb.png,"a blue dot, small"\na.png,red again\n',
        )
        self.assertEqual(
            folder.read_folder(self.root),
            [
                self._record("a.png", ["a red square", "red again"], "train"),
                self._record("b.png", ["a blue dot, small"], "train"),
            ],
        )

    def test_split_folders_each_with_its_metadata(self):
        self._images("train/a.png", "validation/b.png", "test/c.png", "test/d.png")
        _write(self._path("train", "metadata.jsonl"), _jsonl({"file_name": "a.png", "text": "a"}))
        _write(self._path("validation", "metadata.csv"), "file_name,caption\nb.png,b\n")
        _write(
            self._path("test", "metadata.jsonl"),
            _jsonl({"file_name": "c.png", "text": "c"}, {"file_name": "d.png", "text": " "}),
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = folder.read_folder(self.root)
        self.assertEqual(
            records,
            [
                self._record("train/a.png", ["a"], "train"),
                self._record("validation/b.png", ["b"], "val"),
                self._record("test/c.png", ["c"], "test"),
            ],
        )
        self.assertEqual(
            logs.output[-1],
            f"WARNING:absl:{self.root}: dropped 1 image(s) with no non-empty caption: "
            "test/d.png (test/metadata.jsonl, line 2)",
        )

    def test_one_metadata_file_with_split_prefixes_and_a_split_key(self):
        self._images("train/a.png", "val/b.png", "test/c.png", "d.png", "e.png", "f.png")
        _write(
            self._path("metadata.jsonl"),
            _jsonl(
                {"file_name": "train/a.png", "text": "a"},
                {"file_name": "val/b.png", "text": "b"},
                {"file_name": "test/c.png", "text": "c"},
                {"file_name": "d.png", "text": "d"},
                {"file_name": "e.png", "text": "e", "split": "restval"},
                {"file_name": "f.png", "text": "f", "split": " Test"},
                {"file_name": "test/c.png", "text": "c2", "split": "test"},
            ),
        )
        self.assertEqual(
            folder.read_folder(self.root),
            [
                self._record("train/a.png", ["a"], "train"),
                self._record("val/b.png", ["b"], "val"),
                self._record("test/c.png", ["c", "c2"], "test"),
                self._record("d.png", ["d"], "train"),  # a14ae8912b535394 -> 63
                self._record("e.png", ["e"], "train"),
                self._record("f.png", ["f"], "test"),
            ],
        )

    def test_kaggle_flickr8k_captions_txt_with_images_folder(self):
        self._images("Images/1000268201_693b08cb0e.jpg", "Images/1001773457_577c3a7d70.jpg")
        _write(
            self._path("captions.txt"),
            "image,caption\n"
            "1000268201_693b08cb0e.jpg,A child in a pink dress is climbing up a set of stairs .\n"
            "1000268201_693b08cb0e.jpg,A girl going into a wooden building .\r\n"
            '1001773457_577c3a7d70.jpg,"A black dog and a spotted dog are fighting, outside ."\n',
        )
        self.assertEqual(
            folder.read_folder(self.root),
            [
                self._record(
                    "Images/1000268201_693b08cb0e.jpg",  # d7308ad26595b7cd -> 84
                    [
                        "A child in a pink dress is climbing up a set of stairs .",
                        "A girl going into a wooden building .",
                    ],
                    "val",
                ),
                self._record(
                    "Images/1001773457_577c3a7d70.jpg",  # e21ed533f2cbd0c2 -> 88
                    ["A black dog and a spotted dog are fighting, outside ."],
                    "val",
                ),
            ],
        )

    def test_flickr30k_results_csv_separated_by_bars(self):
        self._images("flickr30k_images/1000092795.jpg", "flickr30k_images/10002456.jpg")
        path = _write(
            self._path("results.csv"),
            "image_name| comment_number| comment\n"
            "1000092795.jpg| 0| Two young guys with shaggy hair look at their hands .\n"
            '1000092795.jpg| 1| Two young , White males wear "Life is good" shirts .\n'
            "10002456.jpg| 0| Several men in hard hats are operating a giant pulley system .\n"
            "10002456.jpg| 4 Workers look down from up above on a piece of equipment .\n",
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = folder.read_folder(self.root)
        self.assertEqual(
            records,
            [
                self._record(
                    "flickr30k_images/1000092795.jpg",  # 9be20223d67430ff -> 60
                    [
                        "Two young guys with shaggy hair look at their hands .",
                        'Two young , White males wear "Life is good" shirts .',
                    ],
                    "train",
                ),
                self._record(
                    "flickr30k_images/10002456.jpg",  # 708d5f0eda308080 -> 43
                    ["Several men in hard hats are operating a giant pulley system ."],
                    "train",
                ),
            ],
        )
        self.assertEqual(
            logs.output,
            [
                f"WARNING:absl:{path}, line 5: has 2 fields, the header 3; skipped",
                f"WARNING:absl:{path}: skipped 1 of 4 row(s) (wrong number of fields: 1)",
            ],
        )

    def test_coco_json_in_annotations_with_images_in_train2017(self):
        self._images(*(f"train2017/{i:012d}.jpg" for i in (9, 25, 30)))
        path = _write(
            self._path("annotations", "captions_train2017.json"),
            json.dumps(
                {
                    "info": {},
                    "images": [
                        {"id": 9, "file_name": "000000000009.jpg", "width": 4},
                        {"id": 25, "file_name": "000000000025.jpg", "split": "val"},
                        {"id": 30, "file_name": "000000000030.jpg"},
                    ],
                    "annotations": [
                        {"id": 1, "image_id": 9, "caption": "Closeup of bins of food."},
                        {"id": 2, "image_id": 25, "caption": "A giraffe eating food."},
                        {"id": 3, "image_id": 9, "caption": "A meal in a container."},
                    ],
                }
            ),
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = folder.read_folder(self.root)
        self.assertEqual(
            records,
            [
                self._record(  # 11caa71d3a03052d -> 6
                    "train2017/000000000009.jpg",
                    ["Closeup of bins of food.", "A meal in a container."],
                    "train",
                ),
                self._record("train2017/000000000025.jpg", ["A giraffe eating food."], "val"),
            ],
        )
        self.assertEqual(
            logs.output,
            [
                f"WARNING:absl:{path}: dropped 1 image(s) with no non-empty caption: "
                "train2017/000000000030.jpg (images[2])"
            ],
        )

    def test_coco_file_name_that_several_subfolders_hold(self):
        self._images("y.png", "a/x.png", "b/x.png")
        data = {
            "images": [{"id": 1, "file_name": "x.png"}, {"id": "2", "file_name": "y.png"}],
            "annotations": [{"image_id": 1, "caption": "x"}, {"image_id": 2, "caption": "y"}],
        }
        path = _write(self._path("captions.json"), json.dumps(data))
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = folder.read_folder(self.root)
        self.assertEqual(records, [self._record("y.png", ["y"], "train")])  # 74
        self.assertEqual(
            logs.output[0],
            f"WARNING:absl:{path}, images[0]: 'x.png' could be any of a/x.png, b/x.png; skipped",
        )

    def test_explicit_captions_file(self):
        self._images("x.png", "y.png")
        _write(self._path("a.csv"), "image,caption\ny.png,a y\n")
        _write(self._path("b.tsv"), "File\t Sentence \nx.png\tan x\n")
        lists = _write(self._path("lists", "c.csv"), "image,caption\n../y.png,y from lists\n")
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        self.assertEqual(
            str(cm.exception),
            f"folder: {self.root} holds 2 candidate captions files: a.csv, b.tsv; "
            "pass --captions=FILE to name the one to read",
        )
        self.assertEqual(
            folder.read_folder(self.root, captions="b.tsv"),
            [self._record("x.png", ["an x"], "train")],  # 22
        )
        self.assertEqual(
            folder.read_folder(self.root, captions=lists),
            [self._record("y.png", ["y from lists"], "train")],  # 74
        )
        self.assertEqual(
            datasets.load_records("folder", self.root, captions="a.csv"),
            [self._record("y.png", ["a y"], "train")],
        )
        with self.assertRaisesRegex(
            DatasetError, f"^folder: the captions file {self._path('nope.csv')} does not exist$"
        ):
            folder.read_folder(self.root, captions="nope.csv")
        with self.assertRaisesRegex(ValueError, "captions='a.csv' is read for dataset 'folder'"):
            datasets.load_records("shapes", self.root, captions="a.csv")


class StabilityTest(FolderTest):
    def _photos(self, first: int, last: int) -> str:
        """Empty photos/<i>.jpg files (only their names are read) and their two rows each."""
        rows = []
        for i in range(first, last):
            _write(self._path("photos", f"{i:04d}.jpg"), b"")
            rows += [f"photos/{i:04d}.jpg,photo {i}\n", f"photos/{i:04d}.jpg,again {i}\n"]
        with open(self._path("captions.csv"), "a", encoding="utf-8") as f:
            f.write("".join(rows))

    def test_adding_photos_moves_none_and_one_image_is_in_one_split(self):
        _write(self._path("captions.csv"), "image,caption\n")
        self._photos(0, 30)
        before = {r.image_id: r.split for r in folder.read_folder(self.root)}
        self._photos(30, 60)
        records = folder.read_folder(self.root)
        after = {r.image_id: r.split for r in records}
        self.assertEqual({k: after[k] for k in before}, before)
        # sha256sum: 0015, 0020, 0023, 0044, 0051 at 91..97; 0029, 0031, 0036, 0057 at 87..89.
        held_out = {15: "test", 20: "test", 23: "test", 44: "test", 51: "test"}
        held_out.update({29: "val", 31: "val", 36: "val", 57: "val"})
        expected = {f"photos/{i:04d}.jpg": held_out.get(i, "train") for i in range(60)}
        self.assertEqual(after, expected)
        self.assertLen(records, 60)
        for record in records:
            i = int(record.image_id[7:11])
            self.assertEqual(record.captions, (f"photo {i}", f"again {i}"))
        by_split = {s: {r.image_id for r in records if r.split == s} for s in folder.SPLIT_PERCENT}
        self.assertEqual(sum(len(ids) for ids in by_split.values()), 60)
        self.assertEqual(set.union(*by_split.values()), set(expected))

    def test_one_image_given_two_splits_is_refused(self):
        self._images("a.png")
        path = _write(
            self._path("captions.csv"), "image,caption,split\na.png,one,train\na.png,two,test\n"
        )
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        self.assertEqual(
            str(cm.exception),
            f"{path}: image id 'a.png' appears at line 2 as {self._path('a.png')} (split train) "
            f"and at line 3 as {self._path('a.png')} (split test)",
        )


class BadInputTest(FolderTest):
    def test_bad_table_rows(self):
        self._images("a.png", "d.png")
        path = _write(
            self._path("captions.csv"),
            "image,caption,split\n"
            "a.png,a red square,train\n"
            "b.png,too,many,fields\n"
            ",no image here,train\n"
            "notes.txt,a text file,train\n"
            "c.png,a circle,training\n"
            "d.png, ,val\n"
            "\n"
            'e.png,"a quote left open,test\n'
            "f.png,never read,test\n",
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = folder.read_folder(self.root)
        self.assertEqual(records, [self._record("a.png", ["a red square"], "train")])
        extensions = ".jpg, .jpeg, .png, .gif, .bmp, .webp"
        self.assertEqual(
            logs.output,
            [
                f"WARNING:absl:{path}, line 3: has 4 fields, the header 3; skipped",
                f"WARNING:absl:{path}, line 4: has no image name; skipped",
                f"WARNING:absl:{path}, line 5: names 'notes.txt', not an image file "
                f"({extensions}); skipped",
                f"WARNING:absl:{path}, line 6: has split 'training'; expected one of train, "
                "restval, val, validation, test; skipped",
                f"WARNING:absl:{path}, line 9: a field runs over lines 9-10 (a quote left "
                "open?); skipped",
                f"WARNING:absl:{path}: skipped 5 of 7 row(s) (wrong number of fields: 1, no "
                "image name: 1, not an image file: 1, unknown split: 1, field over several "
                "lines: 1)",
                f"WARNING:absl:{path}: skipped 1 empty or whitespace-only caption(s), at line 7",
                f"WARNING:absl:{path}: dropped 1 image(s) with no non-empty caption: d.png "
                "(line 7)",
            ],
        )

    def test_bad_json_lines(self):
        self._images("a.png", "train/c.png")
        path = _write(
            self._path("metadata.jsonl"),
            '{"file_name": "a.png", "text": "ok"}\n'
            '{"file_name": "b.png", "text": "broken"\n'
            '["b.png", "a list"]\n'
            '{"file_name": "b.png"}\n'
            "\n"
            '{"text": "no file"}\n'
            '{"file_name": "b.png", "text": ["x", 3]}\n'
            '{"file_name": 7, "text": "x"}\n'
            '{"file_name": "train/c.png", "text": "c", "split": "test"}\n',
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = folder.read_folder(self.root)
        self.assertEqual(records, [self._record("a.png", ["ok"], "train")])
        captions = "caption, comment, text, captions, sentence"
        images = "image, image_name, file_name, filename, file, path, img"
        self.assertEqual(
            logs.output,
            [
                f"WARNING:absl:{path}, line 2: not valid JSON (Expecting ',' delimiter at "
                "column 40); skipped",
                f"WARNING:absl:{path}, line 3: is a JSON list, not an object; skipped",
                f"WARNING:absl:{path}, line 4: has no caption key (one of {captions}); skipped",
                f"WARNING:absl:{path}, line 6: has no image key (one of {images}); skipped",
                f"WARNING:absl:{path}, line 7: 'text' is ['x', 3], not a string or a list of "
                "strings; skipped",
                f"WARNING:absl:{path}, line 8: 'file_name' is 7, not a string; skipped",
                f"WARNING:absl:{path}, line 9: has split 'test', but train/c.png is in the "
                "train/ folder; skipped",
                f"WARNING:absl:{path}: skipped 7 of 8 row(s) (not valid JSON: 1, not a JSON "
                "object: 1, no caption key: 1, no image key: 1, caption not a string: 1, image "
                "name not a string: 1, split against its folder: 1)",
            ],
        )

    def test_missing_images(self):
        self._images("a.png")
        path = _write(self._path("captions.txt"), "image,caption\na.png,a\ngone.png,g\n")
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        self.assertEqual(
            str(cm.exception),
            f"{path}: 1 of 2 images listed are missing on disk: {self._path('gone.png')}; "
            "pass on_missing='skip' to drop them",
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = folder.read_folder(self.root, on_missing="skip")
        self.assertEqual(records, [self._record("a.png", ["a"], "train")])
        self.assertEqual(
            logs.output,
            [
                f"WARNING:absl:{path}: 1 of 2 images listed are missing on disk: "
                f"{self._path('gone.png')}; skipped them"
            ],
        )

    def test_missing_image_is_looked_for_in_the_images_folder(self):
        self._images("Images/a.png")
        _write(self._path("captions.txt"), "image,caption\na.png,a\ngone.png,g\n")
        with self.assertRaisesRegex(DatasetError, f"missing on disk: {self._path('Images')}/gone"):
            folder.read_folder(self.root)

    def test_non_utf8_line(self):
        path = _write(self._path("captions.csv"), b"image,caption\na.png,ok\nb.png,caf\xe9\n")
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        self.assertStartsWith(
            str(cm.exception),
            f"{path}, line 3: bytes b'\\xe9' (file offset 32) are not valid UTF-8",
        )

    def test_one_file_under_several_names(self):
        self._images("a.png", "sub/b.png")
        os.symlink(self._path("a.png"), self._path("link.png"))
        path = _write(
            self._path("metadata.csv"),
            "file_name,text\na.png,one\n./a.png,two\nsub/../a.png,three\n./a.png,four\n"
            "link.png,five\nsub/b.png,b\n",
        )
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            records = folder.read_folder(self.root)
        self.assertEqual(
            records,
            [
                self._record("a.png", ["one", "two", "three", "four", "five"], "train"),
                self._record("sub/b.png", ["b"], "train"),  # 75e5a71e997df603 -> 46
            ],
        )
        first = f"'a.png' at {path}, line 2; its captions are kept with image a.png"
        self.assertEqual(
            logs.output,
            [
                f"WARNING:absl:{path}, line 3: './a.png' names the same file as {first}",
                f"WARNING:absl:{path}, line 4: 'sub/../a.png' names the same file as {first}",
                f"WARNING:absl:{path}, line 6: 'link.png' names the same file as {first}",
                f"WARNING:absl:{path}: kept 3 other name(s) of a file with its first name",
            ],
        )

    def test_warnings_stop_after_ten_and_the_summary_counts_all(self):
        self._images("a.png")
        rows = "".join(f"x{i}.txt,bad\n" for i in range(12))
        path = _write(self._path("captions.csv"), f"image,caption\na.png,ok\n{rows}")
        with self.assertLogs(logger="absl", level="WARNING") as logs:
            folder.read_folder(self.root)
        self.assertLen(logs.output, 11)
        self.assertIn(f"{path}, line 12: names 'x9.txt'", logs.output[9])
        self.assertEqual(
            logs.output[10],
            f"WARNING:absl:{path}: skipped 12 of 13 row(s) (not an image file: 12); the first "
            "10 are logged above",
        )

    @parameterized.named_parameters(
        ("no_images", {}, "images"),
        ("no_file_name", {"images": [{"id": 1}], "annotations": []}, "images[0] has no key"),
        (
            "unknown_image",
            {"images": [], "annotations": [{"image_id": 3, "caption": "c"}]},
            "annotations[0] refers to image_id 3, which 'images' does not list",
        ),
        (
            "repeated_id",
            {"images": [{"id": 1, "file_name": "a.png"}] * 2, "annotations": []},
            "images[1] repeats the id 1 of an earlier entry",
        ),
    )
    def test_coco_schema_errors(self, data, expected):
        path = _write(self._path("annotations", "captions.json"), json.dumps(data))
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        self.assertIn(f"{path}: ", str(cm.exception))
        self.assertIn(expected, str(cm.exception))


class NoCaptionsTest(FolderTest):
    def test_ambiguous_candidates(self):
        _write(self._path("captions.txt"), "image,caption\n")
        _write(self._path("metadata.jsonl"), "")
        _write(self._path("annotations", "captions_val2017.json"), "{}")
        _write(self._path("train", "metadata.jsonl"), "")
        _write(self._path("test", "metadata.csv"), "")
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        self.assertEqual(
            str(cm.exception),
            f"folder: {self.root} holds 4 candidate captions files: metadata.jsonl, "
            "train/metadata.jsonl + test/metadata.csv, captions.txt, "
            "annotations/captions_val2017.json; pass --captions=FILE to name the one to read",
        )

    def test_no_captions_file(self):
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        message = str(cm.exception)
        self.assertStartsWith(
            message, f"folder: {self.root} holds no captions file (it is empty); the layouts"
        )
        for line in (
            '{"file_name": "cat.png", "text": ["a cat sleeps", "a grey cat on a sofa"]}',
            'dog.jpg,"a brown dog, running"',
            '{"images": [{"id": 1, "file_name": "dog.jpg"}],',
        ):
            self.assertIn(f"\n    {line}", message)
        self._images("a.png", "Images/b.png")
        _write(self._path("notes.txt"), "holiday photos")
        with self.assertRaisesRegex(DatasetError, f"^folder: {self.root} holds no captions file;"):
            folder.read_folder(self.root)
        absent = self._path("absent")
        with self.assertRaisesRegex(DatasetError, f"^folder: {absent} is not a folder$"):
            folder.read_folder(absent)

    def test_no_usable_row(self):
        path = _write(self._path("captions.csv"), "image,caption\nnotes.txt,x\na.png, \n")
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        self.assertStartsWith(
            str(cm.exception),
            f"folder: captions.csv in {self.root} gives no image with a caption (2 row(s) "
            "read, 1 skipped); the layouts looked for",
        )
        _write(path, "\n")
        with self.assertRaisesRegex(DatasetError, r"gives no image with a caption \(0 row"):
            folder.read_folder(self.root)

    def test_header_without_image_and_caption_columns(self):
        path = _write(self._path("captions.csv"), "\nname;words\na.png;x\n")
        with self.assertRaises(DatasetError) as cm:
            folder.read_folder(self.root)
        self.assertEqual(
            str(cm.exception),
            f"{path}, line 2: the header 'name;words' has no image column (one of image, "
            "image_name, file_name, filename, file, path, img) and caption column (one of "
            "caption, comment, text, captions, sentence) separated by ',', a tab or '|'",
        )


class SplitTest(absltest.TestCase):
    def test_split_of_by_hand(self):
        self.assertEqual(folder.split_of("a.png"), "train")  # 49
        self.assertEqual(folder.split_of("./a.png"), "train")
        self.assertEqual(folder.split_of("g.png"), "val")  # 88
        self.assertEqual(folder.split_of("photos/0029.jpg"), "val")  # 87
        self.assertEqual(folder.split_of("photos/0015.jpg"), "test")  # 91
        self.assertEqual(folder.split_of("photos/0020.jpg"), "test")  # 97

    def test_proportions_over_a_thousand_names(self):
        names = [f"photos/{i:04d}.jpg" for i in range(1000)]
        counts = {s: 0 for s in ("train", "val", "test")}
        for name in names:
            counts[folder.split_of(name)] += 1
        # Counted with sha256sum over the same names.
        self.assertEqual(counts, {"train": 794, "val": 100, "test": 106})
        # Binomial: 1000 names, three standard deviations (13 for 80 %, 10 for 10 %).
        self.assertAlmostEqual(counts["train"], 800, delta=38)
        self.assertAlmostEqual(counts["val"], 100, delta=28)
        self.assertAlmostEqual(counts["test"], 100, delta=28)


if __name__ == "__main__":
    absltest.main()
