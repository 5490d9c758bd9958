"""absl flags generated from the fields of `sat_tf.config.Config`.

Scripts call `define_config_flags()` at import and `config_from_flags(FLAGS)` in `main`;
nothing under `sat_tf/` reads flags. A flagfile is plain data read by absl
(`--flagfile=configs/coco.flags`); an unknown flag in it stops the script with a
one-line error naming the flag.
"""

import os
import sys

from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sat_tf import config as config_lib  # noqa: E402

_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}


def define_config_flags(flag_values=flags.FLAGS, only=None):
    """Defines one flag per `Config` field (or per field named in `only`)."""
    for name, default, kind, help_text in config_lib.fields_with_help():
        if only is not None and name not in only:
            continue
        if name in config_lib.CHOICES:
            flags.DEFINE_enum(
                name, default, list(config_lib.CHOICES[name]), help_text, flag_values=flag_values
            )
        elif kind in _DEFINE:
            _DEFINE[kind](name, default, help_text, flag_values=flag_values)
        else:
            flags.DEFINE_string(name, default, help_text, flag_values=flag_values)


def config_from_flags(flag_values=flags.FLAGS):
    """Builds a `Config` from parsed flags.

    Raises:
      ValueError: for an invalid value, or for flags given explicitly (on the command
        line or in a flagfile) that contradict each other
        (`config_lib.check_given_settings`).
    """
    names = [name for name, *_ in config_lib.fields_with_help() if name in flag_values]
    config = config_lib.Config(**{name: flag_values[name].value for name in names})
    config_lib.check_given_settings(config, {n for n in names if flag_values[n].present})
    return config


def run(main):
    """`absl.app.run(main)` that prints a ValueError as one line and exits with 1."""
    from absl import app

    def wrapped(argv):
        try:
            return main(argv)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(1)

    app.run(wrapped)
