"""Tests for sat_tf.serving.off_world_stats: the statistics' file written and read back
field for field, refusals naming the file, and no TensorFlow loaded to read it."""

import dataclasses
import os

import numpy as np
import pytest
from fixtures import fresh_python

from sat_tf.serving import off_world_stats


def _stats():
    rng = np.random.default_rng(0)
    return off_world_stats.Stats(
        mean=rng.normal(size=8).astype(np.float32),
        components=rng.normal(size=(3, 8)).astype(np.float32),
        variances=np.array([3.0, 2.0, 1.0], np.float32),
        noise_variance=0.25,  # values float32 holds exactly: the file stores float32
        distance_mean=4.0,
        distance_sd=0.5,
        log_spread_mean=-1.0,
        log_spread_sd=0.125,
        threshold=2.5,
        quantile=0.5,
        info={"photos": "16", "encoder": "shapes_cnn"},
    )


def test_written_and_read_back(tmp_path):
    stats = _stats()
    off_world_stats.save(stats, str(tmp_path / off_world_stats.FILE))
    got = off_world_stats.load_from(str(tmp_path))
    for name in ("mean", "components", "variances"):
        np.testing.assert_array_equal(getattr(got, name), getattr(stats, name))
    for name in ("noise_variance", "threshold", "quantile", *off_world_stats.STANDARDISATION):
        assert getattr(got, name) == getattr(stats, name), name
    assert got.info == stats.info
    assert got.feature_dim == 4
    os.makedirs(tmp_path / "none")
    assert off_world_stats.load_from(str(tmp_path / "none")) is None


def test_refusals_name_the_file(tmp_path):
    path = str(tmp_path / "bad.npz")
    with open(path, "wb") as f:
        f.write(b"not an npz")
    with pytest.raises(ValueError, match=f"^{path} is not off-world statistics: "):
        off_world_stats.load(path)
    stats = _stats()
    off_world_stats.save(dataclasses.replace(stats, variances=np.ones(2, np.float32)), path)
    with pytest.raises(ValueError, match=f"^{path}: off-world statistics of inconsistent shapes$"):
        off_world_stats.load(path)


def test_read_without_tensorflow(tmp_path):
    off_world_stats.save(_stats(), str(tmp_path / off_world_stats.FILE))
    script = (
        "import sys; from sat_tf.serving import off_world_stats; "
        "print(off_world_stats.load_from(sys.argv[1]).threshold)"
    )
    status, lines, stderr = fresh_python(script, str(tmp_path))
    assert status == 0, stderr
    assert lines == ["2.5", "[]"]
