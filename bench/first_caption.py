"""The first caption's cost: tracing the caption function, with and without autograph.

    python bench/first_caption.py [--image=photo.jpg] [--preset=NAME] [--beam_size=K]

The first call of a caption function traces it: a command that captions a few photos
spends most of its time there. The package traces its decoding with `autograph=False`
(`inference.make_caption_fn`), its control flow being TensorFlow's own ops; the baseline
is the same function traced with autograph on, TensorFlow's default, which first rewrites
the source of every Python function the decoding calls. Both run in this process on the
same photo's features, the package's first, so that what the process warms up once
(TensorFlow's graph building, Keras's layers) counts against it, not the baseline. Each
is then called `--repeats` times more: the traced graphs run as fast as each other.
Prints one JSON object: the machine, first-call and median later-call seconds of each,
the ratio of the first calls, and whether the two captioned the photo alike (tokens and
log-probability). Without --image it captions a 320 x 240 picture it draws. Never run as
a test.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "bench")]


def _timed(fn, batch, repeats):
    """(seconds of the first call, median seconds of `repeats` later calls, result)."""
    start = time.perf_counter()
    out = fn(batch)
    first = time.perf_counter() - start
    later = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(batch)
        later.append(time.perf_counter() - start)
    return first, statistics.median(later), out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="")
    parser.add_argument("--preset", default="flickr8k_lite0_grid14_soft")
    parser.add_argument("--beam_size", type=int, default=None, help="None: the preset's")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import caption_path
    import numpy as np
    import tensorflow as tf

    from sat_tf import Captioner
    from sat_tf.serving import inference
    from sat_tf.utils import machine

    captioner = Captioner.from_preset(args.preset)
    with tempfile.TemporaryDirectory() as folder:
        pixels = captioner.load_image(args.image or caption_path.drawn_photo(folder))[None]
    model, config, vocab = captioner.model, captioner.config, captioner.vocab
    encoder = inference.feature_encoder(model, config)
    batch = {"features": encoder(tf.constant(pixels), training=False)}

    package = inference.make_caption_fn(model, config, args.beam_size, vocab=vocab)
    decoding = inference.decoding_arguments(config, vocab, args.beam_size)
    baseline = tf.function(lambda b: model.generate(b, **decoding), reduce_retracing=True)
    timings, firsts, outs = {}, [], []
    for name, fn in (("package_autograph_off", package), ("baseline_autograph_on", baseline)):
        first, later, out = _timed(fn, batch, args.repeats)
        timings[name] = {"first_call_s": round(first, 3), "later_call_median_s": round(later, 4)}
        firsts.append(first)
        outs.append(out)
    ours, theirs = outs
    report = {
        "machine": machine.describe(),
        "preset": args.preset,
        "beam_size": decoding["beam_size"],
        "repeats": args.repeats,
        **timings,
        "first_call_speedup": round(firsts[1] / firsts[0], 2),
        "same_caption": bool(
            np.array_equal(ours.tokens.numpy(), theirs.tokens.numpy())
            and np.allclose(ours.log_prob.numpy(), theirs.log_prob.numpy(), atol=1e-5)
        ),
        "caption": " ".join(vocab.decode(ours.tokens.numpy()[0][: int(ours.length[0])])),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
