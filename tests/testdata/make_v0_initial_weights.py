"""Writes `v0_initial_weights.json`: the first values and the sum of every variable of
models built by `build_model` from seed 0, by the code before the package layout of
issue 20 (run with that code only; commit 525c87d), so that `tests/compatibility_test.py`
can check that later code starts runs from the same weights.

    PYTHONPATH=<old checkout> python tests/testdata/make_v0_initial_weights.py out.json
"""

import json
import sys

import keras
import numpy as np

from sat_tf.config import Config
from sat_tf.model import build_model

CASES = {
    "shapes_soft": dict(),
    "shapes_hard": dict(attention="hard"),
    "features_dot": dict(attention_score="dot", use_feature_cache=True),
}


def main(path):
    out = {}
    for name, settings in CASES.items():
        config = Config(**settings)
        keras.utils.set_random_seed(0)
        shape = (196, 50) if config.use_feature_cache else None
        model = build_model(config, 40, shape)
        out[name] = [
            [w.path, np.ravel(w.numpy())[:3].tolist(), float(np.sum(w.numpy(), dtype=np.float64))]
            for w in model.weights
        ]
    with open(path, "w") as f:
        json.dump({"settings": CASES, "vocab_size": 40, "weights": out}, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1])
