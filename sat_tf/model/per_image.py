"""What beam search adds to the paper's decoding step for speed: each image's
annotations read once for all its hypotheses, and the step run only on the hypotheses
of the beam states (an image's k, or with a constraint each of its two sets of k) that
still hold a live one, until an image's captions are settled (`model/search.py`:
`beam_search(constants=)`, and every beam search for the others).

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


def on_live_images(advance, live, per_row, books, constraint):
    """`advance(images, per_row, books, constraint)`, beam search's step of some images
    (`search.beam_search`), on the B' images that hold a live hypothesis (`live`, bool
    (B, S)), their rows of `per_row` (tensors of B S rows) and `books` (of B) gathered,
    and its results put back: the other images are left as they are, as each step would
    only extend their hypotheses by `<pad>`, each in its own slot.

    Returns:
      (per_row, books, alpha (B, S, L): 0 for the others, parent (B, S): each its own).
    """
    shape = tf.shape(live)
    images = tf.cast(tf.where(tf.reduce_any(live, axis=1))[:, 0], tf.int32)  # (B',)
    at = images[:, None]
    rows = tf.reshape(images[:, None] * shape[1] + tf.range(shape[1])[None], [-1, 1])
    new_rows, new_books, alpha, parent = advance(
        images,
        tf.nest.map_structure(lambda x: tf.gather_nd(x, rows), per_row),
        tf.nest.map_structure(lambda x: tf.gather(x, images), books),
        None if constraint is None else tf.gather(constraint, images),
    )

    def put(where):
        def update(old, new):
            merged = tf.tensor_scatter_nd_update(old, where, new)
            merged.set_shape(old.shape)
            return merged

        return update

    return (
        tf.nest.map_structure(put(rows), per_row, new_rows),
        tf.nest.map_structure(put(at), books, new_books),
        tf.scatter_nd(at, alpha, tf.concat([shape, tf.shape(alpha)[2:]], 0)),
        put(at)(tf.broadcast_to(tf.range(shape[1]), shape), parent),
    )


def attention_history(alphas, parents, steps, max_length):
    """(B, S, T, L) attention of each final hypothesis at every step, from the alpha
    written at each step t < `steps` and the parent each hypothesis came from (`alphas`,
    `parents`: TensorArrays of (B, S, L) and (B, S)); zeros from `steps` on.

    Beam search keeps these instead of gathering a (B, S, T, L) history by parent at
    every step, work that grows with T: walking the parents back from the last step
    picks the same alphas. Every array has `max_length` elements, so that XLA compiles it.
    """

    def back(t, slot, history):
        def walked():
            alpha = tf.gather(alphas.read(t), slot, batch_dims=1)
            return alpha, tf.gather(parents.read(t), slot, batch_dims=1)

        def after_the_end():
            return tf.zeros(tf.concat([tf.shape(slot), [alphas.element_shape[-1]]], 0)), slot

        alpha, slot = tf.cond(t < steps, walked, after_the_end)
        return t - 1, slot, history.write(t, alpha)

    shape = tf.shape(parents.read(0))
    _, _, history = tf.while_loop(
        lambda t, *unused: t >= 0,
        back,
        (
            tf.constant(max_length - 1),
            tf.broadcast_to(tf.range(shape[1]), shape),
            tf.TensorArray(tf.float32, size=max_length, element_shape=alphas.element_shape),
        ),
    )
    return tf.transpose(history.stack(), [1, 2, 0, 3])  # (B, S, T, L)


def settled(finished, length, log_prob, live, penalty, max_length, num_return, constrained):
    """bool (B,): the images whose returned captions no further step can change: their
    `num_return` best finished hypotheses (of the second state with a constraint,
    `constrained` = k: `search._best` returns from it once it holds one) score more than any
    caption a live one can end in. A live hypothesis only loses log-probability, so
    none of its captions scores more than `log_prob / penalty(max_length)`, the least
    penalty a caption can meet; an image whose every hypothesis has finished is
    settled too. Stepping them further would change no caption (`compact` in
    `search.beam_search`). `live`: the hypotheses still extended; `penalty(n)`: the length
    penalty of n tokens."""
    neg_inf = tf.constant(float("-inf"), tf.float32)
    final = tf.where(finished, log_prob / penalty(length + 1), neg_inf)
    if constrained is not None:
        final = tf.where(tf.range(tf.shape(final)[1])[None] >= constrained, final, neg_inf)
    best = tf.where(live, log_prob / penalty(max_length), neg_inf)
    beaten = tf.reduce_max(best, axis=1, keepdims=True)  # (B, 1)
    fixed = tf.reduce_sum(tf.cast(final > beaten, tf.int32), axis=1) >= num_return
    return tf.logical_or(fixed, ~tf.reduce_any(live, axis=1))
