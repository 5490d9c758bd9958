"""absl flags generated from the fields of `sat_tf.config.Config`, and `run`, which parses
a command line into one command's flags and calls its main.

Each command (`sat_tf/cli/<name>.py`, the console command `sat-<name>` and
`scripts/<name>.py`) defines its flags on its own `flags.FlagValues` at import, so that
every command can be imported (and run, `main(argv)`) in one process; `run` adds them to
absl's `flags.FLAGS` for the parse and removes them after. Nothing else under `sat_tf/`
reads flags. A flagfile is plain data, one flag a line (`--flagfile=configs/coco.flags`),
read by absl; a name not found from the working directory is looked up in the project's
`configs/` (`--flagfile=coco.flags`), also for flagfiles that flagfiles name. An unknown
flag in it stops the command with a one-line error naming the flag.

What a command prints: its results on stdout; on stderr, the package's own log messages
(the `logging.info` / `logging.warning` calls under `sat_tf/`) as plain lines, the
message alone (`warning: ` or `error: ` before those levels), and errors as
`error: ...`. TensorFlow's C++ and Python log lines, Keras's and absl's, the Python
warnings of those libraries and the log lines of other libraries below errors are left
out (`sat_tf/cli/__init__.py` before TensorFlow loads, `run` for the log records);
`-v` / `--verbose`, on every command, keeps all of them in absl's own format. Only the
commands do this: the rest of the package never imports `sat_tf.cli`, so `import sat_tf`
and its Python API (`sat_tf.Captioner`) leave TensorFlow's logging, Python's warnings
and absl's format as they are.
"""

import contextlib
import dataclasses
import functools
import logging
import os
import sys

from absl import app, flags
from absl import logging as absl_logging

from sat_tf import cli
from sat_tf import config as config_lib

# The repository root: configs/ holds the project's flagfiles (an editable install, or a
# checkout run through scripts/).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")

_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}
# absl's help flags, which print the help and exit with status 1; `run` makes it 0.
HELP_FLAGS = ("-?", "-h", "-help", "--help", "--helpshort", "--helpfull", "--helpxml")
# The package's folder: log records of its modules are the ones a command shows.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Read from the command line before anything is parsed (`sat_tf.cli.verbose`), since
# TensorFlow's logging is chosen before TensorFlow loads; the flag makes absl accept it
# and --help list it. absl's own `-v` is --verbosity's short name: `run` passes a `-v`
# without a number as --verbose.
flags.DEFINE_bool(
    "verbose",
    False,
    "-v: show TensorFlow's, Keras's and absl's log lines and warnings, and every log "
    "line in absl's format; left out: only the package's own messages, as plain lines.",
)


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


class _FlagfileReader(flags.FlagValues):
    """absl's own flagfile reading (comments, nesting, `--flagfile NAME`, cycles), with
    `find_flagfile` choosing the file a name means.

    Why a private method: absl's public API (`read_flags_from_files`) opens every name
    from the working directory, and the project's flagfiles name others by bare name
    (configs/flickr8k_grid14.flags holds `--flagfile=flickr8k_lite.flags`), so the
    lookup must run at every open, nested ones included; `_get_flag_file_lines` is the
    one place absl opens a flagfile. Rewriting names before the parse would mean reading
    the format a second time. setup.py pins absl-py below 3, and tests/cli_test.py holds
    the result equal to absl's own reading of the same files by path."""

    def _get_flag_file_lines(self, filename, parsed_file_stack=None):
        if filename:
            filename = os.path.realpath(find_flagfile(filename))
        return super()._get_flag_file_lines(filename, parsed_file_stack)


def expand_flagfiles(argv):
    """`argv` with every `--flagfile=NAME` (and `--flagfile NAME`) replaced, in place, by
    the flags of the file it names (`find_flagfile`), recursively, as absl expands them.

    Raises:
      ValueError: for a flagfile that cannot be found or read.
    """
    try:
        return _FlagfileReader().read_flags_from_files(list(argv))
    except (flags.Error, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read a flagfile of {' '.join(argv)}: {e}") from e


def define_override(name, what, flag_values=flags.FLAGS):
    """An integer flag whose absence means the trained model's own setting."""
    flags.DEFINE_integer(
        name,
        None,
        f"{what}; left out: the trained model's own --{name}.",
        flag_values=flag_values,
    )


def override(flag_values, name):
    """The value of a `define_override` flag (None when left out).

    Raises:
      ValueError: for a value below 1.
    """
    value = flag_values[name].value
    if value is not None and value < 1:
        raise ValueError(f"--{name}={value} must be at least 1 (leave it out for the model's own)")
    return value


# The decoding settings that a command loading a trained model may override
# (`decoding_overrides`); each command defines its beam size and length itself
# (`define_override`).
DECODING_OVERRIDES = (
    "hard_decoding",
    "length_penalty",
    "block_repeats",
    "block_bad_endings",
    "tags",
    "tag_threshold",
)


# The preset that captions when neither --workdir nor --preset is given (sat-caption,
# sat-demo).
DEFAULT_PRESET = "flickr8k_lite0_grid14_soft"


def define_model_source(flag_values=flags.FLAGS):
    """The flags --workdir and --preset, of which a script that loads a trained model
    takes exactly one (`load_trained`), and the decoding settings it may override
    (`decoding_overrides`): a flag per name of `DECODING_OVERRIDES` with the type and
    help of its `Config` field, None when left out."""
    for name, _, kind, help_text in config_lib.fields_with_help():
        if name not in DECODING_OVERRIDES:
            continue
        help_text = f"{help_text.rstrip('.')}; left out: the trained model's own --{name}."
        if name in config_lib.CHOICES:
            choices = list(config_lib.CHOICES[name])
            flags.DEFINE_enum(name, None, choices, help_text, flag_values=flag_values)
        else:
            _DEFINE[kind](name, None, help_text, flag_values=flag_values)
    flags.DEFINE_string(
        "workdir",
        None,
        "A trained workdir (sat-train); or --preset.",
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


def check_model_source(flag_values):
    """`model_source`, the workdir or preset it names checked without TensorFlow: a
    workdir holds its config, a preset is a shipped name or a folder (a URL is checked
    when it is read).

    Raises:
      ValueError: unless exactly one is given, or for one that is not there.
    """
    from sat_tf.serving import preset

    kind, source = model_source(flag_values)
    if kind == "workdir":
        check_workdir(source)
    if kind == "preset" and "://" not in source:
        preset.resolve(source)
    return kind, source


def check_workdir(workdir):
    """Raises ValueError, naming `--workdir`, unless the folder holds a workdir's config."""
    from sat_tf.serving import preset

    if not os.path.isfile(os.path.join(workdir, preset.CONFIG_FILE)):
        raise ValueError(
            f"--workdir={workdir} is not a sat_tf workdir: {preset.CONFIG_FILE} is missing"
        )


def check_data_dir(config):
    """Raises ValueError when the folder of `config.dataset` does not exist (the shapes
    dataset is generated there)."""
    if config.dataset != "shapes" and not os.path.isdir(config.data_dir):
        raise ValueError(
            f"--dataset={config.dataset}: --data_dir={config.data_dir} is not a folder"
        )


def decoding_overrides(flag_values, config):
    """Applies the flags of `DECODING_OVERRIDES` (--hard_decoding, --length_penalty,
    --block_repeats, --block_bad_endings, --tags, --tag_threshold) to a loaded model's
    config, which its decoding reads (`inference.decoding_arguments`).

    Returns:
      (config with the values, {name: value} of those that differ from the model's own).

    Raises:
      ValueError: for --hard_decoding with a model without hard attention, or a negative
        --length_penalty, or a --tag_threshold outside [0, 1].
    """
    given = {name: flag_values[name].value for name in DECODING_OVERRIDES}
    threshold, penalty = given["tag_threshold"], given["length_penalty"]
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise ValueError(f"--tag_threshold={threshold} must lie in [0, 1]")
    if penalty is not None and penalty < 0:
        raise ValueError(f"--length_penalty={penalty} must be >= 0 (0 = off)")
    changed = {k: v for k, v in given.items() if v is not None and v != getattr(config, k)}
    if "hard_decoding" in changed and config.attention != "hard":
        raise ValueError(
            f"--hard_decoding={changed['hard_decoding']} is a setting of hard attention; "
            f"this model has {config.attention} attention: leave it out"
        )
    return dataclasses.replace(config, **changed), changed


def load_trained(flag_values):
    """`inference.Trained` of the workdir or preset the flags name (`model_source`):
    model, vocabulary, config, off-world statistics, read once; the config with the
    decoding flags applied (`decoding_overrides`)."""
    from sat_tf.serving import inference  # TensorFlow: not for --help

    kind, source = model_source(flag_values)
    trained = inference.load(source, kind=kind)
    config, _ = decoding_overrides(flag_values, trained.config)
    return trained._replace(config=config)


def _error(e):
    print(f"error: {e}", file=sys.stderr)
    return 1


def _parse_flags(argv):
    """absl's parse, with a flag it cannot parse reported as one `error: ...` line."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        unknown = isinstance(e, flags.UnrecognizedFlagError)
        _error(f"{e} (--helpfull lists the flags)" if unknown else e)
        raise SystemExit(1) from None


def _verbose_as_flag(args):
    """`args` with each `-v` that is not absl's `-v N` (--verbosity) as `--verbose`."""
    args = list(args)
    end = args.index("--") if "--" in args else len(args)
    for i in range(end):
        number = i + 1 < end and args[i + 1].lstrip("-").isdigit()
        if args[i] == "-v" and not number:
            args[i] = "--verbose"
    return args


class _PlainFormatter(logging.Formatter):
    """A log record as its message alone, after `warning: ` or `error: ` at those levels."""

    def format(self, record):
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"error: {text}"
        return f"warning: {text}" if record.levelno >= logging.WARNING else text


def _shown(record):
    """Whether a command without -v shows a log record: the package's, and errors."""
    return record.levelno >= logging.ERROR or record.pathname.startswith(PACKAGE + os.sep)


@contextlib.contextmanager
def _plain_log_lines():
    """absl's handler (every Python log record reaches it, in absl's format) writing
    only the records `_shown` passes, as `_PlainFormatter` lines."""
    handler = absl_logging.get_absl_handler()
    formatter = handler.python_handler.formatter
    handler.setFormatter(_PlainFormatter())
    handler.addFilter(_shown)
    try:
        yield
    finally:
        handler.removeFilter(_shown)
        handler.setFormatter(formatter)


def _help_modules(flag_values):
    """{absl module: names} of a command's own `flag_values`: --help lists the flags of
    the main module (absl keys it by sys.argv[0]), the command's own and the essential
    settings; --helpfull adds the other settings, a heading per section (absl sorts the
    headings), in the order of `config_lib.SECTIONS`."""
    settings = {f.name for f in dataclasses.fields(config_lib.Config)}
    key = [name for name in flag_values if name not in settings or name in config_lib.ESSENTIAL]
    modules = {sys.argv[0]: key}
    for number, (section, names) in enumerate(config_lib.SECTIONS.items(), 1):
        module = f"{os.path.basename(sys.argv[0])} settings, {number}. {section}"
        modules[module] = [n for n in names if n in flag_values and n not in config_lib.ESSENTIAL]
    return {module: names for module, names in modules.items() if names}


def _short_help(flag_args):
    """Whether the first help flag of `flag_args` asks for --help (not --helpfull)."""
    asked = [arg.split("=", 1)[0] for arg in flag_args if arg.split("=", 1)[0] in HELP_FLAGS]
    return bool(asked) and asked[0] in ("-?", "-h", "-help", "--help", "--helpshort")


def _flag_help(flag, indent="  "):
    """A flag's lines of help, as absl writes them."""
    name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
    short = f"-{flag.short_name}," if flag.short_name else ""
    wrap = functools.partial(flags.text_wrap, indent=indent + "  ")
    lines = [wrap(f"{short}{name}: {flag.help or ''}", firstline_indent=indent)]
    if flag.default_as_str:
        lines.append(wrap(f"(default: {flag.default_as_str})"))
    if flag.parser.syntactic_help:
        lines.append(wrap(f"({flag.parser.syntactic_help})"))
    return "\n".join(lines)


def task_help(flag_values, first):
    """--help of a command with its own `flag_values` that reads by task: under the
    command's heading the flags named in `first` (what a user sets first, in that order),
    the essential settings (`config_lib.ESSENTIAL`, in its order) and the command's other
    flags (--verbose last); then the other settings, a heading per section of
    `config_lib.SECTIONS` in its order; each flag once. --helpfull keeps absl's list."""
    modules = _help_modules(flag_values)
    order = [*first, *config_lib.ESSENTIAL, *sorted(flag_values)]
    key = sorted(modules.pop(sys.argv[0], ()), key=order.index)
    blocks = {
        os.path.basename(sys.argv[0]): [flag_values[n] for n in key] + [flags.FLAGS["verbose"]]
    }
    blocks.update({m: [flag_values[n] for n in names] for m, names in modules.items()})
    text = (f"\n{head}:\n" + "\n".join(map(_flag_help, shown)) for head, shown in blocks.items())
    return "".join(text)


def _print_help(text):
    """Prints `text`; a reader that stops early (`sat-train --help | head`) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to say


def run(
    main, flag_values=flags.FLAGS, argv=None, doc="", check=None, help_first=(), tensorflow=None
):
    """Parses `argv` into `flag_values` and calls `main` with the arguments left, through
    `absl.app.run` (its --help / --helpfull, logging flags and flagfiles, with names
    looked up by `expand_flagfiles`). TensorFlow loads (`cli.quiet_tensorflow`) after
    the parse and `check`, before `main`: help, a flag or value not accepted and a
    missing input answer without it.

    Without -v / --verbose (`sat_tf.cli.verbose` of `argv`, flagfiles expanded) log
    records are shown as the module docstring says; absl's handler gets its own format
    back when the run ends.

    Args:
      main: a function of the remaining argv (its program name first); its return value
        is the exit status (None for 0).
      flag_values: the command's own `flags.FlagValues`; reset to defaults first, so a
        command can run more than once in a process. A script that defines its flags on
        absl's `flags.FLAGS` itself passes that (the default).
      argv: the command line, program name first; None for `sys.argv`.
      doc: the command's help text, printed by --help before the flags.
      check: a function of the remaining argv that checks the settings and inputs
        without TensorFlow, raising ValueError; what it returns, unless None, is the
        exit status, and `main` does not run.
      help_first: for a command with its own `flag_values`, the flags its --help
        lists first, in that order (`task_help`); left out: absl's --help.
      tensorflow: a function of no arguments, called after `check`, that says whether
        `main` runs TensorFlow (False: it is not loaded, as for a command that captions
        with LiteRT); None: it does.

    Returns:
      the exit status: main's, 0 after --help, 1 for a ValueError or for flags absl
      cannot parse (each printed as one line `error: ...`).
    """
    argv = list(sys.argv if argv is None else argv)
    flag_args = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    asked_help = any(arg.split("=", 1)[0] in HELP_FLAGS for arg in flag_args)
    try:
        argv = [argv[0], *expand_flagfiles(argv[1:])]
    except ValueError as e:
        return _error(e)
    verbose = cli.verbose(argv)
    log_lines = contextlib.nullcontext() if verbose else _plain_log_lines()
    argv = _verbose_as_flag(argv)

    def wrapped(args):
        flag_values.mark_as_parsed()
        try:
            status = check(args) if check else None
            if status is not None:
                return status
            if not verbose and (tensorflow is None or tensorflow()):
                cli.quiet_tensorflow()
            elif not verbose:
                cli.quiet_litert()
            return main(args)
        except ValueError as e:
            return _error(e)

    main_module = sys.modules["__main__"]
    main_doc = main_module.__doc__
    own = flag_values is not flags.FLAGS
    if own:
        for name in flag_values:
            flag_values[name].unparse()  # its default, not given
        flags.FLAGS.append_flag_values(flag_values)
        for module, names in _help_modules(flag_values).items():
            for name in names:
                flags.FLAGS.register_flag_by_module(module, flag_values[name])
    if flags.FLAGS["verbose"] not in flags.FLAGS.get_flags_for_module(sys.argv[0]):
        flags.FLAGS.register_flag_by_module(sys.argv[0], flags.FLAGS["verbose"])
    try:
        main_module.__doc__ = (doc or main_doc or "") + FLAGFILE_HELP
        if help_first and _short_help(flag_args):
            text = main_module.__doc__ + "\nflags:\n" + task_help(flag_values, help_first)
            _print_help(text + "\n\nTry --helpfull to get a list of all flags.")
            return 0
        with log_lines:
            app.run(wrapped, argv=argv, flags_parser=_parse_flags)
    except SystemExit as e:
        if asked_help and e.code == 1:
            return 0
        return e.code if isinstance(e.code, int) else (0 if e.code is None else _error(e.code))
    finally:
        main_module.__doc__ = main_doc
        if own:
            flags.FLAGS.remove_flag_values(flag_values)
    return 0


def run_beam_command(main, check, flag_values, doc, argv=None):
    """`run` for a Beam command: its flagfiles expanded, its own flags (`flag_values`)
    parsed apart from the pipeline options (`launch.split_args`), which
    `check(pipeline_args)` and `main(pipeline_args)` take first; 1 for a flagfile that
    cannot be read."""
    from sat_tf.pipelines import launch

    argv = list(sys.argv if argv is None else argv)
    try:
        argv = [argv[0], *expand_flagfiles(argv[1:])]
    except ValueError as e:
        return _error(e)
    own, pipeline_args = launch.split_args(argv, flag_values, keep=HELP_FLAGS)
    check = functools.partial(check, pipeline_args)
    return run(functools.partial(main, pipeline_args), flag_values, own, doc, check=check)


def run_with_filesystem_options(main, flag_values, argv=None, doc="", **kwargs):
    """`run` for a command that reads or writes a folder elsewhere (`s3://`, `hdfs://`):
    Beam's options of those filesystems (`--s3_endpoint_url=...`, `--hdfs_host=...`, on
    the command line or in a flagfile) are taken apart and given to them
    (`filesystem.set_options`) before `main(argv)` runs; `kwargs` as for `run`."""
    from sat_tf.utils import filesystem

    argv = list(sys.argv if argv is None else argv)
    try:
        argv = [argv[0], *expand_flagfiles(argv[1:])]
    except ValueError as e:
        return _error(e)
    argv, options = filesystem.split_options(argv)

    def with_options(args):
        filesystem.set_options(options)
        return main(args)

    return run(with_options, flag_values, argv, doc, **kwargs)
