"""The additive score of one decoder step as a compiled TensorFlow op (float32, CPU).

`AdditiveScore.step_scores` written as TensorFlow ops passes over the (B, L, A)
projection `W_a a` about fourteen times a step, forward and backward (bench/flops.py);
on CPUs whose products are fast that streaming is most of the step. The kernels in
`kernels/additive_score.cc` compute the same scores in one pass and their gradient in
one more, updating the running sum of `W_a a`'s gradient over the steps in place; the
fused recurrence (`recurrence.py`) runs them when the decoder asks for it. The decoder's
autodiff loop (ungated hard attention's training schedule) runs the scores too, through the
gradient registered here, which starts each step's sum at zero (TensorFlow adds the
steps up).

The op is built from its source with the C++ compiler on first use, against the headers
of the installed TensorFlow, and kept in a cache folder (`SAT_TF_KERNEL_CACHE`, default
`~/.cache/sat_tf/kernels`) under a name that changes with the source, TensorFlow's
version and the CPU's flags. Where it cannot be built (no compiler, no headers) `load`
logs why once and returns None, and the recurrence runs the TensorFlow ops instead:
the same math, slower. `SAT_TF_COMPILED_SCORE=0` turns it off.
"""

import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile

import tensorflow as tf
from absl import logging

SOURCE = os.path.join(os.path.dirname(__file__), "kernels", "additive_score.cc")


def _cpu_flags():
    """The CPU's flags line (the build uses -march=native), or the machine name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.machine()


def _native_flags():
    """-march=native, less the AVX-512 FP16 packets where the CPU has them: TF 2.21's Eigen
    header for them (PacketMathFP16.h) does not compile under g++ 12, and the op computes
    in float32."""
    flags = ["-march=native"]
    if "avx512_fp16" in _cpu_flags().split():
        flags.append("-mno-avx512fp16")
    return flags


def _compile_command(output, native=True):
    return [
        os.environ.get("CXX", "g++"),
        "-shared",
        "-fPIC",
        "-O3",
        *(_native_flags() if native else []),
        "-w",
        *tf.sysconfig.get_compile_flags(),
        SOURCE,
        "-o",
        output,
        *tf.sysconfig.get_link_flags(),
    ]


def library_path():
    """Where the built op is (or will be) kept: named by a hash of its source, the TF and
    Python versions, the CPU's flags and the build's (a change of any builds it anew)."""
    with open(SOURCE, "rb") as f:
        source = f.read()
    texts = (tf.__version__, _cpu_flags(), sys.version, " ".join(_native_flags()))
    key = hashlib.sha256(b"\0".join([source, *(t.encode() for t in texts)])).hexdigest()[:16]
    cache = os.environ.get("SAT_TF_KERNEL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "sat_tf", "kernels"
    )
    return os.path.join(cache, f"additive_score_{key}.so")


def build(path):
    """Compiles the op into `path` (atomically: concurrent builds leave one whole file).

    It builds for this CPU (`-march=native`) and, where the compiler or assembler
    refuses that (an older toolchain than the CPU, a compiler without the flag), once
    more for the compiler's default target, logging why.

    Raises:
      RuntimeError: naming the command and the compiler's message, when it fails.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
    os.close(fd)
    try:
        failed = _compile(partial, native=True)
        if failed:
            logging.warning(
                "building %s for this CPU (-march=native) failed; building it without "
                "-march=native. The compiler said:\n%s",
                SOURCE,
                failed,
            )
            failed = _compile(partial, native=False)
            if failed:
                raise RuntimeError(failed)
        os.chmod(partial, 0o755)  # mkstemp's file is the owner's only
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _compile(output, native):
    """Runs the compiler; returns None, or what went wrong (the command and the
    compiler's message).

    Raises:
      RuntimeError: when there is no compiler.
    """
    command = _compile_command(output, native)
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise RuntimeError(f"building {SOURCE} needs a C++ compiler: {e}") from e
    if done.returncode == 0:
        return None
    return f"building {SOURCE} failed ({' '.join(command[:6])} ...):\n" + done.stderr[-2000:]


@functools.cache
def load():
    """The op's module (`sat_additive_score`, `sat_additive_score_grad`), or None where
    it is turned off or cannot be built (logged once)."""
    if os.environ.get("SAT_TF_COMPILED_SCORE", "1") == "0":
        logging.info("SAT_TF_COMPILED_SCORE=0: the additive score runs as TensorFlow ops")
        return None
    path = library_path()
    try:
        if not os.path.exists(path):
            logging.info("building the additive score's op into %s", path)
            build(path)
        return tf.load_op_library(path)
    except (RuntimeError, OSError, tf.errors.OpError) as e:
        logging.warning("the additive score runs as TensorFlow ops (slower): %s", e)
        return None


def applies(dtype):
    """Whether the op can run a step of this dtype here: float32, no GPU visible (it has
    a CPU kernel only), and it loads."""
    if tf.as_dtype(dtype) != tf.float32 or tf.config.list_logical_devices("GPU"):
        return False
    return load() is not None


def scores(projected, score_in, v):
    """(B, L) `v . tanh(projected + score_in)`: `AdditiveScore.step_scores`' scores.

    Args:
      projected: (B, L, A) `W_a a`.
      score_in: (B, A) `U_a h`.
      v: (A, 1) the score's kernel.
    """
    return load().sat_additive_score(projected, score_in, v[:, 0])


@tf.RegisterGradient("SatAdditiveScore")
def _scores_gradient(op, d_scores):
    projected, score_in, v = op.inputs
    return load().sat_additive_score_grad(
        projected, score_in, v, d_scores, tf.zeros_like(projected)
    )


def scores_grad(projected, score_in, v, d_scores, d_projected_sum):
    """The gradients of `scores` from d_scores (B, L): (d_projected_sum plus that of
    `projected`, that of `score_in` (B, A), that of v (A, 1))."""
    d_projected_sum, d_score_in, d_v = load().sat_additive_score_grad(
        projected, score_in, v[:, 0], d_scores, d_projected_sum
    )
    return d_projected_sum, d_score_in, d_v[:, None]
