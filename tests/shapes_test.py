"""Tests for the shapes dataset generator."""

import collections
import itertools
import json
import os
import re
from unittest import mock

import numpy as np
import pytest
from PIL import Image

from sat_tf.data import shapes
from sat_tf.evaluation import grounding

LOCATION_NAMES = [
    "top left",
    "top",
    "top right",
    "left",
    "center",
    "right",
    "bottom left",
    "bottom",
    "bottom right",
]
PALETTE = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (230, 220, 40),
    "white": (235, 235, 235),
}


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    path = shapes.generate(str(out), seed=3, num_train=20, num_val=6, num_test=6)
    return str(out), _load(path)


@pytest.fixture(scope="module")
def large_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes_large")
    path = shapes.generate(str(out), seed=7, num_train=300, num_val=0, num_test=0)
    return _load(path)


def _file_bytes(directory):
    result = {}
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                result[os.path.relpath(os.path.join(root, name), directory)] = f.read()
    return result


def test_generation_is_deterministic(tmp_path):
    kwargs = dict(num_train=6, num_val=2, num_test=2)
    shapes.generate(str(tmp_path / "a"), seed=11, **kwargs)
    shapes.generate(str(tmp_path / "b"), seed=11, **kwargs)
    shapes.generate(str(tmp_path / "c"), seed=12, **kwargs)
    a, b, c = (_file_bytes(tmp_path / d) for d in "abc")
    assert len(a) == 11
    assert a == b
    assert a["dataset_shapes.json"] != c["dataset_shapes.json"]
    assert a["images/00000.png"] != c["images/00000.png"]


def test_existing_dataset_is_reused_and_other_params_regenerate(tmp_path):
    path = shapes.generate(str(tmp_path), seed=1, num_train=4, num_val=1, num_test=1)
    mtime = os.stat(path).st_mtime_ns
    assert shapes.generate(str(tmp_path), seed=1, num_train=4, num_val=1, num_test=1) == path
    assert os.stat(path).st_mtime_ns == mtime

    os.remove(tmp_path / "images" / "00002.png")
    shapes.generate(str(tmp_path), seed=1, num_train=4, num_val=1, num_test=1)
    assert os.path.exists(tmp_path / "images" / "00002.png")

    with mock.patch.object(shapes.logging, "warning") as warning:
        shapes.generate(str(tmp_path), seed=1, num_train=5, num_val=1, num_test=1)
    # Replacing a dataset of other settings names what changed (a run still reading the
    # folder would read the new images).
    warning.assert_called_once()
    assert "num_train 4 -> 5" in warning.call_args[0][0] % warning.call_args[0][1:]
    assert "seed" not in warning.call_args[0][2]
    data = _load(path)
    assert len(data["images"]) == 7
    assert data["params"]["num_train"] == 5
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_karpathy_format(small_set):
    out, data = small_set
    assert data["dataset"] == "shapes"
    images = data["images"]
    assert [im["split"] for im in images] == ["train"] * 20 + ["val"] * 6 + ["test"] * 6
    assert [im["imgid"] for im in images] == list(range(32))
    sentids = []
    for im in images:
        assert im["filename"] == f"{im['imgid']:05d}.png"
        path = os.path.join(out, im["filepath"], im["filename"])
        with Image.open(path) as img:
            assert img.mode == "RGB" and img.size == (112, 112)
        assert im["image_size"] == 112
        assert len(im["sentences"]) == 5
        assert im["sentids"] == [s["sentid"] for s in im["sentences"]]
        for s in im["sentences"]:
            assert s["imgid"] == im["imgid"]
            assert re.fullmatch(r"[a-z]+( [a-z]+)*", s["raw"])
            assert s["tokens"] == s["raw"].split(" ")
        sentids += im["sentids"]
    assert sorted(sentids) == list(range(32 * 5))


def test_load_objects(small_set, tmp_path):
    out, data = small_set
    objects = shapes.load_objects(os.path.join(out, "dataset_shapes.json"))
    assert sorted(objects, key=int) == [str(i) for i in range(32)]
    assert objects["7"] == data["images"][7]["objects"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [{"imgid": 0}]}')
    with pytest.raises(ValueError, match="bad.json"):
        shapes.load_objects(str(bad))


def test_objects_sit_in_distinct_cells_inside_the_image(large_set):
    counts = collections.Counter()
    for im in large_set["images"]:
        objs = im["objects"]
        counts[len(objs)] += 1
        cells = [o["cell"] for o in objs]
        assert cells == sorted(set(cells))
        for o in objs:
            x0, y0, x1, y1 = o["box"]
            assert 0 <= x0 < x1 <= 112 and 0 <= y0 < y1 <= 112
            centre_cell = 3 * int((y0 + y1) / 2 * 3 // 112) + int((x0 + x1) / 2 * 3 // 112)
            assert centre_cell == o["cell"]
            assert o["location"] == LOCATION_NAMES[o["cell"]]
            assert o["shape"] in ("circle", "square", "triangle", "diamond")
            assert o["color"] in PALETTE
            width = x1 - x0
            assert (20 <= width <= 30) if o["size"] == "big" else (10 <= width <= 17)
        for a, b in itertools.combinations(objs, 2):
            ax0, ay0, ax1, ay1 = a["box"]
            bx0, by0, bx1, by1 = b["box"]
            assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0
    assert set(counts) == {1, 2, 3, 4}
    assert 0.01 <= counts[1] / 300 <= 0.12


def test_boxes_match_drawn_pixels(small_set):
    out, data = small_set
    for im in data["images"]:
        with Image.open(os.path.join(out, "images", im["filename"])) as img:
            pixels = np.asarray(img).astype(int)
        bright = pixels.max(axis=-1) > 120
        inside = np.zeros_like(bright)
        for o in im["objects"]:
            x0, y0, x1, y1 = o["box"]
            box = bright[y0:y1, x0:x1]
            inside[y0:y1, x0:x1] = True
            assert box.mean() >= 0.4
            assert box.any(axis=0).all() and box.any(axis=1).all()
            mean = pixels[y0:y1, x0:x1][box].mean(axis=0)
            nearest = min(PALETTE, key=lambda c: np.sum((np.array(PALETTE[c]) - mean) ** 2))
            assert nearest == o["color"]
        assert not (bright & ~inside).any()
        assert pixels[~inside].max() < 100


def test_most_images_share_a_colour_or_shape(large_set):
    shared = sum(
        any(
            a["color"] == b["color"] or a["shape"] == b["shape"]
            for a, b in itertools.combinations(im["objects"], 2)
        )
        for im in large_set["images"]
    )
    assert shared / 300 >= 0.7


def test_captions_name_every_object_in_reading_order(large_set):
    for im in large_set["images"]:
        objs = im["objects"]
        plain = " and ".join(
            f"a {o['size']} {o['color']} {o['shape']} at the {o['location']}" for o in objs
        )
        assert im["sentences"][0]["raw"] == plain
        for s in im["sentences"]:
            pos = -1
            for o in objs:
                found = [
                    m.start()
                    for prep in ("at", "in")
                    for m in re.finditer(
                        rf"\b{o['size']} {o['color']} {o['shape']} {prep} the {o['location']}\b",
                        s["raw"],
                    )
                    if m.start() > pos
                ]
                assert found, (s["raw"], o)
                pos = min(found)


def test_relations_are_true_and_plain_phrasing_is_most_frequent(large_set):
    phrasings = collections.Counter()
    words = collections.Counter()
    lengths = []
    for im in large_set["images"]:
        for s in im["sentences"]:
            raw = s["raw"]
            words.update(s["tokens"])
            lengths.append(len(s["tokens"]))
            phrasings[
                (raw.startswith("there is"), " in the " in raw, "to its" in raw or "below" in raw)
            ] += 1
            mentions = grounding.parse_object_mentions(s["tokens"])
            for k in range(1, len(mentions)):
                between = " ".join(s["tokens"][mentions[k - 1].index + 1 : mentions[k].index])
                before, after = im["objects"][k - 1]["cell"], im["objects"][k]["cell"]
                if "to its right" in between:
                    assert before // 3 == after // 3 and before < after
                if "below it" in between:
                    assert before // 3 < after // 3
    plain = phrasings[(False, False, False)]
    assert all(plain > n for key, n in phrasings.items() if key != (False, False, False))
    assert len(words) < 60
    assert max(lengths) <= 40


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_train=-1), "num_train"),
        (dict(num_val=-2), "num_val"),
        (dict(num_test=1.5), "num_test"),
        (dict(image_size=40), "image_size"),
        (dict(seed=-1), "seed"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, name):
    with pytest.raises(ValueError, match=name):
        shapes.generate(str(tmp_path), **kwargs)
    assert not os.path.exists(tmp_path / "images")


@pytest.mark.parametrize("image_size", [48, 64, 97])
def test_other_image_sizes(tmp_path, image_size):
    path = shapes.generate(
        str(tmp_path), num_train=30, num_val=0, num_test=0, image_size=image_size
    )
    for im in _load(path)["images"]:
        assert im["image_size"] == image_size
        for o in im["objects"]:
            x0, y0, x1, y1 = o["box"]
            assert 0 <= x0 < x1 <= image_size and 0 <= y0 < y1 <= image_size
