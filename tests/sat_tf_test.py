"""Tests for sat_tf/__init__.py (its lazy names are api_test.py's and inference_test.py's):
importing sat_tf selects TensorFlow's BFC allocator for CPU memory, and when it cannot or
must not, and that `cpu_allocator` tells the three allocators apart. Each case runs in a
fresh Python process: the allocator is fixed for the life of a process once TensorFlow
has run an op. Every case sets TF_ENABLE_ONEDNN_OPTS, whose default depends on the CPU
(on with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX), so the expected answers are the
same on every machine."""

import os
import subprocess
import sys

import pytest
from absl.testing import absltest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REPORT = "import sat_tf; print(sat_tf.cpu_allocator())"


def _allocators(programs, env_overrides):
    """Runs every program in its own interpreter, all at once; returns the last line each
    printed."""
    procs = []
    for program, overrides in zip(programs, env_overrides, strict=True):
        drop = ("TF_CPU_ALLOCATOR_USE_BFC", "TF_ENABLE_ONEDNN_OPTS")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(overrides)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", program],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise AssertionError(f"exit {proc.returncode}:\n{err[-2000:]}")
        lines.append(out.strip().splitlines()[-1])
    return lines


AFTER_KERAS = "import keras, tensorflow as tf\n" + REPORT
TOO_LATE = "import tensorflow as tf\ntf.constant(1.0) + 1\n" + REPORT
NO_ONEDNN = {"TF_ENABLE_ONEDNN_OPTS": "0"}
ONEDNN = {"TF_ENABLE_ONEDNN_OPTS": "1"}


class CpuAllocatorTest(absltest.TestCase):
    def test_import_selects_bfc_unless_too_late(self):
        got = _allocators([REPORT, TOO_LATE], [NO_ONEDNN, NO_ONEDNN])
        self.assertEqual(
            got,
            [
                "bfc",  # a fresh process
                "default",  # TensorFlow had already chosen, at its first op
            ],
        )

    @pytest.mark.slow
    def test_after_keras_and_the_users_own_setting(self):
        # Slow: two more processes that import TensorFlow.
        got = _allocators(
            [AFTER_KERAS, REPORT],
            [NO_ONEDNN, {**NO_ONEDNN, "TF_CPU_ALLOCATOR_USE_BFC": "false"}],
        )
        self.assertEqual(
            got,
            [
                "bfc",  # TensorFlow and Keras imported first, but no op run yet
                "default",  # the user's own setting wins
            ],
        )

    @pytest.mark.slow
    def test_with_onednn_its_allocator_unless_bfc_is_requested_in_time(self):
        # Slow: three more processes that import TensorFlow; the choice made on import is
        # the same code path as without oneDNN, only the allocator reported differs.
        got = _allocators(
            [REPORT, REPORT, TOO_LATE],
            [ONEDNN, {**ONEDNN, "TF_CPU_ALLOCATOR_USE_BFC": "false"}, ONEDNN],
        )
        self.assertEqual(
            got,
            [
                "bfc",  # requested in time, oneDNN on: still the BFC allocator
                "onednn",  # not requested, oneDNN on: oneDNN's allocator
                "onednn",  # requested too late, oneDNN on
            ],
        )


if __name__ == "__main__":
    absltest.main()
