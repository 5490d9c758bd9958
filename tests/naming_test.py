"""Tests for sat_tf.evaluation.naming: main-object recall and CHAIR counted by hand on
made-up photos, and on the human captions of ../shared/data/coco-mini-train."""

import os

import numpy as np
import pytest

from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation import coco_photos, naming
from sat_tf.evaluation.coco_photos import Photo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COCO_MINI = os.environ.get(
    "SAT_TF_COCO_MINI", os.path.join(ROOT, "..", "shared", "data", "coco-mini-train")
)


def _photo(image_id, **boxes):
    return Photo(
        image_id,
        f"{image_id}.jpg",
        100,
        100,
        {k.replace("_", " "): np.asarray(v, np.float64) for k, v in boxes.items()},
    )


# Photo 1: a dog (area 50 x 50 = 2500) and two persons (largest 40 x 60 = 2400): main dog.
# Photo 2: a dining table (80 x 50 = 4000) and a cup: main dining table.
# Photo 3: no boxes.
PHOTOS = [
    _photo(1, person=[[0, 0, 10, 10], [0, 0, 40, 60]], dog=[[50, 50, 100, 100]]),
    _photo(2, dining_table=[[10, 10, 90, 60]], cup=[[0, 0, 5, 5]]),
    _photo(3),
]


def test_main_category_is_the_largest_box():
    assert [naming.main_category(p) for p in PHOTOS] == ["dog", "dining table", None]


def test_naming_by_hand():
    captions = [
        "a man and his dog play with a dog".split(),  # person, dog, dog: none absent
        "a cat sits on a table next to a cup".split(),  # cat absent; table, cup present
        "a hot dog".split(),  # hot dog absent (not a dog); no main object
    ]
    result = naming.naming(PHOTOS, captions)
    # Main objects: dog named (photo 1), dining table named (photo 2); photo 3 has none.
    assert (result["with_objects"], result["main_named"]) == (2, 2)
    assert result["main_object_recall"] == 1.0
    # Mentions: 3 + 3 + 1 = 7, of which cat and hot dog are absent.
    assert (result["mentions"], result["absent_mentions"]) == (7, 2)
    assert result["chair_i"] == pytest.approx(2 / 7)
    assert (result["captions_with_absent"], result["chair_s"]) == (2, pytest.approx(2 / 3))
    assert result["absent_by_category"] == {"cat": 1, "hot dog": 1}
    assert result["per_photo"][1] == {
        "image_id": 2,
        "main": "dining table",
        "named": ["cat", "dining table", "cup"],
        "absent": ["cat"],
    }
    # Counting the cat as present (as a human caption naming it would) drops one.
    also = naming.naming(PHOTOS, captions, also_present={2: {"cat"}})
    assert (also["absent_mentions"], also["captions_with_absent"]) == (1, 1)


def test_missed_main_object_and_empty_rates():
    result = naming.naming(PHOTOS[:2], [["a", "man"], ["a", "cup"]])
    assert result["main_object_recall"] == 0.0
    assert result["main_by_category"] == {
        "dining table": {"photos": 1, "named": 0},
        "dog": {"photos": 1, "named": 0},
    }
    assert result["chair_i"] == 0.0 and result["chair_s"] == 0.0
    empty = naming.naming(PHOTOS[2:], [["a", "view"]])
    assert empty["main_object_recall"] is None and empty["chair_i"] is None
    assert empty["chair_s"] == 0.0
    text = naming.format_naming(result)
    assert "main-object recall 0.000 (0 of 2 photos)" in text
    assert "main object missed: dining table 1, dog 1" in text
    with pytest.raises(ValueError, match="one entry per photo"):
        naming.naming(PHOTOS, [["a"]])


@pytest.mark.skipif(
    not os.path.isdir(COCO_MINI), reason=f"no COCO photos at {COCO_MINI} (set SAT_TF_COCO_MINI)"
)
def test_human_captions_of_coco_mini_train():
    """The first human caption of each of the 80 photos names its largest object far
    more often than the Flickr8k captioner does, and rarely an object without a box."""
    photos = coco_photos.load_coco_dir(COCO_MINI)
    references = coco_photos.read_reference_captions(COCO_MINI, photos)
    first = vocab_lib.tokenize_py([references[p.image_id][0] for p in photos])
    result = naming.naming(photos, first)
    assert result["photos"] == result["with_objects"] == 80
    assert result["main_object_recall"] >= 0.6
    assert result["chair_i"] <= 0.25
    # Counting what the human captions name as present, their own mentions are present.
    also = naming.reference_categories(references)
    assert naming.naming(photos, first, also_present=also)["absent_mentions"] == 0
