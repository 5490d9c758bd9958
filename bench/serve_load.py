"""sat-serve under load: photos per second and latency at 1, 8 and 32 concurrent clients,
beside the export's own rates in this process, measured in the same run.

    python bench/serve_load.py [--export=DIR] [--count=144] [--clients=1,8,32]
        [--batching_parameters_file=export/serving/batching_parameters.txt]
        [--flickr8k=../shared/data/flickr8k]

Without --export, the default preset (sat-caption's, flickr8k_lite0_grid14_soft) is
exported with export/export.py into a temporary version folder, as `sat-export
--preset=flickr8k_lite0_grid14_soft --output=exports/preset/1` does. The requests are one
file each, the Flickr8k test photos in order with every tenth request a bad file (empty,
text, or the first 3,000 bytes of a photo, in turn); --count requests per level.

In this process, `serving_default` of the export on the photos' bytes: one photo at a time
(each photo's caption alone, and the median seconds a call) and in batches of 16 (photos
per second over one pass, after a warm-up pass; once before the server runs and once
after). Then scripts/serve.py (sat-serve) as a subprocess on 127.0.0.1 with the batching
file; per level, each client thread posts REST predict bodies (row form, b64) one after
another on its own keep-alive connection (`http.client`) and keeps each answer's bytes,
parsed once the level's clock has stopped: the clients share the two cores with the
server, and a load generator should take as little of them as it can. Reported per
level: captioned photos per second (wall clock), p50 / p99 request latency, whether every
photo got its caption alone and every bad file its error, connection errors, and the
server's resident memory after the level.
Prints one JSON object and writes it to bench/results/serve_load_<machine>.json. Never run
as a test; the photos are read where they are, never copied into the repo.
"""

import argparse
import base64
import concurrent.futures
import dataclasses
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
FLICKR8K = os.path.join(os.path.dirname(ROOT), "shared", "data", "flickr8k")
BATCHING_FILE = os.path.join(ROOT, "export", "serving", "batching_parameters.txt")
ENV = {**os.environ, "PYTHONPATH": ROOT}


def photos(count, folder=FLICKR8K):
    """The bytes of the first `count` Flickr8k test photos (of Flickr8k in `folder`)."""
    with open(os.path.join(folder, "Flickr_8k.testImages.txt"), encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()][:count]
    found = []
    for name in names:
        with open(os.path.join(folder, "Flicker8k_Dataset", name), "rb") as f:
            found.append(f.read())
    return found


def requests_of(good, count):
    """`count` (index of a photo or None, bytes): every tenth a bad file, else the next photo."""
    bad = (b"", b"not a photo\n", good[0][:3000])
    found, photo = [], 0
    for i in range(count):
        if i % 10 == 9:
            found.append((None, bad[(i // 10) % 3]))
        else:
            found.append((photo, good[photo]))
            photo += 1
    return found


def export_default_preset(folder):
    """The default preset exported to `folder`/sat/1 by export/export.py; the base path."""
    from sat_tf.cli.flags_lib import DEFAULT_PRESET

    base = os.path.join(folder, "sat")
    argv = [sys.executable, "export/export.py", f"--preset={DEFAULT_PRESET}"]
    subprocess.run(
        [*argv, f"--output={base}/1"], cwd=ROOT, env=ENV, check=True, stdout=subprocess.DEVNULL
    )
    return base


def in_process(export, good, batch=16):
    """(each photo's caption alone, median seconds of a one-photo call, a function that
    times one pass in batches of `batch` and returns its photos per second)."""
    import tensorflow as tf

    fn = tf.saved_model.load(export).signatures["serving_default"]
    captions, seconds = [], []
    fn(image_bytes=tf.constant(good[:1]))
    for data in good:
        start = time.perf_counter()
        out = fn(image_bytes=tf.constant([data]))
        seconds.append(time.perf_counter() - start)
        captions.append(out["caption"].numpy()[0].decode())
    batches = [good[i : i + batch] for i in range(0, len(good), batch)]

    def rate():
        start = time.perf_counter()
        for part in batches:
            fn(image_bytes=tf.constant(part))
        return len(good) / (time.perf_counter() - start)

    rate()
    return captions, statistics.median(seconds), rate


def start_server(base, batching_file):
    """scripts/serve.py on 127.0.0.1 (free ports); (process, REST URL of predict)."""
    server = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "serve.py"),
            f"--model_base_path={base}",
            "--rest_api_port=0",
            "--port=0",
            "--host=127.0.0.1",
            f"--batching_parameters_file={batching_file}",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    line = server.stdout.readline()
    found = re.search(r"REST on 127.0.0.1:(\d+)", line)
    if not found:
        server.kill()
        raise SystemExit(f"sat-serve did not start: {line!r}")
    return server, f"http://127.0.0.1:{found.group(1)}/v1/models/sat:predict"


def rss_mb(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return int(next(x for x in f if x.startswith("VmRSS:")).split()[1]) / 1024


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def level(url, requests_, clients, want):
    """One level: `clients` threads share `requests_` in order; its figures."""
    where = urllib.parse.urlsplit(url)
    bodies = [
        json.dumps({"instances": [{"image_bytes": {"b64": base64.b64encode(d).decode()}}]}).encode()
        for _, d in requests_
    ]
    lock, next_index = threading.Lock(), [0]
    latency, raw, failures = [0.0] * len(bodies), [None] * len(bodies), []

    def client():
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=300)
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(bodies):
                connection.close()
                return
            start = time.perf_counter()
            try:
                connection.request(
                    "POST", where.path, bodies[i], {"Content-Type": "application/json"}
                )
                answer = connection.getresponse()
                raw[i] = (answer.status, answer.read())
            except (OSError, http.client.HTTPException) as e:
                failures.append(f"{type(e).__name__}: {e}")
                connection.close()
            latency[i] = time.perf_counter() - start

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    wall = time.perf_counter() - start
    answers = [None] * len(bodies)
    for i, got in enumerate(raw):
        try:
            answers[i] = got and (got[0], json.loads(got[1])["predictions"][0])
        except (ValueError, KeyError) as e:
            failures.append(f"{type(e).__name__}: {e}")
    photo_rows = [(i, a) for (i, _), a in zip(requests_, answers, strict=True) if i is not None]
    bad_rows = [a for (i, _), a in zip(requests_, answers, strict=True) if i is None]
    return {
        "requests": len(bodies),
        "photos": len(photo_rows),
        "wall_s": round(wall, 2),
        "photos_per_s": round(len(photo_rows) / wall, 2),
        "latency_ms": {
            "p50": round(1e3 * percentile(latency, 0.5), 1),
            "p99": round(1e3 * percentile(latency, 0.99), 1),
        },
        "captions_as_alone": sum(
            a is not None and a[0] == 200 and a[1]["caption"] == want[i] for i, a in photo_rows
        )
        / len(photo_rows),
        "bad_files_refused": all(
            a is not None and a[0] == 200 and a[1]["status"] != 0 and a[1]["error"]
            for a in bad_rows
        ),
        "connection_errors": len(failures),
        "first_error": failures[0] if failures else None,
    }


def machine_name(machine):
    cpu = machine["cpu"].lower()
    kind = next((w for w in ("epyc", "xeon", "ryzen", "core") if w in cpu), "cpu")
    ids, vector = machine["cpu_id"], (machine["vector_extensions"] or ["novector"])[-1]
    return f"{machine['cores']}core_{kind}_f{ids['family']}m{ids['model']}_{vector}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", default="", help="a version folder; default: the preset's")
    parser.add_argument("--count", type=int, default=144, help="requests per level")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--batching_parameters_file", default=BATCHING_FILE)
    parser.add_argument("--flickr8k", default=FLICKR8K, help="the Flickr8k folder")
    args = parser.parse_args()
    from sat_tf.server import batching
    from sat_tf.utils import machine

    clients = [int(c) for c in args.clients.split(",")]
    requests_ = requests_of(photos(args.count, args.flickr8k), args.count)
    good = [d for i, d in requests_ if i is not None]
    report = {
        "machine": machine.describe(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "batching": dataclasses.asdict(batching.read_parameters(args.batching_parameters_file)),
        "requests_per_level": args.count,
        "levels": {},
    }
    with tempfile.TemporaryDirectory(prefix="serve_load_") as folder:
        if args.export:
            base = os.path.join(folder, "sat")
            os.makedirs(base)
            os.symlink(os.path.abspath(args.export), os.path.join(base, "1"))
        else:
            base = export_default_preset(folder)
        want, one_s, rate = in_process(os.path.join(base, "1"), good)
        before = rate()
        server, url = start_server(base, args.batching_parameters_file)
        try:
            for n in clients:
                level(url, requests_[: 2 * n], n, want)  # the connections and threads start
                report["levels"][n] = level(url, requests_, n, want)
                report["levels"][n]["server_rss_mb"] = round(rss_mb(server.pid), 1)
        finally:
            server.terminate()
            server.wait(60)
        after = rate()
    report["in_process"] = {
        "photos": len(good),
        "batch16_photos_per_s": [round(before, 2), round(after, 2)],
        "batch1_s": round(one_s, 3),
    }
    rate16 = (before + after) / 2
    most, one = report["levels"][max(clients)], report["levels"][min(clients)]
    report["ratios"] = {
        f"{max(clients)}_clients_to_batch16": round(most["photos_per_s"] / rate16, 2),
        f"{min(clients)}_client_p50_to_batch1": round(one["latency_ms"]["p50"] / 1e3 / one_s, 2),
        f"{min(clients)}_client_p50_over_1.25_batch1_ms": round(
            one["latency_ms"]["p50"] - 1.25e3 * one_s, 1
        ),
    }
    name = f"serve_load_{machine_name(report['machine'])}.json"
    with open(os.path.join(ROOT, "bench", "results", name), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
