"""TensorFlow's default CPU allocator against the BFC allocator that sat_tf selects on
import; prints one JSON document.

    python bench/allocator.py            # paper scale, 3 pairs of processes, ~3 minutes
    python bench/allocator.py --quick    # small shapes, 1 pair

The allocator is fixed for the life of a process, so the two cannot be compared in
one: each round starts one child process per allocator (order alternating between
rounds) and each child times, after warm-up, the soft-attention train step and greedy
decoding at batch 1 (`run.py`'s cases), the page faults and kernel time of the train
steps, and the machine's matmul rate next to them. A ratio default / BFC is taken
within each round, so that a change of the machine's speed between rounds cancels.
Never run as a test.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

ALLOCATORS = ("default", "bfc")


def child(quick):
    """Measures this process (whose allocator the parent chose) and prints JSON."""
    import keras
    import numpy as np
    import run
    import tensorflow as tf

    import sat_tf

    p = run.QUICK if quick else run.FULL
    keras.utils.set_random_seed(0)
    matmul = run.case_matmul(p)["gflops"]["median"]
    model = run.feature_model(p)
    step = run.blocking(tf.function(model.train_step), run.train_batch(p))
    for _ in range(p["warmup"]):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF)
    seconds = run.time_calls(step, 0, p["repeats"])
    after = resource.getrusage(resource.RUSAGE_SELF)
    steps = len(seconds)
    locations = p["grid"][0] * p["grid"][1]
    features = np.random.default_rng(1).normal(size=(1, locations, p["feature_dim"]))
    greedy = run.generate_fn(p, run.decode_model(p), beam=1)
    greedy_s = run.time_calls(
        run.blocking(greedy, tf.constant(features, tf.float32)), p["warmup"], 3 * p["repeats"]
    )
    print(
        json.dumps(
            {
                "cpu_allocator": sat_tf.cpu_allocator(),
                "matmul_gflops": matmul,
                "train_step_s": statistics.median(seconds),
                "page_faults_per_step": (after.ru_minflt - before.ru_minflt) / steps,
                "kernel_s_per_step": (after.ru_stime - before.ru_stime) / steps,
                "user_s_per_step": (after.ru_utime - before.ru_utime) / steps,
                "greedy_batch1_ms": 1e3 * statistics.median(greedy_s),
                "peak_rss_mb": run.peak_rss_mb(),
            }
        )
    )


def run_child(allocator, quick):
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true" if allocator == "bfc" else "false"}
    command = [sys.executable, os.path.abspath(__file__), "--child"] + ["--quick"] * quick
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-2000:]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["cpu_allocator"] != allocator:
        result["error"] = f"asked for {allocator}, ran with {result['cpu_allocator']}"
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, one pair")
    parser.add_argument("--pairs", type=int, default=None, help="rounds (default 3, quick 1)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.quick)
        return
    import run  # the parent loads TensorFlow only to describe the machine

    pairs = args.pairs or (1 if args.quick else 3)
    rounds = []
    for i in range(pairs):
        order = ALLOCATORS if i % 2 == 0 else ALLOCATORS[::-1]
        rounds.append({allocator: run_child(allocator, args.quick) for allocator in order})
    ok = [r for r in rounds if not any("error" in m for m in r.values())]
    summary = {}
    for key in ("train_step_s", "greedy_batch1_ms", "page_faults_per_step", "kernel_s_per_step"):
        if ok:
            summary[key] = {a: statistics.median(r[a][key] for r in ok) for a in ALLOCATORS}
    for key in ("train_step_s", "greedy_batch1_ms"):
        ratios = [r["default"][key] / r["bfc"][key] for r in ok]
        if ratios:
            summary[f"{key}_default_over_bfc"] = run.stats(ratios)
    report = {
        "machine": {k: v for k, v in run.machine_info().items() if k != "cpu_allocator"},
        "mode": "quick" if args.quick else "full",
        "rounds": rounds,
        "summary": summary,
    }
    json.dump(report, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
