"""Two checkouts of the project against each other: the paper-scale soft train step and
greedy decoding at batch 1, timed in alternating child processes that each import their
own checkout's sat_tf; prints one JSON document.

    git worktree add /tmp/before <commit>
    python bench/versions.py --before=/tmp/before --after=. [--rounds=3] [--quick]

Each child is `bench/allocator.py --child` of its own checkout (same cases as
`run.py`, with the BFC allocator). Ratios after / before are taken within each round, so
that a change of the machine's speed between rounds cancels. Never run as a test.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

KEYS = ("train_step_s", "greedy_batch1_ms", "page_faults_per_step")


def run_child(checkout, quick):
    checkout = os.path.abspath(checkout)
    env = {**os.environ, "PYTHONPATH": checkout, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
    script = os.path.join(checkout, "bench", "allocator.py")
    command = [sys.executable, script, "--child"] + ["--quick"] * quick
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the earlier checkout")
    parser.add_argument("--after", default=".", help="the later checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small shapes")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import run  # the parent loads TensorFlow only to describe the machine

    versions = {"before": args.before, "after": args.after}
    rounds = []
    for i in range(args.rounds):
        order = list(versions) if i % 2 == 0 else list(versions)[::-1]
        rounds.append({v: run_child(versions[v], args.quick) for v in order})
    ok = [r for r in rounds if not any("error" in m for m in r.values())]
    summary = {}
    for key in KEYS:
        if ok:
            summary[key] = {v: statistics.median(r[v][key] for r in ok) for v in versions}
            summary[f"{key}_after_over_before"] = run.stats(
                [r["after"][key] / r["before"][key] for r in ok]
            )
    report = {
        "machine": run.machine_info(),
        "checkouts": {v: os.path.abspath(p) for v, p in versions.items()},
        "mode": "quick" if args.quick else "full",
        "rounds": rounds,
        "summary": summary,
    }
    json.dump(report, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
