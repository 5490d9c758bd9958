"""A folder of photos and bad files through `sat-caption` on each runtime: the same rows?
which is faster?

    python bench/runtimes.py [--data_dir=../shared/data/flickr8k] [--count=100] [--rounds=1]

Copies the first `--count` Flickr8k test photos and a few bad files (empty, text, a
truncated JPEG, a JPEG cut in its data, a PNG bomb, a CMYK JPEG, an EXIF-rotated one)
into a scratch folder, then runs `sat-caption <folder> --output=<file>` in fresh
processes, the default runtime (LiteRT, its file built first) and `--runtime=tensorflow`
in turns, `--rounds` times. Prints one JSON object: the machine, the seconds of each
run, how many rows give the same caption, whether every row has the same keys, the
largest score difference, the error lines of the bad files on each, and the default's
time over TensorFlow's (fastest of each). Never run as a test.
"""

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]
_CAPTION = os.path.join(_ROOT, "scripts", "caption.py")


def _bad_files(folder, photo):
    """Bad and awkward files beside the photos: {name: bytes}."""
    import numpy as np
    from admission_test import png_bomb
    from PIL import Image

    with open(photo, "rb") as f:
        jpeg = f.read()
    image = Image.open(io.BytesIO(jpeg))
    cmyk, rotated = io.BytesIO(), io.BytesIO()
    image.convert("CMYK").save(cmyk, "JPEG")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.asarray(image)[:, :150]).save(rotated, "JPEG", exif=exif.tobytes())
    files = {
        "zz_empty.jpg": b"",
        "zz_text.png": b"not a picture\n",
        "zz_truncated.jpg": jpeg[: len(jpeg) // 2],
        "zz_cut_header.jpg": jpeg[:300],
        "zz_bomb.png": png_bomb(),
        "zz_cmyk.jpg": cmyk.getvalue(),
        "zz_rotated.jpg": rotated.getvalue(),
    }
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return sorted(files)


def _run(folder, output, runtime, preset):
    command = [sys.executable, _CAPTION, folder, f"--output={output}", f"--preset={preset}"]
    if runtime:
        command.append(f"--runtime={runtime}")
    env = {**os.environ, "PYTHONPATH": _ROOT}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(command)} exited with {done.returncode}: {done.stderr}")
    with open(output, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return seconds, rows, errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data_dir", default=os.path.join(_ROOT, "..", "shared", "data", "flickr8k")
    )
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--preset", default="flickr8k_lite0_grid14_soft")
    args = parser.parse_args()

    from sat_tf.utils import machine

    with open(os.path.join(args.data_dir, "Flickr_8k.testImages.txt"), encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()][: args.count]
    scratch = tempfile.mkdtemp()
    folder = os.path.join(scratch, "photos")
    os.makedirs(folder)
    for name in names:
        shutil.copy(os.path.join(args.data_dir, "Flicker8k_Dataset", name), folder)
    bad = _bad_files(folder, os.path.join(folder, names[0]))
    first = os.path.join(scratch, "first")
    os.makedirs(first)
    shutil.copy(os.path.join(folder, names[0]), first)
    _run(first, os.path.join(scratch, "built.jsonl"), "litert", args.preset)  # builds the file
    seconds = {"default": [], "tensorflow": []}
    results = {}
    for _ in range(args.rounds):
        for name, runtime in (("default", ""), ("tensorflow", "tensorflow")):
            took, rows, errors = _run(
                folder, os.path.join(scratch, f"{name}.jsonl"), runtime, args.preset
            )
            seconds[name].append(round(took, 2))
            results[name] = rows, errors
    shutil.rmtree(scratch)
    (rows, errors), (want_rows, want_errors) = results["default"], results["tensorflow"]
    same = sum(r["caption"] == w["caption"] for r, w in zip(rows, want_rows, strict=True))
    fastest = {name: min(values) for name, values in seconds.items()}
    report = {
        "machine": machine.describe(),
        "preset": args.preset,
        "photos": len(names),
        "bad_files": bad,
        "seconds": seconds,
        "default_over_tensorflow": round(fastest["default"] / fastest["tensorflow"], 3),
        "rows": [len(rows), len(want_rows)],
        "same_caption": same,
        "same_keys": [set(r) for r in rows] == [set(w) for w in want_rows],
        "same_paths": [r["path"] for r in rows] == [w["path"] for w in want_rows],
        "largest_score_difference": max(
            abs(r["score"] - w["score"]) for r, w in zip(rows, want_rows, strict=True)
        ),
        "same_error_lines": errors == want_errors,
        "error_lines": errors,
        "different": [
            [r["path"], r["caption"], w["caption"]]
            for r, w in zip(rows, want_rows, strict=True)
            if r["caption"] != w["caption"]
        ],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
