"""The special tokens of every vocabulary and their ids; no TensorFlow, so that any
module can name them cheaply."""

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
# Never emitted by decoding: `<pad>` and `<start>` would misalign the words and the
# attention rows of a caption, and `<unk>` says nothing a reader can use.
NEVER_EMITTED = (PAD_ID, START_ID, UNK_ID)
# Words a caption may not end on: a caption ending on one is cut short ("a man riding a
# bike with a"). The list of self-critical.pytorch (ruotianluo, `bad_endings`), which
# reports how often sampled captions end on one after CIDEr optimisation; decoding can
# forbid `<end>` after them, and every evaluation reports the share of captions ending so.
BAD_ENDINGS = frozenset(
    ("a", "an", "the", "in", "for", "at", "of", "with", "before", "after", "on", "upon")
    + ("near", "to", "is", "are", "am")
)
