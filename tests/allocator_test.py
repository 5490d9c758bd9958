"""Tests that importing sat_tf selects TensorFlow's BFC allocator for CPU memory, and
when it cannot or must not. Each case runs in a fresh Python process: the allocator is
fixed for the life of a process once TensorFlow has run an op."""

import os
import subprocess
import sys

from absl.testing import absltest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REPORT = "import sat_tf; print(sat_tf.cpu_allocator())"


def _allocators(programs, env_overrides):
    """Runs every program in its own interpreter, all at once; returns the last line each
    printed."""
    procs = []
    for program, overrides in zip(programs, env_overrides, strict=True):
        env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
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


class CpuAllocatorTest(absltest.TestCase):
    def test_import_selects_bfc_unless_told_or_too_late(self):
        after_keras = "import keras, tensorflow as tf\n" + REPORT
        too_late = "import tensorflow as tf\ntf.constant(1.0) + 1\n" + REPORT
        got = _allocators(
            [REPORT, after_keras, REPORT, too_late],
            [{}, {}, {"TF_CPU_ALLOCATOR_USE_BFC": "false"}, {}],
        )
        self.assertEqual(
            got,
            [
                "bfc",  # a fresh process
                "bfc",  # TensorFlow and Keras imported first, but no op run yet
                "default",  # the user's own setting wins
                "default",  # TensorFlow had already chosen, at its first op
            ],
        )


if __name__ == "__main__":
    absltest.main()
