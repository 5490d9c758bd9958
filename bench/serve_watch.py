"""sat-serve's threads and memory while broken versions come and go, for --minutes.

    python bench/serve_watch.py [--export=DIR] [--minutes=10]

Without --export, the default preset is exported as bench/serve_load.py exports it. That
export serves as version 1 under a temporary base path; then come version 2 (its
saved_model.pb corrupt), 3 (its warm-up file corrupt) and 4 (a warm-up request its
signature refuses, so its model loads before the warm-up fails), each tried three times
(--max_num_load_retries=2, 0.1 s apart) and listed END with its error while version 1
serves. Then, for --minutes, the newest broken folders leave and come back in turn, so
that the version the policy aspires changes and is tried anew (4 away: 3 tried; 3 away:
2; 3 back: 3; 4 back: 4), each step waiting for its three failed loads, and one photo is
posted after each round. Printed as JSON: the server's OS threads and resident memory
once the first failures are listed and at the end, the memory after each round (it
swings by a few hundred MB as models load and go, so its growth is the peak of the last
third of the rounds over the peak of the first third), the failed loads counted in its
log, every answer's status and the listing at the end. sat-serve holds its threads within
+2 and that growth within +100 MB over ten minutes.
"""

import argparse
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import serve_load  # noqa: E402

FAILED = " did not load (try "


def broken_copy(export, base, version, how):
    """A copy of `export` as `base/<version>`, broken `how` ("model", "warmup" or
    "warmup_request"), renamed into place."""
    staged = os.path.join(base, f".{version}.staged")
    shutil.copytree(export, staged)
    warmup = os.path.join(staged, "assets.extra", "tf_serving_warmup_requests")
    if how == "model":
        with open(os.path.join(staged, "saved_model.pb"), "wb") as f:
            f.write(b"\x0a\xff\xff\xff\xff")
    elif how == "warmup":
        with open(warmup, "r+b") as f:
            f.seek(12)
            f.write(b"\x00" * 16)
    else:
        import tensorflow as tf
        from tensorflow_serving.apis import prediction_log_pb2

        log = prediction_log_pb2.PredictionLog()
        log.predict_log.request.model_spec.signature_name = "serving_default"
        log.predict_log.request.inputs["pixels"].CopyFrom(tf.make_tensor_proto([1.0]))
        with tf.io.TFRecordWriter(warmup) as writer:
            writer.write(log.SerializeToString())
    os.rename(staged, os.path.join(base, str(version)))


class Server:
    """scripts/serve.py over `base`, its log in `log`."""

    def __init__(self, base, log):
        self.log = log
        self.process = subprocess.Popen(
            [
                sys.executable,
                os.path.join(serve_load.ROOT, "scripts", "serve.py"),
                f"--model_base_path={base}",
                "--rest_api_port=0",
                "--port=0",
                "--host=127.0.0.1",
                "--file_system_poll_wait_seconds=0.2",
                "--max_num_load_retries=2",
                "--load_retry_interval_micros=100000",
            ],
            stdout=subprocess.PIPE,
            stderr=open(log, "w"),  # noqa: SIM115 - the process's, closed with it
            text=True,
            env=serve_load.ENV,
        )
        found = re.search(r"REST on 127.0.0.1:(\d+)", self.process.stdout.readline())
        if not found:
            self.process.kill()
            raise SystemExit(f"sat-serve did not start; its log: {log}")
        self.url = f"http://127.0.0.1:{found.group(1)}/v1/models/sat"

    def failed_loads(self):
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read().count(FAILED)

    def wait_for_failures(self, count, timeout=300):
        deadline = time.monotonic() + timeout
        while self.failed_loads() < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"no {count} failed loads within {timeout} s; log: {self.log}")
            time.sleep(0.05)

    def listing(self):
        with urllib.request.urlopen(self.url, timeout=60) as answer:
            states = json.load(answer)["model_version_status"]
        return [(s["version"], s["state"], s["status"]["error_code"]) for s in states]

    def post(self, body):
        request = urllib.request.Request(self.url + ":predict", data=body)
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status

    def resources(self):
        with open(f"/proc/{self.process.pid}/status", encoding="ascii") as f:
            rss = int(next(x for x in f if x.startswith("VmRSS:")).split()[1]) / 1024
        return {"threads": len(os.listdir(f"/proc/{self.process.pid}/task")), "rss_mb": rss}


def peak_growth(values):
    """The peak of the last third of `values` over the peak of the first third."""
    third = max(1, len(values) // 3)
    return max(values[-third:]) - max(values[:third]) if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", default="", help="a version folder; default: the preset's")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--flickr8k", default=serve_load.FLICKR8K, help="the Flickr8k folder")
    args = parser.parse_args()
    photo = serve_load.photos(1, args.flickr8k)[0]
    body = json.dumps({"instances": [{"b64": base64.b64encode(photo).decode()}]}).encode()
    with tempfile.TemporaryDirectory(prefix="serve_watch_") as folder:
        export = args.export or os.path.join(serve_load.export_default_preset(folder), "1")
        base = os.path.join(folder, "watched")
        os.makedirs(base)
        os.symlink(os.path.abspath(export), os.path.join(base, "1"))
        server = Server(base, os.path.join(folder, "serve.log"))
        try:
            for version, how in ((2, "model"), (3, "warmup"), (4, "warmup_request")):
                broken_copy(export, base, version, how)
                server.wait_for_failures(3 * (version - 1))
            time.sleep(1)
            first = {**server.resources(), "failed_loads": server.failed_loads()}
            statuses, rss_by_round, rounds, start = [], [], 0, time.monotonic()
            while time.monotonic() - start < 60 * args.minutes:
                for version, there in ((4, "away"), (3, "away"), (3, "back"), (4, "back")):
                    here, away = (
                        os.path.join(base, str(version)),
                        os.path.join(folder, str(version)),
                    )
                    count = server.failed_loads()
                    os.rename(*((here, away) if there == "away" else (away, here)))
                    server.wait_for_failures(count + 3)
                statuses.append(server.post(body))
                rss_by_round.append(round(server.resources()["rss_mb"]))
                rounds += 1
            last = {**server.resources(), "failed_loads": server.failed_loads()}
            report = {
                "minutes": args.minutes,
                "rounds": rounds,
                "after_the_first_failures": first,
                "at_the_end": last,
                "growth": {
                    "threads": last["threads"] - first["threads"],
                    "rss_mb_peak": peak_growth(rss_by_round),
                },
                "rss_mb_after_each_round": rss_by_round,
                "answers": {str(s): statuses.count(s) for s in set(statuses)},
                "listing": server.listing(),
            }
        finally:
            server.process.terminate()
            server.process.wait(60)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
