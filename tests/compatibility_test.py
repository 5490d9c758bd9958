"""Runs from one --seed start from the weights the code before the package layout changed
started from (`testdata/v0_initial_weights.json`; the workdirs that code saved:
inference_test.py)."""

import json
import os

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.config import Config
from sat_tf.model.show_attend_tell import build_model

TESTDATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")


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

    with open(os.path.join(TESTDATA, "v0_initial_weights.json"), encoding="utf-8") as f:
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
