"""Tests for sat_tf.model.fast.fused_score: the compiled additive score and its gradient
against `AdditiveScore.step_scores` and autodiff of it, its shape errors, and the build's
failure report. The recurrence's use of it is tested in recurrence_test.py."""

import os
import shlex
import sys
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from sat_tf.model.attention import AdditiveScore
from sat_tf.model.fast import fused_score

# Uneven sizes (A = 37 is no multiple of a vector width: the tail of every row counts).
BATCH, CELLS, UNITS = 3, 5, 37


def _inputs(seed):
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return tf.constant(rng.normal(size=shape), tf.float32)

    return normal(BATCH, CELLS, UNITS), normal(BATCH, UNITS), normal(UNITS, 1)


class CompiledScoreTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.assertIsNotNone(fused_score.load(), "the op did not build (see the log)")

    def test_scores_are_step_scores(self):
        projected, score_in, v = _inputs(0)
        want, _ = AdditiveScore.step_scores(projected, score_in, None, v)
        got = fused_score.scores(projected, score_in, v)
        self.assertEqual(got.shape, (BATCH, CELLS))
        self.assertAllClose(got, want, atol=2e-6, rtol=0.0)

    def test_gradients_are_autodiff_of_step_scores_plus_the_running_sum(self):
        projected, score_in, v = _inputs(1)
        rng = np.random.default_rng(1)
        d_scores = rng.normal(size=(BATCH, CELLS)).astype(np.float32)
        d_scores[1, 2] = 0.0  # a cell nothing flows back from: the op skips its tanh
        d_scores[2] = 0.0  # and a whole image
        d_scores = tf.constant(d_scores)
        running = tf.constant(rng.normal(size=(BATCH, CELLS, UNITS)), tf.float32)
        with tf.GradientTape() as tape:
            tape.watch([projected, score_in, v])
            scores, _ = AdditiveScore.step_scores(projected, score_in, None, v)
        want = tape.gradient(scores, [projected, score_in, v], output_gradients=d_scores)
        got = fused_score.scores_grad(projected, score_in, v, d_scores, running)
        self.assertAllClose(got[0], running + want[0], atol=1e-6, rtol=0.0)
        self.assertAllClose(got[1], want[1], atol=1e-5, rtol=0.0)
        self.assertAllClose(got[2], want[2], atol=1e-5, rtol=0.0)
        # Where nothing flows back, the running sum passes through unchanged.
        self.assertAllEqual(got[0][2], running[2])
        self.assertAllEqual(got[0][1, 2], running[1, 2])

    def test_the_running_sum_over_steps_in_a_loop(self):
        # As the recurrence's backward loop uses it: the sum over T steps, each with its
        # own U_a h and d_scores, equals the sum of the per-step autodiff gradients.
        projected, _, v = _inputs(2)
        rng = np.random.default_rng(2)
        steps = 4
        score_ins = tf.constant(rng.normal(size=(steps, BATCH, UNITS)), tf.float32)
        d_scores = tf.constant(rng.normal(size=(steps, BATCH, CELLS)), tf.float32)

        @tf.function
        def summed():
            def body(t, total):
                grads = fused_score.scores_grad(projected, score_ins[t], v, d_scores[t], total)
                return t + 1, grads[0]

            return tf.while_loop(lambda t, _: t < steps, body, (0, tf.zeros_like(projected)))[1]

        want = 0.0
        for t in range(steps):
            with tf.GradientTape() as tape:
                tape.watch(projected)
                scores, _ = AdditiveScore.step_scores(projected, score_ins[t], None, v)
            want += tape.gradient(scores, projected, output_gradients=d_scores[t])
        self.assertAllClose(summed(), want, atol=1e-5, rtol=0.0)

    def test_shape_errors_name_the_input(self):
        projected, score_in, v = _inputs(3)
        for args, name in [
            ((projected[0], score_in, v), "projected"),
            ((projected, score_in[:, :-1], v), "score_in"),
            ((projected, score_in, v[:-1]), "v must be"),
        ]:
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, name):
                fused_score.scores(*args)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "d_projected_sum"):
            fused_score.scores_grad(projected, score_in, v, tf.zeros([BATCH, CELLS]), projected[:1])

    def test_applies_to_float32_only(self):
        self.assertTrue(fused_score.applies("float32"))
        self.assertFalse(fused_score.applies("bfloat16"))
        self.assertFalse(fused_score.applies(tf.float16))


class BuildTest(tf.test.TestCase):
    @pytest.mark.slow
    def test_a_build_is_one_readable_library(self):
        # Slow: a real compile, as the first use of the op on a machine does (in a fresh
        # clone the default run builds it there, into the kernel cache).
        path = os.path.join(self.get_temp_dir(), "built", "op.so")
        fused_score.build(path)
        self.assertEqual(os.listdir(os.path.dirname(path)), ["op.so"])
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o755)
        if sys.platform.startswith("linux"):  # loading it would register the ops twice
            with open(path, "rb") as f:
                self.assertEqual(f.read(4), b"\x7fELF")

    def test_a_compiler_that_refuses_march_native_gets_a_second_build_without_it(self):
        # A stand-in compiler: it logs each command line, fails on -march=native as an
        # old compiler does, and otherwise writes the output file.
        folder = self.get_temp_dir()
        calls = os.path.join(folder, "calls.txt")
        compiler = os.path.join(folder, "cxx")
        with open(compiler, "w") as f:
            f.write(
                "#!/bin/sh\n"
                f'echo "$*" >> {shlex.quote(calls)}\n'
                'case " $* " in *" -march=native "*)\n'
                "  echo \"error: bad value ('native') for '-march=' switch\" >&2; exit 1;;\n"
                "esac\n"
                'while [ "$1" != "-o" ]; do shift; done\n'
                'echo built > "$2"\n'
            )
        os.chmod(compiler, 0o755)
        path = os.path.join(folder, "built", "op.so")
        with mock.patch.dict(os.environ, {"CXX": compiler}):
            with self.assertLogs(level="WARNING") as logs:
                fused_score.build(path)
        self.assertIn("bad value ('native')", "\n".join(logs.output))
        with open(path) as f:
            self.assertEqual(f.read(), "built\n")
        self.assertEqual(os.listdir(os.path.dirname(path)), ["op.so"])
        with open(calls) as f:
            first, second = f.read().splitlines()
        # The same command (the same partial output file) without the flag.
        self.assertIn(" -march=native ", f" {first} ")
        native = fused_score._native_flags()
        self.assertEqual(" ".join(w for w in first.split() if w not in native), second)

    def test_a_cpu_with_fp16_packets_builds_native_without_them(self):
        for flags, expected in [
            (
                "flags\t: fpu avx2 avx512f avx512_fp16 amx_tile",
                ["-march=native", "-mno-avx512fp16"],
            ),
            ("flags\t: fpu avx2 avx512f avx512_bf16", ["-march=native"]),
        ]:
            with mock.patch.object(fused_score, "_cpu_flags", lambda flags=flags: flags):
                self.assertEqual(fused_score._native_flags(), expected)
                command = fused_score._compile_command("op.so")
            self.assertEqual(command[4 : 4 + len(expected)], expected)

    def test_a_missing_compiler_is_reported_with_the_source(self):
        path = os.path.join(self.get_temp_dir(), "op.so")
        with mock.patch.dict(os.environ, {"CXX": "/nonexistent/g++"}):
            with self.assertRaisesRegex(RuntimeError, "additive_score.cc needs a C"):
                fused_score.build(path)
        self.assertFalse(os.path.exists(path))
        self.assertEqual(os.listdir(self.get_temp_dir()), [])

    def test_a_compile_error_is_reported_with_the_compilers_message(self):
        path = os.path.join(self.get_temp_dir(), "op.so")
        bad = os.path.join(self.get_temp_dir(), "bad.cc")
        with open(bad, "w") as f:
            f.write("this is not C++;\n")
        with mock.patch.object(fused_score, "SOURCE", bad):
            with self.assertRaisesRegex(RuntimeError, "(?s)building .*bad.cc failed.*error"):
                fused_score.build(path)
        self.assertEqual(sorted(os.listdir(self.get_temp_dir())), ["bad.cc"])
