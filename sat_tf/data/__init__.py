"""Data: dataset readers, the built-in shapes set, the vocabulary, image decoding, the
tf.data pipelines and the feature cache. Nothing here imports the model."""
