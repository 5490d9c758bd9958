"""Latency of the demo page's caption request; prints one JSON document.

    python bench/demo_latency.py --export=exports/sat/1,exports/sat/2
    python bench/demo_latency.py --workdir=runs/shapes      # exports greedy and beam 3 first

Serves the exports with `sat_tf.serving.demo` on 127.0.0.1 (the server `scripts/demo.py`
runs),
then posts the same photo (default: the first Flickr8k test photo, else a generated
JPEG) `--requests` times per decoding, one at a time after two warm-up requests.
Reported per decoding, as median / min / max / IQR in milliseconds: the whole HTTP
request as the browser sees it, the `serving_default` call inside it, and the server's
time for the request (checks, model, the per-word pictures). Never run as a test.
"""

import argparse
import io
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np
import requests
from PIL import Image

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "bench")]

from run import machine_info, stats  # noqa: E402

from sat_tf.server import demo  # noqa: E402
from sat_tf.serving import inference  # noqa: E402

FLICKR8K = os.path.join(os.path.dirname(_ROOT), "shared", "data", "flickr8k")


def default_photo():
    """(name, bytes): the first Flickr8k test photo, or a generated 400 x 300 JPEG."""
    listing = os.path.join(FLICKR8K, "Flickr_8k.testImages.txt")
    if os.path.exists(listing):
        with open(listing, encoding="utf-8") as f:
            name = f.readline().strip()
        path = os.path.join(FLICKR8K, "Flicker8k_Dataset", name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                return name, f.read()
    pixels = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return "generated.jpg", buffer.getvalue()


def measure(url, name, data, beam_size, requests_count, warmup=2):
    """Milliseconds per request: {"request": [...], "model": [...], "server": [...]}."""
    times = {"request": [], "model": [], "server": []}
    for i in range(warmup + requests_count):
        start = time.perf_counter()
        response = requests.post(
            f"{url}/api/caption",
            files={"image": (name, data)},
            data={"beam_size": str(beam_size)},
            timeout=300,
        )
        elapsed = 1e3 * (time.perf_counter() - start)
        if response.status_code != 200:
            raise SystemExit(f"error: request failed: {response.json().get('error')}")
        if i >= warmup:
            page = response.json()
            times["request"].append(elapsed)
            times["model"].append(page["model_ms"])
            times["server"].append(page["total_ms"])
    return times, page


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export", action="append", default=[], help="Export folder(s).")
    parser.add_argument("--workdir", help="A trained workdir, exported greedy and beam 3.")
    parser.add_argument("--preset", default="", help="A preset (name, folder or URL) to export.")
    parser.add_argument("--photo", help="Photo to caption.")
    parser.add_argument("--requests", type=int, default=20, help="Timed requests per decoding.")
    args = parser.parse_args(argv)
    exports = [p for value in args.export for p in value.split(",") if p]
    if bool(exports) + bool(args.workdir) + bool(args.preset) != 1:
        raise SystemExit("error: give one of --export=DIR[,DIR], --workdir=DIR, --preset=NAME")
    if args.photo:
        with open(args.photo, "rb") as f:
            name, data = os.path.basename(args.photo), f.read()
    else:
        name, data = default_photo()
    with tempfile.TemporaryDirectory(prefix="sat_tf_demo_bench_") as folder:
        if args.workdir or args.preset:
            trained = (
                inference.load_workdir(args.workdir)
                if args.workdir
                else inference.load_preset(args.preset)
            )
            exports = demo.export_decodings(trained, folder)
        captioners = demo.load_captioners(exports)
        server = demo.serve(demo.create_app(captioners), 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://{demo.HOST}:{server.port}"
        report = {
            "machine": machine_info(),
            "photo": {"name": name, "bytes": len(data)},
            "source": {"workdir": args.workdir, "preset": args.preset, "export": exports},
            "model": {k: captioners[0].info[k] for k in ("image_size", "grid", "max_length")},
            "requests_per_decoding": args.requests,
            "decodings": {},
        }
        for captioner in captioners:
            times, page = measure(url, name, data, captioner.beam_size, args.requests)
            report["decodings"][captioner.name] = {
                "caption": page["caption"],
                "words": len(page["words"]),
                **{f"{key}_ms": stats(values) for key, values in times.items()},
            }
        server.shutdown()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
