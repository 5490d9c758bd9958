"""Greedy and beam-search decoding over any step function.

Nothing here knows about LSTMs or Keras. A model exposes one decoding step,

    step_fn(tokens, state) -> (log_probs, new_state, alpha)

with `tokens` int32 (B,), `state` a nest of tensors whose leading dimension is B,
`log_probs` float32 (B, V) normalised log-probabilities of the next word and `alpha`
float32 (B, L) the attention weights that produced them (paper §3.1.2, §4). What a step
reads of each image and never changes (the annotations, `W_a a`) may be given apart, as
`constants` (leading dimension: images); the step is then
`step_fn(tokens, state, constants)` and beam search keeps the constants once per image
instead of once per hypothesis. Beam search runs the step only on the hypotheses of the
beam states (k hypotheses of an image) that still have a live one. The decoders
run it inside one `tf.while_loop` over time, eagerly or under `tf.function`; greedy keeps
buffers of a fixed length `max_length` (no `TensorArray`), so that it converts to
TFLite with builtin ops only. The rules captioning adds (blocked repeats and endings, a
constraint on the words) are `sat_tf.model.decoding_rules`, called at one place a step;
greedy decoding draws its words instead with `sat_tf.model.sampling`.
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from sat_tf.data.tokens import PAD_ID
from sat_tf.model import decoding_rules, per_image, sampling

StepFn = Callable[..., tuple[tf.Tensor, Any, tf.Tensor]]


class DecodeResult(NamedTuple):
    """Captions decoded for a batch of images.

    T is the `max_length` the decoder was given. With `beam_search(num_return=n)`, n > 1,
    every field gains an axis of size n after the batch axis, best hypothesis first, the
    n distinct; log_prob is -inf at the places of an image that has fewer than n
    hypotheses to return (its tokens are then meaningless).

    Attributes:
        tokens: int32 (B, T). Generated word ids, then `<end>` if it was emitted, then
            0 (`<pad>`).
        length: int32 (B,). Number of words before `<end>` (the caption length; `<end>`
            not counted). A caption that never emitted `<end>` has length T.
        log_prob: float32 (B,). Sum of the log-probabilities of the emitted tokens,
            `<end>` included.
        attention: float32 (B, T, L). The alpha that produced each emitted token
            (`<end>` included), zeros after.
    """

    tokens: tf.Tensor
    length: tf.Tensor
    log_prob: tf.Tensor
    attention: tf.Tensor


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive Python int, got {value!r}.")


def _time_mask(t: tf.Tensor, max_length: int, dtype: tf.DType) -> tf.Tensor:
    """One-hot row selecting time step `t` of a (..., max_length) buffer."""
    return tf.one_hot(t, max_length, dtype=dtype)


def _step(
    step_fn: StepFn, num_locations: int, tokens: tf.Tensor, state: Any, *constants: Any
) -> tuple[tf.Tensor, Any, tf.Tensor]:
    """Calls `step_fn` (with `constants` when given) and keeps the state's structure and
    static shapes stable.

    `tf.while_loop` needs loop variables with the same structure (tuple vs. list) and
    compatible shapes in every iteration; a step function may return a list for a tuple or
    lose a static dimension, so both are restored from the incoming state.
    """
    log_probs, new_state, alpha = step_fn(tokens, state, *constants)
    if not alpha.shape.is_compatible_with([None, num_locations]):
        raise ValueError(
            f"step_fn returned alpha of shape {alpha.shape}; expected "
            f"(batch, num_locations={num_locations})."
        )
    if log_probs.shape.rank not in (None, 2):
        raise ValueError(
            f"step_fn returned log_probs of shape {log_probs.shape}; expected (batch, V)."
        )
    new_state = tf.nest.pack_sequence_as(state, tf.nest.flatten(new_state))
    new_state = tf.nest.map_structure(_keep_shape, new_state, state)
    return tf.cast(log_probs, tf.float32), new_state, tf.cast(alpha, tf.float32)


def _keep_shape(new: tf.Tensor, old: tf.Tensor) -> tf.Tensor:
    new = tf.convert_to_tensor(new)
    new.set_shape(old.shape)
    return new


def greedy_decode(
    step_fn: StepFn,
    initial_state: Any,
    *,
    batch_size: int | tf.Tensor,
    start_id: int,
    end_id: int,
    max_length: int,
    num_locations: int,
    block_repeats: bool = False,
    bad_ending_ids: Sequence[int] = (),
    drawing: sampling.Drawing | None = None,
) -> DecodeResult:
    """Decodes by taking the most likely word at every step, or with a `drawing` by
    drawing it from the step's distribution (`sampling.draw`: the samples of
    self-critical training, and captions drawn for variety).

    Starts from `<start>`, feeds each chosen word back, and stops once every caption has
    emitted `<end>` or after `max_length` tokens. A finished caption is fed `<pad>` and
    its later outputs are discarded.

    Args:
        step_fn: `step_fn(tokens, state) -> (log_probs, new_state, alpha)` with tokens
            int32 (B,), log_probs float32 (B, V), alpha float32 (B, L).
        initial_state: Nest of tensors, each with leading dimension B.
        batch_size: B, a Python int or a scalar int32 tensor (e.g. from `tf.shape`).
        start_id: Id of `<start>`, fed at the first step.
        end_id: Id of `<end>`.
        max_length: T, the most tokens emitted per caption, `<end>` included.
        num_locations: L, the number of attention locations.
        block_repeats: Never emit a word a third time in a row, nor a trigram twice
            (`decoding_rules.block`).
        bad_ending_ids: Words a caption may not end on (`<end>` is banned after them).
        drawing: None for greedy; a `sampling.Drawing` (seed, temperature, nucleus) to
            draw each word. The log-probability returned is the step's own all the same.

    Returns:
        A `DecodeResult` with tokens (B, T), length (B,), log_prob (B,) and attention
        (B, T, L); T = max_length always (fixed-size buffers, not trimmed).
    """
    _check_positive("max_length", max_length)
    _check_positive("num_locations", num_locations)

    def cond(t, tokens, state, finished, *unused):
        return tf.logical_and(t < max_length, tf.reduce_any(tf.logical_not(finished)))

    blocking = dict(block_repeats=block_repeats, bad_ending_ids=bad_ending_ids, end_id=end_id)

    def body(t, tokens, state, finished, token_buf, attention_buf, length, log_prob):
        log_probs, state, alpha = _step(step_fn, num_locations, tokens, state)
        log_probs = decoding_rules.block(log_probs, tokens, token_buf, t, **blocking)
        alive = tf.logical_not(finished)
        if drawing is None:
            chosen = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        else:
            chosen = sampling.draw(log_probs, drawing, t)
        next_tokens = tf.where(alive, chosen, PAD_ID)
        chosen_log_prob = tf.gather(log_probs, chosen, batch_dims=1)  # (B,)
        log_prob += tf.where(alive, chosen_log_prob, 0.0)
        token_buf += _time_mask(t, max_length, tf.int32)[None] * next_tokens[:, None]  # (B, T)
        alpha = tf.where(alive[:, None], alpha, 0.0)
        attention_buf += _time_mask(t, max_length, tf.float32)[None, :, None] * alpha[:, None]
        length += tf.cast(tf.logical_and(alive, next_tokens != end_id), tf.int32)
        finished = tf.logical_or(finished, next_tokens == end_id)
        return t + 1, next_tokens, state, finished, token_buf, attention_buf, length, log_prob

    loop_vars = (
        tf.constant(0),
        tf.fill([batch_size], tf.constant(start_id, tf.int32)),
        initial_state,
        tf.zeros([batch_size], tf.bool),
        tf.zeros([batch_size, max_length], tf.int32),
        tf.zeros([batch_size, max_length, num_locations], tf.float32),
        tf.zeros([batch_size], tf.int32),
        tf.zeros([batch_size], tf.float32),
    )
    *_, tokens, attention, length, log_prob = tf.while_loop(cond, body, loop_vars)
    return DecodeResult(tokens=tokens, length=length, log_prob=log_prob, attention=attention)


def _length_penalty(num_tokens: tf.Tensor, alpha: float) -> tf.Tensor:
    """GNMT length penalty ((5 + |Y|) / 6) ** alpha (Wu et al., 2016, §7); 1 for alpha=0."""
    return tf.pow((5.0 + tf.cast(num_tokens, tf.float32)) / 6.0, alpha)


def _top_k(scores, k, constraint=None):
    """(scores, flat indices into S * V), both (B, S), of the extensions of `scores`
    (B, S, V) that a beam of k keeps (with a constraint, `decoding_rules.constrained_top_k`)."""
    if constraint is not None:
        return decoding_rules.constrained_top_k(scores, k, constraint)
    shape = tf.shape(scores)
    return tf.math.top_k(tf.reshape(scores, [shape[0], shape[1] * shape[2]]), k=k)


def beam_search(
    step_fn: StepFn,
    initial_state: Any,
    *,
    batch_size: int | tf.Tensor,
    start_id: int,
    end_id: int,
    max_length: int,
    beam_size: int,
    num_locations: int,
    length_penalty: float = 0.0,
    num_return: int = 1,
    block_repeats: bool = False,
    bad_ending_ids: Sequence[int] = (),
    constraint: tf.Tensor | None = None,
    constants: Any = None,
    compact: bool = True,
    drawing: sampling.Drawing | None = None,
) -> DecodeResult:
    """Batched beam search keeping `beam_size` hypotheses per image, optionally
    constrained to captions that hold one of some given words.

    The k hypotheses of image b sit in row b*k + j of the (B*k)-row state given to
    `step_fn`; after every step the state, tokens and attention history are gathered by
    parent beam, so each hypothesis carries the alpha of its own ancestors. A hypothesis
    that emitted `<end>` stays in the beam and competes with the live ones, extended only
    by `<pad>` at log-probability 0. Hypotheses are ranked by

        score = log_prob / ((5 + n) / 6) ** length_penalty

    where n is the number of tokens emitted, `<end>` included (GNMT length
    normalisation, Wu et al., 2016, §7; `length_penalty=0` ranks by log_prob). At the
    first step only beam 0 is expanded, so the k hypotheses are distinct. Decoding stops
    when every image is settled (every hypothesis finished, or those returned beyond the
    reach of the live ones), or after `max_length` tokens.
    With `beam_size=1` the result equals `greedy_decode`.

    With a `constraint`, this is constrained beam search (Anderson et al., 2017, "Guided
    Open Vocabulary Image Captioning with Constrained Beam Search", §3) for one
    disjunctive constraint, a finite-state machine of two states: k hypotheses that hold
    none of the image's constraint words yet, and k that hold one. Each step fills both
    from all 2k: the first with the best extensions by other words, the second with the
    best extensions of its own hypotheses and those that add a constraint word. The
    caption returned is the best that holds a constraint word, or the best of the others
    where none does. An image without constraint words starts in the second state, so
    it is decoded as without a constraint. The two states' selection is
    `decoding_rules.constrained_top_k`, where a plain beam takes its top k.

    Args:
        step_fn: `step_fn(tokens, state) -> (log_probs, new_state, alpha)` with tokens
            int32 (N,), log_probs float32 (N, V), alpha float32 (N, L), here N = B*k.
        initial_state: Nest of tensors, each with leading dimension B (one row per
            image; tiled to B*k here).
        batch_size: B, a Python int or a scalar int32 tensor (e.g. from `tf.shape`).
        start_id: Id of `<start>`, fed at the first step.
        end_id: Id of `<end>`.
        max_length: T, the most tokens emitted per caption, `<end>` included.
        beam_size: k, hypotheses kept per image.
        num_locations: L, the number of attention locations.
        length_penalty: Exponent of the GNMT length penalty; 0 turns it off.
        num_return: n, how many hypotheses to return per image, best first;
            1 <= n <= k. The first is the caption of `num_return=1`; an image is settled
            only once its n best are.
        block_repeats: Never emit a word a third time in a row, nor a trigram twice.
        bad_ending_ids: Words a caption may not end on (`<end>` is banned after them).
        constraint: None, or bool (B, V): the words of which each image's caption must
            hold one (a row without any: no constraint).
        constants: None, or a nest of tensors with leading dimension B (one row per
            image, never tiled) that the step reads and never changes:
            `step_fn(tokens, state, constants)` is then called with the constants of the
            image of each beam state whose hypotheses it steps (those of the k that still
            hold a live one, with or without constants), so that the row of a state's
            constants serves its k hypotheses, in a row; the captions are those of a step
            that reads them from the state.
        compact: step and keep the books of only the images that hold a live
            hypothesis and are not settled (`per_image.settled`), in tensors whose size is known
            only when the graph runs; False keeps every tensor at B rows and steps every
            live hypothesis, as XLA needs (`jit_compile`). The captions are the same.
        drawing: None, or a `sampling.Drawing` to rank the extensions perturbed
            (`sampling.perturb`): a beam of one (per state) draws its caption; the
            log-probabilities are the step's own all the same.

    Returns:
        A `DecodeResult`. For n = 1: tokens (B, T), length (B,), log_prob (B,),
        attention (B, T, L). For n > 1: tokens (B, n, T), length (B, n),
        log_prob (B, n), attention (B, n, T, L).
    """
    checked = dict(max_length=max_length, beam_size=beam_size, num_locations=num_locations)
    for name, value in {**checked, "num_return": num_return}.items():
        _check_positive(name, value)
    if num_return > beam_size:
        raise ValueError(f"num_return={num_return} must not exceed beam_size={beam_size}.")
    k = beam_size
    # Hypotheses per image: k, or k without a constraint word, then k with one.
    slots = k if constraint is None else 2 * k
    neg_inf = tf.constant(float("-inf"), tf.float32)

    def open_(finished, length, log_prob):
        """bool (B, S): the hypotheses still extended, those of the images whose caption
        is not yet settled (`per_image.settled`; with compact=False, every live one)."""
        live = _live(finished, log_prob)
        if not compact:
            return live
        penalty = functools.partial(_length_penalty, alpha=length_penalty)
        ranked = finished, length, log_prob, live, penalty, max_length, num_return
        settled = per_image.settled(*ranked, None if constraint is None else k)
        return tf.logical_and(live, ~settled[:, None])

    def cond(t, tokens, state, finished, token_buf, alphas, parents, length, log_prob):
        return tf.logical_and(t < max_length, tf.reduce_any(open_(finished, length, log_prob)))

    blocking = dict(block_repeats=block_repeats, bad_ending_ids=bad_ending_ids, end_id=end_id)
    advance = functools.partial(
        _advance,
        functools.partial(_step, step_fn, num_locations),
        constants,
        dict(k=k, slots=slots, max_length=max_length, num_locations=num_locations),
        dict(length_penalty=length_penalty, end_id=end_id, blocking=blocking),
        drawing,
    )

    def body(t, tokens, state, finished, token_buf, alphas, parents, length, log_prob):
        books = (finished, token_buf, length, log_prob)
        if compact:
            live = open_(finished, length, log_prob)
            advanced = per_image.on_live_images(
                functools.partial(advance, t), live, (tokens, state), books, constraint
            )
        else:
            advanced = advance(t, None, (tokens, state), books, constraint)
        (tokens, state), (finished, token_buf, length, log_prob), alpha, parent = advanced
        alphas, parents = alphas.write(t, alpha), parents.write(t, parent)
        return t + 1, tokens, state, finished, token_buf, alphas, parents, length, log_prob

    # Only the first hypothesis of a state starts (an image without constraint words
    # starts in the second), so the k of a state are distinct.
    first = tf.zeros([batch_size], tf.int32)
    if constraint is not None:
        first = decoding_rules.constrained_start(constraint, k)
    initial_log_prob = tf.where(tf.range(slots)[None] == first[:, None], 0.0, neg_inf)
    rows = tf.nest.flatten(initial_state)[0].shape[0]  # B where the state knows it, else None
    loop_vars = (
        tf.constant(0),
        tf.fill([batch_size * slots], tf.constant(start_id, tf.int32)),
        tf.nest.map_structure(lambda x: tf.repeat(x, slots, axis=0), initial_state),
        tf.zeros([batch_size, slots], tf.bool),
        tf.zeros([batch_size, slots, max_length], tf.int32),
        # Static where the batch is (TFLite lowers a TensorArray of static elements only).
        tf.TensorArray(tf.float32, max_length, element_shape=[rows, slots, num_locations]),
        tf.TensorArray(tf.int32, max_length, clear_after_read=False, element_shape=[rows, slots]),
        tf.zeros([batch_size, slots], tf.int32),
        initial_log_prob,  # (B, S)
    )
    steps, _, _, finished, tokens, alphas, parents, length, log_prob = tf.while_loop(
        cond, body, loop_vars
    )
    attention = per_image.attention_history(alphas, parents, steps, max_length)
    final = DecodeResult(tokens, length, log_prob, attention)
    return _best(final, finished, k, length_penalty, num_return, constrained=constraint is not None)


_SIZES = ("k", "slots", "max_length", "num_locations")


def _gather_beams(x, parent):
    return tf.gather(x, parent, batch_dims=1)


def _advance(step, constants, sizes, rules, drawing, t, images, per_row, books, constraint):
    """One step of `beam_search` for B' images (`images`, (B',), their index among the
    B; None: all B), their rows gathered: per_row (tokens, state), books (finished,
    token_buf, length, log_prob) -> (per_row, books, alpha (B', S, L), parent (B', S)).
    `sizes`: k, slots (S), max_length, num_locations; `rules`: length_penalty, end_id
    and the `decoding_rules.block` arguments; `drawing`: None, or a `sampling.Drawing`."""
    (tokens, state), (finished, token_buf, length, log_prob) = per_row, books
    k, slots, max_length, num_locations = (sizes[key] for key in _SIZES)
    neg_inf = tf.constant(float("-inf"), tf.float32)
    count = tf.shape(finished)[0]
    live = _live(finished, log_prob)
    log_probs, state, alpha = per_image.live_images_step(
        step, tokens, state, constants, live, group=k, images=images
    )
    history = tf.reshape(token_buf, [-1, max_length])  # (B'S, T)
    log_probs = decoding_rules.block(log_probs, tokens, history, t, **rules["blocking"])
    vocab_size = tf.shape(log_probs)[-1]
    log_probs = tf.reshape(log_probs, [count, slots, vocab_size])  # (B', S, V)
    alpha = tf.reshape(alpha, [count, slots, num_locations])  # (B', S, L)
    pad_only = tf.where(tf.range(vocab_size) == PAD_ID, 0.0, neg_inf)
    step_log_probs = tf.where(finished[..., None], pad_only, log_probs)  # (B', S, V)
    candidates = log_prob[..., None] + step_log_probs  # (B', S, V)
    ranked = candidates
    if drawing is not None:
        ranked = sampling.perturb(candidates, step_log_probs, drawing, t)
    scores = ranked / _length_penalty(length + 1, rules["length_penalty"])[..., None]
    kept, best = _top_k(scores, k, constraint)
    parent = best // vocab_size
    next_tokens = best % vocab_size
    log_prob = _gather_beams(tf.reshape(candidates, [count, slots * vocab_size]), best)
    log_prob = tf.where(kept > neg_inf, log_prob, neg_inf)

    was_finished = _gather_beams(finished, parent)
    alive = tf.logical_not(was_finished)
    next_tokens = tf.where(alive, next_tokens, PAD_ID)
    token_buf = _gather_beams(token_buf, parent)
    token_buf += _time_mask(t, max_length, tf.int32)[None, None] * next_tokens[..., None]
    alpha = tf.where(alive[..., None], _gather_beams(alpha, parent), 0.0)
    length = _gather_beams(length, parent)
    length += tf.cast(tf.logical_and(alive, next_tokens != rules["end_id"]), tf.int32)
    finished = tf.logical_or(was_finished, next_tokens == rules["end_id"])
    state = _gather_hypotheses(state, parent)
    tokens = _keep_shape(tf.reshape(next_tokens, [-1]), tokens)  # (B'S,)
    return (tokens, state), (finished, token_buf, length, log_prob), alpha, parent


def _live(finished, log_prob):
    """The hypotheses still extended: not finished, and not at -inf (an unfilled slot,
    never extended into a caption)."""
    return tf.logical_and(tf.logical_not(finished), log_prob > float("-inf"))


def _gather_hypotheses(state, parent):
    """The state of rows b S + parent[b, j] (parent (B, S)) in rows b S + j."""
    rows = tf.range(tf.shape(parent)[0])[:, None] * tf.shape(parent)[1] + parent  # (B, S)
    rows = tf.reshape(rows, [-1])  # (B*S,)
    return tf.nest.map_structure(lambda s: _keep_shape(tf.gather(s, rows), s), state)


def _best(hypotheses, finished, k, length_penalty, num_return, constrained):
    """The `num_return` best of the (B, S) final hypotheses, best first; with a
    constraint, from the second state (those that hold a constraint word) where any is
    there. A place no such hypothesis fills has log_prob -inf. One drops the hypothesis
    axis."""
    num_tokens = hypotheses.length + tf.cast(finished, tf.int32)
    final = hypotheses.log_prob / _length_penalty(num_tokens, length_penalty)  # (B, S)
    if constrained:
        final = decoding_rules.constrained_best(final, k)
    kept, order = tf.math.top_k(final, k=num_return)
    result = DecodeResult(*(tf.gather(x, order, batch_dims=1) for x in hypotheses))
    result = result._replace(log_prob=tf.where(kept > float("-inf"), result.log_prob, kept))
    if num_return == 1:
        result = DecodeResult(*(tf.squeeze(x, axis=1) for x in result))
    return result
