"""sat-make-preset of a workdir carries its tag table and off-world statistics, or says
in one line what the preset lacks; `--choose_decoding` keeps the decoding its validation
split chooses and stores the test scores of that decoding."""

import contextlib
import dataclasses
import io
import json
import os

import tensorflow as tf
from fixtures import without_java
from preset_test import tiny_workdir

from sat_tf.cli import make_preset
from sat_tf.config import Config
from sat_tf.serving import inference, preset
from sat_tf.training import decoding_choice, prepare, publish, scoring

COMMANDS = dict(train_command="t", make_command="m")


class CarriedFilesTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = without_java(self)
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


class ChooseDecodingTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = without_java(self)
        publish.make(tiny_workdir(self.root), os.path.join(self.root, "p"), "t", **COMMANDS)
        self.folder = os.path.join(self.root, "p", "t")

    def test_the_preset_keeps_the_validation_choice_and_its_scores(self):
        # What the search chooses, run directly on the preset's validation images.
        model, vocab, before = inference.load_preset(self.folder)
        data = prepare.prepare_data(before, os.path.join(self.root, "data"), vocab=vocab)
        want, tried = decoding_choice.choose(
            model, data.splits["val"], vocab, before, data.objects, model.grid, full=True
        )
        # The case is not the trivial one: the search moves off the preset's decoding.
        self.assertNotEqual(decoding_choice.settings(want), decoding_choice.settings(before))

        argv = ["scripts/make_preset.py", f"--choose_decoding={self.folder}"]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(make_preset.main(argv), 0)
        self.assertIn('"decoding"', out.getvalue())
        metadata = preset.verify(self.folder)
        command = f"python scripts/make_preset.py --choose_decoding={self.folder}"
        self.assertEqual(metadata["rescored_with"], command)
        self.assertEqual(metadata["decoding"]["chosen_with"], command)
        self.assertEqual(metadata["decoding"]["selected_on"], "val_bleu4")

        # config.json: the chosen decoding, every other setting as it was.
        after = Config.load(os.path.join(self.folder, preset.CONFIG_FILE))
        names = [n for n, _ in decoding_choice.SEARCH]
        self.assertEqual(after, dataclasses.replace(before, **{n: getattr(want, n) for n in names}))
        self.assertEqual(metadata["decoding"]["chosen"], decoding_choice.settings(want))
        for key in preset.CHECKED_FIELDS:
            if key in metadata["config"]:
                self.assertEqual(metadata["config"][key], getattr(after, key), key)
        # decoding.json, listed in the metadata, keeps every setting tried.
        self.assertIn(decoding_choice.DECODING_FILE, metadata["files"])
        with open(os.path.join(self.folder, decoding_choice.DECODING_FILE), encoding="utf-8") as f:
            kept = json.load(f)
        self.assertEqual(kept["tried"], json.loads(json.dumps(tried)))
        self.assertEqual(kept["images"], len(data.splits["val"]))
        self.assertIn("coco-caption", kept["tried"][0]["scores"])

        # The stored scores: beams 1 and 3 and the chosen one, each as measured afresh.
        scores = metadata["scores"]
        beams = sorted({*preset.BEAM_SIZES, want.beam_size})
        self.assertEqual(
            sorted(k for k in scores if k.startswith("beam_")), [f"beam_{b}" for b in beams]
        )
        model, vocab, loaded = inference.load_preset(self.folder)
        self.assertEqual(loaded, after)
        outputs = os.path.join(self.root, "outputs")
        fresh = scoring.evaluate_images(model, vocab, loaded, outputs, "test")
        own = publish.stored_scores(metadata, want.beam_size)
        self.assertEqual(publish.score_differences(own, fresh), [])
        self.assertEqual(publish.score_differences(fresh, own), [])

    def test_rescore_and_choose_decoding_exclude_each_other(self):
        argv = ["sat-make-preset", f"--rescore={self.folder}", f"--choose_decoding={self.folder}"]
        with contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(make_preset.main(argv), 1)
        self.assertIn("not both", err.getvalue())


if __name__ == "__main__":
    tf.test.main()
