"""A trained model's decoding, chosen on its own validation split and kept with it.

How a model should decode (beam size, length normalisation, repeat and ending blocking,
for hard attention the context it reads) depends on the model and its data: shapes
captions repeat trigrams by their grammar ("at the top left and ... at the top right"),
so a ban on repeated trigrams that helps Flickr8k garbles them. The package therefore
holds no decoding that suits one dataset; after training, `choose` tries the settings of
`SEARCH` one at a time (coordinate ascent from the run's own values, simplest value
first so that a tie keeps it) on the validation images, by the run's
`--selection_metric`, and the workdir's `config.json` keeps the winner, which every
command that loads the workdir (caption, evaluate, export, make_preset) then uses.
`decoding.json` records every setting tried with its scores. Settings given explicitly
on the command line or in a flagfile are kept as given and not searched.
"""

import dataclasses
import os
import time
from collections.abc import Collection

from absl import logging

from sat_tf.config import Config
from sat_tf.serving.inference import CONFIG_FILE
from sat_tf.training.scoring import caption_records, score_captions
from sat_tf.training.workdir import write_json

DECODING_FILE = "decoding.json"
# Each setting searched and its values, simplest first; in this order, each chosen with
# those before it fixed. The length penalty only acts on beams wider than one.
SEARCH = (
    ("beam_size", (1, 3, 5)),
    ("length_penalty", (0.0, 1.0)),
    ("block_repeats", (False, True)),
    ("block_bad_endings", (False, True)),
    ("hard_decoding", ("expected", "argmax")),
)
# --selection_metric -> its score in `score_captions`' output.
_SCORE = {"bleu4": "BLEU-4", "cider": "CIDEr"}


def _applies(name: str, config: Config) -> bool:
    if name == "length_penalty":
        return config.beam_size > 1
    if name == "hard_decoding":
        return config.attention == "hard"
    return True


def describe(config: Config) -> str:
    """The decoding settings of `config` in one phrase, e.g. 'beam 3, repeats blocked'."""
    parts = ["greedy" if config.beam_size == 1 else f"beam {config.beam_size}"]
    if config.beam_size > 1 and config.length_penalty:
        parts.append(f"length penalty {config.length_penalty:g}")
    parts.append("repeats blocked" if config.block_repeats else "repeats allowed")
    if config.block_bad_endings:
        parts.append("bad endings blocked")
    if config.attention == "hard":
        parts.append(f"{config.hard_decoding} context")
    return ", ".join(parts)


def choose(
    model,
    records,
    vocab,
    config: Config,
    objects=None,
    grid=None,
    fixed: Collection[str] = (),
    encoder=None,
    full: bool = False,
) -> tuple[Config, list[dict]]:
    """The decoding that scores best on `records` (validation images), by coordinate
    ascent over `SEARCH` starting from `config`'s values.

    Args:
      model: the trained `ShowAttendTell` (its best weights loaded).
      records: the validation records to caption.
      vocab: the model's vocabulary.
      config: the run's settings; its decoding is the starting point.
      objects, grid: shapes object metadata and the attention grid, for the grounding
        scores recorded beside the selection score (None elsewhere).
      fixed: names of settings given explicitly, kept as they are.
      encoder: the backbone to run on the records' image files, for a model trained on
        cached features that is scored from the photos (`inference.feature_encoder`);
        None reads the model's own input (`scoring.caption_records`).
      full: also record each setting's coco-caption scores (PTB tokenizer, METEOR, ...:
        `score_captions(full=True)`) under "coco-caption"; the choice stays by the
        selection score on the words as generated, as after training.

    Returns:
      (config with the chosen decoding, the settings tried in order, each a dict of the
      `SEARCH` settings and its validation scores).
    """
    key = _SCORE[config.selection_metric]
    tried = {}

    def score(candidate: Config) -> float:
        tried_settings = settings(candidate)
        name = tuple(sorted(tried_settings.items()))
        if name not in tried:
            start = time.time()
            results = caption_records(model, records, vocab, candidate, encoder=encoder)
            scores = score_captions(
                records, results, objects, grid or (14, 14), candidate.image_size
            )
            if full:
                scores["coco-caption"] = score_captions(
                    records, results, None, grid or (14, 14), candidate.image_size, full=True
                )
            tried[name] = {**tried_settings, "scores": scores}
            logging.info(
                "decoding %s: validation %s %.4f (%d images, %.1fs)",
                *(describe(candidate), key, scores[key], len(records), time.time() - start),
            )
        return tried[name]["scores"][key]

    best = config
    for name, values in SEARCH:
        if name in fixed or not _applies(name, best):
            continue
        own = getattr(best, name)
        options = values if own in values else (own, *values)
        # max keeps the first of equal scores: the simplest value.
        best = max((dataclasses.replace(best, **{name: v}) for v in options), key=score)
    return best, list(tried.values())


def choose_and_keep(model, data, config: Config, workdir: str, fixed=()) -> Config:
    """`choose` on the run's validation images (`--eval_images` of them), then the
    workdir's `config.json` holds the chosen decoding and `decoding.json` what was tried.

    Returns `config` unchanged, writing nothing, when the run has no validation split
    or `--choose_decoding` is off.
    """
    val = data.splits["val"][: config.eval_images or None]
    if not val or not config.choose_decoding:
        return config
    chosen, tried = choose(model, val, data.vocab, config, data.objects, model.grid, fixed)
    logging.info("decoding chosen on %d validation images: %s", len(val), describe(chosen))
    write_json(os.path.join(workdir, DECODING_FILE), record(chosen, tried, len(val), fixed))
    chosen.save(os.path.join(workdir, CONFIG_FILE))
    return chosen


def settings(config: Config) -> dict:
    """{name: value} of the `SEARCH` settings that apply to `config`."""
    return {n: getattr(config, n) for n, _ in SEARCH if _applies(n, config)}


def record(chosen: Config, tried: list[dict], images: int, fixed=()) -> dict:
    """What `decoding.json` keeps of a `choose`: the selection score, the number of
    validation images, the settings kept fixed, the chosen ones and every one tried."""
    return {
        "selected_on": chosen.selection_key,
        "images": images,
        "fixed": sorted(set(fixed) & {n for n, _ in SEARCH}),
        "chosen": settings(chosen),
        "tried": tried,
    }
