"""Tests for sat_tf.model.search with fake step functions whose answers are known."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model import sampling, search

PAD, START, END, A, B = 0, 1, 2, 3, 4
VOCAB = 5
LOCATIONS = 3


def _probs(end=0.0, a=0.0, b=0.0):
    """A distribution over [pad, start, end, a, b] (pad and start impossible)."""
    return np.array([0.0, 0.0, end, a, b])


class TableStep:
    """log p(y_t) = log table[image, t, y_{t-1}]; alpha = alpha_table[image, t, y_{t-1}].

    The state is a dict {"image": (B,), "step": (B,)}, so the step count and the image
    travel with each row (and must be tiled and gathered correctly by beam search).
    """

    def __init__(self, rows, num_images, max_length, default=None, seed=0):
        default = _probs(end=0.2, a=0.45, b=0.35) if default is None else default
        table = np.tile(default, (num_images, max_length, VOCAB, 1))
        for (image, t, prev), probs in rows.items():
            if t < max_length:
                table[image, t, prev] = probs
        with np.errstate(divide="ignore"):
            self.log_table = np.log(table).astype(np.float32)
        rng = np.random.default_rng(seed)
        self.alpha_table = rng.random((num_images, max_length, VOCAB, LOCATIONS)).astype(np.float32)
        self.calls = 0

    def initial_state(self, images):
        images = tf.convert_to_tensor(images, tf.int32)
        return {"image": images, "step": tf.zeros_like(images)}

    def __call__(self, tokens, state):
        self.calls += 1
        index = tf.stack([state["image"], state["step"], tokens], axis=-1)
        log_probs = tf.gather_nd(self.log_table, index)
        alpha = tf.gather_nd(self.alpha_table, index)
        return log_probs, {"image": state["image"], "step": state["step"] + 1}, alpha

    def alphas(self, image, tokens):
        """Alpha rows that produced `tokens` of `image`, one per token."""
        prevs = [START, *tokens[:-1]]
        return np.stack([self.alpha_table[image, t, p] for t, p in enumerate(prevs)])


class PathStep:
    """A random step function of the whole token path.

    The state is one int32 code per row, hashed from the previous code and the token fed,
    so log-probs and alpha depend on every ancestor: a wrong gather by parent beam gives
    other numbers. `numpy_step` is the same function in NumPy for the references below.
    """

    def __init__(self, seed, vocab_size=VOCAB, table_size=997, end_logit=0.0):
        rng = np.random.default_rng(seed)
        logits = 2.0 * rng.normal(size=(table_size, vocab_size))
        logits[:, END] += end_logit
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        self.log_table = log_probs.astype(np.float32)
        self.alpha_table = rng.random((table_size, LOCATIONS)).astype(np.float32)
        self.table_size = table_size
        self.vocab_size = vocab_size

    def __call__(self, tokens, code):
        code = (code * 31 + tokens + 7) % self.table_size
        return tf.gather(self.log_table, code), code, tf.gather(self.alpha_table, code)

    def numpy_step(self, code, token):
        code = (code * 31 + token + 7) % self.table_size
        return self.log_table[code], code, self.alpha_table[code]

    def path(self, code, tokens):
        """(log-prob sum, alpha rows) of feeding `<start>` then `tokens` from `code`."""
        log_prob, alphas, prev = np.float32(0.0), [], START
        for token in tokens:
            log_probs, code, alpha = self.numpy_step(code, prev)
            log_prob = np.float32(log_prob + log_probs[token])
            alphas.append(alpha)
            prev = token
        return log_prob, np.stack(alphas)


def _penalty(num_tokens, length_penalty):
    return np.float32(((5.0 + num_tokens) / 6.0) ** length_penalty)


def _pad(tokens, alphas, max_length):
    out_tokens = np.zeros(max_length, np.int32)
    out_tokens[: len(tokens)] = tokens
    out_alphas = np.zeros((max_length, LOCATIONS), np.float32)
    out_alphas[: len(alphas)] = alphas
    return out_tokens, out_alphas


def _blocked(tokens, block_repeats=False, bad_endings=()):
    """The words that may not follow `tokens`, found by listing the caption's trigrams."""
    banned = set()
    if block_repeats and len(tokens) >= 2:
        if tokens[-1] == tokens[-2]:
            banned.add(tokens[-1])
        for i in range(len(tokens) - 2):
            if (tokens[i], tokens[i + 1]) == (tokens[-2], tokens[-1]):
                banned.add(tokens[i + 2])
    if tokens and tokens[-1] in bad_endings:
        banned.add(END)
    return banned


def _masked(log_probs, banned):
    log_probs = log_probs.copy()
    log_probs[list(banned)] = -np.inf
    return log_probs


def _reference_greedy(fn, code, max_length, **blocking):
    """Greedy decoding written with Python loops."""
    tokens, prev = [], START
    for _ in range(max_length):
        log_probs, code, _ = fn.numpy_step(code, prev)
        prev = int(np.argmax(_masked(log_probs, _blocked(tokens, **blocking))))
        tokens.append(prev)
        if prev == END:
            break
    return tokens


def _reference_beam(fn, code, max_length, beam_size, length_penalty, num_return, **blocking):
    """Beam search written with Python lists, one image at a time.

    Same rules as `search.beam_search`: finished hypotheses stay in the beam and are
    extended by `<pad>` at log-prob 0; rank by GNMT-normalised score, ties to the lower
    (beam, token) index. Returns [(tokens, log_prob)] best first.
    """
    beam = [([], np.float32(0.0), False, code)]
    for _ in range(max_length):
        if all(finished for _, _, finished, _ in beam):
            break
        candidates = []
        for j, (tokens, log_prob, finished, code) in enumerate(beam):
            if finished:
                score = log_prob / _penalty(len(tokens), length_penalty)
                candidates.append((score, j * fn.vocab_size, tokens, log_prob, True, code))
                continue
            log_probs, new_code, _ = fn.numpy_step(code, tokens[-1] if tokens else START)
            log_probs = _masked(log_probs, _blocked(tokens, **blocking))
            for v in range(fn.vocab_size):
                new_log_prob = np.float32(log_prob + log_probs[v])
                score = new_log_prob / _penalty(len(tokens) + 1, length_penalty)
                candidates.append(
                    (score, j * fn.vocab_size + v, [*tokens, v], new_log_prob, v == END, new_code)
                )
        candidates.sort(key=lambda c: (-c[0], c[1]))
        beam = [c[2:] for c in candidates[:beam_size]]
    scored = [
        (log_prob / _penalty(len(tokens), length_penalty), j, tokens, log_prob)
        for j, (tokens, log_prob, _, _) in enumerate(beam)
    ]
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [(tokens, log_prob) for _, _, tokens, log_prob in scored[:num_return]]


def _reference_constrained_beam(fn, code, words, max_length, beam_size, length_penalty, **blocking):
    """Constrained beam search for one disjunctive constraint written with Python lists,
    one image at a time, by the rules of `search.beam_search`: 2k slots, the first k for
    hypotheses holding none of `words`, the last k for those holding one (where an image
    without words starts). Each step lists every extension of every hypothesis (a
    finished one by `<pad>` at log-prob 0, a live one by each word `_blocked` allows); an
    extension from the second state or by one of `words` goes to the second state, the
    others to the first, and each state keeps its best k, ties to the lower (slot, token)
    index. The caption is the best of the second state, or of the first where the second
    is empty. Returns (tokens, log_prob)."""
    k = beam_size
    # A hypothesis: (tokens, log_prob, finished, code); None in a slot not filled.
    slots = [None] * (2 * k)
    slots[0 if words else k] = ([], np.float32(0.0), False, code)
    for _ in range(max_length):
        if not any(slot and not slot[2] for slot in slots):
            break
        states = ([], [])
        for j, slot in enumerate(slots):
            if slot is None:
                continue
            tokens, log_prob, finished, code = slot
            if finished:
                score = log_prob / _penalty(len(tokens), length_penalty)
                extensions = [(score, PAD, tokens, log_prob, True, code)]
            else:
                log_probs, new_code, _ = fn.numpy_step(code, tokens[-1] if tokens else START)
                banned = _blocked(tokens, **blocking)
                extensions = []
                for v in range(fn.vocab_size):
                    if v in banned:
                        continue
                    new_log_prob = np.float32(log_prob + log_probs[v])
                    score = new_log_prob / _penalty(len(tokens) + 1, length_penalty)
                    extensions.append((score, v, [*tokens, v], new_log_prob, v == END, new_code))
            for score, v, *hypothesis in extensions:
                holds = j >= k or (not finished and v in words)
                states[holds].append((score, j * fn.vocab_size + v, tuple(hypothesis)))
        slots = []
        for state in states:
            state.sort(key=lambda c: (-c[0], c[1]))
            kept = [hypothesis for _, _, hypothesis in state[:k]]
            slots += kept + [None] * (k - len(kept))
    final = [
        (slot[1] / _penalty(len(slot[0]), length_penalty), j, slot[0], slot[1])
        for j, slot in enumerate(slots)
        if slot is not None
    ]
    if any(j >= k for _, j, _, _ in final):
        final = [f for f in final if f[1] >= k]
    final.sort(key=lambda f: (-f[0], f[1]))
    return final[0][2], final[0][3]


def _all_sequences(fn, code, max_length, length_penalty, **blocking):
    """Every caption of at most max_length tokens with its score, best first; with
    `blocking` (`_blocked`), every caption none of whose words is blocked."""
    results = []

    def expand(tokens, log_prob, code):
        if len(tokens) == max_length or (tokens and tokens[-1] == END):
            score = log_prob / ((5.0 + len(tokens)) / 6.0) ** length_penalty
            results.append((score, tokens, log_prob))
            return
        log_probs, new_code, _ = fn.numpy_step(code, tokens[-1] if tokens else START)
        banned = _blocked(tokens, **blocking)
        for v in range(fn.vocab_size):
            if v not in banned:
                expand([*tokens, v], log_prob + float(log_probs[v]), new_code)

    expand([], 0.0, code)
    results.sort(key=lambda r: -r[0])
    return results


def _greedy(step_fn, state, batch_size, max_length, **kwargs):
    return search.greedy_decode(
        step_fn,
        state,
        batch_size=batch_size,
        start_id=START,
        end_id=END,
        max_length=max_length,
        num_locations=LOCATIONS,
        **kwargs,
    )


def _beam(step_fn, state, batch_size, max_length, beam_size, **kwargs):
    return search.beam_search(
        step_fn,
        state,
        batch_size=batch_size,
        start_id=START,
        end_id=END,
        max_length=max_length,
        beam_size=beam_size,
        num_locations=LOCATIONS,
        **kwargs,
    )


GREEDY_ROWS = {
    (0, 0, START): _probs(end=0.1, a=0.6, b=0.3),
    (0, 1, A): _probs(end=0.2, a=0.1, b=0.7),
    (0, 2, B): _probs(end=0.8, a=0.1, b=0.1),
    **{(1, t, p): _probs(end=0.05, a=0.9, b=0.05) for t in range(5) for p in range(VOCAB)},
}

# Greedy takes a (0.5) then <end> (0.4): 0.20; beam 2 keeps b (0.4) and finds <end> (0.9): 0.36.
BEAM_BEATS_GREEDY_ROWS = {
    (0, 0, START): _probs(end=0.1, a=0.5, b=0.4),
    (0, 1, A): _probs(end=0.4, a=0.35, b=0.25),
    (0, 1, B): _probs(end=0.9, a=0.05, b=0.05),
}

# [<end>] has log-prob log .52 = -0.654, [a b <end>] log(.47 * .99 * .99) = -0.775, but
# normalised by ((5 + 3) / 6) ** 1 the long caption scores -0.581 and wins.
LENGTH_ROWS = {
    (0, 0, START): _probs(end=0.52, a=0.47, b=0.01),
    (0, 1, A): _probs(end=0.005, a=0.005, b=0.99),
    (0, 2, B): _probs(end=0.99, a=0.005, b=0.005),
    (0, 1, PAD): _probs(end=0.005, a=0.99, b=0.005),
    (0, 2, PAD): _probs(end=0.005, a=0.99, b=0.005),
}


# With length_penalty=1 and beam 2, after step 1: [a b] scores ln(.7 * .357) / (7 / 6) = -1.189,
# [<end>] ln(.3) / 1 = -1.204, [a a] ln(.7 * .343) / (7 / 6) = -1.223: [a a] is pruned.
PRUNE_ROWS = {
    (0, 0, START): _probs(end=0.3, a=0.7),
    (0, 1, A): _probs(end=0.3, a=0.343, b=0.357),
}

# Greedy keeps a (0.5) and ends (0.34): 0.17. Beam 2 prefers [b a] (0.225) and [b b] (0.216)
# at step 1, drops [a <end>], and then finds nothing better than 0.225 * 0.34 = 0.0765.
GREEDY_BEATS_BEAM_ROWS = {
    (0, 0, START): _probs(end=0.05, a=0.5, b=0.45),
    (0, 1, A): _probs(end=0.34, a=0.33, b=0.33),
    (0, 1, B): _probs(end=0.02, a=0.5, b=0.48),
    (0, 2, A): _probs(end=0.34, a=0.33, b=0.33),
    (0, 2, B): _probs(end=0.34, a=0.33, b=0.33),
}


class GreedyDecodeTest(tf.test.TestCase):
    def test_argmax_chain_stops_at_end(self):
        fn = TableStep(GREEDY_ROWS, num_images=2, max_length=5)
        result = _greedy(fn, fn.initial_state([0, 1]), batch_size=2, max_length=5)

        self.assertAllEqual(result.tokens, [[A, B, END, 0, 0], [A, A, A, A, A]])
        self.assertAllEqual(result.length, [2, 5])
        self.assertAllClose(
            result.log_prob, [np.log(0.6) + np.log(0.7) + np.log(0.8), 5 * np.log(0.9)]
        )
        self.assertAllClose(result.attention[0, :3], fn.alphas(0, [A, B, END]))
        self.assertAllEqual(result.attention[0, 3:], np.zeros((2, LOCATIONS)))
        self.assertAllClose(result.attention[1], fn.alphas(1, [A] * 5))

    def test_stops_when_all_finished(self):
        fn = TableStep(GREEDY_ROWS, num_images=2, max_length=10)
        result = _greedy(fn, fn.initial_state([0, 0]), batch_size=2, max_length=10)

        self.assertEqual(fn.calls, 3)
        self.assertAllEqual(result.tokens[:, :4], [[A, B, END, 0]] * 2)
        self.assertAllEqual(result.tokens[:, 4:], np.zeros((2, 6)))

    def test_never_ending_caption_stops_at_max_length(self):
        fn = TableStep(GREEDY_ROWS, num_images=2, max_length=4)
        result = _greedy(fn, fn.initial_state([1]), batch_size=1, max_length=4)

        self.assertEqual(fn.calls, 4)
        self.assertAllEqual(result.tokens, [[A, A, A, A]])
        self.assertAllEqual(result.length, [4])
        self.assertAllClose(result.log_prob, [4 * np.log(0.9)])

    def test_matches_reference(self):
        fn = PathStep(seed=3)
        codes = np.arange(6, dtype=np.int32)
        result = _greedy(fn, tf.constant(codes), batch_size=6, max_length=6)

        for i, code in enumerate(codes):
            tokens = _reference_greedy(fn, code, 6)
            log_prob, alphas = fn.path(code, tokens)
            padded_tokens, padded_alphas = _pad(tokens, alphas, 6)
            self.assertAllEqual(result.tokens[i], padded_tokens)
            self.assertEqual(result.length[i], len(tokens) - (tokens[-1] == END))
            self.assertAllClose(result.log_prob[i], log_prob)
            self.assertAllClose(result.attention[i], padded_alphas)


class BeamSearchTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(0, 1, 2, 3)
    def test_beam_one_equals_greedy(self, seed):
        fn = PathStep(seed)
        state = tf.constant([5, 17, 3, 40], tf.int32)
        greedy = _greedy(fn, state, batch_size=4, max_length=7)
        beam = _beam(fn, state, batch_size=4, max_length=7, beam_size=1)

        self.assertAllEqual(beam.tokens, greedy.tokens)
        self.assertAllEqual(beam.length, greedy.length)
        self.assertAllEqual(beam.log_prob, greedy.log_prob)
        self.assertAllEqual(beam.attention, greedy.attention)

    def test_beam_two_finds_better_caption_than_greedy(self):
        fn = TableStep(BEAM_BEATS_GREEDY_ROWS, num_images=1, max_length=4)
        state = fn.initial_state([0])
        greedy = _greedy(fn, state, batch_size=1, max_length=4)
        beam = _beam(fn, state, batch_size=1, max_length=4, beam_size=2, num_return=2)

        self.assertAllEqual(greedy.tokens, [[A, END, 0, 0]])
        self.assertAllClose(greedy.log_prob, [np.log(0.5 * 0.4)])
        self.assertAllEqual(beam.tokens, [[[B, END, 0, 0], [A, END, 0, 0]]])
        self.assertAllEqual(beam.length, [[1, 1]])
        self.assertAllClose(beam.log_prob, [[np.log(0.4 * 0.9), np.log(0.5 * 0.4)]])
        self.assertAllClose(beam.attention[0, 0, :2], fn.alphas(0, [B, END]))
        self.assertAllClose(beam.attention[0, 1, :2], fn.alphas(0, [A, END]))

    def test_first_step_expands_one_beam(self):
        fn = TableStep(BEAM_BEATS_GREEDY_ROWS, num_images=1, max_length=1)
        beam = _beam(
            fn, fn.initial_state([0]), batch_size=1, max_length=1, beam_size=3, num_return=3
        )

        self.assertAllEqual(beam.tokens, [[[A], [B], [END]]])
        self.assertAllEqual(beam.length, [[1, 1, 0]])
        self.assertAllClose(beam.log_prob, np.log([[0.5, 0.4, 0.1]]))

    @parameterized.parameters(0.0, 1.0)
    def test_length_penalty_changes_choice(self, length_penalty):
        fn = TableStep(LENGTH_ROWS, num_images=1, max_length=4)
        beam = _beam(
            fn,
            fn.initial_state([0]),
            batch_size=1,
            max_length=4,
            beam_size=2,
            length_penalty=length_penalty,
        )

        if length_penalty:
            self.assertAllEqual(beam.tokens, [[A, B, END, 0]])
            self.assertAllEqual(beam.length, [2])
            self.assertAllClose(beam.log_prob, [np.log(0.47 * 0.99 * 0.99)])
        else:
            self.assertAllEqual(beam.tokens, [[END, 0, 0, 0]])
            self.assertAllEqual(beam.length, [0])
            self.assertAllClose(beam.log_prob, [np.log(0.52)])

    def test_length_penalty_used_for_pruning(self):
        fn = TableStep(PRUNE_ROWS, num_images=1, max_length=2)
        beam = _beam(
            fn,
            fn.initial_state([0]),
            batch_size=1,
            max_length=2,
            beam_size=2,
            length_penalty=1.0,
            num_return=2,
        )

        self.assertAllEqual(beam.tokens, [[[A, B], [END, 0]]])
        self.assertAllEqual(beam.length, [[2, 0]])
        self.assertAllClose(beam.log_prob, np.log([[0.7 * 0.357, 0.3]]))

    def test_beam_is_not_exhaustive(self):
        fn = TableStep(GREEDY_BEATS_BEAM_ROWS, num_images=1, max_length=3)
        state = fn.initial_state([0])
        greedy = _greedy(fn, state, batch_size=1, max_length=3)
        beam = _beam(fn, state, batch_size=1, max_length=3, beam_size=2)

        self.assertAllEqual(greedy.tokens, [[A, END, 0]])
        self.assertAllClose(greedy.log_prob, np.log([0.5 * 0.34]))
        self.assertAllEqual(beam.tokens, [[B, A, END]])
        self.assertAllClose(beam.log_prob, np.log([0.45 * 0.5 * 0.34]))

    def test_finished_hypothesis_not_extended(self):
        fn = TableStep(LENGTH_ROWS, num_images=1, max_length=4)
        beam = _beam(fn, fn.initial_state([0]), batch_size=1, max_length=4, beam_size=2)
        loose = _beam(
            fn, fn.initial_state([0]), batch_size=1, max_length=4, beam_size=2, compact=False
        )

        # Settled after the first step: the live hypothesis scores below the finished
        # one divided by the least penalty it could meet; the loop without that stop
        # runs to the end and returns the same.
        self.assertEqual(fn.calls, 1 + 3)
        self.assertAllEqual(loose.tokens, beam.tokens)
        self.assertAllEqual(beam.tokens, [[END, 0, 0, 0]])
        self.assertEqual(beam.log_prob[0], fn.log_table[0, 0, START, END])
        self.assertAllClose(beam.attention[0, 0], fn.alpha_table[0, 0, START])
        self.assertAllEqual(beam.attention[0, 1:], np.zeros((3, LOCATIONS)))

    def test_never_ending_caption_stops_at_max_length(self):
        fn = TableStep(GREEDY_ROWS, num_images=2, max_length=3)
        beam = _beam(fn, fn.initial_state([1]), batch_size=1, max_length=3, beam_size=2)

        self.assertEqual(fn.calls, 3)
        self.assertAllEqual(beam.tokens, [[A, A, A]])
        self.assertAllEqual(beam.length, [3])
        self.assertAllClose(beam.log_prob, [3 * np.log(0.9)])

    @parameterized.product(seed=[0, 1, 2], beam_size=[2, 4], length_penalty=[0.0, 1.5])
    def test_matches_reference(self, seed, beam_size, length_penalty):
        fn = PathStep(seed)
        codes = np.array([0, 11, 230], np.int32)
        beam = _beam(
            fn,
            tf.constant(codes),
            batch_size=3,
            max_length=6,
            beam_size=beam_size,
            length_penalty=length_penalty,
            num_return=2,
        )

        for i, code in enumerate(codes):
            reference = _reference_beam(fn, code, 6, beam_size, length_penalty, 2)
            for n, (tokens, log_prob) in enumerate(reference):
                padded_tokens, padded_alphas = _pad(tokens, fn.path(code, tokens)[1], 6)
                self.assertAllEqual(beam.tokens[i, n], padded_tokens)
                self.assertAllClose(beam.log_prob[i, n], log_prob)
                self.assertAllClose(beam.attention[i, n], padded_alphas)

    @parameterized.parameters(0.0, 1.0)
    def test_exhaustive_beam_finds_best_caption(self, length_penalty):
        fn = PathStep(seed=7)
        codes = np.array([2, 9, 31, 100], np.int32)
        wide = _beam(
            fn,
            tf.constant(codes),
            batch_size=4,
            max_length=3,
            beam_size=25,
            length_penalty=length_penalty,
            num_return=3,
        )
        greedy = _greedy(fn, tf.constant(codes), batch_size=4, max_length=3)

        for i, code in enumerate(codes):
            best = _all_sequences(fn, code, 3, length_penalty)[:3]
            for n, (_, tokens, log_prob) in enumerate(best):
                padded_tokens, padded_alphas = _pad(tokens, fn.path(code, tokens)[1], 3)
                self.assertAllEqual(wide.tokens[i, n], padded_tokens)
                self.assertAllClose(wide.log_prob[i, n], log_prob)
                self.assertAllClose(wide.attention[i, n], padded_alphas)
            self.assertGreaterEqual(wide.log_prob[i, 0], greedy.log_prob[i] - 1e-6)

    @parameterized.parameters(0, 1, 2, 3, 4, 5)
    def test_beam_at_least_as_likely_as_greedy(self, seed):
        fn = PathStep(seed)
        state = tf.range(8, dtype=tf.int32) * 13
        greedy = _greedy(fn, state, batch_size=8, max_length=5)
        beam = _beam(fn, state, batch_size=8, max_length=5, beam_size=3)

        self.assertAllGreaterEqual(beam.log_prob - greedy.log_prob, -1e-6)

    @parameterized.parameters(1, 3)
    def test_batch_equals_single_images(self, beam_size):
        fn = PathStep(seed=11)
        codes = [4, 50, 123, 7]
        batched = _beam(fn, tf.constant(codes), 4, max_length=6, beam_size=beam_size, num_return=1)
        for i, code in enumerate(codes):
            single = _beam(fn, tf.constant([code]), 1, max_length=6, beam_size=beam_size)
            for got, want in zip(batched, single, strict=True):
                self.assertAllEqual(got[i], want[0])

    def test_num_return_ordering_and_distinct(self):
        fn = PathStep(seed=5)
        beam = _beam(
            fn,
            tf.constant([1, 2, 3]),
            batch_size=3,
            max_length=5,
            beam_size=4,
            length_penalty=0.6,
            num_return=4,
        )

        self.assertEqual(beam.tokens.shape, (3, 4, 5))
        self.assertEqual(beam.attention.shape, (3, 4, 5, LOCATIONS))
        num_tokens = beam.length.numpy() + np.any(beam.tokens.numpy() == END, axis=-1)
        scores = beam.log_prob.numpy() / ((5.0 + num_tokens) / 6.0) ** 0.6
        self.assertAllGreaterEqual(scores[:, :-1] - scores[:, 1:], 0.0)
        for captions in beam.tokens.numpy():
            self.assertLen({tuple(c) for c in captions}, 4)

    def test_attention_follows_own_ancestors(self):
        fn = PathStep(seed=9)
        codes = np.array([3, 77], np.int32)
        beam = _beam(fn, tf.constant(codes), 2, max_length=6, beam_size=3, num_return=3)

        for i, code in enumerate(codes):
            for n in range(3):
                tokens = beam.tokens[i, n].numpy()
                num_tokens = beam.length[i, n] + int(END in tokens)
                log_prob, alphas = fn.path(code, tokens[:num_tokens])
                self.assertAllClose(beam.log_prob[i, n], log_prob)
                self.assertAllClose(beam.attention[i, n, :num_tokens], alphas)
                self.assertAllEqual(
                    beam.attention[i, n, num_tokens:], np.zeros((6 - num_tokens, LOCATIONS))
                )

    def test_invalid_arguments(self):
        fn = PathStep(seed=0)
        state = tf.constant([0])
        with self.assertRaisesRegex(ValueError, "num_return=3 must not exceed beam_size=2"):
            _beam(fn, state, 1, max_length=3, beam_size=2, num_return=3)
        with self.assertRaisesRegex(ValueError, "beam_size must be a positive"):
            _beam(fn, state, 1, max_length=3, beam_size=0)
        with self.assertRaisesRegex(ValueError, "max_length must be a positive"):
            _greedy(fn, state, 1, max_length=0)
        with self.assertRaisesRegex(ValueError, "num_locations=3"):
            _greedy(lambda t, s: (*fn(t, s)[:2], tf.ones([1, 5])), state, 1, max_length=3)


# Every step: <end> .02, a .6, b .38. Unblocked, greedy says a forever; blocked, a a b a a,
# then a (third in a row) and b (trigram a a b again) are banned and <end> comes.
REPEAT_ROWS = {(0, t, p): _probs(end=0.02, a=0.6, b=0.38) for t in range(8) for p in range(VOCAB)}

BLOCKINGS = [
    dict(block_repeats=True),
    dict(bad_endings=(A,)),
    dict(block_repeats=True, bad_endings=(A, B)),
]


def _search_blocking(blocking):
    return dict(
        block_repeats=blocking.get("block_repeats", False),
        bad_ending_ids=blocking.get("bad_endings", ()),
    )


def _has_repeat(tokens, length):
    words = [int(w) for w in tokens[:length]]
    triples = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(set(triples)) < len(triples) or any(len(set(x)) == 1 for x in triples)


class BlockingTest(tf.test.TestCase, parameterized.TestCase):
    def test_greedy_repeats_blocked_by_hand(self):
        fn = TableStep(REPEAT_ROWS, num_images=1, max_length=8)
        state = fn.initial_state([0])
        plain = _greedy(fn, state, batch_size=1, max_length=8)
        blocked = _greedy(fn, state, batch_size=1, max_length=8, block_repeats=True)

        self.assertAllEqual(plain.tokens, [[A] * 8])
        self.assertAllEqual(blocked.tokens, [[A, A, B, A, A, END, 0, 0]])
        self.assertAllEqual(blocked.length, [5])
        self.assertAllClose(blocked.log_prob, [np.log(0.6**4 * 0.38 * 0.02)])
        self.assertAllClose(blocked.attention[0, :6], fn.alphas(0, [A, A, B, A, A, END]))

    def test_bad_ending_blocked_by_hand(self):
        fn = TableStep(BEAM_BEATS_GREEDY_ROWS, num_images=1, max_length=3)
        state = fn.initial_state([0])
        ends_on_a = _greedy(fn, state, batch_size=1, max_length=3)
        no_bad_end = _greedy(fn, state, 1, max_length=3, bad_ending_ids=(A,))
        both = _greedy(fn, state, 1, max_length=3, bad_ending_ids=(A,), block_repeats=True)

        self.assertAllEqual(ends_on_a.tokens, [[A, END, 0]])
        self.assertAllEqual(no_bad_end.tokens, [[A, A, A]])
        self.assertAllClose(no_bad_end.log_prob, [np.log(0.5 * 0.35 * 0.45)])
        self.assertAllEqual(both.tokens, [[A, A, B]])
        self.assertAllClose(both.log_prob, [np.log(0.5 * 0.35 * 0.35)])

    @parameterized.product(seed=[0, 1, 2], blocking=BLOCKINGS)
    def test_greedy_matches_reference(self, seed, blocking):
        fn = PathStep(seed, end_logit=-2.0)
        codes = np.arange(0, 640, 10, dtype=np.int32)
        result = _greedy(fn, tf.constant(codes), 64, max_length=8, **_search_blocking(blocking))
        plain = _greedy(fn, tf.constant(codes), 64, max_length=8)

        self.assertNotAllEqual(result.tokens, plain.tokens)
        for i, code in enumerate(codes):
            tokens = _reference_greedy(fn, code, 8, **blocking)
            log_prob, alphas = fn.path(code, tokens)
            padded_tokens, padded_alphas = _pad(tokens, alphas, 8)
            self.assertAllEqual(result.tokens[i], padded_tokens)
            self.assertAllClose(result.log_prob[i], log_prob)
            self.assertAllClose(result.attention[i], padded_alphas)

    @parameterized.product(seed=[0, 1], beam_size=[1, 3], blocking=BLOCKINGS)
    def test_beam_matches_reference(self, seed, beam_size, blocking):
        fn = PathStep(seed, end_logit=-2.0)
        codes = np.arange(0, 480, 15, dtype=np.int32)
        search_blocking = _search_blocking(blocking)
        beam = _beam(
            fn, tf.constant(codes), 32, 8, beam_size, length_penalty=0.5, **search_blocking
        )
        plain = _beam(fn, tf.constant(codes), 32, 8, beam_size, length_penalty=0.5)

        self.assertNotAllEqual(beam.tokens, plain.tokens)
        for i, code in enumerate(codes):
            ((tokens, log_prob),) = _reference_beam(fn, code, 8, beam_size, 0.5, 1, **blocking)
            padded_tokens, padded_alphas = _pad(tokens, fn.path(code, tokens)[1], 8)
            self.assertAllEqual(beam.tokens[i], padded_tokens)
            self.assertAllClose(beam.log_prob[i], log_prob)
            self.assertAllClose(beam.attention[i], padded_alphas)
            if blocking.get("block_repeats"):
                self.assertFalse(_has_repeat(beam.tokens[i].numpy(), beam.length[i]))

    def test_blocked_under_tf_function(self):
        fn = TableStep(REPEAT_ROWS, num_images=1, max_length=8)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
        def decode(images):
            state = fn.initial_state(images)
            return _beam(fn, state, tf.shape(images)[0], 8, 2, block_repeats=True)

        result = decode(tf.constant([0, 0]))
        self.assertFalse(_has_repeat(result.tokens[0].numpy(), result.length[0]))
        self.assertAllEqual(result.tokens[0], result.tokens[1])


class GraphModeTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(1, 3)
    def test_tf_function_with_unknown_batch(self, beam_size):
        fn = TableStep(GREEDY_ROWS, num_images=2, max_length=5)
        signature = [tf.TensorSpec([None], tf.int32)]

        @tf.function(input_signature=signature)
        def greedy(images):
            batch = tf.shape(images)[0]
            return _greedy(fn, fn.initial_state(images), batch_size=batch, max_length=5)

        @tf.function(input_signature=signature)
        def beam(images):
            batch = tf.shape(images)[0]
            return _beam(fn, fn.initial_state(images), batch, max_length=5, beam_size=beam_size)

        images = tf.constant([0, 1, 0])
        for decode, eager in [
            (greedy, _greedy(fn, fn.initial_state(images), 3, max_length=5)),
            (beam, _beam(fn, fn.initial_state(images), 3, max_length=5, beam_size=beam_size)),
        ]:
            self.assertEqual(
                decode.get_concrete_function().structured_outputs.tokens.shape[0], None
            )
            for got, want in zip(decode(images), eager, strict=True):
                self.assertAllEqual(got, want)
            self.assertAllEqual(decode(images[:1]).tokens, [[A, B, END, 0, 0]])

    def test_greedy_converts_to_builtin_tflite(self):
        from ai_edge_litert.interpreter import Interpreter

        fn = PathStep(seed=4)

        @tf.function(input_signature=[tf.TensorSpec([3], tf.int32)])
        def greedy(codes):
            return _greedy(fn, codes, batch_size=3, max_length=6)._asdict()

        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [greedy.get_concrete_function()], greedy
        )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        interpreter = Interpreter(model_content=converter.convert())
        interpreter.allocate_tensors()
        codes = np.array([1, 20, 300], np.int32)
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], codes)
        interpreter.invoke()
        outputs = [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]
        tokens = next(o for o in outputs if o.shape == (3, 6) and o.dtype == np.int32)

        self.assertAllEqual(tokens, _greedy(fn, tf.constant(codes), 3, max_length=6).tokens)


def _constraint(rows):
    """bool (B, VOCAB) from one set of constraint words per image."""
    mask = np.zeros((len(rows), VOCAB), bool)
    for i, words in enumerate(rows):
        mask[i, list(words)] = True
    return tf.constant(mask)


class ConstrainedBeamSearchTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(0.0, 1.0)
    def test_exhaustive_beam_finds_best_caption_with_a_word(self, length_penalty):
        """With a beam as wide as every prefix, constrained beam search returns the best
        caption of those that hold a constraint word, enumerated in Python."""
        fn = PathStep(seed=3)
        codes = np.array([2, 9, 31, 100, 5], np.int32)
        words = [{B}, {A}, {A, B}, set(), {END}]
        got = _beam(
            fn,
            tf.constant(codes),
            batch_size=5,
            max_length=3,
            beam_size=25,
            length_penalty=length_penalty,
            constraint=_constraint(words),
        )
        for i, code in enumerate(codes):
            every = _all_sequences(fn, code, 3, length_penalty)
            held = [s for s in every if not words[i] or set(s[1]) & words[i]]
            _, tokens, log_prob = held[0]
            padded_tokens, padded_alphas = _pad(tokens, fn.path(code, tokens)[1], 3)
            self.assertAllEqual(got.tokens[i], padded_tokens)
            self.assertAllClose(got.log_prob[i], log_prob)
            self.assertAllClose(got.attention[i], padded_alphas)

    @parameterized.product(
        seed=[3, 4], length_penalty=[0.0, 1.0], blocking=[{}, BLOCKINGS[0], BLOCKINGS[2]]
    )
    def test_beam_three_matches_reference(self, seed, length_penalty, blocking):
        """At the preset's beam of 3, with and without repeat and ending blocking, the
        caption of the constrained beam search written in Python."""
        fn = PathStep(seed, end_logit=-2.0)
        codes = np.arange(0, 300, 10, dtype=np.int32)
        words = [({A}, {B}, {A, B}, set(), {END})[i % 5] for i in range(len(codes))]
        got = _beam(
            fn,
            tf.constant(codes),
            len(codes),
            8,
            3,
            length_penalty=length_penalty,
            constraint=_constraint(words),
            **_search_blocking(blocking),
        )
        plain = _beam(fn, tf.constant(codes), len(codes), 8, 3, length_penalty=length_penalty)
        self.assertNotAllEqual(got.tokens, plain.tokens)
        for i, code in enumerate(codes):
            tokens, log_prob = _reference_constrained_beam(
                fn, code, words[i], 8, 3, length_penalty, **blocking
            )
            self.assertTrue(not words[i] or set(tokens) & words[i], (i, tokens))
            padded_tokens, padded_alphas = _pad(tokens, fn.path(code, tokens)[1], 8)
            self.assertAllEqual(got.tokens[i], padded_tokens, msg=f"image {i}")
            self.assertAllClose(got.log_prob[i], log_prob)
            self.assertAllClose(got.attention[i], padded_alphas)
            if blocking.get("block_repeats"):
                self.assertFalse(_has_repeat(got.tokens[i].numpy(), got.length[i]))
        if blocking:
            unblocked = _beam(
                fn,
                tf.constant(codes),
                len(codes),
                8,
                3,
                length_penalty=length_penalty,
                constraint=_constraint(words),
            )
            self.assertNotAllEqual(got.tokens, unblocked.tokens)

    @parameterized.parameters(0.0, 1.0)
    def test_exhaustive_beam_with_blocking_finds_best_allowed_caption(self, length_penalty):
        """With repeat and ending blocking and a beam as wide as every prefix, the best
        caption holding a constraint word of those no blocked word is in, enumerated."""
        fn = PathStep(seed=3)
        codes = np.array([2, 9, 31, 100, 5, 77], np.int32)
        words = [{B}, {A}, {A, B}, set(), {END}, {A}]
        blocking = dict(block_repeats=True, bad_endings=(A, B))
        got = _beam(
            fn,
            tf.constant(codes),
            batch_size=len(codes),
            max_length=4,
            beam_size=125,
            length_penalty=length_penalty,
            constraint=_constraint(words),
            **_search_blocking(blocking),
        )
        for i, code in enumerate(codes):
            every = _all_sequences(fn, code, 4, length_penalty, **blocking)
            held = [s for s in every if not words[i] or set(s[1]) & words[i]]
            _, tokens, log_prob = held[0]
            padded_tokens, padded_alphas = _pad(tokens, fn.path(code, tokens)[1], 4)
            self.assertAllEqual(got.tokens[i], padded_tokens, msg=f"image {i}")
            self.assertAllClose(got.log_prob[i], log_prob)
            self.assertAllClose(got.attention[i], padded_alphas)

    @parameterized.parameters(1, 3)
    def test_no_constraint_words_equals_beam_search(self, beam_size):
        fn = PathStep(seed=11)
        codes = tf.constant([4, 50, 123, 7])
        plain = _beam(fn, codes, 4, max_length=6, beam_size=beam_size)
        none = _beam(fn, codes, 4, 6, beam_size, constraint=_constraint([set()] * 4))
        for got, want in zip(none, plain, strict=True):
            self.assertAllClose(got, want)

    def test_word_is_forced_in_by_hand(self):
        """Image 0 ends at once ([<end>] 0.8) unless made to say b: [b <end>] (0.1 * 0.9)
        beats [a b <end>] (0.1 * 0.5 * 0.9); image 1 can never say b and keeps its
        best caption."""
        rows = {
            (0, 0, START): _probs(end=0.8, a=0.1, b=0.1),
            (0, 1, A): _probs(end=0.4, a=0.1, b=0.5),
            (0, 1, B): _probs(end=0.9, a=0.05, b=0.05),
            **{(1, t, p): _probs(end=0.6, a=0.4) for t in range(4) for p in range(VOCAB)},
        }
        fn = TableStep(rows, num_images=2, max_length=4)
        got = _beam(
            fn,
            fn.initial_state([0, 1]),
            batch_size=2,
            max_length=4,
            beam_size=2,
            constraint=_constraint([{B}, {B}]),
        )
        self.assertAllEqual(got.tokens[0], [B, END, PAD, PAD])
        self.assertAllClose(got.log_prob[0], np.log(0.1 * 0.9))
        self.assertAllEqual(got.tokens[1], [END, PAD, PAD, PAD])
        self.assertAllClose(got.log_prob[1], np.log(0.6))

    def test_under_tf_function_with_unknown_batch(self):
        fn = PathStep(seed=2)

        @tf.function(
            input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, VOCAB], tf.bool)]
        )
        def decode(codes, constraint):
            return _beam(fn, codes, tf.shape(codes)[0], 5, 2, constraint=constraint)

        codes = tf.constant([3, 8, 21])
        mask = _constraint([{A}, set(), {B}])
        for got, want in zip(
            decode(codes, mask), _beam(fn, codes, 3, 5, 2, constraint=mask), strict=True
        ):
            self.assertAllClose(got, want)


class NBestTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(0.0, 1.0)
    def test_n_best_of_an_exhaustive_beam_are_the_best_captions(self, length_penalty):
        """A beam as wide as every prefix returns the n best captions of all there are,
        enumerated in Python, best first, each with its own log-probability."""
        fn = PathStep(seed=6)
        codes = np.array([2, 40, 311], np.int32)
        got = _beam(fn, tf.constant(codes), 3, 3, 25, length_penalty=length_penalty, num_return=5)
        for i, code in enumerate(codes):
            for n, (_, tokens, log_prob) in enumerate(
                _all_sequences(fn, code, 3, length_penalty)[:5]
            ):
                padded_tokens, padded_alphas = _pad(tokens, fn.path(code, tokens)[1], 3)
                self.assertAllEqual(got.tokens[i, n], padded_tokens, msg=(i, n))
                self.assertAllClose(got.log_prob[i, n], log_prob)
                self.assertAllClose(got.attention[i, n], padded_alphas)

    @parameterized.parameters(0.0, 1.0)
    def test_first_of_n_is_the_caption_of_one(self, length_penalty):
        fn = PathStep(seed=8, end_logit=-1.0)
        codes = tf.constant(np.arange(0, 200, 10, dtype=np.int32))
        words = _constraint([({A}, {B}, set(), {END})[i % 4] for i in range(20)])
        for constraint in (None, words):
            one = _beam(fn, codes, 20, 8, 3, length_penalty=length_penalty, constraint=constraint)
            three = _beam(
                fn,
                codes,
                20,
                8,
                3,
                length_penalty=length_penalty,
                constraint=constraint,
                num_return=3,
            )
            for got, want in zip(three, one, strict=True):
                self.assertAllEqual(got[:, 0], want)

    def test_constrained_n_best_hold_the_word_or_are_marked(self):
        """After one step image 0 (b: 0.1) holds one caption that says b: the second
        place is -inf, not a caption without b; image 1 can never say b and returns its
        two best without it."""
        rows = {
            (0, 0, START): _probs(end=0.8, a=0.1, b=0.1),
            (1, 0, START): _probs(end=0.6, a=0.4),
        }
        fn = TableStep(rows, num_images=2, max_length=1)
        got = _beam(
            fn, fn.initial_state([0, 1]), 2, 1, 2, num_return=2, constraint=_constraint([{B}] * 2)
        )
        self.assertAllEqual(got.tokens[0, 0], [B])
        self.assertAllClose(got.log_prob[0], [np.log(0.1), -np.inf])
        self.assertAllEqual(got.tokens[1], [[END], [A]])
        self.assertAllClose(got.log_prob[1], np.log([0.6, 0.4]))


def _sampled_beam(fn, codes, max_length, **kwargs):
    return _beam(fn, tf.constant(codes), len(codes), max_length, 1, **kwargs)


class SamplingTest(tf.test.TestCase, parameterized.TestCase):
    """Captions drawn by greedy decoding (`sampling.draw`) and by a beam of one per state
    (`sampling.perturb`): towards temperature 0 the undrawn captions, the log-probability
    the step's own, the first word as often as its probability says."""

    CODES = np.arange(0, 400, 7, dtype=np.int32)

    @parameterized.parameters(
        dict(),
        dict(length_penalty=1.0, block_repeats=True, bad_ending_ids=(A,)),
        dict(length_penalty=1.0, constraint="words"),
    )
    def test_near_zero_temperature_equals_the_undrawn_caption(self, **kwargs):
        fn = PathStep(seed=4, end_logit=-1.0)
        if kwargs.get("constraint"):
            kwargs["constraint"] = _constraint(
                [({A}, {B}, set())[i % 3] for i in range(len(self.CODES))]
            )
        seed = dict(drawing=sampling.Drawing(tf.constant([1, 2]), 1e-6))
        if "constraint" in kwargs:
            drawn = _sampled_beam(fn, self.CODES, 7, **seed, **kwargs)
            want = _sampled_beam(fn, self.CODES, 7, **kwargs)
        else:
            blocking = {k: v for k, v in kwargs.items() if k != "length_penalty"}
            drawn = _greedy(fn, tf.constant(self.CODES), len(self.CODES), 7, **seed, **blocking)
            want = _greedy(fn, tf.constant(self.CODES), len(self.CODES), 7, **blocking)
            beam = _sampled_beam(fn, self.CODES, 7, **seed, **kwargs)
            self.assertAllEqual(beam.tokens, want.tokens)
        for got, expected in zip(drawn, want, strict=True):
            self.assertAllClose(got, expected)

    @parameterized.parameters(dict(temperature=2.0), dict(temperature=0.7, top_p=0.8))
    def test_a_drawn_captions_log_prob_is_the_steps_own(self, **drawing):
        fn = PathStep(seed=5, end_logit=-1.0)
        seed = sampling.Drawing(tf.constant([9, 9]), **drawing)
        words = _constraint([({A}, set())[i % 2] for i in range(len(self.CODES))])
        drawn = [
            _greedy(fn, tf.constant(self.CODES), len(self.CODES), 6, drawing=seed),
            _sampled_beam(fn, self.CODES, 6, drawing=seed, constraint=words),
        ]
        for result in drawn:
            for i, code in enumerate(self.CODES):
                tokens = result.tokens[i].numpy()
                num_tokens = int(result.length[i]) + int(END in tokens)
                log_prob, alphas = fn.path(code, tokens[:num_tokens])
                self.assertAllClose(result.log_prob[i], log_prob)
                self.assertAllClose(result.attention[i, :num_tokens], alphas)
        # The constrained draws say their word (from every word; a nucleus may leave it
        # out of every step, as a beam may never reach it).
        if "top_p" not in drawing:
            for i in range(0, len(self.CODES), 2):
                self.assertIn(A, drawn[1].tokens[i, : drawn[1].length[i]].numpy().tolist())

    def test_first_words_follow_their_probabilities(self):
        # Every image starts from end .2, a .45, b .35: over 20,000 draws of each path,
        # the first word's shares; at temperature 2 those of sqrt(p), normalised.
        rows, probs = 20_000, np.array([0.0, 0.0, 0.2, 0.45, 0.35])
        fn = TableStep({}, num_images=1, max_length=1)
        state = fn.initial_state(np.zeros(rows, np.int32))
        for temperature, want in ((None, probs), (2.0, np.sqrt(probs) / np.sqrt(probs).sum())):
            drawing = dict(drawing=sampling.Drawing(tf.constant([3, 1]), temperature))
            paths = {
                "greedy": _greedy(fn, state, rows, 1, **drawing),
                "beam of one": _beam(fn, state, rows, 1, 1, **drawing),
                "constrained": _beam(
                    fn, state, rows, 1, 1, constraint=_constraint([set()] * rows), **drawing
                ),
            }
            for name, result in paths.items():
                got = np.bincount(result.tokens[:, 0].numpy(), minlength=VOCAB) / rows
                self.assertAllClose(got, want, atol=0.015, msg=(name, temperature))

    def test_a_seed_repeats_its_draws_and_another_does_not(self):
        fn = PathStep(seed=2)
        words = _constraint([{A}] * len(self.CODES))
        for draw in (
            lambda seed: _greedy(
                fn, tf.constant(self.CODES), len(self.CODES), 6, drawing=sampling.Drawing(seed)
            ),
            lambda seed: _sampled_beam(
                fn, self.CODES, 6, drawing=sampling.Drawing(seed), constraint=words
            ),
        ):
            first, again = draw(tf.constant([4, 5])), draw(tf.constant([4, 5]))
            other = draw(tf.constant([4, 6]))
            self.assertAllEqual(first.tokens, again.tokens)
            self.assertNotAllEqual(first.tokens, other.tokens)


if __name__ == "__main__":
    tf.test.main()
