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
log-probability). Without --image it captions a 320 x 240 picture it draws.

Then, as fresh processes in turns (`--commands` of each), `python -c "import tensorflow"`
and `sat-caption <the photo> --preset=<preset>` (scripts/caption.py): the seconds of
each, and how far the command's are beyond TensorFlow's own start; its caption is checked
against the one captioned here. Never run as a test.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
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


def _commands(photo, preset, count):
    """{name: [seconds]} of a bare TensorFlow import and of sat-caption on `photo`, fresh
    processes in turns, and sat-caption's first printed line."""
    argv = {
        "import_tensorflow": [sys.executable, "-c", "import tensorflow"],
        "sat_caption": [
            sys.executable,
            os.path.join(_ROOT, "scripts", "caption.py"),
            photo,
            f"--preset={preset}",
        ],
    }
    seconds, printed = {name: [] for name in argv}, ""
    env = {**os.environ, "PYTHONPATH": _ROOT}
    for _ in range(count):
        for name, command in argv.items():
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
            seconds[name].append(time.perf_counter() - start)
            if name == "sat_caption":
                printed = done.stdout.splitlines()[0]
    return seconds, printed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="")
    parser.add_argument("--preset", default="flickr8k_lite0_grid14_soft")
    parser.add_argument("--beam_size", type=int, default=None, help="None: the preset's")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--commands", type=int, default=3, help="fresh processes of each")
    args = parser.parse_args()

    import caption_path
    import numpy as np
    import tensorflow as tf

    from sat_tf import Captioner
    from sat_tf.serving import inference
    from sat_tf.utils import machine

    captioner = Captioner.from_preset(args.preset)
    folder = tempfile.mkdtemp()
    photo = args.image or caption_path.drawn_photo(folder)
    pixels = captioner.load_image(photo)[None]
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
    caption = " ".join(vocab.decode(ours.tokens.numpy()[0][: int(ours.length[0])]))
    seconds, printed = _commands(photo, args.preset, args.commands)
    shutil.rmtree(folder)
    fastest = {name: min(values) for name, values in seconds.items()}
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
        "caption": caption,
        "fresh_processes_s": {name: [round(x, 2) for x in v] for name, v in seconds.items()},
        "sat_caption_beyond_import_s": round(
            fastest["sat_caption"] - fastest["import_tensorflow"], 2
        ),
        "sat_caption_caption_as_here": printed.split(": ", 1)[-1].startswith(caption),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
