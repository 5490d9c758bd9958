"""A folder of one's own images with one captions file (`--dataset=folder`).

`read_folder(data_dir)` finds the captions file by the conventions below, or reads the
one `captions=` names (relative to `data_dir` or absolute), and returns one `Record` per
image. An image's id is its path relative to `data_dir`, '/'-separated ("trip/boat.jpg");
images may sit in any subfolder, in any format `image_io` reads (IMAGE_EXTENSIONS).

Layouts looked for in `data_dir`:

    imagefolder  metadata.jsonl: one JSON object a line, its image under `file_name` and
                 its caption under `text`, `caption` or `captions` (a string or a list of
                 strings); or metadata.csv, a `file_name` and a caption column, one row
                 per caption. File names are relative to the metadata file's folder: one
                 file at the top, or one in each of train/, validation/ (or val/) and
                 test/, as Hugging Face's `imagefolder` has them.
    table        A CSV or TSV with a header: captions.txt, captions.csv, captions.tsv,
                 results.csv or any other *.csv or *.tsv at the top, as Kaggle's Flickr8k
                 (`captions.txt`, header `image,caption`, images in Images/) and
                 Flickr30k (`results.csv`, header `image_name| comment_number| comment`,
                 images in flickr30k_images/) ship theirs. The delimiter (`,`, tab or
                 `|`) is the first that splits the header into an image column
                 (IMAGE_COLUMNS) and a caption column (CAPTION_COLUMNS); names are matched
                 without case and surrounding spaces, the first of each list present
                 wins. An image is looked for beside the file, then in its Images/,
                 images/ and flickr30k_images/ subfolders.
    coco         A COCO-format captions JSON ({"images": [{"id", "file_name"}],
                 "annotations": [{"image_id", "caption"}]}, as COCO, nocaps and VizWiz
                 ship theirs) at the top or in annotations/. An image is looked for beside
                 it, at the top, then by its file name in every subfolder (train2017/...).

metadata.csv is read as a table whose images sit beside it; the keys of metadata.jsonl
are looked up by the names of a table's columns. A folder holding more than one candidate
file is refused, naming them: pass `captions=` (--captions=FILE) to choose. A file given
so is read by its name: *.jsonl and metadata.csv as imagefolder, *.json as COCO, any
other as a table.

Splits, a property of the image (all captions of an image go to its split):
  1. a `split` column or key: train, val, validation or test (restval is train);
  2. else the top-level folder train/, validation/ or val/, test/ that holds the image;
  3. else `split_of`, from a sha256 hash of the image's id: 80 % train, 10 % val,
     10 % test (SPLIT_PERCENT). It depends on that path alone: adding photos moves none.

Bad input follows `records.py` (the `Collector`: empty captions, images missing on disk,
unreadable or non-UTF-8 files) and, for one row (a table row, a JSON line, an entry of
the COCO "images"):
  * A row that cannot be used is skipped with a warning naming the file, the line and the
    problem: a table row with the wrong number of fields or a field running over several
    lines (a quote left open), a line that is not a JSON object with an image and a
    caption, no image name, a name that is not of an image file, a file name that several
    images of a COCO layout share, an unknown split or one that contradicts the split
    folder. The first ROW_WARNINGS are logged, and one summary counts all of them.
  * One file named two ways (`a.jpg` and `./a.jpg`, a link or a case variant that opens
    the same file): its captions are kept with the first name, and a warning names both.
  * A folder without a captions file, or a captions file that gives no image with a
    caption: `DatasetError` naming the folder and the layouts looked for.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import hashlib
import io
import json
import os
import posixpath
from collections.abc import Iterator, Sequence

from absl import logging

from sat_tf.data import coco
from sat_tf.data.records import (
    Collector,
    DatasetError,
    Record,
    check_options,
    read_text,
    split_counts,
    text_lines,
)
from sat_tf.utils.messages import preview

# Percent of images that `split_of` gives each split.
SPLIT_PERCENT = {"train": 80, "val": 10, "test": 10}
# The file names of the formats `image_io` reads (JPEG, PNG, GIF, BMP, WebP).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
IMAGE_COLUMNS = ("image", "image_name", "file_name", "filename", "file", "path", "img")
CAPTION_COLUMNS = ("caption", "comment", "text", "captions", "sentence")
SPLIT_COLUMN = "split"
SPLIT_VALUES = {
    "train": "train",
    "restval": "train",
    "val": "val",
    "validation": "val",
    "test": "test",
}
SPLIT_FOLDERS = {"train": "train", "validation": "val", "val": "val", "test": "test"}
METADATA_FILES = ("metadata.jsonl", "metadata.csv")
TABLE_FILES = ("captions.txt", "captions.csv", "captions.tsv", "results.csv")
TABLE_EXTENSIONS = (".csv", ".tsv")
IMAGE_SUBFOLDERS = ("Images", "images", "flickr30k_images")
COCO_FOLDER = "annotations"
DELIMITERS = (",", "\t", "|")
# Bad rows (and files named two ways) logged one by one; the summary counts them all.
ROW_WARNINGS = 10

LAYOUTS = """the layouts looked for (or name the file with --captions=FILE):
  metadata.jsonl (or metadata.csv), at the top or in each of train/, validation/, test/:
    {"file_name": "dog.jpg", "text": "a dog runs on the grass"}
    {"file_name": "cat.png", "text": ["a cat sleeps", "a grey cat on a sofa"]}
    {"file_name": "trip/boat.jpg", "caption": "a boat on a lake"}
  a CSV or TSV with a header (captions.txt, *.csv, *.tsv), images beside it or in Images/:
    image,caption
    dog.jpg,a dog runs on the grass
    dog.jpg,"a brown dog, running"
  a COCO-format captions JSON at the top or in annotations/, images in any subfolder:
    {"images": [{"id": 1, "file_name": "dog.jpg"}],
     "annotations": [{"image_id": 1, "caption": "a dog runs on the grass"},
                     {"image_id": 1, "caption": "a brown dog"}]}"""


def split_of(relative_path: str) -> str:
    """The split of an image by a hash of its path, independent of every other image.

    The first 8 bytes of the sha256 of the '/'-separated, normalized path (UTF-8), read
    as a big-endian integer n, give the percentile `n * 100 // 2**64`; the splits take
    SPLIT_PERCENT of them in the order train, val, test.

    Args:
      relative_path: The image's path relative to the data folder ("trip/boat.jpg").

    Returns:
      "train", "val" or "test".
    """
    key = posixpath.normpath(relative_path.replace(os.sep, "/"))
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    percentile = int.from_bytes(digest[:8], "big") * 100 >> 64
    for split, percent in SPLIT_PERCENT.items():
        if percentile < percent:
            return split
        percentile -= percent
    raise AssertionError(f"SPLIT_PERCENT sums to less than 100: {SPLIT_PERCENT}")


@dataclasses.dataclass(frozen=True)
class _Source:
    """The captions file(s) of a folder: `layout` is "imagefolder", "table" or "coco"."""

    layout: str
    files: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _Row:
    """One row of a captions file; `problem` is (kind, text) for a row that is skipped."""

    file: str
    where: str
    name: str = ""
    captions: tuple[str, ...] = ()
    split: str | None = None
    problem: tuple[str, str] | None = None


def _relative(path: str, data_dir: str) -> str:
    return os.path.relpath(path, data_dir).replace(os.sep, "/")


def _files(data_dir: str, folder: str, keep) -> list[str]:
    """The files of `data_dir/folder` whose name `keep` accepts, in name order."""
    path = os.path.join(data_dir, folder)
    if not os.path.isdir(path):
        return []
    names = sorted(n for n in os.listdir(path) if keep(n))
    return [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]


def _candidates(data_dir: str) -> list[_Source]:
    """Every captions file of the layouts in this module's docstring, in that order."""

    def is_metadata(name):
        return name in METADATA_FILES

    found = [_Source("imagefolder", (p,)) for p in _files(data_dir, "", is_metadata)]
    per_split = [_files(data_dir, f, is_metadata) for f in SPLIT_FOLDERS]
    if any(len(files) > 1 for files in per_split):
        found += [_Source("imagefolder", (p,)) for files in per_split for p in files]
    elif any(per_split):
        found.append(_Source("imagefolder", tuple(p for files in per_split for p in files)))

    def is_table(name):
        lower = name.lower()
        return name != "metadata.csv" and (lower in TABLE_FILES or lower.endswith(TABLE_EXTENSIONS))

    def is_json(name):
        return name.lower().endswith(".json")

    found += [_Source("table", (p,)) for p in _files(data_dir, "", is_table)]
    coco = _files(data_dir, "", is_json) + _files(data_dir, COCO_FOLDER, is_json)
    return found + [_Source("coco", (p,)) for p in coco]


def _find_source(data_dir: str) -> _Source:
    found = _candidates(data_dir)
    if len(found) == 1:
        return found[0]
    if not found:
        empty = " (it is empty)" if not os.listdir(data_dir) else ""
        raise DatasetError(f"folder: {data_dir} holds no captions file{empty}; {LAYOUTS}")
    names = [" + ".join(_relative(p, data_dir) for p in s.files) for s in found]
    raise DatasetError(
        f"folder: {data_dir} holds {len(found)} candidate captions files: {', '.join(names)}; "
        "pass --captions=FILE to name the one to read"
    )


def _named_source(data_dir: str, captions: str) -> _Source:
    path = captions if os.path.isabs(captions) else os.path.join(data_dir, captions)
    if not os.path.isfile(path):
        raise DatasetError(f"folder: the captions file {path} does not exist")
    name = os.path.basename(path).lower()
    if name.endswith(".jsonl") or name == "metadata.csv":
        return _Source("imagefolder", (path,))
    return _Source("coco" if name.endswith(".json") else "table", (path,))


def _entry_row(path: str, where: str, entry) -> _Row:
    """The row of one JSON line of metadata.jsonl."""

    def bad(kind, text):
        return _Row(path, where, problem=(kind, text))

    if not isinstance(entry, dict):
        return bad("not a JSON object", f"is a JSON {type(entry).__name__}, not an object")
    image_key = next((k for k in IMAGE_COLUMNS if k in entry), None)
    caption_key = next((k for k in CAPTION_COLUMNS if k in entry), None)
    if image_key is None or caption_key is None:
        keys = ", ".join(IMAGE_COLUMNS if image_key is None else CAPTION_COLUMNS)
        what = "image" if image_key is None else "caption"
        return bad(f"no {what} key", f"has no {what} key (one of {keys})")
    name, captions, split = entry[image_key], entry[caption_key], entry.get(SPLIT_COLUMN)
    if isinstance(captions, str):
        captions = [captions]
    if not isinstance(name, str):
        return bad("image name not a string", f"{image_key!r} is {name!r:.60}, not a string")
    if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
        return bad(
            "caption not a string",
            f"{caption_key!r} is {captions!r:.60}, not a string or a list of strings",
        )
    if split is not None and not isinstance(split, str):
        return bad("unknown split", f"'split' is {split!r:.60}, not a string")
    return _Row(path, where, name, tuple(captions), split)


def _jsonl_rows(path: str) -> Iterator[_Row]:
    for n, line in text_lines(path):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            problem = f"not valid JSON ({e.msg} at column {e.colno})"
            yield _Row(path, f"line {n}", problem=("not valid JSON", problem))
            continue
        yield _entry_row(path, f"line {n}", entry)


def _columns(path: str, text: str) -> tuple[str, int, int, int | None]:
    """(delimiter, image column, caption column, split column or None) of a table,
    read from its header, the first line that is not blank."""
    lines = io.StringIO(text, newline="")
    n, header = next(((n, line) for n, line in enumerate(lines, 1) if line.strip()), (0, ""))
    for delimiter in DELIMITERS:
        names = [name.strip().lower() for name in next(csv.reader([header], delimiter=delimiter))]
        image = next((names.index(c) for c in IMAGE_COLUMNS if c in names), None)
        caption = next((names.index(c) for c in CAPTION_COLUMNS if c in names), None)
        if image is not None and caption is not None:
            split = names.index(SPLIT_COLUMN) if SPLIT_COLUMN in names else None
            logging.info(
                "%s: image column %r, caption column %r, delimiter %r",
                path,
                names[image],
                names[caption],
                delimiter,
            )
            return delimiter, image, caption, split
    raise DatasetError(
        f"{path}, line {n}: the header {header.strip()!r:.100} has no image column (one of "
        f"{', '.join(IMAGE_COLUMNS)}) and caption column (one of {', '.join(CAPTION_COLUMNS)}) "
        "separated by ',', a tab or '|'"
    )


def _table_rows(path: str) -> Iterator[_Row]:
    text = read_text(path)
    if not text.strip():
        return
    delimiter, image, caption, split = _columns(path, text)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    width = None
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            yield _Row(path, f"line {start}", problem=("unreadable CSV", str(e)))
            continue
        if not any(field.strip() for field in row):
            continue
        if width is None:
            width = len(row)
            continue
        where = f"line {start}"
        if reader.line_num > start:
            lines = f"lines {start}-{reader.line_num}"
            problem = f"a field runs over {lines} (a quote left open?)"
            yield _Row(path, where, problem=("field over several lines", problem))
        elif len(row) != width:
            problem = f"has {len(row)} fields, the header {width}"
            yield _Row(path, where, problem=("wrong number of fields", problem))
        else:
            value = row[split] if split is not None else None
            yield _Row(path, where, row[image], (row[caption],), value)


def _coco_rows(path: str) -> Iterator[_Row]:
    """One row per entry of "images", with the captions "annotations" give it."""
    images, annotations = coco.caption_entries(path)
    captions: dict[str, list[str]] = {}
    for where, image_id, _, _ in images:
        if image_id in captions:
            raise DatasetError(f"{path}: {where} repeats the id {image_id} of an earlier entry")
        captions[image_id] = []
    for _, image_id, caption in annotations:
        captions[image_id].append(caption)
    for where, image_id, file_name, entry in images:
        split = entry.get(SPLIT_COLUMN)
        split = None if split is None else str(split)
        yield _Row(path, where, file_name, tuple(captions[image_id]), split)


def _file_key(path: str, image_id: str):
    """What names one file however it is spelled (device and inode), else its image id."""
    try:
        stat = os.stat(path)
    except OSError:
        return image_id
    return stat.st_dev, stat.st_ino


def _split(value: str | None, image_id: str) -> tuple[str, tuple[str, str] | None]:
    """(split, problem) of an image from its row's split value (None if it has none), else
    from its top-level split folder, else from `split_of`."""
    top, slash, _ = image_id.partition("/")
    folder_split = SPLIT_FOLDERS.get(top) if slash else None
    if value is None:
        return folder_split or split_of(image_id), None
    split = SPLIT_VALUES.get(value.strip().lower())
    if split is None:
        expected = ", ".join(SPLIT_VALUES)
        return "", ("unknown split", f"has split {value!r}; expected one of {expected}")
    if folder_split and split != folder_split:
        problem = f"has split {value!r}, but {image_id} is in the {top}/ folder"
        return "", ("split against its folder", problem)
    return split, None


class _Reader:
    """Turns the rows of a folder's captions files into a `Collector`'s images."""

    def __init__(self, data_dir: str, collector: Collector, several_files: bool):
        self.data_dir = data_dir
        self.collector = collector
        self.several_files = several_files
        self.rows = 0
        self.usable = 0
        self.skipped = collections.Counter()
        self.aliases: set = set()
        self.warned = 0
        self._names: dict = {}
        self._index: dict[str, list[str]] | None = None

    def read(self, path: str, layout: str) -> None:
        folder = os.path.dirname(path)
        if layout == "coco":
            rows, dirs = _coco_rows(path), (folder, self.data_dir)
        elif path.lower().endswith(".jsonl"):
            rows, dirs = _jsonl_rows(path), (folder,)
        else:
            rows = _table_rows(path)
            dirs = (folder,)
            if layout == "table":
                dirs += tuple(os.path.join(folder, s) for s in IMAGE_SUBFOLDERS)
        for row in rows:
            self.rows += 1
            problem = row.problem or self._add(row, dirs, search=layout == "coco")
            if problem:
                self.skipped[problem[0]] += 1
                self._warn(f"{row.file}, {row.where}: {problem[1]}; skipped")

    def _where(self, row: _Row) -> str:
        if self.several_files:
            return f"{_relative(row.file, self.data_dir)}, {row.where}"
        return row.where

    def _add(self, row: _Row, dirs: Sequence[str], search: bool) -> tuple[str, str] | None:
        name = row.name.strip()
        if not name:
            return "no image name", "has no image name"
        if not name.lower().endswith(IMAGE_EXTENSIONS):
            extensions = ", ".join(IMAGE_EXTENSIONS)
            return "not an image file", f"names {name!r}, not an image file ({extensions})"
        path, others = self._locate(name, dirs, search)
        if others:
            shown = preview(_relative(p, self.data_dir) for p in others)
            return "file name of several images", f"{name!r} could be any of {shown}"
        image_id = _relative(path, self.data_dir)
        key = _file_key(path, image_id)
        first = self._names.get(key, (image_id, path, name, f"{row.file}, {row.where}"))
        split, problem = _split(row.split, first[0])
        if problem:
            return problem
        self._names[key] = first
        if name != first[2] and (key, name) not in self.aliases:
            self.aliases.add((key, name))
            self._warn(
                f"{row.file}, {row.where}: {name!r} names the same file as {first[2]!r} at "
                f"{first[3]}; its captions are kept with image {first[0]}"
            )
        self.collector.add(first[0], first[1], split, row.captions, self._where(row))
        if any(c.strip() for c in row.captions):
            self.usable += 1
        return None

    def _locate(self, name: str, dirs: Sequence[str], search: bool) -> tuple[str, list[str]]:
        """The image `name` names, in the first of `dirs` that holds it, else (`search`)
        the one image of its file name in the folder's tree; else where it should be (in
        the first of `dirs[1:]` that exists, else in `dirs[0]`). Also the images that
        share its file name when there are several."""
        for folder in dirs:
            path = os.path.normpath(os.path.join(folder, name))
            if os.path.isfile(path):
                return path, []
        if search:
            matches = self._by_file_name().get(os.path.basename(name), [])
            if len(matches) == 1:
                return matches[0], []
            if matches:
                return "", matches
        home = next((d for d in dirs[1:] if os.path.isdir(d)), dirs[0])
        return os.path.normpath(os.path.join(home, name)), []

    def _by_file_name(self) -> dict[str, list[str]]:
        """{file name: its paths} of the images under the data folder (hidden ones not)."""
        if self._index is None:
            self._index = collections.defaultdict(list)
            for folder, subfolders, names in os.walk(self.data_dir):
                subfolders[:] = sorted(s for s in subfolders if not s.startswith("."))
                for name in sorted(names):
                    if name.lower().endswith(IMAGE_EXTENSIONS):
                        self._index[name].append(os.path.join(folder, name))
        return self._index

    def _warn(self, message: str) -> None:
        self.warned += 1
        if self.warned <= ROW_WARNINGS:
            logging.warning("%s", message)

    def summarize(self, source: str) -> None:
        """Logs one warning counting the rows skipped and the files named two ways."""
        parts = []
        if self.skipped:
            kinds = ", ".join(f"{kind}: {n}" for kind, n in self.skipped.items())
            parts.append(f"skipped {sum(self.skipped.values())} of {self.rows} row(s) ({kinds})")
        if self.aliases:
            parts.append(f"kept {len(self.aliases)} other name(s) of a file with its first name")
        if parts:
            logged = (
                f"; the first {ROW_WARNINGS} are logged above" if self.warned > ROW_WARNINGS else ""
            )
            logging.warning("%s: %s%s", source, "; ".join(parts), logged)


def read_folder(
    data_dir: str,
    *,
    captions: str = "",
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
    max_captions: int = 5,
) -> list[Record]:
    """Reads a folder of images and its captions file (the layouts of this module).

    Args:
      data_dir: The folder; image ids are paths relative to it.
      captions: The captions file, relative to `data_dir` or absolute; "" to find it by
        the conventions of this module's docstring.
      splits: Splits to return (subset of "train", "val", "test"); None for all.
      on_missing: "error" or "skip" for images named but absent on disk.
      max_captions: Keep at most this many captions per image (paper §5.1: 5).

    Returns:
      The records, in order of first appearance in the captions file(s).

    Raises:
      DatasetError: For a folder without a captions file or with several candidates, a
        captions file that gives no image with a caption, unreadable, non-UTF-8 or
        inconsistent input, or missing images with on_missing="error".
    """
    splits = check_options(splits, on_missing, max_captions)
    if not os.path.isdir(data_dir):
        raise DatasetError(f"folder: {data_dir} is not a folder")
    source = _named_source(data_dir, captions) if captions else _find_source(data_dir)
    label = source.files[0] if len(source.files) == 1 else data_dir
    reader = _Reader(data_dir, Collector(label), several_files=len(source.files) > 1)
    for path in source.files:
        reader.read(path, source.layout)
    reader.summarize(label)
    if not reader.usable:
        names = ", ".join(_relative(p, data_dir) for p in source.files)
        raise DatasetError(
            f"folder: {names} in {data_dir} gives no image with a caption ({reader.rows} "
            f"row(s) read, {sum(reader.skipped.values())} skipped); {LAYOUTS}"
        )
    records = reader.collector.records(splits, on_missing, max_captions, data_dir)
    logging.info(
        "folder: read %s (%s layout): images per split %s",
        label,
        source.layout,
        split_counts(records),
    )
    return records
