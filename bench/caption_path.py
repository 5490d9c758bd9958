"""What of the package runs to caption one photo: its files and functions, traced.

    python bench/caption_path.py [--image=photo.jpg] [--preset=NAME]

Traces three ways of captioning one image with a preset (the shipped
flickr8k_lite0_grid14_soft by default), each in a fresh process, the TensorFlow ones
with `tf.function`s run eagerly (so their Python bodies are traced as they run):
- `command`: `sat-caption IMAGE --preset=NAME --runtime=tensorflow`
  (`sat_tf.cli.caption.main`), the path evaluation and the export share;
- `api`: `Captioner.from_preset(NAME, runtime="tensorflow").caption(IMAGE)`;
- `litert`: `sat-caption IMAGE --preset=NAME --runtime=litert`, its TFLite file built
  first (not traced).

For each it prints, as one JSON object: the package files that ran any code (module
bodies included: the files imported), the functions that ran (their number and the code
lines of their bodies, as `tests/layout_test.code_lines` counts them: no docstrings,
comments or blank lines) and whether a training module ran. Without --image it
captions a 320 x 240 picture it draws. The machine is stated in the output.
"""

import argparse
import ast
import collections
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAYS = ("command", "api", "litert")

PACKAGE = os.path.join(ROOT, "sat_tf") + os.sep
# Modules that belong to training, which captioning never runs.
TRAINING = (
    os.path.join("sat_tf", "training") + os.sep,
    os.path.join("sat_tf", "model", "self_critical.py"),
    os.path.join("sat_tf", "model", "losses.py"),
    os.path.join("sat_tf", "model", "resumable.py"),
)


def function_spans(path, code_lines):
    """{first line of a def (`co_firstlineno`: its first decorator's line): the code lines
    of its body, without those of the functions and classes defined inside it}, the code
    lines as `code_lines(source)` counts them."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = code_lines(source)
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)

    def span(node):
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return first, {n for n in lines if first <= n <= node.end_lineno}

    spans = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, defs):
            first, body = span(node)
            for inner in ast.walk(node):
                if inner is not node and isinstance(inner, (*defs, ast.ClassDef)):
                    body -= span(inner)[1]
            spans[first] = body
    return spans


def trace(way, image, preset):
    """Runs one way of captioning under `sys.setprofile`; returns its report."""
    if way != "litert":
        import tensorflow as tf

        tf.config.run_functions_eagerly(True)
    files, functions = set(), set()

    def profile(frame, event, arg):
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(PACKAGE):
                files.add(path)
                functions.add((path, frame.f_code.co_firstlineno, frame.f_code.co_name))

    # Module bodies run under the import system's frames, which `setprofile` sees.
    sys.setprofile(profile)
    try:
        if way in ("command", "litert"):
            from sat_tf.cli import caption

            runtime = "litert" if way == "litert" else "tensorflow"
            status = caption.main(
                ["sat-caption", image, f"--preset={preset}", f"--runtime={runtime}"]
            )
            if status:
                raise SystemExit(f"sat-caption exited with {status}")
        else:
            from sat_tf import Captioner

            print(Captioner.from_preset(preset, runtime="tensorflow").caption(image)[0].text)
    finally:
        sys.setprofile(None)
    # The layout test's count of code lines (no docstrings, comments or blank lines),
    # imported after the trace: it imports the package's config.
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from layout_test import code_lines

    spans = {path: function_spans(path, code_lines) for path in files}
    # Module and class bodies (no def starts at their first line) are imports, not runs.
    ran = [(path, first, name) for path, first, name in functions if first in spans[path]]
    lines, per_file = 0, collections.Counter()
    for path, first, _ in ran:
        per_file[os.path.relpath(path, ROOT)] += len(spans[path][first])
        lines += len(spans[path][first])
    relative = sorted(os.path.relpath(p, ROOT) for p in files)
    return {
        "way": way,
        "files_imported": len(relative),
        "files_run": len(per_file),
        "functions": len(ran),
        "function_code_lines": lines,
        "training_code_ran": sorted(p for p in per_file if p.startswith(TRAINING)),
        "training_code_imported": sorted(p for p in relative if p.startswith(TRAINING)),
        "lines_per_file": dict(per_file.most_common()),
        "files_imported_only": sorted(set(relative) - set(per_file)),
        "functions_run": sorted(
            f"{os.path.relpath(path, ROOT)}:{first} {name} ({len(spans[path][first])})"
            for path, first, name in ran
        ),
    }


def drawn_photo(folder):
    """The path of a 320 x 240 PNG drawn into `folder`: a red disc on blue, the photo
    the caption benchmarks take without --image."""
    from PIL import Image, ImageDraw

    path = os.path.join(folder, "photo.png")
    picture = Image.new("RGB", (320, 240), (90, 140, 200))
    ImageDraw.Draw(picture).ellipse((100, 60, 220, 180), fill=(200, 60, 40))
    picture.save(path)
    return path


def machine():
    from sat_tf.utils import machine as machine_lib

    return machine_lib.describe()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="")
    parser.add_argument("--preset", default="flickr8k_lite0_grid14_soft")
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.way:  # the child: one way, traced from a fresh interpreter
        print("REPORT " + json.dumps(trace(args.way, args.image, args.preset)))
        return
    with tempfile.TemporaryDirectory() as folder:
        image = args.image or drawn_photo(folder)
        built = [sys.executable, os.path.join(ROOT, "scripts", "caption.py"), image]
        subprocess.run(
            [*built, f"--preset={args.preset}", "--runtime=litert"], capture_output=True, check=True
        )
        reports = []
        for way in WAYS:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    f"--way={way}",
                    f"--image={image}",
                    f"--preset={args.preset}",
                ],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            ).stdout
            reports.append(json.loads(out.split("REPORT ", 1)[1]))
    print(json.dumps({"machine": machine(), "preset": args.preset, "ways": reports}, indent=1))


if __name__ == "__main__":
    main()
