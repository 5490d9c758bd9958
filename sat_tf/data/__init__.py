"""Data: dataset readers, the built-in shapes set, the vocabulary, image decoding, the
tf.data pipelines, and the feature cache's format and reader. Nothing here imports the
model, training, evaluation or the export (tests/layout_test.py checks it): running the
encoder over a dataset into the cache is `sat_tf/training/extract.py`."""
