"""The console commands: `sat-<name>` (setup.py) and `python scripts/<name>.py` both run
`sat_tf.cli.<name>.main` (`export/export.py` runs `sat_tf.cli.export`).

Importing this package silences TensorFlow's own log lines (library loading, CPU
features, a missing CUDA driver) unless the command line asks for them with `-v` or
`--verbosity`: its C++ logging through `TF_CPP_MIN_LOG_LEVEL` (unless already set) and
its Python logger; the lines absl's C++ logging writes while TensorFlow's libraries load,
which no setting reaches, by pointing stderr at /dev/null for the import alone.
"""

import os
import sys

VERBOSE_FLAGS = ("-v", "--v", "-verbosity", "--verbosity")


def verbose(argv) -> bool:
    """Whether `argv` (program name first) asks for log lines: -v / --verbosity."""
    return any(arg.split("=", 1)[0] in VERBOSE_FLAGS for arg in argv[1:])


def quiet_tensorflow() -> None:
    """Imports TensorFlow (and tensorflow_text, which loads its own copy of the logging
    library) with its log lines hidden; Python errors of the import still show."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        import tensorflow as tf

        try:
            import tensorflow_text  # noqa: F401
        except ImportError:
            pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    tf.get_logger().setLevel("ERROR")


if not verbose(sys.argv):
    quiet_tensorflow()
