"""Tests for sat_tf.serving.inference: `load` reads all a captioner needs of a shipped
preset, and `load_workdir` loads the workdirs earlier code saved, which caption as they did."""

import json
import os
from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import sat_tf
from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
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


if __name__ == "__main__":
    tf.test.main()
