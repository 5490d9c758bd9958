"""Tests for sat_tf.serving.litert: which runtime captions (`choose`), the LiteRT
captioner against the TensorFlow one (`api.Captioner`) on a tiny preset with off-world
statistics (captions, scores, attention, the K hypotheses, bad inputs), what it hands to
TensorFlow, that a process captioning with it never imports TensorFlow, and (slow) the
shipped grid preset on Flickr8k photos: the same captions, tags and off-world marks,
scores and attention within 1e-4."""

import os
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from api_test import flickr8k_photos, made_photo
from fixtures import fresh_python, scenes
from litert_cache_test import tiny_preset

import sat_tf
from sat_tf.data import image_io
from sat_tf.serving import api, inference, litert, litert_cache, preset
from sat_tf.serving import off_world as off_world_lib
from sat_tf.serving.captions import Caption

GRID_PRESET = "flickr8k_lite0_grid14_soft"
# Run in a fresh process: captions the photos of argv with a built file's folder.
NO_TENSORFLOW = """
import sys
from sat_tf.serving import litert
captioner = litert.LiteRTCaptioner(sys.argv[1])
print(captioner.caption(sys.argv[2:])[0].text)
"""


def assert_same_captions(test, got, want, atol=1e-4):
    """LiteRT's `Caption`s against TensorFlow's: every field."""
    test.assertLen(got, len(want))
    for g, w in zip(got, want, strict=True):
        test.assertIsInstance(g, Caption)
        test.assertEqual((g.text, g.words, g.tag), (w.text, w.words, w.tag))
        test.assertAllEqual(g.tokens, w.tokens)
        test.assertAllClose(g.score, w.score, atol=atol)
        test.assertEqual(g.attention.shape, w.attention.shape)
        test.assertAllClose(g.attention, w.attention, atol=atol)
        test.assertAllEqual(g.image, w.image)
        for name in ("tag_prob", "off_world_score"):
            if getattr(w, name) is None:
                test.assertIsNone(getattr(g, name))
            else:
                test.assertAllClose(getattr(g, name), getattr(w, name), atol=atol)
        test.assertEqual(g.off_world, w.off_world)


@pytest.mark.long(21)
class TinyPresetTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.cache = os.path.join(cls.root, "cache")
        cls.folder, config = tiny_preset(cls.root, beam_size=3, length_penalty=1.0)
        cls.photos = []
        for i in range(6):
            cls.photos.append(
                made_photo(os.path.join(cls.root, f"p{i}.jpg"), i, (150 + 9 * i, 130))
            )
        # Off-world statistics whose threshold splits the photos.
        encoder = inference.load(cls.folder, kind="preset").model.encoder
        pixels = np.stack([image_io.load_image_file(p, 112, 1.0) for p in cls.photos])
        pooled = off_world_lib.pool(encoder(scenes(7, 24).astype(np.float32))).numpy()
        stats = off_world_lib.fit(pooled, 3)
        held_out = off_world_lib.pool(encoder(pixels)).numpy()
        stats = off_world_lib.calibrate(stats, held_out, 0.5)
        off_world_lib.save(stats, os.path.join(cls.folder, off_world_lib.FILE))
        cls.source = litert.read_source("preset", cls.folder)
        built = litert_cache.build("preset", cls.folder, cls.source.config, cls.cache)
        cls.captioner = litert.LiteRTCaptioner(built, tensorflow=api.tensorflow_loader(cls.source))
        cls.tensorflow = sat_tf.Captioner.from_preset(cls.folder, runtime="tensorflow")

    def test_the_same_captions_as_tensorflow(self):
        got = self.captioner.caption(self.photos)
        want = self.tensorflow.caption(self.photos)
        self.assertGreater(len({c.text for c in want}), 1)
        assert_same_captions(self, got, want)
        self.assertEqual({c.off_world for c in want}, {True, False})
        # Batched over interpreters as one at a time.
        assert_same_captions(self, self.captioner.caption(self.photos[2]), want[2:3])

    def test_every_input_kind(self):
        from PIL import Image

        path = self.photos[0]
        with open(path, "rb") as f:
            data = f.read()
        pixels = np.asarray(Image.open(path))
        for image in (path, data, pixels, Image.open(path), pixels.astype(np.float32)):
            with self.subTest(type(image).__name__):
                self.assertAllClose(
                    self.captioner.load_image(image), self.tensorflow.load_image(image), atol=1e-4
                )

    def test_the_k_hypotheses_are_the_beams(self):
        pixels = np.stack([self.captioner.load_image(p) for p in self.photos[:3]])
        got = self.captioner.caption_pixels(pixels, num_captions=3)
        model, config = self.tensorflow.model, self.tensorflow.config
        want = model.generate(
            {"image": tf.constant(pixels)},
            max_length=config.max_decode_length,
            beam_size=3,
            length_penalty=1.0,
            block_repeats=config.block_repeats,
            num_return=3,
        )
        for i, captions in enumerate(got):
            self.assertBetween(len(captions), 1, 3)
            for j, caption in enumerate(captions):
                n = int(want.length[i][j])
                self.assertAllEqual(caption.tokens, want.tokens[i][j][:n])
                self.assertAllClose(caption.score, want.log_prob[i][j], atol=1e-4)
            self.assertEqual(
                captions[0].text, self.captioner.caption_pixels(pixels[i : i + 1])[0].text
            )
            self.assertEqual(
                [c.score for c in captions], sorted((c.score for c in captions), reverse=True)
            )

    def test_what_litert_cannot_do_goes_to_tensorflow(self):
        want = self.tensorflow.caption(self.photos[:2], beam_size=1)
        assert_same_captions(
            self, self.captioner.caption(self.photos[:2], beam_size=1), want, atol=1e-6
        )
        self.assertIs(self.captioner.model, self.captioner._tensorflow().model)
        (maps,) = self.captioner.attend(self.photos[0], ["a red square"])
        self.assertEqual(maps.shape, (4, 14, 14))
        self.assertFalse(hasattr(self.captioner, "_private"))

    def test_bad_inputs_get_tensorflows_errors(self):
        empty = os.path.join(self.root, "empty.jpg")
        open(empty, "wb").close()
        cut = os.path.join(self.root, "cut.jpg")
        with open(self.photos[0], "rb") as f, open(cut, "wb") as out:
            out.write(f.read()[:300])
        cases = [
            os.path.join(self.root, "missing.jpg"),
            self.root,
            empty,
            cut,
            b"not an image at all",
            np.zeros((4, 4, 2), np.uint8),
            np.full((4, 4, 3), 0.5, np.float32),
            3.5,
        ]
        for image in cases:
            with self.subTest(repr(image)[:40]):
                with self.assertRaises(ValueError) as want:
                    self.tensorflow.caption(image)
                with self.assertRaises(ValueError) as got:
                    self.captioner.caption(image)
                self.assertEqual(str(got.exception), str(want.exception))
                self.assertEqual(type(got.exception), type(want.exception))

    def test_the_api_chooses_the_built_file(self):
        captioner = sat_tf.Captioner.from_preset(self.folder, runtime="litert")
        self.assertEqual(captioner.runtime, "litert")
        self.assertEqual(
            captioner.caption(self.photos[0])[0].text,
            self.tensorflow.caption(self.photos[0])[0].text,
        )
        self.assertNotIsInstance(
            sat_tf.Captioner.from_preset(self.folder, runtime="tensorflow"), litert.LiteRTCaptioner
        )

    def test_no_tensorflow_is_imported(self):
        folder = litert_cache.find(
            litert_cache.fingerprint("preset", self.folder, self.source.config), self.cache
        )
        status, lines, stderr = fresh_python(NO_TENSORFLOW, folder, self.photos[0])
        self.assertEqual(status, 0, stderr[-3000:])
        self.assertEqual(lines[-2], self.tensorflow.caption(self.photos[0])[0].text)
        self.assertEqual(lines[-1], "[]")  # a JPEG: neither TensorFlow nor Pillow


class ChooseTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.cache = self.get_temp_dir()
        self.folder = os.path.join(preset.PRESETS_DIR, GRID_PRESET)
        self.shipped = litert.read_source("preset", GRID_PRESET)

    def test_the_rules(self):
        shipped = self.shipped
        other = shipped._replace(fixed=False)
        choose = lambda runtime, source=shipped, **kw: litert.choose(
            runtime, source, cache_dir=self.cache, **kw
        )[:2]  # noqa: E731
        self.assertTrue(shipped.fixed)
        self.assertEqual(choose("tensorflow"), ("tensorflow", None))
        self.assertEqual(choose("auto"), ("litert", None))  # to be built
        self.assertEqual(choose("auto", build=False), ("tensorflow", None))
        self.assertEqual(choose("auto", own_decoding=False), ("tensorflow", None))
        self.assertEqual(choose("auto", other), ("tensorflow", None))
        self.assertEqual(choose("litert", other), ("litert", None))
        self.assertEqual(choose("auto", needs="--sample"), ("tensorflow", None))
        with self.assertRaisesRegex(
            ValueError, "^--sample needs TensorFlow: leave out --runtime=litert$"
        ):
            choose("litert", needs="--sample")
        with self.assertRaisesRegex(
            ValueError, "--runtime='jax' is not one of auto, litert, tensorflow"
        ):
            choose("jax")
        # A file in the cache is taken whatever made it.
        key = litert_cache.fingerprint("preset", other.directory, other.config)
        built = os.path.join(litert_cache.root(self.cache), key)
        os.makedirs(built)
        open(os.path.join(built, litert_cache.INFO_FILE), "w").close()
        self.assertEqual(choose("auto", other, build=False), ("litert", built))

    def test_without_the_packages(self):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(litert, "missing_packages", lambda: ["ai-edge-litert"])
            runtime, folder, why = litert.choose("auto", self.shipped, cache_dir=self.cache)
            self.assertEqual((runtime, folder), ("tensorflow", None))
            self.assertEqual(
                why,
                "captioning with TensorFlow: LiteRT is not installed (pip install ai-edge-litert)",
            )
            with self.assertRaisesRegex(
                ValueError, "^--runtime=litert needs ai-edge-litert: pip install ai-edge-litert$"
            ):
                litert.choose("litert", self.shipped, cache_dir=self.cache)

    def test_sources(self):
        self.assertEqual(self.shipped.directory, self.folder)
        self.assertEqual(self.shipped.config.beam_size, 3)
        folder = litert.read_source("preset", self.folder)
        self.assertFalse(folder.fixed)  # named by its folder: it can change under the name
        with self.assertRaisesRegex(ValueError, "is not a sat_tf workdir: config.json is missing"):
            litert.read_source("workdir", self.get_temp_dir())
        with self.assertRaisesRegex(ValueError, "unknown preset 'nope'"):
            litert.read_source("preset", "nope")
        # A damaged preset folder is named as loading it with TensorFlow names it.
        damaged = os.path.join(self.get_temp_dir(), "damaged")
        shutil.copytree(self.folder, damaged)
        os.remove(os.path.join(damaged, preset.CONFIG_FILE))
        with self.assertRaisesRegex(ValueError, f"^preset {damaged}: config.json is missing$"):
            litert.read_source("preset", damaged)
        with self.assertRaisesRegex(ValueError, f"^preset {damaged}: config.json is missing$"):
            preset.read(damaged)
        os.remove(os.path.join(damaged, preset.METADATA_FILE))
        with self.assertRaisesRegex(ValueError, "is not a sat_tf preset: metadata.json is missing"):
            litert.read_source("preset", damaged)


@pytest.mark.slow
class ShippedPresetTest(tf.test.TestCase):
    """The grid preset with its tags and off-world statistics, built into a scratch cache."""

    def test_flickr8k_photos_as_tensorflow_captions_them(self):
        photos = flickr8k_photos(12) or []
        real = bool(photos)
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        for i in range(len(photos), 4):
            photos.append(made_photo(os.path.join(root, f"m{i}.png"), i, (240, 320)))
        source = litert.read_source("preset", GRID_PRESET)
        folder = litert_cache.build(
            "preset", source.directory, source.config, os.path.join(root, "cache")
        )
        got = litert.LiteRTCaptioner(folder).caption(photos)
        want = sat_tf.Captioner.from_preset(GRID_PRESET, runtime="tensorflow").caption(photos)
        assert_same_captions(self, got, want)
        if real:  # the tag path was taken (made pictures get no tag)
            self.assertTrue(any(c.tag for c in want))


if __name__ == "__main__":
    tf.test.main()
