"""CIDEr-D (Vedantam et al., 2015) of one caption at a time, with document frequencies
fixed in advance: the reward of self-critical training (Rennie et al., 2017).

coco-caption's scorer (`pycocoevalcap.cider`) takes its document frequencies from the
references of the captions it scores, and cooks every reference again on every call.
Here the document frequencies come from a reference corpus given once (the training
references, one document per image) and each image's references are cooked once, so
that scoring a caption costs only its own n-grams. The arithmetic is coco-caption's,
including its quirks (raw n-gram counts as term frequencies, the length of the
Gaussian penalty counted in bigrams, sigma 6, x10): with the document frequencies of the
scored set's own references, `CiderD.score` equals `pycocoevalcap.cider.Cider`'s
per-image score (tests/cider_test.py).

Tokens may be words or ids; the document frequencies of an id corpus are saved as npz.
"""

import math
import os
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from sat_tf.utils import files

NGRAM_ORDER = 4
SIGMA = 6.0


def ngram_counts(tokens: Sequence[Hashable], n: int = NGRAM_ORDER) -> Counter:
    """{n-gram tuple: count} of every 1..n-gram of `tokens` (coco-caption's `precook`)."""
    tokens = tuple(tokens)
    return Counter(tokens[i : i + k] for k in range(1, n + 1) for i in range(len(tokens) - k + 1))


class CiderD:
    """CIDEr-D against fixed document frequencies.

    Args:
      document_frequency: {n-gram tuple: number of documents (images) whose references
        hold it}.
      num_documents: number of documents the frequencies were counted over.
      n: highest n-gram order.
      sigma: width of the Gaussian length penalty.
    """

    def __init__(self, document_frequency, num_documents, n=NGRAM_ORDER, sigma=SIGMA):
        if num_documents < 1:
            raise ValueError(f"CIDEr-D needs at least one document, got {num_documents}")
        self.document_frequency = document_frequency
        self.num_documents = num_documents
        self.n = n
        self.sigma = sigma
        self._log_documents = math.log(float(num_documents))

    @classmethod
    def from_references(cls, references: Iterable[Sequence[Sequence[Hashable]]], **kwargs):
        """Counts document frequencies over `references`: per image, its reference token
        sequences (one document per image, as coco-caption counts)."""
        frequency, documents = Counter(), 0
        for refs in references:
            documents += 1
            frequency.update({g for ref in refs for g in ngram_counts(ref, kwargs.get("n", 4))})
        return cls(dict(frequency), documents, **kwargs)

    def cook(self, tokens):
        """The tf-idf vector of a token sequence: ({n-gram: weight}, (n,) norms, length
        as coco-caption counts it: the number of bigrams)."""
        vector, norms, length = {}, np.zeros(self.n), 0
        for gram, count in ngram_counts(tokens, self.n).items():
            df = math.log(max(1.0, self.document_frequency.get(gram, 0.0)))
            weight = float(count) * (self._log_documents - df)
            vector[gram] = weight
            norms[len(gram) - 1] += weight * weight
            if len(gram) == 2:
                length += count
        return vector, np.sqrt(norms), length

    def cook_references(self, references: Iterable[Sequence[Sequence[Hashable]]]) -> list:
        """Cooks each image's references once, for `score`."""
        return [[self.cook(ref) for ref in refs] for refs in references]

    def score(self, tokens: Sequence[Hashable], cooked_refs) -> float:
        """CIDEr-D of one caption against one image's cooked references (x10, as
        coco-caption reports it)."""
        vector, norms, length = self.cook(tokens)
        total = np.zeros(self.n)
        for ref_vector, ref_norms, ref_length in cooked_refs:
            sims = np.zeros(self.n)
            for gram, weight in vector.items():
                ref_weight = ref_vector.get(gram, 0.0)
                sims[len(gram) - 1] += min(weight, ref_weight) * ref_weight
            both = (norms != 0) & (ref_norms != 0)
            sims[both] /= norms[both] * ref_norms[both]
            delta = float(length - ref_length)
            total += sims * np.e ** (-(delta**2) / (2 * self.sigma**2))
        return float(np.mean(total) / len(cooked_refs) * 10.0)

    def save(self, path: str) -> None:
        """Writes the document frequencies of an id corpus as npz (atomically)."""
        grams = list(self.document_frequency)
        padded = np.full((len(grams), self.n), -1, np.int64)
        for i, gram in enumerate(grams):
            padded[i, : len(gram)] = gram
        counts = np.array([self.document_frequency[g] for g in grams], np.int64)
        with files.atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(
                    f,
                    ngrams=padded,
                    counts=counts,
                    num_documents=self.num_documents,
                    sigma=self.sigma,
                )

    @classmethod
    def load(cls, path: str) -> "CiderD":
        """Reads what `save` wrote."""
        try:
            with np.load(path) as saved:
                padded, counts = saved["ngrams"], saved["counts"]
                documents, sigma = int(saved["num_documents"]), float(saved["sigma"])
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"cannot read CIDEr-D document frequencies {path}: {e}") from e
        frequency = {
            tuple(int(t) for t in row if t >= 0): int(c)
            for row, c in zip(padded.tolist(), counts.tolist(), strict=True)
        }
        return cls(frequency, documents, n=padded.shape[1], sigma=sigma)


def cached(path: str, references: Sequence[Sequence[Sequence[int]]]) -> CiderD:
    """`CiderD.from_references(references)` read from `path` when it is there, else
    computed and written there (where the directory allows; the scorer is returned
    either way)."""
    if os.path.exists(path):
        return CiderD.load(path)
    scorer = CiderD.from_references(references)
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        scorer.save(path)
    except OSError:
        pass
    return scorer


class Rewarder:
    """CIDEr-D of sampled id sequences against the references of a fixed image list: the
    reward of self-critical training, called from the graph through `tf.numpy_function`.

    `<end>` is part of every caption: a sampled caption's tokens run up to and including
    its `<end>` (when it emitted one) and every reference ends with it, so a caption cut
    short loses the n-grams that end a sentence (self-critical.pytorch does the same).

    Args:
      scorer: the `CiderD` with the training corpus's document frequencies.
      references: per image (in the order of the image indices the graph passes), its
        reference id sequences, `<end>` included.
      end_id: the id of `<end>`.
    """

    def __init__(self, scorer: CiderD, references, end_id: int):
        self.scorer = scorer
        self.end_id = end_id
        self.cooked = scorer.cook_references(references)

    def _caption(self, row):
        row = row.tolist()
        if self.end_id in row:
            return row[: row.index(self.end_id) + 1]
        return [t for t in row if t != 0]

    def __call__(self, tokens, image_index):
        """(N,) float32 CIDEr-D of each row of `tokens` (N, T) against the references of
        image `image_index[i]`; `<pad>` (0) after `<end>` is ignored."""
        return np.array(
            [
                self.scorer.score(self._caption(row), self.cooked[int(i)])
                for row, i in zip(np.asarray(tokens), np.asarray(image_index), strict=True)
            ],
            np.float32,
        )
