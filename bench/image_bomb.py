"""Time and peak memory of refusing an image bomb on each path; prints one JSON document.

    python bench/image_bomb.py                      # the shipped default preset
    python bench/image_bomb.py --preset=flickr8k_lite0_soft --out=bench/results/x.json

Builds a PNG of about 64 KB that declares 23,000 x 23,000 RGB pixels (1.6 GB decoded,
and several times that as float32), then sends it down each path in a process of its
own: the Python API (`Captioner.caption` of a file path and of bytes), the command
(`sat-caption bomb.png`), the SavedModel's `serving_default` (an export of the preset
made first, in another process) and the demo's upload check. Per path: the seconds and
the growth of the process's peak resident memory across the refusal alone (model
loaded and one 1-pixel PNG captioned first, so first-call costs are not counted), the
peak after that 1-pixel PNG, the whole process's peak, and the message. A path that does not admit
images first (an older sat_tf) is not run: the bomb takes 9 GB there. Never run as a
test.
"""

import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
import zlib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "bench")]

from run import machine_info  # noqa: E402

DEFAULT_PRESET = "flickr8k_lite0_grid14_soft"
PATHS = ("api_path", "api_bytes", "command", "serving_default", "demo_check")


def png_bomb(width=23000, height=23000):
    """A valid PNG header and a few rows of zeros: width x height RGB declared."""

    def chunk(kind, body):
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"\0" * (1 + 3 * width) * 900, 9)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )


def _peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(path, bomb, preset, export):
    """Runs one path in this process; prints {seconds, peak_growth_mb, message}."""
    import inspect

    with open(bomb, "rb") as f:
        data = f.read()
    if path in ("api_path", "api_bytes"):
        from sat_tf.serving import api

        if "max_image_pixels" not in inspect.signature(api.Captioner.__init__).parameters:
            return {"skipped": "this sat_tf's Captioner does not admit images first"}
        captioner = api.Captioner.from_preset(preset)

        def warm_up():
            captioner.caption(png_bomb(1, 1))

        def call():
            captioner.caption([bomb if path == "api_path" else data])

    elif path == "serving_default":
        import tensorflow as tf

        serve = tf.saved_model.load(export).signatures["serving_default"]
        if "status" not in serve.structured_outputs:
            return {"skipped": "serving_default has no status output: it decodes every image"}

        def warm_up():
            serve(image_bytes=tf.constant([png_bomb(1, 1)]))

        def call():
            out = serve(image_bytes=tf.constant([data]))
            if int(out["status"][0]) != 0:
                raise ValueError(out["error"].numpy()[0].decode())

    else:
        from sat_tf.server import demo

        def warm_up():
            pass

        def call():
            demo.check_image(data, "bomb.png", demo.Limits())

    start = time.perf_counter()
    warm_up()
    warm_up_seconds = time.perf_counter() - start
    before = _peak_mb()
    start = time.perf_counter()
    try:
        call()
        message = None
    except ValueError as e:
        message = str(e)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "peak_growth_mb": _peak_mb() - before,
        "message": message,
        "one_pixel_png_first_seconds": warm_up_seconds,
        "peak_after_one_pixel_png_mb": before,
    }


def _run(command, env):
    """(seconds, peak MB of the process, stdout, stderr) of a child process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=_ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        out.seek(0), err.seek(0)
        return seconds, usage.ru_maxrss / 1024, out.read().decode(), err.read().decode(), status


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=DEFAULT_PRESET)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--out", default="")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--bomb", default="", help=argparse.SUPPRESS)
    parser.add_argument("--export", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.bomb, args.preset, args.export)))
        return

    env = {**os.environ, "PYTHONPATH": _ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    scratch = tempfile.mkdtemp(prefix="image_bomb_")
    bomb = os.path.join(scratch, "bomb.png")
    with open(bomb, "wb") as f:
        f.write(png_bomb())
    paths = [p for p in args.paths.split(",") if p]
    export = os.path.join(scratch, "export")
    if "serving_default" in paths:
        made = (
            "import sys\n"
            "try:\n    from sat_tf.serving import exporting as e\n"
            "    from sat_tf.serving.inference import load_preset\n"
            "except ImportError:\n    from sat_tf import export_model as e\n"
            "    from sat_tf.serving.preset import load as load_preset\n"
            "e.export(*load_preset(sys.argv[1]), sys.argv[2])\n"
        )
        *_, status = _run([sys.executable, "-c", made, args.preset, export], env)
        if status:
            raise SystemExit(f"exporting {args.preset} failed")
    results = {}
    for path in paths:
        if path == "command":
            command = [sys.executable, "scripts/caption.py", bomb, f"--preset={args.preset}"]
            seconds, peak, out, err, status = _run(command, env)
            tiny = os.path.join(scratch, "tiny.png")
            with open(tiny, "wb") as f:
                f.write(png_bomb(1, 1))
            base_seconds, base_peak, *_ = _run(command[:2] + [tiny] + command[3:], env)
            results[path] = {
                "seconds": seconds,
                "process_peak_mb": peak,
                "one_pixel_png_seconds": base_seconds,
                "one_pixel_png_peak_mb": base_peak,
                "exit_status": status >> 8,
                "message": err.strip().splitlines()[-1] if err.strip() else None,
            }
            continue
        command = [sys.executable, __file__, f"--child={path}", f"--bomb={bomb}"]
        command += [f"--preset={args.preset}", f"--export={export}"]
        seconds, peak, out, err, status = _run(command, env)
        if status:
            results[path] = {"failed": err.strip().splitlines()[-3:]}
            continue
        results[path] = {**json.loads(out.strip().splitlines()[-1]), "process_peak_mb": peak}
    report = {
        "bench": "image_bomb",
        "bomb": {"bytes": os.path.getsize(bomb), "declares": "23000 x 23000 RGB"},
        "preset": args.preset,
        "paths": results,
        "machine": machine_info(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
