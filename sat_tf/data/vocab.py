"""Basic tokenization and the word vocabulary (paper §5.1).

Tokenization is the paper's "basic tokenization": Unicode case folding, punctuation,
symbols and Unicode separators replaced by spaces, split on whitespace. It runs as
tensorflow-text ops so that the input pipeline and vocabulary building share one
definition. TensorFlow and tensorflow-text load when a caption is tokenized or encoded:
reading a vocabulary file, its ids and words need neither (a process that captions with
LiteRT, `sat_tf.serving.litert`, never loads them).
"""

import collections
import functools
import hashlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from sat_tf.data.tokens import (  # noqa: F401 (the vocabulary's names for them)
    END,
    END_ID,
    NEVER_EMITTED,
    PAD,
    PAD_ID,
    SPECIALS,
    START,
    START_ID,
    UNK,
    UNK_ID,
)
from sat_tf.utils import files

if TYPE_CHECKING:
    import tensorflow as tf


@functools.cache
def _tokenizer():
    import tensorflow_text as tf_text

    return tf_text.WhitespaceTokenizer()


def tokenize(texts: "tf.Tensor") -> "tf.RaggedTensor":
    """Splits captions into words.

    Args:
      texts: string tensor of shape (N,).

    Returns:
      Ragged string tensor of shape (N, None): lowercase words without punctuation.
    """
    import tensorflow as tf
    import tensorflow_text as tf_text

    folded = tf_text.case_fold_utf8(texts)
    cleaned = tf.strings.regex_replace(folded, r"[\pP\pS\pZ\x{85}]", " ")
    return _tokenizer().tokenize(cleaned)


def tokenize_py(texts: Sequence[str]) -> list[list[str]]:
    """`tokenize` for Python strings; returns lists of Python words."""
    if not texts:
        return []
    import tensorflow as tf

    words = tokenize(tf.constant(list(texts), tf.string)).to_list()
    return [[w.decode("utf-8") for w in ws] for ws in words]


def _ranked_words(captions: Iterable[str], chunk: int) -> list[tuple[str, int]]:
    """(word, count) of the words of `captions` but the special tokens, most frequent
    first (ties: alphabetical); `chunk` captions are tokenized at a time."""
    counts = collections.Counter()
    batch = []
    for caption in captions:
        batch.append(caption)
        if len(batch) == chunk:
            counts.update(w for ws in tokenize_py(batch) for w in ws)
            batch = []
    counts.update(w for ws in tokenize_py(batch) for w in ws)
    for special in SPECIALS:
        counts.pop(special, None)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


class Vocab:
    """Word <-> id mapping with `<pad>`=0, `<start>`=1, `<end>`=2, `<unk>`=3.

    Args:
      words: every token in id order, starting with the four special tokens.
    """

    def __init__(self, words: Sequence[str]):
        words = list(words)
        if tuple(words[:4]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}, got {words[:4]}")
        if len(set(words)) != len(words):
            dupes = [w for w, n in collections.Counter(words).items() if n > 1]
            raise ValueError(f"duplicate vocabulary entries: {dupes[:5]}")
        self.words = words
        self._index = {w: i for i, w in enumerate(words)}
        self._table = None

    def __len__(self) -> int:
        return len(self.words)

    @property
    def fingerprint(self) -> str:
        """Short hash of the word list, stored with checkpoints to detect a mismatch."""
        return hashlib.sha256("\n".join(self.words).encode("utf-8")).hexdigest()[:16]

    @classmethod
    def build(cls, captions: Iterable[str], max_words: int = 10000, chunk: int = 4096) -> "Vocab":
        """Keeps the `max_words` most frequent words of `captions` (ties: alphabetical)."""
        ranked = _ranked_words(captions, chunk)[:max_words]
        return cls(list(SPECIALS) + [w for w, _ in ranked])

    def grow(self, captions: Iterable[str], min_count: int, chunk: int = 4096) -> "Vocab":
        """This vocabulary and, after its words, those of `captions` it lacks (`--init_from`
        a model of another vocabulary, `--new_word_min_count`).

        Args:
          captions: the training captions of the new data.
          min_count: a new word is added when it occurs at least this many times.
          chunk: captions tokenized at a time.

        Returns:
          a `Vocab` whose first words are this one's, with their ids; the new words
          follow as `build` ranks them (most frequent first, ties alphabetical).
        """
        if min_count < 1:
            raise ValueError(f"min_count={min_count} must be at least 1")
        ranked = _ranked_words(captions, chunk)
        new = [w for w, n in ranked if n >= min_count and w not in self._index]
        return type(self)(self.words + new)

    @classmethod
    def load(cls, path: str) -> "Vocab":
        """Reads a vocabulary file: one token per line, in id order."""
        try:
            with open(path, encoding="utf-8") as f:
                words = f.read().split("\n")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read vocabulary {path}: {e}") from e
        if words and words[-1] == "":
            words.pop()
        try:
            return cls(words)
        except ValueError as e:
            raise ValueError(f"vocabulary {path}: {e}") from e

    def save(self, path: str) -> None:
        """Writes one token per line, atomically (temp file + rename)."""
        files.write_text(path, "\n".join(self.words) + "\n")

    @property
    def table(self) -> "tf.lookup.StaticHashTable":
        """word -> id lookup table; unknown words map to `<unk>`."""
        if self._table is None:
            import tensorflow as tf

            init = tf.lookup.KeyValueTensorInitializer(
                tf.constant(self.words), tf.range(len(self.words), dtype=tf.int64)
            )
            self._table = tf.lookup.StaticHashTable(init, default_value=UNK_ID)
        return self._table

    def encode(self, texts: "tf.Tensor", max_words: int | None = None) -> "tf.RaggedTensor":
        """Captions -> ids framed as `<start> w1 .. wn <end>`.

        Args:
          texts: string tensor (N,).
          max_words: keep at most this many words (before framing).

        Returns:
          int32 ragged tensor (N, None).
        """
        return self.encode_words(tokenize(texts), max_words)

    def encode_words(
        self, words: "tf.RaggedTensor", max_words: int | None = None
    ) -> "tf.RaggedTensor":
        """`encode` for captions already split by `tokenize`: ragged string (N, None)."""
        import tensorflow as tf

        if max_words is not None:
            words = words[:, :max_words]
        ids = tf.ragged.map_flat_values(self.table.lookup, words)
        n = ids.nrows()
        start = tf.fill([n, 1], tf.constant(START_ID, tf.int64))
        end = tf.fill([n, 1], tf.constant(END_ID, tf.int64))
        return tf.cast(tf.concat([start, ids, end], axis=1), tf.int32)

    def ids(self, words: Sequence[str]) -> list[int]:
        return [self._index.get(w, UNK_ID) for w in words]

    def ids_present(self, words: Iterable[str]) -> tuple[int, ...]:
        """The sorted ids of those `words` the vocabulary holds (e.g. `BAD_ENDINGS`)."""
        return tuple(sorted(self._index[w] for w in words if w in self._index))

    def decode(self, ids: Iterable[int]) -> list[str]:
        """ids -> words, stopping at `<end>` and skipping `<pad>` and `<start>`."""
        words = []
        for i in np.asarray(list(ids)).tolist():
            if i == END_ID:
                break
            if i in (PAD_ID, START_ID):
                continue
            words.append(self.words[i] if 0 <= i < len(self.words) else UNK)
        return words
