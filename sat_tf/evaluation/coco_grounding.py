"""Where attention looks on real photos: a pointing metric over COCO instance boxes.

Show, Attend and Tell (Xu et al., 2015, §5.4, Fig. 3) shows attention maps; this module
scores them. For every generated word that names a COCO category present in the photo
(`SYNONYMS` maps caption words to category names), the attention alpha_t that produced
the word (§3.1.2) is mapped back onto the photo exactly as the encoder saw it
(`image_io.crop_window`: resize, centre crop) and compared with that category's boxes:

- hit: the centre of the argmax cell lies inside a box (ties: the share of the tied
  cells whose centre does);
- mass: the attention inside the union of the boxes, each cell a rectangle of the photo,
  sum_i alpha_i * area(cell_i ∩ boxes) / area(cell_i), computed exactly;

beside what the same words get from maps that do not look:

- centre: the cell that holds the centre of the frame (for an even side the centre lies
  on a cell border; the two cells of that side that touch it count half each, so on a
  14 x 14 grid the four middle cells count a quarter each);
- random: a uniformly drawn cell, in expectation: the share of cells whose centre lies
  inside a box (exact, no sampling). A `none` model's uniform alpha ties every cell, so
  its hit equals this baseline;
- area_share: the share of the seen frame that the boxes cover, which is the mass a
  uniform map puts inside them.

Where the argmax lands regardless of the boxes is reported too: edge, the share of
scored words whose argmax cell lies on the grid's outer ring (ties: the share of tied
cells), beside edge_cells, the ring's share of all cells (what a uniformly drawn cell
gives). A model that parks its look on the border (an attention sink) shows edge well
above edge_cells; objects, framed towards the centre, then get less than they should.

Photographers centre what they photograph, so the centre guess is hard to beat on words
whose boxes hold the centre. The same scores are also reported over the off-centre
words alone, those whose boxes hold no centre cell (the centre baseline scores 0 on
them): there a hit is something the framing of the photo does not give away.

How far the look is ahead of the centre guess, with its uncertainty: hit_minus_centre is
the mean over the scored words of hit - centre, with a percentile interval from
resampling the photos (not the words: words of one photo share its framing and its
boxes, so they are not independent). Each resample draws as many photos as were scored,
with replacement, and takes the word-weighted mean of their words; a fixed seed makes the
interval repeatable.

The shapes set's metric (`grounding.pointing_accuracy`) asks the same question of
synthetic images; here the boxes come from COCO-format `instances_*.json` files, read by
`coco_photos`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np

from sat_tf.data import image_io
from sat_tf.evaluation.coco_photos import SYNONYMS, Photo, category_mentions


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How the encoder saw a photo (`image_io.resize_and_crop`) and its attention grid.

    Attributes:
      image_size: side of the square encoder input.
      crop_fraction: see `image_io.resize_and_crop` (`config.effective_crop_fraction`).
      grid: (H, W) of the attention grid; alpha is row-major over it.
    """

    image_size: int
    crop_fraction: float
    grid: tuple[int, int]


def visible_frame(width: int, height: int, image_size: int, crop_fraction: float) -> np.ndarray:
    """The part of a photo the encoder sees, in the photo's pixels.

    Reads the crop from `image_io.crop_window`, the code `resize_and_crop` runs: the
    resized image spans the photo's frame, so resized pixel `p` starts at original
    `p * width / new_width` (likewise down).

    Returns:
      float64 (4,) [x0, y0, x1, y1].
    """
    new_size, top, left = image_io.crop_window([height, width], image_size, crop_fraction)
    new_height, new_width = (int(v) for v in np.asarray(new_size))
    top, left = int(top), int(left)
    sx, sy = width / new_width, height / new_height
    return np.array(
        [left * sx, top * sy, (left + image_size) * sx, (top + image_size) * sy], np.float64
    )


def _edges(start: float, stop: float, n: int) -> np.ndarray:
    return start + (stop - start) * np.arange(n + 1) / n


def cell_rects(frame: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """The grid's cells as rectangles of the photo, row-major.

    Args:
      frame: [x0, y0, x1, y1] that the encoder input covers (`visible_frame`).
      grid: (H, W).

    Returns:
      float64 (H * W, 4) [x0, y0, x1, y1].
    """
    rows, cols = grid
    xs, ys = _edges(frame[0], frame[2], cols), _edges(frame[1], frame[3], rows)
    row, col = np.divmod(np.arange(rows * cols), cols)
    return np.stack([xs[col], ys[row], xs[col + 1], ys[row + 1]], axis=1)  # (L, 4)


def centres_inside(cells: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """bool (L,): whether each cell's centre lies in one of the boxes (edges included)."""
    cx = (cells[:, 0] + cells[:, 2]) / 2
    cy = (cells[:, 1] + cells[:, 3]) / 2
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    inside = (
        (boxes[:, 0] <= cx[:, None])
        & (cx[:, None] <= boxes[:, 2])
        & (boxes[:, 1] <= cy[:, None])
        & (cy[:, None] <= boxes[:, 3])
    )  # (L, n)
    return inside.any(axis=1)


def covered_fractions(frame: np.ndarray, grid: tuple[int, int], boxes: np.ndarray) -> np.ndarray:
    """Share of each cell's area inside the union of the boxes, exactly.

    The box edges (clipped to the frame) and the cell edges cut the frame into
    rectangles that lie wholly inside or outside each box and each cell; their areas are
    summed per cell.

    Args:
      frame: [x0, y0, x1, y1] of the seen part of the photo.
      grid: (H, W) cells that split the frame evenly.
      boxes: (n, 4) [x0, y0, x1, y1].

    Returns:
      float64 (H * W,) in [0, 1], row-major.
    """
    rows, cols = grid
    cell_x, cell_y = _edges(frame[0], frame[2], cols), _edges(frame[1], frame[3], rows)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    xs = np.unique(np.concatenate([cell_x, np.clip(boxes[:, [0, 2]], frame[0], frame[2]).ravel()]))
    ys = np.unique(np.concatenate([cell_y, np.clip(boxes[:, [1, 3]], frame[1], frame[3]).ravel()]))
    mx, my = (xs[:-1] + xs[1:]) / 2, (ys[:-1] + ys[1:]) / 2
    in_x = (boxes[:, 0, None] <= mx) & (mx <= boxes[:, 2, None])  # (n, X)
    in_y = (boxes[:, 1, None] <= my) & (my <= boxes[:, 3, None])  # (n, Y)
    covered = (in_y[:, :, None] & in_x[:, None, :]).any(axis=0)  # (Y, X)
    area = np.diff(ys)[:, None] * np.diff(xs)[None, :] * covered  # (Y, X)
    col = np.clip(np.searchsorted(cell_x, mx, side="right") - 1, 0, cols - 1)
    row = np.clip(np.searchsorted(cell_y, my, side="right") - 1, 0, rows - 1)
    per_cell = np.zeros(rows * cols)
    np.add.at(per_cell, (row[:, None] * cols + col[None, :]).ravel(), area.ravel())
    cell_area = (frame[2] - frame[0]) * (frame[3] - frame[1]) / (rows * cols)
    return np.minimum(per_cell / cell_area, 1.0)


def centre_cells(grid: tuple[int, int]) -> np.ndarray:
    """Row-major indices of the cells that hold the frame's centre.

    An odd side has one middle cell; on an even side the centre lies on the border of
    the two middle cells and both count. The centre baseline averages over these cells
    (1, 2 or 4), as ties of the argmax are averaged.
    """

    def middle(n):
        return [n // 2] if n % 2 else [n // 2 - 1, n // 2]

    rows, cols = grid
    return np.array([r * cols + c for r in middle(rows) for c in middle(cols)])


def edge_cells(grid: tuple[int, int]) -> np.ndarray:
    """(H * W,) bool, row-major: the cells of the grid's outer ring (every cell of a grid
    with a side of 1 or 2)."""
    rows, cols = grid
    ring = np.ones(grid, bool)
    ring[1 : rows - 1, 1 : cols - 1] = False
    return ring.reshape(-1)


def score_word(
    alpha: np.ndarray,
    cells: np.ndarray,
    boxes: np.ndarray,
    frame: np.ndarray,
    grid: tuple[int, int],
) -> dict:
    """The pointing scores of one word's attention against one category's boxes.

    Args:
      alpha: (H * W,) attention weights, row-major.
      cells: `cell_rects(frame, grid)`.
      boxes: (n, 4) boxes of the category named.
      frame, grid: see `cell_rects`.

    Returns:
      {"hit", "mass", "centre", "random", "area_share", "edge"}, floats (see the
      module's docstring).
    """
    inside = centres_inside(cells, boxes).astype(np.float64)
    covered = covered_fractions(frame, grid, boxes)
    peaks = np.flatnonzero(alpha == alpha.max())
    return {
        "hit": float(inside[peaks].mean()),
        "mass": float(np.dot(alpha, covered)),
        "centre": float(inside[centre_cells(grid)].mean()),
        "random": float(inside.mean()),
        "area_share": float(covered.mean()),
        "edge": float(edge_cells(grid)[peaks].mean()),
    }


SCORES = ("hit", "centre", "random", "mass", "area_share")


def photo_bootstrap(
    rows: Sequence[dict],
    key: str = "hit",
    baseline: str = "centre",
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> dict | None:
    """The mean of row[key] - row[baseline] over scored words, with a percentile interval
    from resampling the photos (the module's docstring).

    Args:
      rows: scored words ("image_id", key and baseline each).
      key, baseline: the two scores compared.
      resamples: bootstrap draws.
      level: the interval's coverage, in (0, 1).
      seed: of the draws.

    Returns:
      {"mean", "low", "high", "level", "resamples", "photos"}, or None without rows.

    Raises:
      ValueError: if resamples < 1 or level is not in (0, 1).
    """
    if resamples < 1 or not 0.0 < level < 1.0:
        raise ValueError(f"need resamples >= 1 and 0 < level < 1, got {resamples} and {level}")
    if not rows:
        return None
    photos = sorted({row["image_id"] for row in rows})
    where = {image_id: i for i, image_id in enumerate(photos)}
    totals, counts = np.zeros(len(photos)), np.zeros(len(photos))
    for row in rows:
        totals[where[row["image_id"]]] += row[key] - row[baseline]
        counts[where[row["image_id"]]] += 1
    picks = np.random.default_rng(seed).integers(0, len(photos), (resamples, len(photos)))
    means = totals[picks].sum(axis=1) / counts[picks].sum(axis=1)
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return {
        "mean": float(totals.sum() / counts.sum()),
        "low": float(low),
        "high": float(high),
        "level": level,
        "resamples": resamples,
        "photos": len(photos),
    }


def _summary(rows: list[dict]) -> dict:
    summary = {"words": len(rows), "photos": len({r["image_id"] for r in rows})}
    for key in SCORES:
        summary[key] = float(np.mean([r[key] for r in rows])) if rows else None
    return summary


def coco_grounding(
    photos: Sequence[Photo],
    captions: Sequence[Sequence[str]],
    alphas: Sequence[np.ndarray],
    geometry: Geometry,
    synonyms: dict = SYNONYMS,
) -> dict:
    """Scores where the attention of every category word of the captions lands.

    A word counts when it (`category_mentions`) names a category with a box in its
    photo; words naming an absent category are counted apart (`absent`), not scored.
    Rates are means over the scored words.

    Args:
      photos: the captioned photos.
      captions: per photo the generated words.
      alphas: per photo an array (T, H * W) or (T, H, W); row t is the attention that
        produced word t. Words with t >= T are not scored.
      geometry: how the encoder saw the photos.
      synonyms: word or phrase -> category name.

    Returns:
      {"photos": captioned photos, "words", "photos_scored", "absent", the `SCORES`
      over all scored words (None when no word was scored), "off_centre": {"words",
      "photos", SCORES...} over the words whose centre baseline is 0, "per_category":
      {name: {"words", "photos", SCORES...}} (most words first), "edge" and
      "edge_cells" (the module's docstring; edge None when no word was scored),
      "hit_minus_centre" (`photo_bootstrap`; None when no word was scored; the same
      under "off_centre" is hit - random there, as centre is 0), "scored": one dict per
      scored word}.

    Raises:
      ValueError: if the lists differ in length or an alpha does not fit the grid.
    """
    if not len(photos) == len(captions) == len(alphas):
        raise ValueError(
            f"photos, captions and alphas must have one entry per photo, got "
            f"{len(photos)}, {len(captions)} and {len(alphas)}"
        )
    grid = tuple(geometry.grid)
    num_cells = grid[0] * grid[1]
    rows, absent = [], 0
    for photo, words, alpha in zip(photos, captions, alphas, strict=True):
        alpha = np.asarray(alpha, np.float64)
        alpha = alpha.reshape(alpha.shape[0], -1) if alpha.ndim == 3 else alpha
        if alpha.ndim != 2 or alpha.shape[1] != num_cells or not np.all(np.isfinite(alpha)):
            raise ValueError(
                f"attention of photo {photo.image_id} must be finite with shape (T, "
                f"{num_cells}) for grid {grid}, got shape {alpha.shape}"
            )
        frame = visible_frame(
            photo.width, photo.height, geometry.image_size, geometry.crop_fraction
        )
        cells = cell_rects(frame, grid)
        for mention in category_mentions(words, synonyms):
            if mention.category not in photo.boxes:
                absent += 1
                continue
            if mention.index >= alpha.shape[0]:
                continue
            scores = score_word(
                alpha[mention.index], cells, photo.boxes[mention.category], frame, grid
            )
            rows.append(
                {
                    "image_id": photo.image_id,
                    "index": mention.index,
                    "word": mention.text,
                    "category": mention.category,
                    **scores,
                }
            )
    by_category = collections.defaultdict(list)
    for row in rows:
        by_category[row["category"]].append(row)
    per_category = {
        name: _summary(group)
        for name, group in sorted(by_category.items(), key=lambda item: (-len(item[1]), item[0]))
    }
    summary = _summary(rows)
    off_rows = [row for row in rows if row["centre"] == 0.0]
    return {
        "photos": len(photos),
        "words": summary.pop("words"),
        "photos_scored": summary.pop("photos"),
        "absent": absent,
        **summary,
        "hit_minus_centre": photo_bootstrap(rows),
        "off_centre": _summary(off_rows)
        | {"hit_minus_random": photo_bootstrap(off_rows, baseline="random")},
        "per_category": per_category,
        "edge": float(np.mean([row["edge"] for row in rows])) if rows else None,
        "edge_cells": float(edge_cells(grid).mean()),
        "scored": rows,
    }


def measure(
    photos: Sequence[Photo],
    caption_batch: Callable[[list[Photo]], list[tuple[list[str], np.ndarray]]],
    geometry: Geometry,
    batch_size: int = 8,
) -> tuple[dict, list[dict]]:
    """Captions the photos batch by batch and scores them with `coco_grounding`.

    Args:
      photos: from `coco_photos.load_coco_dir` / `read_instances`.
      caption_batch: photos -> per photo (words, alpha (T, H * W) or (T, H, W)).
      geometry: how the captioner's encoder sees a photo.
      batch_size: photos per call of `caption_batch`.

    Returns:
      (the `coco_grounding` result, per photo {"image_id", "file", "caption"}).
    """
    captions, alphas = [], []
    for start in range(0, len(photos), batch_size):
        for words, alpha in caption_batch(list(photos[start : start + batch_size])):
            captions.append(list(words))
            alphas.append(alpha)
    result = coco_grounding(photos, captions, alphas, geometry)
    written = [
        {"image_id": p.image_id, "file": os.path.basename(p.path), "caption": " ".join(w)}
        for p, w in zip(photos, captions, strict=True)
    ]
    return result, written


def format_table(result: dict, top: int = 12) -> str:
    """A Markdown table of a `coco_grounding` result: all words, then the `top`
    categories with the most words."""
    header = "| words | photos | hit | centre | random | mass | area share |"
    lines = [
        f"{result['words']} category words scored in {result['photos_scored']} of "
        f"{result['photos']} photos ({result['absent']} more name a category the photo "
        "lacks and are not scored)",
        "",
        "| category " + header,
        "|---" * 8 + "|",
    ]

    def line(name, s):
        rates = " | ".join("-" if s[k] is None else f"{s[k]:.3f}" for k in SCORES)
        return f"| {name} | {s['words']} | {s['photos']} | {rates} |"

    overall = {k: result[k] for k in SCORES} | {
        "words": result["words"],
        "photos": result["photos_scored"],
    }
    lines.append(line("**all**", overall))
    if "off_centre" in result:
        lines.append(line("*off centre*", result["off_centre"]))
    for name, s in list(result["per_category"].items())[:top]:
        lines.append(line(name, s))
    hidden = len(result["per_category"]) - top
    if hidden > 0:
        lines.append(f"\n({hidden} more categories in the JSON output)")

    def difference(name, interval):
        return (
            f"{name}: {interval['mean']:+.3f} ({100 * interval['level']:.0f} % interval "
            f"{interval['low']:+.3f} to {interval['high']:+.3f}, {interval['resamples']} "
            f"resamples of the {interval['photos']} photos)"
        )

    if result.get("hit_minus_centre"):
        lines.append("\n" + difference("Hit - centre", result["hit_minus_centre"]))
    if result.get("off_centre", {}).get("hit_minus_random"):
        off_centre = result["off_centre"]["hit_minus_random"]
        lines.append(difference("Off centre, hit - random", off_centre))
    if result.get("edge") is not None:
        lines.append(
            f"\nArgmax on the grid's outer ring: {result['edge']:.3f} of the scored words "
            f"(the ring holds {result['edge_cells']:.3f} of the cells)"
        )
    return "\n".join(lines)
