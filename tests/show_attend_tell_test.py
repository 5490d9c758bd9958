"""Tests for sat_tf.model.show_attend_tell.ShowAttendTell on cached features and on the
shapes encoder."""

import os
from unittest import mock

import fixtures
import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

from sat_tf.model import losses
from sat_tf.model.decoder import AttentionDecoder
from sat_tf.model.encoder import ImageEncoder
from sat_tf.model.fast import schedule
from sat_tf.model.losses import BASELINE_SLOTS
from sat_tf.model.show_attend_tell import Generated, ShowAttendTell

VOCAB, WIDTH, LOCATIONS, FEATURES = 12, 8, 4, 8
START, END = 1, 2
ATTENTIONS = ("soft", "hard", "none")


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "features": rng.normal(size=(2, LOCATIONS, FEATURES)).astype(np.float32),
        "caption": np.array([[1, 5, 6, 7, 2, 0], [1, 8, 9, 2, 0, 0]], np.int32),
    }


def _model(
    attention="soft",
    score="additive",
    dropout=0.0,
    seed=0,
    alpha_c=0.0,
    hard_decoding="expected",
    hard_gate=False,
    **reinforce,
):
    decoder = AttentionDecoder(
        VOCAB,
        embed_dim=WIDTH,
        hidden_dim=WIDTH,
        attention_dim=WIDTH,
        attention=attention,
        attention_score=score,
        dropout=dropout,
        hard_decoding=hard_decoding,
        hard_gate=hard_gate,
        name="decoder",
    )
    # The paper's hard attention (§4.1) unless a test says otherwise.
    paper = {"reinforce_reward": "sequence", "reinforce_baseline": "moving_average"}
    reinforce = {**paper, "hard_warmup_steps": 0, **reinforce}
    model = ShowAttendTell(
        decoder, feature_dim=FEATURES, alpha_c=alpha_c, reinforce=reinforce, seed=seed
    )
    model.build()
    return model


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _numpy_word_log_likelihood(logits, captions):
    """(B, T) log p(y_t) of the targets captions[:, 1:], 0 at pad."""
    targets = captions[:, 1:]
    log_probs = np.take_along_axis(_log_softmax(logits), targets[..., None], -1)[..., 0]
    return log_probs * (targets != 0)


def _numpy_log_likelihood(logits, captions):
    """(B,) sum of log p(y_t) over the non-pad targets captions[:, 1:]."""
    return _numpy_word_log_likelihood(logits, captions).sum(-1)


@pytest.mark.long(2)
class ShowAttendTellTest(tf.test.TestCase, parameterized.TestCase):
    def setUp(self):
        super().setUp()
        keras.utils.set_random_seed(0)

    @parameterized.parameters(*ATTENTIONS)
    def test_fit_lowers_loss(self, attention):
        batch = _batch()
        model = _model(attention, dropout=0.1)
        model.compile(optimizer=keras.optimizers.Adam(0.02))
        before = -_numpy_log_likelihood(model(batch)["logits"].numpy(), batch["caption"])
        dataset = tf.data.Dataset.from_tensors(batch).repeat(25)
        history = model.fit(dataset, epochs=1, verbose=0)
        after = -_numpy_log_likelihood(model(batch)["logits"].numpy(), batch["caption"])
        self.assertLess(after.mean(), 0.5 * before.mean())
        expected_metrics = {"loss", "nll_per_word"} | ({"reward"} if attention == "hard" else set())
        self.assertEqual(set(history.history), expected_metrics)

    @parameterized.parameters(0.0, 0.5)
    def test_hard_baseline_moving_average(self, mix):
        batch = _batch()
        model = _model("hard", seed=3, hard_mix_prob=mix)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        self.assertAllEqual(model.baseline.numpy(), np.zeros(BASELINE_SLOTS))
        expected, seen = np.zeros(BASELINE_SLOTS), np.zeros(BASELINE_SLOTS)
        for _ in range(4):
            # Draw the step's samples here, then again from the same seed state in fit.
            seed_state = model.seed_generator.state.numpy()
            terms = model.loss_terms(batch, training=True)
            reward, sampled = terms["reward"].numpy(), terms["sampled"].numpy()
            model.seed_generator.state.assign(seed_state)
            history = model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
            # One baseline per caption length: the two captions have 4 and 3 target words.
            # Only captions that used a sampled location move it; the first such batch of
            # a length sets it, later ones move it by 0.1.
            for row, words in enumerate((4, 3)):
                if sampled[row]:
                    old = expected[words]
                    expected[words] = (
                        reward[row] if not seen[words] else 0.9 * old + 0.1 * reward[row]
                    )
                    seen[words] = 1.0
            self.assertAllClose(model.baseline.numpy(), expected, atol=1e-5)
            self.assertAllEqual(model.baseline_seen.numpy(), seen)
            self.assertAllClose(history.history["reward"][0], reward.mean(), atol=1e-5)
            self.assertLess(reward.mean(), 0.0)
        if mix == 0.0:
            self.assertEqual(seen.sum(), 2.0)

    def test_hard_baseline_moving_average_of_rewards_to_go(self):
        batch = _batch()
        model = _model("hard", seed=3, hard_mix_prob=0.0, reinforce_reward="to_go")
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        expected, seen = np.zeros(BASELINE_SLOTS), np.zeros(BASELINE_SLOTS)
        for _ in range(3):
            seed_state = model.seed_generator.state.numpy()
            noise, _ = model.hard_noise(batch["features"], 5)
            model.seed_generator.state.assign(seed_state)
            outputs = model.decoder(
                batch["features"],
                batch["caption"][:, :-1],
                gumbel_noise=noise,
                use_expected=tf.zeros([2], tf.bool),
            )
            words = _numpy_word_log_likelihood(outputs["logits"].numpy(), batch["caption"])
            model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
            # Step t of a caption of n words carries the reward of its last n - t words,
            # and moves the slot n - t: slot k averages the rewards to go of both captions
            # that cover k words (4 and 3 target words: slots 1-3 get two values, 4 one).
            by_slot = {}
            for row, count in enumerate((4, 3)):
                for t in range(count):
                    by_slot.setdefault(count - t, []).append(words[row, t:].sum())
            for slot, values in by_slot.items():
                mean = np.mean(values)
                expected[slot] = mean if not seen[slot] else 0.9 * expected[slot] + 0.1 * mean
                seen[slot] = 1.0
            self.assertAllClose(model.baseline.numpy(), expected, atol=1e-4)
        self.assertAllEqual(np.flatnonzero(seen), [1, 2, 3, 4])

    def test_hard_warmup_uses_the_expected_context_only(self):
        batch = {
            "features": np.random.default_rng(0).normal(size=(64, LOCATIONS, FEATURES)),
            "caption": np.tile(_batch()["caption"], [32, 1]),
        }
        batch["features"] = batch["features"].astype(np.float32)
        model = _model("hard", hard_mix_prob=0.25, hard_warmup_steps=2)
        # Without an optimizer (no step count) there is no warm-up.
        _, use_expected = model.hard_noise(batch["features"], 5)
        self.assertBetween(np.mean(use_expected.numpy()), 0.05, 0.5)
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        shares = []
        for _ in range(4):
            terms = model.loss_terms(batch, training=True)
            shares.append(float(np.mean(terms["sampled"].numpy())))
            model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
            if len(shares) <= 2:
                self.assertAllEqual(model.baseline_seen.numpy(), np.zeros(BASELINE_SLOTS))
        # Steps 0 and 1 sample nothing; then about 3/4 of the captions use a sample.
        self.assertEqual(shares[:2], [0.0, 0.0])
        self.assertBetween(shares[2], 0.5, 0.95)
        self.assertBetween(shares[3], 0.5, 0.95)
        # One moving average per caption length (4 and 3 words).
        self.assertAllEqual(np.flatnonzero(model.baseline_seen.numpy()), [3, 4])

    def test_hard_baseline_ignores_expected_context_captions(self):
        batch = _batch()
        model = _model("hard", hard_mix_prob=1.0)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        model.fit(tf.data.Dataset.from_tensors(batch).repeat(3), epochs=1, verbose=0)
        self.assertAllEqual(model.baseline.numpy(), np.zeros(BASELINE_SLOTS))
        self.assertAllEqual(model.baseline_seen.numpy(), np.zeros(BASELINE_SLOTS))

    def test_train_and_test_on_batch(self):
        batch = _batch()
        model = _model("soft")
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        log_likelihood = _numpy_log_likelihood(model(batch)["logits"].numpy(), batch["caption"])
        logs = model.test_on_batch(batch, return_dict=True)
        self.assertAllClose(logs["loss"], -log_likelihood.mean(), atol=1e-5)
        logs = model.train_on_batch(batch, return_dict=True)
        self.assertAllClose(logs["loss"], -log_likelihood.mean(), atol=1e-5)

    def test_soft_loss_terms(self):
        batch = _batch(seed=1)
        model = _model("soft", alpha_c=0.7)
        outputs = model(batch)
        log_likelihood = _numpy_log_likelihood(outputs["logits"].numpy(), batch["caption"])
        mask = (batch["caption"][:, 1:] != 0).astype(np.float32)
        coverage = (outputs["alpha"].numpy() * mask[..., None]).sum(1)
        penalty = ((1.0 - coverage) ** 2).sum(-1)
        terms = model.loss_terms(batch, training=False)
        self.assertAllClose(terms["log_likelihood"], log_likelihood, atol=1e-5)
        self.assertAllClose(terms["loss"], -log_likelihood + 0.7 * penalty, atol=1e-5)
        self.assertAllClose(terms["objective"], terms["loss"])
        self.assertAllEqual(terms["words"], [4.0, 3.0])

    @parameterized.product(
        baseline=("argmax", "moving_average"), dropout=(0.0, 0.5), graph=(False, True)
    )
    def test_hard_objective_gradients_match_the_autodiff_loop(self, baseline, dropout, graph):
        # The whole objective of gated hard attention (likelihood, REINFORCE with the
        # baseline, entropy) through the fused recurrence (`fused_hard`) against the
        # autodiff loop: the recurrence is a schedule of the same step. With dropout, both
        # passes draw the same masks (the seed generators' states are restored before
        # each); under tf.function each schedule has its own trace.
        batch = _batch(seed=6)
        model = _model(
            "hard",
            seed=6,
            dropout=dropout,
            hard_gate=True,
            entropy_weight=0.01,
            reinforce_baseline=baseline,
        )
        rng = np.random.default_rng(6)
        for w in model.trainable_weights:
            w.assign(rng.normal(size=w.shape).astype(np.float32))
        noise = rng.gumbel(size=(2, 5, LOCATIONS)).astype(np.float32)
        use_expected = tf.constant([False, True])
        seeds = [v for v in model.non_trainable_variables if "seed_generator_state" in v.path]
        self.assertNotEmpty(seeds)
        start = [v.numpy() for v in seeds]

        def objective_and_gradients():
            for variable, value in zip(seeds, start, strict=True):
                variable.assign(value)
            with tf.GradientTape() as tape:
                terms = model.loss_terms(
                    batch, training=True, gumbel_noise=noise, use_expected=use_expected
                )
                objective = tf.reduce_sum(terms["objective"])
            return objective, tape.gradient(objective, model.trainable_weights)

        def run():
            return (tf.function(objective_and_gradients) if graph else objective_and_gradients)()

        model.decoder.fused_hard = False
        self.assertFalse(schedule.uses_recurrence(model.decoder))  # the loop where asked
        autodiff, autodiff_grads = run()
        model.decoder.fused_hard = True
        self.assertTrue(schedule.uses_recurrence(model.decoder))
        fused, fused_grads = run()
        self.assertAllClose(fused, autodiff, rtol=1e-5)
        for got, want in zip(fused_grads, autodiff_grads, strict=True):
            # The embedding's gradients are IndexedSlices.
            got, want = tf.convert_to_tensor(got), tf.convert_to_tensor(want)
            self.assertAllClose(got, want, rtol=1e-4, atol=1e-5)
        if dropout:
            # The masks bite: restored to the states the fused pass left (fresh masks,
            # the same noise), the objective moves.
            start = [v.numpy() for v in seeds]
            self.assertNotAllClose(run()[0], fused, rtol=1e-3)

    @parameterized.product(to_go=(True, False), baseline=("argmax", "moving_average"))
    def test_hard_loss_terms_use_the_given_samples(self, to_go, baseline):
        batch = _batch(seed=2)
        model = _model(
            "hard",
            entropy_weight=0.01,
            reinforce_reward="to_go" if to_go else "sequence",
            reinforce_baseline=baseline,
        )
        for w in model.trainable_weights:
            w.assign(np.random.default_rng(4).normal(size=w.shape).astype(np.float32))
        model.baseline.assign(-np.arange(BASELINE_SLOTS, dtype=np.float32))
        noise = np.random.default_rng(2).gumbel(size=(2, 5, LOCATIONS)).astype(np.float32)
        use_expected = tf.constant([False, True])
        terms = model.loss_terms(
            batch, training=True, gumbel_noise=noise, use_expected=use_expected
        )
        outputs = model.decoder(
            batch["features"],
            batch["caption"][:, :-1],
            gumbel_noise=noise,
            use_expected=use_expected,
        )
        words = _numpy_word_log_likelihood(outputs["logits"].numpy(), batch["caption"])
        log_likelihood = words.sum(-1)
        mask = (batch["caption"][:, 1:] != 0).astype(np.float32)
        # The reward credited to step t, and its baseline: the moving average of the slot
        # named by the number of words the reward covers (baseline[k] = -k here), or the
        # same reward of the caption decoded at argmax alpha (no noise).
        covered = np.cumsum(mask[:, ::-1], axis=1)[:, ::-1]  # (B, T) words t..
        if to_go:
            reward = np.cumsum(words[:, ::-1], axis=1)[:, ::-1]
            slots = covered
        else:
            reward = np.repeat(log_likelihood[:, None], 5, axis=1)
            slots = np.repeat(covered[:, :1], 5, axis=1)
        if baseline == "argmax":
            at_argmax = model.decoder(batch["features"], batch["caption"][:, :-1])["logits"]
            argmax_words = _numpy_word_log_likelihood(at_argmax.numpy(), batch["caption"])
            if to_go:
                expected_baseline = np.cumsum(argmax_words[:, ::-1], axis=1)[:, ::-1]
            else:
                expected_baseline = np.repeat(argmax_words.sum(-1)[:, None], 5, axis=1)
        else:
            expected_baseline = -slots
        credited = ((reward - expected_baseline) * outputs["log_p_s"].numpy() * mask).sum(-1)
        entropy = (outputs["entropy"].numpy() * mask).sum(-1)
        # Row 0 sampled: -(r + sum_t (r_t - b_t) log p(s_t) + 0.01 H); row 1 used the
        # expected context and carries neither term.
        expected = -log_likelihood
        expected[0] -= credited[0] + 0.01 * entropy[0]
        self.assertGreater(abs(credited[0]), 0.1)
        self.assertAllClose(terms["reward"], log_likelihood, atol=1e-4)
        self.assertAllClose(terms["objective"], expected, atol=1e-3)
        self.assertAllClose(terms["loss"], -log_likelihood, atol=1e-4)
        # No caption sampled (as in the warm-up): the objective is the likelihood alone,
        # with the argmax baseline's pass skipped.
        everywhere = tf.constant([True, True])
        unsampled = model.loss_terms(batch, gumbel_noise=noise, use_expected=everywhere)
        logits = model.decoder(
            batch["features"], batch["caption"][:, :-1], gumbel_noise=noise, use_expected=everywhere
        )["logits"]
        expected_only = _numpy_word_log_likelihood(logits.numpy(), batch["caption"]).sum(-1)
        self.assertAllClose(unsampled["objective"], -expected_only, atol=1e-4)

    @parameterized.parameters(True, False)
    def test_argmax_baseline_decodes_the_sampled_captions_alone(self, to_go):
        # Four captions, the 1st and 3rd sampled: the second pass decodes those two, and
        # their baselines equal the whole batch's pass at their rows; the others get 0.
        model = _model("hard", hard_gate=True)
        rng = np.random.default_rng(9)
        for w in model.trainable_weights:
            w.assign(rng.normal(size=w.shape).astype(np.float32))
        features = rng.normal(size=(4, LOCATIONS, FEATURES)).astype(np.float32)
        captions = np.array(
            [[1, 5, 6, 7, 2], [1, 8, 9, 2, 0], [1, 3, 2, 0, 0], [1, 4, 4, 5, 2]], np.int32
        )
        mask = tf.cast(captions[:, 1:] != 0, tf.float32)
        sampled = tf.constant([1.0, 0.0, 1.0, 0.0])
        reward = tf.zeros([4, 4] if to_go else [4])
        state = model.decoder.initial_state(features)
        whole = losses.argmax_reward(model.decoder, features, captions, mask, to_go)
        decoded, argmax_reward = [], losses.argmax_reward

        def recording(decoder, features, *args):
            decoded.append(features.shape[0])
            return argmax_reward(decoder, features, *args)

        with mock.patch.object(losses, "argmax_reward", recording):
            got = losses.sampled_argmax_reward(
                model.decoder, features, captions, mask, to_go, sampled, reward, state
            )
            none = losses.sampled_argmax_reward(
                model.decoder, features, captions, mask, to_go, 0.0 * sampled, reward, state
            )
        self.assertEqual(decoded, [2])
        self.assertEqual(got.shape, reward.shape)
        self.assertAllClose(tf.gather(got, [0, 2]), tf.gather(whole, [0, 2]), atol=1e-5)
        self.assertAllEqual(tf.gather(got, [1, 3]), tf.zeros_like(tf.gather(got, [1, 3])))
        first = tf.reshape(tf.gather(whole, [0, 2]), [2, -1])[:, 0]  # the whole caption's
        self.assertGreater(float(tf.reduce_min(tf.abs(first))), 0.1)
        self.assertAllEqual(none, tf.zeros_like(reward))

    def test_evaluate_metrics(self):
        batch = _batch(seed=3)
        model = _model("soft")
        model.compile(optimizer="adam")
        log_likelihood = _numpy_log_likelihood(model(batch)["logits"].numpy(), batch["caption"])
        logs = model.evaluate(tf.data.Dataset.from_tensors(batch), verbose=0, return_dict=True)
        self.assertAllClose(logs["loss"], -log_likelihood.mean(), atol=1e-5)
        # 4 + 3 target words.
        self.assertAllClose(logs["nll_per_word"], -log_likelihood.sum() / 7.0, atol=1e-5)

    @parameterized.parameters(*ATTENTIONS)
    def test_config_round_trip(self, attention):
        model = _model(attention, alpha_c=0.5, entropy_weight=0.01, seed=7)
        config = model.get_config()
        self.assertEqual(config["feature_dim"], FEATURES)
        self.assertIsNone(config["encoder"])
        fixtures.check_round_trip(self, model, _batch(), output=lambda y: y["logits"])

    @parameterized.product(attention=ATTENTIONS, score=("additive", "dot"))
    def test_keras_save_load(self, attention, score):
        batch = _batch()
        model = _model(attention, score)
        rng = np.random.default_rng(0)
        for w in model.trainable_weights:
            w.assign(0.5 * rng.normal(size=w.shape).astype(np.float32))
        model.baseline.assign(np.full(BASELINE_SLOTS, -3.5, np.float32))
        loaded = fixtures.check_saved_model_file(self, model, batch, model(batch))
        self.assertIsInstance(loaded, ShowAttendTell)
        self.assertEqual(loaded.get_config(), model.get_config())
        self.assertAllEqual(loaded.baseline.numpy(), model.baseline.numpy())

    def test_beam_search_in_tf_function_with_a_batch_of_one(self):
        # The state gathered by parent beam once lost its static shape for a static
        # batch of one, which tf.while_loop refuses.
        model = _model("soft")
        features = tf.random.stateless_normal([1, LOCATIONS, FEATURES], seed=[1, 2])
        beam = tf.function(lambda x: model.generate({"features": x}, max_length=5, beam_size=3))
        eager = model.generate({"features": features}, max_length=5, beam_size=3)
        self.assertAllEqual(beam(features).tokens, eager.tokens)

    @parameterized.parameters(*ATTENTIONS)
    def test_generate(self, attention):
        batch = _batch(seed=4)
        model = _model(attention)
        rng = np.random.default_rng(4)
        for w in model.trainable_weights:
            w.assign(0.5 * rng.normal(size=w.shape).astype(np.float32))
        # A likely <end> so that captions of several lengths come out.
        model.decoder.deep_output.bias.assign(np.eye(VOCAB, dtype=np.float32)[END] * 2.5)
        max_length = 6
        result = model.generate(batch, max_length=max_length)
        self.assertIsInstance(result, Generated)
        # No tagger: no tag, and the probability 0.
        self.assertAllEqual(result.tag, [-1, -1])
        self.assertAllEqual(result.tag_prob, [0.0, 0.0])
        self.assertEqual(result.tokens.shape, (2, max_length))
        self.assertEqual(result.length.shape, (2,))
        self.assertEqual(result.log_prob.shape, (2,))
        self.assertEqual(result.attention.shape, (2, max_length, LOCATIONS))

        # Greedy decoding written out with the decoder's step.
        state = model.decoder.initial_state(tf.constant(batch["features"]))
        token = tf.fill([2], START)
        tokens, log_prob, alphas = [], np.zeros(2), []
        done = np.zeros(2, bool)
        for _ in range(max_length):
            log_probs, state, alpha = model.decoder.step(token, state)
            allowed = log_probs.numpy().copy()
            allowed[:, [0, 1, 3]] = -np.inf  # never <pad>, <start> or <unk>
            word = allowed.argmax(-1)
            log_prob += np.where(done, 0.0, log_probs.numpy()[np.arange(2), word])
            tokens.append(np.where(done, 0, word))
            alphas.append(np.where(done[:, None], 0.0, alpha.numpy()))
            done |= word == END
            token = tf.constant(word, tf.int32)
        tokens = np.stack(tokens, 1)
        self.assertAllEqual(result.tokens, tokens)
        self.assertAllClose(result.log_prob, log_prob, atol=1e-5)
        self.assertAllClose(result.attention, np.stack(alphas, 1), atol=1e-6)
        ended = (tokens == END).any(-1)
        self.assertTrue(ended.any())
        lengths = np.where(ended, (tokens == END).argmax(-1), max_length)
        self.assertAllEqual(result.length, lengths)

        beam_1 = model.generate(batch, max_length=max_length, beam_size=1)
        self.assertAllEqual(beam_1.tokens, result.tokens)

    @parameterized.parameters(1, 3)
    def test_generate_attends_as_its_hard_decoding_says(self, beam_size):
        # A decoder built with "expected" told "argmax" decodes as one built with
        # "argmax" (the same weights), and is left as it was.
        batch = _batch(seed=7)
        argmax, expected = _model("hard", hard_decoding="argmax"), _model("hard")
        rng = np.random.default_rng(7)
        for a, e in zip(argmax.trainable_weights, expected.trainable_weights, strict=True):
            value = rng.normal(size=a.shape).astype(np.float32)
            a.assign(value)
            e.assign(value)
        decoding = dict(max_length=6, beam_size=beam_size)
        want = argmax.generate(batch, **decoding)
        got = expected.generate(batch, hard_decoding="argmax", **decoding)
        self.assertAllEqual(got.tokens, want.tokens)
        self.assertAllClose(got.attention, want.attention, atol=1e-6)
        self.assertEqual(expected.decoder.hard_decoding, "expected")
        own = expected.generate(batch, **decoding)
        self.assertAllClose(
            own.attention, expected.generate(batch, hard_decoding="expected", **decoding).attention
        )
        self.assertNotAllClose(own.attention, want.attention)

    @parameterized.parameters(1, 3)
    def test_generate_never_emits_pad_start_or_unk(self, beam_size):
        batch = _batch(seed=6)
        model = _model()
        # <pad>, <start> and <unk> are by far the likeliest words, then word 7, then <end>.
        bias = np.full(VOCAB, -5.0, np.float32)
        bias[[0, 1, 3]], bias[7], bias[END] = 20.0, 3.0, 2.0
        model.decoder.deep_output.bias.assign(bias)
        model.decoder.deep_output.kernel.assign(np.zeros_like(model.decoder.deep_output.kernel))
        result = model.generate(batch, max_length=4, beam_size=beam_size)
        # The log-probabilities are the model's own, not renormalised without the two.
        log_p = bias - np.log(np.exp(bias).sum())
        if beam_size == 1:
            # Greedy takes word 7 each time and never reaches <end>.
            self.assertAllEqual(result.tokens, np.full((2, 4), 7))
            self.assertAllEqual(result.length, [4, 4])
            self.assertAllClose(result.log_prob, [4 * log_p[7]] * 2, rtol=1e-5)
        else:
            # Beam search prefers "<end>" (log p -19.1) to four 7s (4 x -18.1).
            self.assertAllEqual(result.tokens[:, 0], [END, END])
            self.assertAllEqual(result.tokens[:, 1:], np.zeros((2, 3)))
            self.assertAllEqual(result.length, [0, 0])
            self.assertAllClose(result.log_prob, [log_p[END]] * 2, rtol=1e-5)

    def test_weights_file_carries_the_random_states(self):
        # Dropout masks and hard-attention samples continue after a reload from a backup:
        # training on from the file ends where uninterrupted training ends.
        batch = _batch()
        data = tf.data.Dataset.from_tensors(batch).repeat(3)

        def make(seed):
            keras.utils.set_random_seed(seed)
            model = _model("hard", dropout=0.3)
            model.compile(optimizer=keras.optimizers.Adam(0.01))
            model.optimizer.build(model.trainable_variables)
            return model

        whole = make(0)
        whole.fit(data, verbose=0)
        path = os.path.join(self.get_temp_dir(), "backup.weights.h5")
        whole.save_weights(path)
        whole.fit(data, verbose=0)
        resumed = make(1)  # other initial weights and random states
        resumed.load_weights(path)
        resumed.fit(data, verbose=0)
        self.assertLen(whole._random_states(), 2)  # hard-attention noise and dropout
        for a, b in zip(
            whole.weights + whole._random_states(),
            resumed.weights + resumed._random_states(),
            strict=True,
        ):
            self.assertAllEqual(a, b, msg=a.path)
        # Without the states the continuation draws other numbers.
        other = make(1)
        other.load_weights(path)
        for state in other._random_states():
            state.assign(state.numpy() + 1)
        other.fit(data, verbose=0)
        changed = [
            not np.array_equal(a, b) for a, b in zip(whole.weights, other.weights, strict=True)
        ]
        self.assertTrue(any(changed))

    @parameterized.parameters(*ATTENTIONS)
    def test_beam_is_at_least_as_likely_as_greedy_on_random_models(self, attention):
        # Not a theorem (search_test has a counter-example), but on random small models
        # beam 3 should find a caption at least as likely as greedy's for every image.
        for seed in range(3):
            batch = _batch(seed=10 + seed)
            model = _model(attention)
            rng = np.random.default_rng(seed)
            for w in model.trainable_weights:
                w.assign(rng.normal(size=w.shape).astype(np.float32))
            model.decoder.deep_output.bias.assign(np.eye(VOCAB, dtype=np.float32)[END] * 1.5)
            greedy = model.generate(batch, max_length=6)
            beam = model.generate(batch, max_length=6, beam_size=3)
            self.assertAllGreaterEqual(beam.log_prob - greedy.log_prob, -1e-5)

    @parameterized.parameters(
        ("soft", "expected"), ("none", "expected"), ("hard", "argmax"), ("hard", "expected")
    )
    def test_beam_search_scores_match_teacher_forcing(self, attention, hard_decoding):
        batch = _batch(seed=5)
        model = _model(attention, hard_decoding=hard_decoding)
        rng = np.random.default_rng(5)
        for w in model.trainable_weights:
            w.assign(rng.normal(size=w.shape).astype(np.float32))
        result = model.generate(batch, max_length=5, beam_size=3)
        tokens = result.tokens.numpy()
        captions = np.concatenate([np.full((2, 1), START, np.int32), tokens], axis=1)
        # Teacher forcing reads what decoding read: hard attention's argmax cell, or the
        # expected context, which a caption drawn to use it gets.
        every = np.ones(2, bool) if (attention, hard_decoding) == ("hard", "expected") else None
        outputs = model.decoder(batch["features"], captions[:, :-1], use_expected=every)
        log_likelihood = _numpy_log_likelihood(outputs["logits"].numpy(), captions)
        self.assertAllClose(result.log_prob, log_likelihood, atol=1e-4)
        emitted = (tokens != 0)[..., None]
        self.assertAllClose(result.attention, outputs["alpha"].numpy() * emitted, atol=1e-5)


class ShapesEncoderTest(tf.test.TestCase):
    def test_features_and_coordinates(self):
        keras.utils.set_random_seed(0)
        decoder = AttentionDecoder(
            VOCAB, embed_dim=WIDTH, hidden_dim=WIDTH, attention_dim=WIDTH, name="decoder"
        )
        model = ShowAttendTell(decoder, encoder=ImageEncoder("shapes_cnn", 112, name="encoder"))
        model.build()
        self.assertEqual(model.grid, (14, 14))
        self.assertEqual(model.feature_dim, 50)
        images = np.random.default_rng(0).uniform(0, 255, size=(2, 112, 112, 3))
        features = model.encode({"image": images.astype(np.float32)}).numpy()
        self.assertEqual(features.shape, (2, 196, 50))
        self.assertAllGreaterEqual(features[..., :-2], 0.0)
        # Cell i = 14 r + c carries (row, column) coordinates in [-1, 1].
        line = np.linspace(-1.0, 1.0, 14)
        rows, cols = np.meshgrid(line, line, indexing="ij")
        self.assertAllClose(features[0, :, -2], rows.ravel(), atol=1e-6)
        self.assertAllClose(features[1, :, -1], cols.ravel(), atol=1e-6)
        captions = np.array([[1, 5, 2], [1, 6, 2]], np.int32)
        outputs = model({"image": images.astype(np.float32), "caption": captions})
        self.assertEqual(outputs["logits"].shape, (2, 2, VOCAB))
        self.assertEqual(outputs["alpha"].shape, (2, 2, 196))


if __name__ == "__main__":
    tf.test.main()
