"""Tests for sat_tf.model.self_critical: the leave-one-out baseline and the surrogate's
gradient by hand, the terms of a tiny model (its sampled captions' log-likelihood and
entropy against the decoding loop's, no gradient to the words never emitted), and its
settings from the config (the training loop of self-critical runs: scst_test.py)."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.model import sampling, search, self_critical
from sat_tf.model.show_attend_tell import build_model


def test_leave_one_out_baseline_by_hand():
    rewards = tf.constant([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])  # two images, K = 3
    baseline = self_critical.leave_one_out_baseline(rewards, 3).numpy()
    np.testing.assert_allclose(baseline, [4.0, 3.5, 1.5, 1.5, 1.5, 0.0])


def test_surrogate_gradient_is_minus_advantage_times_score():
    theta = tf.Variable([0.3, -0.2])
    with tf.GradientTape() as tape:
        log_p = tf.stack([2.0 * theta[0], theta[0] + 3.0 * theta[1]])
        reward = tf.constant([1.0, 0.5]) + 0.0 * theta[0]  # any gradient it has is stopped
        loss = tf.reduce_sum(
            self_critical.self_critical_surrogate(log_p, reward, tf.constant([0.25, 0.75]))
        )
    grad = tape.gradient(loss, theta).numpy()
    # -(0.75) * (2, 0) - (-0.25) * (1, 3)
    np.testing.assert_allclose(grad, [-1.5 + 0.25, 0.75])


def _tiny_model(attention, baseline="mean"):
    config = Config(
        attention=attention,
        use_feature_cache=True,
        embed_dim=8,
        hidden_dim=16,
        attention_dim=8,
        scst=True,
        scst_samples=3,
        scst_baseline=baseline,
        max_caption_length=6,
    )
    return build_model(config, 12, feature_shape=(4, 8), grid=(2, 2))


class _Recorder:
    """A reward: the number of words before `<end>`, minus the image index; records
    what it saw."""

    def __init__(self):
        self.calls = []

    def __call__(self, tokens, image_index):
        self.calls.append((np.array(tokens), np.array(image_index)))
        words = [(list(row) + [2]).index(2) for row in tokens]
        return (np.array(words) - np.array(image_index)).astype(np.float32)


@pytest.mark.parametrize("attention", ["soft", "hard", "none"])
@pytest.mark.parametrize("baseline", ["mean", "greedy"])
def test_terms_of_a_tiny_model(attention, baseline):
    model = _tiny_model(attention, baseline)
    recorder = _Recorder()
    model.rewarder = recorder
    batch = {
        "features": tf.random.stateless_normal([2, 4, 8], [1, 2]),
        "image_index": tf.constant([7, 3], tf.int32),
    }
    with tf.GradientTape() as tape:
        terms = model.self_critical_terms(batch)
        loss = tf.reduce_mean(terms["objective"])
    grads = tape.gradient(loss, model.trainable_variables)
    tokens, index = recorder.calls[0]
    np.testing.assert_array_equal(index, [7, 7, 7, 3, 3, 3])  # K samples, image by image
    assert tokens.shape == (6, 6)
    reward = terms["reward"].numpy()
    np.testing.assert_allclose(reward, recorder(tokens, index))
    if baseline == "mean":
        np.testing.assert_allclose(
            terms["baseline"].numpy(), self_critical.leave_one_out_baseline(reward, 3).numpy()
        )
        np.testing.assert_array_equal(len(recorder.calls), 2)  # the check above called it
    else:
        greedy_tokens, greedy_index = recorder.calls[1]
        np.testing.assert_array_equal(greedy_index, [7, 3])
        assert greedy_tokens.shape[0] == 2
    # log p(sample) from the teacher-forced pass equals the sampling loop's sum.
    words = terms["words"].numpy()
    np.testing.assert_array_equal(words, [(list(r) + [0]).index(0) for r in tokens])
    assert np.all(terms["log_likelihood"].numpy() < 0)
    advantage = reward - terms["baseline"].numpy()
    np.testing.assert_allclose(
        terms["objective"].numpy(), -advantage * terms["log_likelihood"].numpy(), rtol=1e-6
    )
    if np.any(advantage != 0):
        assert any(g is not None and float(tf.reduce_sum(tf.abs(g))) > 0 for g in grads)


@pytest.mark.parametrize("attention", ["soft", "hard", "none"])
def test_log_likelihood_matches_the_sampling_loop(attention):
    """The objective's `log p(sample)` is the sampler's own: a sampling loop whose step
    renormalises over the words captioning may emit draws the same words with that
    log-probability."""
    model = _tiny_model(attention)
    features = tf.random.stateless_normal([2, 4, 8], [5, 6])
    seed = tf.constant([1, 2], tf.int32)
    state = model.decoder.initial_state(tf.repeat(features, 3, axis=0))
    step_fn = model.decoding_step()

    def renormalised(tokens, state):
        log_probs, state, alpha = step_fn(tokens, state)
        return tf.nn.log_softmax(log_probs), state, alpha

    sampled = search.greedy_decode(
        renormalised,
        state,
        batch_size=6,
        start_id=1,
        end_id=2,
        max_length=6,
        num_locations=4,
        drawing=sampling.Drawing(seed),
    )
    model.rewarder = lambda tokens, index: np.zeros(len(tokens), np.float32)
    settings = dataclasses.replace(model.self_critical, baseline="mean")
    terms = self_critical.self_critical_terms(
        settings,
        model,
        features,
        tf.constant([0, 1]),
        seed,
        model.rewarder,
    )
    np.testing.assert_allclose(
        terms["log_likelihood"].numpy(), sampled.log_prob.numpy(), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("attention", ["soft", "hard", "none"])
def test_entropy_bonus_matches_the_decoding_steps(attention):
    """`entropy` is the sum over a sample's words of its step distributions' entropy, as
    the decoding step run over the sample's words gives them, and with a zero advantage
    the objective is minus β times it."""
    model = _tiny_model(attention)
    features = tf.random.stateless_normal([2, 4, 8], [9, 10])
    seen = []

    def rewarder(tokens, index):
        seen.append(np.array(tokens))
        return np.zeros(len(tokens), np.float32)

    settings = dataclasses.replace(model.self_critical, entropy_weight=0.5)
    terms = self_critical.self_critical_terms(
        settings, model, features, tf.constant([0, 1]), tf.constant([3, 4]), rewarder
    )
    tokens = seen[0]
    state = model.decoder.initial_state(tf.repeat(features, 3, axis=0))
    step_fn = model.decoding_step()
    previous = tf.fill([6], vocab_lib.START_ID)
    expected = np.zeros(6)
    for t in range(tokens.shape[1]):
        log_probs, state, _ = step_fn(previous, state)
        p = tf.nn.softmax(log_probs).numpy().astype(np.float64)
        logp = np.log(np.where(p > 0, p, 1.0))
        expected += (tokens[:, t] != vocab_lib.PAD_ID) * -(p * logp).sum(axis=1)
        previous = tf.constant(tokens[:, t])
    assert np.all(expected > 0)
    np.testing.assert_allclose(terms["entropy"].numpy(), expected, rtol=1e-4)
    np.testing.assert_allclose(terms["objective"].numpy(), -0.5 * expected, rtol=1e-4)


@pytest.mark.parametrize("entropy_weight", [0.0, 0.5])
def test_never_emitted_words_get_no_gradient(entropy_weight):
    """No sample holds `<pad>`, `<start>` or `<unk>`, so the objective (with or without the
    entropy bonus) leaves their output scores alone; every other word's score moves."""
    model = _tiny_model("soft")
    features = tf.random.stateless_normal([2, 4, 8], [7, 8])
    model.rewarder = lambda tokens, index: np.arange(len(tokens), dtype=np.float32)
    with tf.GradientTape() as tape:
        terms = self_critical.self_critical_terms(
            dataclasses.replace(model.self_critical, entropy_weight=entropy_weight),
            model,
            features,
            tf.constant([0, 1]),
            tf.constant([3, 4]),
            model.rewarder,
        )
        loss = tf.reduce_mean(terms["objective"])
    [bias] = [v for v in model.trainable_variables if tuple(v.shape) == (12,)]
    grad = tape.gradient(loss, bias).numpy()
    never = sorted(vocab_lib.NEVER_EMITTED)
    np.testing.assert_array_equal(grad[never], 0.0)
    emitted = np.delete(grad, never)
    assert np.all(emitted != 0.0), emitted


def test_config_checks():
    with pytest.raises(ValueError, match="needs at least 2"):
        Config(scst=True, scst_samples=1)
    with pytest.raises(ValueError, match="scst_baseline"):
        Config(scst=True, scst_baseline="moving")
    with pytest.raises(ValueError, match="batch_size"):
        Config(scst=True, scst_samples=5, batch_size=4)
    Config(scst=True, scst_samples=1, scst_baseline="greedy")
    with pytest.raises(ValueError, match="scst_entropy_weight"):
        Config(scst=True, scst_entropy_weight=-0.1)
    assert self_critical.SelfCriticalSettings.from_config(
        Config(scst=True, scst_entropy_weight=0.02)
    ).entropy_weight == pytest.approx(0.02)
