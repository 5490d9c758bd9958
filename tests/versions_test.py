"""Tests for sat_tf.server.versions: only folders named by ASCII digits that hold
saved_model.pb are versions (temporary names, other scripts' digits, files and big
numbers are not); two folders of one number resolve as TF Serving resolves them; the
three version policies pick what TF Serving's source picks; and a base path on another
file system (TensorFlow's ram://) lists as a local one."""

import os
import tempfile

import tensorflow as tf
from tensorflow_serving.config import file_system_storage_path_source_pb2 as source_pb2

from sat_tf.server import versions

Policy = source_pb2.FileSystemStoragePathSourceConfig.ServableVersionPolicy


def make(base, *names, with_model=True):
    for name in names:
        tf.io.gfile.makedirs(os.path.join(base, name))
        if with_model:
            with tf.io.gfile.GFile(os.path.join(base, name, "saved_model.pb"), "wb") as f:
                f.write(b"")


class ListVersionsTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.base = tempfile.mkdtemp(dir=self.get_temp_dir())

    def test_only_ascii_digit_folders_with_a_model(self):
        make(self.base, "1", "3", "0042", ".5.tmp", "6a", "٩", "١٢", "+7", " 8", ".tmp9-1")
        make(self.base, "2", with_model=False)  # still being copied
        make(self.base, str(2**63))  # past int64
        with open(os.path.join(self.base, "10"), "w") as f:
            f.write("a file, not a folder")
        got = versions.list_versions(self.base)
        self.assertEqual(got, {1: f"{self.base}/1", 3: f"{self.base}/3", 42: f"{self.base}/0042"})

    def test_two_folders_of_one_number(self):
        make(self.base, "3", "03")
        with self.assertLogs("sat_tf.server.versions", "WARNING") as logs:
            got = versions.list_versions(self.base)
        self.assertEqual(got, {3: f"{self.base}/3"})  # "03" < "3": the last by name
        self.assertIn("version 3 of", logs.output[0])

    def test_a_missing_base_path_raises(self):
        with self.assertRaises(tf.errors.NotFoundError):
            versions.list_versions(os.path.join(self.base, "nowhere"))

    def test_another_file_system(self):
        base = "ram://versions_test/sat"
        make(base, "1", "7", ".8.tmp")
        self.assertEqual(versions.list_versions(base), {1: f"{base}/1", 7: f"{base}/7"})


class AspiredVersionsTest(tf.test.TestCase):
    found = {v: f"/m/{v}" for v in (1, 2, 5, 9)}

    def aspired(self, text):
        from google.protobuf import text_format

        return sorted(versions.aspired_versions(text_format.Parse(text, Policy()), self.found))

    def test_latest_is_the_default(self):
        self.assertEqual(self.aspired(""), [9])
        self.assertEqual(self.aspired("latest {}"), [9])
        self.assertEqual(self.aspired("latest { num_versions: 2 }"), [5, 9])
        self.assertEqual(self.aspired("latest { num_versions: 9 }"), [1, 2, 5, 9])

    def test_all(self):
        self.assertEqual(self.aspired("all {}"), [1, 2, 5, 9])

    def test_specific(self):
        with self.assertLogs("sat_tf.server.versions", "WARNING") as logs:
            got = self.aspired("specific { versions: 2 versions: 5 versions: 7 }")
        self.assertEqual(got, [2, 5])
        self.assertIn("version 7 of model  is not in its base path", logs.output[0])

    def test_nothing_found(self):
        self.found = {}
        self.assertEqual(self.aspired(""), [])
        self.assertEqual(self.aspired("all {}"), [])


if __name__ == "__main__":
    tf.test.main()
