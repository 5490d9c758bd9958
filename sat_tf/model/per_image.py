"""What beam search adds to the paper's decoding step for speed: each image's
annotations read once for all its hypotheses, and the step run only on the hypotheses
of the beam states (an image's k, or with a constraint each of its two sets of k) that
still hold a live one (`model/search.py`: `beam_search(constants=)`, and every beam
search for the second).

Beam search keeps S hypotheses of each image (S = k, or 2k with a constraint) in rows
b S + j. The paper's step reads its annotations `a` (B, L, D) and `W_a a` (B, L, A)
from the state, one copy per hypothesis; here they are the step's `constants`, one
copy per image, and `grouped_attention` makes the score and the context read image b's
copy for its S hypotheses in one product. The captions, tokens, log-probabilities and
attention maps are those of the paper's step (tests/per_image_test.py).
"""

import functools

import tensorflow as tf


def _grouped(x, images):
    """(B S, X) rows -> (B, S, X), B the leading dimension of `images`."""
    return tf.reshape(x, [tf.shape(images)[0], -1, x.shape[-1]])


def grouped_attention(score, attend):
    """`score` and `attend` of `step.attention_step` for N = B S hypotheses, S of each
    image in a row, over the annotations of B images given once each: the hypotheses'
    rows are grouped (B, S, .) for them, and their results flattened back to N rows."""

    def score_hypotheses(projected, score_in, h):
        score_in = None if score_in is None else _grouped(score_in, projected)
        scores, hidden = score(projected, score_in, _grouped(h, projected))  # (B, S, L)
        return tf.reshape(scores, [-1, scores.shape[-1]]), hidden

    def attend_hypotheses(alpha, log_alpha, features):
        log_alpha = None if log_alpha is None else _grouped(log_alpha, features)
        context, where = attend(_grouped(alpha, features), log_alpha, features)  # (B, S, D)
        where = None if where is None else tf.reshape(where, [-1])
        return tf.reshape(context, [-1, context.shape[-1]]), where

    return score_hypotheses, attend_hypotheses


def constants_apart(state):
    """(the decoder's state without the annotations, the annotations) of a state of B
    images: what the step reads of each image and never changes, kept apart so that
    beam search holds it once per image, not once per hypothesis. (state, None) for a
    decoder without attention."""
    if "projected" not in state:
        return state, None
    constants = {key: state[key] for key in ("features", "projected")}
    return {key: value for key, value in state.items() if key not in constants}, constants


def live_images_step(step, tokens, state, constants, live, group=None, images=None):
    """`step(tokens, state, constants)` on the hypotheses of the groups of `group` rows
    (`live`, bool (B, S), S a multiple of `group`: the k hypotheses of one beam state;
    None: S, an image's) that hold a live one, with the `constants` of each such group's
    image gathered once for it (`step(tokens, state)` for constants None). `images`
    (int (B,)): the index in `constants` of each row of `live` (None: its own).

    The other rows get log-probabilities and attention 0 and keep their state: a group
    without a live hypothesis has finished, or never started (the state of a constrained
    search that an image without constraint words skips), and beam search extends its
    hypotheses by `<pad>` alone or not at all whatever the step gives them, so skipping
    them changes no caption.

    Returns:
      (log_probs (B S, V), state of B S rows, alpha (B S, L)).
    """
    slots = tf.shape(live)[1]
    num_rows = tf.shape(live)[0] * slots
    group = live.shape[1] if group is None else group
    live_groups = tf.reduce_any(tf.reshape(live, [-1, group]), axis=1)  # (B S / group,)
    groups = tf.cast(tf.where(live_groups)[:, 0], tf.int32)  # (G',)
    rows = tf.reshape(groups[:, None] * group + tf.range(group)[None], [-1, 1])  # (G' group, 1)
    owner = groups // (slots // group)
    images_of = functools.partial(
        tf.gather, indices=owner if images is None else tf.gather(images, owner)
    )
    per_image = () if constants is None else (tf.nest.map_structure(images_of, constants),)
    log_probs, new_state, alpha = step(
        tf.gather_nd(tokens, rows),
        tf.nest.map_structure(lambda s: tf.gather_nd(s, rows), state),
        *per_image,
    )

    def scattered(old, new):
        merged = tf.tensor_scatter_nd_update(old, rows, new)
        merged.set_shape(old.shape)
        return merged

    return (
        tf.scatter_nd(rows, log_probs, [num_rows, tf.shape(log_probs)[1]]),
        tf.nest.map_structure(scattered, state, new_state),
        tf.scatter_nd(rows, alpha, [num_rows, tf.shape(alpha)[1]]),
    )
