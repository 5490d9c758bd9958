"""A learned location prior for the attention scores (not in the paper).

A score layer of `model/attention.py` built with `location=True` also learns one vector
per cell, p_i, added to its projection (`W_a a_i + p_i`): the score can then prefer places
as well as content. It joins the once-per-image projection, so the step and its
hand-written backward pass are unchanged and p_i gets its gradient through the
projection's.
"""

import tensorflow as tf


def build(layer, features_shape):
    """Creates `layer.location_embedding`, (L, units) zeros, when `layer.location`."""
    if not layer.location:
        return
    cells = features_shape[-2]
    if cells is None:
        raise ValueError(
            f"{layer.name}: location=True learns one vector per cell and needs the number "
            "of cells L when it is built; got features of shape "
            f"{tuple(features_shape)}"
        )
    layer.location_embedding = layer.add_weight(
        shape=(cells, layer.units), initializer="zeros", name="location"
    )


def add(layer, projected):
    """`projected` (B, L, units) plus the layer's per-cell vectors, when it has them."""
    if not layer.location:
        return projected
    cells = layer.location_embedding.shape[0]
    if projected.shape[-2] is not None and projected.shape[-2] != cells:
        raise ValueError(
            f"{layer.name}: the location vectors were built for {cells} cells; the "
            f"features have {projected.shape[-2]}"
        )
    return projected + tf.cast(layer.location_embedding, projected.dtype)
