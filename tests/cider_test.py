"""Tests for sat_tf.evaluation.cider (CIDEr-D against fixed document frequencies) and the
caption statistics every evaluation reports."""

import math
import random

import numpy as np
import pytest
from pycocoevalcap.cider.cider import Cider

from sat_tf.evaluation import cider, metrics

# A fixed set: refs of different counts and lengths, hypotheses sharing some n-grams,
# one sharing none, one with a repeated word and one of a single word.
REFS = {
    "1": ["the cat is on the mat", "there is a cat on the mat", "a cat sits on a mat"],
    "2": ["a man rides a brown horse", "a man is riding a horse"],
    "3": ["two dogs play in the snow", "dogs running through snow", "two dogs in snow"],
    "4": ["a child in a red shirt jumps", "a boy jumps into the water"],
    "5": ["people walk down a busy street at night"],
}
HYPS = {
    "1": "the cat sat on the mat",
    "2": "a man rides a horse",
    "3": "a dog a dog a dog in the snow",
    "4": "green ideas sleep furiously",
    "5": "people",
}


def _random_set(rng, images=12, words=7):
    vocab = [f"w{i}" for i in range(words)]

    def sentence():
        return " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 12)))

    refs = {str(i): [sentence() for _ in range(rng.randint(1, 5))] for i in range(images)}
    return refs, {i: sentence() for i in refs}


def _ours(refs, hyps):
    ids = sorted(refs)
    scorer = cider.CiderD.from_references([[r.split() for r in refs[i]] for i in ids])
    cooked = scorer.cook_references([[r.split() for r in refs[i]] for i in ids])
    return [scorer.score(hyps[i].split(), c) for i, c in zip(ids, cooked, strict=True)]


@pytest.mark.parametrize("seed", [None, 0, 1, 2])
def test_equals_coco_caption_cider_d_per_image(seed):
    refs, hyps = (REFS, HYPS) if seed is None else _random_set(random.Random(seed))
    ids = sorted(refs)
    mean, per_image = Cider().compute_score({i: refs[i] for i in ids}, {i: [hyps[i]] for i in ids})
    ours = _ours(refs, hyps)
    np.testing.assert_allclose(ours, per_image, rtol=1e-12, atol=1e-12)
    assert np.mean(ours) == pytest.approx(mean, rel=1e-12)
    assert max(ours) > 0.1  # the set scores something


def test_hand_computed_single_document():
    # One image, one reference equal to the hypothesis: with one document every df is 1
    # and every idf is log(1) - log(1) = 0, so every vector is zero and the score is 0.
    scorer = cider.CiderD.from_references([[["a", "b"]]])
    assert scorer.score(["a", "b"], scorer.cook_references([[["a", "b"]]])[0]) == 0.0
    # Two documents: "a b" in image 0 only. Unigram idf log 2 for a and b; the bigram
    # "a b" idf log 2. Identical candidate and reference: cosine 1 for n = 1, 2 and 0 for
    # n = 3, 4 (no such n-grams): score = 10 * (1 + 1 + 0 + 0) / 4 = 5.
    scorer = cider.CiderD.from_references([[["a", "b"]], [["c"]]])
    cooked = scorer.cook_references([[["a", "b"]]])[0]
    assert scorer.score(["a", "b"], cooked) == pytest.approx(5.0)
    # One bigram shorter (0 bigrams vs 1): penalty exp(-1/72) on the unigram cosine
    # (a against a b: 1 / sqrt(2)); no bigram: score = 10 * (1/sqrt(2)) e^(-1/72) / 4.
    expected = 10 * (1 / math.sqrt(2)) * math.exp(-1 / 72) / 4
    assert scorer.score(["a"], cooked) == pytest.approx(expected)


def test_save_and_load_keep_the_frequencies(tmp_path):
    corpus = [[[5, 6, 7, 2], [5, 7, 2]], [[8, 9, 2]], [[5, 6, 2]]]
    scorer = cider.CiderD.from_references(corpus)
    path = str(tmp_path / "df.npz")
    scorer.save(path)
    loaded = cider.CiderD.load(path)
    assert loaded.document_frequency == scorer.document_frequency
    assert loaded.num_documents == 3
    assert loaded.document_frequency[(5, 6)] == 2
    again = cider.cached(path, corpus[:1])  # read back, not recomputed
    assert again.num_documents == 3
    with pytest.raises(ValueError, match="cannot read"):
        cider.CiderD.load(str(tmp_path / "missing.npz"))


def test_rewarder_counts_end_and_ignores_padding():
    end = 2
    refs = [[[5, 6, 7, end], [5, 8, end]], [[9, 10, end]]]
    rewarder = cider.Rewarder(cider.CiderD.from_references(refs), refs, end)
    tokens = np.array(
        [
            [5, 6, 7, end, 0, 0],  # equals a reference, <end> included
            [5, 6, 7, 0, 0, 0],  # the same words without <end>
            [5, 6, 7, end, 0, 0],  # against the other image
            [9, 10, end, 0, 0, 0],
        ],
        np.int32,
    )
    rewards = rewarder(tokens, np.array([0, 0, 1, 1]))
    scorer = rewarder.scorer
    assert rewards.dtype == np.float32
    assert rewards[0] == pytest.approx(scorer.score([5, 6, 7, end], rewarder.cooked[0]))
    assert rewards[1] == pytest.approx(scorer.score([5, 6, 7], rewarder.cooked[0]))
    assert rewards[0] > rewards[1] > 0  # the missing "7 <end>" n-grams cost reward
    assert rewards[2] == 0.0 and rewards[3] > 0


def test_caption_statistics():
    stats = metrics.caption_statistics(
        {"1": "a dog runs on the grass", "2": "a man riding a bike with a", "3": "a dog a dog a"}
    )
    assert stats["bad_ending_rate"] == pytest.approx(2 / 3)
    assert stats["repeated_trigram_rate"] == pytest.approx(1 / 3)  # "a dog a" twice
    # a dog runs on the grass man riding bike with: 10 words
    assert stats["distinct_words"] == 10
    assert stats["mean_length"] == pytest.approx((6 + 7 + 5) / 3)
    assert set(stats) == set(metrics.CAPTION_STATISTICS)
