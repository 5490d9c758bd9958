"""Beam search with each image's annotations held once against a tiled state.

    python bench/beam_constants.py [--images=GLOB] [--count=64] [--batch=16] [--preset=NAME]

`ShowAttendTell.decode` keeps what the step reads of each image and never changes (the
annotations and `W_a a`) apart from the hypotheses' state (`model/per_image.py`); the
baseline is the same decoding with those two tensors tiled into the state, once per
hypothesis (`per_image.constants_apart` returning the whole state), run in this process on
the same photos' features. Both run the step on live images only. Prints one JSON object:
the machine, the seconds of decoding each batch (median of `--repeats` runs after one
warm-up call), the ratio, and whether the captions are the same (tokens equal,
log-probabilities within 1e-4). Without --images it draws its photos. Never run as a test.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from unittest import mock

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "bench")]


def _seconds(fn, batches, repeats):
    """Median seconds over `repeats` of decoding every batch, and the last results."""
    outs = [fn(batch) for batch in batches]  # traces and warms up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = [fn(batch) for batch in batches]
        times.append(time.perf_counter() - start)
    return statistics.median(times), outs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", default="")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--preset", default="flickr8k_lite0_grid14_soft")
    parser.add_argument("--beam_size", type=int, default=None, help="None: the preset's")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import caption_path
    import numpy as np
    import tensorflow as tf

    from sat_tf import Captioner
    from sat_tf.model import per_image
    from sat_tf.serving import inference
    from sat_tf.utils import machine

    captioner = Captioner.from_preset(args.preset)
    model, config, vocab = captioner.model, captioner.config, captioner.vocab
    with tempfile.TemporaryDirectory() as folder:
        paths = sorted(glob.glob(args.images))[: args.count] if args.images else []
        paths = paths or [caption_path.drawn_photo(folder)] * args.count
        pixels = np.stack([captioner.load_image(path) for path in paths])
    encoder = inference.feature_encoder(model, config)
    batches = [
        {"features": encoder(tf.constant(pixels[i : i + args.batch]), training=False)}
        for i in range(0, len(pixels), args.batch)
    ]
    decoding = inference.decoding_arguments(config, vocab, args.beam_size)

    def caption_fn():
        return tf.function(lambda b: model.generate(b, **decoding), reduce_retracing=True)

    held_once, outs = _seconds(caption_fn(), batches, args.repeats)
    with mock.patch.object(per_image, "constants_apart", lambda state: (state, None)):
        tiled, baseline = _seconds(caption_fn(), batches, args.repeats)
    same = [
        bool(np.array_equal(a.tokens, b.tokens) and np.allclose(a.log_prob, b.log_prob, atol=1e-4))
        for a, b in zip(outs, baseline, strict=True)
    ]
    report = {
        "machine": machine.describe(),
        "preset": args.preset,
        "beam_size": decoding["beam_size"],
        "tags": bool(decoding.get("tag_threshold") is not None and model.tagger is not None),
        "photos": len(paths),
        "batch": args.batch,
        "repeats": args.repeats,
        "held_once_s": round(held_once, 3),
        "tiled_s": round(tiled, 3),
        "speedup": round(tiled / held_once, 2),
        "same_captions": all(same),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
