"""Captioning the images of a split and scoring the captions (paper §4.3, §5)."""

import dataclasses
import os

from sat_tf.config import Config
from sat_tf.data import input_pipeline
from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation import grounding, metrics
from sat_tf.serving.inference import feature_encoder, make_caption_fn
from sat_tf.training.prepare import Data, cached_features, prepare_data
from sat_tf.training.workdir import write_json


def references(records):
    """{image_id: [tokenized reference, ...]} as space-joined lowercase words."""
    texts = [c for r in records for c in r.captions]
    words = iter(vocab_lib.tokenize_py(texts))
    return {r.image_id: [" ".join(next(words)) for _ in r.captions] for r in records}


def caption_records(
    model,
    records,
    vocab,
    config: Config,
    beam_size=None,
    batch_size=100,
    encoder=None,
    caption=None,
):
    """Captions every record's image (its cached features with `--use_feature_cache`;
    the images through `encoder` when one is given, see `make_caption_fn`).

    `caption`, a function `make_caption_fn` made for these arguments, is used instead of
    a new one: a caller that captions again after each epoch traces it once.

    Returns:
      list of dicts {"words": [...], "alpha": (n_words + 1, L) array (the last row made
      `<end>`; n_words rows when the caption reached the length limit without `<end>`),
      "log_prob": float}, in record order.
    """
    cached = None if encoder is not None else cached_features(config, records)[0]
    ds = input_pipeline.eval_dataset(
        records,
        image_size=config.image_size,
        crop_fraction=config.effective_crop_fraction,
        batch_size=batch_size,
        features=cached,
    )
    key = "image" if cached is None else "features"
    caption = caption or make_caption_fn(model, config, beam_size, encoder, vocab)
    results = []
    for batch in ds:
        out = caption({key: batch[key]})
        tokens, lengths = out.tokens.numpy(), out.length.numpy()
        for i in range(len(tokens)):
            n = int(lengths[i])
            results.append(
                {
                    "words": vocab.decode(tokens[i][:n]),
                    "alpha": out.attention[i, : n + 1].numpy(),
                    "log_prob": float(out.log_prob[i]),
                }
            )
    return results


def score_captions(records, results, objects=None, grid=(14, 14), image_size=112, full=False):
    """Metrics of generated captions against the records' references.

    Args:
      records: the captioned records.
      results: output of `caption_records`.
      objects: shapes object metadata keyed by image id, for pointing / location
        accuracy (docs/design.md §6.2).
      grid, image_size: attention grid and image size for pointing accuracy.
      full: all coco-caption metrics (Java for METEOR) instead of the two that model
        selection uses, BLEU-4 and CIDEr, on the words as generated.

    Returns:
      dict of metric name -> value, with `metrics.caption_statistics` (bad-ending rate,
      repeated trigrams, distinct words, mean length).
    """
    refs = references(records)
    hyps = {r.image_id: " ".join(res["words"]) for r, res in zip(records, results, strict=True)}
    if full:
        scores = metrics.coco_scores(refs, hyps, with_paper_bleu=True)
    else:
        scores = {"BLEU-4": metrics.bleu4(refs, hyps), "CIDEr": metrics.cider(refs, hyps)}
    scores.update(metrics.caption_statistics(hyps))
    if objects is not None:
        words = [res["words"] for res in results]
        objs = [objects[r.image_id] for r in records]
        alphas = [res["alpha"] for res in results]
        scores.update(
            grounding.pointing_accuracy(words, alphas, objs, grid=grid, image_size=image_size)
        )
        scores.update(grounding.location_accuracy(words, objs))
    return scores


def evaluate(
    model,
    data: Data,
    config: Config,
    workdir: str,
    split="test",
    beam_size=None,
    encoder=None,
    overrides=None,
):
    """Captions a split, scores it with every metric, and writes the results to workdir:
    `captions_<split>.json` and `metrics_<split>.json`, named by `result_name` (`encoder`
    as for `caption_records`; `overrides`, the decoding settings given instead of the
    trained model's (`flags_lib.decoding_overrides`), only name the files)."""
    records = data.splits[split]
    if not records:
        raise ValueError(f"the {split} split of {config.dataset} is empty")
    results = caption_records(model, records, data.vocab, config, beam_size, encoder=encoder)
    grid = model.grid or (14, 14)
    scores = score_captions(records, results, data.objects, grid, config.image_size, full=True)
    captions = {r.image_id: " ".join(res["words"]) for r, res in zip(records, results, strict=True)}
    write_json(
        os.path.join(
            workdir, result_name("captions", split, config, beam_size, ".json", overrides)
        ),
        metrics.to_coco_results(captions),
    )
    metrics_name = result_name("metrics", split, config, beam_size, overrides=overrides)
    write_json(os.path.join(workdir, metrics_name), scores)
    return scores


def result_name(kind, split, config, beam_size=None, extension=".json", overrides=None):
    """`<kind>_<split><extension>`, with before the extension `_beam<k>` when `beam_size`
    overrides the model's own (`config.beam_size`), then `_lp<value>` and `_<value>` for
    a length penalty and a hard decoding in `overrides` (`flags_lib.decoding_overrides`),
    `_repeats` / `_norepeats`, `_badendings` / `_nobadendings` for the blocking, and
    `_notags` / `_tags`, `_tag<threshold>` for the tags."""
    beam = beam_size or config.beam_size
    name = f"{kind}_{split}{f'_beam{beam}' if beam != config.beam_size else ''}"
    overrides = overrides or {}
    if "length_penalty" in overrides:
        name += f"_lp{overrides['length_penalty']:g}"
    if "hard_decoding" in overrides:
        name += f"_{overrides['hard_decoding']}"
    if "block_repeats" in overrides:
        name += "_norepeats" if overrides["block_repeats"] else "_repeats"
    if "block_bad_endings" in overrides:
        name += "_nobadendings" if overrides["block_bad_endings"] else "_badendings"
    if "tags" in overrides:
        name += "_tags" if overrides["tags"] else "_notags"
    if "tag_threshold" in overrides:
        name += f"_tag{overrides['tag_threshold']:g}"
    return name + extension


def check_output_dir(output_dir: str, config: Config) -> None:
    """Raises ValueError when `output_dir` lies in the dataset folder or in the package:
    evaluation results are never written there."""
    real = os.path.realpath(output_dir)
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    for name, folder in (("dataset folder", config.data_dir), ("sat_tf package", package)):
        folder = os.path.realpath(folder)
        if real == folder or real.startswith(folder + os.sep):
            raise ValueError(
                f"output folder {output_dir} lies in the {name} {folder}; choose another one"
            )


def evaluate_images(
    model, vocab, config: Config, output_dir: str, split="test", beam_size=None, overrides=None
):
    """`evaluate` from the split's image files, for a model without a workdir (a preset).

    No feature cache is read: a model trained on cached features gets the backbone that
    made them (`feature_encoder`), run on each image as `caption.py` and the
    exports run it, so the scores are those of the model as users run it.

    Args:
      model, vocab, config: the model (e.g. from `inference.load_preset`); `config.data_dir` names
        the dataset folder.
      output_dir: where the captions and the metrics go (file names as `evaluate`).
      split: "train", "val" or "test".
      beam_size: None for `config.beam_size`.
      overrides: as for `evaluate`.

    Returns:
      the scores (as `evaluate`).

    Raises:
      ValueError: for an `output_dir` in the dataset folder or the package
        (`check_output_dir`), or a dataset that cannot be read.
    """
    check_output_dir(output_dir, config)
    config = dataclasses.replace(config, use_feature_cache=False)
    os.makedirs(output_dir, exist_ok=True)
    data = prepare_data(config, output_dir, vocab=vocab)
    encoder = feature_encoder(model, config) if model.encoder is None else None
    return evaluate(model, data, config, output_dir, split, beam_size, encoder, overrides=overrides)
