"""Writes the workdirs of `v0_workdirs/`: tiny models saved by the code before the
package layout of issue 20 (written by commit 525c87d), with the captions that code
gave for fixed inputs, so that `tests/inference_test.py` can check that later code
loads them and captions alike.

    python tests/testdata/make_v0_workdirs.py tests/testdata/v0_workdirs

Run it with the old code only; the files it wrote are committed.
"""

import json
import os
import sys

import keras
import numpy as np
from sat_tf.vocab import Vocab

from sat_tf import train_lib
from sat_tf.config import Config
from sat_tf.model import build_model

WORDS = ["a", "big", "small", "red", "blue", "circle", "square", "at", "the", "top", "left"]
TINY = dict(embed_dim=8, hidden_dim=16, attention_dim=8, max_decode_length=8, vocab_size=11)
MODELS = {
    "soft_additive_image": dict(attention="soft", image_size=32),
    "hard_gated_image": dict(attention="hard", image_size=32),
    "soft_dot_features": dict(attention="soft", attention_score="dot", use_feature_cache=True),
    "none_features": dict(attention="none", use_feature_cache=True),
}
FEATURE_SHAPE = (16, 6)


def inputs(config):
    rng = np.random.default_rng(0)
    if config.use_feature_cache:
        return {"features": rng.normal(size=(2, *FEATURE_SHAPE)).astype(np.float32)}
    size = config.image_size
    return {"image": rng.uniform(0, 255, size=(2, size, size, 3)).astype(np.float32)}


def main(out_dir):
    vocab = Vocab(["<pad>", "<start>", "<end>", "<unk>", *WORDS])
    for name, settings in MODELS.items():
        workdir = os.path.join(out_dir, name)
        os.makedirs(workdir, exist_ok=True)
        config = Config(**TINY, **settings)
        keras.utils.set_random_seed(0)
        shape = FEATURE_SHAPE if config.use_feature_cache else None
        model = build_model(config, len(vocab), shape)
        config.save(os.path.join(workdir, train_lib.CONFIG_FILE))
        vocab.save(os.path.join(workdir, train_lib.VOCAB_FILE))
        if config.use_feature_cache:
            features = {"feature_shape": list(FEATURE_SHAPE), "grid": [4, 4]}
            with open(os.path.join(workdir, train_lib.FEATURES_FILE), "w") as f:
                json.dump(features, f)
        train_lib.save_weights_atomically(model, os.path.join(workdir, train_lib.BEST_WEIGHTS))
        train_lib.write_best_info(workdir, vocab, epoch=1, val_bleu4=0.0)
        expected = {}
        for beam in (1, 2):
            out = model.generate(inputs(config), max_length=8, beam_size=beam)
            expected[f"beam{beam}"] = {
                "tokens": out.tokens.numpy().tolist(),
                "log_prob": out.log_prob.numpy().tolist(),
            }
        with open(os.path.join(workdir, "expected_captions.json"), "w") as f:
            json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
