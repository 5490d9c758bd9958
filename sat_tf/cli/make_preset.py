"""Makes a preset, `sat_tf/presets/<name>/`, from a trained workdir.

  sat-make-preset --workdir=runs/flickr8k_lite0 --name=flickr8k_lite0_soft \\
      --data_dir=../shared/data/flickr8k \\
      --train_command="sat-train --flagfile=flickr8k_lite.flags ..."

The weights are stored in float16 with the vocabulary, the config and metadata.json
(see sat_tf/serving/preset.py). The preset is written to a temporary folder beside its
place, loaded back from there as users load it, evaluated on the test split greedily and with
beam 3 from the image files (the encoder runs on every photo, as caption.py and the
exports run it), and renamed into place when complete: the scores stored in its
metadata are those of the shipped float16 weights. `evaluate.py --preset=<name>`
reproduces them. A preset may take at most 25 MB.

Rebuilding the shipped preset, when a better model is trained: train it (the
`trained_with` command in the old preset's metadata.json names the settings), then run
this script with the new workdir, the same --name and --overwrite, and commit the
folder. `--archive=out.tar.gz` also packs the preset for download
(`--preset=https://host/out.tar.gz#sha256=<the printed sha256>`).

  sat-make-preset --rescore=sat_tf/presets/flickr8k_lite0_soft \
      --data_dir=../shared/data/flickr8k

measures a preset's stored scores again with today's code (after a change to decoding,
say), its weights untouched.

  sat-make-preset --choose_decoding=sat_tf/presets/flickr8k_lite0_grid14_soft \
      --data_dir=../shared/data/flickr8k

chooses a preset's decoding (beam size, length penalty, repeat and ending blocking) on
its validation photos by its --selection_metric, as training chooses a run's
(sat_tf/training/decoding_choice.py), keeps it in its config.json, every setting tried
in its decoding.json, and measures its stored test scores again with it (greedy, beam 3
and the chosen beam size).
"""

import json
import os
import shlex
import sys

from absl import flags

from sat_tf.cli import flags_lib
from sat_tf.cli.flags_lib import run
from sat_tf.serving import preset

PROGRAM = "sat-make-preset"

FLAGS = flags.FlagValues()
for _name, _default, _help in (
    ("workdir", None, "The trained workdir (sat-train)."),
    ("name", None, "Name of the preset: lowercase letters, digits, _ . -"),
    ("train_command", None, "The command that trained the workdir."),
    ("data_dir", None, "Dataset folder to evaluate on; default the training run's."),
    ("description", "", "One line saying what the preset is."),
    ("output_root", preset.PRESETS_DIR, "Folder of presets."),
    ("archive", None, "Also pack the preset into this .tar.gz file."),
):
    flags.DEFINE_string(_name, _default, _help, flag_values=FLAGS)
flags.DEFINE_bool("overwrite", False, "Replace an earlier preset of that name.", flag_values=FLAGS)
flags.DEFINE_string(
    "rescore",
    None,
    "A preset folder whose stored scores to measure again (instead of making a preset).",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "choose_decoding",
    None,
    "A preset folder whose decoding to choose on its validation photos, then store its "
    "test scores with it (instead of making a preset).",
    flag_values=FLAGS,
)
REQUIRED = ("workdir", "name", "train_command")


def _command(argv):
    """The command line as it would be typed again: the script's path, or the console
    command's name."""
    program = ["python", "scripts/make_preset.py"] if argv[0].endswith(".py") else [PROGRAM]
    return shlex.join([*program, *argv[1:]])


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS.rescore and FLAGS.choose_decoding:
        raise ValueError("give --rescore or --choose_decoding, not both")
    for name in ("rescore", "choose_decoding"):
        if FLAGS[name].value and not os.path.isdir(FLAGS[name].value):
            raise ValueError(f"--{name}={FLAGS[name].value} is not a preset folder")
    if not FLAGS.rescore and not FLAGS.choose_decoding:
        missing = [f"--{name}" for name in REQUIRED if not FLAGS[name].value]
        if missing:
            raise ValueError(
                f"give {', '.join(missing)} (or --rescore or --choose_decoding=<preset folder>)"
            )
        flags_lib.check_workdir(FLAGS.workdir)
    if FLAGS.data_dir is not None and not os.path.isdir(FLAGS.data_dir):
        raise ValueError(f"--data_dir={FLAGS.data_dir} is not a folder")


def _main(argv, command):
    from sat_tf.training import publish

    if FLAGS.rescore:
        metadata = publish.rescore(FLAGS.rescore, data_dir=FLAGS.data_dir, command=command)
        scores = metadata["scores"]
        print(json.dumps({k: scores[k] for k in scores if "beam" in k}, indent=2))
        return
    if FLAGS.choose_decoding:
        metadata = publish.choose_decoding(
            FLAGS.choose_decoding, data_dir=FLAGS.data_dir, command=command
        )
        scores = metadata["scores"]
        print(json.dumps({"decoding": metadata["decoding"]["chosen"]}, indent=2))
        print(json.dumps({k: scores[k] for k in scores if "beam" in k}, indent=2))
        return
    metadata = publish.make(
        FLAGS.workdir,
        FLAGS.output_root,
        FLAGS.name,
        train_command=FLAGS.train_command,
        make_command=command,
        data_dir=FLAGS.data_dir,
        description=FLAGS.description,
        overwrite=FLAGS.overwrite,
    )
    folder = os.path.join(FLAGS.output_root, FLAGS.name)
    scores = metadata["scores"]
    summary = {k: {m: scores[k][m] for m in ("BLEU-4", "CIDEr")} for k in scores if "beam" in k}
    print(json.dumps({"preset": folder, **summary}, indent=2))
    if FLAGS.archive:
        digest = publish.pack(folder, FLAGS.archive)
        print(f"archive: {FLAGS.archive}\nsha256: {digest}")


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    argv = list(sys.argv if argv is None else argv)
    return run(lambda rest: _main(rest, _command(argv)), FLAGS, argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
