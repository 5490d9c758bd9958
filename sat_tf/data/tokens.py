"""The special tokens of every vocabulary and their ids; no TensorFlow, so that any
module can name them cheaply."""

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
