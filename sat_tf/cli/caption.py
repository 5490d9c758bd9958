"""Captions image files with a trained model and shows where it looked for every word.

  sat-caption photo.jpg
  sat-caption photo.jpg other.png --workdir=runs/shapes --visualize=out/
  sat-caption photos/ "more/*.jpg" --preset=flickr8k_lite0_soft --output=captions.jsonl
  sat-caption photo.jpg --num_captions=3 [--sample --temperature=0.8 --top_p=0.9 --seed=1]

Without --workdir or --preset the shipped preset flickr8k_lite0_grid14_soft captions.
Each argument is an image file, a folder (its image files: .jpg .jpeg .png .gif .bmp
.webp, in name order) or a glob; a file that several of them name is captioned once.
Prints each caption with a per-word attention summary (argmax cell and weight); with
--output writes one JSON object a line per image: {"path", "caption", "tokens" (word
ids), "score" (the caption's log-probability), for a preset with a tag table "tag" (the
ImageNet tag the caption was made to say, null for none; --notags turns tags off) and
"tag_prob" (the photo's most probable tag's probability), and for a model with off-world
statistics (`sat-off-world`) "off_world_score" and "off_world" (the photo is unlike the
training photos: the caption is likely wrong), and with --num_captions over 1 "captions"
([{"caption", "score"}, ...], best first, "caption" the first)}, into a temporary file
renamed when done (an existing file is kept when nothing was captioned); with
--visualize writes one PNG per image with a panel per word (paper Fig. 3), outlining the
attended cell for a hard-attention model, named <name>_attention.png, or after the path
below the inputs' common folder when two inputs share a name. An image that cannot be read (missing,
empty, not an image, truncated, or over --max_image_pixels, read from its header before
anything is decoded) is reported on stderr in one line and skipped, the others are
captioned; the exit status is then 2 (1: nothing could start, e.g. a bad flag or model).
--num_captions=k gives the beam's k best captions of each photo (a narrower beam is
widened to k), or with --sample k captions drawn from the model (--temperature, --top_p,
--seed: `Captioner.caption`), printed numbered under the photo with their scores; the
attention summary and picture are the first's.
With more than one image, stderr shows the progress (`12/80`). -v shows TensorFlow's
log lines.

--runtime: `litert` captions without TensorFlow, from the model's TFLite file (built
once into the cache, with TensorFlow, where it is not there yet); `tensorflow` with
TensorFlow; `auto` (the default) with LiteRT where its file is in the cache or the model
is a shipped or downloaded preset decoding as it was made to, else with TensorFlow
(sat_tf/serving/litert.py). Both give the same captions, scores, tags and pictures.
"""

import dataclasses
import glob
import json
import os
import random
import sys

from absl import flags

from sat_tf.cli.flags_lib import (
    DEFAULT_PRESET,
    check_model_source,
    decoding_overrides,
    define_model_source,
    define_override,
    load_trained,
    model_source,
    override,
    run,
)
from sat_tf.config import RUNTIMES
from sat_tf.data import image_files
from sat_tf.pipelines import caption_rows

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
flags.DEFINE_integer(
    "num_captions",
    1,
    "Captions per photo: the beam's best (a narrower beam is widened to it), or with "
    "--sample drawn ones; over 1 they are printed numbered and written as 'captions'.",
    flag_values=FLAGS,
)
flags.DEFINE_bool(
    "sample",
    False,
    "Draw the captions word by word from the model instead of searching for the most "
    "likely (no --beam_size).",
    flag_values=FLAGS,
)
flags.DEFINE_float(
    "temperature", 1.0, "With --sample: > 0; towards 0 greedy, above 1 flatter.", flag_values=FLAGS
)
flags.DEFINE_float(
    "top_p",
    1.0,
    "With --sample: draw each word from the fewest most likely words whose probability "
    "reaches this, in (0, 1].",
    flag_values=FLAGS,
)
flags.DEFINE_integer(
    "seed",
    None,
    "With --sample: a non-negative seed that makes the draws reproducible (the same "
    "photos in the same order and --batch_size); left out: a fresh seed each run.",
    flag_values=FLAGS,
)
flags.DEFINE_integer(
    "max_image_pixels",
    image_files.MAX_IMAGE_PIXELS,
    "Most pixels (width x height) of an image, read from its header; larger ones are "
    "skipped before anything is decoded.",
    flag_values=FLAGS,
)
flags.DEFINE_enum(
    "runtime",
    "auto",
    list(RUNTIMES),
    "litert: without TensorFlow (the model's TFLite file, built once into the cache); "
    "tensorflow; auto: LiteRT where its file is built or the model is a shipped preset "
    "decoding as it was made to, else TensorFlow.",
    flag_values=FLAGS,
)
# The runtime `_check` chose: ("litert", the file's folder or None to build it, the
# model's `litert.Source`) or ("tensorflow", None, None).
_chosen = ["tensorflow", None, None]


def expand(args):
    """The image files that the arguments name, in order, and the problems found.

    Args:
      args: files (taken as given, whatever their extension), folders (their files with
        an image extension, in name order, not recursing) and globs (`*`, `?`, `[`;
        `**` recurses; matching files in name order).

    Returns:
      (paths, problems): each file once (the first time an argument names it, however
      written: `a.jpg`, `./a.jpg`, a link to it), and a message for each argument that
      names no image.
    """
    paths, problems, seen = [], [], set()
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
        for path in found:
            key = os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                paths.append(path)
    return paths, problems


def picture_names(paths):
    """{path: file name of its attention picture}, no two alike: `<stem>_attention.png`,
    or for stems that several inputs share, the path below their common folder with its
    separators and dots as `_` (`a/img.jpg` -> `a_img_jpg_attention.png`), numbered if
    that still is not enough."""
    stems = {}
    for path in paths:
        stems.setdefault(os.path.splitext(os.path.basename(path))[0], []).append(path)
    names, taken = {}, set()
    for stem, group in stems.items():
        if len(group) > 1:
            root = os.path.commonpath([os.path.abspath(p) for p in group])
            for path in group:
                relative = os.path.relpath(os.path.abspath(path), root)
                names[path] = relative.replace(os.sep, "_").replace(".", "_")
        else:
            names[group[0]] = stem
    unique = {}
    for path in paths:
        name, number = names[path], 1
        while f"{name}_attention.png" in taken:
            number += 1
            name = f"{names[path]}_{number}"
        taken.add(f"{name}_attention.png")
        unique[path] = f"{name}_attention.png"
    return unique


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


def _write_picture(captioner, caption, name):
    target = os.path.join(FLAGS.visualize, name)
    captioner.attention_figure(caption, path=target)
    print(f"attention picture: {target}")


def _off_world_note(captioner, caption):
    if not caption.off_world:
        return ""
    return (
        f"  [off-world photo: score {caption.off_world_score:.1f} over "
        f"{captioner.off_world.threshold:.1f}, unlike the training photos; the caption is "
        "likely wrong]"
    )


def _load_images(captioner, paths, progress):
    """(the paths read, their pixels); each one that cannot be read is reported."""
    read, pixels = [], []
    for path in paths:
        try:
            image_files.check_path(path)
            pixels.append(captioner.load_image(path))
            read.append(path)
        except ValueError as e:
            progress.report(e)
    return read, pixels


def _show(captioner, path, captions, picture):
    """Prints the (first) caption, its tag and off-world note, the others numbered under
    it, and where it looked; writes its attention picture with --visualize."""
    caption = captions[0]
    tagged = f"  [tag: {caption.tag}, {caption.tag_prob:.2f}]" if caption.tag else ""
    print(f"{path}: {caption.text}{tagged}{_off_world_note(captioner, caption)}")
    if FLAGS.num_captions > 1:
        for number, each in enumerate(captions, 1):
            print(f"  {number}. {each.text}  (log p {each.score:.3f})")
    print(captioner.attention_summary(caption))
    if FLAGS.visualize:
        _write_picture(captioner, caption, picture)


def _record(path, captions):
    """The --output line of a photo's captions, a dict (`caption_rows.caption_row`)."""
    caption = captions[0]
    return caption_rows.caption_row(
        path,
        caption.text,
        caption.tokens,
        caption.score,
        caption.tag,
        caption.tag_prob,
        caption.off_world_score,
        caption.off_world,
        captions=[(c.text, c.score) for c in captions] if FLAGS.num_captions > 1 else None,
    )


def _decoding():
    """`Captioner.caption_pixels`'s decoding arguments from the flags (the seed without
    the batch's start, a fresh one for the run when --seed is left out)."""
    decoding = dict(beam_size=override(FLAGS, "beam_size"), num_captions=FLAGS.num_captions)
    if FLAGS.sample:
        seed = FLAGS.seed if FLAGS.seed is not None else random.SystemRandom().randrange(2**63)
        decoding.update(sample=True, temperature=FLAGS.temperature, top_p=FLAGS.top_p, seed=seed)
    return decoding


def _check_decoding():
    """Refuses decoding flags that do not fit together, before TensorFlow loads."""
    if FLAGS.num_captions < 1:
        raise ValueError(f"--num_captions={FLAGS.num_captions} must be at least 1")
    drawing = {"temperature": 1.0, "top_p": 1.0, "seed": None}
    given = [f"--{name}" for name, default in drawing.items() if FLAGS[name].value != default]
    if given and not FLAGS.sample:
        raise ValueError(f"{', '.join(given)} draw captions: add --sample")
    if FLAGS.sample and FLAGS.beam_size is not None:
        raise ValueError("--sample draws captions word by word: leave --beam_size out")
    if not FLAGS.temperature > 0:
        raise ValueError(f"--temperature={FLAGS.temperature} must be above 0")
    if not 0 < FLAGS.top_p <= 1:
        raise ValueError(f"--top_p={FLAGS.top_p} must lie in (0, 1]")
    if FLAGS.seed is not None and FLAGS.seed < 0:
        raise ValueError(f"--seed={FLAGS.seed} must be at least 0")


def _check(argv):
    """Checks the flags, the model and the inputs before TensorFlow loads; when no input
    is a file, reports them all as captioning would (the exit status: `SKIPPED`)."""
    if len(argv) < 2:
        raise ValueError("give one or more image files, folders or globs to caption")
    override(FLAGS, "beam_size")
    _check_decoding()
    if FLAGS.batch_size < 1:
        raise ValueError(f"--batch_size={FLAGS.batch_size} must be at least 1")
    if FLAGS.max_image_pixels < 1:
        raise ValueError(f"--max_image_pixels={FLAGS.max_image_pixels} must be at least 1")
    if not FLAGS.workdir and not FLAGS.preset:
        FLAGS.preset = DEFAULT_PRESET
    check_model_source(FLAGS)
    paths, problems = expand(argv[1:])
    if any(image_files.path_problem(path) is None for path in paths):
        _chosen[:] = _choose_runtime()
        return None
    return _caption(None, paths, problems)


def _choose_runtime():
    """`_chosen` for the flags (`litert.choose`), read without TensorFlow."""
    if FLAGS.runtime == "tensorflow":
        return "tensorflow", None, None
    from sat_tf.serving import litert

    source = litert.read_source(*model_source(FLAGS))
    config, changed = decoding_overrides(FLAGS, source.config)
    beam_size = override(FLAGS, "beam_size")
    if beam_size is not None and beam_size != config.beam_size:
        config, changed = dataclasses.replace(config, beam_size=beam_size), {**changed, "beam": 1}
    source = source._replace(config=config)
    needs = ""
    if FLAGS.sample:
        needs = "--sample"
    elif FLAGS.num_captions > config.beam_size:
        needs = f"--num_captions={FLAGS.num_captions} over the beam of {config.beam_size}"
    runtime, folder, why = litert.choose(
        FLAGS.runtime, source, own_decoding=not changed, needs=needs
    )
    if why:
        print(f"note: {why}", file=sys.stderr)
    return runtime, folder, source


def _litert_captioner():
    from sat_tf.serving import litert, litert_cache

    _, folder, source = _chosen
    if folder is None:  # its first use: built with TensorFlow (loaded by `run`), once
        folder = litert_cache.build(source.kind, source.directory, source.config)
    sizes = dict(batch_size=FLAGS.batch_size, max_image_pixels=FLAGS.max_image_pixels)

    def tensorflow():  # TensorFlow loads only if LiteRT cannot caption
        from sat_tf.serving import api

        return api.tensorflow_loader(source, **sizes)()

    return litert.LiteRTCaptioner(folder, tensorflow=tensorflow, **sizes)


def _main(argv):
    if _chosen[0] == "litert":
        return _caption(_litert_captioner(), *expand(argv[1:]))
    from sat_tf.serving import api

    captioner = api.Captioner.from_trained(
        load_trained(FLAGS), batch_size=FLAGS.batch_size, max_image_pixels=FLAGS.max_image_pixels
    )
    return _caption(captioner, *expand(argv[1:]))


def _caption(captioner, paths, problems):
    """Captions `paths` (`captioner` None: none of them is a file) and reports `problems`
    and the images that cannot be read; the exit status."""
    decoding = _decoding()
    pictures = {}
    if FLAGS.visualize:
        pictures = picture_names(paths)
        os.makedirs(FLAGS.visualize, exist_ok=True)
    output = temporary = None
    if FLAGS.output:
        folder, name = os.path.split(os.path.abspath(FLAGS.output))
        os.makedirs(folder, exist_ok=True)
        temporary = os.path.join(folder, f".tmp{os.getpid()}-{name}")
        output = open(temporary, "w", encoding="utf-8")
    progress = _Progress(len(paths))
    for problem in problems:
        progress.report(problem)
    failed, captioned = len(problems), 0
    try:
        for start in range(0, len(paths), FLAGS.batch_size):
            batch = paths[start : start + FLAGS.batch_size]
            chunk, pixels = _load_images(captioner, batch, progress)
            failed += len(batch) - len(chunk)
            # Each batch draws with the run's seed and its place.
            batch_decoding = (
                {**decoding, "seed": (decoding["seed"], start)} if FLAGS.sample else decoding
            )
            captions = captioner.caption_pixels(pixels, **batch_decoding) if chunk else []
            for path, found in zip(chunk, captions, strict=True):
                found = found if FLAGS.num_captions > 1 else [found]
                _show(captioner, path, found, pictures.get(path))
                if output:
                    output.write(json.dumps(_record(path, found)) + "\n")
                captioned += 1
            if output:
                output.flush()
            progress.add(len(batch))
    finally:
        if output:
            output.close()
            # What was captioned is kept, even when a later image stopped the run.
            if captioned:
                os.replace(temporary, FLAGS.output)
            else:
                os.remove(temporary)
                if os.path.exists(FLAGS.output):
                    print(
                        f"error: nothing captioned; {FLAGS.output} is left as it was",
                        file=sys.stderr,
                    )
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
    _chosen[:] = ["tensorflow", None, None]
    return run(_main, FLAGS, argv, __doc__, check=_check, tensorflow=lambda: _chosen[1] is None)


if __name__ == "__main__":
    raise SystemExit(main())
