"""`serving_default`'s photos per second: an export against a baseline export, one process.

    python bench/serving_speed.py --export=DIR --baseline=DIR --images=GLOB [--count=96]

Loads both SavedModels with `tf.saved_model.load` (the way TF Serving and other TF code
run them) and calls `serving_default` on the same photos' bytes: in batches of
`--batch` (photos per second over all of them, median of `--repeats` passes after one
warm-up pass) and one photo at a time (median seconds of the first `--singles` photos).
The two run in turns, so a loaded machine slows both alike. Prints one JSON object: the
machine, each export's rates, the ratios, and the share of photos whose captions (tokens)
are the same. Never run as a test.
"""

import argparse
import glob
import json
import os
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT]


def photo_bytes(pattern, count):
    """The bytes of the first `count` files (sorted) that `pattern` matches."""
    paths = sorted(glob.glob(pattern))[:count]
    if not paths:
        raise SystemExit(f"--images={pattern!r} matches no file")
    data = []
    for path in paths:
        with open(path, "rb") as f:
            data.append(f.read())
    return data


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True)
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--images", required=True)
    parser.add_argument("--count", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--singles", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import tensorflow as tf

    from sat_tf.utils import machine

    data = photo_bytes(args.images, args.count)
    batches = [data[i : i + args.batch] for i in range(0, len(data), args.batch)]
    signatures = {
        name: tf.saved_model.load(path).signatures["serving_default"]
        for name, path in (("baseline", args.baseline), ("export", args.export))
    }

    def run_all(fn):
        return [fn(image_bytes=tf.constant(batch)) for batch in batches]

    tokens, batched, single = {}, {name: [] for name in signatures}, {n: [] for n in signatures}
    for name, fn in signatures.items():  # traces and warms up
        tokens[name] = np.concatenate([out["tokens"].numpy() for out in run_all(fn)])
        fn(image_bytes=tf.constant(data[:1]))
    for _ in range(args.repeats):
        for name, fn in signatures.items():
            start = time.perf_counter()
            run_all(fn)
            batched[name].append(time.perf_counter() - start)
    for photo in data[: args.singles]:
        for name, fn in signatures.items():
            start = time.perf_counter()
            fn(image_bytes=tf.constant([photo]))
            single[name].append(time.perf_counter() - start)
    rate = {name: len(data) / statistics.median(times) for name, times in batched.items()}
    one = {name: statistics.median(times) for name, times in single.items()}
    same = [np.array_equal(a, b) for a, b in zip(tokens["export"], tokens["baseline"], strict=True)]
    report = {
        "machine": machine.describe(),
        "photos": len(data),
        "batch": args.batch,
        "repeats": args.repeats,
        "photos_per_s": {name: round(value, 2) for name, value in rate.items()},
        "batch_speedup": round(rate["export"] / rate["baseline"], 2),
        "one_photo_s": {name: round(value, 3) for name, value in one.items()},
        "one_photo_ratio": round(one["export"] / one["baseline"], 2),
        "same_captions": round(float(np.mean(same)), 4),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
