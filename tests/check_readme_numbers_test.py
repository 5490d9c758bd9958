"""Tests for .ci/check_readme_numbers.py: README's sentence, the printed scores, the
tolerances, and the script's exit status."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, ".ci", "check_readme_numbers.py")
_spec = importlib.util.spec_from_file_location("check_readme_numbers", SCRIPT)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

# README's sentence wrapped as Markdown wraps it, inside other text.
README = """## The shapes demo

On the 1,000 test images this model scores BLEU-4 0.900 (coco-caption), METEOR 0.600,
CIDEr 6.50, pointing accuracy 0.800, phrase pointing 0.950 and location accuracy
0.930; `--flagfile=configs/shapes_long.flags` (10 epochs) reaches BLEU-4 0.952.
"""
STATED = {
    "BLEU-4": 0.9,
    "METEOR": 0.6,
    "CIDEr": 6.5,
    "pointing accuracy": 0.8,
    "phrase pointing": 0.95,
    "location accuracy": 0.93,
}
# The printed keys of those six, each 0.01 above README's (CIDEr 0.1).
ABOVE = {
    "BLEU-4": 0.91,
    "METEOR": 0.61,
    "CIDEr": 6.6,
    "pointing_accuracy": 0.81,
    "phrase_pointing_accuracy": 0.96,
    "location_accuracy": 0.94,
}


def train_log(**scores):
    """What README's first command prints around train.py's JSON: log lines, a progress
    bar without its newline, the scores, then caption.py's and export.py's output."""
    printed = {
        **ABOVE,
        "BLEU-1": 0.93,
        "ROUGE-L": 0.9,
        "paper BLEU-4 (no BP)": 0.91,
        "unavailable": {},
        "tokenizer": "PTBTokenizer (Stanford CoreNLP 3.4.1, java)",
        **scores,
    }
    return (
        "I1201 19:50:00.246932 train_lib.py:190] training on 8000 images\n"
        "625/625 ━━━━━━━━━━━━━━━━━━━━ 0s 284ms/step - loss: 17.3 {'note': 'not json'}\r"
        + json.dumps(printed, indent=2, sort_keys=True)
        + '\n09000.png: a big red circle at the top left\n{"exported": "runs/shapes/export"}\n'
    )


def test_readme_numbers_of_a_wrapped_sentence():
    assert check.readme_numbers(README) == STATED


def test_the_real_readme_sentence_parses():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        stated = check.readme_numbers(f.read())
    assert list(stated) == [words for words, _ in check.METRICS]
    assert all(0 < v <= 1 for k, v in stated.items() if k != "CIDEr")
    assert 0 < stated["CIDEr"] <= 10


def test_a_changed_sentence_is_named_with_what_was_found():
    with pytest.raises(
        check.CheckError, match="no sentence of the form.*found: 'this model scores"
    ):
        check.readme_numbers(README.replace("METEOR 0.600,", ""))
    with pytest.raises(check.CheckError, match=r"no sentence of the form '[^']*'$"):
        check.readme_numbers("## The shapes demo\n")


def test_printed_scores_are_train_py_s_json_among_other_output():
    printed = check.printed_scores(train_log(METEOR=0.5))
    assert printed["METEOR"] == 0.5 and printed["location_accuracy"] == 0.94
    with pytest.raises(check.CheckError, match='no JSON object with test scores \\(a "BLEU-4"'):
        check.printed_scores(train_log().split("{\n")[0] + '{"exported": "x"}\n')


def test_above_within_and_below_the_tolerance():
    # README's BLEU-4 0.900 with tolerance 0.03: 0.91 above, 0.875 within, 0.86 below;
    # CIDEr 6.50 with 0.3: 6.25 within, 6.1 below.
    assert check.TOLERANCE["BLEU-4"] == 0.03 and check.TOLERANCE["CIDEr"] == 0.3
    cases = [({}, []), ({"BLEU-4": 0.875, "CIDEr": 6.25}, []), ({"BLEU-4": 0.86}, ["BLEU-4"])]
    cases.append(({"CIDEr": 6.1, "location_accuracy": 0.5}, ["CIDEr", "location accuracy"]))
    for changes, failing in cases:
        rows = check.compare(STATED, check.printed_scores(train_log(**changes)))
        assert [row[0] for row in rows if not row[-1]] == failing, changes
        assert [row[1] for row in rows] == list(STATED.values())


def test_null_or_missing_scores_fail():
    why = "java not found on PATH; METEOR 1.5 is a Java program"
    printed = check.printed_scores(train_log(METEOR=None, unavailable={"METEOR": why}))
    rows = check.compare(STATED, printed)
    assert [row[0] for row in rows if not row[-1]] == ["METEOR"]
    table = check.format_rows(rows, printed["unavailable"])
    assert "null" in table.splitlines()[2] and table.endswith(f"METEOR: {why}")
    del printed["pointing_accuracy"], printed["CIDEr"]
    with pytest.raises(check.CheckError, match="have no CIDEr, pointing_accuracy$"):
        check.compare(STATED, printed)


def run_script(tmp_path, readme, log):
    (tmp_path / "README.md").write_text(readme, encoding="utf-8")
    (tmp_path / "first.log").write_text(log, encoding="utf-8")
    return subprocess.run(
        [sys.executable, SCRIPT, str(tmp_path / "README.md"), str(tmp_path / "first.log")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_script_exits_non_zero_below_the_tolerance(tmp_path):
    done = run_script(tmp_path, README, train_log(pointing_accuracy=0.69))
    assert done.returncode == 1
    assert "pointing accuracy      0.8   0.6900       0.1  NO" in done.stdout
    assert "location accuracy     0.93   0.9400      0.03  yes" in done.stdout
    assert done.stderr.startswith("README's numbers: pointing accuracy below README's")

    within = run_script(tmp_path, README, train_log(pointing_accuracy=0.71))
    assert (within.returncode, within.stderr) == (0, "")
    assert within.stdout.count(" yes") == 6


@pytest.mark.parametrize(
    "readme, log, message",
    [
        ("no numbers here\n", train_log(), "README.md has no sentence of the form"),
        (README, "training failed\n", "the log holds no JSON object with test scores"),
    ],
    ids=["no sentence", "no json"],
)
def test_script_names_what_is_missing(tmp_path, readme, log, message):
    done = run_script(tmp_path, readme, log)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"README's numbers: {message}")
