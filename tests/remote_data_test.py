"""Tests for sat_tf.pipelines.remote_data: a user's photo folder and a COCO folder on S3
(moto, in this process) give the records their local copies give, image ids and
fingerprint alike, paths on S3; nothing is downloaded but the caption files and nothing
is left in TMPDIR; a dataset that cannot be read from elsewhere, an empty folder and a
bad caption file are named."""

import dataclasses
import os
import tempfile
from unittest import mock

import tensorflow as tf
from feature_cache_test import write_coco
from fixtures import fake_s3, upload_folder, write_photo_folder

from sat_tf.config import Config
from sat_tf.data import feature_cache
from sat_tf.pipelines import remote_data
from sat_tf.training import extract
from sat_tf.utils import filesystem


class RemoteRecordsTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.bucket = cls.enterClassContext(fake_s3())

    def _same_records(self, config, address):
        local = extract.records_of(config)
        upload_folder(config.data_dir, address)
        temp = os.path.join(self.get_temp_dir(), "tmp")
        os.makedirs(temp)
        read = mock.patch.object(filesystem, "read_bytes", wraps=filesystem.read_bytes)
        with mock.patch.object(tempfile, "tempdir", temp), read as reads:
            remote = remote_data.records_of(dataclasses.replace(config, data_dir=address))
        self.assertEqual(os.listdir(temp), [])
        downloaded = {call.args[0].rsplit("/", 1)[1] for call in reads.call_args_list}
        self.assertFalse([n for n in downloaded if n.endswith(".jpg")], downloaded)
        self.assertLen(remote, len(local))
        for mine, theirs in zip(remote, local, strict=True):
            relative = os.path.relpath(theirs.image_path, config.data_dir).replace(os.sep, "/")
            self.assertEqual(mine, dataclasses.replace(theirs, image_path=f"{address}/{relative}"))
        self.assertEqual(
            feature_cache.records_fingerprint(remote), feature_cache.records_fingerprint(local)
        )
        return downloaded

    def test_a_photo_folder(self):
        folder = write_photo_folder(os.path.join(self.get_temp_dir(), "mine"), count=4)
        config = Config(dataset="folder", data_dir=folder)
        downloaded = self._same_records(config, f"{self.bucket}/mine")
        self.assertEqual(downloaded, {"captions.txt"})

    def test_coco_in_the_official_layout(self):
        folder = os.path.join(self.get_temp_dir(), "coco")
        write_coco(folder, official=True)
        downloaded = self._same_records(Config(dataset="coco", data_dir=folder), f"{self.bucket}/c")
        self.assertEqual(downloaded, {"captions_train2014.json", "captions_val2014.json"})

    def test_what_cannot_be_read_is_named(self):
        with self.assertRaisesRegex(ValueError, "^--dataset=shapes is read from a local"):
            remote_data.records_of(Config(dataset="shapes", data_dir=f"{self.bucket}/s"))
        with self.assertRaisesRegex(ValueError, f"^--data_dir={self.bucket}/none: no file"):
            remote_data.records_of(Config(dataset="folder", data_dir=f"{self.bucket}/none"))
        filesystem.write_bytes(f"{self.bucket}/bad/captions.txt", b"image,caption\n")
        with self.assertRaisesRegex(ValueError, f"{self.bucket}/bad") as raised:
            remote_data.records_of(Config(dataset="folder", data_dir=f"{self.bucket}/bad"))
        self.assertNotIn("sat_dataset_listing_", str(raised.exception))


if __name__ == "__main__":
    tf.test.main()
