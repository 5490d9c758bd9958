"""Tests for sat-caption (sat_tf.cli.caption), run in process (`main(argv)`): a folder with
a corrupt photo, globs and files, its output file, pictures, bombs, README's command and
the default preset (the scripts as a user runs them: scripts_test.py)."""

import dataclasses
import json
import os
import shlex
import shutil
import tempfile

import pytest
import tensorflow as tf
from admission_test import png_bomb
from api_test import flickr8k_photos, made_photo
from cli_test import run_main
from fixtures import MAX_LENGTH, tiny_model

import sat_tf
from sat_tf.cli import caption as caption_cli
from sat_tf.serving import preset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_printed_line(test, line, path, caption):
    """sat-caption's first line for a photo: path, caption, its tag, and the off-world mark."""
    tag = f"  [tag: {caption.tag}, {caption.tag_prob:.2f}]" if caption.tag else ""
    test.assertStartsWith(line, f"{path}: {caption.text}{tag}")
    test.assertEqual("[off-world photo: score" in line, caption.off_world, line)


def photo_folder(test_class, count):
    """(a scratch folder removed after the class, its photos/ folder of `count` photos:
    the first two Flickr8k test photos where the data is there, drawn ones for the rest)."""
    root = tempfile.mkdtemp()
    test_class.addClassCleanup(shutil.rmtree, root, ignore_errors=True)
    folder = os.path.join(root, "photos")
    os.makedirs(folder)
    photos = flickr8k_photos(2) or []
    for i, path in enumerate(photos):
        shutil.copy(path, os.path.join(folder, f"p{i}.jpg"))
    for i in range(len(photos), count):
        made_photo(os.path.join(folder, f"p{i}.png"), i)
    return root, folder


@pytest.mark.long(8)
class CaptionCommandTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir, cls.folder = photo_folder(cls, 3)
        cls.bad = os.path.join(cls.folder, "p1_broken.jpg")
        with open(cls.bad, "wb") as f:
            f.write(b"\xff\xd8\xff\xe0 this JPEG ends here")
        with open(os.path.join(cls.folder, "notes.txt"), "w", encoding="utf-8") as f:
            f.write("not an image and not named like one: left out of a folder\n")
        cls.good = sorted(
            os.path.join(cls.folder, n) for n in os.listdir(cls.folder) if n.startswith("p")
        )
        cls.good.remove(cls.bad)
        # What the command does with its inputs does not depend on the model: a tiny
        # one, saved as a preset folder, captions them (README's command and the default
        # preset: the shipped presets).
        cls.preset = os.path.join(cls.dir, "tiny_preset")
        model, vocab, settings = tiny_model()
        preset.save(model, vocab, settings, cls.preset, name="tiny")
        cls.captioner = sat_tf.Captioner.from_preset(cls.preset)

    def test_folder_with_a_corrupt_photo(self):
        output = os.path.join(self.dir, "out", "captions.jsonl")
        code, stdout, stderr = run_main(
            caption_cli.main,
            "sat-caption",
            self.folder,
            f"--preset={self.preset}",
            f"--output={output}",
            "--beam_size=1",
            "--batch_size=2",
        )
        self.assertEqual(code, caption_cli.SKIPPED)
        self.assertEqual(caption_cli.SKIPPED, 2)
        with open(output, encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        want = self.captioner.caption(self.good, beam_size=1)
        self.assertEqual([r["path"] for r in records], self.good)
        self.assertEqual([set(r) for r in records], [{"path", "caption", "tokens", "score"}] * 3)
        vocab = self.captioner.vocab
        for record, caption in zip(records, want, strict=True):
            self.assertEqual(record["caption"], caption.text)
            self.assertEqual(" ".join(vocab.decode(record["tokens"])), record["caption"])
            self.assertAllClose(record["score"], caption.score, rtol=1e-5)
            self.assertIn(f"{record['path']}: {record['caption']}\n", stdout)
        lines = stderr.splitlines()
        # Names sorted: p0, p1_broken, p1 / p2 ... in batches of two, then the summary.
        errors = [line for line in lines if line.startswith("error: ")]
        self.assertLen(errors, 2)
        self.assertRegex(
            errors[0], rf"^error: {self.bad} \(\d+ bytes\) is a truncated or corrupt JPEG file$"
        )
        self.assertEqual(errors[1], "error: 1 of 4 inputs not captioned (named above)")
        self.assertEqual(
            [line for line in lines if "/" in line and ":" not in line], ["2/4", "4/4"]
        )

    def test_globs_and_files(self):
        pattern = os.path.join(self.folder, "p[0-9].*")
        missing = os.path.join(self.dir, "none", "*.jpg")
        code, stdout, stderr = run_main(
            caption_cli.main,
            "sat-caption",
            pattern,
            missing,
            f"--preset={self.preset}",
            "--beam_size=1",
        )
        self.assertEqual(code, 2)
        self.assertIn(f"error: no file matches {missing!r}", stderr)
        want = self.captioner.caption(self.good, beam_size=1)
        printed = [line for line in stdout.splitlines() if line.startswith(self.folder)]
        self.assertEqual(printed, [f"{p}: {c.text}" for p, c in zip(self.good, want, strict=True)])

    def test_one_photo_no_progress_exit_0(self):
        code, stdout, stderr = run_main(
            caption_cli.main, "sat-caption", self.good[0], f"--preset={self.preset}"
        )
        self.assertEqual(code, 0, stderr)
        self.assertEqual(stderr.strip(), "")
        (want,) = self.captioner.caption(self.good[0])
        self.assertStartsWith(stdout, f"{self.good[0]}: {want.text}\n")

    def test_readme_command(self):
        # README's first sat-caption command, as written, from the photo's folder.
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            command = next(line for line in f if line.startswith("sat-caption photo.jpg"))
        args = shlex.split(command)
        self.assertEqual(args[:2], ["sat-caption", "photo.jpg"])
        (name,) = [a.split("=", 1)[1] for a in args if a.startswith("--preset=")]
        shutil.copy(self.good[0], os.path.join(self.dir, "photo.jpg"))
        code, stdout, stderr = run_main(caption_cli.main, *args, cwd=self.dir)
        self.assertEqual(code, 0, stderr)
        (want,) = sat_tf.Captioner.from_preset(name).caption(os.path.join(self.dir, "photo.jpg"))
        assert_printed_line(self, stdout.splitlines()[0], "photo.jpg", want)
        if any(a.startswith("--visualize=") for a in args):
            self.assertNotEmpty(os.listdir(os.path.join(self.dir, "pictures")))

    def caption(self, *args, cwd=None):
        return run_main(caption_cli.main, "sat-caption", *args, f"--preset={self.preset}", cwd=cwd)

    def test_an_existing_output_is_kept_when_nothing_was_captioned(self):
        output = os.path.join(self.dir, "kept", "captions.jsonl")
        os.makedirs(os.path.dirname(output))
        with open(output, "w", encoding="utf-8") as f:
            f.write("earlier results\n")
        code, _, stderr = self.caption(os.path.join(self.dir, "mistyped.jpg"), f"--output={output}")
        self.assertEqual(code, caption_cli.SKIPPED)
        with open(output, encoding="utf-8") as f:
            self.assertEqual(f.read(), "earlier results\n")
        self.assertIn(f"error: nothing captioned; {output} is left as it was", stderr)
        self.assertEqual(os.listdir(os.path.dirname(output)), ["captions.jsonl"])
        code, _, _ = self.caption(self.good[0], f"--output={output}")
        with open(output, encoding="utf-8") as f:
            self.assertEqual([json.loads(line)["path"] for line in f], [self.good[0]])
        self.assertEqual(os.listdir(os.path.dirname(output)), ["captions.jsonl"])

    def test_inputs_sharing_a_name_get_a_picture_each(self):
        folder = os.path.join(self.dir, "same_names")
        for i, sub in enumerate(("a", "b")):
            os.makedirs(os.path.join(folder, sub))
            made_photo(os.path.join(folder, sub, "img.png"), 10 + i)
        made_photo(os.path.join(folder, "other.png"), 12)
        pictures = os.path.join(self.dir, "pictures_same")
        code, stdout, stderr = self.caption(
            "a/img.png", "b/img.png", "other.png", f"--visualize={pictures}", cwd=folder
        )
        self.assertEqual(code, 0, stderr)
        self.assertEqual(
            sorted(os.listdir(pictures)),
            ["a_img_png_attention.png", "b_img_png_attention.png", "other_attention.png"],
        )
        self.assertEqual(
            caption_cli.picture_names(["x/a.jpg", "y/a.jpg", "x_a_jpg.png", "z.png"]),
            {
                "x/a.jpg": "x_a_jpg_attention.png",
                "y/a.jpg": "y_a_jpg_attention.png",
                "x_a_jpg.png": "x_a_jpg_2_attention.png",
                "z.png": "z_attention.png",
            },
        )

    def test_overlapping_files_folders_and_globs_caption_each_image_once(self):
        relative = os.path.relpath(self.good[0], self.dir)
        code, stdout, stderr = self.caption(
            self.folder, os.path.join(self.folder, "p[0-9].*"), f"./{relative}", cwd=self.dir
        )
        self.assertEqual(code, caption_cli.SKIPPED)  # the broken photo, once
        printed = [
            line.split(":")[0] for line in stdout.splitlines() if ".jp" in line or ".pn" in line
        ]
        self.assertEqual(printed, self.good)
        self.assertEqual(stderr.count(self.bad), 1)

    def test_a_bomb_is_refused_from_its_header_and_the_others_captioned(self):
        bomb = os.path.join(self.dir, "bomb.png")
        with open(bomb, "wb") as f:
            f.write(png_bomb())
        code, stdout, stderr = self.caption(bomb, self.good[0])
        self.assertEqual(code, caption_cli.SKIPPED)
        self.assertIn(
            f"error: {bomb}: 529,000,000 pixels (23000 x 23000) is over the limit of 50,000,000",
            stderr,
        )
        self.assertIn(f"{self.good[0]}: ", stdout)
        code, _, stderr = self.caption(self.good[0], "--max_image_pixels=1000")
        self.assertEqual(code, caption_cli.SKIPPED)
        self.assertIn("pixels", stderr)
        self.assertIn("is over the limit of 1,000; max_image_pixels", stderr)

    def test_the_default_preset_captions_without_flags(self):
        code, stdout, stderr = run_main(caption_cli.main, "sat-caption", self.good[0])
        self.assertEqual(code, 0, stderr)
        (want,) = sat_tf.Captioner.from_preset(caption_cli.DEFAULT_PRESET).caption(self.good[0])
        assert_printed_line(self, stdout.splitlines()[0], self.good[0], want)
        self.assertIn(caption_cli.DEFAULT_PRESET, caption_cli.__doc__)

    def test_several_captions_are_numbered_and_written(self):
        output = os.path.join(self.dir, "several", "captions.jsonl")
        code, stdout, stderr = self.caption(
            *self.good, "--num_captions=3", "--beam_size=1", f"--output={output}"
        )
        self.assertEqual(code, 0, stderr)
        with open(output, encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        # --beam_size=1 is widened to the three captions asked for.
        want = self.captioner.caption(self.good, beam_size=1, num_captions=3)
        lines = stdout.splitlines()
        for record, captions in zip(records, want, strict=True):
            self.assertEqual([c["caption"] for c in record["captions"]], [c.text for c in captions])
            self.assertAllClose(
                [c["score"] for c in record["captions"]], [c.score for c in captions]
            )
            self.assertEqual(
                (record["caption"], record["score"]), tuple(record["captions"][0].values())
            )
            at = lines.index(f"{record['path']}: {record['caption']}")
            for number, caption in enumerate(captions, 1):
                self.assertStartsWith(lines[at + number], f"  {number}. {caption.text}  (log p -")

    def test_drawn_captions_repeat_with_their_seed(self):
        def drawn(*flags):
            output = os.path.join(self.dir, "drawn.jsonl")
            code, _, stderr = self.caption(*self.good, "--sample", *flags, f"--output={output}")
            self.assertEqual(code, 0, stderr)
            with open(output, encoding="utf-8") as f:
                return [json.loads(line) for line in f]

        first = drawn("--num_captions=4", "--seed=4", "--temperature=2", "--batch_size=2")
        self.assertEqual(
            drawn("--num_captions=4", "--seed=4", "--temperature=2", "--batch_size=2"), first
        )
        other = drawn("--num_captions=4", "--seed=5", "--temperature=2", "--batch_size=2")
        self.assertNotEqual([r["captions"] for r in other], [r["captions"] for r in first])
        texts = [[c["caption"] for c in r["captions"]] for r in first]
        scores = self.captioner.score([r["path"] for r in first], texts)
        for record, got in zip(first, scores, strict=True):
            want = [c["score"] for c in record["captions"]]
            self.assertEqual(want, sorted(want, reverse=True))
            for caption, score in zip(record["captions"], got, strict=True):
                # A caption cut at the length limit has no `<end>` in its score.
                if len(caption["caption"].split()) < MAX_LENGTH:
                    self.assertAllClose(score, caption["score"], atol=1e-3)
        # Towards temperature 0: the greedy caption.
        (greedy,) = self.captioner.caption([self.good[0]], beam_size=1)
        code, stdout, _ = self.caption(self.good[0], "--sample", "--temperature=1e-6")
        self.assertStartsWith(stdout, f"{self.good[0]}: {greedy.text}\n")

    def test_decoding_flags_that_do_not_fit_exit_1(self):
        cases = {
            ("--temperature=0.5",): "--temperature draw captions: add --sample",
            ("--top_p=0.9", "--seed=3"): "--top_p, --seed draw captions: add --sample",
            (
                "--sample",
                "--beam_size=2",
            ): "--sample draws captions word by word: leave --beam_size out",
            ("--sample", "--temperature=0"): "--temperature=0.0 must be above 0",
            ("--sample", "--top_p=1.5"): r"--top_p=1.5 must lie in (0, 1]",
            ("--sample", "--seed=-2"): "--seed=-2 must be at least 0",
            ("--num_captions=0",): "--num_captions=0 must be at least 1",
        }
        for flags, message in cases.items():
            code, _, stderr = self.caption(self.good[0], *flags)
            self.assertEqual(code, 1, flags)
            self.assertEqual(stderr.strip(), f"error: {message}", flags)

    def test_no_arguments_and_bad_flags_exit_1(self):
        code, _, stderr = run_main(caption_cli.main, "sat-caption", f"--preset={self.preset}")
        self.assertEqual(
            (code, stderr.strip()),
            (1, "error: give one or more image files, folders or globs to caption"),
        )
        code, _, stderr = run_main(
            caption_cli.main, "sat-caption", "x.jpg", "--beam_size=0", f"--preset={self.preset}"
        )
        self.assertEqual(code, 1)
        self.assertIn("--beam_size=0 must be at least 1", stderr)


@pytest.mark.long(22)
class RuntimeTest(tf.test.TestCase):
    """--runtime: LiteRT and TensorFlow print and write the same, refuse bad files alike;
    which one `auto` takes."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir, cls.folder = photo_folder(cls, 5)
        bad = {"empty.jpg": b"", "broken.jpg": b"\xff\xd8\xff\xe0 ends here", "text.png": b"hi\n"}
        for name, data in bad.items():
            with open(os.path.join(cls.folder, name), "wb") as f:
                f.write(data)
        cls.preset = os.path.join(cls.dir, "tiny_preset")
        model, vocab, settings = tiny_model()
        preset.save(
            model, vocab, dataclasses.replace(settings, beam_size=2), cls.preset, name="tiny"
        )
        cls.cache = os.path.join(cls.dir, "cache")
        cls.patch = pytest.MonkeyPatch()
        cls.patch.setenv("SAT_TF_CACHE", cls.cache)
        cls.addClassCleanup(cls.patch.undo)

    def caption(self, *args):
        return run_main(caption_cli.main, "sat-caption", *args, f"--preset={self.preset}")

    def test_both_runtimes_print_write_and_refuse_alike(self):
        outputs = {}
        for runtime in ("litert", "tensorflow"):
            output = os.path.join(self.dir, f"{runtime}.jsonl")
            code, stdout, stderr = self.caption(
                self.folder, f"--output={output}", f"--runtime={runtime}", "--batch_size=3"
            )
            self.assertEqual(caption_cli._chosen[0], runtime)
            with open(output, encoding="utf-8") as f:
                rows = [json.loads(line) for line in f]
            outputs[runtime] = code, stdout, stderr.splitlines(), rows
        (code, stdout, stderr, rows), (want_code, want_stdout, want_stderr, want_rows) = (
            outputs["litert"],
            outputs["tensorflow"],
        )
        self.assertEqual(code, caption_cli.SKIPPED)
        self.assertEqual(code, want_code)
        self.assertEqual([line for line in stderr if "LiteRT" not in line], want_stderr)
        self.assertLen([line for line in stderr if line.startswith("error: ")], 4)
        self.assertEqual([set(r) for r in rows], [set(r) for r in want_rows])
        for row, want in zip(rows, want_rows, strict=True):
            self.assertEqual(
                (row["path"], row["caption"], row["tokens"]),
                (want["path"], want["caption"], want["tokens"]),
            )
            self.assertAllClose(row["score"], want["score"], atol=1e-4)
        printed = [line for line in stdout.splitlines() if ": " in line]
        self.assertEqual(printed, [line for line in want_stdout.splitlines() if ": " in line])

    def test_auto_takes_litert_where_its_file_is_built(self):
        photo = os.path.join(self.folder, "p3.png")
        fresh = os.path.join(self.dir, "fresh_cache")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SAT_TF_CACHE", fresh)
            code, _, stderr = self.caption(photo)
            self.assertEqual((code, caption_cli._chosen[0]), (0, "tensorflow"), stderr)
            self.assertFalse(os.path.exists(os.path.join(fresh, "litert")))  # nothing built
            code, stdout, stderr = self.caption(photo, "--runtime=litert")  # builds it
            self.assertEqual((code, caption_cli._chosen[0]), (0, "litert"), stderr)
            code, again, _ = self.caption(photo)
            self.assertEqual((code, caption_cli._chosen[0], again), (0, "litert", stdout))
            # Another decoding than the file's: TensorFlow, the same flags' captions.
            code, _, stderr = self.caption(photo, "--beam_size=1")
            self.assertEqual((code, caption_cli._chosen[0]), (0, "tensorflow"), stderr)


if __name__ == "__main__":
    tf.test.main()
