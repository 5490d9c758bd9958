"""Tests for sat_tf.data.flickr: Flickr8k's and Flickr30k's own files (the token file and
the split files) read into records."""

import os

import tensorflow as tf
from fixtures import karpathy_entry, write_file, write_jpegs, write_karpathy

from sat_tf.data import datasets
from sat_tf.data.datasets import DatasetError, Record


class Flickr8kRawTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()
        self.image_dir = os.path.join(self.root, "Flicker8k_Dataset")
        write_jpegs(self.image_dir, "a_1.jpg", "b_2.jpg", "c_3.jpg", "e_5.jpg", "d_4.jpg")
        self._splits(["a_1.jpg"], ["b_2.jpg"], ["c_3.jpg", "e_5.jpg"])

    def _splits(self, train, dev, test):
        for name, files in (("train", train), ("dev", dev), ("test", test)):
            write_file(
                os.path.join(self.root, f"Flickr_8k.{name}Images.txt"), "\n".join(files) + "\n"
            )

    def _tokens(self, data) -> str:
        return write_file(os.path.join(self.root, "Flickr8k.token.txt"), data)

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


class Flickr30kRawTest(tf.test.TestCase):
    """Flickr30k from `results_20130124.token` and Flickr30k Entities' split files."""

    def setUp(self):
        super().setUp()
        self.root = self.get_temp_dir()
        self.image_dir = os.path.join(self.root, "flickr30k-images")
        write_jpegs(self.image_dir, "1000092795.jpg", "10002456.jpg", "1000268201.jpg")
        # The token file as flickr30k.tar.gz has it: "<name>.jpg#<n>\t<caption>".
        write_file(
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
            write_file(os.path.join(self.root, f"{split}.txt"), ids)

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
        write_karpathy(
            os.path.join(self.root, "dataset_flickr30k.json"),
            [karpathy_entry("10002456.jpg", 7, "test", ["karpathy caption"])],
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
