"""Measures where a captioner looks on real photos: COCO boxes against its attention.

  sat-grounding --preset=flickr8k_lite0_soft --beam_size=3 --output=g.json
  sat-grounding --workdir=runs/flickr8k_soft --coco_dir=../shared/data/coco-mini-train
  sat-grounding --export=exports/sat/1
  sat-grounding --workdir=runs/flickr8k_soft --captions=reference

Captions every photo of a COCO-format folder (annotations/instances_<name>.json and the
photos in <name>/) with a trained workdir's best weights, a preset, or a SavedModel
export (its `serving_default` signature, fed the photo files' bytes as a client would),
and scores each generated word that names a category present in the photo
(`sat_tf.evaluation.coco_grounding`): argmax hit, attention mass in the boxes, and the
centre-cell, uniform-random and area-share baselines, overall and per category. Then
whether the captions name what is in the photos (`sat_tf.evaluation.naming`): the share
naming the photo's largest boxed object (main-object recall) and CHAIR_i / CHAIR_s, the
share of mentioned objects / of captions naming a category the photo has no box of (and
again counting the categories its human captions name as present, when the folder has
them). Prints tables; --output writes it all (with every caption and scored word) as JSON.

With --captions=reference the words scored are not the model's but the COCO folder's
human captions (annotations/captions_<name>.json, five a photo in COCO), each fed to
the model word by word: every model is then scored on the same words, about ten times
as many as its own captions give.
"""

import datetime
import json
import os
import time

from absl import flags

from sat_tf.cli.flags_lib import (
    check_model_source,
    define_model_source,
    define_override,
    load_trained,
    override,
    run,
)
from sat_tf.utils import files

FLAGS = flags.FlagValues()
define_model_source(FLAGS)
flags.DEFINE_string(
    "export",
    None,
    "A SavedModel folder of sat-export instead of --workdir / --preset.",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "coco_dir",
    "../shared/data/coco-mini-train",
    "COCO-format folder: annotations/instances_<name>.json and the photos in <name>/.",
    flag_values=FLAGS,
)
define_override("beam_size", "Beam size (1 = greedy); an export decodes with its own", FLAGS)
flags.DEFINE_integer(
    "num_photos", 0, "Score only the first N photos of the file; 0: all.", flag_values=FLAGS
)
flags.DEFINE_integer("batch_size", 8, "Photos captioned at once.", flag_values=FLAGS)
flags.DEFINE_enum(
    "captions",
    "generated",
    ["generated", "reference"],
    "Whose words are scored: the model's own captions, or the COCO folder's human captions "
    "(annotations/captions_<name>.json) fed to it word by word: the same words for every "
    "model.",
    flag_values=FLAGS,
)
flags.DEFINE_string(
    "output", None, "JSON file for the scores, captions and scored words.", flag_values=FLAGS
)
flags.DEFINE_bool(
    "store_in_preset",
    False,
    'With --preset: record the overall scores in the preset\'s metadata.json ("grounding").',
    flag_values=FLAGS,
)


def _model_captioner(captioner, beam_size):
    """(caption_batch, geometry, description) of the --workdir or --preset model, which
    captions the photo files as `sat_tf.Captioner` does."""

    def caption_batch(photos):
        captions = captioner.caption([p.path for p in photos], beam_size)
        return [(c.words, c.attention) for c in captions]

    config = captioner.config
    about = {
        "attention": config.attention,
        "beam_size": beam_size or config.beam_size,
        "length_penalty": config.length_penalty,
    }
    if config.attention == "hard":
        about["hard_decoding"] = config.hard_decoding
    return caption_batch, _geometry(captioner), about


def _geometry(captioner):
    from sat_tf.evaluation import coco_grounding

    return coco_grounding.Geometry(captioner.image_size, captioner.crop_fraction, captioner.grid)


def _reference_grounding(captioner, photos, coco_dir):
    """`coco_grounding` of the model's attention on the photos' human captions, fed word
    by word (`Captioner.attend`); words outside its vocabulary are not scored (it could
    not say them).

    Returns:
      (the result, whose "photos" counts the photos with captions and "references" the
      captions, and per caption {"image_id", "file", "caption"}).
    """
    from sat_tf.data import vocab as vocab_lib
    from sat_tf.evaluation import coco_grounding, coco_photos

    references = coco_photos.read_reference_captions(coco_dir, photos)
    known = set(captioner.vocab.words)
    rows, captions, alphas, written = [], [], [], []
    for photo in photos:
        texts = references.get(photo.image_id, [])
        words = vocab_lib.tokenize_py(texts)
        for w, maps in zip(words, captioner.attend(photo.path, words), strict=True):
            rows.append(photo)
            captions.append([x if x in known else vocab_lib.UNK for x in w])
            alphas.append(maps)
            written.append(
                {
                    "image_id": photo.image_id,
                    "file": os.path.basename(photo.path),
                    "caption": " ".join(w),
                }
            )
    result = coco_grounding.coco_grounding(rows, captions, alphas, _geometry(captioner))
    result["photos"] = len({photo.image_id for photo in rows})
    result["references"] = len(rows)
    return result, written


def _export_captioner(path, beam_size):
    """(caption_batch, geometry, description) of a SavedModel export's serving_default."""
    import tensorflow as tf

    from sat_tf.evaluation import coco_grounding
    from sat_tf.serving import exporting

    info_path = os.path.join(path, exporting.EXPORT_INFO)
    if not os.path.isfile(info_path):
        raise ValueError(f"--export={path} has no {exporting.EXPORT_INFO}: give an export folder")
    with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    if beam_size is not None and beam_size != info["beam_size"]:
        raise ValueError(
            f"--export={path} decodes with beam size {info['beam_size']} fixed in its graph; "
            f"leave out --beam_size={beam_size} or export again"
        )
    serve = tf.saved_model.load(path).signatures["serving_default"]

    def caption_batch(photos):
        data = []
        for photo in photos:
            with open(photo.path, "rb") as f:
                data.append(f.read())
        out = serve(image_bytes=tf.constant(data))
        texts = out["caption"].numpy()
        return [
            (t.decode("utf-8").split(), a)
            for t, a in zip(texts, out["attention"].numpy(), strict=True)
        ]

    geometry = coco_grounding.Geometry(
        info["image_size"], info["crop_fraction"], tuple(info["grid"])
    )
    about = {"attention": info["config"]["attention"], "beam_size": info["beam_size"]}
    return caption_batch, geometry, about


def _naming(photos, captions, coco_dir):
    """`naming` of the generated captions against the boxes, printed, and under
    "with_references" against the boxes and the human captions' objects (Rohrbach et
    al.'s CHAIR) when the folder holds its captions file."""
    from sat_tf.evaluation import coco_photos, naming

    words = [c["caption"].split() for c in captions]
    result = naming.naming(photos, words)
    print("\n" + naming.format_naming(result, title="Naming (present: a box)"))
    try:
        references = coco_photos.read_reference_captions(coco_dir, photos)
    except ValueError:
        return result
    also = naming.reference_categories(references)
    result["with_references"] = naming.naming(photos, words, also_present=also)
    result["with_references"].pop("per_photo")
    title = "Naming (present: a box or named by a human caption)"
    print(naming.format_naming(result["with_references"], title=title))
    return result


def _check_flags():
    """The flag naming the model (`workdir`, `preset` or `export`), in a list of one.

    Raises:
      ValueError: flags that are missing or cannot act together, named.
    """
    given = [name for name in ("workdir", "preset", "export") if FLAGS[name].value]
    if len(given) != 1:
        raise ValueError(
            "give exactly one of --workdir, --preset and --export"
            + (f" (got {', '.join('--' + g for g in given)})" if given else "")
        )
    if FLAGS.store_in_preset and not FLAGS.preset:
        raise ValueError("--store_in_preset needs --preset")
    if FLAGS.store_in_preset and FLAGS.captions == "reference":
        raise ValueError("--store_in_preset records the scores of generated captions only")
    if FLAGS.num_photos < 0 or FLAGS.batch_size < 1:
        raise ValueError("--num_photos must be >= 0 and --batch_size >= 1")
    if FLAGS.captions == "reference":
        for name in ("export", "beam_size", "length_penalty"):
            if FLAGS[name].value is not None:
                raise ValueError(
                    f"--captions=reference feeds the human captions to a --workdir or "
                    f"--preset model; leave out --{name}={FLAGS[name].value}"
                )
    if FLAGS.export:
        for name in ("hard_decoding", "length_penalty"):
            if FLAGS[name].value is not None:
                raise ValueError(
                    f"--export={FLAGS.export} decodes as its graph was exported; leave out "
                    f"--{name}={FLAGS[name].value} or export again with it"
                )
    return given


def _write_output(source, about, geometry, seconds, result, captions):
    """--output: the scores, the settings and every caption, as JSON."""
    files.write_json(
        FLAGS.output,
        {
            "source": source,
            **about,
            "coco_dir": FLAGS.coco_dir,
            "geometry": {
                "image_size": geometry.image_size,
                "crop_fraction": geometry.crop_fraction,
                "grid": list(geometry.grid),
            },
            "seconds": round(seconds, 1),
            **result,
            "captions": captions,
        },
        indent=1,
    )
    print(f"wrote {FLAGS.output}")


def _store_in_preset(result, about):
    """--store_in_preset: the overall scores into the preset's metadata."""
    from sat_tf.serving import preset
    from sat_tf.training import publish

    folder = preset.resolve(FLAGS.preset)
    about_run = {
        "coco_dir": os.path.basename(os.path.normpath(FLAGS.coco_dir)),
        **{k: v for k, v in about.items() if k != "attention"},
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    publish.store_grounding(folder, result, about_run)
    print(f"stored the grounding scores in {os.path.join(folder, preset.METADATA_FILE)}")


def _check(argv):
    if len(argv) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(argv[1:])}")
    override(FLAGS, "beam_size")
    _check_flags()
    if FLAGS.export and not os.path.isdir(FLAGS.export):
        raise ValueError(f"--export={FLAGS.export} is not a folder")
    if not FLAGS.export:
        check_model_source(FLAGS)
    if not os.path.isdir(FLAGS.coco_dir):
        raise ValueError(f"--coco_dir={FLAGS.coco_dir} is not a folder")


def _main(argv):
    from sat_tf.evaluation import coco_grounding, coco_photos
    from sat_tf.serving import api

    beam_size = override(FLAGS, "beam_size")
    given = _check_flags()
    photos = coco_photos.load_coco_dir(FLAGS.coco_dir)
    if FLAGS.num_photos:
        photos = photos[: FLAGS.num_photos]
    reference = FLAGS.captions == "reference"
    if FLAGS.export:
        caption_batch, geometry, about = _export_captioner(FLAGS.export, beam_size)
    else:
        captioner = api.Captioner(*load_trained(FLAGS)[:3], batch_size=FLAGS.batch_size)
        caption_batch, geometry, about = _model_captioner(captioner, beam_size)
    about = {"captions": FLAGS.captions, **about}
    start = time.time()
    if reference:
        del about["beam_size"], about["length_penalty"]
        result, captions = _reference_grounding(captioner, photos, FLAGS.coco_dir)
        decoding = "teacher-forced on the human captions"
    else:
        result, captions = coco_grounding.measure(photos, caption_batch, geometry, FLAGS.batch_size)
        decoding = f"beam {about['beam_size']}"
    seconds = time.time() - start
    source = {name: FLAGS[name].value for name in given}
    print(
        f"{source} ({about['attention']} attention, {decoding}, grid "
        f"{geometry.grid[0]}x{geometry.grid[1]}, crop fraction {geometry.crop_fraction}) on "
        f"{FLAGS.coco_dir}: {seconds:.1f} s"
    )
    print(coco_grounding.format_table(result))
    if not reference:
        result["naming"] = _naming(photos, captions, FLAGS.coco_dir)
    if FLAGS.output:
        _write_output(source, about, geometry, seconds, result, captions)
    if FLAGS.store_in_preset:
        _store_in_preset(result, about)


def main(argv=None):
    """The console command; `argv` (program name first) defaults to `sys.argv`.

    Returns:
      the exit status.
    """
    return run(_main, FLAGS, argv, __doc__, check=_check)


if __name__ == "__main__":
    raise SystemExit(main())
