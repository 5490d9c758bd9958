"""Tests for sat_tf.evaluation.java_tools: METEOR 1.5, SPICE and the PTB tokenizer run as
Java programs (by hand, against the Python tokenizer), and a missing, failing, hanging
or idle Java (hidden, or a shell script standing in for it)."""

import json
import shutil
import stat
import time

import pytest
from metrics_test import BP, HYPS, NO_BP, REFS

from sat_tf.evaluation import java_tools, metrics

HAS_JAVA = shutil.which("java") is not None
# Only the tests that run coco-caption's Java programs (METEOR 1.5, the PTB tokenizer); the
# others hide java or stand in a fake one. .ci/run installs it.
needs_java = pytest.mark.skipif(
    not HAS_JAVA, reason=java_tools.java_missing("METEOR 1.5 and the PTB tokenizer")
)


def _fake_java(monkeypatch, tmp_path, script):
    path = tmp_path / "java"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    real_which = shutil.which
    monkeypatch.setattr(
        shutil,
        "which",
        lambda name, *a, **k: str(path) if name == "java" else real_which(name, *a, **k),
    )


def test_java_missing_from_path_is_one_line_and_null_in_the_json(monkeypatch, tmp_path, caplog):
    # What a machine without Java runs: PATH holds no java at all (shutil.which not mocked).
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level("WARNING", logger="absl"):
        scores = metrics.coco_scores(REFS, HYPS, use_spice=True)
    printed = json.loads(json.dumps(scores, indent=2, sort_keys=True))  # as sat-evaluate prints
    assert printed["METEOR"] is None and printed["SPICE"] is None
    assert printed["unavailable"] == {
        "METEOR": "java not found on PATH; METEOR 1.5 is a Java program "
        "(install it: apt-get install default-jre-headless)",
        "SPICE": "java not found on PATH; SPICE is a Java program "
        "(install it: apt-get install default-jre-headless)",
    }
    assert printed["tokenizer"].endswith(
        "because java not found on PATH; the PTB tokenizer is a Java program "
        "(install it: apt-get install default-jre-headless)"
    )
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line
    assert line.startswith("METEOR not computed (null in the scores): java not found on PATH;")
    assert "; SPICE not computed (null in the scores): java not found on PATH;" in line
    assert printed["BLEU-4"] == pytest.approx(NO_BP[3] * BP, rel=1e-8)


def test_failing_java_becomes_unavailable(monkeypatch, tmp_path):
    _fake_java(monkeypatch, tmp_path, "echo 'jvm exploded' >&2\nexit 3")
    scores = metrics.coco_scores(REFS, HYPS)
    assert "exit code 3" in scores["unavailable"]["METEOR"]
    assert "jvm exploded" in scores["unavailable"]["METEOR"]
    assert java_tools._meteor is None  # a failed process is not kept
    assert "exited with code 3" in scores["tokenizer"]
    assert scores["BLEU-4"] == pytest.approx(NO_BP[3] * BP, rel=1e-8)


def test_hanging_java_times_out(monkeypatch, tmp_path):
    _fake_java(monkeypatch, tmp_path, "exec sleep 60")
    start = time.monotonic()
    scores = metrics.coco_scores(REFS, HYPS, java_timeout=1.0)
    assert time.monotonic() - start < 15
    assert "did not finish within 1 s" in scores["unavailable"]["METEOR"]
    assert java_tools._meteor is None
    assert "did not finish within 1 s" in scores["tokenizer"]


def test_spice_without_java_is_unavailable(no_java):
    scores = metrics.coco_scores(REFS, HYPS, use_spice=True)
    assert scores["SPICE"] is None and "java" in scores["unavailable"]["SPICE"]


@needs_java
def test_missing_meteor_jar_is_unavailable(monkeypatch):
    monkeypatch.setattr(java_tools._meteor_module, "METEOR_JAR", "no-such-meteor.jar")
    scores = metrics.coco_scores(REFS, HYPS)
    assert scores["METEOR"] is None
    assert "no-such-meteor.jar is missing" in scores["unavailable"]["METEOR"]
    assert scores["tokenizer"].startswith("PTBTokenizer")


@needs_java
def test_spice_missing_files_reported(monkeypatch, tmp_path):
    monkeypatch.setattr(java_tools._spice_module, "__file__", str(tmp_path / "spice.py"))
    with pytest.raises(java_tools.Unavailable, match="stanford-corenlp-3.6.0"):
        java_tools.spice("java", {"1": ["a"]}, {"1": ["a"]}, 10)


@needs_java
def test_meteor_by_hand():
    # METEOR 1.5, English defaults alpha 0.85, beta 0.2, gamma 0.6, delta 0.75
    # (Denkowski & Lavie, 2014); the corpus score sums the statistics of both images:
    #   "1": hyp 6 words (a, on, the function; dog, runs, grass content), ref "a cat":
    #        only "a" matches, exactly.  "2": 4 content words, all match, in 2 chunks.
    #   weighted matches 0.75 * 4 + 0.25 * 1 = 3.25; hyp weight 0.75 * 7 + 0.25 * 3 = 6,
    #   ref weight 0.75 * 5 + 0.25 * 1 = 4: P = 3.25 / 6, R = 3.25 / 4,
    #   Fmean = P R / (0.85 P + 0.15 R); chunks 3 over 5 matches: penalty 0.6 * 0.6^0.2.
    refs = {"1": ["a cat"], "2": ["dog cat bird fish"]}
    hyps = {"1": "a dog runs on the grass", "2": "bird fish dog cat"}
    p, r = 3.25 / 6, 3.25 / 4
    expected = p * r / (0.85 * p + 0.15 * r) * (1 - 0.6 * 0.6**0.2)
    scores = metrics.coco_scores(refs, hyps)
    assert scores["unavailable"] == {}
    assert scores["METEOR"] == pytest.approx(expected, abs=1e-9)
    assert scores["tokenizer"].startswith("PTBTokenizer")
    # The same process answers the next call, and each EVAL scores only its own images:
    # "2" alone: 4 matches of 4 equal content words in 2 chunks: Fmean 1, penalty
    # 0.6 * (2 / 4)^0.2.
    process = java_tools._meteor
    alone = metrics.coco_scores({"2": refs["2"]}, {"2": hyps["2"]})
    assert java_tools._meteor is process and process.proc.poll() is None
    assert alone["METEOR"] == pytest.approx(1 - 0.6 * 0.5**0.2, abs=1e-9)
    assert metrics.coco_scores(refs, hyps)["METEOR"] == pytest.approx(expected, abs=1e-9)


def test_meteor_process_is_closed_when_idle(monkeypatch, tmp_path):
    # A stand-in for METEOR's -stdio protocol: 3 statistics per SCORE line, then one
    # answer per statistics set and one for the corpus per EVAL line.
    _fake_java(
        monkeypatch,
        tmp_path,
        """while read -r line; do
  case "$line" in
    SCORE*) echo "1 1 1" ;;
    EVAL*) n=$(echo "$line" | grep -o '|||' | wc -l)
           i=0; while [ "$i" -le "$n" ]; do echo 0.5; i=$((i + 1)); done ;;
  esac
done""",
    )
    monkeypatch.setattr(java_tools, "METEOR_IDLE_SECONDS", 0.5)
    java = shutil.which("java")
    assert java_tools.meteor(java, {"1": ["a"]}, {"1": ["a"]}, 10) == 0.5
    process = java_tools._meteor
    assert java_tools.meteor(java, {"1": ["a"], "2": ["b"]}, {"1": ["a"], "2": ["c"]}, 10) == 0.5
    assert java_tools._meteor is process
    deadline = time.monotonic() + 10
    while java_tools._meteor is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert java_tools._meteor is None and process.proc.poll() is not None


@needs_java
def test_python_tokenizer_matches_java_ptb_tokenizer():
    captions = [
        "A dog runs.",
        "A dog. A cat runs",
        "Three people (two adults and a child) walk down the street.",
        "Two men [one in red] stand {here}.",
        "The men's hats; the dogs' toys.",
        "I'm sure they're here, we've seen it, you'll see, he'd go.",
        "Can't won't don't cannot",
        "50% of $5 bills #1 fan o'clock",
        "A man -- in black - is well-known -tall- ok",
        "He said 'hello world' to me",
        "Wait... what?!",
        "and/or 3.5 10:30 1,000,000 e.g. etc. Mr. Smith vs. the U.S.A.",
        'A sign says "STOP".',
        "A skier, wearing a red jacket, is going down a snowy hill... fast!",
        "It's 5:00 p.m. in N.Y. I have 5.",
        "A girl in a pink dress is climbing into a wooden playhouse .",
        "",
        "An Asian man wearing a black suit stands near a dark-haired woman .",
    ]
    java = java_tools.java_ptb_tokenize(shutil.which("java"), captions, 60)
    assert [java_tools.simple_ptb_tokenize(c) for c in captions] == java
