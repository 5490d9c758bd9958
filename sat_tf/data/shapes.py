"""The built-in shapes captioning dataset.

`generate` draws images of 1-4 coloured shapes on a noisy dark background, each in its own
cell of a 3x3 grid, and writes them with five captions each in the Karpathy split JSON
format, so the loaders that read Flickr8k read it too. Captions name every object with its
size, colour, shape and location in reading order, so a caption that gets a location or the
order wrong loses many n-grams.

Every object's box is stored with the captions, so that the attention maps can be
scored rather than only looked at (`evaluation/grounding.py`).
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import logging
from PIL import Image

from sat_tf.utils import files

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
    existing = _read_dataset(json_path)
    if _is_complete(existing, image_dir, params):
        return json_path
    if os.path.exists(json_path):
        _warn_of_other_params(existing, out_dir, params)
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
        with files.atomic_path(path) as tmp:
            Image.fromarray(pixels).save(tmp, format="PNG", compress_level=3)
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
    files.write_json(json_path, data, separators=(",", ":"))
    return json_path


def _read_dataset(json_path: str):
    """The dataset JSON's content (a dict), or None where it is missing or unreadable."""
    try:
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _warn_of_other_params(existing, out_dir: str, params: dict):
    """Logs which settings differ when a dataset of other settings (`existing`, from
    `_read_dataset`) is replaced in place: a run still reading the folder (its validation
    and test images are read from disk every time) would read the new images against its
    old captions."""
    if existing is None:
        return
    old = existing.get("params")
    old = old if isinstance(old, dict) else {}
    changed = {k: (old.get(k), v) for k, v in params.items() if old.get(k) != v}
    if changed:
        logging.warning(
            "replacing the shapes dataset in %s (was -> now: %s): a run or evaluation "
            "still using this folder now reads the new images against its old captions; "
            "give concurrent runs of other seeds or sizes their own --data_dir",
            out_dir,
            ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()),
        )


def _is_complete(data, image_dir: str, params: dict) -> bool:
    """True if the dataset JSON's content `data` (from `_read_dataset`) was written with
    `params` and all its images exist."""
    if data is None or data.get("params") != params:
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
