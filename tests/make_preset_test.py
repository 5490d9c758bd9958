"""Tests for sat_tf.cli.make_preset (sat-make-preset), the command around
`training.publish` (whose making and rescoring of a preset publish_test.py and
preset_test.py test): the command line recorded as typed, the flags passed on, the
summary printed, the archive's digest, the flags a preset needs; and end to end, a run
fine-tuned on a user's folder made a preset that sat-caption and the API caption with."""

import json
import os
import tempfile
from unittest import mock

import tensorflow as tf
from fixtures import run_main, tiny_workdir, without_java, write_photo_folder

import sat_tf
from sat_tf.cli import caption as caption_cli
from sat_tf.cli import make_preset
from sat_tf.cli import train as train_cli
from sat_tf.serving import preset
from sat_tf.training import publish
from sat_tf.training import workdir as workdir_lib

# What publish.make and publish.rescore give back: the scores of every split and beam.
SCORES = {
    "test_beam1": {"BLEU-4": 0.21, "CIDEr": 0.52, "METEOR": 0.2},
    "test_beam3": {"BLEU-4": 0.23, "CIDEr": 0.55, "METEOR": 0.21},
    "val": {"BLEU-4": 0.3, "CIDEr": 0.6},
}


class CommandLineTest(tf.test.TestCase):
    def test_the_command_is_recorded_as_it_would_be_typed_again(self):
        argv = ["scripts/make_preset.py", "--name=a", "--train_command=sat-train --seed=1"]
        self.assertEqual(
            make_preset._command(argv),
            "python scripts/make_preset.py --name=a '--train_command=sat-train --seed=1'",
        )
        self.assertEqual(
            make_preset._command(["/usr/bin/sat-make-preset", "--workdir=w"]),
            "sat-make-preset --workdir=w",
        )


class MakeTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(dir=self.get_temp_dir())
        # The folders the command checks before it runs (publish itself is stood in).
        for folder in ("runs/w", "w", "presets/p1", "d"):
            os.makedirs(os.path.join(self.root, folder))
        for workdir in ("runs/w", "w"):
            with open(os.path.join(self.root, workdir, "config.json"), "w") as f:
                f.write("{}")

    def test_the_flags_go_to_publish_and_the_beam_scores_are_printed(self):
        argv = [
            "sat-make-preset",
            "--workdir=runs/w",
            "--name=p1",
            "--train_command=sat-train --seed=1",
            "--output_root=out/presets",  # nothing is written: publish.make is stood in
            "--description=one line",
        ]
        with mock.patch.object(publish, "make", return_value={"scores": SCORES}) as make:
            code, out, err = run_main(make_preset.main, *argv, cwd=self.root)
        self.assertEqual(code, 0, err)
        make.assert_called_once_with(
            "runs/w",
            "out/presets",
            "p1",
            train_command="sat-train --seed=1",
            make_command="sat-make-preset --workdir=runs/w --name=p1 "
            "'--train_command=sat-train --seed=1' --output_root=out/presets "
            "'--description=one line'",
            data_dir=None,
            description="one line",
            overwrite=False,
        )
        self.assertEqual(
            json.loads(out),
            {
                "preset": os.path.join("out/presets", "p1"),
                "test_beam1": {"BLEU-4": 0.21, "CIDEr": 0.52},
                "test_beam3": {"BLEU-4": 0.23, "CIDEr": 0.55},
            },
        )

    def test_an_archive_prints_its_digest(self):
        archive = os.path.join(self.root, "p1.tar.gz")
        argv = ["sat-make-preset", "--workdir=w", "--name=p1", "--train_command=t"]
        argv += [f"--output_root={self.root}", f"--archive={archive}", "--overwrite"]
        with (
            mock.patch.object(publish, "make", return_value={"scores": SCORES}) as make,
            mock.patch.object(publish, "pack", return_value="ab12") as pack,
        ):
            code, out, err = run_main(make_preset.main, *argv, cwd=self.root)
        self.assertEqual(code, 0, err)
        self.assertTrue(make.call_args.kwargs["overwrite"])
        pack.assert_called_once_with(os.path.join(self.root, "p1"), archive)
        self.assertEndsWith(out, f"archive: {archive}\nsha256: ab12\n")

    def test_rescore_prints_the_beam_scores_and_makes_nothing(self):
        with (
            mock.patch.object(publish, "rescore", return_value={"scores": SCORES}) as rescore,
            mock.patch.object(publish, "make") as make,
        ):
            code, out, err = run_main(
                make_preset.main,
                "sat-make-preset",
                "--rescore=presets/p1",
                "--data_dir=d",
                cwd=self.root,
            )
        self.assertEqual(code, 0, err)
        rescore.assert_called_once_with(
            "presets/p1",
            data_dir="d",
            command="sat-make-preset --rescore=presets/p1 --data_dir=d",
        )
        make.assert_not_called()
        self.assertEqual(json.loads(out), {k: v for k, v in SCORES.items() if "beam" in k})

    def test_the_flags_a_preset_needs_are_named(self):
        with mock.patch.object(publish, "make") as make:
            code, _, err = run_main(make_preset.main, "sat-make-preset", "--workdir=w")
            self.assertEqual(code, 1)
            self.assertIn(
                "error: give --name, --train_command "
                "(or --rescore or --choose_decoding=<preset folder>)",
                err,
            )
            code, _, err = run_main(make_preset.main, "sat-make-preset", "--rescore=p", "extra")
            self.assertEqual(code, 1)
            self.assertIn("error: unexpected arguments: extra", err)
        make.assert_not_called()


class FolderPresetTest(tf.test.TestCase):
    def test_a_run_fine_tuned_on_a_folder_makes_a_preset_that_captions(self):
        root = without_java(self)
        source, _, vocab, _ = tiny_workdir(root)
        workdir_lib.write_best_info(source, vocab, epoch=1)
        data_dir = write_photo_folder(os.path.join(root, "photos"))
        workdir = os.path.join(root, "run")
        train = ["sat-train", "--dataset=folder", f"--data_dir={data_dir}", f"--workdir={workdir}"]
        train += [f"--init_from={source}", "--epochs=1", "--steps_per_epoch=1", "--batch_size=4"]
        train += ["--eval_images=2", "--nochoose_decoding"]
        code, _, err = run_main(train_cli.main, *train)
        self.assertEqual(code, 0, err[-3000:])

        argv = ["sat-make-preset", f"--workdir={workdir}", "--name=my_photos"]
        argv += [f"--train_command={' '.join(train)}", f"--output_root={root}"]
        code, out, err = run_main(make_preset.main, *argv)
        self.assertEqual(code, 0, err[-3000:])
        folder = os.path.join(root, "my_photos")
        self.assertEqual(json.loads(out)["preset"], folder)
        stored = preset.read(folder)
        self.assertEqual((stored.config.dataset, stored.config.data_dir), ("folder", data_dir))
        # The source's words and the one new word seen three times or more (`on`, 5 times).
        self.assertEqual(stored.vocab.words, [*vocab.words, "on"])

        photo = os.path.join(data_dir, "images", "p3.jpg")
        output = os.path.join(root, "captions.jsonl")
        code, _, err = run_main(
            caption_cli.main, "sat-caption", f"--preset={folder}", f"--output={output}", photo
        )
        self.assertEqual(code, 0, err[-3000:])
        with open(output, encoding="utf-8") as f:
            (line,) = [json.loads(text) for text in f]
        (caption,) = sat_tf.Captioner.from_preset(folder).caption([photo])
        self.assertEqual(line["path"], photo)
        self.assertEqual((line["caption"], line["tokens"]), (caption.text, caption.tokens.tolist()))
        self.assertAllClose(line["score"], caption.score, atol=1e-5)
        self.assertNotEmpty(caption.words)


if __name__ == "__main__":
    tf.test.main()
