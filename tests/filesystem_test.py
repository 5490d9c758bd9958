"""Tests for sat_tf.utils.filesystem on a local folder and on S3 as moto fakes it in this
process: the same calls give the same answers, a file elsewhere is written whole (never
seen half-written, no temporary object left), a size comes from the listing, a local
copy is removed after use, a mirror copies only what changed, Beam's filesystem options
are taken apart from a command line, and a missing extra is named."""

import os
import sys
from unittest import mock

import tensorflow as tf
from fixtures import fake_s3

from sat_tf.utils import filesystem


class LocalAndElsewhereTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.bucket = cls.enterClassContext(fake_s3())

    def _same_answers(self, folder):
        self.assertEqual(filesystem.files_in(folder), {})
        filesystem.make_folder(folder)
        path = filesystem.join(folder, "a.bin")
        self.assertFalse(filesystem.exists(path))
        filesystem.write_bytes(path, b"12345")
        filesystem.write_bytes(filesystem.join(folder, "b.json.gz"), b"not gzip")
        self.assertTrue(filesystem.exists(path))
        self.assertEqual(filesystem.size(path), 5)
        self.assertEqual(filesystem.read_bytes(path), b"12345")
        self.assertEqual(filesystem.read_bytes(filesystem.join(folder, "b.json.gz")), b"not gzip")
        self.assertEqual(filesystem.files_in(folder), {"a.bin": 5, "b.json.gz": 8})
        with filesystem.local_file(path) as local:
            with open(local, "rb") as f:
                self.assertEqual(f.read(), b"12345")
        self.assertTrue(os.path.exists(local) == (not filesystem.is_remote(path)))
        filesystem.delete(path)
        self.assertEqual(filesystem.files_in(folder), {"b.json.gz": 8})
        with self.assertRaises(FileNotFoundError):
            filesystem.size(path)

    def test_a_local_folder(self):
        self._same_answers(os.path.join(self.get_temp_dir(), "here"))

    def test_a_folder_on_s3(self):
        self._same_answers(f"{self.bucket}/there")

    def test_a_file_elsewhere_appears_whole_or_not_at_all(self):
        folder = f"{self.bucket}/cache"
        with self.assertRaisesRegex(RuntimeError, "killed"):
            with filesystem.atomic_path(f"{folder}/shard-0.tfrecord") as tmp:
                with open(tmp, "wb") as f:
                    f.write(b"half")
                raise RuntimeError("killed")
        self.assertFalse(os.path.exists(tmp))
        self.assertEqual(filesystem.files_in(folder), {})
        with filesystem.atomic_path(f"{folder}/shard-0.tfrecord") as tmp:
            with open(tmp, "wb") as f:
                f.write(b"whole" * 1000)
            self.assertEqual(filesystem.files_in(folder), {})
        self.assertFalse(os.path.exists(tmp))
        self.assertEqual(filesystem.files_in(folder), {"shard-0.tfrecord": 5000})

    def test_a_mirror_copies_what_changed(self):
        local = os.path.join(self.get_temp_dir(), "copy")
        folder = f"{self.bucket}/f"
        for name, data in (("a", b"1"), ("b", b"22"), ("c", b"333")):
            filesystem.write_bytes(f"{folder}/{name}", data)
        self.assertEqual(filesystem.mirror(folder, local, ["a", "b"]), 2)
        self.assertEqual(sorted(os.listdir(local)), ["a", "b"])
        filesystem.write_bytes(f"{folder}/b", b"4444")
        self.assertEqual(filesystem.mirror(folder, local, ["a", "b", "c"]), 2)
        with open(os.path.join(local, "b"), "rb") as f:
            self.assertEqual(f.read(), b"4444")


class OptionsTest(tf.test.TestCase):
    def test_schemes(self):
        self.assertEqual(filesystem.scheme("s3://b/k"), "s3")
        self.assertEqual(filesystem.scheme("GS://b/k"), "gs")
        self.assertIsNone(filesystem.scheme("file:///tmp/x"))
        self.assertIsNone(filesystem.scheme("runs/x"))
        self.assertIsNone(filesystem.scheme(r"C:\photos\x.jpg"))
        self.assertEqual(filesystem.join("s3://b/f/", "x"), "s3://b/f/x")

    def test_beams_filesystem_options_apart_from_a_command_line(self):
        argv = ["sat-train", "--s3_endpoint_url", "http://h:9", "--feature_dir=s3://b/f"]
        argv += ["--hdfs_host=h", "--s3_disable_ssl", "--epochs", "2"]
        kept, options = filesystem.split_options(argv)
        self.assertEqual(kept, ["sat-train", "--feature_dir=s3://b/f", "--epochs", "2"])
        self.assertEqual(
            options, ["--s3_endpoint_url", "http://h:9", "--hdfs_host=h", "--s3_disable_ssl"]
        )

    def test_a_missing_extra_is_named(self):
        with mock.patch.dict(sys.modules, {"boto3": None}):
            with self.assertRaisesRegex(
                ValueError,
                r"^s3://b/f/index.json: reading and writing s3:// needs Apache Beam's "
                r"filesystems and boto3: pip install 'sat_tf\[beam\]'$",
            ):
                filesystem.exists("s3://b/f/index.json")
        with mock.patch.dict(sys.modules, {"google.cloud.storage": None}):
            with self.assertRaisesRegex(ValueError, r"gs://.*pip install 'sat_tf\[gcp\]'$"):
                filesystem.read_bytes("gs://b/f/index.json")
        with mock.patch.dict(sys.modules, {"apache_beam.io.filesystems": None}):
            with self.assertRaisesRegex(ValueError, r"pip install 'sat_tf\[beam\]'$"):
                filesystem.size("hdfs://h/f")


if __name__ == "__main__":
    tf.test.main()
