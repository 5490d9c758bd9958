"""train_and_evaluate on a tiny shapes set, resume after a kill, divergence, optimizers, a
folder read once."""

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from unittest import mock

import keras
import pytest
import tensorflow as tf
from fixtures import TINY, TRAINED, run_main, trained_run, without_java, write_photo_folder

from sat_tf.cli import train as train_cli
from sat_tf.config import Config
from sat_tf.serving import inference
from sat_tf.training import optimizers, prepare, scoring, train_lib
from sat_tf.training import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.long(5)
@pytest.mark.scope_group("trained_run")
class TrainAndEvaluateTest(tf.test.TestCase):
    """The shared run of `sat-train` (fixtures.trained_run): its scores, files and model."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        run = trained_run()
        cls.workdir, cls.config, cls.scores = run.workdir, run.config, run.scores
        cls.data_dir = run.data_dir

    def test_prints_the_test_metrics(self):
        for key in (
            "BLEU-4",
            "paper BLEU-4 (no BP)",
            "pointing_accuracy",
            "phrase_pointing_accuracy",
            "location_accuracy",
        ):
            self.assertBetween(self.scores[key], 0.0, 1.0)
        self.assertGreaterEqual(self.scores["phrase_hits"], self.scores["hits"])
        self.assertGreaterEqual(self.scores["CIDEr"], 0.0)
        # The caption statistics describe the captions the run wrote.
        with open(os.path.join(self.workdir, "captions_test.json"), encoding="utf-8") as f:
            captions = [c["caption"].split() for c in json.load(f)]
        self.assertAllClose(self.scores["mean_length"], sum(map(len, captions)) / len(captions))
        self.assertEqual(self.scores["distinct_words"], len({w for c in captions for w in c}))
        self.assertBetween(self.scores["bad_ending_rate"], 0.0, 1.0)
        with open(os.path.join(self.workdir, "metrics_test.json"), encoding="utf-8") as f:
            self.assertEqual(json.load(f)["BLEU-4"], self.scores["BLEU-4"])

    def test_decoding_chosen_on_validation(self):
        with open(os.path.join(self.workdir, "decoding.json"), encoding="utf-8") as f:
            kept = json.load(f)
        self.assertEqual(kept["images"], TINY["eval_images"])
        self.assertEqual(kept["selected_on"], "val_bleu4")
        # Coordinate ascent from greedy with repeats blocked: every beam tried at the
        # start's other settings, and the chosen one scores best of all tried.
        first = [t for t in kept["tried"] if t["block_repeats"] and not t["block_bad_endings"]]
        self.assertEqual([t["beam_size"] for t in first[:3]], [1, 3, 5])
        best = max(t["scores"]["BLEU-4"] for t in kept["tried"])
        chosen = [t for t in kept["tried"] if all(t[k] == v for k, v in kept["chosen"].items())]
        self.assertLen(chosen, 1)
        self.assertEqual(chosen[0]["scores"]["BLEU-4"], best)
        saved = Config.load(os.path.join(self.workdir, "config.json"))
        for name, value in kept["chosen"].items():
            self.assertEqual(getattr(saved, name), value, name)

    def test_workdir_holds_what_a_later_run_needs(self):
        for name in ("config.json", "vocab.txt", "best.weights.h5", "val_history.json"):
            self.assertTrue(os.path.exists(os.path.join(self.workdir, name)), name)
        history = workdir_lib.read_history(os.path.join(self.workdir, "val_history.json"))
        self.assertEqual([h["epoch"] for h in history], [1])

    def test_init_from_starts_from_another_workdirs_weights(self):
        # One step at a learning rate too small to move them: the new run's trained
        # weights are the shared run's, which fresh ones could not be. (Statistics that
        # training updates whatever the rate, such as the baselines, move.) Its own data
        # folder holds the shared run's training images (they depend on the seed alone,
        # so the vocabulary is the same) and no others: nothing to validate or test.
        root = self.get_temp_dir()
        workdir = os.path.join(root, "continued")
        settings = {**TRAINED, "steps_per_epoch": 1, "num_val": 0, "num_test": 0}
        code, stdout, stderr = run_main(
            train_cli.main,
            "sat-train",
            f"--workdir={workdir}",
            f"--data_dir={os.path.join(root, 'data')}",
            f"--init_from={self.workdir}",
            "--learning_rate=1e-12",
            *(f"--{k}={v}" for k, v in settings.items()),
        )
        self.assertEqual(code, 0, stderr[-3000:])
        self.assertIn(f"starting from the best weights of {self.workdir}", stderr)
        self.assertIn("training on 40 images", stderr)
        continued, _, _ = inference.load_workdir(workdir)
        shared, _, _ = inference.load_workdir(self.workdir)
        pairs = zip(continued.trainable_weights, shared.trainable_weights, strict=True)
        for got, want in pairs:
            self.assertAllClose(got, want, atol=1e-6, rtol=0)

    def test_trained_steps_and_reload(self):
        model, vocab, config = inference.load_workdir(self.workdir)
        self.assertEqual(config, self.config)
        with open(os.path.join(self.workdir, "captions_test.json"), encoding="utf-8") as f:
            saved = json.load(f)
        self.assertLen(saved, TINY["num_test"])
        # The reloaded model captions the first test image as the run did.
        first = sorted(saved, key=lambda c: str(c["image_id"]))[0]
        data = prepare.prepare_data(config, self.workdir)
        record = next(r for r in data.splits["test"] if str(r.image_id) == str(first["image_id"]))
        (result,) = scoring.caption_records(model, [record], vocab, config)
        self.assertEqual(" ".join(result["words"]), first["caption"])

    def test_another_model_in_the_same_workdir_is_refused(self):
        other = dataclasses.replace(self.config, hidden_dim=32)
        with self.assertRaisesRegex(ValueError, "--hidden_dim: workdir has 16, this run 32"):
            train_lib.train_and_evaluate(other, self.workdir)

    def test_weights_of_another_vocabulary_are_refused(self):
        copy = os.path.join(self.get_temp_dir(), "copy")
        shutil.copytree(self.workdir, copy)
        with open(os.path.join(copy, "vocab.txt"), encoding="utf-8") as f:
            words = f.read().split("\n")
        words[4], words[5] = words[5], words[4]  # same size, two ids swapped
        with open(os.path.join(copy, "vocab.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(words))
        with self.assertRaisesRegex(ValueError, r"not the vocabulary its weights were trained"):
            inference.load_workdir(copy)


class UnwritableWorkdirTest(tf.test.TestCase):
    """A workdir that cannot be written stops the run before any training."""

    def test_workdir_below_a_file(self):
        root = self.get_temp_dir()
        blocker = os.path.join(root, "a_file")
        with open(blocker, "w") as f:
            f.write("x")
        config = Config(data_dir=os.path.join(root, "data"), **TINY)
        with self.assertRaisesRegex(ValueError, f"workdir '{blocker}/run' is not writable"):
            train_lib.train_and_evaluate(config, os.path.join(blocker, "run"))
        self.assertFalse(os.path.exists(config.data_dir), "the run went on past the check")

    def test_full_disk(self):
        root = self.get_temp_dir()
        config = Config(data_dir=os.path.join(root, "data"), **TINY)
        real_open = open

        def full(path, mode="r", *args, **kwargs):
            if "w" in mode and str(path).startswith(root):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_open(path, mode, *args, **kwargs)

        with mock.patch("builtins.open", full):
            with self.assertRaisesRegex(ValueError, "is not writable: .*No space left on device"):
                train_lib.train_and_evaluate(config, os.path.join(root, "run"))


class RefusedRunTest(tf.test.TestCase):
    """A run refused before training starts leaves its workdir as it found it, so that
    the corrected command is not refused in turn."""

    def test_a_refused_start_writes_nothing(self):
        root = self.get_temp_dir()
        not_a_run = os.path.join(root, "not_a_run")
        os.makedirs(not_a_run)
        workdir = os.path.join(root, "run")
        config = Config(data_dir=os.path.join(root, "data"), init_from=not_a_run, **TINY)
        with self.assertRaisesRegex(ValueError, "not_a_run"):
            train_lib.train_and_evaluate(config, workdir)
        self.assertFalse(
            os.path.exists(workdir), os.listdir(workdir) if os.path.exists(workdir) else ""
        )
        # The corrected command runs in the same workdir, and its config there names its
        # folders absolutely.
        config = Config(data_dir=os.path.join(root, "data"), **{**TINY, "num_test": 0})
        previous = os.getcwd()
        try:
            os.chdir(root)
            relative = dataclasses.replace(config, data_dir="data", cache_dir="cache")
            self.assertEqual(train_lib.train_and_evaluate(relative, "run"), {})
        finally:
            os.chdir(previous)
        saved = Config.load(os.path.join(workdir, "config.json"))
        self.assertEqual(saved.data_dir, os.path.join(os.path.realpath(root), "data"))
        self.assertEqual(saved.cache_dir, os.path.join(os.path.realpath(root), "cache"))


class StopAt(keras.callbacks.Callback):
    """Calls `stop()` after step `step` of epoch `epoch` (both counted from 1), or, with
    step 0, at the end of epoch `epoch` after its evaluation and best checkpoint, just
    before BackupAndRestore writes its backup."""

    def __init__(self, epoch, step, stop):
        super().__init__()
        self.at, self.stop = (epoch, step), stop

    def on_epoch_begin(self, index, logs=None):
        self.epoch = index + 1

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch + 1) == self.at:
            self.stop()

    def on_epoch_end(self, index, logs=None):
        if (index + 1, 0) == self.at:
            self.stop()


def stopping_callbacks(stop_at, stop):
    """`train_lib._callbacks` with `StopAt` ("EPOCH:STEP") just before the backup."""
    epoch, step = (int(x) for x in stop_at.split(":"))
    real = train_lib._callbacks

    def callbacks(*args, **kwargs):
        found, stopper = real(*args, **kwargs)
        if not isinstance(found[-1], keras.callbacks.BackupAndRestore):
            raise AssertionError(f"the backup is not the last callback: {found}")
        return [*found[:-1], StopAt(epoch, step, stop), found[-1]], stopper

    return callbacks


class Interrupted(Exception):
    """Where a run in this process stops (`StopAt`) instead of being killed."""


def _interrupt():
    raise Interrupted


# The child process of ResumeTest (`python -c KILLED_RUN EPOCH:STEP --flags...`, with
# tests/ on its path): runs sat-train with --flags and SIGKILLs itself where `StopAt` says.
KILLED_RUN = """
import os
import signal
import sys

import train_lib_test
from sat_tf.cli import train as train_cli
from sat_tf.training import train_lib

train_lib._callbacks = train_lib_test.stopping_callbacks(
    sys.argv[1], lambda: os.kill(os.getpid(), signal.SIGKILL)
)
sys.exit(train_cli.main(["sat-train", *sys.argv[2:]]))
"""
RESUME_EPOCHS, RESUME_STEPS = 3, 3


def _train_flags(workdir, data_dir):
    flags = {
        **TINY,
        "attention": "hard",
        "epochs": RESUME_EPOCHS,
        "steps_per_epoch": RESUME_STEPS,
        "hard_warmup_steps": 2,  # sampling starts at the third step, in the first epoch
        "eval_images": 1,
        "num_test": 0,  # no test-split scores: the weights are what is compared
    }
    return [
        f"--workdir={workdir}",
        f"--data_dir={data_dir}",
        *(f"--{k}={v}" for k, v in flags.items()),
    ]


def _final_state(workdir):
    """[(path, array)] of every model and optimizer variable after the last epoch, in the
    order the model and optimizer create them (their paths carry per-process names such
    as "adam_1" or "show_attend_tell_1")."""
    model, _, config = inference.load_workdir(workdir)
    steps = config.epochs * config.steps_per_epoch
    model.compile(optimizer=optimizers.build(config, total_steps=steps))
    model.optimizer.build(model.trainable_variables)
    model.load_weights(os.path.join(workdir, "backup", "latest.weights.h5"))
    return [(v.path, v.numpy()) for v in model.weights + model.optimizer.variables]


@pytest.mark.long(7)
class ResumeTest(tf.test.TestCase):
    """A hard-attention run of sat-train stopped at chosen steps; the same command resumes
    it and ends with the weights of an uninterrupted run.

    By default the run stops (an exception, in this process) at the end of epoch 2 after
    its evaluation and best checkpoint, before its backup: the resumed run redoes epoch
    2. With the slow tests a child process is killed (SIGKILL: no cleanup runs) first
    mid-way through epoch 1 (after sampling started, before any backup), then where the
    default case stops. The uninterrupted and the resumed runs run in this process."""

    def test_interrupted_after_validation_before_backup(self):
        self._check_resume((("2:0", 1),), killed=False)

    @pytest.mark.slow
    def test_killed_before_any_backup_then_after_validation(self):
        # Slow: two child processes.
        self._check_resume((("1:3", 0), ("2:0", 1)), killed=True)

    def _check_resume(self, stops, killed):
        root = self.get_temp_dir()
        data_dir = os.path.join(root, "data")
        epochs, steps = RESUME_EPOCHS, RESUME_STEPS
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        path = [ROOT, os.path.join(ROOT, "tests"), env.get("PYTHONPATH")]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, path))

        code, _, stderr = run_main(
            train_cli.main, "sat-train", *_train_flags(f"{root}/whole", data_dir)
        )
        self.assertEqual(code, 0, stderr[-3000:])

        workdir = os.path.join(root, "stopped")
        flags = _train_flags(workdir, data_dir)
        for stop_at, backed_up in stops:
            if killed:
                done = subprocess.run(
                    [sys.executable, "-c", KILLED_RUN, stop_at, *flags],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                self.assertEqual(done.returncode, -signal.SIGKILL, done.stderr[-3000:])
            else:
                callbacks = stopping_callbacks(stop_at, _interrupt)
                with mock.patch.object(train_lib, "_callbacks", callbacks):
                    with self.assertRaises(Interrupted):
                        run_main(train_cli.main, "sat-train", *flags)
            self.assertEqual(workdir_lib.backed_up_epoch(workdir), backed_up, stop_at)
        history = workdir_lib.read_history(os.path.join(workdir, workdir_lib.HISTORY_FILE))
        self.assertEqual([h["epoch"] for h in history], [1, 2])

        code, stdout, stderr = run_main(train_cli.main, "sat-train", *flags)
        self.assertEqual(code, 0, stderr[-3000:])
        # Keras prints "Epoch k/3" for each epoch it trains: the resumed run starts after
        # the backed-up epoch instead of at 1.
        trained = sorted({int(e) for e in _epochs_printed(stdout)})
        self.assertEqual(trained, [2, 3])

        # Step counter, optimizer moments, REINFORCE baselines, random-number states and
        # the data order all continued: the weights equal the uninterrupted run's.
        expected, got = _final_state(os.path.join(root, "whole")), _final_state(workdir)
        self.assertEqual([v.shape for _, v in got], [v.shape for _, v in expected])
        iterations = [v for p, v in got if p.endswith("/iteration") or p.endswith("/iterations")]
        self.assertNotEmpty(iterations)
        for value in iterations:
            self.assertEqual(int(value), epochs * steps)
        seen = [v for p, v in got if p.endswith("reinforce_baseline_seen")]
        self.assertGreater(seen[0].sum(), 0)
        for (path, value), (_, want) in zip(got, expected, strict=True):
            self.assertAllClose(value, want, atol=1e-5, rtol=1e-4, msg=path)
        history = workdir_lib.read_history(os.path.join(workdir, workdir_lib.HISTORY_FILE))
        whole = workdir_lib.read_history(os.path.join(root, "whole", workdir_lib.HISTORY_FILE))
        self.assertEqual(history, whole)


def _epochs_printed(text):
    words = text.replace("\r", "\n").split()
    return [
        w.split("/")[0] for p, w in zip(words, words[1:], strict=False) if p == "Epoch" and "/" in w
    ]


class FolderRunTest(tf.test.TestCase):
    def test_a_folder_is_read_once_when_its_features_are_extracted_first(self):
        # The extraction's records are the run's: the folder's summary line shows once.
        root = without_java(self)
        data_dir = write_photo_folder(os.path.join(root, "photos"))
        settings = dict(
            use_feature_cache=True,
            encoder="shapes_cnn",
            encoder_weights="",
            image_size=32,
            embed_dim=8,
            hidden_dim=16,
            attention_dim=8,
            batch_size=4,
            epochs=1,
            steps_per_epoch=1,
            eval_images=2,
            max_decode_length=4,
            choose_decoding=False,
        )
        code, _, err = run_main(
            train_cli.main,
            "sat-train",
            "--dataset=folder",
            f"--data_dir={data_dir}",
            f"--workdir={os.path.join(root, 'run')}",
            f"--cache_dir={os.path.join(root, 'cache')}",
            *(f"--{k}={v}" for k, v in settings.items()),
        )
        self.assertEqual(code, 0, err[-3000:])
        self.assertIn("extracting them once", err)
        self.assertEqual(err.count("folder: read "), 1, err)


class TrainJitTest(tf.test.TestCase):
    def test_xla_compiles_the_train_step_only_with_the_flag_and_a_gpu(self):
        gpus = ["/physical_device:GPU:0"]
        for flag, devices, expected in ((False, [], False), (True, [], False), (True, gpus, True)):
            with mock.patch.object(tf.config, "list_physical_devices", return_value=devices):
                self.assertIs(
                    train_lib._train_jit(Config(jit_compile=flag)), expected, (flag, devices)
                )
        with mock.patch.object(tf.config, "list_physical_devices", return_value=gpus):
            self.assertFalse(train_lib._train_jit(Config(jit_compile=False)))


if __name__ == "__main__":
    tf.test.main()
