"""Self-critical sequence training: the baseline, the surrogate's gradient, sampling in the
graph, the objective of a tiny model, and a few steps of the real loop (steps under a
`MirroredStrategy`: distribute_test)."""

import dataclasses
import os
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from fixtures import TINY, WORDS, tiny_model
from train_lib_test import Interrupted, _final_state, _interrupt, stopping_callbacks

from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.model import search, self_critical
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference, preset
from sat_tf.training import train_lib
from sat_tf.training import workdir as workdir_lib


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


def _two_word_step(log_p_first):
    """A step whose next word is 4 with log-probability `log_p_first`, else 5; `<end>`
    (2) surely after the first word."""

    def step_fn(tokens, state):
        first = tf.equal(tokens, vocab_lib.START_ID)[:, None]
        no = -1e9
        choice = tf.constant([[no, no, no, no, log_p_first, np.log1p(-np.exp(log_p_first))]])
        end = tf.constant([[no, no, 0.0, no, no, no]])
        log_probs = tf.where(first, choice, end)  # (N, 6)
        return log_probs, state, tf.ones([tf.shape(tokens)[0], 1])

    return step_fn


def test_sampling_draws_from_the_step_distribution_and_is_seeded():
    common = dict(batch_size=2000, start_id=1, end_id=2, max_length=4, num_locations=1)
    step_fn = _two_word_step(np.log(0.3))
    state = {"h": tf.zeros([2000, 1])}
    seed = tf.constant([3, 4], tf.int32)
    out = search.greedy_decode(step_fn, state, sample_seed=seed, **common)
    first = out.tokens.numpy()[:, 0]
    assert set(first) == {4, 5}
    assert abs(np.mean(first == 4) - 0.3) < 0.04  # 2000 draws: sd about 0.01
    np.testing.assert_array_equal(out.tokens.numpy()[:, 1], 2)  # then <end>
    np.testing.assert_array_equal(out.length.numpy(), 1)
    expected = np.where(first == 4, np.log(0.3), np.log(0.7))
    np.testing.assert_allclose(out.log_prob.numpy(), expected, rtol=1e-5)
    again = search.greedy_decode(step_fn, state, sample_seed=seed, **common)
    np.testing.assert_array_equal(again.tokens.numpy(), out.tokens.numpy())
    greedy = search.greedy_decode(step_fn, state, **common)
    np.testing.assert_array_equal(greedy.tokens.numpy()[:, 0], 5)


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
        sample_seed=seed,
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


def _loop_config(tmp_path, **settings):
    # Soft attention (the objective of each: test_terms_of_a_tiny_model); two validation
    # images and no test split (test metrics: train_lib_test, on the shared run).
    return Config(
        data_dir=str(tmp_path / "data"),
        cache_dir=str(tmp_path / "cache"),
        **{**TINY, "scst": True, "scst_samples": 2, "steps_per_epoch": 2}
        | {"eval_images": 2, "num_test": 0}
        | settings,
    )


def test_a_few_steps_of_the_loop_and_a_finished_run_run_again(tmp_path):
    config = _loop_config(tmp_path)
    workdir = str(tmp_path / "run")
    assert train_lib.train_and_evaluate(config, workdir) == {}
    history = workdir_lib.read_history(os.path.join(workdir, workdir_lib.HISTORY_FILE))
    assert [h["epoch"] for h in history] == [1]
    for key in ("val_bleu4", "val_cider", "val_bad_ending_rate", "val_mean_length"):
        assert 0 <= history[0][key] < np.inf, key
    kept = [n for _, _, names in os.walk(config.cache_dir) for n in names]
    assert any(n.startswith("cider_df_") for n in kept)  # beside the dataset's vocabulary
    # The same command again resumes the finished run: nothing more to train or write.
    weights = [
        os.path.join(workdir, inference.BEST_WEIGHTS),
        os.path.join(workdir, "backup", "latest.weights.h5"),
    ]
    written = [os.stat(path).st_mtime_ns for path in weights]
    assert train_lib.train_and_evaluate(config, workdir) == {}
    assert [os.stat(path).st_mtime_ns for path in weights] == written
    assert workdir_lib.read_history(os.path.join(workdir, workdir_lib.HISTORY_FILE)) == history


@pytest.mark.slow
def test_a_run_interrupted_mid_epoch_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    # Slow: three runs. Stopped (an exception, in this process) after the first step of
    # epoch 2, when the backup holds epoch 1; the same command redoes epoch 2 and must end
    # where the uninterrupted run ends: the samples drawn from the seed generator the
    # backup restores, the optimizer's step and moments, the data order all continued.
    config = _loop_config(tmp_path, epochs=2)
    whole, stopped = str(tmp_path / "whole"), str(tmp_path / "stopped")
    assert train_lib.train_and_evaluate(config, whole) == {}
    with mock.patch.object(train_lib, "_callbacks", stopping_callbacks("2:1", _interrupt)):
        with pytest.raises(Interrupted):
            train_lib.train_and_evaluate(config, stopped)
    assert workdir_lib.backed_up_epoch(stopped) == 1
    first_epoch = _final_state(stopped)
    assert train_lib.train_and_evaluate(config, stopped) == {}

    expected, got = _final_state(whole), _final_state(stopped)
    steps = [int(v) for p, v in got if p.endswith(("/iteration", "/iterations"))]
    assert steps and set(steps) == {2 * config.steps_per_epoch}, steps
    moved = [p for (p, v), (_, w) in zip(got, first_epoch, strict=True) if not np.allclose(v, w)]
    assert any("decoder" in p for p in moved), moved  # epoch 2 changed the weights
    for (path, value), (_, want) in zip(got, expected, strict=True):
        np.testing.assert_allclose(value, want, atol=1e-5, rtol=1e-4, err_msg=path)
    history = workdir_lib.read_history(os.path.join(stopped, workdir_lib.HISTORY_FILE))
    assert [h["epoch"] for h in history] == [1, 2]
    assert history == workdir_lib.read_history(os.path.join(whole, workdir_lib.HISTORY_FILE))


def test_init_from_a_preset(tmp_path):
    """`--init_from` takes a preset folder: a second stage starts from its weights, and
    one with another vocabulary is refused by name."""
    model, vocab, config = tiny_model(attention="soft")
    folder = str(tmp_path / "p")
    preset.save(model, vocab, config, folder, name="p")
    fresh, _, _ = tiny_model(seed=5, attention="soft")
    workdir_lib.load_initial_weights(fresh, config, vocab, folder)
    for mine, theirs in zip(fresh.weights, model.weights, strict=True):
        # The preset stores float16.
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-3, atol=1e-3)
    other = vocab_lib.Vocab([*WORDS[:-1], "other"])
    with pytest.raises(ValueError, match="holds another model:\n  the vocabulary"):
        workdir_lib.load_initial_weights(fresh, config, other, folder)
