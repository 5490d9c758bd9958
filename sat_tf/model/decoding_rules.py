"""Rules that captioning adds to the paper's decoding (`model/search.py`): words a caption
never emits, repeats it may not make, words it may not end on, and the selection of
constrained beam search, which makes a caption hold one of some given words.

Each rule acts on the log-probabilities or the scores of a step, so that the search
loops stay the paper's: greedy and beam search call `block` once a step, and beam search
with a constraint calls `constrained_start`, `constrained_top_k` and `constrained_best`
where a plain beam starts, keeps its best extensions and picks its caption.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from sat_tf.data import vocab as vocab_lib


def never_emitted_penalty(vocab_size):
    """(V,) float32: -1e9 at the words of `vocab.NEVER_EMITTED` (`<pad>`, `<start>`,
    `<unk>`), 0 elsewhere; added to a step's scores, no caption holds those words."""
    banned = np.zeros([vocab_size], np.float32)
    banned[list(vocab_lib.NEVER_EMITTED)] = -1e9
    return banned


def never_emitting(step_fn, vocab_size):
    """`step_fn` with `never_emitted_penalty` added to its log-probabilities; the other
    words' log-probabilities are not renormalised."""
    banned = never_emitted_penalty(vocab_size)

    def step(tokens, state, *constants):
        log_probs, state, alpha = step_fn(tokens, state, *constants)
        return log_probs + banned, state, alpha

    return step


def block(
    log_probs: tf.Tensor,
    tokens: tf.Tensor,
    history: tf.Tensor,
    t: tf.Tensor,
    *,
    block_repeats: bool,
    bad_ending_ids: Sequence[int],
    end_id: int,
) -> tf.Tensor:
    """Sets to -inf the log-probability of the words a caption may not take next.

    With `block_repeats`, a word already emitted twice in a row, and any word that would
    complete a trigram the caption already holds (self-critical.pytorch's trigram
    blocking, made hard); with `bad_ending_ids`, `<end>` right after one of those words.

    Args:
        log_probs: float32 (N, V), the step's log-probabilities.
        tokens: int32 (N,), the word fed at step t (`<start>` at t = 0).
        history: int32 (N, T), the words emitted so far in columns < t.
        t: scalar int32, the step.

    Returns:
        `log_probs`, -inf where a word is blocked.
    """
    num_rows, vocab_size = tf.shape(log_probs)[0], tf.shape(log_probs)[1]
    banned = tf.zeros_like(log_probs, tf.bool)
    if block_repeats:
        before = tf.gather(history, tf.maximum(t - 2, 0), axis=1)  # (N,), y_{t-2}
        third_in_row = tf.logical_and(t >= 2, before == tokens)
        # y_{i+2} is banned when (y_i, y_{i+1}) = (y_{t-2}, y_{t-1}) for some i < t - 2.
        seen = (history[:, :-2] == before[:, None]) & (history[:, 1:-1] == tokens[:, None])
        seen &= tf.range(history.shape[1] - 2) < t - 2  # (N, T-2)
        ids = tf.concat(
            [
                tf.where(third_in_row, tokens, vocab_size)[:, None],
                tf.where(seen, history[:, 2:], vocab_size),
            ],
            axis=1,
        )  # (N, T-1), column V for "nothing banned"
        rows = tf.broadcast_to(tf.range(num_rows)[:, None], tf.shape(ids))
        hits = tf.scatter_nd(
            tf.stack([rows, ids], axis=-1), tf.ones_like(ids), [num_rows, vocab_size + 1]
        )
        banned |= hits[:, :vocab_size] > 0
    if bad_ending_ids:
        bad = tf.reduce_any(tokens[:, None] == tf.constant(bad_ending_ids, tf.int32), axis=1)
        banned |= bad[:, None] & (tf.range(vocab_size) == end_id)[None]
    return tf.where(banned, tf.constant(float("-inf"), tf.float32), log_probs)


# Constrained beam search (Anderson et al., 2017, "Guided Open Vocabulary Image Captioning
# with Constrained Beam Search", §3) for one disjunctive constraint: a finite-state machine
# of two states, each with k hypotheses in slots [0, k) (none of the image's constraint
# words yet) and [k, 2k) (one of them).


def constrained_start(constraint: tf.Tensor, k: int) -> tf.Tensor:
    """int32 (B,): the slot whose hypothesis starts, 0, or k for an image without
    constraint words (bool (B, V) `constraint`), which is then decoded as without one."""
    return tf.where(tf.reduce_any(constraint, axis=1), 0, k)


def constrained_top_k(scores: tf.Tensor, k: int, constraint: tf.Tensor):
    """(scores, flat indices into S * V), both (B, 2k), of the extensions of `scores`
    (B, S = 2k, V) that the two states keep: the best k that hold none of the
    constraint's words, then the best k that hold one (a score is -inf where a state had
    fewer candidates than k)."""
    shape = tf.shape(scores)
    flat = [shape[0], shape[1] * shape[2]]
    neg_inf = tf.constant(float("-inf"), tf.float32)
    holds = tf.range(shape[1]) >= k  # (S,), the second state
    enters = tf.logical_or(holds[None, :, None], constraint[:, None, :])  # (B, S, V)
    without = tf.math.top_k(tf.reshape(tf.where(enters, neg_inf, scores), flat), k=k)
    with_word = tf.math.top_k(tf.reshape(tf.where(enters, scores, neg_inf), flat), k=k)
    return tf.concat([without[0], with_word[0]], 1), tf.concat([without[1], with_word[1]], 1)


def constrained_best(final: tf.Tensor, k: int) -> tf.Tensor:
    """The final scores (B, 2k) a caption is picked by: those of the second state (the
    hypotheses that hold a constraint word) where any is there, else the first's; -inf
    for the others."""
    neg_inf = tf.constant(float("-inf"), tf.float32)
    holds = tf.range(tf.shape(final)[1])[None] >= k  # (1, S)
    any_holds = tf.reduce_any(tf.logical_and(holds, final > neg_inf), axis=1)
    return tf.where(tf.equal(holds, any_holds[:, None]), final, neg_inf)
