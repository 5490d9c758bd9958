"""Tests for the Python API (`sat_tf.Captioner`): on the shipped preset README's three
lines and the captions against the package's own pipeline of `scripts/caption.py` before
the API (inference.load_preset, image_io, make_caption_fn); on a tiny model every input
kind against the file path, batches against one image at a time, refusals, pictures and
`attend` (`sat_tf.load`: inference_test.py)."""

import contextlib
import io
import os
import pathlib
import re
import shutil
import tempfile
import time

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized
from admission_test import png_bomb
from fixtures import scenes, tiny_model
from PIL import Image

import sat_tf
from sat_tf.data import image_io
from sat_tf.data import vocab as vocab_lib
from sat_tf.serving import inference, tags
from sat_tf.serving.inference import feature_encoder
from sat_tf.serving.tags import TagRow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLICKR8K = os.environ.get("SAT_TF_FLICKR8K", os.path.join(ROOT, "..", "shared", "data", "flickr8k"))
PRESET = "flickr8k_lite0_soft"


def readme_lines():
    """README's three Python lines (the first python block), as they are written, and
    the preset they name."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    (name,) = re.findall(r'from_preset\("([^"]+)"\)', block)
    return block, name


def flickr8k_photos(count):
    """The first `count` Flickr8k test photos, or None without the data."""
    listing = os.path.join(FLICKR8K, "Flickr_8k.testImages.txt")
    if not os.path.exists(listing):
        return None
    with open(listing, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()][:count]
    paths = [os.path.join(FLICKR8K, "Flicker8k_Dataset", name) for name in names]
    return paths if all(os.path.exists(p) for p in paths) else None


def made_photo(path, seed=0, size=(180, 240)):
    """A photo-like picture (smooth colour fields, a bright disc) saved at `path`."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[: size[0], : size[1]] / np.array(size).reshape(2, 1, 1)
    pixels = np.stack([x, y, 1 - x * y], -1) * rng.uniform(80, 250, 3)
    cy, cx = rng.uniform(0.3, 0.7, 2)
    pixels[(y - cy) ** 2 + (x - cx) ** 2 < 0.03] = rng.uniform(0, 255, 3)
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path)
    return path


def pipeline_words(model, vocab, config, paths, beam_size):
    """The captions of `paths` by the steps scripts/caption.py took before the API."""
    crop = config.effective_crop_fraction
    images = np.stack([image_io.load_image_file(p, config.image_size, crop) for p in paths])
    encoder = feature_encoder(model, config) if model.encoder is None else None
    out = inference.make_caption_fn(model, config, beam_size, encoder)({"image": images})
    return [vocab.decode(out.tokens[i][: int(out.length[i])].numpy()) for i in range(len(paths))]


def input_kinds(path):
    """{kind: the image at `path` as that kind of input}."""
    with open(path, "rb") as f:
        data = f.read()
    pil = Image.open(path)
    array = np.asarray(pil.convert("RGB"))
    rgba = np.concatenate([array, np.full(array.shape[:2] + (1,), 7, np.uint8)], -1)
    return {
        "str": path,
        "Path": pathlib.Path(path),
        "bytes": data,
        "PIL": pil,
        "uint8": array,
        "float": array.astype(np.float32),
        "float64": array.astype(np.float64),
        "rgba": rgba,
    }


class CaptionerTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.captioner = sat_tf.Captioner.from_preset(PRESET)
        cls.pngs = [made_photo(os.path.join(cls.dir, f"made_{i}.png"), i) for i in range(3)]

    def test_readme_three_lines(self):
        photos = flickr8k_photos(1)
        cwd = os.getcwd()
        os.chdir(self.dir)
        try:
            if photos:
                shutil.copy(photos[0], "photo.jpg")
            else:
                Image.open(self.pngs[0]).convert("RGB").save("photo.jpg", quality=95)
            lines, name = readme_lines()
            self.assertLen(lines.strip().splitlines(), 3)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(lines, {})
            model, vocab, config = inference.load_preset(name)
            want = pipeline_words(model, vocab, config, ["photo.jpg"], config.beam_size)[0]
        finally:
            os.chdir(cwd)
        self.assertNotEmpty(want)
        self.assertEqual(printed.getvalue(), " ".join(want) + "\n")

    def test_caption_fields(self):
        (caption,) = self.captioner.caption(self.pngs[0])
        n = len(caption.words)
        self.assertEqual(caption.text, " ".join(caption.words))
        self.assertEqual(caption.words, self.captioner.vocab.decode(caption.tokens))
        self.assertEqual(caption.tokens.shape, (n,))
        self.assertEqual(caption.tokens.dtype, np.int32)
        height, width = self.captioner.grid
        self.assertIn(caption.attention.shape, [(n, height, width), (n + 1, height, width)])
        # Every map is a softmax over the grid (paper §4).
        self.assertAllClose(caption.attention.sum(axis=(1, 2)), np.ones(len(caption.attention)))
        self.assertLess(caption.score, 0.0)
        size = self.captioner.image_size
        self.assertEqual(caption.image.shape, (size, size, 3))
        self.assertEqual(caption.image.dtype, np.uint8)

    def test_the_captions_of_the_pipeline(self):
        c = self.captioner
        for beam in (1, 3):
            got = [x.words for x in c.caption(self.pngs, beam_size=beam)]
            want = pipeline_words(c.model, c.vocab, c.config, self.pngs, beam)
            self.assertEqual(got, want, f"beam {beam}")

    def test_every_input_kind_of_a_jpeg_photo(self):
        photos = flickr8k_photos(1)
        if not photos:
            self.skipTest(f"no Flickr8k test photo under {os.path.abspath(FLICKR8K)}")
        # TensorFlow's JPEG decoder (its default IDCT) and PIL's differ by a few levels
        # per pixel: the same caption, scores within a small margin.
        kinds = input_kinds(photos[0])
        (want,) = self.captioner.caption(photos[0])
        got = self.captioner.caption(list(kinds.values()))
        for name, caption in zip(kinds, got, strict=True):
            self.assertEqual(caption.text, want.text, name)


class TinyCaptionerTest(tf.test.TestCase):
    """What the API does with its inputs, batches and captions, on a tiny model (the
    shipped preset's own captions: CaptionerTest)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.captioner = sat_tf.Captioner(*tiny_model())
        cls.pngs = [made_photo(os.path.join(cls.dir, f"made_{i}.png"), i) for i in range(3)]

    def test_every_input_kind_gives_the_caption_of_the_path(self):
        # PNG decodes to the same pixels with TensorFlow and PIL: the same numbers.
        kinds = input_kinds(self.pngs[1])
        (want,) = self.captioner.caption(self.pngs[1], beam_size=1)
        for name, image in kinds.items():
            (got,) = self.captioner.caption(image, beam_size=1)
            self.assertEqual(got.text, want.text, name)
            self.assertAllEqual(got.tokens, want.tokens, msg=name)
            self.assertAllClose(got.score, want.score, msg=name)
            self.assertAllClose(got.attention, want.attention, msg=name)
        got = self.captioner.caption(list(kinds.values()), beam_size=1)
        self.assertEqual([c.text for c in got], [want.text] * len(kinds))

    def test_batches_equal_one_image_at_a_time(self):
        photos = (flickr8k_photos(3) or []) + self.pngs
        captioner = sat_tf.Captioner(*tiny_model(), batch_size=2)
        for beam in (1, 3):
            together = self.captioner.caption(photos, beam_size=beam)
            self.assertGreater(len({c.text for c in together}), 1)  # rows that could mix
            # Batches of two (a last one of one) with beam 3 only: its state is the one
            # that grows with the batch (B x beam rows).
            in_twos = captioner.caption(photos, beam_size=beam) if beam == 3 else []
            for i, path in enumerate(photos):
                (alone,) = self.captioner.caption(path, beam_size=beam)
                for batched in (together[i], *in_twos[i : i + 1]):
                    self.assertEqual(batched.text, alone.text, path)
                    self.assertAllClose(batched.score, alone.score, rtol=1e-4, msg=path)
                    self.assertAllClose(batched.attention, alone.attention, atol=1e-4)

    def test_grayscale_is_converted(self):
        gray = np.asarray(Image.open(self.pngs[2]).convert("L"))
        three = np.stack([gray] * 3, -1)
        (want,) = self.captioner.caption(three, beam_size=1)
        for image in (gray, gray[..., None], Image.fromarray(gray)):
            (got,) = self.captioner.caption(image, beam_size=1)
            self.assertAllEqual(got.tokens, want.tokens)

    def test_bad_input_names_the_image(self):
        bad = {
            "missing": (os.path.join(self.dir, "nope.jpg"), r"nope\.jpg' does not exist"),
            "garbage bytes": (
                b"not an image",
                r"^image 1 of the batch \(12 bytes\) is text, not a JPEG, PNG, GIF, BMP or WebP",
            ),
            "empty bytes": (b"", r"^image 1 of the batch is empty \(0 bytes\)$"),
            "unit floats": (np.full((8, 8, 3), 0.5), r"\[0, 1\] \(multiply by 255\)"),
            "negative": (np.full((8, 8, 3), -1.0), r"must lie in \[0, 255\]"),
            "shape": (np.zeros((8, 8, 2), np.uint8), r"got shape \(8, 8, 2\)"),
            "type": (3.0, r"give a file path, bytes, a PIL image or a numpy array"),
        }
        for name, (image, message) in bad.items():
            with self.assertRaisesRegex(ValueError, message, msg=name):
                self.captioner.caption([self.pngs[0], image])

    def test_bombs_and_broken_files_are_refused_in_the_package_words(self):
        bomb = os.path.join(self.dir, "bomb.png")
        with open(bomb, "wb") as f:
            f.write(png_bomb())
        with open(self.pngs[0], "rb") as f:
            cut = f.read()[:60]
        cases = {
            bomb: rf"^{bomb}: 529,000,000 pixels \(23000 x 23000\) is over the limit of 50,000,000",
            png_bomb(): r"^image 0 of the batch: 529,000,000 pixels",
            cut: r"^image 0 of the batch \(60 bytes\) is a truncated or corrupt PNG file$",
            b"II*\0" + bytes(100): r"is a TIFF image, not a JPEG",
            b"<svg xmlns='http://www.w3.org/2000/svg'/>": r"is an SVG drawing, not a JPEG",
        }
        for image, message in cases.items():
            start = time.perf_counter()
            with self.assertRaisesRegex(ValueError, message) as caught:
                self.captioner.caption(image)
            self.assertLess(time.perf_counter() - start, 5)
            for internal in ("{{function_node", "[Op:", "\n"):
                self.assertNotIn(internal, str(caught.exception))
        small = sat_tf.Captioner(
            self.captioner.model, self.captioner.vocab, self.captioner.config, max_image_pixels=10
        )
        with self.assertRaisesRegex(ValueError, r"is over the limit of 10; max_image_pixels"):
            small.caption(self.pngs[0])
        with self.assertRaisesRegex(ValueError, "beam_size=0 must be at least 1"):
            self.captioner.caption(self.pngs[0], beam_size=0)
        self.assertEqual(self.captioner.caption([]), [])

    def test_attention_figure_has_a_panel_per_word(self):
        (caption,) = self.captioner.caption(self.pngs[0], beam_size=1)
        path = os.path.join(self.dir, "figure.png")
        picture = self.captioner.attention_figure(caption, path)
        self.assertAllEqual(np.asarray(Image.open(path).convert("RGB")), picture)
        # visualize.attention_figure: 220 x 240 pixels a panel, 5 panels a row, the
        # image first, then one per map.
        panels = 1 + len(caption.attention)
        self.assertEqual(picture.shape, (240 * -(-panels // 5), 220 * min(5, panels), 3))

    def test_attend_to_its_own_caption_gives_its_attention(self):
        # Teacher forcing on the words greedy decoding chose runs the same steps.
        (caption,) = self.captioner.caption(self.pngs[0], beam_size=1)
        (maps,) = self.captioner.attend(self.pngs[0], [caption.words])
        self.assertEqual(maps.shape, (len(caption.words) + 1, *self.captioner.grid))
        self.assertAllClose(maps, caption.attention, atol=1e-5)
        # A text is split as in training; a word outside the vocabulary is read as <unk>.
        text, unknown, spelled = self.captioner.attend(
            self.pngs[0], ["A dog, running!", ["a", "zzzq"], ["a", "<unk>"]]
        )
        self.assertEqual(text.shape, (4, *self.captioner.grid))
        self.assertAllClose(unknown, spelled)
        self.assertEqual(self.captioner.attend(self.pngs[0], []), [])


def ranking(caption, length_penalty):
    """The beam's ranking of a caption: its score over ((5 + n) / 6)^α, n its tokens."""
    return caption.score / ((5.0 + len(caption.attention)) / 6.0) ** length_penalty


class SeveralCaptionsTest(tf.test.TestCase, parameterized.TestCase):
    """`caption(num_captions=k)`, drawn captions and `score` on a tiny model, with and
    without a tag to say (the shipped preset on 50 Flickr8k photos: FlickrSeveralCaptionsTest)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        model, vocab, config = tiny_model()
        cls.images = list(scenes(0, 4))
        cls.captioner = sat_tf.Captioner(model, vocab, config, batch_size=3)
        tagged, tag_vocab, tag_config = tiny_model()
        rows = [TagRow(0, "n0", "circle", "circle", "")]
        kernel = np.zeros((tagged.feature_dim, 1))
        tagged.tagger = tags.Tagger.from_rows(rows, tag_vocab, kernel, np.zeros(1))
        cls.tagged = sat_tf.Captioner(tagged, tag_vocab, tag_config, batch_size=3)

    @parameterized.parameters(dict(beam=3, k=3), dict(beam=3, k=2), dict(beam=2, k=4))
    def test_the_beams_best_captions(self, beam, k):
        for captioner in (self.captioner, self.tagged):
            length_penalty = captioner.config.length_penalty
            several = captioner.caption(self.images, beam_size=beam, num_captions=k)
            # A beam narrower than k is widened to k: the first is that beam's caption.
            one = captioner.caption(self.images, beam_size=max(beam, k))
            self.assertLen(several, len(self.images))
            for captions, best in zip(several, one, strict=True):
                self.assertIsInstance(captions, list)
                self.assertBetween(len(captions), 1, k)
                self.assertEqual(captions[0].text, best.text)
                self.assertEqual(captions[0].score, best.score)
                self.assertLen({c.text for c in captions}, len(captions))
                ranks = [ranking(c, length_penalty) for c in captions]
                self.assertEqual(ranks, sorted(ranks, reverse=True))
                for caption in captions:
                    self.assertEqual(caption.words, captioner.vocab.decode(caption.tokens))
                    self.assertEqual(caption.tag, best.tag)
                    if caption.tag:
                        self.assertIn(caption.tag, caption.words)
            self.assertTrue(all(len(c) == k for c in several) or captioner is self.tagged)

    def test_one_caption_is_todays(self):
        # num_captions=1 is the default: a `Caption` per image, not a list.
        for captioner in (self.captioner, self.tagged):
            default, one = captioner.caption(self.images), captioner.caption(self.images, None, 1)
            self.assertTrue(all(isinstance(c, sat_tf.Caption) for c in one))
            self.assertEqual([c.text for c in one], [c.text for c in default])

    def test_scores_are_the_models_under_teacher_forcing(self):
        """`score` of every caption the searches and the draws return equals its score;
        a caption of no search gets the sum of its words' and `<end>`'s log-probabilities,
        computed here one step at a time from the decoder's step."""
        for captioner in (self.captioner, self.tagged):
            found = captioner.caption(self.images, beam_size=3, num_captions=3)
            drawn = captioner.caption(self.images, num_captions=3, sample=True, seed=2)
            for returned in (found, drawn):
                texts = [[c.text for c in captions] for captions in returned]
                scores = captioner.score(self.images, texts)
                for captions, got in zip(returned, scores, strict=True):
                    for caption, score in zip(captions, got, strict=True):
                        # A caption cut at the length limit has no `<end>` in its score.
                        if len(caption.attention) == len(caption.words) + 1:
                            self.assertAllClose(score, caption.score, atol=1e-3)
        words = ["a", "big", "red", "circle", "circle"]
        (got,) = self.captioner.score(self.images[0], " ".join(words))
        self.assertAllClose(got, self.step_by_step(self.images[0], words), atol=1e-4)
        (nothing,) = self.captioner.score(self.images[0], "")
        self.assertAllClose(nothing, self.step_by_step(self.images[0], []), atol=1e-4)

    def step_by_step(self, image, words):
        """log p(words, <end>) fed to the decoder's step one word at a time."""
        model, vocab = self.captioner.model, self.captioner.vocab
        features = model.encode({"image": tf.constant(image[None], tf.float32)})
        state = model.decoder.initial_state(features)
        total, previous = 0.0, vocab_lib.START_ID
        for word in [*vocab.ids(words), vocab_lib.END_ID]:
            log_probs, state, _ = model.decoder.step(tf.constant([previous]), state)
            total += float(log_probs[0, word])
            previous = word
        return total

    def test_score_takes_one_text_or_several_per_image(self):
        c, image = self.captioner, self.images[1]
        (one,) = c.score(image, "a red circle")
        (several,) = c.score(image, ["a red circle", "A red circle!", "a blue square"])
        self.assertIsInstance(one, float)
        self.assertAllClose(several[:2], [one, one])  # split as training splits it
        self.assertNotEqual(several[2], one)
        batch = c.score(self.images[:2], ["a red circle", ["a circle", "top"]])
        self.assertEqual(batch[0], c.score(self.images[0], "a red circle")[0])
        self.assertLen(batch[1], 2)
        self.assertEqual(c.score(self.images[:1], [[]]), [[]])

    def test_score_refuses_what_it_cannot_score(self):
        c = self.captioner
        cases = {
            "a red zebra in the dark": (
                self.images[0],
                r"caption 'a red zebra in the dark' of image 0 of the batch \(ndarray\) holds "
                r"words outside the model's vocabulary of 12 words: 'zebra', 'in', 'the', 'dark'$",
            ),
            "count": (self.images[:2], [["a"]], r"2 images take a list of 2 captions .* of 1$"),
            "not text": (self.images[0], [3], r"give a text or a list of texts, not \[3\]"),
            "one text for a batch": (self.images[:2], "a red circle", r"got str$"),
        }
        for name, case in cases.items():
            images, captions, message = case if len(case) == 3 else (case[0], name, case[1])
            with self.assertRaisesRegex(ValueError, message, msg=name):
                c.score(images, captions)

    def test_draws_repeat_with_their_seed(self):
        c = self.captioner
        kwargs = dict(num_captions=4, sample=True, temperature=1.5)
        first = c.caption(self.images, seed=7, **kwargs)
        again, other = (
            c.caption(self.images, seed=7, **kwargs),
            c.caption(self.images, seed=8, **kwargs),
        )
        texts = lambda found: [[x.text for x in captions] for captions in found]  # noqa: E731
        self.assertEqual(texts(first), texts(again))
        self.assertNotEqual(texts(first), texts(other))
        for captions in first:
            self.assertLen(captions, 4)
            scores = [x.score for x in captions]
            self.assertEqual(scores, sorted(scores, reverse=True))
        # A batch of three and one more (batch_size=3): each chunk draws with its own seed.
        self.assertNotEqual(texts(first)[0], texts(first)[3])

    @parameterized.parameters(dict(temperature=1e-6), dict(top_p=1e-6))
    def test_near_greedy_draws_are_the_greedy_caption(self, **drawing):
        # A nucleus of one word leaves a tag out of every step but where it is the most
        # likely word: the tag holds at temperature 0 only.
        for captioner in (self.captioner, self.tagged)[: 1 if "top_p" in drawing else 2]:
            greedy = captioner.caption(self.images, beam_size=1)
            drawn = captioner.caption(self.images, sample=True, seed=3, **drawing)
            self.assertEqual([c.text for c in drawn], [c.text for c in greedy])
            self.assertEqual([c.tag for c in drawn], [c.tag for c in greedy])
            self.assertAllClose([c.score for c in drawn], [c.score for c in greedy])

    def test_bad_decoding_arguments(self):
        image = self.images[0]
        cases = {
            "temperature, top_p and seed draw captions: pass sample=True": dict(temperature=0.5),
            r"seed draw captions": dict(seed=1),
            r"temperature=0 must be a positive number": dict(sample=True, temperature=0),
            r"top_p=1.5 must lie in \(0, 1\]": dict(sample=True, top_p=1.5),
            r"seed=-1 must be a non-negative int": dict(sample=True, seed=-1),
            r"beam_size=3 and sampling": dict(sample=True, beam_size=3),
            r"num_captions=0 must be a positive integer": dict(num_captions=0),
        }
        for message, kwargs in cases.items():
            with self.assertRaisesRegex(ValueError, message, msg=kwargs):
                self.captioner.caption(image, **kwargs)


@pytest.mark.slow
class FlickrSeveralCaptionsTest(tf.test.TestCase):
    """The shipped default preset (beam 3, length penalty 1, tags) on the first 50
    Flickr8k test photos."""

    def test_three_captions_their_scores_and_draws(self):
        photos = flickr8k_photos(50)
        if not photos:
            self.skipTest(f"no Flickr8k test photos under {os.path.abspath(FLICKR8K)}")
        captioner = sat_tf.Captioner.from_preset("flickr8k_lite0_grid14_soft")
        self.assertEqual(captioner.config.beam_size, 3)
        one = captioner.caption(photos)
        three = captioner.caption(photos, num_captions=3)
        scores = captioner.score(photos, [[c.text for c in captions] for captions in three])
        for best, captions, got in zip(one, three, scores, strict=True):
            self.assertLen({c.text for c in captions}, 3)
            self.assertEqual(captions[0].text, best.text)
            ranks = [ranking(c, captioner.config.length_penalty) for c in captions]
            self.assertEqual(ranks, sorted(ranks, reverse=True))
            self.assertAllClose(got, [c.score for c in captions], atol=1e-3)
        greedy = captioner.caption(photos, beam_size=1)
        self.assertGreater(sum(c.tag is not None for c in greedy), 5)  # tags said
        drawn = captioner.caption(photos, sample=True, temperature=1e-6, seed=1)
        self.assertEqual([c.text for c in drawn], [c.text for c in greedy])
        texts = lambda seed: [c.text for c in captioner.caption(photos, sample=True, seed=seed)]  # noqa: E731
        first = texts(5)
        self.assertEqual(texts(5), first)
        self.assertGreater(sum(a != b for a, b in zip(first, texts(6), strict=True)), 40)


class AttendHardTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters("expected", "argmax")
    def test_hard_attention_attends_as_it_decodes(self, hard_decoding):
        model, vocab, config = tiny_model(attention="hard", hard_decoding=hard_decoding)
        self.assertEqual(model.decoder.hard_decoding, hard_decoding)
        captioner = sat_tf.Captioner(model, vocab, config)
        images = list(scenes(0, 4))
        captions = captioner.caption(images, beam_size=1)
        self.assertGreater(len({c.text for c in captions}), 1)
        for image, caption in zip(images, captions, strict=True):
            if len(caption.attention) != len(caption.words) + 1:
                continue  # stopped at the length limit, without <end>
            (maps,) = captioner.attend(image, [caption.words])
            self.assertAllClose(maps, caption.attention, atol=1e-5)


class LazyImportTest(tf.test.TestCase):
    def test_import_sat_tf_does_not_import_tensorflow(self):
        import subprocess
        import sys

        code = "import sys, sat_tf; print('tensorflow' in sys.modules, 'Captioner' in dir(sat_tf))"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        self.assertEqual(done.stdout.split(), ["False", "True"], done.stderr[-2000:])


if __name__ == "__main__":
    tf.test.main()
