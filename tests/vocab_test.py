"""Tests for sat_tf.data.vocab: tokenization, building and growing, the vocabulary file,
encode and decode."""

import os

import hypothesis
import tensorflow as tf
from absl.testing import parameterized
from hypothesis import strategies as st

from sat_tf.data import vocab as vocab_lib
from sat_tf.data.vocab import SPECIALS, Vocab

WORDS = ["a", "dog", "runs", "école"]


def _vocab():
    """ids: <pad>=0 <start>=1 <end>=2 <unk>=3 a=4 dog=5 runs=6 école=7."""
    return Vocab(list(SPECIALS) + WORDS)


def _write(path, data):
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


class TokenizeTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("lowercase", "A Dog RUNS", ["a", "dog", "runs"]),
        ("non_ascii_case", "ÉCOLE Ärger ΣΟΦΙΑ Ñu", ["école", "ärger", "σοφια", "ñu"]),
        ("full_case_folding", "STRASSE Straße", ["strasse", "strasse"]),
        ("punctuation", 'a dog, a cat; (two!) "pets"...', ["a", "dog", "a", "cat", "two", "pets"]),
        ("inner_punctuation", "don't stop-me.now", ["don", "t", "stop", "me", "now"]),
        ("symbols", "5$ + 3€ = 8 ©x #tag @me ^_^", ["5", "3", "8", "x", "tag", "me"]),
        ("angle_brackets", "<end> <unk>", ["end", "unk"]),
        ("multiple_spaces", "  two   spaces\tand\ttabs\n\n", ["two", "spaces", "and", "tabs"]),
        ("unicode_spaces", "a\u00a0b\u3000c", ["a", "b", "c"]),
        ("next_line", "a\x85b", ["a", "b"]),
        ("line_separator", "a\u2028b\u2029c", ["a", "b", "c"]),
        ("ogham_space", "a\u1680b", ["a", "b"]),
        ("cjk_punctuation", "猫。犬、鳥", ["猫", "犬", "鳥"]),
        ("only_punctuation", "... !! ?", []),
        ("empty", "", []),
    )
    def test_tokenize(self, text, expected):
        self.assertEqual(vocab_lib.tokenize_py([text]), [expected])

    def test_tokenize_keeps_one_row_per_caption(self):
        words = vocab_lib.tokenize(tf.constant(["A b", "", "c, D e"]))
        self.assertIsInstance(words, tf.RaggedTensor)
        self.assertEqual(words.to_list(), [[b"a", b"b"], [], [b"c", b"d", b"e"]])

    def test_tokenize_py_of_nothing(self):
        self.assertEqual(vocab_lib.tokenize_py([]), [])


class BuildTest(tf.test.TestCase, parameterized.TestCase):
    CAPTIONS = [
        "Zebra apple, mango.",
        "zebra APPLE kiwi",
        "the zebra; the apple!",
        "mango kiwi fig",
        "the Zebra",
    ]
    # zebra 4, apple 3, the 3, kiwi 2, mango 2, fig 1: ties in code-point order.
    RANKED = ["zebra", "apple", "the", "kiwi", "mango", "fig"]

    @parameterized.parameters(1, 3, 6, 100)
    def test_keeps_most_frequent_with_ties_in_alphabetical_order(self, max_words):
        vocab = Vocab.build(self.CAPTIONS, max_words=max_words)
        self.assertEqual(vocab.words, list(SPECIALS) + self.RANKED[:max_words])
        self.assertEqual(len(vocab), 4 + min(max_words, 6))

    @parameterized.parameters(1, 2, 4)
    def test_counts_across_chunks(self, chunk):
        vocab = Vocab.build(iter(self.CAPTIONS), max_words=100, chunk=chunk)
        self.assertEqual(vocab.words, list(SPECIALS) + self.RANKED)

    def test_specials_keep_ids_0_to_3(self):
        vocab = Vocab.build(["<end> <end> <pad> x"])
        self.assertEqual(vocab.words[:4], ["<pad>", "<start>", "<end>", "<unk>"])
        self.assertEqual(
            (vocab_lib.PAD_ID, vocab_lib.START_ID, vocab_lib.END_ID, vocab_lib.UNK_ID),
            (0, 1, 2, 3),
        )
        self.assertEqual(vocab.words[4:], ["end", "pad", "x"])

    def test_no_captions(self):
        self.assertEqual(Vocab.build([]).words, list(SPECIALS))

    @parameterized.named_parameters(
        ("no_specials", ["a", "b"]),
        ("specials_out_of_order", ["<start>", "<pad>", "<end>", "<unk>", "a"]),
        ("duplicate", list(SPECIALS) + ["a", "b", "a"]),
    )
    def test_constructor_rejects(self, words):
        with self.assertRaises(ValueError):
            Vocab(words)


class GrowTest(tf.test.TestCase, parameterized.TestCase):
    # zebra 4, apple 3, the 3, kiwi 2, mango 2, fig 1 (BuildTest.CAPTIONS).
    SOURCE = [*SPECIALS, "mango", "dog", "apple"]

    @parameterized.parameters(
        (1, ["zebra", "the", "kiwi", "fig"]),
        (2, ["zebra", "the", "kiwi"]),
        (3, ["zebra", "the"]),
        (4, ["zebra"]),
        (5, []),
    )
    def test_appends_the_words_it_lacks_seen_min_count_times(self, min_count, new):
        grown = Vocab(self.SOURCE).grow(BuildTest.CAPTIONS, min_count)
        self.assertEqual(grown.words, self.SOURCE + new)
        # The source's words keep their ids; the new ones follow.
        self.assertEqual(grown.ids(["mango", "dog", "apple"]), [4, 5, 6])
        self.assertEqual(grown.ids(new), list(range(7, 7 + len(new))))

    @parameterized.parameters(1, 2, 100)
    def test_counts_across_chunks(self, chunk):
        grown = Vocab(self.SOURCE).grow(iter(BuildTest.CAPTIONS), 2, chunk=chunk)
        self.assertEqual(grown.words, self.SOURCE + ["zebra", "the", "kiwi"])

    def test_a_vocabulary_that_has_every_word_stays_the_same(self):
        built = Vocab.build(BuildTest.CAPTIONS)
        self.assertEqual(built.grow(BuildTest.CAPTIONS, 1).fingerprint, built.fingerprint)

    def test_tokenizes_as_the_pipeline_and_never_adds_a_special(self):
        grown = Vocab(list(SPECIALS)).grow(["<unk> Dog, DOG!", "dog <end>"], 2)
        # "<unk>" and "<end>" are the words "unk" and "end"; each occurs once.
        self.assertEqual(grown.words, [*SPECIALS, "dog"])

    def test_min_count_below_one_is_refused(self):
        with self.assertRaisesRegex(ValueError, "^min_count=0 must be at least 1$"):
            Vocab(self.SOURCE).grow(BuildTest.CAPTIONS, 0)


class FileTest(tf.test.TestCase, parameterized.TestCase):
    def test_save_writes_one_token_per_line(self):
        path = os.path.join(self.get_temp_dir(), "vocab.txt")
        _vocab().save(path)
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data, "<pad>\n<start>\n<end>\n<unk>\na\ndog\nruns\nécole\n".encode())
        self.assertEqual(os.listdir(os.path.dirname(path)), ["vocab.txt"])

    def test_round_trip(self):
        path = os.path.join(self.get_temp_dir(), "vocab.txt")
        vocab = Vocab.build(BuildTest.CAPTIONS + ["Ünïcödé ok"])
        vocab.save(path)
        loaded = Vocab.load(path)
        self.assertEqual(loaded.words, vocab.words)
        self.assertEqual(loaded.fingerprint, vocab.fingerprint)

    def test_load_accepts_windows_line_ends(self):
        path = _write(os.path.join(self.get_temp_dir(), "crlf.txt"), "\r\n".join(_vocab().words))
        self.assertEqual(Vocab.load(path).words, _vocab().words)

    @parameterized.named_parameters(
        ("no_specials", b"a\ndog\n"),
        ("specials_out_of_order", b"<start>\n<pad>\n<end>\n<unk>\na\n"),
        ("duplicates", b"<pad>\n<start>\n<end>\n<unk>\ndog\na\ndog\n"),
        ("empty", b""),
        ("not_utf8", b"<pad>\n<start>\n<end>\n<unk>\ncaf\xe9\n"),
    )
    def test_load_bad_file_names_it(self, data):
        path = _write(os.path.join(self.get_temp_dir(), "bad_vocab.txt"), data)
        with self.assertRaisesRegex(ValueError, "bad_vocab.txt"):
            Vocab.load(path)

    def test_load_names_duplicate_word(self):
        path = _write(
            os.path.join(self.get_temp_dir(), "dup.txt"), "\n".join(_vocab().words + ["dog"])
        )
        with self.assertRaisesRegex(ValueError, r"dup\.txt.*dog"):
            Vocab.load(path)

    def test_load_unreadable_names_it(self):
        missing = os.path.join(self.get_temp_dir(), "missing_vocab.txt")
        with self.assertRaisesRegex(ValueError, "missing_vocab.txt"):
            Vocab.load(missing)
        folder = os.path.join(self.get_temp_dir(), "a_folder")
        os.makedirs(folder, exist_ok=True)
        with self.assertRaisesRegex(ValueError, "a_folder"):
            Vocab.load(folder)


class EncodeDecodeTest(tf.test.TestCase, parameterized.TestCase):
    def test_encode_frames_and_maps_unknown_words(self):
        ids = _vocab().encode(tf.constant(["A dog runs.", "a CAT runs", "", "École!"]))
        self.assertEqual(ids.dtype, tf.int32)
        self.assertEqual(ids.to_list(), [[1, 4, 5, 6, 2], [1, 4, 3, 6, 2], [1, 2], [1, 7, 2]])

    @parameterized.parameters(
        (None, [1, 5, 5, 5, 5, 6, 2]),
        (6, [1, 5, 5, 5, 5, 6, 2]),
        (5, [1, 5, 5, 5, 5, 6, 2]),
        (3, [1, 5, 5, 5, 2]),
        (1, [1, 5, 2]),
        (0, [1, 2]),
    )
    def test_encode_truncates_words_before_framing(self, max_words, expected):
        ids = _vocab().encode(tf.constant(["dog dog dog dog runs", "a"]), max_words=max_words)
        self.assertEqual(ids.to_list()[0], expected)
        self.assertEqual(ids.to_list()[1], [1, 4, 2] if max_words != 0 else [1, 2])

    def test_encode_splits_on_every_unicode_space(self):
        ids = _vocab().encode(tf.constant(["a\u2028dog\x85runs\u1680école"]))
        self.assertEqual(ids.to_list(), [[1, 4, 5, 6, 7, 2]])

    def test_caption_text_cannot_produce_special_ids(self):
        ids = _vocab().encode(tf.constant(["<end> <pad> <start> dog"])).to_list()[0]
        self.assertEqual(ids, [1, 3, 3, 3, 5, 2])

    @parameterized.named_parameters(
        ("stops_at_end", [1, 4, 5, 2, 6, 6], ["a", "dog"]),
        ("skips_pad_and_start", [1, 0, 4, 1, 0, 5, 2, 0], ["a", "dog"]),
        ("no_end", [4, 6, 7], ["a", "runs", "école"]),
        ("end_first", [2, 4], []),
        ("unk", [3, 5], ["<unk>", "dog"]),
        ("out_of_range", [8, 99, -1], ["<unk>", "<unk>", "<unk>"]),
        ("empty", [], []),
    )
    def test_decode(self, ids, expected):
        vocab = _vocab()
        self.assertEqual(vocab.decode(ids), expected)
        self.assertEqual(vocab.decode(tf.constant(ids, tf.int32)), expected)

    def test_ids(self):
        self.assertEqual(_vocab().ids(["dog", "zebra", "a"]), [5, 3, 4])

    def test_fingerprint(self):
        base = Vocab(list(SPECIALS) + ["a", "bc"])
        self.assertLen(base.fingerprint, 16)
        self.assertEqual(base.fingerprint, Vocab(list(SPECIALS) + ["a", "bc"]).fingerprint)
        for other in (["a", "bd"], ["bc", "a"], ["ab", "c"], ["a", "bc", "d"]):
            self.assertNotEqual(base.fingerprint, Vocab(list(SPECIALS) + other).fingerprint, other)


def _texts():
    """Any text, with whitespace, punctuation and combining marks drawn more often.

    Lone surrogates (category Cs) are left out: they are not Unicode scalar values, no
    UTF-8 file holds them, and no string tensor can.
    """
    tricky = st.sampled_from(" \t\n\r\x85\xa0\u1680\u2028\u2029\u3000.,!-'\u0301ßİΣ")
    characters = st.characters(blacklist_categories=("Cs",))
    return st.text(st.one_of(characters, tricky), max_size=20)


class PropertyTest(tf.test.TestCase):
    @hypothesis.settings(max_examples=60, deadline=None, database=None)
    @hypothesis.given(st.lists(_texts(), min_size=1, max_size=4), _texts())
    def test_encode_decode_arbitrary_text(self, captions, text):
        vocab = Vocab.build(captions, max_words=5)
        ids = vocab.encode(tf.constant([text])).to_list()[0]
        self.assertEqual((ids[0], ids[-1]), (1, 2))
        self.assertTrue(all(4 <= i < len(vocab) or i == 3 for i in ids[1:-1]), ids)

        words = vocab.words[4:]
        round_trip = vocab.encode(tf.constant([" ".join(words)])).to_list()[0]
        self.assertEqual(vocab.decode(round_trip), words)

    @hypothesis.settings(max_examples=30, deadline=None, database=None)
    @hypothesis.given(st.lists(_texts(), min_size=1, max_size=4))
    def test_file_round_trip_arbitrary_words(self, captions):
        vocab = Vocab.build(captions)
        path = os.path.join(self.get_temp_dir(), "vocab.txt")
        vocab.save(path)
        self.assertEqual(Vocab.load(path).words, vocab.words)


if __name__ == "__main__":
    tf.test.main()
