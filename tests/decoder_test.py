"""Tests for sat_tf.model.decoder against a NumPy version of the paper's equations (§3.1.2, §4)."""

import fixtures
import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model.decoder import AttentionDecoder

BATCH, STEPS, LOCATIONS = 2, 5, 4
VOCAB, EMBED, HIDDEN, ATTENTION, FEATURES = 12, 6, 8, 5, 7
ATTENTIONS = ("soft", "hard", "none")
SCORES = ("additive", "dot", "scaled_dot")


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(BATCH, LOCATIONS, FEATURES)).astype(np.float32)
    captions = rng.integers(1, VOCAB, size=(BATCH, STEPS)).astype(np.int32)
    return features, captions


def _decoder(
    attention,
    score,
    dropout=0.0,
    seed=0,
    hard_gate=False,
    hard_decoding="argmax",
    global_context=False,
    start_state="mean",
    location_prior=False,
):
    """A built decoder whose weights (biases too) are random, so none of them is 0.
    Hard attention decodes at argmax unless told: `_numpy_decode` without noise does."""
    decoder = AttentionDecoder(
        VOCAB,
        embed_dim=EMBED,
        hidden_dim=HIDDEN,
        attention_dim=ATTENTION,
        attention=attention,
        attention_score=score,
        dropout=dropout,
        hard_gate=hard_gate,
        hard_decoding=hard_decoding,
        global_context=global_context,
        start_state=start_state,
        location_prior=location_prior,
        name="decoder",
    )
    decoder.build((None, LOCATIONS, FEATURES))
    rng = np.random.default_rng(seed)
    for w in decoder.weights:
        w.assign(0.5 * rng.normal(size=w.shape).astype(np.float32))
    return decoder


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _numpy_decode(decoder, features, captions, noise=None, use_expected=None):
    """Teacher-forced decoding written out from the paper, in float64.

    Returns logits (B, T, V), alpha (B, T, L), and for hard attention log_p_s and
    entropy (B, T). Hard attention attends at argmax(log alpha + noise), noise 0 if None.
    """

    def get(layer, name="kernel"):
        return getattr(layer, name).numpy().astype(np.float64)

    features = features.astype(np.float64)
    batch, steps = captions.shape
    rows = np.arange(batch)
    embeddings = get(decoder.embedding, "embeddings")
    mean = features.mean(1)
    if decoder.start_state == "mean":
        h = np.tanh(mean @ get(decoder.init_h) + get(decoder.init_h, "bias"))
        c = np.tanh(mean @ get(decoder.init_c) + get(decoder.init_c, "bias"))
    else:
        h = np.tile(np.tanh(get(decoder.init_h, "bias")), (batch, 1))
        c = np.tile(np.tanh(get(decoder.init_c, "bias")), (batch, 1))
    out = {"logits": [], "alpha": [], "log_p_s": [], "entropy": []}
    for t in range(steps):
        x = embeddings[captions[:, t]]
        if decoder.attention == "none":
            alpha = np.full((batch, features.shape[1]), 1.0 / features.shape[1])
            z = mean
        else:
            att = decoder.f_att
            # p_i, the per-cell vectors of `location_prior` (zero without it)
            place = get(att, "location_embedding") if att.location else 0.0
            if decoder.attention_score == "additive":
                pre = np.tanh(
                    features @ get(att.w_a)
                    + get(att.w_a, "bias")
                    + place
                    + (h @ get(att.u_a))[:, None]
                )
                e = (pre @ get(att.v))[..., 0]
            else:
                keys = features @ get(att.w_a)
                if decoder.attention_score == "scaled_dot":
                    keys /= np.sqrt(h.shape[-1])
                e = np.einsum("bln,bn->bl", keys + place, h)
            log_alpha = _log_softmax(e)
            alpha = np.exp(log_alpha)
            expected = np.einsum("bl,bld->bd", alpha, features)
            if decoder.attention == "soft":
                beta = _sigmoid(h @ get(decoder.beta) + get(decoder.beta, "bias"))
                z = beta * expected
            else:
                shifted = log_alpha if noise is None else log_alpha + noise[:, t]
                where = shifted.argmax(-1)
                z = features[rows, where]
                if use_expected is not None:
                    z = np.where(use_expected[:, None], expected, z)
                if decoder.hard_gate:
                    z = _sigmoid(h @ get(decoder.beta) + get(decoder.beta, "bias")) * z
                out["log_p_s"].append(log_alpha[rows, where])
                out["entropy"].append(-(alpha * log_alpha).sum(-1))
        gates = (
            x @ get(decoder.lstm_embed)
            + get(decoder.lstm_embed, "bias")
            + h @ get(decoder.lstm_hidden)
            + z @ get(decoder.lstm_context)
        )
        if decoder.global_context:
            gates += mean @ get(decoder.lstm_global)
        i, f, o, g = np.split(gates, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        pre = x + h @ get(decoder.out_h) + get(decoder.out_h, "bias") + z @ get(decoder.out_z)
        if decoder.global_context:
            pre += mean @ get(decoder.out_global)
        deep = np.tanh(pre)
        logits = deep @ get(decoder.deep_output) + get(decoder.deep_output, "bias")
        out["logits"].append(logits)
        out["alpha"].append(alpha)
    return {k: np.stack(v, axis=1) for k, v in out.items() if v}


def _gumbel(shape, seed):
    uniform = np.random.default_rng(seed).uniform(1e-9, 1.0, size=shape)
    return (-np.log(-np.log(uniform))).astype(np.float32)


@pytest.mark.long(9)
class AttentionDecoderTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(attention=ATTENTIONS, score=SCORES)
    def test_output_shapes(self, attention, score):
        features, captions = _inputs()
        outputs = _decoder(attention, score)(features, captions)
        self.assertEqual(outputs["logits"].shape, (BATCH, STEPS, VOCAB))
        self.assertEqual(outputs["alpha"].shape, (BATCH, STEPS, LOCATIONS))
        if attention == "hard":
            self.assertEqual(outputs["log_p_s"].shape, (BATCH, STEPS))
            self.assertEqual(outputs["entropy"].shape, (BATCH, STEPS))
        else:
            self.assertNotIn("log_p_s", outputs)

    @parameterized.product(attention=ATTENTIONS, score=SCORES)
    def test_weight_count(self, attention, score):
        m, n, a, d, v = EMBED, HIDDEN, ATTENTION, FEATURES, VOCAB
        expected = (
            v * m  # E
            + 2 * (d * n + n)  # init_h, init_c
            + (m * 4 * n + 4 * n)  # lstm_embed
            + n * 4 * n  # lstm_hidden
            + d * 4 * n  # lstm_context
            + (n * m + m)  # L_h
            + d * m  # L_z
            + (m * v + v)  # deep_output
        )
        if attention != "none":
            expected += (d * a + a) + n * a + a if score == "additive" else d * n
        if attention == "soft":
            expected += n + 1
        decoder = _decoder(attention, score)
        self.assertEqual(sum(int(np.prod(w.shape)) for w in decoder.trainable_weights), expected)

    @parameterized.product(attention=ATTENTIONS, score=SCORES)
    def test_call_matches_numpy(self, attention, score):
        features, captions = _inputs()
        decoder = _decoder(attention, score)
        outputs = decoder(features, captions)
        expected = _numpy_decode(decoder, features, captions)
        self.assertAllClose(outputs["logits"], expected["logits"], atol=1e-4)
        self.assertAllClose(outputs["alpha"], expected["alpha"], atol=1e-5)
        if attention == "hard":
            self.assertAllClose(outputs["log_p_s"], expected["log_p_s"], atol=1e-5)
            self.assertAllClose(outputs["entropy"], expected["entropy"], atol=1e-5)

    def _assert_steps_match(self, decoder, features, captions, expected):
        """Decoding word by word with `step` gives `expected`'s words and maps."""
        state = decoder.initial_state(features)
        for t in range(STEPS):
            log_probs, state, alpha = decoder.step(captions[:, t], state)
            self.assertAllClose(log_probs, _log_softmax(expected["logits"][:, t]), atol=1e-4)
            self.assertAllClose(alpha, expected["alpha"][:, t], atol=1e-5)

    @parameterized.product(attention=ATTENTIONS, score=SCORES)
    def test_step_matches_numpy(self, attention, score):
        features, captions = _inputs(seed=1)
        decoder = _decoder(attention, score, seed=1)
        self._assert_steps_match(
            decoder, features, captions, _numpy_decode(decoder, features, captions)
        )

    @parameterized.product(score=SCORES, hard_gate=(False, True))
    def test_hard_step_decodes_with_the_expected_context(self, score, hard_gate):
        # hard_decoding="expected" reads sum_i alpha_i a_i (gated when hard_gate) at every
        # step: the training pass of a caption drawn to use the expected context.
        features, captions = _inputs(seed=7)
        decoder = _decoder("hard", score, seed=7, hard_gate=hard_gate, hard_decoding="expected")
        every = np.ones(BATCH, dtype=bool)
        expected = _numpy_decode(decoder, features, captions, use_expected=every)
        at_argmax = _numpy_decode(decoder, features, captions)
        self._assert_steps_match(decoder, features, captions, expected)
        # The two rules give other words here, so the check above tells them apart.
        self.assertGreater(np.abs(expected["logits"] - at_argmax["logits"]).max(), 1e-2)

    def test_unknown_hard_decoding_is_refused(self):
        with self.assertRaisesRegex(ValueError, "hard_decoding='sample' is not one of"):
            AttentionDecoder(VOCAB, attention="hard", hard_decoding="sample")

    @parameterized.product(attention=ATTENTIONS, score=SCORES)
    def test_call_matches_step(self, attention, score):
        features, captions = _inputs(seed=2)
        decoder = _decoder(attention, score, seed=2)
        outputs = decoder(features, captions)
        log_probs_call = tf.nn.log_softmax(outputs["logits"])
        state = decoder.initial_state(features)
        for t in range(STEPS):
            log_probs, state, alpha = decoder.step(captions[:, t], state)
            self.assertAllClose(log_probs, log_probs_call[:, t], atol=1e-5)
            self.assertAllClose(alpha, outputs["alpha"][:, t], atol=1e-6)

    @parameterized.parameters(*SCORES)
    def test_hard_noise_fixes_the_sample(self, score):
        features, captions = _inputs(seed=3)
        decoder = _decoder("hard", score, seed=3)
        noise = _gumbel((BATCH, STEPS, LOCATIONS), seed=3)
        outputs = decoder(features, captions, gumbel_noise=noise)
        log_alpha = np.log(outputs["alpha"].numpy())
        where = (log_alpha + noise).argmax(-1)  # (B, T)
        chosen = np.take_along_axis(log_alpha, where[..., None], axis=-1)[..., 0]
        self.assertAllClose(outputs["log_p_s"], chosen, atol=1e-5)
        expected = _numpy_decode(decoder, features, captions, noise=noise)
        self.assertAllClose(outputs["logits"], expected["logits"], atol=1e-4)
        self.assertAllClose(outputs["log_p_s"], expected["log_p_s"], atol=1e-5)
        # The noise moves the sample away from the argmax somewhere, so it was used.
        self.assertNotAllEqual(where, log_alpha.argmax(-1))

    @parameterized.parameters(*SCORES)
    def test_use_expected_is_soft_context_without_beta(self, score):
        features, captions = _inputs(seed=4)
        hard = _decoder("hard", score, seed=4)
        soft = _decoder("soft", score)
        by_path = {w.path: w for w in hard.weights}
        for w in soft.weights:
            if w.path in by_path:
                w.assign(by_path[w.path])
        soft.beta.kernel.assign(tf.zeros_like(soft.beta.kernel))
        soft.beta.bias.assign([40.0])  # beta_t = sigmoid(40) = 1 in float32.
        noise = _gumbel((BATCH, STEPS, LOCATIONS), seed=4)
        mixed = hard(
            features, captions, gumbel_noise=noise, use_expected=tf.constant([True, False])
        )
        sampled = hard(features, captions, gumbel_noise=noise)
        expected = soft(features, captions)
        self.assertAllClose(mixed["logits"][0], expected["logits"][0], atol=1e-5)
        self.assertAllClose(mixed["alpha"][0], expected["alpha"][0], atol=1e-6)
        self.assertAllClose(mixed["logits"][1], sampled["logits"][1], atol=1e-6)
        self.assertNotAllClose(mixed["logits"][0], sampled["logits"][0], atol=1e-3)
        reference = _numpy_decode(
            hard, features, captions, noise=noise, use_expected=np.array([True, False])
        )
        self.assertAllClose(mixed["logits"], reference["logits"], atol=1e-4)
        self.assertAllClose(mixed["log_p_s"], reference["log_p_s"], atol=1e-5)

    @parameterized.parameters(*SCORES)
    def test_hard_gate_scales_the_glimpse(self, score):
        features, captions = _inputs(seed=6)
        gated = _decoder("hard", score, seed=6, hard_gate=True)
        self.assertEqual(gated.beta.kernel.shape, (HIDDEN, 1))
        noise = _gumbel((BATCH, STEPS, LOCATIONS), seed=6)
        use_expected = np.array([True, False])
        outputs = gated(features, captions, gumbel_noise=noise, use_expected=use_expected)
        reference = _numpy_decode(gated, features, captions, noise, use_expected)
        self.assertAllClose(outputs["logits"], reference["logits"], atol=1e-4)
        self.assertAllClose(outputs["log_p_s"], reference["log_p_s"], atol=1e-5)
        # Decoding attends at argmax alpha, gated the same way.
        greedy = _numpy_decode(gated, features, captions)
        state = gated.initial_state(features)
        for t in range(STEPS):
            log_probs, state, _ = gated.step(captions[:, t], state)
            self.assertAllClose(log_probs, _log_softmax(greedy["logits"][:, t]), atol=1e-4)
        # The gate is there: with its weights moved the outputs move.
        gated.beta.bias.assign(gated.beta.bias - 3.0)
        moved = gated(features, captions, gumbel_noise=noise, use_expected=use_expected)
        self.assertNotAllClose(moved["logits"], outputs["logits"], atol=1e-3)
        # Only hard attention takes the flag: soft is gated anyway, none has no glimpse.
        ungated = _decoder("none", score, hard_gate=True)
        self.assertFalse(ungated.hard_gate)
        self.assertIsNone(ungated.beta)

    @parameterized.product(attention=ATTENTIONS, score=SCORES)
    def test_alpha_rows_sum_to_one(self, attention, score):
        features, captions = _inputs(seed=5)
        alpha = _decoder(attention, score, seed=5)(features, captions)["alpha"].numpy()
        self.assertAllClose(alpha.sum(-1), np.ones((BATCH, STEPS)), atol=1e-6)
        self.assertAllGreaterEqual(alpha, 0.0)
        if attention == "none":
            self.assertAllClose(alpha, np.full_like(alpha, 1.0 / LOCATIONS))
        else:
            self.assertGreater(np.abs(alpha - 1.0 / LOCATIONS).max(), 0.05)

    @parameterized.product(attention=("soft", "hard"), score=SCORES)
    def test_global_context_matches_numpy(self, attention, score):
        # The mean annotation joins the gates (G) and the output (L_g) at every step, in
        # the teacher-forced pass (fused recurrence for soft) and word by word.
        features, captions = _inputs(seed=8)
        decoder = _decoder(attention, score, seed=8, hard_gate=True, global_context=True)
        self.assertEqual(decoder.lstm_global.kernel.shape, (FEATURES, 4 * HIDDEN))
        self.assertEqual(decoder.out_global.kernel.shape, (FEATURES, EMBED))
        expected = _numpy_decode(decoder, features, captions)
        outputs = decoder(features, captions)
        self.assertAllClose(outputs["logits"], expected["logits"], atol=1e-4)
        self.assertAllClose(outputs["alpha"], expected["alpha"], atol=1e-5)
        self._assert_steps_match(decoder, features, captions, expected)
        # Both terms move the outputs, so the reference above tells them apart.
        for layer in (decoder.lstm_global, decoder.out_global):
            kept = layer.kernel.numpy()
            layer.kernel.assign(np.zeros_like(kept))
            self.assertNotAllClose(decoder(features, captions)["logits"], outputs["logits"])
            layer.kernel.assign(kept)
        # G abar and L_g abar are all the weights it adds.
        plain = _decoder(attention, score, hard_gate=True)
        added = sum(np.prod(w.shape) for w in decoder.weights) - sum(
            np.prod(w.shape) for w in plain.weights
        )
        self.assertEqual(added, FEATURES * (4 * HIDDEN + EMBED))
        fixtures.check_round_trip(self, decoder, features, captions, output=lambda y: y["logits"])
        self.assertTrue(decoder.get_config()["global_context"])

    @parameterized.product(attention=ATTENTIONS, score=("additive", "dot"))
    def test_learned_start_matches_numpy(self, attention, score):
        # h_0, c_0 are tanh of the init layers' biases for every image: teacher forcing
        # and word-by-word decoding follow the reference that starts there.
        features, captions = _inputs(seed=10)
        decoder = _decoder(attention, score, seed=10, hard_gate=True, start_state="learned")
        expected = _numpy_decode(decoder, features, captions)
        outputs = decoder(features, captions)
        self.assertAllClose(outputs["logits"], expected["logits"], atol=1e-4)
        self.assertAllClose(outputs["alpha"], expected["alpha"], atol=1e-5)
        self._assert_steps_match(decoder, features, captions, expected)
        # The start does not depend on the image; from the mean annotation it does, and
        # the reference above tells the two apart.
        other = _inputs(seed=11)[0]
        for key in ("h", "c"):
            self.assertAllEqual(
                decoder.initial_state(features)[key], decoder.initial_state(other)[key]
            )
        decoder.start_state = "mean"
        self.assertNotAllClose(decoder(features, captions)["logits"], outputs["logits"])
        decoder.start_state = "learned"
        fixtures.check_round_trip(self, decoder, features, captions, output=lambda y: y["logits"])
        self.assertEqual(decoder.get_config()["start_state"], "learned")

    @parameterized.product(attention=("soft", "hard"), score=SCORES)
    def test_location_prior_matches_numpy(self, attention, score):
        # Each cell's vector p_i joins W_a a_i; teacher forcing and word-by-word decoding
        # follow the reference that adds it, and zeroing it changes the attention.
        features, captions = _inputs(seed=12)
        decoder = _decoder(attention, score, seed=12, hard_gate=True, location_prior=True)
        place = decoder.f_att.location_embedding
        self.assertEqual(tuple(place.shape), (LOCATIONS, decoder.f_att.units))
        expected = _numpy_decode(decoder, features, captions)
        outputs = decoder(features, captions)
        self.assertAllClose(outputs["logits"], expected["logits"], atol=1e-4)
        self.assertAllClose(outputs["alpha"], expected["alpha"], atol=1e-5)
        self._assert_steps_match(decoder, features, captions, expected)
        kept = place.numpy()
        place.assign(np.zeros_like(kept))
        self.assertNotAllClose(decoder(features, captions)["alpha"], outputs["alpha"])
        place.assign(kept)
        fixtures.check_round_trip(self, decoder, features, captions, output=lambda y: y["logits"])
        self.assertTrue(decoder.get_config()["location_prior"])

    def test_location_prior_needs_the_number_of_cells(self):
        decoder = AttentionDecoder(VOCAB, location_prior=True, name="decoder")
        with self.assertRaisesRegex(
            ValueError, "f_att: location=True .* needs the number of cells"
        ):
            decoder.build((None, None, FEATURES))
        decoder = _decoder("soft", "additive", location_prior=True)
        other = np.zeros((BATCH, LOCATIONS + 1, FEATURES), np.float32)
        with self.assertRaisesRegex(ValueError, f"built for {LOCATIONS} cells; the features have"):
            decoder.initial_state(other)
        with self.assertRaisesRegex(ValueError, "location_prior=True acts on attention"):
            AttentionDecoder(VOCAB, attention="none", location_prior=True)

    def test_unknown_start_state_is_refused(self):
        with self.assertRaisesRegex(ValueError, "start_state='zeros' is not one of"):
            AttentionDecoder(VOCAB, start_state="zeros")

    def test_global_context_needs_an_attended_context(self):
        with self.assertRaisesRegex(ValueError, "global_context=True .* attention='none'"):
            AttentionDecoder(VOCAB, attention="none", global_context=True)

    def test_dropout_only_in_training(self):
        features, captions = _inputs()
        decoder = _decoder("soft", "additive", dropout=0.5)
        expected = _numpy_decode(decoder, features, captions)["logits"]
        self.assertAllClose(decoder(features, captions)["logits"], expected, atol=1e-4)
        trained = decoder(features, captions, training=True)["logits"]
        self.assertNotAllClose(trained, expected, atol=1e-3)

    @parameterized.product(attention=ATTENTIONS, score=SCORES)
    def test_config_round_trip(self, attention, score):
        features, captions = _inputs()
        decoder = _decoder(attention, score)
        config = decoder.get_config()
        self.assertEqual(config["attention"], attention)
        self.assertEqual(config["attention_score"], score)
        fixtures.check_round_trip(self, decoder, features, captions, output=lambda y: y["logits"])

    @parameterized.product(attention=ATTENTIONS, score=SCORES)
    def test_keras_save_load(self, attention, score):
        features, captions = _inputs()
        decoder = _decoder(attention, score)
        feature_input = keras.Input((LOCATIONS, FEATURES), name="features")
        caption_input = keras.Input((STEPS,), dtype="int32", name="captions")
        outputs = decoder(feature_input, caption_input)
        wrapper = keras.Model([feature_input, caption_input], outputs["logits"])
        expected = _numpy_decode(decoder, features, captions)["logits"]
        fixtures.check_saved_model_file(self, wrapper, [features, captions], expected, 1e-4)

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "attention"):
            AttentionDecoder(VOCAB, attention="stochastic")
        with self.assertRaisesRegex(ValueError, "attention_score"):
            AttentionDecoder(VOCAB, attention_score="cosine")


if __name__ == "__main__":
    tf.test.main()
