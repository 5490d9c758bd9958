"""Tests for the scripts: train.py, caption.py and evaluate.py as a user runs them, through
their commands' `main(argv)` in this process (their flags: flags_lib_test.py)."""

import importlib
import json
import math
import os
import re
import shutil
import tempfile

import numpy as np
import pytest
from absl.testing import absltest, parameterized
from fixtures import run_main, trained_run
from nltk.translate.bleu_score import brevity_penalty, closest_ref_length
from PIL import Image
from pycocoevalcap.bleu.bleu import Bleu

from sat_tf import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_scripts(runs, cwd):
    """Runs `{key: (script, args)}` of scripts/ in this process, one after another, as
    their commands' `main(argv)` (the scripts are shims of them: cli_test).

    Returns:
      {key: (exit code, stdout, stderr lines)}.
    """
    results = {}
    for key, (script, args) in runs.items():
        name = os.path.splitext(script)[0]
        main = importlib.import_module(f"sat_tf.cli.{name}").main
        code, stdout, stderr = run_main(main, f"sat-{name}", *args, cwd=cwd)
        results[key] = (code, stdout, [line for line in stderr.splitlines() if line.strip()])
    return results


class TrainScriptTest(parameterized.TestCase):
    """Runs scripts/train.py's command on bad flags, and for --helpfull."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = tempfile.mkdtemp()
        flagfile = os.path.join(cls.dir, "bad.flags")
        with open(flagfile, "w", encoding="utf-8") as f:
            f.write("--batch_size=4\n--no_such_setting=3\n")
        workdir = f"--workdir={os.path.join(cls.dir, 'run')}"
        runs = {
            "flagfile": [f"--flagfile={flagfile}", workdir],
            "choice": ["--attention=bogus", workdir],
            "value": ["--batch_size=0", workdir],
            "contradiction": ["--attention=none", "--alpha_c=0.01", workdir],
            "help": ["--helpfull"],
            # From a folder without configs/: the name is found in the project's configs/.
            "configs_flagfile": [
                "--flagfile=coco.flags",
                f"--data_dir={os.path.join(cls.dir, 'no_coco')}",
                f"--workdir={os.path.join(cls.dir, 'coco_run')}",
            ],
        }
        cls.results = _run_scripts({key: ("train.py", args) for key, args in runs.items()}, cls.dir)

    @parameterized.parameters("flagfile", "choice", "value", "contradiction")
    def test_bad_flags_stop_with_a_short_message(self, key):
        code, _, lines = self.results[key]
        self.assertNotEqual(code, 0)
        self.assertLessEqual(len(lines), 3, lines)
        self.assertNotIn("Traceback", "\n".join(lines))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "run")))

    def test_unknown_flag_in_flagfile_is_named(self):
        self.assertIn("no_such_setting", "\n".join(self.results["flagfile"][2]))

    def test_bad_choice_names_the_flag_and_the_choices(self):
        message = "\n".join(self.results["choice"][2])
        self.assertIn("--attention=bogus", message)
        for value in config_lib.CHOICES["attention"]:
            self.assertIn(value, message)

    def test_bad_value_is_one_line(self):
        self.assertEqual(self.results["value"][2], ["error: --batch_size=0 must be at least 1"])

    def test_contradiction_is_one_line_naming_both_flags(self):
        code, _, lines = self.results["contradiction"]
        self.assertEqual(code, 1)
        self.assertLen(lines, 1)
        self.assertStartsWith(lines[0], "error: --alpha_c=0.01 contradicts --attention=none: ")
        self.assertIn("soft attention only", lines[0])

    def test_flagfile_found_in_configs(self):
        code, _, lines = self.results["configs_flagfile"]
        text = "\n".join(lines)
        self.assertEqual(code, 1, text)
        self.assertNotIn("flagfile", text)
        # The run read coco.flags (--dataset=coco) and stopped at the missing data.
        self.assertRegex(text, r"(?m)^error: .*coco.*no_coco")

    def test_helpfull_lists_every_field_with_its_help(self):
        text = " ".join(self.results["help"][1].split())
        self.assertIn("--workdir:", text)
        self.assertRegex(text, r"--flagfile=NAME .* looked up in \S*configs")
        for name, _, _, help_text in config_lib.fields_with_help():
            help_text = re.escape(" ".join(help_text.split()))
            self.assertRegex(text, rf"--(\[no\])?{name}: (<[^>]*>: )?{help_text}")


def _panel_cells(picture, panels):
    """Splits a `visualize.attention_figure` picture into its grid cells, in reading order.

    The figure is 2.2 x 2.4 inches per panel at 100 dpi, 5 panels a row: cells of
    220 x 240 pixels. Returns None when the size does not fit `panels` panels.
    """
    cols = min(5, panels)
    rows = math.ceil(panels / cols)
    if picture.shape[:2] != (240 * rows, 220 * cols):
        return None
    return [
        picture[240 * r : 240 * (r + 1), 220 * c : 220 * (c + 1)]
        for r in range(rows)
        for c in range(cols)
    ]


@pytest.mark.long(5)
@pytest.mark.scope_group("trained_run")
class CaptionEvaluateScriptTest(parameterized.TestCase):
    """Runs caption.py and evaluate.py on a copy of the tiny workdir trained by train.py
    (fixtures.trained_run).

    The model has hard attention, so the pictures must outline where it looked.
    """

    MAX_LENGTH = 10

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        run = trained_run()
        if (run.config.attention, run.config.max_decode_length) != ("hard", cls.MAX_LENGTH):
            raise AssertionError(f"the shared run is not hard attention to 10 words: {run.config}")
        cls.workdir = os.path.join(cls.dir, "run")
        shutil.copytree(run.workdir, cls.workdir)
        cls.train_stdout, data_dir = run.stdout, run.data_dir
        # train.py scored the test split too; evaluate.py must write these files itself.
        for name in ("captions_test.json", "metrics_test.json", "table_test.md"):
            if os.path.exists(os.path.join(cls.workdir, name)):
                os.remove(os.path.join(cls.workdir, name))

        with open(os.path.join(data_dir, "dataset_shapes.json"), encoding="utf-8") as f:
            images = [i for i in json.load(f)["images"] if i["split"] == "test"]
        cls.references = {i["imgid"]: [s["raw"] for s in i["sentences"]] for i in images}
        cls.paths = {
            i["imgid"]: os.path.join(data_dir, i["filepath"], i["filename"]) for i in images
        }
        # Three test images under new names: a picture is named after its file.
        cls.images = []
        for imgid in sorted(cls.paths)[:3]:
            path = os.path.join(cls.dir, f"photo_{imgid}.png")
            shutil.copy(cls.paths[imgid], path)
            cls.images.append((imgid, path))
        cls.bad = {
            "missing": os.path.join(cls.dir, "no_such_photo.jpg"),
            "not_an_image": os.path.join(cls.dir, "notes.jpg"),
        }
        with open(cls.bad["not_an_image"], "w", encoding="utf-8") as f:
            f.write("these are my notes, not a picture\n")
        cls.pictures = os.path.join(cls.dir, "pictures")
        workdir = f"--workdir={cls.workdir}"
        paths = [path for _, path in cls.images]
        runs = {
            "greedy": ("caption.py", [*paths, workdir, f"--visualize={cls.pictures}"]),
            "beam": ("caption.py", [*paths[:2], workdir, "--beam_size=2"]),
            "missing": ("caption.py", [cls.bad["missing"], workdir]),
            "not_an_image": ("caption.py", [cls.bad["not_an_image"], workdir]),
            "evaluate": ("evaluate.py", [workdir]),
            "evaluate_expected": (
                "evaluate.py",
                [workdir, "--hard_decoding=expected", "--length_penalty=0.5"],
            ),
        }
        cls.results = _run_scripts(runs, cls.dir)

    def _ok(self, key):
        code, stdout, lines = self.results[key]
        self.assertEqual(code, 0, "\n".join(lines[-20:]))
        return stdout

    def _captions(self, key, paths):
        """The caption lines `path: words` of a caption.py run, one per path in order."""
        stdout = self._ok(key)
        found = [line for line in stdout.splitlines() if line.split(": ")[0] in paths]
        self.assertEqual([line.split(": ")[0] for line in found], list(paths))
        return [line.split(": ", 1)[1].split() for line in found]

    def _read_json(self, name):
        with open(os.path.join(self.workdir, name), encoding="utf-8") as f:
            return json.load(f)

    def test_prints_one_caption_per_image(self):
        captions = self._captions("greedy", [path for _, path in self.images])
        # The run's beam size is 1, as evaluate.py's: the same captions for the same images.
        saved = {r["image_id"]: r["caption"] for r in self._read_json("captions_test.json")}
        for (imgid, _), words in zip(self.images, captions, strict=True):
            self.assertLessEqual(len(words), self.MAX_LENGTH)
            self.assertEqual(" ".join(words), saved[imgid])

    def test_beam_search(self):
        captions = self._captions("beam", [path for _, path in self.images[:2]])
        for words in captions:
            self.assertLessEqual(len(words), self.MAX_LENGTH)

    def test_one_picture_per_image_with_a_panel_per_word(self):
        captions = self._captions("greedy", [path for _, path in self.images])
        names = [f"photo_{imgid}_attention.png" for imgid, _ in self.images]
        self.assertCountEqual(os.listdir(self.pictures), names)
        for name, words in zip(names, captions, strict=True):
            picture = np.asarray(Image.open(os.path.join(self.pictures, name)).convert("RGB"))
            # The image, then a panel per word and one for <end> (none when the caption
            # was cut at the length limit).
            panels = 1 + min(len(words) + 1, self.MAX_LENGTH)
            cells = _panel_cells(picture, panels)
            self.assertIsNotNone(cells, f"{name}: {picture.shape} for {panels} panels")
            for k, cell in enumerate(cells):
                drawn = np.mean(cell.min(-1) < 250)
                if k < panels:
                    self.assertGreater(drawn, 0.5, f"{name}: panel {k}")
                else:
                    self.assertEqual(drawn, 0.0, f"{name}: cell {k} should be empty")

    def test_hard_attention_pictures_outline_the_attended_cell(self):
        # Overlays mix 25% image with grey light (red minus green <= 64), so only the
        # outline is pure red. Panel 0, the image itself, may hold red shapes.
        captions = self._captions("greedy", [path for _, path in self.images])
        for (imgid, _), words in zip(self.images, captions, strict=True):
            name = f"photo_{imgid}_attention.png"
            picture = np.asarray(Image.open(os.path.join(self.pictures, name)).convert("RGB"))
            panels = 1 + min(len(words) + 1, self.MAX_LENGTH)
            cells = _panel_cells(picture, panels)
            self.assertIsNotNone(cells, f"{name}: {picture.shape} for {panels} panels")
            for k, cell in enumerate(cells[1:panels], 1):
                r, g, b = (cell[..., i].astype(int) for i in range(3))
                red = np.sum((r > 200) & (g < 80) & (b < 80))
                self.assertGreater(red, 20, f"{name}: panel {k} has no outline")

    @parameterized.parameters("missing", "not_an_image")
    def test_bad_image_is_one_line_naming_it(self, key):
        code, _, lines = self.results[key]
        self.assertEqual(code, 2)  # sat_tf.cli.caption.SKIPPED
        self.assertLen(lines, 1)
        self.assertStartsWith(lines[0], "error: ")
        self.assertIn(self.bad[key], lines[0])

    def test_evaluate_writes_captions_in_coco_results_format(self):
        self._ok("evaluate")
        results = self._read_json("captions_test.json")
        self.assertIsInstance(results, list)
        for result in results:
            self.assertEqual(set(result), {"image_id", "caption"})
            self.assertIsInstance(result["caption"], str)
        self.assertCountEqual([r["image_id"] for r in results], list(self.references))

    def test_evaluate_writes_every_metric(self):
        self._ok("evaluate")
        scores = self._read_json("metrics_test.json")
        for n in range(1, 5):
            self.assertBetween(scores[f"BLEU-{n}"], 0.0, 1.0)
            self.assertBetween(scores[f"paper BLEU-{n} (no BP)"], 0.0, 1.0)
        self.assertBetween(scores["ROUGE-L"], 0.0, 1.0)
        self.assertBetween(scores["CIDEr"], 0.0, 10.0)
        # METEOR is always reported: a score, or null with the reason (no Java).
        if scores["METEOR"] is not None:
            self.assertBetween(scores["METEOR"], 0.0, 1.0)
        else:
            self.assertIn("java", scores["unavailable"]["METEOR"])
        # The reloaded best weights score the test split as the training run did.
        printed = json.loads(re.search(r"^\{$.*^\}$", self.train_stdout, re.M | re.S)[0])
        self.assertEqual(scores["BLEU-4"], printed["BLEU-4"])
        self.assertEqual(scores["paper BLEU-4 (no BP)"], printed["paper BLEU-4 (no BP)"])

    def test_evaluate_writes_table1(self):
        self._ok("evaluate")
        scores = self._read_json("metrics_test.json")
        with open(os.path.join(self.workdir, "table_test.md"), encoding="utf-8") as f:
            table = f.read()
        self.assertIn("| Model | BLEU-1 | BLEU-2 | BLEU-3 | BLEU-4 | METEOR |", table)
        rows = [line for line in table.splitlines() if line.startswith("| this model")]
        self.assertLen(rows, 2)
        self.assertIn("hard attention, argmax context, additive, beam 1", rows[0])
        paper, coco = ([c.strip() for c in row.split("|")[2:6]] for row in rows)
        for k in range(4):
            self.assertEqual(paper[k], f"{100 * scores[f'paper BLEU-{k + 1} (no BP)']:.1f}")
            self.assertEqual(coco[k], f"{100 * scores[f'BLEU-{k + 1}']:.1f}")

    def test_evaluate_with_other_decoding_settings_writes_its_own_files(self):
        # The run decodes at argmax without a length penalty; the overrides name their
        # results apart, so the run's own stay as evaluate.py wrote them.
        self._ok("evaluate_expected")
        own = self._read_json("metrics_test.json")
        printed = json.loads(re.search(r"^\{$.*^\}$", self.train_stdout, re.M | re.S)[0])
        self.assertEqual(own["BLEU-4"], printed["BLEU-4"])
        scores = self._read_json("metrics_test_lp0.5_expected.json")
        self.assertBetween(scores["BLEU-4"], 0.0, 1.0)
        captions = self._read_json("captions_test_lp0.5_expected.json")
        self.assertCountEqual([r["image_id"] for r in captions], list(self.references))
        path = os.path.join(self.workdir, "table_test_lp0.5_expected.md")
        with open(path, encoding="utf-8") as f:
            self.assertIn(
                "| this model (hard attention, expected context, length penalty 0.5, additive, "
                "beam 1)",
                f.read(),
            )

    def test_evaluate_bleu4_recomputed_from_the_written_captions(self):
        # nltk's corpus_bleu and coco-caption's BLEU differ for an n-gram order without
        # a match (0 against counts guarded by 1e-15) and for captions shorter than n
        # words, both common for this barely trained model. So coco-caption's Bleu
        # scores the files directly, and nltk checks the brevity penalty.
        self._ok("evaluate")
        scores = self._read_json("metrics_test.json")
        hyps = {str(r["image_id"]): r["caption"] for r in self._read_json("captions_test.json")}
        refs = {str(i): captions for i, captions in self.references.items()}
        # Lowercase words: coco-caption's PTB tokenizer leaves these captions unchanged.
        for text in [*hyps.values(), *(r for rs in refs.values() for r in rs)]:
            self.assertRegex(text, r"^([a-z]+( [a-z]+)*)?$")
        bleu, _ = Bleu(4).compute_score(refs, {i: [h] for i, h in hyps.items()}, verbose=0)
        self.assertLessEqual(abs(scores["BLEU-4"] - bleu[3]), 1e-9 * bleu[3])
        lengths = [len(h.split()) for h in hyps.values()]
        ref_length = sum(
            closest_ref_length([r.split() for r in refs[i]], n)
            for i, n in zip(hyps, lengths, strict=True)
        )
        penalty = brevity_penalty(ref_length, sum(lengths))
        expected = scores["paper BLEU-4 (no BP)"] * penalty
        self.assertLessEqual(abs(scores["BLEU-4"] - expected), 1e-6 * expected)


if __name__ == "__main__":
    absltest.main()
