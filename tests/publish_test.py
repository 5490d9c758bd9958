"""sat-make-preset of a workdir carries its tag table and off-world statistics, or says
in one line what the preset lacks."""

import os
import shutil
import tempfile
from unittest import mock

import tensorflow as tf
from preset_test import tiny_workdir

from sat_tf.evaluation import java_tools
from sat_tf.serving import preset
from sat_tf.training import publish

COMMANDS = dict(train_command="t", make_command="m")


class CarriedFilesTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        patch = mock.patch.object(java_tools, "find_java", lambda: None)
        patch.start()
        self.addCleanup(patch.stop)
        self.root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)
        self.workdir = tiny_workdir(self.root)

    def test_a_tag_table_is_carried_and_listed(self):
        table = "class\tword\nn02123045\tcat|kitty\n"
        with open(os.path.join(self.workdir, "tags.tsv"), "w", encoding="utf-8") as f:
            f.write(table)
        with self.assertLogs(level="INFO") as logs:
            metadata = publish.make(self.workdir, os.path.join(self.root, "p"), "t", **COMMANDS)
        folder = os.path.join(self.root, "p", "t")
        with open(os.path.join(folder, "tags.tsv"), encoding="utf-8") as f:
            self.assertEqual(f.read(), table)
        self.assertIn("tags.tsv", metadata["files"])
        self.assertEqual(preset.verify(folder)["files"], metadata["files"])
        said = "\n".join(logs.output)
        self.assertIn("holds no off_world.npz: the preset gives no off-world score", said)
        self.assertNotIn("holds no tags.tsv", said)

    def test_without_them_the_preset_says_what_it_lacks(self):
        with self.assertLogs(level="INFO") as logs:
            metadata = publish.make(self.workdir, os.path.join(self.root, "p"), "t", **COMMANDS)
        self.assertNotIn("tags.tsv", metadata["files"])
        said = "\n".join(logs.output)
        self.assertIn("holds no tags.tsv: the preset captions without tags", said)
        self.assertIn("holds no off_world.npz", said)


if __name__ == "__main__":
    tf.test.main()
