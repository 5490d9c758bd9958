"""Tests for sat_tf.evaluation.grounding: object phrases, pointing and location accuracy,
on hand-made captions and attention maps."""

import numpy as np
import pytest

from sat_tf.evaluation import grounding
from sat_tf.evaluation.grounding import Mention


def test_parse_object_mentions():
    words = (
        "a big red circle at the top left and to its right a small blue square in the top right"
    ).split()
    assert grounding.parse_object_mentions(words) == [
        Mention(3, "big", "red", "circle", "top left", start=1),
        Mention(15, "small", "blue", "square", "top right", start=13),
    ]
    assert grounding.parse_object_mentions("there is a white triangle at the bottom".split()) == [
        Mention(4, None, "white", "triangle", "bottom", start=3)
    ]
    assert grounding.parse_object_mentions(["green", "big", "diamond", "center", "circle"]) == [
        Mention(2, "big", "green", "diamond", "center", start=0),
        Mention(4, None, None, "circle", None, start=4),
    ]
    assert grounding.parse_object_mentions("the the small square right of".split()) == [
        Mention(3, "small", None, "square", "right", start=2)
    ]
    # A repeated size word is not part of the phrase.
    assert grounding.parse_object_mentions("a big big circle".split()) == [
        Mention(3, "big", None, "circle", None, start=2)
    ]


@pytest.mark.parametrize(
    "words",
    [[], ["<unk>"], ["circle"] * 3, ["at", "the"], [None, 3, b"square", "at"], None, "a circle"],
)
def test_parse_object_mentions_survives_garbage(words):
    mentions = grounding.parse_object_mentions(words)
    assert all(m.shape in ("circle", "square") for m in mentions)


OBJECTS = [
    {"box": [4, 4, 30, 30], "cell": 0, "location": "top left"},
    {"box": [80, 10, 94, 25], "cell": 2, "location": "top right"},
    {"box": [42, 80, 68, 106], "cell": 7, "location": "bottom"},
]
OBJECTS[0].update(shape="circle", color="red", size="big")
OBJECTS[1].update(shape="circle", color="red", size="small")
OBJECTS[2].update(shape="square", color="blue", size="big")


def _alphas(num_words, peaks):
    """(T, 196) maps with a one-hot peak at (row, col) of the 14x14 grid per word index."""
    alpha = np.full((num_words, 196), 1e-3)
    for t, (row, col) in peaks.items():
        alpha[t, row * 14 + col] = 1.0
    return alpha


@pytest.mark.parametrize(
    "caption, peaks, hits, phrase_hits, scored",
    [
        ("a big blue square at the bottom", {3: (11, 6)}, 1, 1, 1),
        ("a big blue square at the bottom", {3: (1, 1)}, 0, 0, 1),
        ("a red circle and a blue square", {2: (1, 1), 6: (11, 6)}, 1, 1, 1),
        ("a red circle at the top right", {2: (1, 10)}, 1, 1, 1),
        ("a red circle at the top right", {2: (1, 1)}, 0, 0, 1),
        ("a small red circle", {3: (1, 10)}, 1, 1, 1),
        ("a red circle at the top right", {2: (1, 9)}, 1, 1, 1),
        ("a red circle at the top right", {2: (1, 12)}, 0, 0, 1),
        ("a red circle at the top right", {2: (3, 10)}, 1, 1, 1),
        ("a red circle at the top right", {2: (4, 10)}, 0, 0, 1),
        ("a red circle at the center", {2: (1, 10)}, 0, 0, 0),
        ("a green triangle", {2: (1, 1)}, 0, 0, 0),
        (
            "a big red circle at the top left and a big blue square",
            {3: (1, 1), 12: (1, 1)},
            1,
            1,
            2,
        ),
        # The phrase's size or colour word looks at the object, its shape word elsewhere.
        ("a big blue square at the bottom", {1: (11, 6), 3: (1, 1)}, 0, 1, 1),
        ("a big blue square at the bottom", {2: (11, 6), 3: (1, 1)}, 0, 1, 1),
        # Words outside the phrase do not count, nor a look at another object.
        ("a big blue square at the bottom", {0: (11, 6), 3: (1, 1)}, 0, 0, 1),
        ("a big blue square at the bottom", {4: (11, 6), 3: (1, 1)}, 0, 0, 1),
        ("a red circle at the top right", {1: (1, 1), 2: (1, 1)}, 0, 0, 1),
    ],
)
def test_pointing_accuracy(caption, peaks, hits, phrase_hits, scored):
    words = caption.split()
    result = grounding.pointing_accuracy([words], [_alphas(len(words), peaks)], [OBJECTS])
    assert (result["hits"], result["phrase_hits"], result["scored"]) == (hits, phrase_hits, scored)
    assert result["pointing_accuracy"] == (hits / scored if scored else 0.0)
    assert result["phrase_pointing_accuracy"] == (phrase_hits / scored if scored else 0.0)


def test_pointing_accuracy_pools_captions_and_skips_words_past_alpha():
    first = "a big red circle at the top left and a big blue square at the bottom".split()
    second = "a small red circle and a big blue square".split()
    result = grounding.pointing_accuracy(
        [first, second],
        [_alphas(len(first), {3: (1, 1), 12: (11, 6)}), _alphas(4, {3: (0, 0)})],
        [OBJECTS, OBJECTS],
    )
    assert result == {
        "pointing_accuracy": 2 / 3,
        "hits": 2,
        "scored": 3,
        "phrase_pointing_accuracy": 2 / 3,
        "phrase_hits": 2,
    }


def test_pointing_accuracy_uses_the_grid():
    words = "a big blue square".split()
    alpha = np.zeros((4, 16))
    alpha[3, 3 * 4 + 1] = 1.0
    result = grounding.pointing_accuracy([words], [alpha], [OBJECTS], grid=(4, 4))
    assert result["hits"] == 1
    with pytest.raises(ValueError, match="196"):
        grounding.pointing_accuracy([words], [alpha], [OBJECTS])
    with pytest.raises(ValueError, match="same length"):
        grounding.pointing_accuracy([words], [alpha, alpha], [OBJECTS], grid=(4, 4))


@pytest.mark.parametrize(
    "caption, correct, total",
    [
        ("a big red circle at the top left", 1, 1),
        ("a red circle in the top right", 1, 1),
        ("a big red circle at the top right", 0, 1),
        ("a green circle at the top left", 0, 1),
        ("a blue square at the bottom and a triangle and a circle at the center", 1, 2),
        (
            "a big red circle at the top left and to its right a small red circle at the top "
            "and a blue square in the bottom",
            2,
            3,
        ),
        ("a square", 0, 0),
    ],
)
def test_location_accuracy(caption, correct, total):
    result = grounding.location_accuracy([caption.split()], [OBJECTS])
    assert result == {
        "location_accuracy": correct / total if total else 0.0,
        "correct": correct,
        "total": total,
    }
