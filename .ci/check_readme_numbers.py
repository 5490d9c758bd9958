"""Checks the shapes model's test scores that README.md states against those that README's
first command printed.

  python .ci/check_readme_numbers.py README.md first_command.log

README's sentence "On the 1,000 test images this model scores BLEU-4 0.919 (coco-caption),
METEOR ..., CIDEr ..., pointing accuracy ..., phrase pointing ... and location accuracy
...;" gives the stated numbers; the JSON object that `scripts/train.py` prints (its test
scores) gives the measured ones. A measured number below the stated one minus its
tolerance fails, as does a missing sentence, JSON object or score. Standard library only
and no sat_tf import: it judges the command's output, not the code that made it.
"""

import json
import re
import sys

# README's words for each number, in the sentence's order, and the key of the printed
# scores (`metrics.coco_scores`, `grounding.pointing_accuracy`, `location_accuracy`).
METRICS = (
    ("BLEU-4", "BLEU-4"),
    ("METEOR", "METEOR"),
    ("CIDEr", "CIDEr"),
    ("pointing accuracy", "pointing_accuracy"),
    ("phrase pointing", "phrase_pointing_accuracy"),
    ("location accuracy", "location_accuracy"),
)

# How far below README's number a run may land and still pass. The run is seeded but not
# bit-identical across CPU kinds (oneDNN picks other kernels), and three epochs leave the
# scores sensitive to that; the spreads measured on the same command, and why these
# values, are in BUILD_NOTES.md ("Shapes"). Pointing moves most: which word of a phrase
# carries the look changes between runs that are equally good on BLEU-4.
TOLERANCE = {
    "BLEU-4": 0.03,
    "METEOR": 0.05,
    "CIDEr": 0.3,
    "pointing accuracy": 0.1,
    "phrase pointing": 0.05,
    "location accuracy": 0.03,
}

_NUMBER = r"(\d+(?:\.\d+)?)"
SENTENCE = re.compile(
    rf"On the [\d,]+ test images this model scores BLEU-4 {_NUMBER} \(coco-caption\), "
    rf"METEOR {_NUMBER}, CIDEr {_NUMBER}, pointing accuracy {_NUMBER}, "
    rf"phrase pointing {_NUMBER} and location accuracy {_NUMBER};"
)
SENTENCE_FORM = (
    "On the N test images this model scores BLEU-4 x (coco-caption), METEOR x, CIDEr x, "
    "pointing accuracy x, phrase pointing x and location accuracy x;"
)


class CheckError(Exception):
    """README's sentence or the printed scores are missing or incomplete."""


def readme_numbers(text: str) -> dict[str, float]:
    """The numbers of README's sentence on the shapes model's test scores.

    Args:
      text: README.md; the sentence may wrap over lines.

    Returns:
      {README's words for the metric (METRICS): number}, in the sentence's order.

    Raises:
      CheckError: no sentence of the form SENTENCE_FORM.
    """
    joined = re.sub(r"\s+", " ", text)
    match = SENTENCE.search(joined)
    if match is None:
        start = joined.find("this model scores")
        found = f" (found: {joined[start : start + 200]!r})" if start >= 0 else ""
        raise CheckError(f"README.md has no sentence of the form {SENTENCE_FORM!r}{found}")
    values = [float(v) for v in match.groups()]
    return {words: value for (words, _), value in zip(METRICS, values, strict=True)}


def printed_scores(log: str) -> dict:
    """The last JSON object in `log` that holds test scores (a "BLEU-4" key).

    Args:
      log: the output of README's first command, stdout and stderr together.

    Returns:
      the object, as `scripts/train.py` printed it.

    Raises:
      CheckError: no such object.
    """
    decoder = json.JSONDecoder()
    found, position = None, log.find("{")
    while position >= 0:
        try:
            value, end = decoder.raw_decode(log, position)
        except json.JSONDecodeError:
            position = log.find("{", position + 1)
            continue
        if isinstance(value, dict) and "BLEU-4" in value:
            found = value
        position = log.find("{", end)
    if found is None:
        raise CheckError(
            'the log holds no JSON object with test scores (a "BLEU-4" key): '
            "scripts/train.py prints one when it ends"
        )
    return found


def compare(stated: dict[str, float], printed: dict) -> list[tuple]:
    """One row per metric: (README's words, stated, printed, tolerance, ok).

    A printed value passes when it is at least stated - tolerance; a value that is absent
    or null (a scorer that could not run, see the object's "unavailable") fails.

    Raises:
      CheckError: the printed object lacks one of the keys.
    """
    missing = [key for _, key in METRICS if key not in printed]
    if missing:
        raise CheckError(f"the printed test scores have no {', '.join(missing)}")
    rows = []
    for words, key in METRICS:
        value, tolerance = printed[key], TOLERANCE[words]
        ok = isinstance(value, int | float) and value >= stated[words] - tolerance
        rows.append((words, stated[words], value, tolerance, ok))
    return rows


def format_rows(rows: list[tuple], unavailable: dict | None = None) -> str:
    """The comparison as a plain-text table, with the reason for a null value."""
    lines = [f"{'metric':<18} {'README':>7} {'printed':>8} {'tolerance':>9}  ok"]
    for words, stated, value, tolerance, ok in rows:
        shown = "null" if value is None else f"{value:.4f}"
        lines.append(
            f"{words:<18} {stated:>7g} {shown:>8} {tolerance:>9g}  {'yes' if ok else 'NO'}"
        )
    for words, key in METRICS:
        if unavailable and key in unavailable:
            lines.append(f"{words}: {unavailable[key]}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} README.md first_command.log", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        readme = f.read()
    with open(argv[2], encoding="utf-8", errors="replace") as f:
        log = f.read()
    try:
        printed = printed_scores(log)
        rows = compare(readme_numbers(readme), printed)
    except CheckError as e:
        print(f"README's numbers: {e}", file=sys.stderr)
        return 1
    print(format_rows(rows, printed.get("unavailable")))
    failed = [row[0] for row in rows if not row[-1]]
    if failed:
        print(
            f"README's numbers: {', '.join(failed)} below README's by more than the "
            "tolerance; rerun the first command and update README.md (and BUILD_NOTES.md), "
            "or find what lowered them",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
