"""Tests for sat_tf.training.scoring: captioning a split the same under XLA."""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.data.tokens import BAD_ENDINGS
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
            "tag_threshold": 0.4,
        }
        self.assertEqual(inference.decoding_arguments(config, self.vocab), want)
        # An explicit beam wins; tags off leave no threshold.
        untagged = dataclasses.replace(config, tags=False)
        got = inference.decoding_arguments(untagged, self.vocab, beam_size=2)
        self.assertEqual(got, {**want, "beam_size": 2, "tag_threshold": None})


if __name__ == "__main__":
    tf.test.main()
