"""Tests for sat_tf.serving.exporting in-process: request checks, captions, the three
signatures."""

import dataclasses
import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized
from admission_test import png_bomb
from fixtures import MAX_LENGTH, WORDS, encode, scenes, tiny_model
from PIL import Image

from sat_tf.config import Config
from sat_tf.data import image_io
from sat_tf.data import vocab as vocab_lib
from sat_tf.model.encoder import ImageEncoder
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import exporting, off_world
from sat_tf.serving.inference import feature_encoder


def traced(model, vocab, spec):
    """The serving functions traced as the export traces them."""
    functions = exporting.serving_functions(model, model.encoder, vocab, spec)
    return {
        name: tf.function(fn, input_signature=signature, autograph=False)
        for name, (fn, signature) in functions.items()
    }


class RequestTest(tf.test.TestCase, parameterized.TestCase):
    def test_join_words(self):
        words = tf.constant(WORDS)
        tokens = tf.constant([[4, 7, 9, 2, 0], [9, 2, 0, 0, 0], [2, 0, 0, 0, 0], [5, 6, 5, 6, 5]])
        length = tf.constant([3, 1, 0, 5])
        captions = exporting.join_words(words, tokens, length).numpy().tolist()
        self.assertEqual(captions, [b"a red circle", b"circle", b"", b"big small big small big"])

    @parameterized.named_parameters(
        ("empty", b"", 1, "image_bytes[1] is empty (0 bytes)"),
        ("text", b"<html>not found</html>", 2, "image_bytes[1] (22 bytes) is not a JPEG, PNG"),
        ("short", b"\x89P", 2, "image_bytes[1] (2 bytes) is not a JPEG, PNG"),
        ("bomb", png_bomb(), 4, "image_bytes[1]: 529,000,000 pixels (23000 x 23000)"),
    )
    def test_bad_bytes_named_by_index(self, bad, status, message):
        good = encode(scenes(0, 1, 16, 16)[0], "PNG")
        pixels, got, error = exporting.decode_images(tf.constant([good, bad, good]), 16, 1.0)
        self.assertAllEqual(got, [0, status, 0])
        self.assertStartsWith(error[1].numpy().decode(), message)
        self.assertAllEqual(pixels[1], tf.zeros([16, 16, 3]))
        self.assertAllClose(pixels[0], image_io.decode_image(good, 16, 1.0))

    def test_truncated_image_has_status_3(self):
        data = encode(scenes(0, 1, 16, 16)[0], "PNG")
        _, status, error = exporting.decode_images(tf.constant([data[: len(data) // 2]]), 16, 1.0)
        self.assertAllEqual(status, [3])
        self.assertIn("is a truncated or corrupt PNG file", error[0].numpy().decode())

    def test_decode_images_converts_every_format_to_rgb(self):
        pixels = np.random.default_rng(3).integers(0, 256, (16, 16, 3), dtype=np.uint8)
        rgba = np.concatenate([pixels, np.full((16, 16, 1), 17, np.uint8)], axis=-1)
        gray = np.repeat(np.asarray(Image.fromarray(pixels).convert("L"))[..., None], 3, -1)
        y, x = np.mgrid[0:16, 0:16]
        smooth = np.stack([12 * x + 20, 12 * y + 30, 5 * (x + y) + 40], -1).astype(np.uint8)
        smooth_gray = np.repeat(np.asarray(Image.fromarray(smooth).convert("L"))[..., None], 3, -1)
        cases = [
            (encode(pixels, "PNG"), pixels, 0),
            (encode(rgba, "PNG"), pixels, 0),
            (encode(pixels, "PNG", mode="L"), gray, 0),
            (encode(pixels, "BMP"), pixels, 0),
            (encode(pixels, "WEBP", lossless=True), pixels, 0),
            (encode(gray, "GIF"), gray, 0),
            (encode(smooth, "JPEG", mode="L", quality=100), smooth_gray, 6),
            (encode(smooth, "JPEG", mode="CMYK", quality=100), smooth, 6),
        ]
        decoded = exporting.decode_images(tf.constant([c[0] for c in cases]), 16, 1.0)[0].numpy()
        self.assertEqual(decoded.shape, (len(cases), 16, 16, 3))
        for got, (_, want, atol) in zip(decoded, cases, strict=True):
            self.assertAllClose(got, want, atol=atol + 1e-3, rtol=0)

    def test_decode_images_mixes_sizes(self):
        images = [scenes(1, 1, 30, 40)[0], scenes(2, 1, 50, 20)[0]]
        data = tf.constant([encode(x, "PNG") for x in images])
        crop = 224 / 256
        got = exporting.decode_images(data, 16, crop)[0]
        resized = [image_io.resize_and_crop(x, 16, crop) for x in images]
        self.assertAllClose(got, tf.stack(resized))

    def test_resize_images_matches_decode_image(self):
        images = scenes(4, 2, 30, 44)
        crop = 224 / 256
        got = exporting.resize_images(tf.constant(images), 16, crop)
        want = [image_io.decode_image(encode(x, "PNG"), 16, crop) for x in images]
        self.assertEqual(got.shape, (2, 16, 16, 3))
        self.assertAllClose(got, tf.stack(want), atol=1e-4)

    def test_resize_images_refuses_empty_images(self):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "size 0x5"):
            exporting.resize_images(tf.zeros([1, 0, 5, 3], tf.uint8), 16, 1.0)


@pytest.mark.long(3)
class SignaturesTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model, cls.vocab, cls.config = tiny_model()
        cls.images = scenes(0, 4)

    def spec(self, beam_size, model=None, config=None):
        model, config = model or self.model, config or self.config
        return exporting.export_spec(model, model.encoder, config, beam_size, MAX_LENGTH)

    @parameterized.parameters(1, 2)
    def test_signatures_match_generate(self, beam_size):
        self._check_signatures(self.model, self.vocab, self.spec(beam_size))

    def test_signatures_with_global_context(self):
        # The decoder's state carries G abar and L_g abar, which beam search tiles and
        # gathers like the rest of it. With seed 7 the four scenes get four captions.
        model, vocab, config = tiny_model(7, global_context=True)
        self.assertTrue(model.decoder.global_context)
        self._check_signatures(model, vocab, self.spec(2, model, config))

    def test_signatures_with_a_learned_start(self):
        # h_0, c_0 do not depend on the image; the exported graphs still caption each
        # scene as `generate` does, its attended context being what tells them apart.
        model, vocab, config = tiny_model(7, start_state="learned")
        self.assertEqual(model.decoder.start_state, "learned")
        self._check_signatures(model, vocab, self.spec(2, model, config))

    def test_signatures_with_a_location_prior(self):
        # The per-cell vectors (random like every decoder weight of `tiny_model`) join
        # the projection once per image; the exported graphs carry them and caption as
        # `generate` does. With seed 2 the four scenes get four captions.
        model, vocab, config = tiny_model(2, location_prior=True)
        place = model.decoder.f_att.location_embedding
        self.assertEqual(place.shape[0], model.grid[0] * model.grid[1])
        self._check_signatures(model, vocab, self.spec(2, model, config))

    def test_signatures_of_hard_attention_decode_with_the_configs_context(self):
        # A decoder built with the expected context, its config saying argmax (as after
        # --hard_decoding=argmax): the graphs attend at the argmax, as `generate` does
        # when told so, and not as the decoder's own.
        model, vocab, config = tiny_model(2, attention="hard", hard_decoding="expected")
        argmax = dataclasses.replace(config, hard_decoding="argmax")
        spec = self.spec(2, model, argmax)
        self.assertEqual(spec.hard_decoding, "argmax")
        self._check_signatures(model, vocab, spec)
        batch = {"image": self.images.astype(np.float32)}
        own = model.generate(batch, max_length=MAX_LENGTH)
        told = model.generate(batch, max_length=MAX_LENGTH, hard_decoding="argmax")
        self.assertNotAllClose(own.attention, told.attention)

    def _check_signatures(self, model, vocab, spec):
        """The captioning signatures give `model.generate`'s captions and maps, and its
        K = beam_size best captions with their log-probabilities."""
        fns = traced(model, vocab, spec)
        pixels = self.images.astype(np.float32)
        decoding = dict(
            max_length=MAX_LENGTH,
            beam_size=spec.beam_size,
            block_repeats=spec.block_repeats,
            bad_ending_ids=spec.bad_ending_ids,
            hard_decoding=spec.hard_decoding,
        )
        want = model.generate({"image": pixels}, **decoding)
        k = spec.beam_size
        best = model.generate({"image": pixels}, **decoding, num_return=k)
        if k == 1:
            best = best._replace(**{f: getattr(best, f)[:, None] for f in exporting._PER_CAPTION})
        features = model.encoder(pixels)
        image_bytes = tf.constant([encode(x, "PNG") for x in self.images])
        outputs = {
            "serving_default": fns["serving_default"](image_bytes),
            "caption_images": fns["caption_images"](tf.constant(self.images)),
            "caption_features": fns["caption_features"](features),
        }
        # A greedy export's caption is its only one: it has no signature of alternatives.
        self.assertCountEqual(fns, [*exporting.SIGNATURES, *[exporting.ALTERNATIVES][: k - 1]])
        if k > 1:
            outputs["caption_alternatives"] = fns["caption_alternatives"](image_bytes)
        captions = [
            " ".join(vocab.decode(t[:n])).encode()
            for t, n in zip(want.tokens.numpy(), want.length.numpy(), strict=True)
        ]
        self.assertGreater(len(set(captions)), 1)
        texts = [
            [" ".join(vocab.decode(t[:n])).encode() for t, n in zip(ts, ns, strict=True)]
            for ts, ns in zip(best.tokens.numpy(), best.length.numpy(), strict=True)
        ]
        for name, got in outputs.items():
            self.assertAllEqual(got["tokens"], want.tokens)
            self.assertAllEqual(got["length"], want.length)
            self.assertAllClose(got["log_prob"], want.log_prob, atol=1e-4)
            attention = tf.reshape(want.attention, [4, MAX_LENGTH, 14, 14])
            self.assertAllClose(got["attention"], attention, atol=1e-5)
            self.assertEqual(got["caption"].numpy().tolist(), captions)
            # The beam's K best, best first: the first column is the caption.
            self.assertEqual(got["captions"].shape, (4, k))
            self.assertEqual(got["captions"].numpy().tolist(), texts, name)
            self.assertAllClose(got["log_probs"], best.log_prob, atol=1e-4)
            self.assertAllEqual(got["captions"][:, 0], got["caption"])
            self.assertAllEqual(got["log_probs"][:, 0], got["log_prob"])
            self.assertEqual("attentions" in got, name == "caption_alternatives")
        if k > 1:
            alternatives, default = outputs["caption_alternatives"], outputs["serving_default"]
            self.assertCountEqual(alternatives, [*default, "attentions"])
            attentions = tf.reshape(best.attention, [4, k, MAX_LENGTH, 14, 14])
            self.assertAllClose(alternatives["attentions"], attentions, atol=1e-5)
            for row in texts:
                self.assertLen(set(row), k)

    def test_a_bad_image_in_either_signature_of_bytes(self):
        fns = traced(self.model, self.vocab, self.spec(2))
        image_bytes = tf.constant([encode(self.images[0], "PNG"), b"no image"])
        default = fns["serving_default"](image_bytes)
        alternatives = fns["caption_alternatives"](image_bytes)
        for got in (default, alternatives):
            self.assertAllEqual(got["status"], [0, image_io.NOT_AN_IMAGE])
            self.assertEqual(got["error"][0], b"")
            self.assertEqual(got["error"][1], default["error"][1])
            self.assertAllEqual(got["captions"][1], [b"", b""])
            self.assertAllEqual(got["log_probs"][1], [0.0, 0.0])
            self.assertNotEqual(got["captions"][0, 1], b"")
        self.assertAllEqual(alternatives["attentions"][1], tf.zeros([2, MAX_LENGTH, 14, 14]))

    def test_places_a_photo_has_no_caption_for_are_blank(self):
        # Image 0 holds two captions, image 1 one (a tag constraint left no other).
        spec = dataclasses.replace(self.spec(2), max_length=3)
        words = tf.constant(self.vocab.words)
        neg_inf = float("-inf")
        result = self.model.generate({"image": self.images[:2].astype(np.float32)}, max_length=3)
        found = result._replace(
            tokens=tf.constant([[[4, 9, 2], [5, 2, 0]], [[10, 2, 0], [6, 6, 6]]]),
            length=tf.constant([[2, 1], [1, 3]]),
            log_prob=tf.constant([[-1.0, -2.0], [-0.5, neg_inf]]),
            attention=tf.zeros([2, 2, 3, 196]),
        )
        got = exporting._serving_outputs(found, words, spec, None)
        self.assertAllEqual(got["captions"], [[b"a circle", b"big"], [b"square", b""]])
        self.assertAllEqual(got["log_probs"], [[-1.0, -2.0], [-0.5, neg_inf]])
        self.assertAllEqual(got["caption"], [b"a circle", b"square"])

    def test_empty_request_is_refused(self):
        fns = traced(self.model, self.vocab, self.spec(1))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "image_bytes holds no images"):
            fns["serving_default"](tf.constant([], tf.string))

    def test_export_spec(self):
        spec = exporting.export_spec(self.model, self.model.encoder, self.config)
        self.assertEqual(spec.grid, (14, 14))
        self.assertEqual(spec.feature_dim, self.model.feature_dim)
        self.assertEqual((spec.beam_size, spec.max_length), (1, MAX_LENGTH))
        self.assertEqual(spec.crop_fraction, 1.0)
        with self.assertRaisesRegex(ValueError, "--beam_size=-1"):
            exporting.export_spec(self.model, self.model.encoder, self.config, beam_size=-1)

    def test_off_world_outputs(self):
        pooled = [
            off_world.pool(self.model.encoder(scenes(seed, 30).astype(np.float32))).numpy()
            for seed in (1, 2)
        ]
        stats = off_world.calibrate(off_world.fit(pooled[0], 4), pooled[1], 0.9)
        spec = exporting.export_spec(self.model, self.model.encoder, self.config, off_world=stats)
        fns = traced(self.model, self.vocab, spec)
        images = np.concatenate([self.images, np.zeros_like(self.images[:1])])
        want, flagged = off_world.score(self.model.encoder(images.astype(np.float32)), stats)
        got = fns["caption_images"](tf.constant(images))
        self.assertAllClose(got["off_world_score"], want, atol=1e-4)
        self.assertAllEqual(got["off_world"], flagged)
        self.assertTrue(flagged[-1])  # a black frame
        plain = traced(self.model, self.vocab, self.spec(1))["caption_images"]
        self.assertNotIn("off_world", plain(tf.constant(images)))
        output = os.path.join(tempfile.mkdtemp(dir=self.get_temp_dir()), "export")
        info = exporting.export(self.model, self.vocab, self.config, output, off_world=stats)
        self.assertAllClose(info["off_world"]["threshold"], stats.threshold)
        served = tf.saved_model.load(output).signatures["serving_default"]
        out = served(image_bytes=tf.constant([encode(x, "PNG") for x in images]))
        self.assertAllClose(out["off_world_score"], want, atol=1e-4)
        self.assertAllEqual(out["off_world"], flagged)
        with self.assertRaisesRegex(ValueError, "off-world statistics of 5-wide"):
            small = off_world.fit(np.random.default_rng(0).random((20, 10)), 2)
            exporting.export_spec(self.model, self.model.encoder, self.config, off_world=small)

    def test_export_refuses_bad_targets(self):
        root = tempfile.mkdtemp(dir=self.get_temp_dir())
        with self.assertRaisesRegex(ValueError, "vocabulary has 5 words but the model 12"):
            exporting.export(self.model, vocab_lib.Vocab([*WORDS[:4], "x"]), self.config, root)
        with open(os.path.join(root, "notes.txt"), "w") as f:
            f.write("keep me")
        with self.assertRaisesRegex(ValueError, "exists; pass --overwrite"):
            exporting.export(self.model, self.vocab, self.config, root)
        with self.assertRaisesRegex(ValueError, "is not an export; refusing"):
            exporting.export(self.model, self.vocab, self.config, root, overwrite=True)
        self.assertEqual(os.listdir(root), ["notes.txt"])

    def test_feature_encoder_of_a_feature_cache_model(self):
        path = os.path.join(self.get_temp_dir(), "encoder.weights.h5")
        self.model.encoder.net.save_weights(path)
        config = Config(
            embed_dim=8,
            hidden_dim=16,
            attention_dim=8,
            use_feature_cache=True,
            encoder_weights=path,
        )
        features = build_model(config, len(WORDS), feature_shape=(196, self.model.feature_dim))
        encoder = feature_encoder(features, config)
        self.assertIsInstance(encoder, ImageEncoder)
        pixels = self.images[:2].astype(np.float32)
        self.assertAllClose(encoder(pixels), self.model.encoder(pixels))
        # The whole export of a model trained on cached features: its serving_default
        # runs the rebuilt encoder and captions as the model does on its features.
        output = os.path.join(self.get_temp_dir(), "cached_export")
        exporting.export(features, vocab_lib.Vocab(WORDS), config, output)
        serve = tf.saved_model.load(output).signatures["caption_images"]
        got = serve(images=tf.constant(self.images[:2]))
        want = features.generate(
            {"features": encoder(pixels)}, max_length=MAX_LENGTH, block_repeats=True
        )
        self.assertAllEqual(got["tokens"][:, : want.tokens.shape[1]], want.tokens)
        no_weights = Config(embed_dim=8, hidden_dim=16, attention_dim=8, use_feature_cache=True)
        with self.assertRaisesRegex(ValueError, "randomly initialised encoder"):
            feature_encoder(features, no_weights)


if __name__ == "__main__":
    tf.test.main()
