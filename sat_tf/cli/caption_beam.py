"""Captions many photos as an Apache Beam pipeline: on this machine or on Dataflow, Flink or
Spark.

  sat-caption-beam --export=exports/sat/1 --input='photos/*.jpg' --output=runs/captions
  sat-caption-beam --preset=flickr8k_lite0_grid14_soft --input='photos/*.jpg' \
      --output=runs/captions
  sat-caption-beam --export=gs://bucket/export --input='gs://bucket/photos/*.jpg' \
      --output=gs://bucket/captions --runner=DataflowRunner --project=P --region=R \
      --temp_location=gs://bucket/tmp --setup_file=./setup.py

Each file that --input names (a path or a glob; the flag repeats) gets one JSON line in
`<output>-SSSSS-of-NNNNN.jsonl`, with the fields `sat-caption --output` writes (path,
caption, tokens, score; tag and tag_prob, off_world_score and off_world where the model
has them); a file that gets no caption (missing, empty, not an image, truncated or
corrupt, too many pixels) a line {path, error, status} instead, and the others go on. At
the end it prints the output files and the counts of captioned and refused photos (Beam
metrics); the exit status is 2 when some were refused.

Every flag that is not one of this command's is a Beam pipeline option (--runner,
--direct_num_workers, Dataflow's --project --region --temp_location, ...). Without
--runner it runs on this machine with `DEFAULT_OPTIONS`, the fastest local setting
measured (BUILD_NOTES.md, "Beam"). --preset or --workdir export the model to a
temporary folder first, which only a local runner can read; give other runners
--export, a `sat-export` folder their workers read.
"""

import difflib
import functools
import os
import shutil
import sys
import tempfile

from absl import flags

from sat_tf.cli import flags_lib
from sat_tf.cli.flags_lib import define_model_source, define_override, override, run

# The local setting when no --runner is given: the DirectRunner's batch engine (without
# its attempt to fetch the Prism runner), two threads sharing one model (faster here than
# one thread or two processes, each of which loads the model: BUILD_NOTES.md, "Beam").
DEFAULT_OPTIONS = (
    "--runner=FnApiRunner",
    "--direct_running_mode=multi_threading",
    "--direct_num_workers=2",
)
LOCAL_RUNNERS = ("DirectRunner", "FnApiRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")
# The exit status when some photos were refused.
REFUSED = 2

FLAGS = flags.FlagValues()
flags.DEFINE_string(
    "export",
    None,
    "A sat-export folder (any filesystem Beam reads); or --preset.",
    flag_values=FLAGS,
)
flags.DEFINE_multi_string(
    "input", [], "Photos: a path or a glob; repeat for more.", flag_values=FLAGS
)
flags.DEFINE_string("output", None, "Prefix of the JSON-lines files.", flag_values=FLAGS)
flags.DEFINE_integer("batch_size", 16, "Most photos per call of the model.", flag_values=FLAGS)
flags.DEFINE_integer("num_shards", 0, "Output files; 0 lets the runner choose.", flag_values=FLAGS)
flags.DEFINE_integer(
    "max_image_pixels",
    50_000_000,
    "With --preset / --workdir: the export refuses photos of more pixels (status 4), read "
    "from their headers.",
    flag_values=FLAGS,
)
define_model_source(FLAGS)
define_override("beam_size", "With --preset / --workdir: beam size of the export", FLAGS)


def split_args(argv, flag_values=FLAGS):
    """(this command's arguments, the Beam pipeline options) of a command line (program
    name first, flagfiles expanded): a flag this command (`flag_values`; another Beam
    command passes its own) or absl defines goes to the first list, with its value when
    that is the next argument; every other flag and its value to the second."""
    own, pipeline = [argv[0]], []
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "--":
            own += [arg, *args]
            break
        name = arg.lstrip("-").split("=", 1)[0]
        known = flag_values if name in flag_values else flags.FLAGS
        flag = known[name] if name in known else None
        negated = (
            name.startswith("no") and name[2:] in flag_values and flag_values[name[2:]].boolean
        )
        if not arg.startswith("-") or flag is not None or negated or arg in flags_lib.HELP_FLAGS:
            takes_next = flag is not None and not flag.boolean and "=" not in arg
            own += [arg, args.pop(0)] if takes_next and args else [arg]
            continue
        takes_next = "=" not in arg and args and not args[0].startswith("-")
        pipeline += [arg, args.pop(0)] if takes_next else [arg]
    return own, pipeline


def pipeline_options(args, program="sat-caption-beam"):
    """`PipelineOptions` of the arguments, `DEFAULT_OPTIONS` first when no --runner is
    among them; `program` names the command in the error.

    Raises:
      ValueError: naming an argument that is no Beam pipeline option (with the closest).
    """
    from apache_beam.options import pipeline_options as beam_options

    if not any(a.split("=", 1)[0] == "--runner" for a in args):
        args = [*DEFAULT_OPTIONS, *args]
    parser = beam_options._BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in beam_options.PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(args)
    for arg in unknown:
        if arg.startswith("-"):
            known = [o for action in parser._actions for o in action.option_strings]
            close = difflib.get_close_matches(arg.split("=", 1)[0], known, 1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ValueError(
                f"unknown flag {arg}: not a flag of {program} nor a Beam "
                f"pipeline option{hint} (--helpfull lists this command's)"
            )
    return beam_options.PipelineOptions(args)


def _check_flags():
    if not FLAGS.input:
        raise ValueError("give --input=<a path or glob of photos> (repeat for more)")
    if not FLAGS.output:
        raise ValueError("give --output=<prefix of the JSON-lines files>")
    if FLAGS.batch_size < 1 or FLAGS.num_shards < 0:
        raise ValueError(
            f"--batch_size={FLAGS.batch_size} must be >= 1 and --num_shards={FLAGS.num_shards} >= 0"
        )
    if FLAGS.export and (FLAGS.preset or FLAGS.workdir):
        raise ValueError("give --export or --preset / --workdir, not both")
    if not FLAGS.export and not FLAGS.workdir and not FLAGS.preset:
        FLAGS.preset = flags_lib.DEFAULT_PRESET
    if FLAGS.export and "://" not in FLAGS.export and not os.path.isdir(FLAGS.export):
        raise ValueError(f"--export={FLAGS.export} is not a folder (sat-export writes one)")


def _export_model(folder):
    """Exports the --preset / --workdir model into `folder`; returns the export path."""
    from sat_tf.serving import exporting

    model, vocab, config, off_world, _ = flags_lib.load_trained(FLAGS)
    path = os.path.join(folder, "export")
    exporting.export(
        model,
        vocab,
        config,
        path,
        beam_size=override(FLAGS, "beam_size"),
        max_image_pixels=FLAGS.max_image_pixels,
        off_world=off_world,
    )
    return path


def _check(pipeline_args, argv):
    """Checks the pipeline options, the flags and the model source before TensorFlow
    loads (Beam's options load none)."""
    options = pipeline_options(pipeline_args)
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])} (give photos with --input)")
    _check_flags()
    runner = options.get_all_options()["runner"]
    if not FLAGS.export and runner not in LOCAL_RUNNERS:
        raise ValueError(
            f"--preset / --workdir export to a local folder, which {runner}'s "
            "workers cannot read: run sat-export and give --export=<its folder>"
        )
    if not FLAGS.export:
        flags_lib.check_model_source(FLAGS)


def _main(pipeline_args, argv):
    options = pipeline_options(pipeline_args)
    from sat_tf.pipelines import caption_pipeline

    temporary = None if FLAGS.export else tempfile.mkdtemp(prefix="sat_caption_beam_")
    try:
        export = FLAGS.export or _export_model(temporary)
        found = caption_pipeline.run(
            export,
            FLAGS.input,
            FLAGS.output,
            options,
            batch_size=FLAGS.batch_size,
            num_shards=FLAGS.num_shards,
        )
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)
    print(f"captioned {found['captioned']}, refused {found['refused']}: {FLAGS.output}-*.jsonl")
    if found["refused"]:
        print(
            f"error: {found['refused']} photos not captioned (their lines hold the reason)",
            file=sys.stderr,
        )
    return REFUSED if found["refused"] else 0


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status: 0, 1 when nothing could start, `REFUSED` when some photos were
      refused.
    """
    return run_beam_command(_main, _check, FLAGS, __doc__, argv)


def run_beam_command(main, check, flag_values, doc, argv=None):
    """`flags_lib.run` for a Beam command: its flagfiles expanded, its own flags
    (`flag_values`) parsed apart from the pipeline options, which `check(pipeline_args)`
    and `main(pipeline_args)` take first; 1 for a flagfile that cannot be read."""
    argv = list(sys.argv if argv is None else argv)
    try:
        argv = [argv[0], *flags_lib.expand_flagfiles(argv[1:])]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    own, pipeline_args = split_args(argv, flag_values)
    check = functools.partial(check, pipeline_args)
    return run(functools.partial(main, pipeline_args), flag_values, own, doc, check=check)


if __name__ == "__main__":
    raise SystemExit(main())
