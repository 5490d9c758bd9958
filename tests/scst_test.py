"""Self-critical sequence training: sampling in the graph, a few steps of the real loop,
a run resumed, a second stage from a preset (the objective's parts: self_critical_test;
steps under a `MirroredStrategy`: distribute_test)."""

import os
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from fixtures import TINY, WORDS, tiny_model
from train_lib_test import Interrupted, _final_state, _interrupt, stopping_callbacks

from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.model import sampling, search
from sat_tf.serving import inference, preset
from sat_tf.training import train_lib
from sat_tf.training import workdir as workdir_lib


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
    out = search.greedy_decode(step_fn, state, drawing=sampling.Drawing(seed), **common)
    first = out.tokens.numpy()[:, 0]
    assert set(first) == {4, 5}
    assert abs(np.mean(first == 4) - 0.3) < 0.04  # 2000 draws: sd about 0.01
    np.testing.assert_array_equal(out.tokens.numpy()[:, 1], 2)  # then <end>
    np.testing.assert_array_equal(out.length.numpy(), 1)
    expected = np.where(first == 4, np.log(0.3), np.log(0.7))
    np.testing.assert_allclose(out.log_prob.numpy(), expected, rtol=1e-5)
    again = search.greedy_decode(step_fn, state, drawing=sampling.Drawing(seed), **common)
    np.testing.assert_array_equal(again.tokens.numpy(), out.tokens.numpy())
    greedy = search.greedy_decode(step_fn, state, **common)
    np.testing.assert_array_equal(greedy.tokens.numpy()[:, 0], 5)


def _loop_config(tmp_path, **settings):
    # Soft attention (the objective of each: self_critical_test's
    # test_terms_of_a_tiny_model); two validation images and no test split (test
    # metrics: train_lib_test, on the shared run).
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
