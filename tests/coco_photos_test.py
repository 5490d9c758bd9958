"""Tests for sat_tf.evaluation.coco_photos: the COCO categories and their synonyms, the
mentions of a caption's words, and COCO instance annotations read into photos (bad,
unreadable and missing files named) from hand-made annotations."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from sat_tf.evaluation import coco_photos as cp
from sat_tf.evaluation.coco_photos import Mention

# Photo 1 is 100 x 60 with two person boxes and a dog; photo 2 is 200 x 120 with a cat.
# Person A [x 10..40, y 10..50], person B [x 30..60, y 30..50] (they overlap in
# [30..40] x [30..50]), dog [x 60..100, y 0..25], cat [x 0..100, y 0..120].
PERSON_A, PERSON_B = [10, 10, 30, 40], [30, 30, 30, 20]


ANNOTATIONS = {
    "images": [
        {"id": 1, "file_name": "one.jpg", "width": 100, "height": 60},
        {"id": 2, "file_name": "two.png", "width": 200, "height": 120},
    ],
    "annotations": [
        {"id": 10, "image_id": 1, "category_id": 1, "bbox": PERSON_A, "iscrowd": 0},
        {"id": 11, "image_id": 1, "category_id": 1, "bbox": PERSON_B, "iscrowd": 1},
        {"id": 12, "image_id": 1, "category_id": 18, "bbox": [60, 0, 40, 25], "iscrowd": 0},
        {"id": 13, "image_id": 2, "category_id": 17, "bbox": [0, 0, 100, 120], "iscrowd": 0},
    ],
    "categories": [
        {"id": 1, "name": "person"},
        {"id": 17, "name": "cat"},
        {"id": 18, "name": "dog"},
    ],
}


def _write_coco(folder, annotations=ANNOTATIONS, name="val2017"):
    """A COCO folder: annotations/instances_<name>.json and flat grey photos in <name>/."""
    os.makedirs(os.path.join(folder, "annotations"), exist_ok=True)
    os.makedirs(os.path.join(folder, name), exist_ok=True)
    path = os.path.join(folder, "annotations", f"instances_{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(annotations, f)
    for im in annotations["images"]:
        pixels = np.full((im["height"], im["width"], 3), 128, np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, name, im["file_name"]))
    return path


def test_synonyms_name_coco_categories():
    assert len(cp.COCO_CATEGORIES) == len(set(cp.COCO_CATEGORIES)) == 80
    assert set(cp.SYNONYMS.values()) <= set(cp.COCO_CATEGORIES)
    for name in set(cp.COCO_CATEGORIES) - {"orange"}:
        assert cp.SYNONYMS[name] == name
    assert all(len(key.split()) <= 2 for key in cp.SYNONYMS)
    for word, category in [
        ("woman", "person"),
        ("kids", "person"),
        ("players", "person"),
        ("puppy", "dog"),
        ("dogs", "dog"),
        ("bikes", "bicycle"),
        ("motorbike", "motorcycle"),
        ("table", "dining table"),
        ("oranges", "orange"),
    ]:
        assert cp.SYNONYMS[word] == category
    # A colour far more often than the fruit; glass is windows as often as a wine glass.
    assert "orange" not in cp.SYNONYMS and "glass" not in cp.SYNONYMS


def test_category_mentions_match_phrases_before_words():
    words = "a man and a puppy eat a hot dog at the dining table near a teddy bear".split()
    assert cp.category_mentions(words) == [
        Mention(1, "man", "person"),
        Mention(4, "puppy", "dog"),
        Mention(8, "hot dog", "hot dog"),
        Mention(12, "dining table", "dining table"),
        Mention(16, "teddy bear", "teddy bear"),
    ]
    assert cp.category_mentions("a bear on a dirt bike and a bike".split()) == [
        Mention(1, "bear", "bear"),
        Mention(5, "dirt bike", "motorcycle"),
        Mention(8, "bike", "bicycle"),
    ]
    assert cp.category_mentions(["an", "orange", "shirt"]) == []
    assert cp.category_mentions([]) == []


def test_read_instances(tmp_path):
    _write_coco(str(tmp_path))
    one, two = cp.load_coco_dir(str(tmp_path))
    assert (one.image_id, one.width, one.height) == (1, 100, 60)
    assert one.path == os.path.join(str(tmp_path), "val2017", "one.jpg")
    assert sorted(one.boxes) == ["dog", "person"]
    # [x, y, w, h] -> [x0, y0, x1, y1]; the crowd box counts too.
    np.testing.assert_array_equal(one.boxes["person"], [[10, 10, 40, 50], [30, 30, 60, 50]])
    np.testing.assert_array_equal(one.boxes["dog"], [[60, 0, 100, 25]])
    assert list(two.boxes) == ["cat"]


def _broken(**changes):
    data = json.loads(json.dumps(ANNOTATIONS))
    for key, value in changes.items():
        section, index, field = key.split("__")
        data[section][int(index)][field] = value
    return data


@pytest.mark.parametrize(
    "annotations, message",
    [
        (_broken(annotations__0__bbox=[1, 2, 3]), r"annotations\[0\]: bbox \[1, 2, 3\]"),
        (_broken(annotations__1__bbox=[0, 0, -1, 5]), r"annotations\[1\]: bbox"),
        (_broken(annotations__2__category_id=99), r"category_id 99, not in categories"),
        (_broken(annotations__3__image_id=7), r"image_id 7, not in images"),
        (_broken(images__1__width="wide"), r"images\[1\] has id 2, width 'wide'"),
        ({"images": [], "categories": []}, r"has no list 'annotations'"),
        ({**ANNOTATIONS, "categories": [{"id": 1}]}, r"categories\[0\] lacks name"),
        ([1, 2], "holds a list, not an object"),
    ],
)
def test_bad_annotations_name_the_file(tmp_path, annotations, message):
    path = _write_coco(str(tmp_path), ANNOTATIONS)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(annotations, f)
    with pytest.raises(ValueError, match=message) as error:
        cp.load_coco_dir(str(tmp_path))
    assert path in str(error.value)


def test_unreadable_or_missing_files_are_named(tmp_path):
    path = _write_coco(str(tmp_path))
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"images": [')
    with pytest.raises(ValueError, match="cannot be read as JSON") as error:
        cp.load_coco_dir(str(tmp_path))
    assert path in str(error.value)
    with pytest.raises(ValueError, match="does not exist"):
        cp.read_instances(str(tmp_path / "nothing.json"), str(tmp_path))
    _write_coco(str(tmp_path))
    os.remove(tmp_path / "val2017" / "two.png")
    with pytest.raises(ValueError, match=r"(?s)1 photo\(s\) .* missing .*two.png"):
        cp.load_coco_dir(str(tmp_path))
    with pytest.raises(ValueError, match="does not exist"):
        cp.load_coco_dir(str(tmp_path / "elsewhere"))
    _write_coco(str(tmp_path), name="train2017")
    with pytest.raises(ValueError, match="one annotations/instances_\\*.json, found 2"):
        cp.load_coco_dir(str(tmp_path))


def test_photo_turned_by_exif_is_refused(tmp_path):
    _write_coco(str(tmp_path))
    image = Image.new("RGB", (100, 60))
    exif = image.getexif()
    exif[0x0112] = 6  # turned 90 degrees clockwise when shown upright
    image.save(tmp_path / "val2017" / "one.jpg", exif=exif)
    with pytest.raises(ValueError, match=r"1 photo\(s\) .* EXIF orientation .*one.jpg"):
        cp.load_coco_dir(str(tmp_path))
