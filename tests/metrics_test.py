"""Tests for sat_tf.evaluation.metrics: coco-caption scores, the paper's BLEU, Table 1,
results files (the Java programs behind METEOR, SPICE and the tokenizer:
java_tools_test.py)."""

import json
import math
import os

import pytest
from nltk.translate.bleu_score import brevity_penalty, corpus_bleu
from pycocoevalcap.bleu.bleu import Bleu

from sat_tf.evaluation import java_tools, metrics

# Two images, already tokenized. Counts written out by hand:
#   "1": hyp "the cat sat on the mat" (6 words), refs of 6 and 7 words.
#     1-grams: the x2 (ref max 2), cat, sat (0), on, mat -> 5 correct of 6
#     2-grams: the cat, cat sat (0), sat on (0), on the, the mat -> 3 of 5
#     3-grams: the cat sat, cat sat on, sat on the, on the mat -> 1 of 4
#     4-grams: none of 3 -> 0 of 3
#   "2": hyp "a man rides a horse" (5 words), refs of 6 and 6 words.
#     1-grams: a x2 (ref max 2), man, rides, horse -> 5 of 5
#     2-grams: a man, man rides, rides a, a horse -> 4 of 4
#     3-grams: a man rides, man rides a, rides a horse (0) -> 2 of 3
#     4-grams: a man rides a, man rides a horse (0) -> 1 of 2
# Corpus: p = 10/11, 7/9, 3/7, 1/5; hypothesis length c = 6 + 5 = 11 and closest reference
# lengths r = 6 + 6 = 12: the short "2" makes c < r, so BP = exp(1 - 12/11) < 1.
REFS = {
    "1": ["the cat is on the mat", "there is a cat on the mat"],
    "2": ["a man rides a brown horse", "a man is riding a horse"],
}
HYPS = {"1": "the cat sat on the mat", "2": "a man rides a horse"}
NO_BP = [10 / 11, math.sqrt(70 / 99), (10 / 33) ** (1 / 3), (2 / 33) ** (1 / 4)]
BP = math.exp(1 - 12 / 11)


def test_bleu_with_and_without_brevity_penalty_by_hand(no_java):
    scores = metrics.coco_scores(REFS, HYPS)
    paper = metrics.paper_bleu(REFS, HYPS)
    for k in range(4):
        assert scores[metrics.BLEU_KEYS[k]] == pytest.approx(NO_BP[k] * BP, rel=1e-8)
        assert paper[metrics.PAPER_BLEU_KEYS[k]] == pytest.approx(NO_BP[k], rel=1e-8)
        assert paper[metrics.PAPER_BLEU_KEYS[k]] > scores[metrics.BLEU_KEYS[k]]
    assert metrics.bleu4(REFS, HYPS) == pytest.approx(NO_BP[3] * BP, rel=1e-8)


def test_paper_bleu_with_coco_scores_tokenizes_once(no_java, monkeypatch):
    calls = []
    real = java_tools.tokenize
    monkeypatch.setattr(java_tools, "tokenize", lambda *a: calls.append(1) or real(*a))
    both = metrics.coco_scores(REFS, HYPS, with_paper_bleu=True)
    assert len(calls) == 1
    for k in range(4):
        assert both[metrics.PAPER_BLEU_KEYS[k]] == pytest.approx(NO_BP[k], rel=1e-8)
        assert both[metrics.BLEU_KEYS[k]] == pytest.approx(NO_BP[k] * BP, rel=1e-8)
    assert not set(metrics.PAPER_BLEU_KEYS) & set(metrics.coco_scores(REFS, HYPS))


def test_bleu_equal_with_and_without_penalty_when_long_enough(no_java):
    # "1" alone: c = 6 = closest reference length, so BP = 1. No 4-gram matches: the
    # scorers' guards give (5/6 * 3/5 * 1/4 * 1e-15/3)^(1/4) instead of 0.
    refs, hyps = {"1": REFS["1"]}, {"1": HYPS["1"]}
    scores = metrics.coco_scores(refs, hyps)
    paper = metrics.paper_bleu(refs, hyps)
    expected = [5 / 6, math.sqrt(1 / 2), (1 / 8) ** (1 / 3), (1e-15 / 24) ** (1 / 4)]
    for k in range(4):
        assert scores[metrics.BLEU_KEYS[k]] == pytest.approx(expected[k], rel=1e-6)
        assert paper[metrics.PAPER_BLEU_KEYS[k]] == pytest.approx(expected[k], rel=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_bleu_agrees_with_nltk(n):
    # Both take the closest reference length (ties to the shorter) and the same brevity
    # penalty; coco-caption adds 1e-15 to counts and 1e-9 to totals, a relative
    # difference below 1e-9 when every precision is non-zero, as here.
    ids = sorted(HYPS)
    list_of_refs = [[r.split() for r in REFS[i]] for i in ids]
    hyps = [HYPS[i].split() for i in ids]
    weights = (1 / n,) * n
    expected = corpus_bleu(list_of_refs, hyps, weights=weights)
    refs_tok = {i: REFS[i] for i in ids}
    coco, _ = Bleu(n).compute_score(refs_tok, {i: [HYPS[i]] for i in ids}, verbose=0)
    assert coco[n - 1] == pytest.approx(expected, rel=1e-8)
    no_bp = metrics.bleu_without_brevity_penalty(refs_tok, HYPS, n)[n - 1]
    nltk_bp = brevity_penalty(12, 11)
    assert no_bp * nltk_bp == pytest.approx(expected, rel=1e-8)


def test_cider_and_rouge_by_hand(no_java):
    # N = 2 images, idf = log(2) - log(df). "dog" is in both reference sets (idf 0); every
    # other n-gram in one (idf log 2), unseen n-grams also get log 2.
    #   "1": 1-gram vectors hyp (dog 0, runs l, home l), ref (dog 0, runs l, fast l):
    #        clipped dot l^2, norms sqrt(2) l each -> 0.5; 2-grams likewise 0.5;
    #        3-grams no overlap -> 0; no 4-grams -> 0; equal lengths -> no penalty.
    #        CIDEr-D = 10 * mean(0.5, 0.5, 0, 0) = 2.5.
    #   "2": identical 3 words -> cosines 1, 1, 1, 0 -> 7.5. Mean 5.0.
    # ROUGE-L (beta 1.2): "1" LCS 2 of 3 both ways -> 2/3; "2" -> 1. Mean 5/6.
    refs = {"1": ["dog runs fast"], "2": ["dog eats food"]}
    hyps = {"1": "dog runs home", "2": "dog eats food"}
    scores = metrics.coco_scores(refs, hyps)
    assert scores["CIDEr"] == pytest.approx(5.0, rel=1e-9)
    assert scores["ROUGE-L"] == pytest.approx(5 / 6, rel=1e-9)
    swapped = metrics.coco_scores(dict(reversed(refs.items())), dict(reversed(hyps.items())))
    assert swapped["CIDEr"] == pytest.approx(scores["CIDEr"], rel=1e-12)
    # The per-epoch scorer takes the words as given (no tokenizer): the same 5.0.
    assert metrics.cider(refs, hyps) == pytest.approx(5.0, rel=1e-9)


def test_no_java_still_scores_and_marks_meteor_unavailable(no_java, caplog):
    refs = {"1": ["A dog runs on the grass."], "2": ["Two cats (black) sleep."]}
    hyps = {"1": "A dog, running on grass!", "2": "two cats sleep"}
    with caplog.at_level("WARNING", logger="absl"):
        scores = metrics.coco_scores(refs, hyps)
    for key in (*metrics.BLEU_KEYS, "ROUGE-L", "CIDEr"):
        assert 0 <= scores[key] <= 10
    assert scores["BLEU-1"] > 0.5
    assert scores["METEOR"] is None
    reason = scores["unavailable"]["METEOR"]
    assert reason.startswith("java not found on PATH") and "apt-get install default-jre" in reason
    assert "simple_ptb_tokenize" in scores["tokenizer"]
    assert [r.getMessage() for r in caplog.records] == [
        f"METEOR not computed (null in the scores): {reason}"
    ]


@pytest.mark.parametrize(
    "refs, hyps, match",
    [
        ({"1": ["a dog"]}, {"7": "a dog"}, "'7' has a hypothesis but no references"),
        ({"1": []}, {"1": "a dog"}, "'1' has an empty list"),
        ({"1": "a dog"}, {"1": "a dog"}, "'1' are not a list"),
        ({"1": ["a dog", "  "]}, {"1": "a dog"}, "'1' has an empty or non-string"),
        ({"1": ["a dog"]}, {"1": ["a dog"]}, "hypothesis of image '1'"),
        ({1: ["a dog"]}, {1: "a dog"}, "image id 1 is not a string"),
        ({"1": ["a dog"]}, {}, "no hypotheses"),
    ],
)
def test_bad_input_names_the_image(no_java, refs, hyps, match):
    for fn in (metrics.coco_scores, metrics.paper_bleu, metrics.bleu4, metrics.cider):
        with pytest.raises(ValueError, match=match):
            fn(refs, hyps)


def test_only_hypothesis_images_are_scored():
    refs = {**REFS, "3": ["an unrelated caption of another image"]}
    assert metrics.bleu4(refs, HYPS) == pytest.approx(NO_BP[3] * BP, rel=1e-8)


def test_format_table1_has_paper_rows_and_both_bleus():
    scores = {
        **dict(zip(metrics.BLEU_KEYS, [0.6, 0.4, 0.25, 0.15], strict=True)),
        **dict(zip(metrics.PAPER_BLEU_KEYS, [0.6512, 0.43, 0.281, 0.1849], strict=True)),
        "METEOR": 0.2012,
    }
    table = metrics.format_table1(scores, "flickr8k", "ours")
    assert "| Model | BLEU-1 | BLEU-2 | BLEU-3 | BLEU-4 | METEOR |" in table
    assert "| Soft-Attention (Xu et al., 2015) | 67 | 44.8 | 29.9 | 19.5 | 18.93 |" in table
    assert "| Hard-Attention (Xu et al., 2015) | 67 | 45.7 | 31.4 | 21.3 | 20.30 |" in table
    assert "| 65.1 | 43.0 | 28.1 | 18.5 | 20.12 |" in table
    assert "| 60.0 | 40.0 | 25.0 | 15.0 | 20.12 |" in table
    coco = metrics.format_table1(scores, "coco", "ours")
    assert "| Hard-Attention (Xu et al., 2015) | 71.8 | 50.4 | 35.7 | 25.0 | 23.04 |" in coco
    f30k = metrics.format_table1(scores, "Flickr30k", "ours")
    assert "| Soft-Attention (Xu et al., 2015) | 66.7 | 43.4 | 28.8 | 19.1 | 18.49 |" in f30k


@pytest.mark.parametrize("meteor", [{}, {"METEOR": None}], ids=["absent", "null"])
def test_format_table1_other_dataset_and_missing_meteor(meteor):
    scores = dict(zip(metrics.BLEU_KEYS, [0.9, 0.8, 0.7, 0.6], strict=True)) | meteor
    table = metrics.format_table1(scores, "shapes", "ours")
    assert "Xu et al., 2015) |" not in table
    assert (
        "| ours (coco-caption BLEU, with brevity penalty) | 90.0 | 80.0 | 70.0 | 60.0 | n/a |"
        in (table)
    )
    assert "without brevity penalty" not in table


def test_table1_rows_in_order_then_the_papers():
    soft = {**dict(zip(metrics.PAPER_BLEU_KEYS, [0.7, 0.5, 0.33, 0.2], strict=True)), "METEOR": 0.2}
    none = {**dict(zip(metrics.PAPER_BLEU_KEYS, [0.6, 0.4, 0.25, 0.15], strict=True))}
    lines = metrics.table1({"soft": soft, "none": none}, "flickr8k").splitlines()
    rows = [line for line in lines if line.startswith("| ") and "Model" not in line]
    assert rows == [
        "| soft (BLEU without brevity penalty, as the paper) | 70.0 | 50.0 | 33.0 | 20.0 | 20.00 |",
        "| none (BLEU without brevity penalty, as the paper) | 60.0 | 40.0 | 25.0 | 15.0 | n/a |",
        "| Soft-Attention (Xu et al., 2015) | 67 | 44.8 | 29.9 | 19.5 | 18.93 |",
        "| Hard-Attention (Xu et al., 2015) | 67 | 45.7 | 31.4 | 21.3 | 20.30 |",
    ]


def test_coco_results_and_atomic_write(tmp_path):
    captions = {"391895": "a man riding a bike", "img_7": "a cat"}
    assert metrics.to_coco_results(captions) == [
        {"image_id": 391895, "caption": "a man riding a bike"},
        {"image_id": "img_7", "caption": "a cat"},
    ]
    path = tmp_path / "out" / "captions.json"
    metrics.write_results(str(path), captions)
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == metrics.to_coco_results(captions)
    assert os.listdir(path.parent) == ["captions.json"]


def test_mean_and_sd_by_hand():
    # mean 0.2; deviations -0.1, 0, 0.1; sample variance 0.02 / 2 = 0.01.
    mean, sd = metrics.mean_and_sd([0.1, 0.2, 0.3])
    assert abs(mean - 0.2) < 1e-12 and abs(sd - 0.1) < 1e-12
    assert metrics.mean_and_sd([0.25]) == (0.25, 0.0)


def test_seed_table_means_and_counts():
    runs = {
        "soft": [
            {"BLEU-4": 0.20, "METEOR": 0.19, "CIDEr": 0.50, "grounding hit": 0.6},
            {"BLEU-4": 0.22, "METEOR": 0.21, "CIDEr": 0.54},
        ],
        "none": [{"BLEU-4": 0.21, "METEOR": 0.20, "CIDEr": 0.52}],
    }
    table = metrics.seed_table(runs)
    lines = table.splitlines()
    assert lines[0] == "| Model | runs | BLEU-4 | METEOR | CIDEr | hit |"
    # sd of (0.20, 0.22) is 0.02 / sqrt(2) = 0.01414; hit only in one of the two runs.
    assert lines[2] == "| soft | 2 | 0.210 ± 0.014 | 0.200 ± 0.014 | 0.520 ± 0.028 | 0.600 (1) |"
    assert lines[3] == "| none | 1 | 0.210 | 0.200 | 0.520 | n/a |"
