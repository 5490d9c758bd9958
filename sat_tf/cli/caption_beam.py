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
corrupt, too many pixels, too large) a line {path, error, status} instead, and the others
go on. At the end it prints the output files and the counts of captioned and refused
photos (Beam metrics); the exit status is 2 when some were refused.

Every path goes through Beam's FileSystems: local, s3:// (with Beam's --s3_endpoint_url,
--s3_access_key_id, ... options), gs://, hdfs://. A file's size is read from the listing
first, and a file over --max_image_bytes gets its error line unread (status 6).

Every flag that is not one of this command's is a Beam pipeline option (--runner,
--direct_running_mode, --direct_num_workers, the --s3_* options, Dataflow's --project
--region --temp_location, ...); every worker gets them. Without --runner it runs on this
machine in the fastest local setting measured (`launch.LOCAL_DEFAULT`, BUILD_NOTES.md,
"Beam"), for the options not given. A runner whose workers are elsewhere (Dataflow,
Flink, Spark, a portable runner without LOOPBACK) refuses a local --export, --input or
--output at once. --preset or --workdir export the model to a temporary folder first
(removed at the end), which only a local runner can read; give other runners --export, a
`sat-export` folder copied where their workers read it.
"""

import os
import shutil
import sys
import tempfile

from absl import flags

from sat_tf.cli import flags_lib
from sat_tf.cli.flags_lib import define_model_source, define_override, override
from sat_tf.data.image_files import MAX_IMAGE_BYTES

PROGRAM = "sat-caption-beam"
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
    "max_image_bytes",
    MAX_IMAGE_BYTES,
    "A larger file is refused from its listed size, unread (status 6); the default is "
    "more than a photo of --max_image_pixels takes as a JPEG or a PNG.",
    flag_values=FLAGS,
)
flags.DEFINE_integer(
    "max_image_pixels",
    50_000_000,
    "With --preset / --workdir: the export refuses photos of more pixels (status 4), read "
    "from their headers.",
    flag_values=FLAGS,
)
define_model_source(FLAGS)
define_override("beam_size", "With --preset / --workdir: beam size of the export", FLAGS)


def _check_flags():
    if not FLAGS.input:
        raise ValueError("give --input=<a path or glob of photos> (repeat for more)")
    if not FLAGS.output:
        raise ValueError("give --output=<prefix of the JSON-lines files>")
    for name, least in (("batch_size", 1), ("num_shards", 0), ("max_image_bytes", 1)):
        if FLAGS[name].value < least:
            raise ValueError(f"--{name}={FLAGS[name].value} must be at least {least}")
    if FLAGS.export and (FLAGS.preset or FLAGS.workdir):
        raise ValueError("give --export or --preset / --workdir, not both")
    if not FLAGS.export and not FLAGS.workdir and not FLAGS.preset:
        FLAGS.preset = flags_lib.DEFAULT_PRESET


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
    """Checks the pipeline options, the flags, the paths the runner's workers must reach
    and the model source before TensorFlow loads (Beam's options load none)."""
    from sat_tf.pipelines import launch

    options = launch.parse(pipeline_args, PROGRAM)
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])} (give photos with --input)")
    _check_flags()
    if not FLAGS.export and not launch.workers_are_local(options):
        raise ValueError(
            f"--preset / --workdir export to a local folder, which the workers of "
            f"{launch.runner_name(options)} cannot read: run sat-export, copy the folder "
            f"where they read ({launch.SHARED_FILESYSTEMS}) and give --export=<it>"
        )
    paths = [("export", FLAGS.export), *(("input", p) for p in FLAGS.input)]
    launch.check_paths(options, [*paths, ("output", FLAGS.output)])
    if FLAGS.export and launch.is_local(FLAGS.export) and not os.path.isdir(FLAGS.export):
        raise ValueError(f"--export={FLAGS.export} is not a folder (sat-export writes one)")
    if not FLAGS.export:
        flags_lib.check_model_source(FLAGS)


def _main(pipeline_args, argv):
    from sat_tf.pipelines import caption_pipeline, launch

    options = launch.parse(pipeline_args, PROGRAM)
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
            max_image_bytes=FLAGS.max_image_bytes,
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
    return flags_lib.run_beam_command(_main, _check, FLAGS, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
