"""The built-in shapes captioning dataset and the attention metrics it makes possible.

`generate` draws images of 1-4 coloured shapes on a noisy dark background, each in its own
cell of a 3x3 grid, and writes them with five captions each in the Karpathy split JSON
format, so the loaders that read Flickr8k read it too. Captions name every object with its
size, colour, shape and location in reading order, so a caption that gets a location or the
order wrong loses many n-grams.

Because every object's box is known, the attention maps of Show, Attend and Tell (Xu et
al., 2015, Sec. 3.1, 5.4) can be scored rather than only looked at: `pointing_accuracy`
checks that alpha_t peaks on the object named by the word it produced, and
`location_accuracy` that the location words a caption gives are right.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

import numpy as np
from PIL import Image

SHAPES = ("circle", "square", "triangle", "diamond")
COLORS = ("red", "green", "blue", "yellow", "white")
SIZES = ("small", "big")
LOCATIONS = (
    "top left",
    "top",
    "top right",
    "left",
    "center",
    "right",
    "bottom left",
    "bottom",
    "bottom right",
)

_RGB = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (230, 220, 40),
    "white": (235, 235, 235),
}
_FORMAT_VERSION = 1
_MIN_IMAGE_SIZE = 48
_BIG, _SMALL = 26 / 112, 14 / 112
_NUM_OBJECTS_P = (0.05, 0.40, 0.35, 0.20)
_SHARE_P = 0.8
_CAPTIONS_PER_IMAGE = 5
_COLOR_JITTER = 20
_NOISE_LEVELS, _NOISE_STEP = 6, 8
_VARIANTS = ("in", "there", "relation_first", "relation_last", "there_in")


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


def generate(
    out_dir: str,
    *,
    seed: int = 0,
    num_train: int = 8000,
    num_val: int = 1000,
    num_test: int = 1000,
    image_size: int = 112,
) -> str:
    """Writes the shapes dataset to `out_dir` unless it is already there.

    Images go to `out_dir/images/{imgid:05d}.png`, the captions and object metadata to
    `out_dir/dataset_shapes.json` (Karpathy format plus "objects" and "image_size" per
    image, and the generation parameters under "params"). The first `num_train` images
    are "train", then `num_val` "val", then `num_test` "test". Image `imgid` depends only
    on `seed`, `imgid` and `image_size`. The JSON is written last and atomically, so it
    never lists images that were not written.

    Args:
      out_dir: directory to write to; created if missing.
      seed: random seed; the same arguments give byte-identical files.
      num_train: number of training images.
      num_val: number of validation images.
      num_test: number of test images.
      image_size: side of the square RGB images in pixels, at least 48.

    Returns:
      The path of the JSON file.

    Raises:
      ValueError: if a count is negative or `image_size` is too small.
    """
    for name, value in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
        if not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if not isinstance(image_size, (int, np.integer)) or image_size < _MIN_IMAGE_SIZE:
        raise ValueError(
            f"image_size={image_size!r} is too small for a 3x3 grid of big objects; "
            f"need an integer >= {_MIN_IMAGE_SIZE}"
        )
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    params = {
        "version": _FORMAT_VERSION,
        "seed": int(seed),
        "num_train": int(num_train),
        "num_val": int(num_val),
        "num_test": int(num_test),
        "image_size": int(image_size),
    }
    json_path = os.path.join(out_dir, "dataset_shapes.json")
    image_dir = os.path.join(out_dir, "images")
    if _is_complete(json_path, image_dir, params):
        return json_path
    if os.path.exists(json_path):
        os.remove(json_path)
    os.makedirs(image_dir, exist_ok=True)

    splits = ["train"] * num_train + ["val"] * num_val + ["test"] * num_test
    images = []
    for imgid, split in enumerate(splits):
        rng = np.random.default_rng([int(seed), imgid])
        pixels, objects = _draw_scene(rng, int(image_size))
        filename = f"{imgid:05d}.png"
        # Written under a temporary name, then renamed: a run that reads the folder while
        # another run regenerates it sees whole images, never a half-written one.
        path = os.path.join(image_dir, filename)
        tmp_image = f"{path}.tmp{os.getpid()}"
        Image.fromarray(pixels).save(tmp_image, format="PNG", compress_level=3)
        os.replace(tmp_image, path)
        sentences = []
        for k, caption in enumerate(_captions(objects, rng)):
            sentences.append(
                {
                    "raw": caption,
                    "tokens": caption.split(),
                    "imgid": imgid,
                    "sentid": imgid * _CAPTIONS_PER_IMAGE + k,
                }
            )
        images.append(
            {
                "filename": filename,
                "filepath": "images",
                "imgid": imgid,
                "split": split,
                "sentids": [s["sentid"] for s in sentences],
                "sentences": sentences,
                "objects": objects,
                "image_size": int(image_size),
            }
        )
    data = {"dataset": "shapes", "params": params, "images": images}
    tmp_path = f"{json_path}.tmp{os.getpid()}"
    with open(tmp_path, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, separators=(",", ":")))
    os.replace(tmp_path, json_path)
    return json_path


def _is_complete(json_path: str, image_dir: str, params: dict) -> bool:
    """True if `json_path` was written with `params` and all its images exist."""
    try:
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("params") != params:
        return False
    try:
        names = [entry["filename"] for entry in data["images"]]
    except (KeyError, TypeError):
        return False
    return all(os.path.exists(os.path.join(image_dir, name)) for name in names)


def _draw_scene(rng: np.random.Generator, image_size: int) -> tuple[np.ndarray, list[dict]]:
    """Samples one scene and draws it.

    Returns:
      uint8 pixels (image_size, image_size, 3) and the object dicts in reading order.
    """
    n = int(rng.choice(len(_NUM_OBJECTS_P), p=_NUM_OBJECTS_P)) + 1
    cells = sorted(int(c) for c in rng.choice(9, size=n, replace=False))
    shapes = [SHAPES[i] for i in rng.integers(len(SHAPES), size=n)]
    colors = [COLORS[i] for i in rng.integers(len(COLORS), size=n)]
    sizes = [SIZES[i] for i in rng.integers(len(SIZES), size=n)]
    shares = any(
        shapes[i] == shapes[j] or colors[i] == colors[j] for i in range(n) for j in range(i)
    )
    if n > 1 and not shares and rng.random() < _SHARE_P:
        src, dst = (int(i) for i in rng.choice(n, size=2, replace=False))
        if rng.random() < 0.5:
            colors[dst] = colors[src]
        else:
            shapes[dst] = shapes[src]

    base = rng.integers(10, 41, size=3)
    # Grey noise in a few levels keeps the PNGs small (~9 kB) yet every pixel random.
    noise = rng.integers(0, _NOISE_LEVELS, size=(image_size, image_size, 1)) * _NOISE_STEP
    pixels = base + noise  # (S, S, 3)
    bounds = np.floor(np.arange(4) * image_size / 3).astype(int)
    # Each object's box lies inside its cell with a 1 px margin, so boxes never touch.
    objects = []
    for cell, shape, color, size in zip(cells, shapes, colors, sizes, strict=True):
        extent = round((_BIG if size == "big" else _SMALL) * image_size) + int(rng.integers(-1, 2))
        row, col = divmod(cell, 3)
        x0 = int(rng.integers(bounds[col] + 1, bounds[col + 1] - extent))
        y0 = int(rng.integers(bounds[row] + 1, bounds[row + 1] - extent))
        mask = _shape_mask(shape, extent)
        ys, xs = np.nonzero(mask)
        rgb = np.clip(
            np.array(_RGB[color]) + rng.integers(-_COLOR_JITTER, _COLOR_JITTER + 1, 3), 0, 255
        )
        jitter = rng.integers(-2, 3, size=(len(ys), 1)) * _NOISE_STEP
        pixels[y0 + ys, x0 + xs] = rgb + jitter  # (P, 3)
        objects.append(
            {
                "box": [
                    x0 + int(xs.min()),
                    y0 + int(ys.min()),
                    x0 + int(xs.max()) + 1,
                    y0 + int(ys.max()) + 1,
                ],
                "cell": cell,
                "location": LOCATIONS[cell],
                "shape": shape,
                "color": color,
                "size": size,
            }
        )
    return np.clip(pixels, 0, 255).astype(np.uint8), objects


def _shape_mask(shape: str, extent: int) -> np.ndarray:
    """Boolean (extent, extent) mask of `shape`, sampled at pixel centres."""
    u = (np.arange(extent) + 0.5) / extent - 0.5
    x, y = u[None, :], u[:, None]  # (1, E), (E, 1)
    if shape == "circle":
        return x**2 + y**2 <= 0.25
    if shape == "square":
        return np.ones((extent, extent), dtype=bool)
    if shape == "diamond":
        return np.abs(x) + np.abs(y) <= 0.5
    return np.abs(x) <= (y + 0.5) / 2  # (E, E), apex at the top


def _relation(a: dict, b: dict) -> str:
    """Where `b` lies seen from `a`; `b` follows `a` in reading order."""
    return "to its right" if a["cell"] // 3 == b["cell"] // 3 else "below it"


def _captions(objects: list[dict], rng: np.random.Generator) -> list[str]:
    """Five captions: the plain one, then four of the five other phrasings, drawn at random."""

    def phrase(o: dict, prep: str) -> str:
        return f"a {o['size']} {o['color']} {o['shape']} {prep} the {o['location']}"

    def joined(prep: str, relate_at: int | None = None) -> str:
        words = phrase(objects[0], prep)
        for k in range(1, len(objects)):
            link = "and"
            if k == relate_at:
                link = f"and {_relation(objects[k - 1], objects[k])}"
            words += f" {link} {phrase(objects[k], prep)}"
        return words

    variants = {
        "in": joined("in"),
        "there": "there is " + joined("at"),
        "relation_first": joined("at", relate_at=1),
        "relation_last": joined("in", relate_at=len(objects) - 1),
        "there_in": "there is " + joined("in"),
    }
    picked = rng.choice(len(_VARIANTS), size=_CAPTIONS_PER_IMAGE - 1, replace=False)
    return [joined("at")] + [variants[_VARIANTS[i]] for i in picked]


def load_objects(json_path: str) -> dict[str, list[dict]]:
    """Reads the per-image object lists of a shapes JSON.

    Args:
      json_path: a file written by `generate`.

    Returns:
      {image_id: objects} with image_id = str(imgid), objects in reading order.

    Raises:
      ValueError: if the file is not a shapes dataset JSON.
    """
    with open(json_path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except ValueError as e:
            raise ValueError(f"{json_path} is not valid JSON: {e}") from e
    try:
        return {str(entry["imgid"]): entry["objects"] for entry in data["images"]}
    except (KeyError, TypeError) as e:
        raise ValueError(f"{json_path} is not a shapes dataset JSON (missing {e})") from e


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
    by half a grid cell on each side (DESIGN.md §2).

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
