"""Tests for sat_tf.evaluation.coco_grounding and scripts/grounding.py: hand-made COCO
annotations (coco_photos_test.py's, which reads them), photos and attention maps whose
scores are worked out by hand below."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from coco_photos_test import _write_coco
from fixtures import WORDS, tiny_model

from sat_tf.cli import grounding as grounding_cli
from sat_tf.config import Config
from sat_tf.data import image_io
from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation import coco_grounding as cg
from sat_tf.evaluation import coco_photos as cp
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import preset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEV_SET = os.environ.get(
    "SAT_TF_COCO_MINI", os.path.join(ROOT, "..", "shared", "data", "coco-mini-train")
)


# The two photos of coco_photos_test.ANNOTATIONS: photo 1 is 100 x 60 with two person
# boxes, [x 10..40, y 10..50] and [x 30..60, y 30..50], and a dog [x 60..100, y 0..25];
# photo 2 is 200 x 120 with a cat [x 0..100, y 0..120].
@pytest.fixture
def photos(tmp_path):
    _write_coco(str(tmp_path))
    return cp.load_coco_dir(str(tmp_path))


def test_visible_frame_whole_photo_and_centre_crop():
    np.testing.assert_array_equal(cg.visible_frame(100, 60, 40, 1.0), [0, 0, 100, 60])
    # 120 x 200 at 56 / 0.875 = 64: 64 x round(106.67) = 107, crop from row 4, column 25;
    # one resized pixel is 200 / 107 photo pixels across and 120 / 64 down.
    np.testing.assert_allclose(
        cg.visible_frame(200, 120, 56, 0.875),
        [25 * 200 / 107, 4 * 120 / 64, 81 * 200 / 107, 60 * 120 / 64],
    )


def test_visible_frame_is_where_resize_and_crop_puts_the_photo():
    """A white rectangle of the photo lands in the encoder's input where the frame says."""
    pixels = np.zeros((120, 200, 3), np.uint8)
    pixels[40:80, 100:140] = 255
    seen = image_io.resize_and_crop(pixels, 56, 0.875).numpy()[..., 0]
    x0, y0, x1, y1 = cg.visible_frame(200, 120, 56, 0.875)
    rows, cols = np.nonzero(seen > 127.5)
    # The rectangle's edges mapped into the 56 x 56 input, against the half-bright pixels.
    left, right = (np.array([100, 140]) - x0) / (x1 - x0) * 56
    top, bottom = (np.array([40, 80]) - y0) / (y1 - y0) * 56
    assert abs(cols.min() - left) < 1 and abs(cols.max() + 1 - right) < 1
    assert abs(rows.min() - top) < 1 and abs(rows.max() + 1 - bottom) < 1


def test_cells_and_exact_cover_on_a_3_by_4_grid():
    frame = np.array([0.0, 0.0, 100.0, 60.0])
    cells = cg.cell_rects(frame, (3, 4))  # cells of 25 x 20
    np.testing.assert_array_equal(cells[0], [0, 0, 25, 20])
    np.testing.assert_array_equal(cells[6], [50, 20, 75, 40])
    person_a = np.array([[10.0, 10, 40, 50]])
    # Centres x 12.5, 37.5, 62.5, 87.5 and y 10, 30, 50; box edges count as inside.
    np.testing.assert_array_equal(
        cg.centres_inside(cells, person_a), [1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0]
    )
    # Columns 0 and 1 hold 15 of 25 in x, rows 0 and 2 hold 10 of 20 in y, row 1 all.
    np.testing.assert_allclose(
        cg.covered_fractions(frame, (3, 4), person_a),
        [0.3, 0.3, 0, 0, 0.6, 0.6, 0, 0, 0.3, 0.3, 0, 0],
    )
    both = np.array([[10.0, 10, 40, 50], [30, 30, 60, 50]])
    covered = cg.covered_fractions(frame, (3, 4), both)
    # Cell (1, 1) [25..50] x [20..40]: A 300 + B 200 - overlap 100 = 400 of 500.
    assert covered[5] == pytest.approx(0.8)
    # Cell (1, 2) [50..75] x [20..40]: B alone, [50..60] x [30..40].
    assert covered[6] == pytest.approx(0.2)
    # Cell (2, 1) [25..50] x [40..60]: A 150 + B 200 - overlap 100 = 250 of 500.
    assert covered[9] == pytest.approx(0.5)
    # Union: 1200 + 600 - 200 = 1600 of the frame's 6000.
    assert covered.mean() == pytest.approx(1600 / 6000)
    # A box sticking out of the frame counts only inside it.
    outside = cg.covered_fractions(frame, (3, 4), np.array([[-50.0, -50, 25, 20]]))
    np.testing.assert_allclose(outside, [1] + [0] * 11)


def test_centre_cells():
    np.testing.assert_array_equal(cg.centre_cells((7, 7)), [24])
    np.testing.assert_array_equal(cg.centre_cells((3, 4)), [5, 6])
    np.testing.assert_array_equal(cg.centre_cells((14, 14)), [90, 91, 104, 105])


def test_edge_cells():
    # 3 x 4: only cells 5 and 6 are inside the ring; 7 x 7: the 25 inner cells are not.
    np.testing.assert_array_equal(np.flatnonzero(~cg.edge_cells((3, 4))), [5, 6])
    assert cg.edge_cells((7, 7)).sum() == 49 - 25
    assert cg.edge_cells((14, 14)).sum() == 52
    assert cg.edge_cells((2, 5)).all() and cg.edge_cells((1, 1)).all()


def _alpha(values, length=12):
    alpha = np.zeros(length)
    for cell, value in values.items():
        alpha[cell] = value
    return alpha


def test_score_word_by_hand():
    frame = np.array([0.0, 0.0, 100.0, 60.0])
    cells, person_a = cg.cell_rects(frame, (3, 4)), np.array([[10.0, 10, 40, 50]])
    scores = cg.score_word(_alpha({5: 0.5, 3: 0.5 - 1e-6, 0: 1e-6}), cells, person_a, frame, (3, 4))
    assert scores["hit"] == 1.0
    assert scores["mass"] == pytest.approx(0.5 * 0.6 + 1e-6 * 0.3)
    # Centre cells 5 (centre inside) and 6 (not); 6 of 12 centres inside; box 1200 of 6000.
    assert scores["centre"] == 0.5 and scores["random"] == 0.5
    assert scores["area_share"] == pytest.approx(0.2)
    # A tie between cell 5 (inside) and cell 3 (outside) counts half.
    tied = cg.score_word(_alpha({5: 0.4, 3: 0.4, 0: 0.2}), cells, person_a, frame, (3, 4))
    assert tied["hit"] == 0.5
    assert tied["mass"] == pytest.approx(0.4 * 0.6 + 0.2 * 0.3)
    missed = cg.score_word(_alpha({11: 1.0}), cells, person_a, frame, (3, 4))
    assert missed["hit"] == 0.0 and missed["mass"] == 0.0
    # Edge: cell 5 is inner, 3 and 11 on the ring; the tie of 5 and 3 counts half.
    assert (scores["edge"], tied["edge"], missed["edge"]) == (0.0, 0.5, 1.0)


def test_uniform_attention_scores_the_baselines(photos):
    geometry = cg.Geometry(40, 1.0, (3, 4))
    uniform = np.full((4, 12), 1 / 12, np.float32)
    result = cg.coco_grounding(photos[:1], [["a", "man", "and", "dog"]], [uniform], geometry)
    for row in result["scored"]:
        assert row["hit"] == row["random"]
        assert row["mass"] == pytest.approx(row["area_share"])
    assert result["hit"] == result["random"]


def test_none_attention_model_gives_uniform_alpha(photos):
    """A `none` model's alpha ties all cells, so its hit is the random baseline exactly."""
    config = Config(
        use_feature_cache=True,
        attention="none",
        embed_dim=8,
        hidden_dim=16,
        attention_dim=8,
        max_decode_length=6,
    )
    model = build_model(config, 20, (12, 8), grid=(3, 4))
    features = np.random.default_rng(0).normal(size=(1, 12, 8)).astype(np.float32)
    out = model.generate({"features": tf.constant(features)}, max_length=6, beam_size=2)
    # Row t made word t; the row after the last word made `<end>` (if it came).
    alpha = out.attention.numpy()[0, : int(out.length[0]) + 1]  # (n + 1, 12)
    assert np.all(alpha == alpha[:, :1])
    words = ["man", "dog"] * 3
    result = cg.coco_grounding(photos[:1], [words], [alpha], cg.Geometry(40, 1.0, (3, 4)))
    assert result["words"] == len(alpha)
    assert result["hit"] == result["random"]
    assert result["mass"] == pytest.approx(result["area_share"], abs=1e-6)


def test_coco_grounding_counts_and_categories(photos):
    geometry = cg.Geometry(40, 1.0, (3, 4))
    # Photo 1: "man" looks at cell 5 (person: hit), "dog" at cell 3 (the dog box holds the
    # centres of cells 2 and 3: hit), "cat" is absent from photo 1. Photo 2 (its left half
    # is cat; cells 50 x 40): "kitten" ties cells 0 and 9, both in columns 0-1; "people"
    # is absent; "dogs" is word 6 but alpha has 5 rows: absent comes first.
    captions = [
        ["a", "man", "with", "a", "dog", "and", "cat"],
        ["a", "kitten", "near", "people", "and", "big", "dogs"],
    ]
    one = np.stack(
        [_alpha({5: 1.0}), _alpha({5: 1.0}), _alpha({0: 1}), _alpha({0: 1}), _alpha({3: 1})]
        + [_alpha({0: 1})] * 2
    )
    two = np.stack([_alpha({0: 1})] + [_alpha({0: 0.5, 9: 0.5})] + [_alpha({0: 1})] * 3)
    result = cg.coco_grounding(photos, captions, [one, two], geometry)
    assert (result["photos"], result["photos_scored"], result["words"]) == (2, 2, 3)
    assert result["absent"] == 3
    assert [(r["image_id"], r["word"], r["category"], r["hit"]) for r in result["scored"]] == [
        (1, "man", "person", 1.0),
        (1, "dog", "dog", 1.0),
        (2, "kitten", "cat", 1.0),
    ]
    assert list(result["per_category"]) == ["cat", "dog", "person"]
    dog = result["per_category"]["dog"]
    # Dog box [60..100] x [0..25] against cells of 25 x 20: cell 3 inside, cell 2 for 15
    # of 25 across, cells 6 and 7 for 5 of 20 down; centres of cells 2 and 3 inside.
    assert dog["mass"] == pytest.approx(1.0)
    assert dog["random"] == pytest.approx(2 / 12)
    assert dog["centre"] == 0.0
    assert dog["area_share"] == pytest.approx(1000 / 6000)
    # The cat box covers the left half of photo 2: centres of columns 0 and 1.
    assert result["per_category"]["cat"]["random"] == 0.5
    assert result["hit"] == 1.0
    assert result["random"] == pytest.approx((0.5 + 2 / 12 + 0.5) / 3)
    # Off centre: the centre cells 5 and 6 hold person A (cell 5's centre, 37.5, 30) and
    # the cat (cell 5 of photo 2, centre 75, 60), not the dog: only "dog" is off centre.
    off = result["off_centre"]
    assert (off["words"], off["photos"], off["hit"], off["centre"]) == (1, 1, 1.0, 0.0)
    assert off["random"] == pytest.approx(2 / 12) and off["mass"] == pytest.approx(1.0)
    # Argmax cells 5 (inner), 3 (ring), 0 and 9 (ring): edge 2 of 3; ring 10 of 12 cells.
    assert result["edge"] == pytest.approx(2 / 3)
    assert result["edge_cells"] == pytest.approx(10 / 12)
    # Hit - centre per word: man 1 - 0.5 (cells 5 and 6 half each, 5 in the person box),
    # dog 1 - 0, kitten 1 - 0.5: mean 2/3. Resampled photos: (1, 1) gives 3/4, (2, 2)
    # 1/2, mixed 2/3, so the 95 % interval runs from 1/2 to 3/4.
    interval = result["hit_minus_centre"]
    assert interval["mean"] == pytest.approx(2 / 3) and interval["photos"] == 2
    assert (interval["low"], interval["high"]) == pytest.approx((0.5, 0.75))
    off_interval = off["hit_minus_random"]
    assert off_interval["photos"] == 1
    assert off_interval["low"] == off_interval["high"] == pytest.approx(5 / 6)
    assert off_interval["mean"] == pytest.approx(5 / 6)
    table = cg.format_table(result)
    assert (
        "Hit - centre: +0.667 (95 % interval +0.500 to +0.750, 1000 resamples of the 2 photos)"
        in table
    )
    assert "Off centre, hit - random: +0.833 (95 % interval +0.833 to +0.833" in table
    assert "outer ring: 0.667 of the scored words (the ring holds 0.833 of the cells)" in table
    assert "| **all** | 3 | 2 | 1.000 |" in table
    assert "| *off centre* | 1 | 1 | 1.000 | 0.000 | 0.167 | 1.000 | 0.167 |" in table


def _words(*photos):
    """Scored-word rows: per photo a list of (hit, centre)."""
    return [
        {"image_id": i, "hit": hit, "centre": centre}
        for i, words in enumerate(photos)
        for hit, centre in words
    ]


def test_photo_bootstrap_by_hand():
    # Photo 0: one word ahead of the centre by 1; photo 1: three words level. A resample
    # of two photos is (0, 0) -> 1 or (1, 1) -> 0 a quarter of the time each, and mixed
    # -> 1/4 words ahead -> 0.25 half of the time.
    rows = _words([(1.0, 0.0)], [(1.0, 1.0), (0.0, 0.0), (0.5, 0.5)])
    wide = cg.photo_bootstrap(rows, resamples=2000)
    assert wide["mean"] == 0.25 and wide["photos"] == 2 and wide["resamples"] == 2000
    assert (wide["low"], wide["high"]) == (0.0, 1.0)
    # The 30th and 70th percentiles both fall inside the mixed half.
    narrow = cg.photo_bootstrap(rows, resamples=2000, level=0.4)
    assert (narrow["low"], narrow["high"]) == (0.25, 0.25)
    # The same resamples for the same seed; words of equal difference leave no spread.
    assert cg.photo_bootstrap(rows, resamples=2000) == wide
    level = cg.photo_bootstrap(_words([(1.0, 0.5)], [(0.5, 0.0), (1.0, 0.5)]))
    assert level["mean"] == level["low"] == level["high"] == 0.5


def test_photo_bootstrap_weighs_words_and_resamples_photos():
    """The mean is over words (photo 0's two words count twice), and with many photos
    the interval narrows about as the square root of their number."""
    rows = _words([(1.0, 0.0), (1.0, 0.0)], [(0.0, 0.0)])
    assert cg.photo_bootstrap(rows)["mean"] == pytest.approx(2 / 3)
    rng = np.random.default_rng(1)
    spans = []
    for n in (25, 400):
        many = _words(*[[(float(rng.random() < 0.6), 0.5)] for _ in range(n)])
        interval = cg.photo_bootstrap(many)
        assert interval["low"] < interval["mean"] < interval["high"]
        spans.append(interval["high"] - interval["low"])
    # One word a photo, hit ~ Bernoulli(0.6): span ~ 2 * 1.96 * sqrt(0.24 / n).
    assert spans[0] == pytest.approx(3.92 * np.sqrt(0.24 / 25), rel=0.3)
    assert spans[1] == pytest.approx(3.92 * np.sqrt(0.24 / 400), rel=0.3)


def test_photo_bootstrap_refuses_bad_settings():
    assert cg.photo_bootstrap([]) is None
    with pytest.raises(ValueError, match="resamples >= 1"):
        cg.photo_bootstrap(_words([(1.0, 0.0)]), resamples=0)
    with pytest.raises(ValueError, match="0 < level < 1"):
        cg.photo_bootstrap(_words([(1.0, 0.0)]), level=1.0)


def test_crop_moves_the_cells(photos):
    """Photo 2 (200 x 120) centre-cropped at 0.875 shows x 46.73..151.40 only: on a 2 x 2
    grid the cat box (left half, x <= 100) covers all of column 0 and 0.93 px of column 1."""
    two = photos[1]
    whole = cg.coco_grounding(
        [two], [["cat"]], [_alpha({0: 1}, 4)[None]], cg.Geometry(56, 1.0, (2, 2))
    )
    crop = cg.coco_grounding(
        [two], [["cat"]], [_alpha({0: 1}, 4)[None]], cg.Geometry(56, 0.875, (2, 2))
    )
    assert whole["area_share"] == pytest.approx(0.5)
    x0, x1 = 25 * 200 / 107, 81 * 200 / 107
    assert crop["area_share"] == pytest.approx((100 - x0) / (x1 - x0))
    assert crop["mass"] == pytest.approx(1.0) and crop["random"] == 0.5


def test_no_scored_word_gives_no_rates(photos):
    result = cg.coco_grounding(
        photos,
        [["a", "cat"], []],
        [np.ones((2, 12)), np.ones((0, 12))],
        cg.Geometry(40, 1.0, (3, 4)),
    )
    assert (result["words"], result["absent"], result["hit"], result["mass"]) == (0, 1, None, None)
    assert (result["off_centre"]["words"], result["off_centre"]["hit"]) == (0, None)
    assert result["edge"] is None and result["edge_cells"] == pytest.approx(10 / 12)
    assert result["hit_minus_centre"] is None
    assert result["off_centre"]["hit_minus_random"] is None
    assert "| **all** | 0 | 0 | - | - | - | - | - |" in cg.format_table(result)


def test_attention_of_the_wrong_shape_is_refused(photos):
    with pytest.raises(ValueError, match=r"shape \(T, 12\)"):
        cg.coco_grounding(photos[:1], [["man"]], [np.ones((1, 49))], cg.Geometry(40, 1.0, (3, 4)))
    with pytest.raises(ValueError, match="one entry per photo"):
        cg.coco_grounding(photos, [["man"]], [np.ones((1, 12))], cg.Geometry(40, 1.0, (3, 4)))


@pytest.mark.skipif(
    not os.path.isdir(DEV_SET), reason=f"no COCO photos at {DEV_SET} (set SAT_TF_COCO_MINI)"
)
def test_script_on_the_shipped_preset(tmp_path, capsys):
    # In this process, through the command's main (as sat-grounding runs it).
    output = tmp_path / "grounding.json"
    args = [
        "sat-grounding",
        "--preset=flickr8k_lite0_soft",
        f"--coco_dir={DEV_SET}",
        "--num_photos=3",
        "--beam_size=1",
        f"--output={output}",
    ]
    code = grounding_cli.main(args)
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert "| **all** |" in out
    assert "Naming (present: a box): main-object recall" in out
    result = json.loads(output.read_text())
    named = result["naming"]
    assert named["photos"] == len(named["per_photo"]) == 3
    assert named["mentions"] == sum(len(p["named"]) for p in named["per_photo"])
    assert named["with_references"]["absent_mentions"] <= named["absent_mentions"]
    assert result["photos"] == len(result["captions"]) == 3
    assert result["geometry"] == {"image_size": 224, "crop_fraction": 1.0, "grid": [7, 7]}
    assert result["words"] == len(result["scored"])
    for row in result["scored"]:
        assert 0 <= row["hit"] <= 1 and 0 <= row["mass"] <= 1
        caption = next(c["caption"] for c in result["captions"] if c["image_id"] == row["image_id"])
        assert cp.SYNONYMS[row["word"]] == row["category"]
        assert row["word"].split()[-1] == caption.split()[row["index"]]
    refused = grounding_cli.main(args[:2] + ["--workdir=runs/x"])
    assert refused == 1
    assert "give exactly one of --workdir, --preset and --export" in capsys.readouterr().err


CAPTIONS = {
    "annotations": [
        # Photo 1 has persons and a dog: "man" and "dog" are scored; "cat" is absent;
        # "puppy" names a dog but is outside the model's vocabulary, so it is not scored.
        {"id": 1, "image_id": 1, "caption": "A man and a dog."},
        {"id": 2, "image_id": 1, "caption": "a cat and a puppy"},
        {"id": 3, "image_id": 2, "caption": "A big cat"},
        {"id": 4, "image_id": 99, "caption": "a dog"},  # not one of the photos
    ]
}


def test_reference_captions_of_a_none_model(tmp_path, capsys):
    """Teacher-forced on the human captions, a `none` model scores the random baseline
    on exactly the hand-counted words."""
    coco = tmp_path / "coco"
    _write_coco(str(coco))
    with open(coco / "annotations" / "captions_val2017.json", "w", encoding="utf-8") as f:
        json.dump(CAPTIONS, f)
    model, _, config = tiny_model(attention="none")
    words = [*vocab_lib.SPECIALS, "a", "man", "and", "dog", "cat", "big", "on", "the"]
    assert len(words) == len(WORDS)
    preset.save(model, vocab_lib.Vocab(words), config, str(tmp_path / "p"), name="p")
    output = tmp_path / "g.json"
    args = ["sat-grounding", f"--preset={tmp_path / 'p'}", f"--coco_dir={coco}"]
    code = grounding_cli.main([*args, "--captions=reference", f"--output={output}"])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert "teacher-forced on the human captions" in out
    result = json.loads(output.read_text())
    assert result["captions"][0] == {"image_id": 1, "file": "one.jpg", "caption": "a man and a dog"}
    assert (result["photos"], result["references"], len(result["captions"])) == (2, 3, 3)
    scored = [(r["image_id"], r["index"], r["word"]) for r in result["scored"]]
    assert scored == [(1, 1, "man"), (1, 4, "dog"), (2, 2, "cat")]
    assert result["absent"] == 1
    for row in result["scored"]:
        assert row["hit"] == row["random"]
        assert row["mass"] == pytest.approx(row["area_share"], abs=1e-6)

    for bad, message in [
        ("--beam_size=1", "leave out --beam_size=1"),
        ("--store_in_preset", "records the scores of generated captions only"),
    ]:
        assert grounding_cli.main([*args, "--captions=reference", bad]) == 1
        assert message in capsys.readouterr().err
    os.remove(coco / "annotations" / "captions_val2017.json")
    assert grounding_cli.main([*args, "--captions=reference"]) == 1
    assert "has no annotations/captions_val2017.json" in capsys.readouterr().err
