"""The console commands: `sat-<name>` (setup.py) and `python scripts/<name>.py` both run
`sat_tf.cli.<name>.main` (`export/export.py` runs `sat_tf.cli.export`).

A command defines and parses its flags, checks its settings and that its inputs exist
before TensorFlow loads: `--help`, a mistyped flag, a bad value or a missing file answer
at once (tests/cli_start_test.py holds that no `tensorflow` module is imported for them).
Then `flags_lib.run` loads TensorFlow through `quiet_tensorflow`, which quiets TensorFlow
and Keras unless the command line asks for their output with `-v` / `--verbose` (or
absl's `--verbosity`): TensorFlow's C++ logging
through `TF_CPP_MIN_LOG_LEVEL=3` (unless the environment sets a level), its Python
logger (errors only), the Python warnings of TensorFlow, Keras and absl, and the lines
absl's C++ logging writes while TensorFlow's libraries load, which no setting reaches,
by pointing stderr at /dev/null for the import alone. It must come before TensorFlow
loads, so the modules of the commands import TensorFlow (and the package's modules that
do) inside their functions, never at the top; `flags_lib.run` shows the package's log
lines plainly. `import sat_tf` and the Python API change none of this.
"""

import os
import warnings

from sat_tf.utils import quiet

# The modules whose Python warnings a command without -v leaves out.
QUIET_MODULES = r"(tensorflow|tensorflow_text|keras|tf_keras|absl|google\.protobuf)(\.|$)"


def verbose(argv) -> bool:
    """Whether `argv` (program name first) asks for log lines: -v / --verbose, or absl's
    --verbosity (`-v=1`, `-v 1`); a later --noverbose takes it back. Flags after `--`
    are arguments."""
    asked = False
    for arg in argv[1:]:
        if arg == "--":
            break
        if not arg.startswith("-"):
            continue
        name, given, value = arg.lstrip("-").partition("=")
        if name in ("v", "verbosity"):
            asked = True
        elif name == "verbose":
            asked = not given or value.lower() in ("true", "t", "1")
        elif name == "noverbose":
            asked = False
    return asked


def quiet_litert() -> None:
    """Leaves out TensorFlow's and LiteRT's C++ log lines: `TF_CPP_MIN_LOG_LEVEL` set to 3
    (unless the environment sets a level), which TensorFlow reads as it loads and the
    LiteRT captioner as it starts an interpreter (`sat_tf.utils.quiet.info_hidden`)."""
    if not os.environ.get("TF_CPP_MIN_LOG_LEVEL"):
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"


def quiet_tensorflow() -> None:
    """Imports TensorFlow (and tensorflow_text, which loads its own copy of the logging
    library) with its log lines hidden, sets TensorFlow's Python logger to errors, and
    leaves out the Python warnings of `QUIET_MODULES` from then on; Python errors of the
    import still show."""
    quiet_litert()
    warnings.filterwarnings("ignore", module=QUIET_MODULES)
    with quiet.stderr_silenced():
        import tensorflow as tf

        try:
            import tensorflow_text  # noqa: F401
        except ImportError:
            pass
    tf.get_logger().setLevel("ERROR")
