"""Workdirs saved by earlier code still load and caption as they did.

`testdata/v0_workdirs/` holds tiny models written by the code before the package layout
changed (`testdata/make_v0_workdirs.py`), with the tokens and log-probabilities that
code decoded for fixed inputs (greedy and beam 2). That code could emit `<unk>`; the
comparison decodes under its rule (only `<pad>` and `<start>` banned), so that it shows
the weights load as they were, and checks that today's rule differs from it only where
the old caption held `<unk>`.
"""

import json
import os
from unittest import mock

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference

V0 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata", "v0_workdirs")
FEATURE_SHAPE = (16, 6)


def _inputs(config):
    rng = np.random.default_rng(0)
    if config.use_feature_cache:
        return {"features": rng.normal(size=(2, *FEATURE_SHAPE)).astype(np.float32)}
    size = config.image_size
    return {"image": rng.uniform(0, 255, size=(2, size, size, 3)).astype(np.float32)}


class V0WorkdirTest(tf.test.TestCase, parameterized.TestCase):
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


def _by_path(weights):
    """{variable path without the model's own name: (first values, sum)}."""
    out = {}
    for path, first, total in weights:
        head, _, rest = path.partition("/")
        out[rest if head.startswith("show_attend_tell") else path] = (first, total)
    return out


class V0InitialWeightsTest(tf.test.TestCase, parameterized.TestCase):
    """Runs from one --seed start from the weights the earlier code started from
    (`testdata/v0_initial_weights.json`, `testdata/make_v0_initial_weights.py`)."""

    with open(os.path.join(os.path.dirname(V0), "v0_initial_weights.json"), encoding="utf-8") as f:
        V0_WEIGHTS = json.load(f)

    @parameterized.parameters(*V0_WEIGHTS["settings"])
    def test_same_initial_weights(self, case):
        keras.utils.set_random_seed(0)
        config = Config(**self.V0_WEIGHTS["settings"][case])
        shape = (196, 50) if config.use_feature_cache else None
        model = build_model(config, self.V0_WEIGHTS["vocab_size"], shape)
        now = _by_path(
            [w.path, np.ravel(w.numpy())[:3].tolist(), float(np.sum(w.numpy(), dtype=np.float64))]
            for w in model.weights
        )
        before = _by_path(self.V0_WEIGHTS["weights"][case])
        self.assertEqual(sorted(now), sorted(before))
        for path, (first, total) in before.items():
            self.assertAllClose(now[path][0], first, atol=1e-7, msg=path)
            self.assertAllClose(now[path][1], total, rtol=1e-6, atol=1e-6, msg=path)


if __name__ == "__main__":
    tf.test.main()
