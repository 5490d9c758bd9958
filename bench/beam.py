"""sat-caption-beam with its defaults against sat-caption on the same Flickr8k photos, for
one checkout or several in one run (before and after a change), and optionally the
feature cache of sat-extract-features-beam against sat-extract-features'.

    python export/export.py --preset=flickr8k_lite0_grid14_soft --output=/tmp/export
    python bench/beam.py --export=/tmp/export [--counts=150,600,2400] \
        [--roots=/path/to/before,.] [--huge] [--features=600]

For each count N: a folder of links to the first N Flickr8k photos (test, dev, then train
order) and three bad files (empty, text, a truncated JPEG); sat-caption of the preset on
the folder and, for each checkout of --roots (default: this one), sat-caption-beam of the
export on `folder/*.jpg`, each in a fresh process with that checkout first on
PYTHONPATH. Wall times and the peak resident memory of each command's whole process
tree (summed over its processes, sampled every 20 ms), the marginal photos/s between the
smallest and largest N (the rate past the start-up), the share of photos captioned alike,
and whether every photo has one line and each bad file an error line. --huge also runs
each checkout with a 200 MiB file (a JPEG signature, then zeros) added as a second
--input: its line and the peak memory against the run without it. --features=N writes
the cache of N photos (Flickr8k's layout, EfficientNet-Lite0 with ImageNet weights, 224)
with sat-extract-features once and sat-extract-features-beam per checkout: wall times and
whether index and features are equal (bit for bit, or the largest difference in float16
steps). Writes JSON to stdout and bench/results/beam_<cpu>.json. Never run as a test;
the photos are read where they are, never copied into the repo.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]
# The Flickr8k folder: $FLICKR8K, else shared/data/flickr8k beside the checkout.
FLICKR8K = os.environ.get("FLICKR8K") or os.path.join(
    os.path.dirname(ROOT), "shared", "data", "flickr8k"
)
BAD = ("empty.jpg", "notes.jpg", "cut.jpg")
HUGE_BYTES = 200 << 20
FEATURE_FLAGS = ["--dataset=flickr8k", "--encoder=efficientnet_lite0"]
FEATURE_FLAGS += ["--encoder_weights=imagenet", "--image_size=224", "--shard_size=100"]


def photo_names():
    names = []
    for split in ("test", "dev", "train"):
        with open(os.path.join(FLICKR8K, f"Flickr_8k.{split}Images.txt"), encoding="utf-8") as f:
            names += [line.strip() for line in f if line.strip()]
    return names


def photo_folder(folder, count, huge):
    names = photo_names()[:count]
    os.makedirs(folder)
    photos = os.path.join(FLICKR8K, "Flicker8k_Dataset")
    for name in names:
        os.symlink(os.path.join(photos, name), os.path.join(folder, name))
    with open(os.path.join(photos, names[0]), "rb") as f:
        head = f.read(3000)
    for name, data in zip(BAD, (b"", b"not a photo\n", head), strict=True):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    if huge:
        os.makedirs(os.path.join(folder, "big"))
        with open(os.path.join(folder, "big", "huge.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff")
            f.truncate(HUGE_BYTES)


def _tree_rss(pid):
    """The resident bytes of `pid` and its descendants (Linux /proc)."""
    children, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/statm", encoding="utf-8") as f:
                rss[int(entry)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += rss.get(current, 0)
        todo += children.get(current, [])
    return total


def timed(argv, root=ROOT):
    """(wall seconds, peak MB of the process tree) of `argv` run from `root`."""
    env = {**os.environ, "PYTHONPATH": root}
    start, peak = time.perf_counter(), 0
    process = subprocess.Popen(
        argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    while process.poll() is None:
        peak = max(peak, _tree_rss(process.pid))
        time.sleep(0.02)
    return round(time.perf_counter() - start, 2), round(peak / 2**20)


def rows(pattern):
    found = {}
    for name in glob.glob(pattern):
        with open(name, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                found.setdefault(os.path.basename(row["path"]), []).append(row)
    return found


def caption_runs(args, roots, work, count):
    folder = os.path.join(work, f"photos{count}")
    photo_folder(folder, count, args.huge)
    single = os.path.join(work, f"sat_caption{count}.jsonl")
    caption = [sys.executable, "scripts/caption.py", f"--output={single}", folder]
    seconds, memory = {}, {}
    seconds["sat_caption"], memory["sat_caption"] = timed(caption)
    want = rows(single)
    photos = [n for n in os.listdir(folder) if n.endswith(".jpg") and n not in BAD]
    report = {}
    for i, root in enumerate(roots):
        prefix = os.path.join(work, f"beam{count}_{i}", "c")
        beam = [sys.executable, "scripts/caption_beam.py", f"--export={args.export}"]
        beam += [f"--input={folder}/*.jpg", f"--output={prefix}"]
        seconds[root], memory[root] = timed(beam, root)
        got = rows(f"{prefix}-*.jsonl")
        alike = sum(want[n][0]["caption"] == got.get(n, [{}])[0].get("caption") for n in photos)
        report[root] = {
            "captions_alike": alike / len(photos),
            "each_photo_once": all(len(got.get(n, [])) == 1 for n in photos),
            "bad_files_error_rows": all("error" in got.get(n, [{}])[0] for n in BAD),
        }
        if args.huge:
            prefix = os.path.join(work, f"huge{count}_{i}", "c")
            huge = [*beam[:-1], f"--input={folder}/big/*.jpg", f"--output={prefix}"]
            report[root]["wall_s_with_huge"], report[root]["peak_mb_with_huge"] = timed(huge, root)
            report[root]["huge_row"] = rows(f"{prefix}-*.jsonl").get("huge.jpg", [{}])[0]
    return seconds, memory, report


def flickr_subset(folder, count):
    """A Flickr8k folder (raw layout) of the first `count` photos (links)."""
    names = photo_names()[:count]
    kept = set(names)
    os.makedirs(os.path.join(folder, "Flicker8k_Dataset"))
    for name in names:
        source = os.path.join(FLICKR8K, "Flicker8k_Dataset", name)
        os.symlink(source, os.path.join(folder, "Flicker8k_Dataset", name))
    for file_name in os.listdir(FLICKR8K):
        if file_name.endswith(".txt"):
            with open(os.path.join(FLICKR8K, file_name), encoding="utf-8") as f:
                lines = [x for x in f if x.split("#")[0].split("\t")[0].strip() in kept]
            with open(os.path.join(folder, file_name), "w", encoding="utf-8") as f:
                f.writelines(lines)


def features(count, roots, work):
    """Times of the two extraction commands and how their caches compare."""
    from sat_tf.config import Config
    from sat_tf.data import feature_cache
    from sat_tf.training import extract

    data_dir = os.path.join(work, "flickr_subset")
    flickr_subset(data_dir, count)
    flags = [*FEATURE_FLAGS, f"--data_dir={data_dir}", f"--cache_dir={work}/cache"]
    serial = os.path.join(work, "features_serial")
    script = [sys.executable, "scripts/extract_features.py"]
    report = {"sat_extract_features_s": timed([*script, *flags, f"--feature_dir={serial}"])[0]}
    records = extract.records_of(Config(dataset="flickr8k", data_dir=data_dir))
    want = np.stack(list(feature_cache.feature_dataset(serial, records)[0].as_numpy_iterator()))
    for i, root in enumerate(roots):
        out = os.path.join(work, f"features_beam_{i}")
        beam = [sys.executable, "scripts/extract_features_beam.py", *flags, f"--feature_dir={out}"]
        seconds, _ = timed(beam, root)
        got = np.stack(list(feature_cache.feature_dataset(out, records)[0].as_numpy_iterator()))
        steps = np.abs(got - want) / np.maximum(np.spacing(np.abs(want).astype(np.float16)), 1e-8)
        report[root] = {
            "seconds": seconds,
            "index_equal": feature_cache.read_index(out) == feature_cache.read_index(serial),
            "bit_equal": bool(np.array_equal(got, want)),
            "max_float16_steps": float(steps.max()),
        }
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True)
    parser.add_argument("--counts", default="150,600")
    parser.add_argument("--roots", default=ROOT, help="checkouts, comma-separated")
    parser.add_argument("--huge", action="store_true")
    parser.add_argument("--features", type=int, default=0)
    args = parser.parse_args()
    from sat_tf.utils import machine

    counts = [int(c) for c in args.counts.split(",")]
    roots = [os.path.abspath(r) for r in args.roots.split(",")]
    report = {"machine": machine.describe(), "counts": {}}
    with tempfile.TemporaryDirectory() as work:
        for count in counts:
            seconds, memory, per_root = caption_runs(args, roots, work, count)
            report["counts"][count] = {"wall_s": seconds, "peak_mb": memory, **per_root}
        if args.features:
            report["features"] = features(args.features, roots, work)
    low, high = report["counts"][counts[0]], report["counts"][counts[-1]]
    if len(counts) > 1:
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
