"""Tests for sat_tf.model.per_image: beam search with each image's annotations held once
and the step run on live images only gives the captions of the step that reads a tiled
state; the compaction itself on hand-made rows."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model import per_image, search
from sat_tf.model.decoder import AttentionDecoder
from sat_tf.model.show_attend_tell import ShowAttendTell

VOCAB, WIDTH, LOCATIONS, FEATURES, IMAGES = 12, 8, 5, 6, 3
START, END = 1, 2


def _model(attention, score, seed=0):
    decoder = AttentionDecoder(
        VOCAB,
        embed_dim=WIDTH,
        hidden_dim=WIDTH,
        attention_dim=WIDTH,
        attention=attention,
        attention_score=score,
        name="decoder",
    )
    model = ShowAttendTell(decoder, feature_dim=FEATURES, seed=seed)
    model.build()
    rng = np.random.default_rng(seed)
    for w in model.trainable_weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    # A likely <end>, so that images finish at different steps.
    model.decoder.deep_output.bias.assign(np.eye(VOCAB, dtype=np.float32)[END] * 2.0)
    return model


def _features(seed=1):
    return np.random.default_rng(seed).normal(size=(IMAGES, LOCATIONS, FEATURES)).astype(np.float32)


class GroupedAttentionTest(parameterized.TestCase, tf.test.TestCase):
    @parameterized.product(
        attention=("soft", "hard"), score=("additive", "dot"), hard_decoding=("argmax", "expected")
    )
    def test_step_on_images_once_equals_the_step_on_a_tiled_state(
        self, attention, score, hard_decoding
    ):
        model = _model(attention, score)
        slots = 4
        state = model.decoder.initial_state(_features())
        tiled = tf.nest.map_structure(lambda x: tf.repeat(x, slots, axis=0), state)
        rest, _ = per_image.constants_apart(tiled)
        _, images = per_image.constants_apart(state)
        # Rows of one image differ in h and c, as hypotheses do after the first step.
        rng = np.random.default_rng(3)
        for key in ("h", "c"):
            rest[key] = rest[key] + rng.normal(size=rest[key].shape).astype(np.float32)
            tiled[key] = rest[key]
        tokens = tf.constant(rng.integers(3, VOCAB, size=IMAGES * slots), tf.int32)

        want = model.decoder.step(tokens, tiled, hard_decoding)
        got = model.decoder.step(tokens, rest, hard_decoding, images)
        self.assertAllClose(got[0], want[0], atol=1e-5)  # log-probabilities
        self.assertAllClose(got[2], want[2], atol=1e-6)  # attention
        for key in ("h", "c"):
            self.assertAllClose(got[1][key], want[1][key], atol=1e-5)


class BeamSearchTest(parameterized.TestCase, tf.test.TestCase):
    @parameterized.product(
        attention=("soft", "hard", "none"), score=("additive", "dot"), constrained=(False, True)
    )
    def test_constants_give_the_captions_of_the_tiled_state(self, attention, score, constrained):
        model = _model(attention, score, seed=7)
        state = model.decoder.initial_state(_features(seed=8))
        constraint = None
        if constrained:
            constraint = np.zeros((IMAGES, VOCAB), bool)
            constraint[0, [5, 6]] = True
            constraint[2, 9] = True
            constraint = tf.constant(constraint)
        common = dict(
            batch_size=IMAGES,
            start_id=START,
            end_id=END,
            max_length=7,
            beam_size=3,
            num_locations=LOCATIONS,
            block_repeats=True,
            constraint=constraint,
        )
        step_fn = model.decoding_step()
        want = search.beam_search(step_fn, state, **common)
        rest, constants = per_image.constants_apart(state)
        self.assertEqual(constants is None, attention == "none")
        for compact in (True, False):
            got = search.beam_search(step_fn, rest, constants=constants, compact=compact, **common)
            self.assertAllEqual(got.tokens, want.tokens)
            self.assertAllEqual(got.length, want.length)
            self.assertAllClose(got.log_prob, want.log_prob, atol=1e-5)
            self.assertAllClose(got.attention, want.attention, atol=1e-6)
        # And what `decode` runs for beam search is that path.
        decoded = model.decode(state, max_length=7, beam_size=3, block_repeats=True)
        plain = search.beam_search(step_fn, state, **{**common, "constraint": None})
        self.assertAllEqual(decoded.tokens, plain.tokens)


class LiveImagesStepTest(tf.test.TestCase):
    def test_only_the_rows_of_images_with_a_live_hypothesis_are_stepped(self):
        seen = {}

        def step(tokens, state, constants):
            seen.update(tokens=tokens.numpy(), rows=state["row"].numpy(), images=constants.numpy())
            log_probs = tf.cast(tokens[:, None] * 10 + tf.range(4)[None], tf.float32)
            alpha = tf.cast(state["row"][:, None] + tf.zeros([1, 3], tf.int32), tf.float32)
            return log_probs, {"row": state["row"] + 100}, alpha

        # Image 1 has finished (no live hypothesis); image 0 holds one live of two.
        live = tf.constant([[True, False], [False, False], [False, True]])
        tokens = tf.constant([3, 4, 5, 6, 7, 8])
        state = {"row": tf.range(6)}
        constants = tf.constant([[0.5], [1.5], [2.5]])
        log_probs, new_state, alpha = per_image.live_images_step(
            step, tokens, state, constants, live
        )
        self.assertAllEqual(seen["tokens"], [3, 4, 7, 8])
        self.assertAllEqual(seen["rows"], [0, 1, 4, 5])
        self.assertAllEqual(seen["images"], [[0.5], [2.5]])
        stepped = lambda t: [t * 10 + v for v in range(4)]
        want = [stepped(3), stepped(4), [0] * 4, [0] * 4, stepped(7), stepped(8)]
        self.assertAllEqual(log_probs, want)
        self.assertAllEqual(new_state["row"], [100, 101, 2, 3, 104, 105])
        self.assertAllEqual(alpha, [[r] * 3 if r in (0, 1, 4, 5) else [0] * 3 for r in range(6)])

    def test_groups_of_rows_each_read_their_images_constants(self):
        seen = {}

        def step(tokens, state, constants):
            seen.update(tokens=tokens.numpy(), images=constants.numpy())
            return tf.zeros([tf.shape(tokens)[0], 2]), state, tf.ones([tf.shape(tokens)[0], 1])

        # Two images of two states of two hypotheses: image 0's first state has never
        # started, both of image 1's hold a live one.
        live = tf.constant([[False, False, True, False], [True, False, False, True]])
        tokens = tf.range(8)
        constants = tf.constant([[0.5], [1.5]])
        _, _, alpha = per_image.live_images_step(step, tokens, tokens, constants, live, group=2)
        self.assertAllEqual(seen["tokens"], [2, 3, 4, 5, 6, 7])
        self.assertAllEqual(seen["images"], [[0.5], [1.5], [1.5]])
        self.assertAllEqual(alpha[:, 0], [0, 0, 1, 1, 1, 1, 1, 1])

    def test_without_constants_the_step_takes_two_arguments(self):
        def step(tokens, state):
            return tf.zeros([tf.shape(tokens)[0], 2]), state * 2, tf.ones([tf.shape(tokens)[0], 1])

        live = tf.constant([[False], [True]])
        out = per_image.live_images_step(step, tf.constant([1, 2]), tf.constant([5, 6]), None, live)
        self.assertAllEqual(out[1], [5, 12])
        self.assertAllEqual(out[2], [[0.0], [1.0]])

    def test_constants_apart(self):
        state = {"h": 1, "c": 2, "features": 3, "projected": 4}
        self.assertEqual(
            per_image.constants_apart(state), ({"h": 1, "c": 2}, {"features": 3, "projected": 4})
        )
        self.assertEqual(per_image.constants_apart({"h": 1}), ({"h": 1}, None))


if __name__ == "__main__":
    tf.test.main()
