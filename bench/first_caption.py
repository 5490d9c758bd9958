"""The first caption's cost: `sat-caption photo.jpg` in a fresh process against a bare
TensorFlow import.

    python bench/first_caption.py [--image=photo.jpg] [--preset=NAME] [--commands=3] [--trace]

As fresh processes in turns (`--commands` rounds), each timed whole: `python -c "import
tensorflow"`, `sat-caption <photo> --preset=<preset>` (the default runtime: LiteRT for a
shipped preset) and the same with `--runtime=tensorflow` (scripts/caption.py). Before
the rounds the LiteRT file of the preset is built into the cache if it is not there
(its seconds reported, not counted). Prints one JSON object: the machine, the seconds of
each, the fastest of each over the import's (the target of the default: at most 0.15),
whether both runtimes printed the same caption line, and whether the default's process
imported TensorFlow (a separate run that reports `sys.modules`). Without --image it
captions a 320 x 240 picture it draws.

With --trace, also the first call of the TensorFlow caption function traced with
autograph off (the package's `inference.make_caption_fn`) and on (TensorFlow's
default), in this process, on the photo's features: their seconds and whether they
captioned alike. Never run as a test.
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
_CAPTION = os.path.join(_ROOT, "scripts", "caption.py")
# Run in a fresh process: sat-caption's main, then whether TensorFlow was imported.
_PROBE = (
    "import sys; sys.argv = {argv!r}; from sat_tf.cli import caption; status = caption.main(); "
    "print('TENSORFLOW', any(m.split('.')[0] in ('tensorflow', 'keras', 'tensorflow_text') "
    "for m in sys.modules)); sys.exit(status)"
)


def _env():
    return {**os.environ, "PYTHONPATH": _ROOT}


def _commands(photo, preset, count):
    """{name: [seconds]} of each command, fresh processes in turns, and the first line
    each sat-caption printed."""
    caption = [sys.executable, _CAPTION, photo, f"--preset={preset}"]
    argv = {
        "import_tensorflow": [sys.executable, "-c", "import tensorflow"],
        "sat_caption": caption,
        "sat_caption_tensorflow": [*caption, "--runtime=tensorflow"],
    }
    seconds, printed = {name: [] for name in argv}, {}
    for _ in range(count):
        for name, command in argv.items():
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=_env(), check=True)
            seconds[name].append(time.perf_counter() - start)
            if name != "import_tensorflow":
                printed[name] = done.stdout.splitlines()[0]
    return seconds, printed


def _built(photo, preset):
    """Seconds of a first `sat-caption --runtime=litert` (builds the file unless it is
    in the cache), and its printed line."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, _CAPTION, photo, f"--preset={preset}", "--runtime=litert"],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    )
    return round(time.perf_counter() - start, 2), done.stdout.splitlines()[0]


def _imports_tensorflow(photo, preset):
    argv = ["sat-caption", photo, f"--preset={preset}"]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    )
    return done.stdout.strip().splitlines()[-1] == "TENSORFLOW True"


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


def _trace(photo, preset, repeats):
    """The first and later calls of the caption function with autograph off and on."""
    import numpy as np
    import tensorflow as tf

    from sat_tf import Captioner
    from sat_tf.serving import inference

    captioner = Captioner.from_preset(preset, runtime="tensorflow")
    model, config, vocab = captioner.model, captioner.config, captioner.vocab
    encoder = inference.feature_encoder(model, config)
    batch = {"features": encoder(tf.constant(captioner.load_image(photo)[None]), training=False)}
    package = inference.make_caption_fn(model, config, vocab=vocab)
    decoding = inference.decoding_arguments(config, vocab)
    baseline = tf.function(lambda b: model.generate(b, **decoding), reduce_retracing=True)
    report, outs = {}, []
    for name, fn in (("package_autograph_off", package), ("baseline_autograph_on", baseline)):
        first, later, out = _timed(fn, batch, repeats)
        report[name] = {"first_call_s": round(first, 3), "later_call_median_s": round(later, 4)}
        outs.append(out)
    ours, theirs = outs
    report["same_caption"] = bool(
        np.array_equal(ours.tokens.numpy(), theirs.tokens.numpy())
        and np.allclose(ours.log_prob.numpy(), theirs.log_prob.numpy(), atol=1e-5)
    )
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="")
    parser.add_argument("--preset", default="flickr8k_lite0_grid14_soft")
    parser.add_argument("--commands", type=int, default=3, help="fresh processes of each")
    parser.add_argument("--trace", action="store_true", help="also time the first trace")
    parser.add_argument("--repeats", type=int, default=5, help="later calls with --trace")
    args = parser.parse_args()

    import caption_path

    from sat_tf.utils import machine

    folder = tempfile.mkdtemp()
    photo = args.image or caption_path.drawn_photo(folder)
    build_seconds, built_line = _built(photo, args.preset)
    seconds, printed = _commands(photo, args.preset, args.commands)
    fastest = {name: min(values) for name, values in seconds.items()}
    report = {
        "machine": machine.describe(),
        "preset": args.preset,
        "first_litert_run_s": build_seconds,
        "fresh_processes_s": {name: [round(x, 2) for x in v] for name, v in seconds.items()},
        "sat_caption_over_import": round(fastest["sat_caption"] / fastest["import_tensorflow"], 3),
        "sat_caption_tensorflow_over_import": round(
            fastest["sat_caption_tensorflow"] / fastest["import_tensorflow"], 3
        ),
        "target_over_import": 0.15,
        "same_line_both_runtimes": printed["sat_caption"] == printed["sat_caption_tensorflow"]
        and printed["sat_caption"] == built_line,
        "caption": printed["sat_caption"].split(": ", 1)[-1],
        "sat_caption_imports_tensorflow": _imports_tensorflow(photo, args.preset),
    }
    if args.trace:
        report["trace"] = _trace(photo, args.preset, args.repeats)
    shutil.rmtree(folder)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
