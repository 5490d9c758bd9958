"""Show, Attend and Tell (Xu et al., 2015) in TensorFlow 2 / Keras 3."""

import os

# TensorFlow's default CPU allocator gives every large tensor back to the operating
# system when it is freed, so the next tensor of that size is faulted in again page by
# page: at paper scale, 80,000-150,000 page faults and 0.25-0.43 s of kernel time per
# training step (BUILD_NOTES.md, "The CPU allocator"). The BFC allocator keeps freed
# memory and reuses it. TensorFlow chooses its allocator once, at its first op, so the
# choice is made here, before any module of the package runs TensorFlow; a value set by
# the user wins (TF_CPU_ALLOCATOR_USE_BFC=false keeps the default allocator).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

__version__ = "0.1.0"


def cpu_allocator() -> str:
    """The allocator TensorFlow uses for CPU memory: "bfc" or "default".

    Creates TensorFlow's CPU device if nothing has yet; from then on the allocator is
    fixed for the life of the process.
    """
    import tensorflow as tf  # here, not at the top: importing sat_tf must not load it

    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:  # only the BFC allocator keeps the statistics
        return "default"
    return "bfc"
