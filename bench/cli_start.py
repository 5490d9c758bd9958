"""How long each console command takes to answer --help, beside a bare TensorFlow import.

    python bench/cli_start.py [--repeats=3]

Runs `python -m <module> --help` for every console script that setup.py declares, and
`python -c "import tensorflow"`, each --repeats times in fresh processes, interleaved, in
this one run (the machine is shared: compare only within a run). Prints one JSON object:
the machine, and the median and the fastest seconds of each. Never run as a test.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT]

from sat_tf.utils import machine  # noqa: E402  (after the path above)


def console_scripts():
    """{command: module} of setup.py's console_scripts, read from its text."""
    with open(os.path.join(_ROOT, "setup.py"), encoding="utf-8") as f:
        text = f.read()
    block = text.split("for name in (", 1)[1].split(")", 1)[0]
    names = re.findall(r'"(\w+)"', block)
    return {f"sat-{n.replace('_', '-')}": f"sat_tf.cli.{n}" for n in names}


def seconds(argv):
    env = {**os.environ, "PYTHONPATH": _ROOT}
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env, cwd=_ROOT)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr.decode()}")
    return took


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = {"import tensorflow": [sys.executable, "-c", "import tensorflow"]}
    for command, module in console_scripts().items():
        runs[f"{command} --help"] = [sys.executable, "-m", module, "--help"]
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, argv in runs.items():
            times[name].append(seconds(argv))
    report = {
        "machine": machine.describe(),
        "repeats": args.repeats,
        "seconds": {
            name: {"median": round(statistics.median(t), 2), "min": round(min(t), 2)}
            for name, t in times.items()
        },
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
