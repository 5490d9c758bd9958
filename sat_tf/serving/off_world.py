"""How unlike a captioner's training photos a photo is: the off-world score.

A captioner trained on Flickr8k knows people and dogs; shown a black frame, a galaxy or
a microscope slide it still writes a fluent caption about a man, often with a better
log-probability than a real photo gets. The score here tells such photos apart with the
encoder's own features and no second model: the Mahalanobis distance of a photo's pooled
annotation vectors to those of the training photos (Lee et al., 2018, "A Simple Unified
Framework for Detecting Out-of-Distribution Samples and Adversarial Attacks").

The pooled vector of annotation vectors a_1..a_L is [mean_i a_i, std_i a_i] (2D): the
mean says what the photo holds, the spread over the L locations how much the frame varies.
Its covariance is fitted as probabilistic PCA (Tipping and Bishop, 1999): the K leading
principal directions u_k with their variances lambda_k, and one variance sigma^2 for the
rest, so that the statistics stay small (K x 2D floats) and their inverse well
conditioned with a few thousand photos:

    d(x)^2 = sum_k (u_k . (x - mu))^2 / lambda_k
             + (|x - mu|^2 - sum_k (u_k . (x - mu))^2) / sigma^2

In 2D dimensions d of a typical photo sits on a shell far from 0, and a flat frame lands
*closer* to mu than real photos do: d alone misses a black frame. So the score adds the
frame's spread s = mean_d std_i a_id, low for flat frames, noise, star fields and
textures. Each count is standardised on the training photos, and the score is the worse:

    score = max((d - mean d) / sd d, (mean log s - log s) / sd log s)

A photo is off-world when the score exceeds a threshold set at a quantile of the scores
of held-out photos of the same data (the validation split). The scoring is core TF ops,
so it runs in the exported graph. The statistics and their file are
`off_world_stats.py`'s, which needs no TensorFlow.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from sat_tf import config as config_lib
from sat_tf.data import datasets, feature_cache
from sat_tf.serving.off_world_stats import (  # noqa: F401 (the statistics, named here too)
    FILE,
    STANDARDISATION,
    Stats,
    load,
    load_from,
    save,
)

NUM_COMPONENTS = config_lib.OFF_WORLD_COMPONENTS
QUANTILE = config_lib.OFF_WORLD_QUANTILE


def pool(features: tf.Tensor) -> tf.Tensor:
    """[mean_i a_i, std_i a_i] of annotation vectors (B, L, D) -> float32 (B, 2D)."""
    features = tf.cast(features, tf.float32)
    mean, variance = tf.nn.moments(features, axes=[1])  # (B, D), (B, D)
    return tf.concat([mean, tf.sqrt(variance)], axis=-1)


def fit(pooled: np.ndarray, num_components: int = NUM_COMPONENTS, **info) -> Stats:
    """Probabilistic PCA of pooled vectors (N, 2D) of the training photos (uncalibrated)."""
    pooled = np.asarray(pooled, np.float64)
    num, dim = pooled.shape
    if not 0 < num_components < min(num, dim):
        raise ValueError(
            f"num_components={num_components} must be between 1 and min(photos, width) - 1 "
            f"= {min(num, dim) - 1}"
        )
    mean = pooled.mean(axis=0)
    centred = pooled - mean
    eigenvalues, eigenvectors = np.linalg.eigh(centred.T @ centred / (num - 1))
    order = np.argsort(eigenvalues)[::-1]
    eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
    rest = eigenvalues[num_components:]
    stats = Stats(
        mean=mean.astype(np.float32),
        components=eigenvectors[:, :num_components].T.astype(np.float32),
        variances=eigenvalues[:num_components].astype(np.float32),
        noise_variance=float(max(rest.mean(), 1e-12)),
        info={"photos": num, **info},
    )
    d = distance(tf.constant(pooled, tf.float32), stats).numpy()
    log_s = log_spread(tf.constant(pooled, tf.float32)).numpy()
    return dataclasses.replace(
        stats,
        distance_mean=float(d.mean()),
        distance_sd=float(max(d.std(), 1e-6)),
        log_spread_mean=float(log_s.mean()),
        log_spread_sd=float(max(log_s.std(), 1e-6)),
    )


def distance(pooled: tf.Tensor, stats: Stats) -> tf.Tensor:
    """d, the PPCA Mahalanobis distance of pooled vectors (B, 2D) -> float32 (B,)."""
    centred = tf.cast(pooled, tf.float32) - stats.mean  # (B, 2D)
    projected = tf.matmul(centred, stats.components, transpose_b=True)  # (B, K)
    along = tf.reduce_sum(tf.square(projected), axis=-1)
    total = tf.reduce_sum(tf.square(centred), axis=-1)
    squared = tf.reduce_sum(tf.square(projected) / stats.variances, axis=-1)
    squared += tf.maximum(total - along, 0.0) / np.float32(stats.noise_variance)
    return tf.sqrt(squared)


def log_spread(pooled: tf.Tensor) -> tf.Tensor:
    """log s, s the mean over channels of the std over locations: (B, 2D) -> (B,)."""
    spread = tf.reduce_mean(pooled[:, pooled.shape[-1] // 2 :], axis=-1)
    return tf.math.log(tf.maximum(spread, 0.0) + 1e-6)


def pooled_score(pooled: tf.Tensor, stats: Stats) -> tf.Tensor:
    """The off-world score of pooled vectors (B, 2D) -> float32 (B,) (module docstring)."""
    pooled = tf.cast(pooled, tf.float32)
    far = (distance(pooled, stats) - stats.distance_mean) / stats.distance_sd
    flat = (stats.log_spread_mean - log_spread(pooled)) / stats.log_spread_sd
    return tf.maximum(far, flat)


def score(features: tf.Tensor, stats: Stats) -> tuple[tf.Tensor, tf.Tensor]:
    """(score float32 (B,), score > threshold bool (B,)) of annotation vectors (B, L, D)."""
    value = pooled_score(pool(features), stats)
    return value, value > np.float32(stats.threshold)


def calibrate(stats: Stats, held_out: np.ndarray, quantile: float = QUANTILE) -> Stats:
    """`stats` with the threshold at `quantile` of the scores of held-out pooled vectors
    (N, 2D), e.g. the validation photos'."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile={quantile} must be between 0 and 1")
    d = pooled_score(tf.constant(held_out, tf.float32), stats).numpy()
    info = {**stats.info, "held_out_photos": len(d)}
    return dataclasses.replace(
        stats, threshold=float(np.quantile(d, quantile)), quantile=quantile, info=info
    )


def pooled_features(feature_dir: str, records: Sequence[datasets.Record], **settings) -> np.ndarray:
    """`pool` of the cached features of `records` (`feature_cache.feature_dataset`, whose
    `settings` it checks) -> float32 (N, 2D), in record order."""
    ds, _ = feature_cache.feature_dataset(feature_dir, records, **settings)
    return np.concatenate([pool(batch).numpy() for batch in ds.batch(128)])


def compute(
    feature_dir: str,
    records: Sequence[datasets.Record],
    num_components: int = NUM_COMPONENTS,
    quantile: float = QUANTILE,
    **settings,
) -> tuple[Stats, dict]:
    """Statistics of the "train" records' cached features, calibrated on the "val" ones.

    Args:
      feature_dir: the feature cache (`sat-extract-features`) holding every record.
      records: the dataset's records, in extraction order, with their splits.
      num_components: K, principal directions kept.
      quantile: where among the validation photos' distances the threshold sits.
      **settings: the encoder settings the cache must have been made with.

    Returns:
      (stats, {split: share of its photos flagged}) for every split of `records`.
    """
    by_split = {}
    for split in ("train", "val", "test"):
        chosen = [r for r in records if r.split == split]
        if chosen:
            by_split[split] = pooled_features(feature_dir, chosen, **settings)
    if "train" not in by_split or "val" not in by_split:
        raise ValueError("off-world statistics need a train split and a val split")
    info = {k: v for k, v in settings.items() if k in ("encoder", "encoder_weights", "image_size")}
    stats = fit(by_split["train"], num_components, **info)
    stats = calibrate(stats, by_split["val"], quantile)
    rates = {
        split: float(np.mean(pooled_score(tf.constant(p), stats).numpy() > stats.threshold))
        for split, p in by_split.items()
    }
    return stats, rates
