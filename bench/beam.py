"""sat-caption-beam with its defaults against sat-caption on the same Flickr8k photos.

    python export/export.py --preset=flickr8k_lite0_grid14_soft --output=/tmp/export
    python bench/beam.py --export=/tmp/export [--counts=150,600,2400]

For each count N: a folder of links to the first N Flickr8k photos (test, dev, then train
order) and three bad files (empty, text, a truncated JPEG); sat-caption of the preset on
the folder and sat-caption-beam of the export on `folder/*.jpg`, each in a fresh process.
Wall times, the marginal photos/s between the smallest and largest N (the rate past the
start-up), the share of photos captioned alike, and whether every photo has one line and
each bad file an error line. Writes JSON to stdout and bench/results/beam_<cpu>.json.
Never run as a test; the photos are read where they are, never copied into the repo.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]
FLICKR8K = os.path.join(os.path.dirname(ROOT), "shared", "data", "flickr8k")
BAD = ("empty.jpg", "notes.jpg", "cut.jpg")


def photo_folder(folder, count):
    names = []
    for split in ("test", "dev", "train"):
        with open(os.path.join(FLICKR8K, f"Flickr_8k.{split}Images.txt"), encoding="utf-8") as f:
            names += [line.strip() for line in f if line.strip()]
    os.makedirs(folder)
    photos = os.path.join(FLICKR8K, "Flicker8k_Dataset")
    for name in names[:count]:
        os.symlink(os.path.join(photos, name), os.path.join(folder, name))
    with open(os.path.join(photos, names[0]), "rb") as f:
        head = f.read(3000)
    for name, data in zip(BAD, (b"", b"not a photo\n", head), strict=True):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


def timed(argv):
    env = {**os.environ, "PYTHONPATH": ROOT}
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
    return time.perf_counter() - start


def rows(pattern):
    found = {}
    for name in glob.glob(pattern):
        with open(name, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                found.setdefault(os.path.basename(row["path"]), []).append(row)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True)
    parser.add_argument("--counts", default="150,600")
    args = parser.parse_args()
    from sat_tf.utils import machine

    counts = [int(c) for c in args.counts.split(",")]
    report = {"machine": machine.describe(), "counts": {}}
    with tempfile.TemporaryDirectory() as root:
        for count in counts:
            folder = os.path.join(root, f"photos{count}")
            photo_folder(folder, count)
            single = os.path.join(root, f"sat_caption{count}.jsonl")
            prefix = os.path.join(root, f"beam{count}", "c")
            caption = [sys.executable, "scripts/caption.py", f"--output={single}", folder]
            beam = [sys.executable, "scripts/caption_beam.py", f"--export={args.export}"]
            beam += [f"--input={folder}/*.jpg", f"--output={prefix}"]
            seconds = {"sat_caption": timed(caption), "sat_caption_beam": timed(beam)}
            want, got = rows(single), rows(f"{prefix}-*.jsonl")
            photos = [n for n in os.listdir(folder) if n not in BAD]
            alike = sum(want[n][0]["caption"] == got.get(n, [{}])[0].get("caption") for n in photos)
            report["counts"][count] = {
                "wall_s": {k: round(v, 2) for k, v in seconds.items()},
                "captions_alike": alike / len(photos),
                "each_photo_once": all(len(got.get(n, [])) == 1 for n in photos),
                "bad_files_error_rows": all("error" in got.get(n, [{}])[0] for n in BAD),
            }
    low, high = report["counts"][counts[0]], report["counts"][counts[-1]]
    report["marginal_photos_per_s"] = {
        k: round((counts[-1] - counts[0]) / (high["wall_s"][k] - low["wall_s"][k]), 2)
        for k in low["wall_s"]
    }
    import serve_load

    name = f"beam_{serve_load.machine_name(report['machine'])}.json"
    with open(os.path.join(ROOT, "bench", "results", name), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    json.dump(report, sys.stdout, indent=2)


if __name__ == "__main__":
    main()
