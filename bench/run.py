"""Benchmarks of sat_tf on this machine; prints one JSON document.

    python bench/run.py           # paper-scale shapes, ~10 minutes on 2 cores
    python bench/run.py --quick   # small shapes and few repeats, ~1-2 minutes
    python bench/run.py --only=tflite --preset=<name|folder|url>   # one case

Cases: the machine's float32 matmul rate and memory bandwidth (the yardsticks), the
training step at paper scale (VGG19 features L=196 x D=512 as in paper §4.3, m=512,
n=1024, A=512, V=10,000 words + 4 special tokens, B=64 captions of 16 words) with its
analytic FLOPs (`flops.py`), the step's matrix products timed alone at their shapes
(the most of the matmul rate the step could reach), decoding latency and throughput,
encoder throughput, the self-critical train step (`scst`: seconds a step and the share
spent in the CIDEr-D reward), the input pipeline against the training step, the exported
SavedModel / TFLite file, and peak resident memory. Two cases run on a preset
(--preset, else the shipped one) and, where its dataset is at --data_dir, on its test
photos: `tflite` (the float and int8 TFLite files against the SavedModel: size, greedy
batch-1 latency, BLEU-4 and CIDEr, agreement) and `float16` (greedy decoding with
float16 compute against float32).
Every timing is a median over repeats after warm-up, with min, max and interquartile
range; a case that fails reports its error instead. The machine's load average is
recorded: on a shared machine the spread shows how far to trust a median. Never run as
a test.
"""

import argparse
import dataclasses
import io
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import traceback
from unittest import mock

import flops
import keras
import numpy as np
import tensorflow as tf

import sat_tf
from sat_tf.config import Config
from sat_tf.data import input_pipeline
from sat_tf.data import vocab as vocab_lib
from sat_tf.data.datasets import Record
from sat_tf.evaluation import cider
from sat_tf.model import losses, self_critical
from sat_tf.model.encoder import ImageEncoder
from sat_tf.model.fast import schedule as schedule_lib
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference
from sat_tf.training import optimizers, publish
from sat_tf.utils import machine

SPECIALS = len(vocab_lib.SPECIALS)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLICKR8K = os.environ.get("SAT_TF_FLICKR8K", os.path.join(ROOT, "..", "shared", "data", "flickr8k"))
CASES = (
    "matmul",
    "train_step",
    "annotation_pass",
    "step_products",
    "memory_bandwidth",
    "decode",
    "extract",
    "input_pipeline",
    "serve",
    "tflite",
    "float16",
)
# The targets for the int8 TFLite model.
INT8_SIZE_RATIO, INT8_SPEEDUP, INT8_BLEU4_LOSS = 1 / 3, 2.0, 0.005
FLOAT16_IMAGES = 100

FULL = {
    "grid": (14, 14),
    "feature_dim": 512,
    "embed_dim": 512,
    "hidden_dim": 1024,
    "attention_dim": 512,
    "vocab_words": 10000,
    "batch": 64,
    "words": 16,
    "decode_batch": 32,
    "matmul_n": 2048,
    "bandwidth_mb": 256,
    "extract_size": 224,
    "extract_batch": 16,
    "pipeline_images": 256,
    "serve_encoder": "vgg19",
    "serve_image_size": 224,
    "serve_batch": 16,
    "warmup": 2,
    "repeats": 7,
}
QUICK = {
    **FULL,
    "grid": (7, 7),
    "feature_dim": 128,
    "embed_dim": 64,
    "hidden_dim": 128,
    "attention_dim": 64,
    "vocab_words": 1000,
    "batch": 16,
    "words": 8,
    "decode_batch": 8,
    "matmul_n": 1024,
    "bandwidth_mb": 64,
    "extract_size": 112,
    "extract_batch": 4,
    "pipeline_images": 64,
    "serve_encoder": "shapes_cnn",
    "serve_image_size": 112,
    "serve_batch": 4,
    "warmup": 1,
    "repeats": 3,
}
# The train step's decoder sizes, each timed in every case of TRAIN_CASES: the paper's
# (above) and configs/flickr8k_grid14.flags (the 14 x 14 x 1280 dilated Lite0 head,
# m = 256, n = 512, A = 256, 2,500 words; Flickr8k captions average 11.8 words).
TRAIN_SHAPES = {
    "paper": {},
    "flickr8k_grid14": {
        "grid": (14, 14),
        "feature_dim": 1280,
        "embed_dim": 256,
        "hidden_dim": 512,
        "attention_dim": 256,
        "vocab_words": 2500,
        "batch": 64,
        "words": 12,
    },
}
# name: (attention, score, jit_compile, Keras dtype policy, schedule). The schedule
# "autodiff" runs the decoder's autodiff loop instead of the fused recurrence (soft, and
# hard since stop 29): the baseline each fused case's speed-up is measured against.
# "fused" runs the additive score through its compiled op where that applies (float32,
# no XLA: `fused_score.applies`), "fused_ops" as TensorFlow ops; "autodiff_compiled" is
# the autodiff loop with the compiled score (hard attention's training schedule until
# stop 47; since then the schedule of `fused_hard` unset). "fused_whole_baseline" is
# "fused" with hard attention's argmax baseline decoding every caption of the batch,
# as it did until stop 49, instead of the sampled ones alone
# (`losses.sampled_argmax_reward`); "fused_moving_average" is "fused" with the
# paper's moving-average baseline, which needs no second pass. An
# optional sixth value "keras" takes Keras's own Adam instead of the package's
# (`training/optimizers.py`: each variable's update one fused kernel).
TRAIN_CASES = {
    "soft_additive": ("soft", "additive", False, "float32", "fused"),
    "soft_additive_ops": ("soft", "additive", False, "float32", "fused_ops"),
    "soft_additive_keras_adam": ("soft", "additive", False, "float32", "fused", "keras"),
    "soft_additive_autodiff": ("soft", "additive", False, "float32", "autodiff"),
    "hard_additive": ("hard", "additive", False, "float32", "fused"),
    "hard_additive_ops": ("hard", "additive", False, "float32", "fused_ops"),
    "hard_additive_whole_baseline": ("hard", "additive", False, "float32", "fused_whole_baseline"),
    "hard_additive_moving_average": ("hard", "additive", False, "float32", "fused_moving_average"),
    "hard_additive_autodiff": ("hard", "additive", False, "float32", "autodiff"),
    "hard_additive_autodiff_compiled": (
        "hard",
        "additive",
        False,
        "float32",
        "autodiff_compiled",
    ),
    "soft_dot": ("soft", "dot", False, "float32", "fused"),
    "soft_additive_jit": ("soft", "additive", True, "float32", "fused"),
    "hard_additive_jit": ("hard", "additive", True, "float32", "fused"),
    "soft_additive_bf16": ("soft", "additive", False, "mixed_bfloat16", "fused"),
    "soft_additive_bf16_autodiff": ("soft", "additive", False, "mixed_bfloat16", "autodiff"),
    "hard_additive_bf16": ("hard", "additive", False, "mixed_bfloat16", "fused"),
}
# case: the cases its speed-up is measured over (differing in one setting).
SPEEDUP_BASELINES = {
    "soft_additive": ("soft_additive_autodiff", "soft_additive_ops", "soft_additive_keras_adam"),
    "soft_additive_ops": ("soft_additive_autodiff",),
    "hard_additive": (
        "hard_additive_autodiff",
        "hard_additive_ops",
        "hard_additive_whole_baseline",
        "hard_additive_autodiff_compiled",
    ),
    "hard_additive_ops": ("hard_additive_autodiff",),
    "hard_additive_moving_average": ("hard_additive",),
    "hard_additive_autodiff_compiled": ("hard_additive_autodiff",),
    "soft_additive_jit": ("soft_additive",),
    "hard_additive_jit": ("hard_additive",),
    "soft_additive_bf16": ("soft_additive", "soft_additive_bf16_autodiff"),
    "soft_additive_bf16_autodiff": ("soft_additive_autodiff",),
    "hard_additive_bf16": ("hard_additive",),
}
# case: its baselines, each also timed against it in alternating rounds of one process
# (`case_interleaved`).
INTERLEAVED = {
    "soft_additive": ("soft_additive_ops", "soft_additive_keras_adam"),
    "hard_additive_autodiff_compiled": ("hard_additive_autodiff",),
    "hard_additive": ("hard_additive_whole_baseline", "hard_additive_autodiff_compiled"),
    "hard_additive_moving_average": ("hard_additive",),
}
# Cases whose per-op profile the report carries (a profiled run of three steps).
PROFILED = ("soft_additive", "hard_additive", "soft_additive_ops", "soft_additive_bf16")
PROFILE_OPS = 12
DECODER_SIZES = (
    "grid",
    "feature_dim",
    "embed_dim",
    "hidden_dim",
    "attention_dim",
    "vocab_words",
    "batch",
    "words",
)


def stats(values):
    """Median, min, max and interquartile range of a list of numbers."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "iqr": q3 - q1,
        "n": len(values),
    }


def time_calls(fn, warmup, repeats, number=1):
    """Seconds per call of `fn` (which must block until its result is ready).

    Calls it `warmup` times (tracing, compiling, caches), then times `repeats` rounds
    of `number` calls each.

    Returns:
      list of seconds per call, one per round.
    """
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        seconds.append((time.perf_counter() - start) / number)
    return seconds


def rate(seconds, amount):
    """Stats of `amount / s` over timed rounds (min rate from the slowest round)."""
    return stats([amount / s for s in seconds])


def blocking(fn, *args):
    """`fn(*args)`, with every output tensor fetched to the host."""
    return lambda: tf.nest.map_structure(lambda t: getattr(t, "numpy", lambda: t)(), fn(*args))


def guarded(case):
    """Runs one case; an exception becomes {"error": ...} in the report."""
    try:
        return case()
    except Exception as e:  # noqa: BLE001 - a failing case is reported, not fatal
        return error_report(e)


def error_report(error):
    """{"error": type and first line of the message, "where": the last frames}."""
    lines = str(error).strip().splitlines() or [""]
    frames = traceback.extract_tb(error.__traceback__)
    return {
        "error": f"{type(error).__name__}: {lines[0]}"[:500],
        "where": [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames[-3:]],
    }


def peak_rss_mb():
    """Peak resident memory of this process so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine_info():
    """`sat_tf.utils.machine.describe()` with the load, TensorFlow's threads and allocator."""
    return {
        **machine.describe(),
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        # bfc, onednn or default (sat_tf.cpu_allocator); sat_tf asks for bfc on import.
        "cpu_allocator": sat_tf.cpu_allocator(),
    }


def decoder_shape(p, attention="soft", score="additive"):
    return flops.Shape(
        locations=p["grid"][0] * p["grid"][1],
        feature_dim=p["feature_dim"],
        embed_dim=p["embed_dim"],
        hidden_dim=p["hidden_dim"],
        attention_dim=p["attention_dim"],
        vocab_size=p["vocab_words"] + SPECIALS,
        attention=attention,
        score=score,
        hard_gate=Config().hard_gate,
    )


def feature_model(p, attention="soft", score="additive", optimizer="fused"):
    """A `build_model` captioner on cached (L, D) features, as train_lib builds it
    (`optimizer="keras"`: with Keras's own Adam)."""
    config = Config(
        use_feature_cache=True,
        vocab_size=p["vocab_words"],
        embed_dim=p["embed_dim"],
        hidden_dim=p["hidden_dim"],
        attention_dim=p["attention_dim"],
        attention=attention,
        attention_score=score,
        # Hard attention samples from the first step: the warm-up steps would time the
        # expected-context path instead.
        hard_warmup_steps=0,
        lr_schedule="constant",
    )
    locations = p["grid"][0] * p["grid"][1]
    model = build_model(config, p["vocab_words"] + SPECIALS, (locations, p["feature_dim"]))
    model.compile(optimizer=optimizers.build(config, fused=optimizer != "keras"))
    model.optimizer.build(model.trainable_variables)
    return model


def train_batch(p, seed=0):
    """Fixed batch: random features and captions of exactly `words` words."""
    rng = np.random.default_rng(seed)
    locations = p["grid"][0] * p["grid"][1]
    batch, words = p["batch"], p["words"]
    middle = rng.integers(SPECIALS, p["vocab_words"] + SPECIALS, (batch, words))
    captions = np.concatenate(
        [
            np.full((batch, 1), vocab_lib.START_ID),
            middle,
            np.full((batch, 1), vocab_lib.END_ID),
        ],
        axis=1,
    )
    features = rng.normal(size=(batch, locations, p["feature_dim"]))
    return {
        "features": tf.constant(features, tf.float32),
        "caption": tf.constant(captions, tf.int32),
    }


def matmul_product(p):
    """(a blocking call of one n x n float32 product under `tf.function`, its GFLOP)."""
    n = p["matmul_n"]
    a = tf.random.normal([n, n])
    b = tf.random.normal([n, n])
    product = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)))
    return blocking(product), 2 * n**3 / 1e9


def case_matmul(p):
    product, gflop = matmul_product(p)
    seconds = time_calls(product, p["warmup"], p["repeats"], number=3)
    return {"n": p["matmul_n"], "seconds": stats(seconds), "gflops": rate(seconds, gflop)}


def case_memory_bandwidth(p):
    """GB/s of streaming a large float32 tensor: a full read (reduce_sum), and a scaled
    copy into another variable (one read and one write)."""
    count = p["bandwidth_mb"] * 2**20 // 4
    x = tf.Variable(tf.random.uniform([count]))
    y = tf.Variable(tf.zeros([count]))
    read = tf.function(lambda: tf.reduce_sum(x))

    @tf.function
    def scale():
        y.assign(2.0 * x)

    size = count * 4
    read_s = time_calls(blocking(read), p["warmup"], p["repeats"], number=3)
    scale_s = time_calls(blocking(scale), p["warmup"], p["repeats"], number=3)
    return {
        "megabytes": p["bandwidth_mb"],
        "read_gbps": rate(read_s, size / 1e9),
        "read_write_gbps": rate(scale_s, 2 * size / 1e9),
    }


def case_annotation_pass(p, train):
    """The per-word pass over the annotations that the fused recurrence makes twice a word
    (the context `sum_i alpha_i a_i` forward, `d alpha = a dz` backward), at each train
    scale: milliseconds, GB/s of the float32 annotations read, and the same product with
    the annotations stored as bfloat16 (the lever of halving the bytes read), as a
    speed-up over float32 in this run. `share_of_train_step` is two passes a word over
    the soft step's median time of this run's train_step case, where it ran."""
    out = {}
    for scale, shape in TRAIN_SHAPES.items():
        q = {**p, **shape}
        batch, cells, dim = q["batch"], q["grid"][0] * q["grid"][1], q["feature_dim"]
        annotations = tf.random.normal([batch, cells, dim])
        alpha = tf.nn.softmax(tf.random.normal([batch, 1, cells]))
        stored = {"float32": annotations, "bfloat16": tf.cast(annotations, tf.bfloat16)}

        def product(a, alpha=alpha):
            return tf.function(lambda: tf.reduce_sum(tf.matmul(tf.cast(alpha, a.dtype), a)))

        seconds = {
            dtype: time_calls(blocking(product(a)), q["warmup"], q["repeats"], number=10)
            for dtype, a in stored.items()
        }
        f32 = statistics.median(seconds["float32"])
        row = {
            "shape": [batch, cells, dim],
            "float32_ms": stats([1e3 * x for x in seconds["float32"]]),
            "float32_read_gbps": round(4 * batch * cells * dim / f32 / 1e9, 1),
            "bfloat16_ms": stats([1e3 * x for x in seconds["bfloat16"]]),
            "bfloat16_speedup": round(f32 / statistics.median(seconds["bfloat16"]), 3),
        }
        soft = train.get(scale, {}).get("soft_additive", {})
        step = soft.get("seconds_per_step", {}).get("median")
        if step:
            row["share_of_train_step"] = round(2 * q["words"] * f32 / step, 3)
        out[scale] = row
    return out


def op_profile(fn, calls=3, top=PROFILE_OPS):
    """Where `fn`'s time goes: a `tf.profiler` trace of `calls` calls, summed per op.

    Every op kernel the executor runs is one event on a `tf_Compute` line of the host
    plane, named "<node name>:<op type>"; its duration counts the work it hands to the
    intra-op threads. Summed over ops (which may overlap on 2 cores), shares are of that
    sum, seconds per call.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    fn()  # traced and warm before the trace starts
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            for _ in range(calls):
                fn()
        finally:
            tf.profiler.experimental.stop()
        paths = [
            os.path.join(root, name)
            for root, _, names in os.walk(logdir)
            for name in names
            if name.endswith(".xplane.pb")
        ]
        space = xplane_pb2.XSpace()
        with open(paths[0], "rb") as f:
            space.ParseFromString(f.read())
    by_type, by_node, by_region = {}, {}, {}
    for plane in space.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                node, _, op = name.rpartition(":")
                if not node or "::" in name:
                    continue  # executor and thread-pool bookkeeping, not an op
                seconds = event.duration_ps / 1e12 / calls
                by_type[op] = by_type.get(op, 0.0) + seconds
                by_node[name] = by_node.get(name, 0.0) + seconds
                region = _region(node)
                by_region[region] = by_region.get(region, 0.0) + seconds
    total = sum(by_type.values())

    def table(counts):
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        return [
            {"op": k, "seconds_per_call": round(v, 6), "share": round(v / total, 4)}
            for k, v in ranked
        ]

    return {
        "op_seconds_per_call": total,
        "calls": calls,
        "by_region": table(by_region),
        "by_op_type": table(by_type),
        "by_node": table(by_node),
    }


def _region(node):
    """Which part of a train step an op belongs to, from its node name: the forward time
    loop, the backward time loop (the hand-written one's or autodiff's), the gradients
    outside the loops, the optimizer, or the rest (products over all steps, the loss)."""
    if node.startswith(("adam/", "Adam/", "SGD/", "rmsprop/")) or "/adam/" in node:
        return "optimizer"
    in_loop = "while/body" in node or "while_grad" in node
    backward = node.startswith("while/") or "gradient" in node or "_grad" in node
    if in_loop:
        return "backward loop" if backward else "forward loop"
    return "gradients outside the loops" if backward else "forward outside the loops"


def case_train_step(
    p, attention, score, jit, policy="float32", schedule="fused", optimizer="fused", profile=False
):
    """The train step, timed in rounds that alternate with three matmul products.

    Its share of the float32 matmul rate is taken within each round (step GFLOP/s over
    the rate of the products right after it), so that a change of the machine's speed
    during the run moves both alike; the median over rounds is reported. `policy` is the
    Keras dtype policy the model is built under (the matmul yardstick stays float32).
    """
    model, step = train_step_fn(p, attention, score, jit, policy, schedule, optimizer)
    product, product_gflop = matmul_product(p)
    try:
        for _ in range(p["warmup"]):
            step()
            product()
    except Exception as e:  # noqa: BLE001 - XLA may reject the while loop: report it
        return error_report(e)
    seconds, product_seconds = [], []
    for _ in range(p["repeats"]):
        seconds += time_calls(step, 0, 1)
        product_seconds += time_calls(product, 0, 1, number=3)
    counts = flops.train_step_flops(decoder_shape(p, attention, score), p["batch"], p["words"] + 1)
    gflop = counts["total"] / 1e9
    fractions = [
        (gflop / s) / (product_gflop / m) for s, m in zip(seconds, product_seconds, strict=True)
    ]
    report = {
        "seconds_per_step": stats(seconds),
        "captions_per_s": rate(seconds, p["batch"]),
        "batches_per_s": rate(seconds, 1),
        "flops_per_step": counts,
        "gflops": rate(seconds, gflop),
        "matmul_gflops_alongside": rate(product_seconds, product_gflop),
        "fraction_of_matmul_rate": statistics.median(fractions),
        "fraction_of_matmul_rate_by_round": stats(fractions),
        "parameters": int(sum(np.prod(v.shape) for v in model.trainable_weights)),
        "parameters_analytic": decoder_shape(p, attention, score).parameters(),
    }
    report["compiled_score"] = schedule_lib.uses_compiled_score(model.decoder)
    settings = model.settings
    if attention == "hard" and settings.reinforce_baseline == "argmax":
        # The FLOP count has one forward pass; the argmax baseline's pass adds another,
        # without gradient, over the sampled captions (expected share 1 - hard_mix_prob)
        # or, for "fused_whole_baseline", over every caption.
        rows = 1.0 if schedule == "fused_whole_baseline" else 1.0 - settings.hard_mix_prob
        executed = counts["total"] + rows * counts["forward"]
        report["fraction_of_matmul_rate_with_baseline_pass"] = (
            report["fraction_of_matmul_rate"] * executed / counts["total"]
        )
    if profile:
        report["profile"] = op_profile(step)
    return report


def train_step_fn(p, attention, score, jit, policy="float32", schedule="fused", optimizer="fused"):
    """(model, its train step on `train_batch(p)` as a blocking call) for one case."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = feature_model(p, attention, score, optimizer)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    if not schedule.startswith("autodiff"):
        model.decoder.fused_hard = True  # the default, set for the fused cases all the same
    # XLA cannot compile the score's op (a custom op without an XLA kernel).
    compiled = ("fused", "fused_whole_baseline", "fused_moving_average", "autodiff_compiled")
    model.decoder.compiled_score = schedule in compiled and not jit
    if schedule == "fused_moving_average":
        model.settings = dataclasses.replace(model.settings, reinforce_baseline="moving_average")
    train_step = model.train_step
    if schedule == "fused_whole_baseline":
        # Patched while the step runs, so while `tf.function` traces it: the graph holds
        # the whole-batch pass.
        patch = mock.patch.object(losses, "sampled_argmax_reward", whole_batch_argmax_reward)
        train_step = patch(train_step)
    if schedule.startswith("autodiff"):
        # The fast schedule without its recurrence: the reference loop (with the compiled
        # score for "autodiff_compiled"), patched while `tf.function` traces the step.
        patch = mock.patch.object(schedule_lib, "uses_recurrence", lambda decoder: False)
        train_step = patch(train_step)
    return model, blocking(tf.function(train_step, jit_compile=jit), train_batch(p))


class _TimedRewarder:
    """A CIDEr-D rewarder that adds the seconds of its calls to `seconds`."""

    def __init__(self, rewarder):
        self.rewarder, self.seconds = rewarder, 0.0

    def __call__(self, tokens, image_index):
        start = time.perf_counter()
        try:
            return self.rewarder(tokens, image_index)
        finally:
            self.seconds += time.perf_counter() - start


def case_scst_step(p, samples=5):
    """The self-critical train step (`--scst`, soft attention, mean baseline): `batch`
    sampled captions, `batch // samples` images each sampled `samples` times, rewarded
    by CIDEr-D against 5 random references of `words` words an image (document
    frequencies over 1,000 such images), and the share of the step's time spent in the
    reward (`tf.numpy_function`, on the host). An untrained model samples captions to
    the length limit (`words + 4` tokens): its reward and its decoding cost at least
    what a trained model's do, whose samples end sooner."""
    rng = np.random.default_rng(0)
    model = feature_model(p, "soft")
    model.self_critical = self_critical.SelfCriticalSettings(samples, "mean", p["words"] + 4)
    images = p["batch"] // samples

    def references():
        ids = rng.integers(SPECIALS, p["vocab_words"] + SPECIALS, (5, p["words"]))
        return [list(map(int, row)) + [vocab_lib.END_ID] for row in ids]

    corpus = [references() for _ in range(1000)]
    scorer = cider.CiderD.from_references(corpus)
    rewarder = model.rewarder = _TimedRewarder(cider.Rewarder(scorer, corpus, vocab_lib.END_ID))
    locations = p["grid"][0] * p["grid"][1]
    batch = {
        "features": tf.constant(rng.normal(size=(images, locations, p["feature_dim"])), tf.float32),
        "image_index": tf.range(images, dtype=tf.int32),
    }
    step = blocking(tf.function(model.train_step), batch)
    for _ in range(p["warmup"]):
        step()
    rewarder.seconds = 0.0
    seconds = time_calls(step, 0, p["repeats"])
    return {
        "images_per_step": images,
        "samples_per_image": samples,
        "max_tokens": p["words"] + 4,
        "seconds_per_step": stats(seconds),
        "sampled_captions_per_s": rate(seconds, images * samples),
        "reward_seconds_per_step": rewarder.seconds / len(seconds),
        "reward_share": rewarder.seconds / sum(seconds),
    }


def whole_batch_argmax_reward(decoder, features, captions, mask, to_go, sampled, reward, state):
    """`losses.sampled_argmax_reward` as it was until stop 49: the argmax baseline's
    pass decodes every caption of the batch whenever any sampled (the same values at the
    sampled rows; the others are never read)."""
    return tf.cond(
        tf.reduce_any(sampled > 0),
        lambda: losses.argmax_reward(decoder, features, captions, mask, to_go, state),
        lambda: tf.zeros_like(reward),
    )


def case_interleaved(p, name, base):
    """The speed-up of case `name` over case `base` from steps timed in alternating
    rounds of one process (base, then name, twice `repeats` times): the machine's drift
    between rounds moves both alike, so each round's ratio of times is one sample."""
    steps = [train_step_fn(p, *TRAIN_CASES[n])[1] for n in (base, name)]
    for _ in range(p["warmup"]):
        for step in steps:
            step()
    ratios = []
    for _ in range(2 * p["repeats"]):
        base_seconds, seconds = (time_calls(step, 0, 1)[0] for step in steps)
        ratios.append(base_seconds / seconds)
    return {"base": base, "speedup_by_round": stats(ratios), "speedup": statistics.median(ratios)}


def train_shapes(p):
    """(name, sizes) of every shape of TRAIN_SHAPES, each applied to `p`; with --quick
    only the first name, at `p`'s own small sizes."""
    for shape_name, sizes in TRAIN_SHAPES.items():
        yield shape_name, ({**p, **sizes} if p is FULL else p)
        if p is not FULL:
            return


def train_step_cases(p, names=None):
    """The cases `names` (None: all) of TRAIN_CASES at every size of TRAIN_SHAPES, each case of
    SPEEDUP_BASELINES with its speed-up over those of its baselines that ran, measured
    in the same run, as a ratio of times and as a ratio of shares of the matmul rate,
    and each case of INTERLEAVED also timed against its baseline in alternating rounds."""
    results = {}
    for shape_name, shape_p in train_shapes(p):
        cases = results[shape_name] = {"sizes": {k: shape_p[k] for k in DECODER_SIZES}}
        for name, settings in TRAIN_CASES.items():
            if names is not None and name not in names:
                continue
            cases[name] = guarded(
                lambda sp=shape_p, s=settings, n=name: case_train_step(
                    sp, *s, profile=n in PROFILED
                )
            )
        if names is None or "scst" in names:
            cases["scst"] = guarded(lambda sp=shape_p: case_scst_step(sp))
        for name, bases in INTERLEAVED.items():
            for base in bases:
                if name in cases and base in cases:
                    cases[name]["interleaved" + ("" if base == bases[0] else "_" + base)] = guarded(
                        lambda sp=shape_p, n=name, b=base: case_interleaved(sp, n, b)
                    )
        for name, baselines in SPEEDUP_BASELINES.items():
            for base in baselines:
                if name not in cases or base not in cases:
                    continue
                mine = cases[name].get("seconds_per_step", {}).get("median")
                then = cases[base].get("seconds_per_step", {}).get("median")
                if mine and then:
                    cases[name]["speedup_over_" + base] = then / mine
                    # The same ratio with each case's time taken against the matmul
                    # products of its own rounds: the machine's drift between the two
                    # cases, minutes apart, cancels (both count the same FLOPs).
                    cases[name]["speedup_drift_corrected_over_" + base] = (
                        cases[name]["fraction_of_matmul_rate"]
                        / cases[base]["fraction_of_matmul_rate"]
                    )
    return results


def product_loop(rows, inner, cols, transpose_a, transpose_b, calls, min_gflop=2.0):
    """(a blocking call of `repeats` x `calls` products of one shape in a `tf.while_loop`
    (one after the other, as a recurrence runs them), `repeats`): its operands stored as
    TensorFlow's gradient of a product reads them, and repeated until a call holds
    `min_gflop`, so that the call's own overhead does not count."""
    repeats = max(1, math.ceil(min_gflop * 1e9 / (2 * rows * inner * cols * calls)))
    calls *= repeats
    a = tf.random.normal([inner, rows] if transpose_a else [rows, inner])
    b = tf.random.normal([cols, inner] if transpose_b else [inner, cols])

    def body(i, out):
        return i + 1, tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)

    loop = tf.function(
        lambda: tf.reduce_sum(
            tf.while_loop(
                lambda i, _: i < calls, body, (0, tf.zeros([rows, cols])), parallel_iterations=1
            )[1]
        )
    )
    return blocking(loop), repeats


def case_step_products(p, attention="soft", score="additive"):
    """The train step's matrix products (`flops.train_step_products`) timed alone at their
    shapes, in rounds that alternate with the matmul yardstick: the seconds a step needs
    for its products alone, whatever runs around them, and their rate over the
    yardstick's (the products' efficiency at their shapes). A gradient product is timed
    with its operands transposed, as TensorFlow's gradient reads them, and with them
    stored the other way (a schedule can transpose a kernel once, outside the loop, as
    the fused recurrence does; that transposition is not timed); each counts at the
    faster of the two."""
    shape = decoder_shape(p, attention, score)
    listed = flops.train_step_products(shape, p["batch"], p["words"] + 1)
    layouts = [[spec[1:]] for spec in listed]
    for forms, (_, r, k, c, ta, tb, calls) in zip(layouts, listed, strict=True):
        if ta or tb:
            forms.append((r, k, c, False, False, calls))
    loops = [[product_loop(*form) for form in forms] for forms in layouts]
    product, product_gflop = matmul_product(p)
    for _ in range(p["warmup"]):
        for forms in loops:
            for loop, _ in forms:
                loop()
        product()
    rounds, per_product = [], [[[] for _ in forms] for forms in loops]
    for _ in range(p["repeats"]):
        total = 0.0
        for times, forms in zip(per_product, loops, strict=True):
            for form_times, (loop, count) in zip(times, forms, strict=True):
                form_times.append(time_calls(loop, 0, 1)[0] / count)
            total += min(form_times[-1] for form_times in times)
        yardstick = time_calls(product, 0, 1, number=3)[0]
        rounds.append((total, product_gflop / yardstick))
    gflop = sum(2 * r * k * c * calls for _, r, k, c, _, _, calls in listed) / 1e9
    seconds = [total for total, _ in rounds]

    def entry(spec, times):
        name, r, k, c, ta, tb, calls = spec
        medians = [statistics.median(form_times) for form_times in times]
        report = {
            "name": name,
            "shape": [r, k, c],
            "transposed": [ta, tb],
            "calls": calls,
            "seconds": min(medians),
            "gflops": 2 * r * k * c * calls / min(medians) / 1e9,
        }
        if len(medians) > 1:
            report["seconds_transposed"], report["seconds_stored_transposed"] = medians
        return report

    return {
        "attention": attention,
        "score": score,
        "seconds": stats(seconds),
        "gflop": gflop,
        "gflops": rate(seconds, gflop),
        "fraction_of_matmul_rate_by_round": stats(
            [gflop / total / yardstick for total, yardstick in rounds]
        ),
        "matmul_gflops_alongside": stats([yardstick for _, yardstick in rounds]),
        "products": [entry(*pair) for pair in zip(listed, per_product, strict=True)],
    }


def step_products_cases(p):
    """`case_step_products` for soft attention with the additive score at every size of
    TRAIN_SHAPES (one with --quick)."""
    return {
        shape_name: guarded(lambda sp=shape_p: case_step_products(sp))
        for shape_name, shape_p in train_shapes(p)
    }


def add_share_bounds(train, read_gbps, products=None):
    """Adds to every timed train case the share of the matmul rate it could reach at
    most (`flops.share_bound`): its FLOPs at the matmul rate measured alongside, and its
    per-word passes (`flops.train_step_pass_bytes`: the fewest any schedule needs, which
    the compiled score makes, and for the fused recurrence's cases without XLA that run
    the score as TensorFlow ops, the passes those ops make) at
    `read_gbps`, this run's read bandwidth; bfloat16 annotations are 2 bytes a value.
    With `products` (`step_products_cases`), the float32 soft additive cases get a
    tighter one, `products_at_their_shapes`: the products' measured seconds instead of
    their FLOPs at the 2048-square rate, and the fewest passes."""
    if not read_gbps:
        return
    for scale, cases in train.items():
        p = cases["sizes"]
        timed = (products or {}).get(scale, {})
        for name, case in cases.items():
            if name == "sizes" or "flops_per_step" not in case:
                continue
            attention, score, jit, policy, schedule = TRAIN_CASES[name][:5]
            passes = flops.train_step_pass_bytes(
                decoder_shape(p, attention, score),
                p["batch"],
                p["words"] + 1,
                bytes_per_value=2 if policy == "mixed_bfloat16" else 4,
            )
            matmul = case["matmul_gflops_alongside"]["median"]
            step_flops = case["flops_per_step"]["total"]
            bound = case["share_bound"] = {"read_gbps": read_gbps, "pass_bytes": passes}
            bound["minimal_passes"] = flops.share_bound(
                step_flops, passes["minimal"], matmul, read_gbps
            )
            if "seconds" in timed and (attention, score, policy) == ("soft", "additive", "float32"):
                bound["products_at_their_shapes"] = flops.share_bound(
                    step_flops,
                    passes["minimal"],
                    timed["matmul_gflops_alongside"]["median"],
                    read_gbps,
                    product_seconds=timed["seconds"]["median"],
                )
            if schedule.startswith("fused") and not jit and not case.get("compiled_score"):
                bound["fused_recurrence_passes"] = flops.share_bound(
                    step_flops, passes["fused_recurrence"], matmul, read_gbps
                )


def decode_model(p):
    """The paper-scale soft decoder with `<end>` made impossible (its output bias set to
    -1e4), so that every caption runs the full `words` steps whatever the weights."""
    model = feature_model(p)
    bias = model.decoder.deep_output.bias.numpy()
    bias[vocab_lib.END_ID] = -1e4
    model.decoder.deep_output.bias.assign(bias)
    return model


def generate_fn(p, model, beam, jit_compile=False):
    """`model.generate` from (B, L, D) features under `tf.function`, `words` steps."""
    locations = p["grid"][0] * p["grid"][1]
    # A dynamic batch dimension, as in the exported signatures.
    spec = tf.TensorSpec([None, locations, p["feature_dim"]], tf.float32)

    @tf.function(input_signature=[spec], jit_compile=jit_compile)
    def run(features):
        return model.generate({"features": features}, max_length=p["words"], beam_size=beam)

    return run


def weight_products_fn(model, steps):
    """The greedy step's weight products alone at batch 1, chained over `steps` steps.

    Each product's input is made from the previous product's output, so they run one
    after another with nothing else beside them: any graph that reads these weights once
    per step costs at least this, and greedy decoding over it is the loop's own overhead.
    """
    decoder = model.decoder
    kernels = [
        layer.kernel
        for layer in (
            decoder.lstm_hidden,
            decoder.f_att.u_a,
            decoder.lstm_embed,
            decoder.lstm_context,
            decoder.out_h,
            decoder.out_z,
            decoder.deep_output,
        )
    ]

    @tf.function
    def chain():
        def body(t, carry):
            for kernel in kernels:
                inputs = tf.fill([1, kernel.shape[0]], carry)
                carry += 1e-9 * tf.matmul(inputs, kernel)[0, 0]
            return t + 1, carry

        return tf.while_loop(lambda t, _: t < steps, body, (0, tf.constant(0.0)))[1]

    return blocking(chain)


def greedy_over_weight_products(p, model, features):
    """Greedy decoding at batch 1 and `weight_products_fn`, alternated round by round;
    the ratio is taken within each round, so a change of the machine's speed (its
    memory bandwidth above all) during the run cancels."""
    greedy = blocking(generate_fn(p, model, 1), features)
    products = weight_products_fn(model, p["words"])
    for _ in range(p["warmup"]):
        greedy()
        products()
    greedy_s, products_s = [], []
    for _ in range(3 * p["repeats"]):
        greedy_s += time_calls(greedy, 0, 1)
        products_s += time_calls(products, 0, 1)
    return {
        "greedy_ms": stats([1e3 * s for s in greedy_s]),
        "weight_products_ms": stats([1e3 * s for s in products_s]),
        "ratio": stats([g / w for g, w in zip(greedy_s, products_s, strict=True)]),
    }


def case_decode(p, bandwidth_gbps):
    """Greedy and beam-3 decoding from features with the paper-scale decoder
    (`decode_model`: every caption runs the full `words` steps)."""
    model = decode_model(p)
    steps = p["words"]
    locations = p["grid"][0] * p["grid"][1]
    rng = np.random.default_rng(1)
    result = {"steps": steps}

    def random_features(batch):
        return tf.constant(rng.normal(size=(batch, locations, p["feature_dim"])), tf.float32)

    def timed(fn, batch):
        seconds = time_calls(blocking(fn, random_features(batch)), p["warmup"], p["repeats"])
        out = {"seconds": stats(seconds), "images_per_s": rate(seconds, batch)}
        if batch == 1:
            out["ms_per_image"] = stats([1e3 * s for s in seconds])
        return out

    for beam in (1, 3):
        name = "greedy" if beam == 1 else f"beam{beam}"
        fn = generate_fn(p, model, beam)
        for batch in (1, p["decode_batch"]):
            result[f"{name}_batch{batch}"] = guarded(lambda f=fn, b=batch: timed(f, b))
    result["greedy_batch1_over_weight_products"] = guarded(
        lambda: greedy_over_weight_products(p, model, random_features(1))
    )
    # The same greedy loop compiled by XLA (captioning with --jit_compile), which fuses
    # the step's small ops.
    result["greedy_batch1_jit"] = guarded(
        lambda: timed(generate_fn(p, model, 1, jit_compile=True), 1)
    )
    step_bytes = flops.decode_step_bytes(decoder_shape(p))
    if not bandwidth_gbps:
        result["bandwidth_bound_greedy_batch1"] = {"bytes_per_step": step_bytes}
        return result
    seconds_per_step_byte = steps / (bandwidth_gbps * 1e9)
    bound_ms = 1e3 * step_bytes["total"] * seconds_per_step_byte
    measured = result["greedy_batch1"].get("ms_per_image", {}).get("median")
    result["bandwidth_bound_greedy_batch1"] = {
        "bytes_per_step": step_bytes,
        "read_gbps": bandwidth_gbps,
        "ms_per_image": bound_ms,
        "measured_over_bound": measured / bound_ms if measured else None,
    }
    return result


def case_extract(p):
    size, batch = p["extract_size"], p["extract_batch"]
    images = tf.random.uniform([batch, size, size, 3], 0, 255)
    result = {"image_size": size, "batch": batch}
    encoders = {"vgg19": None, "efficientnet_lite0": "imagenet"}
    for name, weights in encoders.items():

        def run(name=name, weights=weights):
            try:
                encoder = ImageEncoder(name, size, weights)
                source = weights or "random"
            except (FileNotFoundError, ValueError) as e:
                encoder, source = ImageEncoder(name, size, None), f"random ({e})"
            fn = tf.function(lambda x: encoder(x, training=False))
            seconds = time_calls(blocking(fn, images), p["warmup"], p["repeats"])
            return {
                "weights": source,
                "features": list(encoder.feature_grid()),
                "images_per_s": rate(seconds, batch),
            }

        result[name] = guarded(run)
    return result


def _synthetic_records(p, rng):
    words = [f"w{i}" for i in range(p["vocab_words"])]
    ranks = np.arange(1, len(words) + 1)
    zipf = (1.0 / ranks) / (1.0 / ranks).sum()
    records = []
    for i in range(p["pipeline_images"]):
        captions = tuple(
            " ".join(rng.choice(words, size=rng.integers(8, 21), p=zipf)) for _ in range(5)
        )
        records.append(
            Record(image_id=str(i), image_path=f"{i}.jpg", captions=captions, split="train")
        )
    return records


def case_input_pipeline(p, train_batches_per_s):
    """Batches/s of `train_dataset` on in-memory float16 features, length-bucketed."""
    rng = np.random.default_rng(2)
    records = _synthetic_records(p, rng)
    vocab = vocab_lib.Vocab.build(
        (c for r in records for c in r.captions), max_words=p["vocab_words"]
    )
    locations = p["grid"][0] * p["grid"][1]
    features = rng.normal(size=(len(records), locations, p["feature_dim"])).astype(np.float16)
    ds = input_pipeline.train_dataset(
        records,
        vocab,
        image_size=224,
        crop_fraction=224 / 256,
        batch_size=p["batch"],
        max_words=40,
        features=tf.data.Dataset.from_tensor_slices(features),
    )
    iterator = iter(ds)
    lengths = set()

    def next_batch():
        batch = next(iterator)
        lengths.add(int(batch["caption"].shape[1]))

    number = 10
    seconds = time_calls(next_batch, 3 * number, p["repeats"], number=number)
    batches = rate(seconds, 1)
    return {
        "images": len(records),
        "feature_dtype": "float16",
        "batch": p["batch"],
        "batches_per_s": batches,
        "caption_lengths_seen": len(lengths),
        "train_step_batches_per_s": train_batches_per_s,
        "pipeline_over_train_step": batches["median"] / train_batches_per_s
        if train_batches_per_s
        else None,
    }


def _jpeg(size, seed):
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def case_serve(p):
    """The exported SavedModel's serving_default on JPEG bytes, and the TFLite file."""
    try:
        from sat_tf.serving import exporting
    except ImportError as e:
        return {"skipped": f"sat_tf.serving.exporting cannot be imported: {e}"}
    words = [f"w{i}" for i in range(p["vocab_words"])]
    vocab = vocab_lib.Vocab(list(vocab_lib.SPECIALS) + words)
    config = Config(
        encoder=p["serve_encoder"],
        image_size=p["serve_image_size"],
        vocab_size=p["vocab_words"],
        embed_dim=p["embed_dim"],
        hidden_dim=p["hidden_dim"],
        attention_dim=p["attention_dim"],
        max_decode_length=p["words"],
    )
    model = build_model(config, len(vocab))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "export")
        try:
            start = time.perf_counter()
            info = exporting.export(model, vocab, config, path, tflite=True)
            export_seconds = time.perf_counter() - start
        except Exception as e:  # noqa: BLE001 - the export belongs to another module
            return {"skipped": "export failed", **error_report(e)}
        result = {
            "encoder": config.encoder,
            "image_size": config.image_size,
            "max_length": config.max_decode_length,
            "export_seconds": export_seconds,
        }
        signature = tf.saved_model.load(path).signatures["serving_default"]
        for batch in (1, p["serve_batch"]):
            data = tf.constant([_jpeg((320, 240), i) for i in range(batch)])
            seconds = time_calls(
                blocking(lambda d: signature(image_bytes=d), data), p["warmup"], p["repeats"]
            )
            result[f"saved_model_batch{batch}"] = {
                "ms_per_request": stats([1e3 * s for s in seconds]),
                "images_per_s": rate(seconds, batch),
            }
        result["tflite_batch1"] = guarded(lambda: _tflite(p, path, info))
    return result


def _tflite(p, path, info):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=os.path.join(path, info["tflite"]["file"]))
    interpreter.allocate_tensors()
    size = info["image_size"]
    detail = interpreter.get_input_details()[0]
    image = np.random.default_rng(3).uniform(0, 255, (1, size, size, 3)).astype(np.float32)

    def invoke():
        interpreter.set_tensor(detail["index"], image)
        interpreter.invoke()

    seconds = time_calls(invoke, p["warmup"], p["repeats"])
    return {
        "bytes": info["tflite"]["bytes"],
        "ms_per_image": stats([1e3 * s for s in seconds]),
    }


def preset_source(requested):
    """(the preset the preset cases run on, None) or (None, why there is none)."""
    from sat_tf.serving import preset

    if requested:
        return requested, None
    shipped = preset.names()
    if not shipped:
        return None, f"no preset: none is shipped in {preset.PRESETS_DIR}; give --preset"
    return shipped[0], None


def test_records(config, data_dir, limit=0):
    """(the test records of the preset's dataset in `data_dir`, None), or ([], why not)."""
    from sat_tf.data import datasets

    try:
        records = datasets.load_records(config.dataset, data_dir)
    except (ValueError, OSError) as e:
        return [], f"no {config.dataset} test photos in {data_dir}: {e}"
    records = [r for r in records if r.split == "test"]
    return (records[:limit] if limit else records), None


def _read_pixels(path):
    from sat_tf.data import image_io

    with open(path, "rb") as f:
        return image_io.decode_upright(tf.constant(f.read())).numpy()


def _litert(path, threads):
    """A LiteRT runner of a caption TFLite file: float32 (1, S, S, 3) -> (tokens, length)."""
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_path=path, num_threads=threads).get_signature_runner()

    def caption(raw, pixels):
        out = runner(image=pixels)
        return out["tokens"][0], int(out["length"][0])

    return caption


def case_tflite(p, source, data_dir, limit):
    """The preset exported as a SavedModel and as float and int8 (dynamic-range) TFLite
    files: sizes; greedy batch-1 latency per caption in LiteRT and in the SavedModel's
    `caption_images`, the three timed one after another on every photo (the order
    rotating), so a change of the machine's load moves all alike; test-split BLEU-4 and
    CIDEr of each (coco-caption); the share of int8 captions equal to float ones.

    LiteRT gets the photo resized as `image_io.resize_and_crop` does (the app's part);
    the SavedModel gets the decoded uint8 photo and resizes it in its graph. Without
    the dataset, random images give the latencies alone.
    """
    from sat_tf.data import image_io
    from sat_tf.evaluation import metrics
    from sat_tf.serving import exporting, preset
    from sat_tf.training import scoring

    model, vocab, config = inference.load_preset(source)
    metadata = preset.read_metadata(preset.resolve(source))
    records, no_data = test_records(config, data_dir, limit)
    size, crop = config.image_size, config.effective_crop_fraction
    threads = len(os.sched_getaffinity(0))
    result = {"preset": metadata["name"], "images": len(records) or None, "litert_threads": threads}
    if no_data:
        result["quality"] = f"not measured: {no_data}"
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "export")
        start = time.perf_counter()
        # Greedy, as the TFLite files decode (a preset's own beam may be larger).
        info = exporting.export(
            model, vocab, config, folder, beam_size=1, tflite=True, quantize="dynamic"
        )
        result["export_seconds"] = time.perf_counter() - start
        float_bytes, int8_bytes = info["tflite"]["bytes"], info["tflite_int8"]["bytes"]
        result["bytes"] = {"tflite_float": float_bytes, "tflite_int8": int8_bytes}
        result["int8_over_float_bytes"] = int8_bytes / float_bytes
        signature = tf.saved_model.load(folder).signatures["caption_images"]

        def saved_model(raw, pixels):
            out = signature(images=tf.constant(raw[None]))
            return out["tokens"].numpy()[0], int(out["length"].numpy()[0])

        engines = {
            "tflite_float": _litert(os.path.join(folder, exporting.TFLITE_FILE), threads),
            "tflite_int8": _litert(os.path.join(folder, exporting.TFLITE_INT8_FILE), threads),
            "saved_model": saved_model,
        }
        rng = np.random.default_rng(4)
        photos = [(r.image_id, r.image_path) for r in records] or [
            (str(i), None) for i in range(3 * p["repeats"])
        ]
        names = list(engines)
        ms = {name: [] for name in names}
        captions = {name: {} for name in names}
        for k, (image_id, path) in enumerate(photos):
            if path:
                raw = _read_pixels(path)
            else:
                raw = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            pixels = image_io.resize_and_crop(raw, size, crop).numpy()[None]
            if k == 0:
                for _ in range(p["warmup"]):
                    for name in names:
                        engines[name](raw, pixels)
            for name in names[k % len(names) :] + names[: k % len(names)]:
                start = time.perf_counter()
                tokens, length = engines[name](raw, pixels)
                ms[name].append(1e3 * (time.perf_counter() - start))
                captions[name][image_id] = " ".join(vocab.decode(tokens[:length]))

    def share_equal(a, b):
        return statistics.mean(captions[a][i] == captions[b][i] for i, _ in photos)

    result["int8_captions_equal_to_float"] = share_equal("tflite_int8", "tflite_float")
    result["float_captions_equal_to_saved_model"] = share_equal("tflite_float", "saved_model")
    engines_report = result["engines"] = {
        name: {"ms_per_caption": stats(ms[name])} for name in names
    }
    if records:
        refs = scoring.references(records)
        for name in names:
            scores = metrics.coco_scores(refs, captions[name])
            engines_report[name].update({k: scores[k] for k in ("BLEU-4", "CIDEr")})
        stored = publish.stored_scores(metadata, 1) or {}
        result["preset_stored_greedy"] = {k: stored.get(k) for k in ("BLEU-4", "CIDEr")}
    median = {name: engines_report[name]["ms_per_caption"]["median"] for name in names}
    result["int8_speedup_over_saved_model"] = median["saved_model"] / median["tflite_int8"]
    result["int8_speedup_over_float"] = median["tflite_float"] / median["tflite_int8"]
    targets = {
        "int8_bytes_at_most_a_third_of_float": result["int8_over_float_bytes"] <= INT8_SIZE_RATIO,
        "int8_at_least_2x_faster_than_saved_model": result["int8_speedup_over_saved_model"]
        >= INT8_SPEEDUP,
    }
    if records:
        loss = engines_report["tflite_float"]["BLEU-4"] - engines_report["tflite_int8"]["BLEU-4"]
        result["int8_bleu4_below_float"] = loss
        targets["int8_bleu4_within_0.005_of_float"] = loss <= INT8_BLEU4_LOSS
    result["targets_met"] = targets
    return result


def _policy_model(model, vocab, config, policy):
    """The model rebuilt under a Keras dtype policy, with `model`'s weights."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        feature_shape = (model.grid[0] * model.grid[1], model.feature_dim)
        twin = build_model(
            config, len(vocab), feature_shape, model.grid, load_encoder_weights=False
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for source, target in zip(model.weights, twin.weights, strict=True):
        target.assign(tf.cast(source, target.dtype))
    return twin


def case_float16(p, source, data_dir, limit):
    """Greedy decoding of the preset from encoder features with float32 weights and
    compute (what `inference.load_preset` gives), float16 weights and compute (Keras policy
    "float16") and float32 weights with float16 compute ("mixed_float16"): ms per caption
    at batch 1 (the three alternating on every image) and at the batch of all images,
    and the share of captions equal to float32's. Features come from the preset's test
    photos (its encoder run once), else random ones."""
    from sat_tf.serving import preset
    from sat_tf.serving.inference import feature_encoder

    model, vocab, config = inference.load_preset(source)
    if model.encoder is not None:
        return {"skipped": "the float16 case decodes features of a model on cached features"}
    records, no_data = test_records(config, data_dir, limit or FLOAT16_IMAGES)
    locations = model.grid[0] * model.grid[1]
    if records:
        from sat_tf.data import image_io

        encoder = feature_encoder(model, config)
        crop = config.effective_crop_fraction
        pixels = [image_io.load_image_file(r.image_path, config.image_size, crop) for r in records]
        features = np.concatenate(
            [encoder(tf.stack(pixels[i : i + 20])).numpy() for i in range(0, len(pixels), 20)]
        )
    else:
        rng = np.random.default_rng(5)
        features = rng.normal(size=(FLOAT16_IMAGES, locations, model.feature_dim))
    features = features.astype(np.float32)
    spec = tf.TensorSpec([None, locations, model.feature_dim], tf.float32)
    variants = {"float32": model}
    for policy in ("float16", "mixed_float16"):
        variants[policy] = _policy_model(model, vocab, config, policy)
    fns = {
        name: tf.function(
            lambda f, m=m: m.generate({"features": f}, max_length=config.max_decode_length),
            input_signature=[spec],
        )
        for name, m in variants.items()
    }
    names = list(fns)
    ms = {name: [] for name in names}
    tokens = {name: [] for name in names}
    for name in names:
        blocking(fns[name], features[:1])()
    for k in range(len(features)):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            start = time.perf_counter()
            out = fns[name](features[k : k + 1])
            row = out.tokens.numpy()[0]
            ms[name].append(1e3 * (time.perf_counter() - start))
            tokens[name].append(row)
    batch_seconds = {name: [] for name in names}
    for name in names:
        blocking(fns[name], features)()
    for _ in range(p["repeats"]):
        for name in names:
            batch_seconds[name] += time_calls(blocking(fns[name], features), 0, 1)
    result = {
        "preset": preset.read_metadata(preset.resolve(source))["name"],
        "features": "test photos" if records else f"random ({no_data})",
        "images": len(features),
        "variants": {},
    }
    for name in names:
        equal = [np.array_equal(a, b) for a, b in zip(tokens[name], tokens["float32"], strict=True)]
        result["variants"][name] = {
            "greedy_batch1_ms_per_caption": stats(ms[name]),
            f"greedy_batch{len(features)}_ms_per_caption": stats(
                [1e3 * s / len(features) for s in batch_seconds[name]]
            ),
            "captions_equal_to_float32": float(np.mean(equal)),
        }
    return result


def run(quick, only=CASES, preset_name=None, data_dir=FLICKR8K, limit=0, train_cases=None):
    p = QUICK if quick else FULL
    start = time.perf_counter()
    report = {
        "machine": machine_info(),
        "mode": "quick" if quick else "full",
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in p.items()},
        "train_cases": {
            name: dict(
                zip(
                    ("attention", "score", "jit_compile", "policy", "schedule", "optimizer"),
                    (*s, "fused")[:6],
                    strict=True,
                )
            )
            for name, s in TRAIN_CASES.items()
            if train_cases is None or name in train_cases
        },
        "cases": {},
    }
    cases = report["cases"]
    keras.utils.set_random_seed(0)
    if "matmul" in only:
        cases["matmul"] = guarded(lambda: case_matmul(p))
    train = {}
    if "train_step" in only:
        train = cases["train_step"] = train_step_cases(p, train_cases)
        cases["peak_rss_mb_after_train_step"] = peak_rss_mb()
    if "annotation_pass" in only:
        cases["annotation_pass"] = guarded(lambda: case_annotation_pass(p, train))
    if "step_products" in only:
        cases["step_products"] = step_products_cases(p)
    bandwidth = None
    if "memory_bandwidth" in only:
        cases["memory_bandwidth"] = guarded(lambda: case_memory_bandwidth(p))
        bandwidth = cases["memory_bandwidth"].get("read_gbps", {}).get("median")
        add_share_bounds(train, bandwidth, cases.get("step_products"))
    if "decode" in only:
        cases["decode"] = guarded(lambda: case_decode(p, bandwidth))
    if "extract" in only:
        cases["extract"] = guarded(lambda: case_extract(p))
    if "input_pipeline" in only:
        train_rate = (
            train.get("paper", {}).get("soft_additive", {}).get("batches_per_s", {}).get("median")
        )
        cases["input_pipeline"] = guarded(lambda: case_input_pipeline(p, train_rate))
    if "serve" in only:
        cases["serve"] = guarded(lambda: case_serve(p))
    source, no_preset = preset_source(preset_name)
    for name, case in (("tflite", case_tflite), ("float16", case_float16)):
        if name in only:
            if no_preset:
                cases[name] = {"skipped": no_preset}
            else:
                cases[name] = guarded(lambda c=case: c(p, source, data_dir, limit))
    cases["peak_rss_mb_at_end"] = peak_rss_mb()
    report["wall_seconds"] = time.perf_counter() - start
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    parser.add_argument(
        "--only", default=",".join(CASES), help=f"comma-separated cases of {', '.join(CASES)}"
    )
    parser.add_argument(
        "--preset", default=None, help="preset of the tflite and float16 cases; default the shipped"
    )
    parser.add_argument(
        "--data_dir", default=FLICKR8K, help="the preset's dataset, for its test photos"
    )
    parser.add_argument(
        "--images", type=int, default=0, help="test photos of the preset cases; 0 = all"
    )
    parser.add_argument(
        "--train_cases",
        default="",
        help=f"comma-separated train_step cases of {', '.join(TRAIN_CASES)}, scst; '' = all",
    )
    args = parser.parse_args(argv)
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = sorted(set(only) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}")
    train_cases = [c.strip() for c in args.train_cases.split(",") if c.strip()] or None
    unknown = sorted(set(train_cases or ()) - set(TRAIN_CASES) - {"scst"})
    if unknown:
        parser.error(f"unknown train case(s) {', '.join(unknown)}; cases: {', '.join(TRAIN_CASES)}")
    report = run(args.quick, only, args.preset, args.data_dir, args.images, train_cases)
    json.dump(report, sys.stdout, indent=2, default=float)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
