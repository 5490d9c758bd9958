"""How well attention points at what a caption names, on the built-in shapes set.

Every shapes object's box is known, so the attention maps of Show, Attend and Tell (Xu
et al., 2015, §3.1, §5.4) can be scored rather than only looked at: `pointing_accuracy`
checks that alpha_t peaks on the object named by the word it produced, and
`location_accuracy` that the location words a caption gives are right. Both read the
object phrases of a caption with `parse_object_mentions`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from sat_tf.data.shapes import COLORS, SHAPES, SIZES


@dataclasses.dataclass(frozen=True)
class Mention:
    """One object phrase found in a caption.

    Attributes:
      index: position of the shape word in the caption.
      size: "small" / "big", or None if the phrase has no size word.
      color: colour word, or None.
      shape: shape word.
      location: location words ("top left", "center", ...), or None.
      start: position of the phrase's first word: its size or colour word, else `index`.
    """

    index: int
    size: str | None
    color: str | None
    shape: str
    location: str | None
    start: int


def parse_object_mentions(words: Sequence[str]) -> list[Mention]:
    """Finds the object phrases of a caption.

    Each shape word starts a mention; the size and colour words directly before it and
    the location words after it (optionally after "at the" / "in the") complete it.
    Garbage input gives fewer or emptier mentions, never an error.

    Args:
      words: the caption as a list of words (str or UTF-8 bytes); items of other types
        count as unknown words, and a single string is split on whitespace.

    Returns:
      The mentions in caption order.
    """
    if isinstance(words, (str, bytes)):
        words = words.split()
    try:
        items = list(words)
    except TypeError:
        return []
    words = [
        w.decode("utf-8", "replace") if isinstance(w, bytes) else w if isinstance(w, str) else ""
        for w in items
    ]
    mentions = []
    for i, word in enumerate(words):
        if word not in SHAPES:
            continue
        size = color = None
        start = i
        for j in (i - 1, i - 2):
            if j < 0 or words[j] not in SIZES + COLORS:
                break
            if words[j] in SIZES and size is None:
                size = words[j]
            elif words[j] in COLORS and color is None:
                color = words[j]
            else:
                break
            start = j
        k = i + 1
        if k < len(words) and words[k] in ("at", "in"):
            k += 1
        if k < len(words) and words[k] == "the":
            k += 1
        location = None
        if k < len(words):
            if words[k] in ("top", "bottom"):
                location = words[k]
                if k + 1 < len(words) and words[k + 1] in ("left", "right"):
                    location += " " + words[k + 1]
            elif words[k] in ("left", "right", "center"):
                location = words[k]
        mentions.append(Mention(i, size, color, word, location, start))
    return mentions


def _referent(mention: Mention, objects: Sequence[dict]) -> dict | None:
    """The one object a mention names, or None if it names none or several.

    Colour and shape first; where they match several objects, the location and then
    the size narrow them down.
    """
    found = [
        o for o in objects if o["shape"] == mention.shape and mention.color in (None, o["color"])
    ]
    if len(found) > 1 and mention.location is not None:
        found = [o for o in found if o["location"] == mention.location]
    if len(found) > 1 and mention.size is not None:
        found = [o for o in found if o["size"] == mention.size]
    return found[0] if len(found) == 1 else None


def _check_lengths(**lists: Sequence) -> None:
    lengths = {name: len(value) for name, value in lists.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"lists must have the same length, got {lengths}")


def _cell_in_box(cell: int, box: Sequence[float], cols: int, cell_w: float, cell_h: float) -> bool:
    """True if the centre of grid cell `cell` (row-major) lies in `box` grown by half a cell."""
    row, col = divmod(cell, cols)
    x, y = (col + 0.5) * cell_w, (row + 0.5) * cell_h
    x0, y0, x1, y1 = box
    return x0 - cell_w / 2 <= x < x1 + cell_w / 2 and y0 - cell_h / 2 <= y < y1 + cell_h / 2


def pointing_accuracy(
    captions: Sequence[Sequence[str]],
    alphas: Sequence[np.ndarray],
    objects: Sequence[Sequence[dict]],
    *,
    grid: tuple[int, int] = (14, 14),
    image_size: int = 112,
) -> dict:
    """Share of object words whose attention peaks on the object they name.

    For every shape word whose phrase names exactly one object of the image (by colour and
    shape; where several match, by the location words, then the size), the attention
    alpha_t that produced the word (Sec. 3.1.2) is reduced to its argmax location; it is a
    hit when that grid cell's centre, in image pixels, lies inside the object's box grown
    by half a grid cell on each side (docs/design.md §6.2).

    A decoder may look at the object while producing the size or colour word and carry
    what it saw to the shape word in its memory; which word of the phrase carries the look
    can change with the seed alone. `phrase_pointing_accuracy` therefore also counts a
    mention as a hit when the attention of any word of its phrase (size, colour, shape)
    peaks on the object.

    Args:
      captions: generated captions, each a list of words.
      alphas: per caption an array (T, L) with L = H * W row-major; row t is the
        attention that produced word t. Words with t >= T are not scored.
      objects: per caption the image's object dicts ("box", "shape", "color", ...).
      grid: (H, W) of the attention grid.
      image_size: side of the square image the boxes are given in.

    Returns:
      {"pointing_accuracy": hits / scored (0.0 if nothing was scored), "hits", "scored",
      "phrase_pointing_accuracy": phrase_hits / scored, "phrase_hits"}.

    Raises:
      ValueError: if the lists differ in length or an alpha does not have L = H * W.
    """
    _check_lengths(captions=captions, alphas=alphas, objects=objects)
    rows, cols = grid
    cell_h, cell_w = image_size / rows, image_size / cols
    hits = phrase_hits = scored = 0
    for words, alpha, objs in zip(captions, alphas, objects, strict=True):
        alpha = np.asarray(alpha, dtype=np.float64)
        if alpha.ndim != 2 or alpha.shape[1] != rows * cols:
            raise ValueError(
                f"alpha must have shape (T, {rows * cols}) for grid {grid}, got {alpha.shape}"
            )
        peaks = np.argmax(alpha, axis=1)
        for mention in parse_object_mentions(list(words)):
            target = _referent(mention, objs)
            if target is None or mention.index >= alpha.shape[0]:
                continue
            on_target = [
                _cell_in_box(int(peaks[t]), target["box"], cols, cell_w, cell_h)
                for t in range(mention.start, mention.index + 1)
            ]
            scored += 1
            hits += int(on_target[-1])
            phrase_hits += int(any(on_target))
    return {
        "pointing_accuracy": hits / scored if scored else 0.0,
        "hits": hits,
        "scored": scored,
        "phrase_pointing_accuracy": phrase_hits / scored if scored else 0.0,
        "phrase_hits": phrase_hits,
    }


def location_accuracy(captions: Sequence[Sequence[str]], objects: Sequence[Sequence[dict]]) -> dict:
    """Share of generated location words that are right.

    Every object phrase with location words counts once; it is correct if an object with
    the phrase's shape, and its colour and size where given, sits in that grid cell.

    Args:
      captions: generated captions, each a list of words.
      objects: per caption the image's object dicts.

    Returns:
      {"location_accuracy": correct / total (0.0 if total is 0), "correct", "total"}.

    Raises:
      ValueError: if the lists differ in length.
    """
    _check_lengths(captions=captions, objects=objects)
    correct = total = 0
    for words, objs in zip(captions, objects, strict=True):
        for m in parse_object_mentions(list(words)):
            if m.location is None:
                continue
            total += 1
            correct += any(
                o["shape"] == m.shape
                and m.color in (None, o["color"])
                and m.size in (None, o["size"])
                and o["location"] == m.location
                for o in objs
            )
    return {
        "location_accuracy": correct / total if total else 0.0,
        "correct": correct,
        "total": total,
    }
