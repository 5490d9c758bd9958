"""Tests for sat_tf.training.scoring: captioning a split the same under XLA."""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from sat_tf.config import Config
from sat_tf.model.show_attend_tell import build_model
from sat_tf.training import scoring

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
            plain = scoring.make_caption_fn(model, config, beam)({"features": features})
            compiled = scoring.make_caption_fn(model, jit, beam)({"features": features})
            self.assertGreater(np.count_nonzero(plain.length), 0)
            self.assertAllEqual(compiled.tokens, plain.tokens)
            self.assertAllClose(compiled.log_prob, plain.log_prob, atol=1e-4)
            self.assertAllClose(compiled.attention, plain.attention, atol=1e-5)


if __name__ == "__main__":
    tf.test.main()
