"""Tests for sat_tf.serving.inference: `load` reads all a captioner needs of a shipped
preset, `load_workdir` loads the workdirs earlier code saved, which caption as they did,
and `make_caption_fn` decodes with the config's `decoding_arguments` (blocking, XLA)."""

import dataclasses
import json
import os
from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import sat_tf
from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.data.tokens import BAD_ENDINGS
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference, preset

V0 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "v0_workdirs")
FEATURE_SHAPE = (16, 6)


class LoadTest(tf.test.TestCase):
    def test_load_reads_all_a_captioner_needs(self):
        shipped = "flickr8k_lite0_grid14_soft"  # with a tag table and off-world statistics
        trained = sat_tf.load(shipped)
        folder = os.path.join(preset.PRESETS_DIR, shipped)
        self.assertIsInstance(trained.model, sat_tf.ShowAttendTell)
        self.assertEqual(trained.directory, folder)
        self.assertEqual(trained.config, Config.load(os.path.join(folder, "config.json")))
        with open(os.path.join(folder, "vocab.txt"), encoding="utf-8") as f:
            self.assertEqual(list(trained.vocab.words), f.read().splitlines())
        self.assertEqual(trained.model.vocab_size, len(trained.vocab))
        # The preset's tag table and off-world statistics come with it.
        self.assertIsNotNone(trained.model.tagger)
        self.assertIsNotNone(trained.off_world)


def _inputs(config):
    rng = np.random.default_rng(0)
    if config.use_feature_cache:
        return {"features": rng.normal(size=(2, *FEATURE_SHAPE)).astype(np.float32)}
    size = config.image_size
    return {"image": rng.uniform(0, 255, size=(2, size, size, 3)).astype(np.float32)}


class V0WorkdirTest(tf.test.TestCase, parameterized.TestCase):
    """Workdirs saved by earlier code still load and caption as they did.

    `testdata/v0_workdirs/` holds tiny models written by the code before the package layout
    changed (`testdata/make_v0_workdirs.py`), with the tokens and log-probabilities that
    code decoded for fixed inputs (greedy and beam 2). That code could emit `<unk>`; the
    comparison decodes under its rule (only `<pad>` and `<start>` banned), so that it shows
    the weights load as they were, and checks that today's rule differs from it only where
    the old caption held `<unk>`.
    """

    @parameterized.parameters(sorted(os.listdir(V0)))
    def test_loads_and_captions_as_before(self, name):
        workdir = os.path.join(V0, name)
        model, vocab, config = inference.load_workdir(workdir)
        self.assertLen(vocab, model.vocab_size)
        with open(os.path.join(workdir, "expected_captions.json"), encoding="utf-8") as f:
            expected = json.load(f)
        old_rule = (vocab_lib.PAD_ID, vocab_lib.START_ID)
        for beam in (1, 2):
            want = expected[f"beam{beam}"]
            with mock.patch.object(vocab_lib, "NEVER_EMITTED", old_rule):
                out = model.generate(_inputs(config), max_length=8, beam_size=beam)
            self.assertAllEqual(out.tokens, want["tokens"])
            self.assertAllClose(out.log_prob, want["log_prob"], atol=1e-5)
            now = model.generate(_inputs(config), max_length=8, beam_size=beam).tokens.numpy()
            self.assertNotIn(vocab_lib.UNK_ID, now)
            for old_row, new_row in zip(np.asarray(want["tokens"]), now, strict=True):
                if vocab_lib.UNK_ID not in old_row:
                    self.assertAllEqual(new_row, old_row)


class CaptionFnTest(tf.test.TestCase):
    def test_jit_compile_captions_the_same(self):
        config = Config(
            use_feature_cache=True, embed_dim=8, hidden_dim=16, attention_dim=8, max_decode_length=6
        )
        model = build_model(config, 20, (9, 12))
        features = np.random.default_rng(0).normal(size=(3, 9, 12)).astype(np.float32)
        jit = dataclasses.replace(config, jit_compile=True)
        for beam in (1, 2):
            plain = inference.make_caption_fn(model, config, beam)({"features": features})
            compiled = inference.make_caption_fn(model, jit, beam)({"features": features})
            self.assertGreater(np.count_nonzero(plain.length), 0)
            self.assertAllEqual(compiled.tokens, plain.tokens)
            self.assertAllClose(compiled.log_prob, plain.log_prob, atol=1e-4)
            self.assertAllClose(compiled.attention, plain.attention, atol=1e-5)


WORDS = [*vocab_lib.SPECIALS, "a", "the", "dog", "runs", "on", "grass", "of", "man"]


def _repeats(words):
    triples = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(set(triples)) < len(triples) or any(len(set(t)) == 1 for t in triples)


class BlockingTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.config = Config(
            use_feature_cache=True,
            embed_dim=8,
            hidden_dim=16,
            attention_dim=8,
            max_decode_length=12,
        )
        self.model = build_model(self.config, len(WORDS), (9, 12))
        bias = self.model.decoder.deep_output.bias.numpy()
        bias[vocab_lib.END_ID] = -30.0  # captions run to the length limit
        self.model.decoder.deep_output.bias.assign(bias)
        self.features = np.random.default_rng(1).normal(size=(8, 9, 12)).astype(np.float32)
        self.vocab = vocab_lib.Vocab(WORDS)

    def _captions(self, config, beam):
        out = inference.make_caption_fn(self.model, config, beam, vocab=self.vocab)(
            {"features": self.features}
        )
        return [
            self.vocab.decode(t[:n])
            for t, n in zip(out.tokens.numpy(), out.length.numpy(), strict=True)
        ]

    def test_config_blocks_repeats(self):
        allowed = dataclasses.replace(self.config, block_repeats=False)
        for beam in (1, 3):
            self.assertTrue(any(_repeats(w) for w in self._captions(allowed, beam)))
            self.assertFalse(any(_repeats(w) for w in self._captions(self.config, beam)))

    def test_bad_ending_ids_are_those_of_the_vocabulary(self):
        config = dataclasses.replace(self.config, block_bad_endings=True)
        options = inference.decoding_arguments(config, self.vocab)
        self.assertEqual(options["bad_ending_ids"], (4, 5, 8, 10))
        self.assertEqual({WORDS[i] for i in options["bad_ending_ids"]}, {"a", "the", "on", "of"})
        self.assertContainsSubset({"a", "the", "on", "of"}, BAD_ENDINGS)
        self.assertEqual(inference.decoding_arguments(self.config)["bad_ending_ids"], ())
        with self.assertRaisesRegex(ValueError, "needs the vocabulary"):
            inference.decoding_arguments(config)

    def test_decoding_arguments_are_the_configs(self):
        config = dataclasses.replace(
            self.config, beam_size=5, length_penalty=1.0, tags=True, tag_threshold=0.4
        )
        want = {
            "max_length": config.max_decode_length,
            "beam_size": 5,
            "length_penalty": 1.0,
            "block_repeats": config.block_repeats,
            "bad_ending_ids": (),
            "hard_decoding": None,
            "tag_threshold": 0.4,
            "num_return": 1,
        }
        self.assertEqual(inference.decoding_arguments(config, self.vocab), want)
        # An explicit beam wins; tags off leave no threshold.
        untagged = dataclasses.replace(config, tags=False)
        got = inference.decoding_arguments(untagged, self.vocab, beam_size=2)
        self.assertEqual(got, {**want, "beam_size": 2, "tag_threshold": None})
        # n captions: a beam narrower than n is widened to n, a wider one kept.
        for beam, captions, widened in ((2, 4, 4), (None, 3, 5), (1, 2, 2)):
            got = inference.decoding_arguments(config, self.vocab, beam, captions)
            self.assertEqual(got, {**want, "beam_size": widened, "num_return": captions})
        # Drawn captions: no beam, the tag kept (a beam of one per state says it).
        drawn = inference.decoding_arguments(config, self.vocab, None, 3, sample=True)
        self.assertEqual(drawn, {**want, "beam_size": 1, "num_return": 3})
        with self.assertRaisesRegex(ValueError, "beam_size=3 and sampling"):
            inference.decoding_arguments(config, self.vocab, 3, sample=True)
        for bad in (0, 1.5, True):
            with self.assertRaisesRegex(ValueError, f"num_captions={bad!r} must be a positive"):
                inference.decoding_arguments(config, self.vocab, None, bad)
        # Hard attention's context is a decoding argument too.
        hard = dataclasses.replace(config, attention="hard", hard_decoding="argmax")
        self.assertEqual(inference.decoding_arguments(hard, self.vocab)["hard_decoding"], "argmax")


if __name__ == "__main__":
    tf.test.main()
