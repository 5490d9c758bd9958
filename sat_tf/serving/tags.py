"""Tags: what the encoder's own ImageNet head sees in a photo, as a caption word.

The EfficientNet-Lite encoders were trained as ImageNet classifiers: the `top_activation`
map, averaged over its cells, then one dense layer to 1000 classes. The annotation
vectors a_i of a `*_head` encoder are that map (paper §3.1.1), so the mean of the a_i is
the vector the classifier reads; with the dilated head (output stride 16) the same
weights see each cell's neighbourhood at twice the resolution, and the classifier keeps
its top class on nearly every photo (BUILD_NOTES.md). A preset's tag table
(`TAGS_FILE`) names a caption word for some classes; a word's probability is the sum
of its classes' (the 118 dog breeds all say "dog"). The most probable word is the photo's
tag. Where its probability reaches a threshold, constrained beam search
(`search.beam_search(constraint=...)`, Anderson et al., 2017) makes the caption say it.

The tag table is `tags.tsv`, one line per output of the encoder's ImageNet head, in
output order, five tab-separated fields: the class index, its WordNet id, the caption
word (empty when the class names nothing the captions say; "dog|dogs|puppy": the tag,
then other words that say it), the class's ImageNet name, and how the word was found
(`sat-build-tag-table` writes it; its docstring says how).
"""

import csv
import os
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from sat_tf.backbones import efficientnet_lite

TAGS_FILE = "tags.tsv"
_HEADER = ("class", "wnid", "word", "imagenet_name", "how")


class TagRow(NamedTuple):
    index: int
    wnid: str
    word: str
    name: str
    how: str


def write_table(path: str, rows: list[TagRow]) -> None:
    """Writes the rows as a tag table (a header line, then one line per class)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(_HEADER)
        writer.writerows(rows)


def read_table(path: str) -> list[TagRow]:
    """The rows of a tag table, checked to number its classes 0, 1, ... in order.

    Raises:
      ValueError: naming the file and line that is not a row of a tag table.
    """
    with open(path, encoding="utf-8", newline="") as f:
        lines = list(csv.reader(f, delimiter="\t"))
    if not lines or tuple(lines[0]) != _HEADER:
        raise ValueError(f"{path} is not a tag table: its first line must be {_HEADER}")
    rows = []
    for number, fields in enumerate(lines[1:], start=2):
        if len(fields) != len(_HEADER) or fields[0] != str(len(rows)):
            raise ValueError(f"{path}, line {number}: expected class {len(rows)} and 5 fields")
        rows.append(TagRow(int(fields[0]), *fields[1:]))
    return rows


# Encoders whose annotation vectors are the input of an ImageNet head: name -> variant.
HEAD_ENCODERS = {
    "efficientnet_lite0_head": "lite0",
    "efficientnet_lite0_head_dilated": "lite0",
    "efficientnet_lite2_head": "lite2",
}


class Tagger:
    """An ImageNet head and a class -> tag table, run in the graph on features.

    Args:
      kernel: float32 (D, C), the head's dense weights.
      bias: float32 (C,).
      class_tags: int (C,), per class the index of its tag, -1 for none.
      tag_ids: int (S,), the vocabulary id of each tag's word.
      spellings: bool (S, V), the words that say each tag (a disjunctive constraint).
    """

    def __init__(self, kernel, bias, class_tags, tag_ids, spellings):
        self.kernel = np.asarray(kernel, np.float32)
        self.bias = np.asarray(bias, np.float32)
        class_tags = np.asarray(class_tags, np.int64)
        self.tag_ids = np.asarray(tag_ids, np.int32)
        self.spellings = np.asarray(spellings, bool)
        # (C, S): 1 where a class names a tag; a row of zeros for a class without one.
        self.to_tags = np.zeros([len(class_tags), len(self.tag_ids)], np.float32)
        named = np.flatnonzero(class_tags >= 0)
        self.to_tags[named, class_tags[named]] = 1.0

    @classmethod
    def from_rows(cls, rows, vocab, kernel, bias):
        """A tagger of a tag table's rows (`word` "dog|dogs|puppy": the tag, then other
        words that say it), keeping the words that `vocab` holds."""
        ids = {word: i for i, word in enumerate(vocab.words)}
        said = {}
        for row in rows:
            words = [w for w in row.word.split("|") if w in ids]
            if words:
                said.setdefault(words[0], set()).update(words)
        tags = sorted(said)
        where = {tag: i for i, tag in enumerate(tags)}
        spellings = np.zeros([len(tags), len(vocab)], bool)
        for tag, words in said.items():
            spellings[where[tag], [ids[w] for w in words]] = True
        class_tags = [where.get(row.word.split("|")[0], -1) for row in rows]
        return cls(kernel, bias, class_tags, [ids[t] for t in tags], spellings)

    def __call__(self, features):
        """The tag of each photo.

        Args:
          features: (B, L, D) annotation vectors.

        Returns:
          (tag index int32 (B,) into `tag_ids`, its probability float32 (B,)).
        """
        pooled = tf.reduce_mean(tf.cast(features, tf.float32), axis=1)  # (B, D)
        probs = tf.nn.softmax(tf.matmul(pooled, self.kernel) + self.bias)  # (B, C)
        tag_probs = tf.matmul(probs, self.to_tags)  # (B, S)
        return tf.argmax(tag_probs, axis=1, output_type=tf.int32), tf.reduce_max(tag_probs, 1)

    def constraint(self, features, threshold):
        """(bool (B, V) constraint of `search.beam_search`, tag (B,), probability (B,)):
        a photo whose tag has at least `threshold` probability must say one of its words;
        tag is the vocabulary id of the tag's word, -1 for the others."""
        best, prob = self(features)
        confident = prob >= threshold
        tag = tf.where(confident, tf.gather(self.tag_ids, best), -1)
        mask = tf.logical_and(confident[:, None], tf.gather(self.spellings, best))
        return mask, tag, prob


def load_tagger(directory, vocab, encoder):
    """The tagger of a preset folder: its tag table and its encoder's ImageNet head (read
    from the installed weights, as the encoder's are). None where the folder has no tag
    table or the encoder has no ImageNet head."""
    path = os.path.join(directory, TAGS_FILE)
    if encoder not in HEAD_ENCODERS or not os.path.isfile(path):
        return None
    rows = read_table(path)
    state = efficientnet_lite.state_dict(
        efficientnet_lite.imagenet_weights_path(HEAD_ENCODERS[encoder])
    )
    kernel = state["_fc.weight"].T  # (D, C)
    bias = state["_fc.bias"]
    if kernel.shape[1] != len(rows):
        raise ValueError(
            f"{path} has {len(rows)} classes; the head of {encoder} has {kernel.shape[1]}"
        )
    return Tagger.from_rows(rows, vocab, kernel, bias)
