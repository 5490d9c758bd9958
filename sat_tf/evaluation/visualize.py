"""Per-word attention pictures, as in Fig. 3 of Xu et al. (2015).

For each generated word, its attention map alpha_t (L = H * W weights over the annotation
grid, §4.2) is upsampled to the image (x16 for 14 x 14 on 224 pixels), smoothed with a
Gaussian and shown as a white light over the darkened image; hard attention (§4.1) can
also mark the location it sampled. Rendering uses matplotlib's Agg canvas directly, so
no display and no global pyplot state are involved. matplotlib and SciPy load when a
picture is drawn: the text summary that `sat-caption` prints for every caption needs
neither (its first caption is timed, bench/first_caption.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from sat_tf.data.tokens import END
from sat_tf.utils import files

_ROWS = ("top", "", "bottom")
_COLS = ("left", "", "right")
_SIGMA_PER_UPSCALE = 1.25
_DARK = 0.25


def upsample_attention(
    alpha: np.ndarray,
    grid: tuple[int, int],
    image_hw: tuple[int, int],
    sigma: float | None = None,
) -> np.ndarray:
    """One attention map alpha_t over the image, smoothed, as in Fig. 3 of the paper.

    Each grid cell becomes the block of image pixels it covers (nearest neighbour, so
    x16 blocks for a 14 x 14 grid on 224 x 224), the result is smoothed with a Gaussian
    and scaled to [0, 1] (min -> 0, max -> 1; a constant map becomes all ones, or all
    zeros if it is zero).

    Args:
      alpha: (L,) attention weights, L = H * W, row-major (H rows).
      grid: (H, W).
      image_hw: (h, w) image size in pixels.
      sigma: Gaussian standard deviation in image pixels; default 1.25 x the upsampling
        factor (20 px for x16, the smoothing of the authors' pictures); 0 for none.

    Returns:
      (h, w) float64 array in [0, 1].
    """
    rows, cols = grid
    alpha = np.asarray(alpha, dtype=np.float64)
    if alpha.shape != (rows * cols,):
        raise ValueError(f"alpha has shape {alpha.shape}, expected ({rows * cols},) for {grid}")
    h, w = image_hw
    r_index = np.minimum((np.arange(h) + 0.5) * rows / h, rows - 1).astype(int)
    c_index = np.minimum((np.arange(w) + 0.5) * cols / w, cols - 1).astype(int)
    heat = alpha.reshape(rows, cols)[r_index[:, None], c_index[None, :]]  # (h, w)
    if sigma is None:
        sigma = _SIGMA_PER_UPSCALE * max(h / rows, w / cols)
    if sigma > 0:  # edges mirrored (d c b a | a b c d), taps out to 4 sigma
        import scipy.ndimage

        heat = scipy.ndimage.gaussian_filter(heat, sigma, mode="reflect", truncate=4.0)
    low, high = heat.min(), heat.max()
    if high - low > 1e-12 * max(abs(high), 1e-300):
        return (heat - low) / (high - low)
    return np.ones_like(heat) if high > 0 else np.zeros_like(heat)


def overlay_attention(image: np.ndarray, heat: np.ndarray) -> np.ndarray:
    """The image under a white light where `heat` is high, darkened where it is low.

    Args:
      image: (h, w, 3) uint8.
      heat: (h, w) values in [0, 1].

    Returns:
      (h, w, 3) uint8: 25% of the image plus 75% of `heat` in grey, the look of Fig. 3.
    """
    light = 255.0 * heat[..., None]  # (h, w, 1)
    return np.clip(_DARK * image + (1.0 - _DARK) * light, 0, 255).astype(np.uint8)


def _as_rgb(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"image must be uint8, got {image.dtype}")
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
        raise ValueError(f"image must be (H, W), (H, W, 1), (H, W, 3) or RGBA, got {image.shape}")
    if image.shape[-1] == 1:
        return np.repeat(image, 3, axis=-1)
    return image[..., :3]


def _check_alphas(words: Sequence[str], alphas: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    alphas = np.asarray(alphas, dtype=np.float64)
    rows, cols = grid
    if alphas.ndim != 2 or alphas.shape[1] != rows * cols:
        raise ValueError(f"alphas has shape {alphas.shape}, expected (T, {rows * cols}) for {grid}")
    if alphas.shape[0] < len(words):
        raise ValueError(f"{len(words)} words but only {alphas.shape[0]} attention maps")
    return alphas[: len(words)]


def build_attention_figure(
    image: np.ndarray,
    words: Sequence[str],
    alphas: np.ndarray,
    grid: tuple[int, int],
    *,
    hard_points: Sequence[int] | None = None,
    cols: int = 5,
) -> Figure:
    """The Fig. 3 picture as a matplotlib Figure: the image, then one panel per word.

    Args:
      image: (H, W, 3) uint8 (grey or RGBA are converted).
      words: the caption's words; panel titles.
      alphas: (T, L) attention maps, T >= len(words); row t belongs to words[t].
      grid: (H, W) of the attention grid, L = H * W.
      hard_points: optional cell index per word (e.g. the locations hard attention
        sampled, or `alphas.argmax(-1)`), outlined in red.
      cols: panels per row.

    Returns:
      A Figure with an Agg canvas and 1 + len(words) axes, in reading order.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    image = _as_rgb(image)
    alphas = _check_alphas(words, alphas, grid)
    if hard_points is not None and len(hard_points) != len(words):
        raise ValueError(f"{len(hard_points)} hard points for {len(words)} words")
    cols = max(1, min(cols, len(words) + 1))
    rows = math.ceil((len(words) + 1) / cols)
    fig = Figure(figsize=(2.2 * cols, 2.4 * rows), dpi=100)
    FigureCanvasAgg(fig)
    h, w = image.shape[:2]
    cell_h, cell_w = h / grid[0], w / grid[1]
    for i in range(len(words) + 1):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.set_axis_off()
        if i == 0:
            ax.imshow(image)
            continue
        heat = upsample_attention(alphas[i - 1], grid, (h, w))
        ax.imshow(overlay_attention(image, heat))
        ax.set_title(words[i - 1], fontsize=12)
        if hard_points is not None:
            r, c = divmod(int(hard_points[i - 1]), grid[1])
            ax.add_patch(
                Rectangle(
                    (c * cell_w - 0.5, r * cell_h - 0.5),
                    cell_w,
                    cell_h,
                    fill=False,
                    edgecolor="red",
                    linewidth=1.5,
                )
            )
    fig.tight_layout()
    return fig


def caption_panels(
    words: Sequence[str], alphas: np.ndarray, hard: bool
) -> tuple[list[str], np.ndarray | None]:
    """Panel titles and hard points for a generated caption.

    Args:
      words: the caption's words, without `<end>`.
      alphas: (T, L) the attention map of each emitted token; a caption cut at the
        length limit has no `<end>` and no map for it.
      hard: the model reads the argmax cell of each map (hard attention decoded at
        argmax, paper §4.1).

    Returns:
      (the words and `<end>`, one per map; the argmax cell of each map, or None).
    """
    titles = (list(words) + [END])[: len(alphas)]
    return titles, (np.asarray(alphas).argmax(-1) if hard else None)


def render(fig: Figure) -> np.ndarray:
    """Draws a Figure with an Agg canvas into an (h, w, 3) uint8 RGB array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def attention_figure(
    image: np.ndarray,
    words: Sequence[str],
    alphas: np.ndarray,
    grid: tuple[int, int],
    *,
    hard_points: Sequence[int] | None = None,
    path: str | None = None,
    cols: int = 5,
) -> np.ndarray:
    """Renders `build_attention_figure` and optionally saves it as a PNG.

    Args:
      image, words, alphas, grid, hard_points, cols: as `build_attention_figure`.
      path: if given, the PNG is written there atomically (temp file + rename).

    Returns:
      The picture as an (h, w, 3) uint8 RGB array (e.g. for `tf.summary.image`).
    """
    picture = render(
        build_attention_figure(image, words, alphas, grid, hard_points=hard_points, cols=cols)
    )
    if path is not None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        from PIL import Image

        with files.atomic_path(path) as tmp:
            Image.fromarray(picture).save(tmp, format="PNG")
    return picture


def coarse_location(row: int, col: int, grid: tuple[int, int]) -> str:
    """Names the third of the image a grid cell's centre falls in: "top left", "center", ...

    Uses the nine location words of the shapes dataset (docs/design.md §4.2).
    """
    vertical = _ROWS[min(2, int(3 * (row + 0.5) / grid[0]))]
    horizontal = _COLS[min(2, int(3 * (col + 0.5) / grid[1]))]
    return " ".join(p for p in (vertical, horizontal) if p) or "center"


def attention_summary(words: Sequence[str], alphas: np.ndarray, grid: tuple[int, int]) -> str:
    """A text table of where each word looked: one line per word after a header.

    Args:
      words: the caption's words.
      alphas: (T, L) attention maps, T >= len(words).
      grid: (H, W), L = H * W.

    Returns:
      Lines "word  (row, col)  max alpha  place", e.g. "dog  (2, 11)  0.412  top right",
      where (row, col) is the argmax cell and place its coarse 3 x 3 location.
    """
    alphas = _check_alphas(words, alphas, grid)
    width = max([len("word"), *(len(w) for w in words)])
    lines = [f"{'word':<{width}}  {'cell':<10}  {'max α':>6}  where"]
    for word, alpha in zip(words, alphas, strict=True):
        row, col = divmod(int(np.argmax(alpha)), grid[1])
        cell = f"({row}, {col})"
        place = coarse_location(row, col, grid)
        lines.append(f"{word:<{width}}  {cell:<10}  {alpha.max():>6.3f}  {place}")
    return "\n".join(lines)
