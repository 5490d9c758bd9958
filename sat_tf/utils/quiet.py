"""What the C++ libraries under the package write to stderr, left out where asked:
TensorFlow's and LiteRT's log lines, which no Python setting reaches."""

import contextlib
import os
import sys


@contextlib.contextmanager
def stderr_silenced():
    """Points file descriptor 2 at /dev/null for the block (Python's `sys.stderr` is
    flushed first, and gets its stream back after)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def info_hidden() -> bool:
    """Whether the environment asks TensorFlow's C++ logging for warnings and errors
    only (`TF_CPP_MIN_LOG_LEVEL` 1 or more), which LiteRT's own log line does not heed."""
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")
    return level.isdigit() and int(level) >= 1
