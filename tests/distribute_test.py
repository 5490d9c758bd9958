"""Training under `tf.distribute` and mixed precision (docs/design.md §5.5).

Logical devices and `TF_CONFIG` must be set before TensorFlow starts, so those cases run
this file as a script in a fresh process (`python tests/distribute_test.py
mirrored|worker`), which prints one JSON line; the tests compare those numbers. The
mixed-precision case runs in the test process, under the global dtype policy it sets
and then puts back.

- mirrored: one SGD step (learning rate 1, so the weight change is the gradient) under a
  `MirroredStrategy` over two logical CPUs against one device on the same global batch;
  and a self-critical step under it, each replica sampling and rewarding its own
  images, against that step written out on one device.
- worker: two `MultiWorkerMirroredStrategy` processes on 127.0.0.1, each with its own
  data, train a few steps; the all-reduce must leave both with the same weights.
- mixed: a train step under the `mixed_bfloat16` policy; softmax and loss in float32;
  the loss and the weight change close to those of the same step in float32.
"""

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from sat_tf.config import Config
from sat_tf.model import self_critical
from sat_tf.model.decoder import AttentionDecoder
from sat_tf.model.show_attend_tell import ShowAttendTell, build_model

VOCAB, WIDTH, LOCATIONS, FEATURES = 12, 8, 4, 8
REPLICAS = 2
# name: (attention, attention_score, hard_mix_prob)
MIRRORED_CASES = {
    "soft": ("soft", "additive", 0.5),
    "hard_all_sampled": ("hard", "additive", 0.0),
    "hard_sampled": ("hard", "additive", 0.5),
}
CHILD_TIMEOUT = 300


def _tiny_model(attention="soft", score="additive", hard_mix_prob=0.5, alpha_c=0.01):
    decoder = AttentionDecoder(
        VOCAB,
        embed_dim=WIDTH,
        hidden_dim=WIDTH,
        attention_dim=WIDTH,
        attention=attention,
        attention_score=score,
        dropout=0.0,
        name="decoder",
    )
    # Hard attention as the paper trains it (§4.1): sampling from the first step, the
    # sequence's reward against a moving average per caption length.
    reinforce = dict(
        hard_mix_prob=hard_mix_prob,
        hard_warmup_steps=0,
        reinforce_reward="sequence",
        reinforce_baseline="moving_average",
    )
    model = ShowAttendTell(
        decoder, feature_dim=FEATURES, alpha_c=alpha_c, reinforce=reinforce, seed=3
    )
    model.build()
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    return model


def _global_batch(seed=0):
    """Four captions of 4, 2 | 2, 5 target words: the two replicas' shards hold 6 and 7
    words, and one caption length occurs on both."""
    rng = np.random.default_rng(seed)
    captions = np.array(
        [
            [1, 5, 6, 7, 2, 0],
            [1, 8, 2, 0, 0, 0],
            [1, 9, 2, 0, 0, 0],
            [1, 4, 10, 11, 6, 2],
        ],
        np.int32,
    )
    features = rng.normal(size=(len(captions), LOCATIONS, FEATURES)).astype(np.float32)
    return {"features": features, "caption": captions}


def _fit_one_step(model, batch):
    history = model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    return {name: float(values[0]) for name, values in history.history.items()}


def _named_weights(model, replica=None, strategy=None):
    """{name: list} of the trainable weights and the REINFORCE baselines, the model's
    name dropped from each path; with a strategy, the copy on one replica."""
    variables = model.trainable_weights + [model.baseline, model.baseline_seen]
    names = [v.path.split("/", 1)[1] for v in variables]
    if strategy is not None:
        variables = [strategy.experimental_local_results(v.value)[replica] for v in variables]
    return {name: v.numpy().tolist() for name, v in zip(names, variables, strict=True)}


def _scst_steps(strategy):
    """One self-critical step (SGD with learning rate 1: the weight change is the gradient)
    of a tiny soft-attention model under `strategy` on a global batch of 4 images, 3
    samples each, a reward recording the image index of each sample; and the same step
    on one device, written out: each replica's half of the images sampled with the step's
    seed folded with the replica's id (`self_critical.sample_seed`), the objectives
    averaged over the 12 samples of the global batch."""
    config = Config(
        attention="soft",
        use_feature_cache=True,
        embed_dim=WIDTH,
        hidden_dim=WIDTH,
        attention_dim=WIDTH,
        scst=True,
        scst_samples=3,
        scst_baseline="mean",
        max_caption_length=6,
    )
    keras.utils.set_random_seed(0)
    single = build_model(config, VOCAB, feature_shape=(LOCATIONS, FEATURES), grid=(2, 2))
    single.compile(optimizer=keras.optimizers.SGD(1.0))
    with strategy.scope():
        mirrored = build_model(config, VOCAB, feature_shape=(LOCATIONS, FEATURES), grid=(2, 2))
        mirrored.compile(optimizer=keras.optimizers.SGD(1.0))
    mirrored.set_weights(single.get_weights())
    rewarded = []

    def reward(tokens, image_index):
        # The words before <end>, minus the image index: advantages that differ.
        rewarded.extend(int(i) for i in image_index)
        words = [(list(row) + [2]).index(2) for row in tokens]
        return (np.array(words) - np.array(image_index)).astype(np.float32)

    single.rewarder = mirrored.rewarder = reward
    features = np.random.default_rng(0).normal(size=(4, LOCATIONS, FEATURES)).astype(np.float32)
    index = np.arange(4, dtype=np.int32)
    initial = _named_weights(single)

    seed = keras.random.randint([2], 0, 2**30, seed=single.seed_generator, dtype="int32")
    shard = len(index) // REPLICAS
    with tf.GradientTape() as tape:
        terms = [
            self_critical.self_critical_terms(
                single.self_critical,
                single,
                features[r * shard : (r + 1) * shard],
                index[r * shard : (r + 1) * shard],
                tf.random.experimental.stateless_fold_in(seed, r),
                reward,
            )
            for r in range(REPLICAS)
        ]
        objective = tf.concat([t["objective"] for t in terms], axis=0)  # (12,)
        loss = tf.reduce_mean(objective)
    variables = single.trainable_variables
    for variable, grad in zip(variables, tape.gradient(loss, variables), strict=True):
        variable.assign_sub(grad)
    one_device_rewarded = sorted(rewarded)
    rewarded.clear()

    data = tf.data.Dataset.from_tensors({"features": features, "image_index": index})
    history = mirrored.fit(data, epochs=1, verbose=0)
    return {
        "initial": initial,
        "one_device": _named_weights(single),
        "replicas": [_named_weights(mirrored, r, strategy) for r in range(REPLICAS)],
        "one_device_metrics": {
            "loss": float(loss),
            "reward": float(tf.reduce_mean(tf.concat([t["reward"] for t in terms], 0))),
        },
        "mirrored_metrics": {k: float(v[-1]) for k, v in history.history.items()},
        "one_device_rewarded": one_device_rewarded,
        "rewarded": sorted(rewarded),
    }


def run_mirrored():
    """One step on one device and under MirroredStrategy(2) for every MIRRORED_CASES, and
    self-critical steps under it."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS
    )
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    batch = _global_batch()
    results = {"replicas": strategy.num_replicas_in_sync}
    for name, (attention, score, mix) in MIRRORED_CASES.items():
        keras.utils.set_random_seed(0)
        single = _tiny_model(attention, score, mix)
        with strategy.scope():
            mirrored = _tiny_model(attention, score, mix)
        mirrored.set_weights(single.get_weights())
        case = {"initial": _named_weights(single)}
        if name == "hard_all_sampled":
            seed_state = single.seed_generator.state.numpy()
            terms = single.loss_terms(batch, training=True)
            single.seed_generator.state.assign(seed_state)
            case["reward"] = terms["reward"].numpy().tolist()
            case["sampled"] = terms["sampled"].numpy().tolist()
            case["words"] = terms["words"].numpy().tolist()
        case["single_metrics"] = _fit_one_step(single, batch)
        case["mirrored_metrics"] = _fit_one_step(mirrored, batch)
        case["single"] = _named_weights(single)
        case["replicas"] = [_named_weights(mirrored, r, strategy) for r in range(REPLICAS)]
        results[name] = case
    results["scst"] = _scst_steps(strategy)
    return results


def run_worker():
    """One MultiWorkerMirroredStrategy worker (cluster from TF_CONFIG): a few steps."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    keras.utils.set_random_seed(task)
    with strategy.scope():
        model = _tiny_model("hard", "additive", 0.5)
    batches = [_global_batch(seed=100 * task + step) for step in range(3)]
    data = tf.data.Dataset.from_tensor_slices(
        {k: np.stack([b[k] for b in batches]) for k in batches[0]}
    )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    history = model.fit(data.with_options(options), epochs=1, verbose=0)
    weights = model.trainable_weights + [model.baseline]
    blob = b"".join(np.ascontiguousarray(v.numpy()).tobytes() for v in weights)
    return {
        "task": task,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "sum": float(sum(np.abs(v.numpy()).sum() for v in weights)),
        "loss": history.history["loss"],
        "steps": int(model.optimizer.iterations.numpy()),
        "baseline_slots": np.flatnonzero(model.baseline_seen.numpy()).tolist(),
    }


def run_mixed():
    """For each attention type under the mixed_bfloat16 policy: a train step (SGD with
    learning rate 1: the weight change is the gradient), the loss terms, the decoder
    outputs and greedy decoding; and the same train step under float32, from the same
    weights and seed. {policy: {attention: results}}; errors are reported."""
    batch = _global_batch()
    results = {}
    for policy in ("mixed_bfloat16", "float32"):
        keras.mixed_precision.set_global_policy(policy)
        results[policy] = {}
        for attention in ("soft", "hard", "none"):
            keras.utils.set_random_seed(0)
            try:
                model = _tiny_model(attention)
                initial = _named_weights(model)
                metrics = _fit_one_step(model, batch)
                after = _named_weights(model)
                result = {
                    "metrics": metrics,
                    "step": {k: np.subtract(after[k], v).tolist() for k, v in initial.items()},
                }
                if policy == "float32":
                    results[policy][attention] = result
                    continue
                terms = model.loss_terms(batch, training=True)
                outputs = model(batch)
                decoded = model.generate({"features": batch["features"]}, max_length=6)
                results[policy][attention] = {
                    **result,
                    "terms": {k: v.dtype.name for k, v in terms.items()},
                    "outputs": {k: v.dtype.name for k, v in outputs.items()},
                    "alpha_sum_error": float(np.abs(outputs["alpha"].numpy().sum(-1) - 1).max()),
                    "decoded": {k: v.dtype.name for k, v in decoded._asdict().items()},
                    "decoded_alpha_sum_error": float(
                        np.abs(decoded.attention.numpy()[:, 0].sum(-1) - 1).max()
                    ),
                    "variable_dtypes": sorted({v.dtype for v in model.trainable_weights}),
                    "state_dtype": model.decoder.initial_state(batch["features"])["h"].dtype.name,
                }
            except Exception as e:  # noqa: BLE001 - the parent reports it
                results[policy][attention] = {"error": f"{type(e).__name__}: {e}"[:3000]}
    return results


def _child_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    # The child runs from tests/; make the checkout importable even when not installed.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def _parse(stdout, stderr, what):
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"{what} printed no JSON; stderr tail:\n{stderr[-4000:]}")
    return json.loads(lines[-1])


def _run_child(mode):
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), mode],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=_child_env(),
    )
    if proc.returncode != 0:
        raise AssertionError(f"{mode} child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return _parse(proc.stdout, proc.stderr, mode)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _assert_weights_close(test, actual, expected, atol=1e-5):
    test.assertEqual(sorted(actual), sorted(expected))
    for path in expected:
        np.testing.assert_allclose(actual[path], expected[path], atol=atol, err_msg=path)


@pytest.mark.long(10)
class MirroredTest(tf.test.TestCase):
    results = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.results = _run_child("mirrored")

    def test_two_replicas(self):
        self.assertEqual(self.results["replicas"], REPLICAS)

    def _check_case(self, name):
        case = self.results[name]
        single, replicas = case["single"], case["replicas"]
        self.assertAllClose(
            case["mirrored_metrics"]["loss"], case["single_metrics"]["loss"], rtol=1e-5
        )
        for replica in replicas:
            self.assertEqual(replica, replicas[0], "replicas hold different weights")
        _assert_weights_close(self, replicas[0], single)
        kernel = [p for p in single if p.endswith("deep_output/kernel")][0]
        step = np.abs(np.subtract(single[kernel], case["initial"][kernel])).max()
        self.assertGreater(step, 1e-3, "the step did not change the weights")

    def test_soft_matches_one_device(self):
        self._check_case("soft")

    def test_hard_baseline_update_matches_one_device(self):
        # With hard_mix_prob=0 every caption uses a sampled location, drawn alike on one
        # device and on two replicas; the per-length baselines come from the all-reduced
        # rewards.
        self._check_case("hard_all_sampled")
        case = self.results["hard_all_sampled"]
        self.assertAllEqual(case["sampled"], [1.0, 1.0, 1.0, 1.0])
        path = [p for p in case["single"] if p.endswith("reinforce_baseline")][0]
        slots = np.array(case["words"], np.int64)
        self.assertAllEqual(slots, [4, 2, 2, 5])
        sums = np.bincount(slots, case["reward"], minlength=len(case["single"][path]))
        expected = sums / np.maximum(np.bincount(slots, minlength=len(sums)), 1)
        for replica in case["replicas"]:
            self.assertAllClose(replica[path], expected, atol=1e-5)
        self.assertAllClose(case["single"][path], expected, atol=1e-5)

    def test_hard_sampling_matches_one_device(self):
        # Each replica must draw the samples that one device draws for its rows of the
        # global batch: independent across replicas, the same for any replica count.
        self._check_case("hard_sampled")

    def test_metrics_match_one_device(self):
        # The shards hold 4 + 2 and 2 + 5 target words: nll_per_word must be the
        # global sum over the global word count, not the mean of per-replica ratios.
        for name in ("soft", "hard_all_sampled"):
            case = self.results[name]
            for metric, value in case["single_metrics"].items():
                self.assertAllClose(case["mirrored_metrics"][metric], value, rtol=1e-5, msg=metric)

    def test_self_critical_step_matches_one_device(self):
        scst = self.results["scst"]
        # Each replica rewards its own 2 images x 3 samples: every image 3 times, and none
        # twice as often (a replica rewarding the global batch would).
        self.assertEqual(scst["rewarded"], sorted(list(range(4)) * 3))
        self.assertEqual(scst["one_device_rewarded"], scst["rewarded"])
        for replica in scst["replicas"]:
            self.assertEqual(replica, scst["replicas"][0], "replicas hold different weights")
        # The samples, rewards, baselines and gradient of each replica are those of its
        # images on one device, and the all-reduce sums the gradients of the global mean.
        _assert_weights_close(self, scst["replicas"][0], scst["one_device"])
        for metric, value in scst["one_device_metrics"].items():
            self.assertAllClose(scst["mirrored_metrics"][metric], value, rtol=1e-5, msg=metric)
        kernel = [p for p in scst["initial"] if p.endswith("deep_output/kernel")][0]
        step = np.subtract(scst["one_device"][kernel], scst["initial"][kernel])
        self.assertGreater(np.abs(step).max(), 1e-3, "the step did not change the weights")


def _run_workers(count):
    """Runs `count` workers of one cluster; kills them all once one fails or time is up.

    Returns:
      list of (return code, stdout, stderr), None as the code of a killed worker.
    """
    ports = _free_ports(count)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as files:
        procs, logs = [], []
        try:
            for index in range(count):
                tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
                out, err = (
                    files.enter_context(open(os.path.join(tmp, f"{index}.{kind}"), "w+"))
                    for kind in ("out", "err")
                )
                logs.append((out, err))
                env = _child_env(TF_CONFIG=json.dumps(tf_config))
                command = [sys.executable, os.path.abspath(__file__), "worker"]
                procs.append(subprocess.Popen(command, stdout=out, stderr=err, env=env))
            deadline = time.monotonic() + CHILD_TIMEOUT
            while time.monotonic() < deadline:
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes) or any(c for c in codes):
                    break
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        results = []
        for p, (out, err) in zip(procs, logs, strict=True):
            out.seek(0)
            err.seek(0)
            results.append((p.returncode, out.read(), err.read()))
        return results


@pytest.mark.slow
class MultiWorkerTest(tf.test.TestCase):
    def test_two_workers_end_with_the_same_weights(self):
        # Each worker reads different data from a different initialisation; the
        # broadcast of initial values and the all-reduce of every step make them agree.
        runs = _run_workers(2)
        logs = "\n".join(
            f"worker {i} exit {code}:\n{err[-3000:]}" for i, (code, _, err) in enumerate(runs)
        )
        self.assertEqual([code for code, _, _ in runs], [0, 0], logs)
        workers = [_parse(out, err, "worker") for _, out, err in runs]
        self.assertEqual([w["task"] for w in workers], [0, 1])
        self.assertEqual([w["steps"] for w in workers], [3, 3])
        self.assertEqual(workers[0]["sha256"], workers[1]["sha256"])
        self.assertEqual(workers[0]["baseline_slots"], workers[1]["baseline_slots"])
        self.assertNotEmpty(workers[0]["baseline_slots"])
        self.assertAllClose(workers[0]["loss"], workers[1]["loss"])


class MixedPrecisionTest(tf.test.TestCase):
    results = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        previous = keras.mixed_precision.global_policy()
        try:
            cls.results = run_mixed()
        finally:
            keras.mixed_precision.set_global_policy(previous)

    def test_train_step_in_mixed_bfloat16(self):
        for attention, result in self.results["mixed_bfloat16"].items():
            with self.subTest(attention=attention):
                self.assertNotIn("error", result, result.get("error"))
                self.assertTrue(np.isfinite(result["metrics"]["loss"]))
                self.assertEqual(result["variable_dtypes"], ["float32"])
                self.assertEqual(result["state_dtype"], "bfloat16")
                for name in ("objective", "loss", "log_likelihood"):
                    self.assertEqual(result["terms"][name], "float32", name)
                self.assertEqual(result["outputs"]["alpha"], "float32")
                self.assertEqual(result["outputs"]["logits"], "float32")
                self.assertEqual(result["decoded"]["log_prob"], "float32")
                self.assertEqual(result["decoded"]["attention"], "float32")
                # A softmax in bfloat16 (8-bit mantissa) misses 1 by ~1e-3.
                self.assertLess(result["alpha_sum_error"], 1e-5)
                self.assertLess(result["decoded_alpha_sum_error"], 1e-5)

    def test_mixed_bfloat16_step_is_the_float32_step(self):
        # bfloat16 keeps 8 significant bits (a rounding of up to 2**-9 of each value).
        # The loss, a float32 mean over the words, moves by far less; the weight change
        # of each variable by a few percent at most, the whole step by under one. A
        # gradient lost or a term computed on other numbers moves them by far more.
        for attention, full in self.results["float32"].items():
            with self.subTest(attention=attention):
                mixed = self.results["mixed_bfloat16"][attention]
                for result in (mixed, full):
                    self.assertNotIn("error", result, result.get("error"))
                for metric, value in full["metrics"].items():
                    self.assertAllClose(mixed["metrics"][metric], value, rtol=1e-3, msg=metric)
                self.assertEqual(sorted(mixed["step"]), sorted(full["step"]))
                got, want = (
                    [np.ravel(r["step"][k]) for k in sorted(full["step"])] for r in (mixed, full)
                )
                for name, g, w in zip(sorted(full["step"]), got, want, strict=True):
                    self.assertLessEqual(
                        np.linalg.norm(g - w), 0.1 * np.linalg.norm(w) + 1e-6, name
                    )
                everything = np.concatenate(want)
                error = np.linalg.norm(np.concatenate(got) - everything)
                self.assertLess(error, 0.02 * np.linalg.norm(everything))
                self.assertGreater(np.linalg.norm(everything), 0.1, "the step changed nothing")


CHILDREN = {"mirrored": run_mirrored, "worker": run_worker}

if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] in CHILDREN:
        print(json.dumps(CHILDREN[sys.argv[1]]()), flush=True)
    else:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(CHILDREN)} (run by pytest)")
