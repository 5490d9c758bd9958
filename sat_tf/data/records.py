"""What every caption reader shares: the `Record` type, strict file reading, the
bad-input policy (`Collector`), and the Karpathy split JSON reader used by every dataset.

Bad input policy (docs/design.md §10.3), the same for every reader:
  * A file that cannot be read, is not valid UTF-8 (strict decoding; no replacement, the
    error names the file and the line), is not valid JSON, lacks a required key (the
    error names the key and the entry index) or a token-file line without a tab or
    `#<n>` raises `DatasetError`.
  * Empty or whitespace-only captions are skipped; an image left with no caption is
    dropped. Both are counted and logged as a warning.
  * The same image id listed more than once: captions are merged in file order if all
    entries name the same file and split, otherwise `DatasetError`.
  * Images listed but absent on disk are counted up front (before any training starts):
    `on_missing="error"` raises `DatasetError` naming the caption file, the count and the
    first few paths; `on_missing="skip"` drops them and logs the same facts.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Sequence

from absl import logging

from sat_tf.utils.messages import preview

SPLITS = ("train", "val", "test")
KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


class DatasetError(ValueError):
    """A caption file or image folder that does not hold what its reader expects."""


@dataclasses.dataclass(frozen=True)
class Record:
    """One image and its reference captions.

    Attributes:
      image_id: Identifier unique within the dataset (COCO id, Karpathy `imgid`, file stem).
      image_path: Path of the image file.
      captions: Raw caption strings, at most `max_captions`, in file order.
      split: One of "train", "val", "test".
    """

    image_id: str
    image_path: str
    captions: tuple[str, ...]
    split: str


def split_counts(records: Iterable[Record]) -> dict[str, int]:
    """Returns the number of images per split, in the order train, val, test."""
    counts = collections.Counter(r.split for r in records)
    return {s: counts[s] for s in SPLITS if counts[s]}


def check_options(splits, on_missing: str, max_captions: int) -> tuple[str, ...]:
    if on_missing not in ("error", "skip"):
        raise ValueError(f"on_missing must be 'error' or 'skip', got {on_missing!r}")
    if not isinstance(max_captions, int) or max_captions < 1:
        raise ValueError(f"max_captions must be a positive integer, got {max_captions!r}")
    if splits is None:
        return SPLITS
    if isinstance(splits, str):
        splits = (splits,)
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise ValueError(f"unknown split(s) {unknown}; expected a subset of {list(SPLITS)}")
    return tuple(splits)


def read_text(path: str) -> str:
    """Reads a whole file as strict UTF-8 (a leading BOM is dropped)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read file ({e.strerror or e})") from e
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        bad = data[e.start : e.end]
        raise DatasetError(
            f"{path}, line {line}: bytes {bad!r} (file offset {e.start}) are not valid "
            "UTF-8; re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
        ) from e


def read_json(path: str):
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from e


def require(obj, key: str, where: str, path: str, kind: type | tuple[type, ...]):
    """Returns `obj[key]`, raising a `DatasetError` naming `where` if absent or mistyped."""
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}: {where} should be a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise DatasetError(f"{path}: {where} has no key {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise DatasetError(
            f"{path}: {where}[{key!r}] should be {names}, got {type(value).__name__} {value!r:.60}"
        )
    return value


class Collector:
    """Gathers images and captions from one source and applies the bad-input policy."""

    def __init__(self, source: str):
        self.source = source
        self._images: dict[str, tuple[str, str, str]] = {}
        self._captions: dict[str, list[str]] = {}
        self._empty: list[str] = []

    def add(self, image_id: str, path: str, split: str, captions: Iterable[str], where: str):
        """Adds captions for one image; `where` names the entry for error messages."""
        # The first entry of an id fixes its file and split; later ones may only add captions.
        seen = self._images.setdefault(image_id, (path, split, where))
        if seen[:2] != (path, split):
            raise DatasetError(
                f"{self.source}: image id {image_id!r} appears at {seen[2]} as {seen[0]} "
                f"(split {seen[1]}) and at {where} as {path} (split {split})"
            )
        kept = self._captions.setdefault(image_id, [])
        for caption in captions:
            caption = caption.strip()
            if caption:
                kept.append(caption)
            else:
                self._empty.append(where)

    def records(
        self, splits: Sequence[str], on_missing: str, max_captions: int, image_dir: str
    ) -> list[Record]:
        """Returns the records of `splits`, after dropping empty and missing images."""
        if self._empty:
            logging.warning(
                "%s: skipped %d empty or whitespace-only caption(s), at %s",
                self.source,
                len(self._empty),
                preview(self._empty),
            )
        records, uncaptioned, missing = [], [], []
        for image_id, (path, split, where) in self._images.items():
            if split not in splits:
                continue
            captions = self._captions[image_id]
            if not captions:
                uncaptioned.append(f"{image_id} ({where})")
            elif not os.path.exists(path):
                missing.append(path)
            else:
                records.append(Record(image_id, path, tuple(captions[:max_captions]), split))
        if uncaptioned:
            logging.warning(
                "%s: dropped %d image(s) with no non-empty caption: %s",
                self.source,
                len(uncaptioned),
                preview(uncaptioned),
            )
        if missing:
            total = len(records) + len(missing)
            message = (
                f"{self.source}: {len(missing)} of {total} images listed are missing on disk: "
                f"{preview(missing)}"
            )
            if not os.path.isdir(image_dir):
                message += f" (the image directory {image_dir} does not exist)"
            if on_missing == "error":
                raise DatasetError(message + "; pass on_missing='skip' to drop them")
            logging.warning("%s; skipped them", message)
        return records


def read_karpathy(
    json_path: str,
    image_dir: str,
    *,
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
    max_captions: int = 5,
    locate: Callable[[str], str] | None = None,
) -> list[Record]:
    """Reads a Karpathy split file (`dataset_{flickr8k,flickr30k,coco,shapes}.json`).

    Image path is `image_dir/filepath/filename` ("filepath" is optional: "train2014" or
    "val2014" for COCO, absent for Flickr), or `locate(image id)`. Image id is `cocoid`
    if present, else `imgid`. Captions are `sentences[i]["raw"]`; split "restval"
    becomes "train".

    Args:
      json_path: The JSON file.
      image_dir: Folder the entries' `filepath/filename` are relative to.
      splits: Splits to return (subset of "train", "val", "test"); None for all.
      on_missing: "error" or "skip" for images absent on disk.
      max_captions: Keep at most this many captions per image (paper §5.1: 5).
      locate: Maps an image id to its path, for images stored under other names than
        the file's (COCO 2017's `<12-digit id>.jpg`); None to use the file's names.

    Returns:
      The records, in file order.

    Raises:
      DatasetError: On unreadable, non-UTF-8, malformed or inconsistent input, or on
        missing images with on_missing="error".
    """
    splits = check_options(splits, on_missing, max_captions)
    data = read_json(json_path)
    entries = require(data, "images", "the top-level object", json_path, list)
    collector = Collector(json_path)
    for i, entry in enumerate(entries):
        where = f"images[{i}]"
        filename = require(entry, "filename", where, json_path, str)
        split = require(entry, "split", where, json_path, str)
        if split not in KARPATHY_SPLITS:
            raise DatasetError(
                f"{json_path}: {where} has split {split!r}; expected one of {list(KARPATHY_SPLITS)}"
            )
        id_key = "cocoid" if "cocoid" in entry else "imgid"
        image_id = str(require(entry, id_key, where, json_path, (int, str)))
        filepath = entry.get("filepath") or ""
        if not isinstance(filepath, str):
            raise DatasetError(f"{json_path}: {where}['filepath'] should be str")
        sentences = require(entry, "sentences", where, json_path, list)
        captions = [
            require(s, "raw", f"{where}['sentences'][{j}]", json_path, str)
            for j, s in enumerate(sentences)
        ]
        path = locate(image_id) if locate else os.path.join(image_dir, filepath, filename)
        collector.add(image_id, path, KARPATHY_SPLITS[split], captions, where)
    return collector.records(splits, on_missing, max_captions, image_dir)


def text_lines(path: str) -> list[tuple[int, str]]:
    """Returns the (1-based line number, text) of the non-blank lines of a text file."""
    text = read_text(path)
    return [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
