"""Drawing captions instead of searching for them: each word drawn from the step's
distribution, flattened or sharpened by a temperature and cut to its nucleus (Holtzman et
al., 2020, "The Curious Case of Neural Text Degeneration", §3.1), and several drawn
captions of each image ranked by their log-probability.

`search.greedy_decode(drawing=...)` calls `draw` once a step (self-critical training's
samples too, at temperature 1 over every word), and `search.beam_search(drawing=...)`
`perturb` (a beam of one per state draws a caption that must hold a constraint word);
`ShowAttendTell.decode` repeats each image's state for its samples (`repeat`) and ranks
them (`ranked`). The temperature and the nucleus change only which word is drawn: a
caption's log-probability is the model's own, as for greedy and beam search.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf


class Drawing(NamedTuple):
    """How words are drawn.

    Attributes:
      seed: int32 (2,), a stateless seed; step t draws with it folded with t, and rows
        draw independently.
      temperature: None (1) or a positive scalar; towards 0 a draw is the most likely
        word, above 1 the distribution is flatter than the model's.
      top_p: None (every word) or a scalar in (0, 1]: each word is drawn from its
        `nucleus`.
    """

    seed: tf.Tensor
    temperature: tf.Tensor | float | None = None
    top_p: tf.Tensor | float | None = None


def _tempered(log_probs, drawing):
    return log_probs if drawing.temperature is None else log_probs / drawing.temperature


def nucleus(logits: tf.Tensor, top_p: tf.Tensor | float) -> tf.Tensor:
    """`logits` (N, V) with -inf outside each row's nucleus: its most likely words, the
    fewest whose probabilities (softmax of the row) sum to at least `top_p`; the most
    likely word is always kept, and a word as likely as the last one kept is kept too.

    Args:
      logits: float32 (N, V).
      top_p: scalar in (0, 1]; 1 keeps every word of nonzero probability.
    """
    ranked = tf.sort(logits, axis=-1, direction="DESCENDING")  # (N, V)
    before = tf.math.cumsum(tf.nn.softmax(ranked), axis=-1, exclusive=True)  # (N, V)
    # The least logit kept: the words before which the mass is still short of top_p.
    kept = tf.where(before < top_p, ranked, ranked[:, :1])
    threshold = tf.reduce_min(kept, axis=-1, keepdims=True)  # (N, 1)
    return tf.where(logits < threshold, tf.constant(float("-inf"), logits.dtype), logits)


def draw(log_probs: tf.Tensor, drawing: Drawing, t: tf.Tensor) -> tf.Tensor:
    """int32 (N,): the words of step `t` drawn from softmax(log_probs / temperature), cut
    to its `nucleus` with a top_p (`Drawing`).

    Args:
      log_probs: float32 (N, V), -inf (or -1e9) at the words the decoding rules block.
      drawing: the `Drawing`.
      t: scalar int32, the step.
    """
    logits = _tempered(log_probs, drawing)
    if drawing.top_p is not None:
        logits = nucleus(logits, drawing.top_p)
    seed = tf.random.experimental.stateless_fold_in(drawing.seed, t)
    return tf.random.stateless_categorical(logits, 1, seed, dtype=tf.int32)[:, 0]


def perturb(candidates, step_log_probs, drawing: Drawing, t):
    """Beam search's extensions made a draw (the Gumbel-max trick): `candidates` (B, S,
    V), the log-probabilities of each hypothesis extended by each word, plus temperature
    times standard Gumbel noise, and -inf at the words outside the `nucleus` of each
    hypothesis' tempered step (`step_log_probs` (B, S, V)). The best of one
    hypothesis' perturbed extensions is a draw from softmax(step_log_probs /
    temperature); ranked as the search ranks (its length penalty divides each
    hypothesis' alike), a beam of one draws a caption, and with a constraint each of its
    two states draws among the extensions it may take. Towards temperature 0 the
    ranking is the search's own.

    Args:
      candidates, step_log_probs: float32 (B, S, V).
      drawing: the `Drawing`.
      t: scalar int32, the step.
    """
    seed = tf.random.experimental.stateless_fold_in(drawing.seed, t)
    tiny = float(np.finfo(np.float32).tiny)
    uniform = tf.random.stateless_uniform(tf.shape(candidates), seed, minval=tiny, maxval=1.0)
    noise = -tf.math.log(-tf.math.log(uniform))  # (B, S, V), standard Gumbel
    if drawing.top_p is not None:
        rows = tf.reshape(_tempered(step_log_probs, drawing), [-1, tf.shape(candidates)[-1]])
        outside = tf.reshape(nucleus(rows, drawing.top_p), tf.shape(candidates)) == -np.inf
        candidates = tf.where(outside, float("-inf"), candidates)
    scale = 1.0 if drawing.temperature is None else drawing.temperature
    return candidates + scale * noise


def repeat(state, n: int):
    """A nest of per-image tensors (and Nones, kept) with each image's row repeated `n`
    times in a row (row b n + j: sample j of image b)."""
    return tf.nest.map_structure(lambda x: None if x is None else tf.repeat(x, n, axis=0), state)


def ranked(result, n: int):
    """A decoding result (a NamedTuple with `log_prob`) of B n rows, `n` samples of each
    image in a row, as fields (B, n, ...): each image's samples ordered by log-probability,
    most likely first (ties in drawing order). Unchanged for n = 1."""
    if n == 1:
        return result
    grouped = type(result)(*(tf.reshape(x, [-1, n, *x.shape[1:]]) for x in result))
    order = tf.argsort(grouped.log_prob, axis=1, direction="DESCENDING", stable=True)  # (B, n)
    return type(result)(*(tf.gather(x, order, batch_dims=1) for x in grouped))
