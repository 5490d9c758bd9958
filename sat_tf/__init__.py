"""Show, Attend and Tell (Xu et al., 2015) in TensorFlow 2 / Keras 3."""

__version__ = "0.1.0"
