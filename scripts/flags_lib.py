"""absl flags generated from the fields of `sat_tf.config.Config`.

Scripts call `define_config_flags()` at import and `config_from_flags(FLAGS)` in `main`;
nothing under `sat_tf/` reads flags. A flagfile is plain data, one flag a line
(`--flagfile=configs/coco.flags`); a name not found from the working directory is looked
up in the project's `configs/` (`--flagfile=coco.flags`), also for flagfiles that
flagfiles name. An unknown flag in it stops the script with a one-line error naming
the flag.
"""

import os
import sys

from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
sys.path.insert(0, ROOT)

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


FLAGFILE_HELP = (
    "\n--flagfile=NAME reads flags from a file, one a line; a NAME not found from the "
    f"working directory is looked up in {CONFIGS} (e.g. --flagfile=coco.flags).\n"
)


def find_flagfile(name):
    """The path of flagfile `name`: as given when it exists, else in the project's
    configs/ (or the project's root, for names such as `configs/shapes.flags`).

    Raises:
      ValueError: naming every place looked in.
    """
    for path in (name, os.path.join(CONFIGS, name), os.path.join(ROOT, name)):
        if os.path.isfile(path):
            return path
    raise ValueError(
        f"flagfile {name!r} not found in the working directory ({os.getcwd()}) nor in {CONFIGS}"
    )


def expand_flagfiles(argv, _seen=()):
    """`argv` with every `--flagfile=NAME` (and `--flagfile NAME`) replaced, in place, by
    the flags of the file it names (`find_flagfile`), recursively; blank lines and lines
    starting with # or // are skipped, as absl does.

    Raises:
      ValueError: for a flagfile that cannot be found or read, or one that names itself.
    """
    out, args = [], list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--flagfile" and args:
            arg = f"--flagfile={args.pop(0)}"
        if not arg.startswith("--flagfile="):
            out.append(arg)
            continue
        path = os.path.realpath(find_flagfile(arg.split("=", 1)[1]))
        if path in _seen:
            raise ValueError(f"flagfile {path} includes itself")
        try:
            with open(path, encoding="utf-8") as f:
                lines = [line.strip() for line in f]
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read flagfile {path}: {e}") from e
        flags_in_file = [x for x in lines if x and not x.startswith(("#", "//"))]
        out += expand_flagfiles(flags_in_file, (*_seen, path))
    return out


def define_override(name, what):
    """An integer flag whose absence means the trained model's own setting."""
    flags.DEFINE_integer(name, None, f"{what}; left out: the trained model's own --{name}.")


def override(flag_values, name):
    """The value of a `define_override` flag (None when left out).

    Raises:
      ValueError: for a value below 1.
    """
    value = flag_values[name].value
    if value is not None and value < 1:
        raise ValueError(f"--{name}={value} must be at least 1 (leave it out for the model's own)")
    return value


def define_model_source(flag_values=flags.FLAGS):
    """The flags --workdir and --preset, of which a script that loads a trained model
    takes exactly one (`load_model`)."""
    flags.DEFINE_string(
        "workdir",
        None,
        "A trained workdir (scripts/train.py); or --preset.",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "preset",
        None,
        "A preset instead of --workdir: the name of a shipped one (sat_tf/presets/), a "
        "preset folder, or the https:// URL of a preset archive (#sha256=<hex> checks it).",
        flag_values=flag_values,
    )


def model_source(flag_values):
    """("workdir", path) or ("preset", source) from the flags of `define_model_source`.

    Raises:
      ValueError: unless exactly one of the two is given.
    """
    workdir, source = flag_values["workdir"].value, flag_values["preset"].value
    if workdir and source:
        raise ValueError(
            f"give --workdir or --preset, not both (--workdir={workdir} --preset={source})"
        )
    if not workdir and not source:
        raise ValueError(
            "give --workdir=<a trained workdir> or --preset=<a shipped name, a folder or "
            "an https:// URL>"
        )
    return ("workdir", workdir) if workdir else ("preset", source)


def load_model(flag_values):
    """(model, vocab, config) of the workdir or preset the flags name (`model_source`)."""
    from sat_tf import preset
    from sat_tf.training import workdir as workdir_lib

    kind, source = model_source(flag_values)
    if kind == "workdir":
        return workdir_lib.load_trained(source)
    return preset.load(source)


def run(main):
    """`absl.app.run(main)` that expands flagfiles (`expand_flagfiles`) and prints a
    ValueError as one line and exits with 1."""
    from absl import app

    main_module = sys.modules["__main__"]
    main_module.__doc__ = (main_module.__doc__ or "") + FLAGFILE_HELP
    try:
        argv = [sys.argv[0], *expand_flagfiles(sys.argv[1:])]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)

    def wrapped(argv):
        try:
            return main(argv)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(1)

    app.run(wrapped, argv=argv)
