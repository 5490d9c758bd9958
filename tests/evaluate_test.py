"""sat-evaluate with a preset: on its own data its scores are compared with the stored
ones; on a folder of other photos they are that folder's alone."""

import json
import os
import re

import numpy as np
import tensorflow as tf
from fixtures import run_main, scenes, without_java
from PIL import Image
from preset_test import tiny_workdir

from sat_tf.cli import evaluate as evaluate_cli
from sat_tf.training import publish


def _tiny_preset(root):
    """A preset of `preset_test.tiny_workdir`, made in `root`."""
    publish.make(
        tiny_workdir(root),
        os.path.join(root, "presets"),
        "tiny",
        train_command="t",
        make_command="m",
    )
    return os.path.join(root, "presets", "tiny")


def _folder(root, count=3):
    """An imagefolder of `count` photos, all in its test split, captioned 'a red circle'."""
    folder = os.path.join(root, "mine", "test")
    os.makedirs(folder)
    lines = []
    for i, pixels in enumerate(scenes(7, count)):
        Image.fromarray(np.asarray(pixels, np.uint8)).save(os.path.join(folder, f"{i}.png"))
        lines.append(json.dumps({"file_name": f"{i}.png", "text": "a red circle"}))
    with open(os.path.join(folder, "metadata.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return os.path.dirname(folder)


class EvaluatePresetTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = without_java(self)
        self.preset = _tiny_preset(self.root)

    def _evaluate(self, *flags):
        out = os.path.join(self.root, "out")
        code, stdout, stderr = run_main(
            evaluate_cli.main,
            "sat-evaluate",
            f"--preset={self.preset}",
            f"--output_dir={out}",
            *flags,
        )
        self.assertEqual(code, 0, stderr[-2000:])
        scores = json.loads(re.search(r"^\{$.*?^\}$", stdout, re.M | re.S)[0])
        return scores, stdout

    def test_own_data_is_compared_with_the_stored_scores(self):
        _, stdout = self._evaluate("--beam_size=3")
        self.assertIn(
            "the preset's metadata.json stores the scores of test, beam 3: these are equal", stdout
        )

    def test_a_folder_is_scored_alone(self):
        folder = _folder(self.root)
        _, stdout = self._evaluate("--dataset=folder", f"--data_dir={folder}", "--beam_size=3")
        self.assertNotIn("metadata.json stores", stdout)
        with open(
            os.path.join(self.root, "out", "captions_test_beam3.json"), encoding="utf-8"
        ) as f:
            captions = json.load(f)
        self.assertEqual(
            sorted(c["image_id"] for c in captions), ["test/0.png", "test/1.png", "test/2.png"]
        )


if __name__ == "__main__":
    tf.test.main()
