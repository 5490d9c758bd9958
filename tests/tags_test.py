"""Tests for sat_tf.serving.tags (the tagger and the tag table's format): a hand-made
ImageNet head whose tag is worked out by hand, and the shipped preset's table (the tag
table's builder, its WordNet walk on made-up synsets: build_tag_table_test.py)."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf
from fixtures import WORDS as FIXTURE_WORDS
from fixtures import scenes, tiny_model
from PIL import Image

from sat_tf import Captioner
from sat_tf.data import vocab as vocab_lib
from sat_tf.serving import exporting, inference, preset, tags
from sat_tf.serving.tags import TagRow

WORDS = [*vocab_lib.SPECIALS, "a", "dog", "cat", "bus"]  # dog 5, cat 6, bus 7; no "dogs"


def _tagger():
    """Three classes on D = 2: logits (x0, x1, 0); classes 0 and 1 say "dog", class 2
    nothing."""
    rows = [TagRow(0, "n1", "dog|dogs", "pug", ""), TagRow(1, "n2", "dog", "collie", "")]
    rows.append(TagRow(2, "n3", "", "altar", ""))
    kernel = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], np.float32)
    return tags.Tagger.from_rows(rows, vocab_lib.Vocab(WORDS), kernel, np.zeros(3, np.float32))


def test_tag_is_the_sum_of_its_classes_by_hand():
    # Image 0: mean feature (ln 2, ln 1) -> probabilities (2, 1, 1) / 4: dog 0.75.
    # Image 1: mean feature (0, 0) -> (1, 1, 1) / 3: dog 2 / 3.
    features = np.zeros((2, 2, 2), np.float32)
    features[0, :, 0] = [0.0, 2 * np.log(2.0)]
    tag, prob = _tagger()(tf.constant(features))
    assert list(tag.numpy()) == [0, 0]  # the one tag, "dog"
    np.testing.assert_allclose(prob.numpy(), [0.75, 2 / 3], rtol=1e-6)
    mask, tag, _ = _tagger().constraint(tf.constant(features), 0.7)
    assert list(tag.numpy()) == [5, -1]
    expected = np.zeros((2, len(WORDS)), bool)
    expected[0, 5] = True
    np.testing.assert_array_equal(mask.numpy(), expected)


def test_table_round_trip_and_damage(tmp_path):
    rows = [TagRow(0, "n01", "dog", "pug", "by hand"), TagRow(1, "n02", "", "altar", "")]
    path = str(tmp_path / "tags.tsv")
    tags.write_table(path, rows)
    assert tags.read_table(path) == rows
    with open(path, "a", encoding="utf-8") as f:
        f.write("5\tn03\tcat\tcat\t\n")
    with pytest.raises(ValueError, match="line 4: expected class 2"):
        tags.read_table(path)


def test_shipped_preset_tags():
    folder = preset.resolve("flickr8k_lite0_grid14_soft")
    rows = tags.read_table(os.path.join(folder, tags.TAGS_FILE))
    assert [r.index for r in rows] == list(range(1000))
    by_name = {r.name: r.word for r in rows}
    assert by_name["tabby"] == "cat|cats" and by_name["espresso"] == "coffee"
    assert by_name["school bus"] == "bus" and by_name["golden retriever"].startswith("dog|")
    assert by_name["mountain bike"].startswith("bicycle|bike|")
    assert by_name["lion"] == ""  # a big cat is no cat
    vocab = vocab_lib.Vocab.load(os.path.join(folder, preset.VOCAB_FILE))
    tagger = tags.load_tagger(folder, vocab, "efficientnet_lite0_head_dilated")
    assert tagger.kernel.shape == (1280, 1000)
    assert {vocab.words[i] for i in tagger.tag_ids} == {
        r.word.split("|")[0] for r in rows if r.word
    }
    cat = list(tagger.tag_ids).index(vocab.words.index("cat"))
    assert {vocab.words[i] for i in np.flatnonzero(tagger.spellings[cat])} == {"cat", "cats"}
    assert tags.load_tagger(folder, vocab, "vgg19") is None


def _tiny_with_tagger(threshold):
    """fixtures.tiny_model with a tagger whose one class, "circle", is certain for every
    photo (one class: its softmax is 1) when `threshold` <= 1."""
    model, vocab, config = tiny_model()
    vocab = vocab_lib.Vocab(FIXTURE_WORDS)
    depth = model.feature_dim
    rows = [TagRow(0, "n0", "circle", "circle", "")]
    model.tagger = tags.Tagger.from_rows(rows, vocab, np.zeros((depth, 1)), np.zeros(1))
    return model, vocab, dataclasses.replace(config, tag_threshold=threshold, beam_size=2)


def test_caption_fn_and_export_say_the_tag():
    images = tf.constant(scenes(0, 4).astype(np.float32))
    model, vocab, config = _tiny_with_tagger(0.5)
    circle = FIXTURE_WORDS.index("circle")
    plain = inference.make_caption_fn(model, dataclasses.replace(config, tags=False))
    tagged = inference.make_caption_fn(model, config)
    without, out = plain({"image": images}), tagged({"image": images})
    assert list(without.tag.numpy()) == [-1] * 4 and list(out.tag.numpy()) == [circle] * 4
    np.testing.assert_allclose(out.tag_prob.numpy(), 1.0)
    for tokens, length in zip(out.tokens.numpy(), out.length.numpy(), strict=True):
        assert circle in tokens[:length]
    plain_tokens, plain_lengths = without.tokens.numpy(), without.length.numpy()
    assert not all(circle in t[:n] for t, n in zip(plain_tokens, plain_lengths, strict=True))
    # The export's signatures decode the same way and name the tag.
    spec = exporting.export_spec(model, model.encoder, config)
    assert spec.tag_threshold == 0.5
    serve = exporting.serving_functions(model, model.encoder, vocab, spec)["caption_images"][0]
    result = serve(tf.constant(scenes(0, 4)))
    assert [t.decode() for t in result["tag"].numpy()] == ["circle"] * 4
    np.testing.assert_array_equal(result["tokens"].numpy(), out.tokens.numpy())
    model.tagger = None
    assert exporting.export_spec(model, model.encoder, config).tag_threshold is None


def test_a_photo_of_a_cat_is_captioned_as_a_cat(tmp_path):
    """A real photo (scikit-image's Chelsea, a cat) through the shipped grid preset from
    a file: the ImageNet head names a cat, so the caption must say "cat"."""
    data = pytest.importorskip("skimage.data")
    path = str(tmp_path / "chelsea.png")
    Image.fromarray(data.chelsea()).save(path)
    captioner = Captioner.from_preset("flickr8k_lite0_grid14_soft")
    (caption,) = captioner.caption(path)
    assert caption.tag == "cat", (caption.tag, caption.tag_prob, caption.text)
    assert caption.tag_prob >= captioner.config.tag_threshold
    assert "cat" in caption.words, caption.text
