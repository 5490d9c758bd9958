"""Tests for sat_tf.pipelines.caption_rows: the row of a caption from its fields and from the
export's outputs, the row of a refused photo."""

import json

import numpy as np
import pytest

from sat_tf.pipelines import caption_rows


def outputs(**changes):
    """One photo's outputs of `serving_default` (numpy values), as the export gives them."""
    row = {
        "caption": np.bytes_(b"a red circle"),
        "tokens": np.array([4, 7, 9, 2, 0, 0], np.int32),
        "length": np.int32(3),
        "log_prob": np.float32(-2.5),
        "attention": np.zeros((6, 2, 2), np.float32),
        "tag": np.bytes_(b""),
        "tag_prob": np.float32(0.0),
        "captions": np.array([b"a red circle", b"a circle", b""], object),
        "log_probs": np.array([-2.5, -3.25, -np.inf], np.float32),
        "status": np.int32(0),
        "error": np.bytes_(b""),
    }
    return {**row, **changes}


def test_a_caption_row_holds_what_the_model_has():
    assert caption_rows.caption_row("a.jpg", "a cat", np.array([4, 5]), np.float32(-1.5)) == {
        "path": "a.jpg",
        "caption": "a cat",
        "tokens": [4, 5],
        "score": -1.5,
    }
    row = caption_rows.caption_row("a.jpg", "a cat", [4], -1.0, None, 0.25, 3.5, True)
    assert row["tag"] is None and row["tag_prob"] == 0.25
    assert (row["off_world_score"], row["off_world"]) == (3.5, True)
    json.dumps(row)  # plain Python values only


def test_export_row_without_a_tag_table():
    assert caption_rows.export_row("a.jpg", outputs()) == {
        "path": "a.jpg",
        "caption": "a red circle",
        "tokens": [4, 7, 9],
        "score": -2.5,
    }


def test_export_row_with_tags_and_off_world_statistics():
    used = caption_rows.export_row(
        "a.jpg",
        outputs(
            tag=np.bytes_(b"circle"),
            tag_prob=np.float32(0.75),
            off_world_score=np.float32(12.0),
            off_world=np.bool_(True),
        ),
    )
    assert (used["tag"], used["tag_prob"]) == ("circle", 0.75)
    assert (used["off_world_score"], used["off_world"]) == (12.0, True)
    unused = caption_rows.export_row("a.jpg", outputs(tag_prob=np.float32(0.125)))
    assert (unused["tag"], unused["tag_prob"]) == (None, 0.125)


def test_a_row_of_several_captions():
    row = caption_rows.caption_row(
        "a.jpg", "a cat", [4, 5], -1.5, captions=[("a cat", np.float32(-1.5)), ("cats", -2.0)]
    )
    assert row["captions"] == [
        {"caption": "a cat", "score": -1.5},
        {"caption": "cats", "score": -2.0},
    ]
    assert "captions" not in caption_rows.caption_row("a.jpg", "a cat", [4, 5], -1.5)
    json.dumps(row)


def test_export_row_of_several_captions_takes_those_the_export_has():
    two = caption_rows.export_row("a.jpg", outputs(), num_captions=2)
    assert two["captions"] == [
        {"caption": "a red circle", "score": -2.5},
        {"caption": "a circle", "score": -3.25},
    ]
    assert (two["caption"], two["score"]) == ("a red circle", -2.5)
    # The third place is empty ("" and -inf): left out.
    assert (
        caption_rows.export_row("a.jpg", outputs(), num_captions=3)["captions"] == two["captions"]
    )
    assert "captions" not in caption_rows.export_row("a.jpg", outputs())
    with pytest.raises(ValueError, match="4 captions a photo: the export gives 3 .its beam size."):
        caption_rows.export_row("a.jpg", outputs(), num_captions=4)


def test_export_row_of_a_refused_photo_names_the_file():
    refused = outputs(status=np.int32(1), error=np.bytes_(b"image_bytes[7] is empty (0 bytes)"))
    assert caption_rows.export_row("dir/e.jpg", refused) == {
        "path": "dir/e.jpg",
        "error": "dir/e.jpg is empty (0 bytes)",
        "status": 1,
    }


def test_a_path_with_backslashes_is_named_as_it_is():
    # A replacement template would read `\1` as a group and `\x` as an escape.
    for path in (r"C:\photos\1\x.jpg", r"s3://bucket/a\g<0>.jpg", "dir/\\"):
        refused = outputs(status=np.int32(2), error=np.bytes_(b"image_bytes[0] is not an image"))
        assert caption_rows.export_row(path, refused)["error"] == f"{path} is not an image"
