"""Show, Attend and Tell (Xu et al., 2015) in TensorFlow 2 / Keras 3."""

import os

# TensorFlow's default CPU allocator gives every large tensor back to the operating
# system when it is freed, so the next tensor of that size is faulted in again page by
# page (BUILD_NOTES.md, "The CPU allocator"). The BFC allocator keeps freed memory and
# reuses it. TensorFlow chooses its allocator once, at its first op, so the choice is
# made here, before any module of the package runs TensorFlow; a value set by the user
# wins (TF_CPU_ALLOCATOR_USE_BFC=false keeps TensorFlow's own choice).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

__version__ = "0.1.0"

# The public names load on first use (PEP 562): `import sat_tf` stays free of TensorFlow,
# which `cpu_allocator` and the allocator choice above rely on.
_LAZY = {
    "Caption": "sat_tf.serving.captions",
    "Captioner": "sat_tf.serving.api",
    "ShowAttendTell": "sat_tf.model.show_attend_tell",
    "load": "sat_tf.serving.inference",
}
__all__ = [*_LAZY, "cpu_allocator"]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sat_tf' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])


ALLOCATORS = ("bfc", "onednn", "default")

# A held tensor below oneDNN's small-allocation threshold (256 KiB): the BFC allocator
# counts it in its statistics, oneDNN's allocator serves it from malloc and does not.
_PROBE_BYTES = 64 * 1024


def cpu_allocator() -> str:
    """The allocator TensorFlow uses for CPU memory, read from how it behaves.

    Returns one of `ALLOCATORS`:
      "bfc": TensorFlow's BFC allocator (`TF_CPU_ALLOCATOR_USE_BFC=true` read at its
        first op): every block comes from a pool that keeps freed memory.
      "onednn": oneDNN's allocator, TensorFlow's own choice when oneDNN is on (by
        default on Linux CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX, or with
        `TF_ENABLE_ONEDNN_OPTS=1`): blocks of 256 KiB and more come from a BFC pool,
        smaller ones from malloc.
      "default": the malloc allocator, which gives large blocks back to the operating
        system (oneDNN off, BFC not requested in time).

    The signal, not the environment: only the two pooling allocators keep statistics
    (`tf.config.experimental.get_memory_info` raises for malloc), and of those only the
    BFC allocator counts a held 64 KiB tensor in them. Call it while no other TensorFlow
    work runs in the process. Creates TensorFlow's CPU device if nothing has yet; from
    then on the allocator is fixed for the life of the process.
    """
    import tensorflow as tf  # here, not at the top: importing sat_tf must not load it

    def in_use():
        return tf.config.experimental.get_memory_info("CPU:0")["current"]

    try:
        before = in_use()
    except ValueError:
        return "default"
    held = tf.fill([_PROBE_BYTES], tf.constant(0, tf.int8))
    counted = in_use() - before
    del held
    return "bfc" if counted > 0 else "onednn"
