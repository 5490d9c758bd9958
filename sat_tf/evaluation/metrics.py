"""Caption metrics: the coco-caption scorers, the paper's BLEU, and Table 1.

`coco_scores` gives the numbers captioning papers report, computed by the `pycocoevalcap`
scorers after PTB tokenization: BLEU-1..4, METEOR, ROUGE-L, CIDEr (CIDEr-D) and, where
its files are present, SPICE. `paper_bleu` gives BLEU-1..4 without the brevity penalty,
as in Table 1 of Xu et al. (2015), and `format_table1` lays both out next to the paper's
rows. `bleu4` is the quick corpus BLEU-4 the training loop selects models on (§4.3).

The PTB tokenizer, METEOR and SPICE are Java programs (`java_tools`): a metric whose
program cannot run is null in the scores and listed "unavailable" with the reason, which
a warning line repeats, never an exception, a hang or a key that silently disappears.
"""

import math
import os
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence

from absl import logging
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from sat_tf.data.tokens import BAD_ENDINGS
from sat_tf.evaluation import java_tools
from sat_tf.utils import files

BLEU_KEYS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4")
PAPER_BLEU_KEYS = tuple(f"paper {k} (no BP)" for k in BLEU_KEYS)
# The keys of `caption_statistics`.
CAPTION_STATISTICS = ("bad_ending_rate", "repeated_trigram_rate", "distinct_words", "mean_length")

# Xu et al. (2015), Table 1: BLEU-1..4 (without brevity penalty) and METEOR, x100, as
# printed in the paper.
PAPER_TABLE1 = {
    "flickr8k": {
        "Soft-Attention": ("67", "44.8", "29.9", "19.5", "18.93"),
        "Hard-Attention": ("67", "45.7", "31.4", "21.3", "20.30"),
    },
    "flickr30k": {
        "Soft-Attention": ("66.7", "43.4", "28.8", "19.1", "18.49"),
        "Hard-Attention": ("66.9", "43.9", "29.6", "19.9", "18.46"),
    },
    "coco": {
        "Soft-Attention": ("70.7", "49.2", "34.4", "24.3", "23.90"),
        "Hard-Attention": ("71.8", "50.4", "35.7", "25.0", "23.04"),
    },
}

_DATASET_ALIASES = {"mscoco": "coco", "ms-coco": "coco", "coco2014": "coco"}

# coco-caption's BleuScorer guards its ratios with these; `paper_bleu` uses the same so
# that it equals coco-caption's BLEU whenever the brevity penalty is 1.
_TINY = 1e-15
_SMALL = 1e-9


def _check_inputs(
    references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str]
) -> dict[str, list[str]]:
    """Validates the inputs; returns the references of the hypotheses' images."""
    if not isinstance(hypotheses, Mapping) or not isinstance(references, Mapping):
        raise ValueError("references and hypotheses must be dicts keyed by image id")
    if not hypotheses:
        raise ValueError("there are no hypotheses to score")
    refs = {}
    for image_id, hyp in hypotheses.items():
        if not isinstance(image_id, str):
            raise ValueError(f"image id {image_id!r} is not a string")
        if not isinstance(hyp, str):
            raise ValueError(f"the hypothesis of image {image_id!r} is not a string: {hyp!r}")
        if image_id not in references:
            raise ValueError(f"image {image_id!r} has a hypothesis but no references")
        ref_list = references[image_id]
        if isinstance(ref_list, str) or not isinstance(ref_list, Sequence):
            raise ValueError(f"the references of image {image_id!r} are not a list of strings")
        if not ref_list:
            raise ValueError(f"image {image_id!r} has an empty list of references")
        for ref in ref_list:
            if not isinstance(ref, str) or not ref.strip():
                raise ValueError(f"image {image_id!r} has an empty or non-string reference")
        refs[image_id] = list(ref_list)
    return refs


def coco_scores(
    references: Mapping[str, Sequence[str]],
    hypotheses: Mapping[str, str],
    *,
    use_spice: bool = False,
    with_paper_bleu: bool = False,
    java_timeout: float = java_tools.DEFAULT_JAVA_TIMEOUT,
) -> dict:
    """The coco-caption metrics of one caption per image (Chen et al., 2015).

    Captions are PTB-tokenized (Java; `java_tools.simple_ptb_tokenize` without it), then scored by
    `pycocoevalcap`'s Bleu(4), Meteor, Rouge and Cider, and Spice if asked for. Only the
    images that have a hypothesis are scored. Java failures do not raise: the metric's
    value is None, its reason is listed under "unavailable" and logged as one warning
    line (without Java: that java is missing and the command that installs it).

    Args:
      references: image id -> reference captions (raw text).
      hypotheses: image id -> generated caption (raw text).
      use_spice: also compute SPICE (needs Java and Stanford CoreNLP 3.6.0 jars).
      with_paper_bleu: also the keys of `paper_bleu`, from the same tokens (one Java
        tokenizer run for both).
      java_timeout: seconds each Java program may run before it counts as failed.

    Returns:
      {"BLEU-1".."BLEU-4", "METEOR", "ROUGE-L", "CIDEr"[, "SPICE"]: float in [0, 1]
      (CIDEr in [0, 10]; METEOR and SPICE None when their program could not run),
      "unavailable": {metric: reason}, "tokenizer": which one ran}.
      BLEU here includes the brevity penalty; see `paper_bleu` for the paper's BLEU.

    Raises:
      ValueError: a hypothesis has no references, an empty reference list, or a
        non-string caption; the message names the image id.
    """
    refs = _check_inputs(references, hypotheses)
    gts, res, tokenizer = java_tools.tokenize(refs, hypotheses, java_timeout)
    scores: dict = {}
    unavailable: dict[str, str] = {}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    scores.update({key: float(value) for key, value in zip(BLEU_KEYS, bleu, strict=True)})
    java = java_tools.find_java()
    try:
        if java is None:
            raise java_tools.Unavailable(java_tools.java_missing("METEOR 1.5"))
        scores["METEOR"] = java_tools.meteor(java, gts, res, java_timeout)
    except java_tools.Unavailable as e:
        scores["METEOR"] = None
        unavailable["METEOR"] = str(e)
    scores["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    scores["CIDEr"] = float(Cider().compute_score(gts, res)[0])
    if with_paper_bleu:
        scores.update(_paper_bleu_of_tokens(gts, res))
    if use_spice:
        try:
            if java is None:
                raise java_tools.Unavailable(java_tools.java_missing("SPICE"))
            scores["SPICE"] = java_tools.spice(java, gts, res, java_timeout)
        except java_tools.Unavailable as e:
            scores["SPICE"] = None
            unavailable["SPICE"] = str(e)
    if unavailable:
        notes = [
            f"{name} not computed (null in the scores): {why}" for name, why in unavailable.items()
        ]
        logging.warning("%s", "; ".join(notes))
    scores["unavailable"] = unavailable
    scores["tokenizer"] = tokenizer
    return scores


def _ngram_counts(words: list[str], n: int) -> Counter:
    return Counter(
        tuple(words[i : i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1)
    )


def bleu_without_brevity_penalty(
    references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str], n: int = 4
) -> list[float]:
    """Corpus BLEU-1..n of tokenized captions with the brevity penalty fixed at 1.

    Clipped n-gram counts are summed over the corpus, p_k = correct_k / guessed_k, and
    BLEU-k = (p_1 ... p_k)^(1/k), with coco-caption's guards (1e-15 added to the counts,
    1e-9 to the totals), so this equals coco-caption's BLEU whenever the hypotheses are
    at least as long as their closest references.

    Args:
      references: image id -> tokenized references.
      hypotheses: image id -> tokenized hypothesis; every id must be in `references`.
      n: highest n-gram order.

    Returns:
      [BLEU-1, ..., BLEU-n].
    """
    correct, guessed = [0] * n, [0] * n
    for image_id, hyp in hypotheses.items():
        words = hyp.split()
        max_ref: Counter = Counter()
        for ref in references[image_id]:
            max_ref |= _ngram_counts(ref.split(), n)
        for ngram, count in _ngram_counts(words, n).items():
            correct[len(ngram) - 1] += min(count, max_ref[ngram])
        for k in range(n):
            guessed[k] += max(0, len(words) - k)
    scores, product = [], 1.0
    for k in range(n):
        product *= (correct[k] + _TINY) / (guessed[k] + _SMALL)
        scores.append(product ** (1.0 / (k + 1)))
    return scores


def paper_bleu(
    references: Mapping[str, Sequence[str]],
    hypotheses: Mapping[str, str],
    *,
    java_timeout: float = java_tools.DEFAULT_JAVA_TIMEOUT,
) -> dict:
    """BLEU-1..4 without brevity penalty, as Table 1 of Xu et al. (2015) reports it.

    The captions are tokenized exactly as in `coco_scores`, then scored by
    `bleu_without_brevity_penalty`.

    Args:
      references: image id -> reference captions (raw text).
      hypotheses: image id -> generated caption (raw text).
      java_timeout: seconds the Java tokenizer may run.

    Returns:
      {"paper BLEU-1 (no BP)", ..., "paper BLEU-4 (no BP)": float in [0, 1]}.

    Raises:
      ValueError: as `coco_scores`.
    """
    refs = _check_inputs(references, hypotheses)
    gts, res, _ = java_tools.tokenize(refs, hypotheses, java_timeout)
    return _paper_bleu_of_tokens(gts, res)


def _paper_bleu_of_tokens(gts, res) -> dict:
    scores = bleu_without_brevity_penalty(gts, {i: h[0] for i, h in res.items()})
    return dict(zip(PAPER_BLEU_KEYS, scores, strict=True))


def bleu4(references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str]) -> float:
    """Corpus BLEU-4 of already tokenized captions, for model selection (paper §4.3).

    coco-caption's Bleu scorer (closest reference length, brevity penalty) on the words
    as given: no tokenizer and no Java, so it is fast enough to run every epoch.

    Args:
      references: image id -> reference captions, lowercase words joined by spaces.
      hypotheses: image id -> generated caption, likewise.

    Returns:
      BLEU-4 in [0, 1].

    Raises:
      ValueError: as `coco_scores`.
    """
    refs = _check_inputs(references, hypotheses)
    res = {i: [h] for i, h in hypotheses.items()}
    bleu, _ = Bleu(4).compute_score(refs, res, verbose=0)
    return float(bleu[3])


def cider(references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str]) -> float:
    """Corpus CIDEr-D of already tokenized captions, for model selection (`--selection_metric`).

    coco-caption's Cider scorer on the words as given, its document frequencies taken from
    these references, as `coco_scores` does after tokenizing: fast enough for every epoch.

    Args and Raises: as `bleu4`.

    Returns:
      CIDEr-D in [0, 10].
    """
    refs = _check_inputs(references, hypotheses)
    res = {i: [h] for i, h in hypotheses.items()}
    return float(Cider().compute_score(refs, res)[0])


def caption_statistics(hypotheses: Mapping[str, str]) -> dict[str, float]:
    """What CIDEr optimisation is known to change in captions, reported beside the scores.

    Args:
      hypotheses: image id -> generated caption (words joined by spaces).

    Returns:
      "bad_ending_rate": share of captions whose last word is in `tokens.BAD_ENDINGS`
      ("... with a"); "repeated_trigram_rate": share of captions that hold some word
      trigram twice; "distinct_words": number of different words over all captions;
      "mean_length": mean number of words.
    """
    captions = [h.split() for h in hypotheses.values()]
    if not captions:
        raise ValueError("no captions")
    bad = sum(bool(words) and words[-1] in BAD_ENDINGS for words in captions)
    repeated = 0
    for words in captions:
        trigrams = list(zip(words, words[1:], words[2:], strict=False))
        repeated += len(set(trigrams)) < len(trigrams)
    return {
        "bad_ending_rate": bad / len(captions),
        "repeated_trigram_rate": repeated / len(captions),
        "distinct_words": float(len({w for words in captions for w in words})),
        "mean_length": statistics.fmean(len(words) for words in captions),
    }


def _cell(scores: Mapping, key: str, digits: int) -> str:
    value = scores.get(key)
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{100 * value:.{digits}f}"


def format_table1(scores: Mapping, dataset: str, model_name: str) -> str:
    """`table1({model_name: scores}, dataset)`: one model beside the paper's rows."""
    return table1({model_name: scores}, dataset)


def table1(models: Mapping[str, Mapping], dataset: str) -> str:
    """A Markdown table laid out like Table 1 of Xu et al. (2015).

    Columns BLEU-1..4 and METEOR, values x100 as the paper prints them. The paper's BLEU
    is computed without brevity penalty, so each model gets a row for that BLEU
    ("paper BLEU-k (no BP)" keys, from `paper_bleu`), comparable to the paper's rows, and
    a row for coco-caption's BLEU with brevity penalty ("BLEU-k" keys, from
    `coco_scores`); rows whose keys are absent are left out. For "flickr8k", "flickr30k"
    and "coco" the paper's soft- and hard-attention rows follow.

    Args:
      models: model name -> its scores (metric name -> value in [0, 1], e.g.
        `coco_scores` merged with `paper_bleu`), in the order of the rows.
      dataset: dataset name; selects the paper's rows.

    Returns:
      The table and a note on its sources, as Markdown.
    """
    header = "| Model | BLEU-1 | BLEU-2 | BLEU-3 | BLEU-4 | METEOR |"
    lines = [f"Table 1 layout (Xu et al., 2015): {dataset}", "", header, "|---" * 6 + "|"]
    for model_name, scores in models.items():
        meteor = _cell(scores, "METEOR", 2)
        for keys, label in (
            (PAPER_BLEU_KEYS, "BLEU without brevity penalty, as the paper"),
            (BLEU_KEYS, "coco-caption BLEU, with brevity penalty"),
        ):
            if any(k in scores for k in keys):
                values = [_cell(scores, k, 1) for k in keys]
                lines.append(f"| {model_name} ({label}) | {' | '.join(values)} | {meteor} |")
    paper_rows = PAPER_TABLE1.get(_DATASET_ALIASES.get(dataset.lower(), dataset.lower()), {})
    for name, values in paper_rows.items():
        lines.append(f"| {name} (Xu et al., 2015) | {' | '.join(values)} |")
    lines.append("")
    note = "Values x100. METEOR from coco-caption's METEOR 1.5."
    if paper_rows:
        note += " Paper rows: Xu et al. (2015), Table 1, whose BLEU has no brevity penalty."
    lines.append(note)
    return "\n".join(lines) + "\n"


# The seed table's columns: (key in a run's scores, header). Grounding keys come from a
# `coco_grounding` report merged in with the prefix "grounding ".
SEED_COLUMNS = (
    ("BLEU-4", "BLEU-4"),
    ("METEOR", "METEOR"),
    ("CIDEr", "CIDEr"),
    ("bad_ending_rate", "bad endings"),
    ("grounding hit", "hit"),
    ("grounding centre", "centre"),
    ("grounding mass", "mass"),
    ("grounding off-centre hit", "off-centre hit"),
    ("grounding off-centre random", "off-centre random"),
)


def mean_and_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1 in the denominator; 0 for one value)."""
    if not values:
        raise ValueError("no values")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def seed_table(models: Mapping[str, Sequence[Mapping]]) -> str:
    """A Markdown table of each model's runs over seeds: mean ± standard deviation.

    Columns coco-caption BLEU-4, METEOR and CIDEr, and grounding (hit, the centre cell's
    hit on the same words, attention mass in the boxes, and over the off-centre words the
    hit and the random cell's) where the runs have it; values in [0, 1] with three
    decimals, the sample standard deviation over the runs that have the key, and the
    number of runs.

    Args:
      models: model name -> its runs' scores (metric name -> value), in row order.

    Returns:
      the table as Markdown.
    """
    columns = [
        (key, header)
        for key, header in SEED_COLUMNS
        if any(key in run for runs in models.values() for run in runs)
    ]
    lines = [
        "| Model | runs | " + " | ".join(header for _, header in columns) + " |",
        "|---" * (len(columns) + 2) + "|",
    ]
    for name, runs in models.items():
        if not runs:
            raise ValueError(f"model {name!r} has no runs")
        cells = []
        for key, _ in columns:
            values = [run[key] for run in runs if run.get(key) is not None]
            if not values:
                cells.append("n/a")
                continue
            mean, sd = mean_and_sd(values)
            cell = f"{mean:.3f} ± {sd:.3f}" if len(values) > 1 else f"{mean:.3f}"
            cells.append(cell if len(values) == len(runs) else f"{cell} ({len(values)})")
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Mean ± sample standard deviation over runs (seeds); a count in brackets where "
        "fewer runs have the value."
    )
    return "\n".join(lines) + "\n"


def to_coco_results(captions: Mapping[str, str]) -> list[dict]:
    """Captions in the COCO results format, [{"image_id", "caption"}, ...].

    Args:
      captions: image id -> caption.

    Returns:
      One dict per image; "image_id" is an int when the id is all ASCII digits (COCO's
      ids), else the string.
    """
    results = []
    for image_id, caption in captions.items():
        if not isinstance(image_id, str) or not isinstance(caption, str):
            raise ValueError(f"caption {image_id!r}: {caption!r} is not a pair of strings")
        key = int(image_id) if re.fullmatch(r"[0-9]+", image_id) else image_id
        results.append({"image_id": key, "caption": caption})
    return results


def write_results(path: str, captions: Mapping[str, str]) -> None:
    """Writes `to_coco_results(captions)` as JSON to `path` atomically (temp + rename).

    Args:
      path: the JSON file to write; its directory is created if needed.
      captions: image id -> caption.
    """
    results = to_coco_results(captions)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    files.write_json(path, results, ensure_ascii=False, indent=1)
