"""The off-world statistics of a captioner (`off_world.py`) as data: `Stats`, and the
.npz file a preset or workdir keeps them in, written and read without TensorFlow (a
process that captions with LiteRT reads the threshold, `sat_tf.serving.litert`)."""

import dataclasses
import os

import numpy as np

from sat_tf.utils import files

FILE = "off_world.npz"
STANDARDISATION = ("distance_mean", "distance_sd", "log_spread_mean", "log_spread_sd")


@dataclasses.dataclass(frozen=True)
class Stats:
    """The training photos' pooled-feature statistics and the threshold on the score.

    Attributes:
      mean: float32 (2D,), mu.
      components: float32 (K, 2D), the leading principal directions u_k (orthonormal rows).
      variances: float32 (K,), lambda_k.
      noise_variance: sigma^2, the mean variance of the other directions.
      distance_mean, distance_sd: mean and standard deviation of d over the training photos.
      log_spread_mean, log_spread_sd: those of log s.
      threshold: the score above which a photo is off-world; nan before calibration.
      quantile: the quantile of the held-out photos' scores the threshold sits at.
      info: what the statistics were computed from (free text fields).
    """

    mean: np.ndarray
    components: np.ndarray
    variances: np.ndarray
    noise_variance: float
    distance_mean: float = 0.0
    distance_sd: float = 1.0
    log_spread_mean: float = 0.0
    log_spread_sd: float = 1.0
    threshold: float = float("nan")
    quantile: float = float("nan")
    info: dict = dataclasses.field(default_factory=dict)

    @property
    def feature_dim(self) -> int:
        """D, the width of the annotation vectors the statistics are for."""
        return self.mean.shape[0] // 2


def save(stats: Stats, path: str) -> None:
    """Writes the statistics as an .npz (float32 arrays, info as strings), atomically."""
    arrays = {
        "mean": stats.mean,
        "components": stats.components,
        "variances": stats.variances,
        "noise_variance": np.float32(stats.noise_variance),
        **{name: np.float32(getattr(stats, name)) for name in STANDARDISATION},
        "threshold": np.float32(stats.threshold),
        "quantile": np.float32(stats.quantile),
        **{f"info_{k}": np.asarray(str(v)) for k, v in stats.info.items()},
    }
    with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def load(path: str) -> Stats:
    """Reads the statistics `save` wrote.

    Raises:
      ValueError: for a file that is not such statistics.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        stats = Stats(
            mean=arrays["mean"].astype(np.float32),
            components=arrays["components"].astype(np.float32),
            variances=arrays["variances"].astype(np.float32),
            noise_variance=float(arrays["noise_variance"]),
            **{name: float(arrays[name]) for name in STANDARDISATION},
            threshold=float(arrays["threshold"]),
            quantile=float(arrays["quantile"]),
            info={k[5:]: str(v) for k, v in arrays.items() if k.startswith("info_")},
        )
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path} is not off-world statistics: {e}") from e
    k, dim = stats.components.shape
    if stats.mean.shape != (dim,) or stats.variances.shape != (k,) or dim % 2:
        raise ValueError(f"{path}: off-world statistics of inconsistent shapes")
    return stats


def load_from(directory: str) -> Stats | None:
    """The statistics in a preset or workdir folder, None where it has none."""
    path = os.path.join(directory, FILE)
    return load(path) if os.path.isfile(path) else None
