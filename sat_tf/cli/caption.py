"""Captions image files with a trained model and shows where it looked for every word.

  sat-caption photo.jpg other.png --workdir=runs/shapes --visualize=out/
  sat-caption photos/ "more/*.jpg" --preset=flickr8k_lite0_soft --output=captions.jsonl

(`python scripts/caption.py ...` is the same command.) Each argument is an image file, a
folder (its image files: .jpg .jpeg .png .gif .bmp .webp, in name order) or a glob.
Prints each caption with a per-word attention summary (argmax cell and weight); with
--output writes one JSON object a line per image: {"path", "caption", "tokens" (word
ids), "score" (the caption's log-probability)}; with --visualize writes one PNG per image
with a panel per word (paper Fig. 3), outlining the attended cell for a hard-attention
model. An image that cannot be read is reported on stderr and skipped, the others are
captioned; the exit status is then 2 (1: nothing could start, e.g. a bad flag or model).
With more than one image, stderr shows the progress (`12/80`).
"""

import glob
import json
import os
import sys

from absl import flags

from sat_tf import api
from sat_tf.cli.flags_lib import define_model_source, define_override, load_model, override, run

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
# The exit status when some images were skipped.
SKIPPED = 2

FLAGS = flags.FlagValues()
define_model_source(FLAGS)
define_override("beam_size", "Beam size (1 = greedy)", FLAGS)
flags.DEFINE_string(
    "visualize", "", "Folder for one attention picture per image.", flag_values=FLAGS
)
flags.DEFINE_string(
    "output",
    "",
    "JSON-lines file: one caption a line (path, caption, tokens, score).",
    flag_values=FLAGS,
)
flags.DEFINE_integer("batch_size", 16, "Images per call of the model.", flag_values=FLAGS)


def expand(args):
    """The image files that the arguments name, in order, and the problems found.

    Args:
      args: files (taken as given, whatever their extension), folders (their files with
        an image extension, in name order, not recursing) and globs (`*`, `?`, `[`;
        `**` recurses; matching files in name order).

    Returns:
      (paths, problems): a problem is a message for an argument that names no image.
    """
    paths, problems = [], []
    for arg in args:
        if os.path.isdir(arg):
            found = sorted(
                os.path.join(arg, name)
                for name in os.listdir(arg)
                if name.lower().endswith(IMAGE_EXTENSIONS)
                and os.path.isfile(os.path.join(arg, name))
            )
            if not found:
                problems.append(
                    f"folder {arg!r} holds no image file ({', '.join(IMAGE_EXTENSIONS)})"
                )
        elif glob.has_magic(arg) and not os.path.exists(arg):
            found = sorted(p for p in glob.glob(arg, recursive=True) if os.path.isfile(p))
            if not found:
                problems.append(f"no file matches {arg!r}")
        else:
            found = [arg]
        paths += found
    return paths, problems


class _Progress:
    """`done/total` on stderr: rewritten in place on a terminal, a line each otherwise."""

    def __init__(self, total):
        self.total, self.done = total, 0
        self.shown = total > 1
        self.tty = sys.stderr.isatty()

    def add(self, count):
        self.done += count
        if not self.shown:
            return
        if self.tty:
            end = "\n" if self.done == self.total else ""
            print(f"\r{self.done}/{self.total}", end=end, file=sys.stderr, flush=True)
        else:
            print(f"{self.done}/{self.total}", file=sys.stderr, flush=True)

    def report(self, message):
        if self.tty and 0 < self.done < self.total:
            print(file=sys.stderr)  # off the progress line
        print(f"error: {message}", file=sys.stderr, flush=True)


def _write_picture(captioner, caption, path):
    stem = os.path.splitext(os.path.basename(path))[0]
    target = os.path.join(FLAGS.visualize, f"{stem}_attention.png")
    captioner.attention_figure(caption, path=target)
    print(f"attention picture: {target}")


def _main(argv):
    if len(argv) < 2:
        raise ValueError("give one or more image files, folders or globs to caption")
    beam_size = override(FLAGS, "beam_size")
    if FLAGS.batch_size < 1:
        raise ValueError(f"--batch_size={FLAGS.batch_size} must be at least 1")
    paths, problems = expand(argv[1:])
    captioner = api.Captioner(*load_model(FLAGS), batch_size=FLAGS.batch_size)
    if FLAGS.visualize:
        os.makedirs(FLAGS.visualize, exist_ok=True)
    if FLAGS.output:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    output = open(FLAGS.output, "w", encoding="utf-8") if FLAGS.output else None
    progress = _Progress(len(paths))
    for problem in problems:
        progress.report(problem)
    failed = len(problems)
    try:
        for start in range(0, len(paths), FLAGS.batch_size):
            chunk, pixels = [], []
            for path in paths[start : start + FLAGS.batch_size]:
                try:
                    pixels.append(captioner.load_image(path))
                    chunk.append(path)
                except ValueError as e:
                    progress.report(e)
                    failed += 1
            captions = captioner.caption_pixels(pixels, beam_size) if chunk else []
            for path, caption in zip(chunk, captions, strict=True):
                print(f"{path}: {caption.text}")
                print(captioner.attention_summary(caption))
                if FLAGS.visualize:
                    _write_picture(captioner, caption, path)
                if output:
                    record = {
                        "path": path,
                        "caption": caption.text,
                        "tokens": caption.tokens.tolist(),
                        "score": caption.score,
                    }
                    output.write(json.dumps(record) + "\n")
            if output:
                output.flush()
            progress.add(len(paths[start : start + FLAGS.batch_size]))
    finally:
        if output:
            output.close()
    if failed and len(paths) + len(problems) > 1:
        print(
            f"error: {failed} of {len(paths) + len(problems)} inputs not captioned (named above)",
            file=sys.stderr,
        )
    return SKIPPED if failed else 0


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status: 0, 1 when nothing could start, `SKIPPED` when some images were
      skipped.
    """
    return run(_main, FLAGS, argv, __doc__)
