"""The CPU allocators TensorFlow can run with, against the BFC allocator that sat_tf
selects on import; prints one JSON document.

    python bench/allocator.py            # paper scale, 3 rounds of 4 processes, ~8 minutes
    python bench/allocator.py --quick    # small shapes, 1 round

TensorFlow's own choice depends on oneDNN: with oneDNN off it is the malloc allocator
("default"), with oneDNN on (the default on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI
or AMX) oneDNN's allocator ("onednn"). oneDNN also changes the kernels, so each is
compared with the BFC allocator under the same oneDNN setting: default against bfc with
oneDNN off, onednn against bfc_onednn with it on.

The allocator is fixed for the life of a process, so they cannot be compared in one:
each round starts one child process per setting (order reversed every other round) and
each child times, after warm-up, the soft-attention train step and greedy decoding at
batch 1 (`run.py`'s cases), the page faults and kernel time of the train steps, and the
machine's matmul rate next to them. Ratios are taken within each round, so that a change
of the machine's speed between rounds cancels. Never run as a test.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

# setting -> (TF_CPU_ALLOCATOR_USE_BFC, TF_ENABLE_ONEDNN_OPTS, the allocator it gives)
SETTINGS = {
    "default": ("false", "0", "default"),
    "bfc": ("true", "0", "bfc"),
    "onednn": ("false", "1", "onednn"),
    "bfc_onednn": ("true", "1", "bfc"),
}
# (setting, its BFC twin under the same oneDNN setting)
PAIRS = (("default", "bfc"), ("onednn", "bfc_onednn"))


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


def run_child(setting, quick):
    use_bfc, onednn, allocator = SETTINGS[setting]
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": use_bfc, "TF_ENABLE_ONEDNN_OPTS": onednn}
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
        order = list(SETTINGS) if i % 2 == 0 else list(SETTINGS)[::-1]
        rounds.append({setting: run_child(setting, args.quick) for setting in order})
    ok = [r for r in rounds if not any("error" in m for m in r.values())]
    summary = {}
    for key in ("train_step_s", "greedy_batch1_ms", "page_faults_per_step", "kernel_s_per_step"):
        if ok:
            summary[key] = {s: statistics.median(r[s][key] for r in ok) for s in SETTINGS}
    for key in ("train_step_s", "greedy_batch1_ms"):
        for setting, twin in PAIRS:
            ratios = [r[setting][key] / r[twin][key] for r in ok]
            if ratios:
                summary[f"{key}_{setting}_over_{twin}"] = run.stats(ratios)
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
