"""Caption dataset readers: Karpathy JSON, raw Flickr8k, official COCO, TFDS `coco_captions`.

Every reader returns a list of `Record`s: one per image, its captions as raw strings
(stripped of surrounding whitespace; tokenization happens in `vocab.py`), at most
`max_captions` of them (5, as in the paper §5.1: "each image has 5 reference sentences"),
in a deterministic order (the order of the source file). Splits are Karpathy's: `train`,
`val`, `test`; `restval` is folded into `train`. The one exception is COCO read from the
official caption files, which have no test split (see `read_coco_official`).

Expected directory layouts, as read by `load_records(dataset, data_dir)`:

    shapes              <data_dir>/dataset_shapes.json
                        <data_dir>/<filepath>/<filename>     (written by `shapes.py`)
    flickr8k            <data_dir>/dataset_flickr8k.json     (Karpathy's caption_datasets.zip)
                        <data_dir>/Flicker8k_Dataset/<name>.jpg
                        Without the Karpathy JSON, the raw text files are read instead:
                        <data_dir>/Flickr8k.token.txt
                        <data_dir>/Flickr_8k.trainImages.txt
                        <data_dir>/Flickr_8k.devImages.txt   (the "val" split)
                        <data_dir>/Flickr_8k.testImages.txt
    flickr30k           <data_dir>/dataset_flickr30k.json
                        <data_dir>/flickr30k-images/<name>.jpg
    coco                <data_dir>/dataset_coco.json
                        <data_dir>/train2014/COCO_train2014_<id>.jpg
                        <data_dir>/val2014/COCO_val2014_<id>.jpg
                        Without the Karpathy JSON, the official caption files are read
                        instead (splits made by `read_coco_official`):
                        <data_dir>/annotations/captions_train2014.json
                        <data_dir>/annotations/captions_val2014.json
    coco_captions_tfds  <data_dir>/coco_captions/2014/<version>/  (prepared by `tfds build`)
                        <data_dir>/coco_captions_images/<id>.jpg  (written on first read)
                        <data_dir>/coco_captions_images/<split>_index.json

The Flickr image folder may also be named `Flickr8k_Dataset/` or `Images/` (Flickr8k),
`flickr30k_images/` or `Images/` (Flickr30k), as other mirrors unpack them; the first
folder that exists is used.

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
from collections.abc import Iterable, Sequence

from absl import logging

from sat_tf import files
from sat_tf.config import DATASETS
from sat_tf.messages import preview

SPLITS = ("train", "val", "test")

FLICKR8K_TOKEN_FILE = "Flickr8k.token.txt"
FLICKR8K_SPLIT_FILES = {
    "train": "Flickr_8k.trainImages.txt",
    "val": "Flickr_8k.devImages.txt",
    "test": "Flickr_8k.testImages.txt",
}
# The official COCO 2014 caption files and the image folders of their `file_name`s.
COCO_OFFICIAL_FILES = {
    "train2014": os.path.join("annotations", "captions_train2014.json"),
    "val2014": os.path.join("annotations", "captions_val2014.json"),
}
# Images of val2014 (by image id) that `read_coco_official` gives to val and to test: the
# sizes of Karpathy's split, not its images.
COCO_VAL_IMAGES = 5000
COCO_TEST_IMAGES = 5000
TFDS_SPLITS = ("train", "val", "test", "restval")
TFDS_IMAGE_DIR = "coco_captions_images"

_IMAGE_DIRS = {
    "flickr8k": ("Flicker8k_Dataset", "Flickr8k_Dataset", "Images"),
    "flickr30k": ("flickr30k-images", "flickr30k_images", "Images"),
}
_KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


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


def _check_options(splits, on_missing: str, max_captions: int) -> tuple[str, ...]:
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


def _read_text(path: str) -> str:
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


def _read_json(path: str):
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(
            f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from e


def _get(obj, key: str, where: str, path: str, kind: type | tuple[type, ...]):
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


class _Collector:
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
) -> list[Record]:
    """Reads a Karpathy split file (`dataset_{flickr8k,flickr30k,coco,shapes}.json`).

    Image path is `image_dir/filepath/filename` ("filepath" is optional: "train2014" or
    "val2014" for COCO, absent for Flickr). Image id is `cocoid` if present, else
    `imgid`. Captions are `sentences[i]["raw"]`; split "restval" becomes "train".

    Args:
      json_path: The JSON file.
      image_dir: Folder the entries' `filepath/filename` are relative to.
      splits: Splits to return (subset of "train", "val", "test"); None for all.
      on_missing: "error" or "skip" for images absent on disk.
      max_captions: Keep at most this many captions per image (paper §5.1: 5).

    Returns:
      The records, in file order.

    Raises:
      DatasetError: On unreadable, non-UTF-8, malformed or inconsistent input, or on
        missing images with on_missing="error".
    """
    splits = _check_options(splits, on_missing, max_captions)
    data = _read_json(json_path)
    entries = _get(data, "images", "the top-level object", json_path, list)
    collector = _Collector(json_path)
    for i, entry in enumerate(entries):
        where = f"images[{i}]"
        filename = _get(entry, "filename", where, json_path, str)
        split = _get(entry, "split", where, json_path, str)
        if split not in _KARPATHY_SPLITS:
            raise DatasetError(
                f"{json_path}: {where} has split {split!r}; expected one of "
                f"{list(_KARPATHY_SPLITS)}"
            )
        id_key = "cocoid" if "cocoid" in entry else "imgid"
        image_id = str(_get(entry, id_key, where, json_path, (int, str)))
        filepath = entry.get("filepath") or ""
        if not isinstance(filepath, str):
            raise DatasetError(f"{json_path}: {where}['filepath'] should be str")
        sentences = _get(entry, "sentences", where, json_path, list)
        captions = [
            _get(s, "raw", f"{where}['sentences'][{j}]", json_path, str)
            for j, s in enumerate(sentences)
        ]
        path = os.path.join(image_dir, filepath, filename)
        collector.add(image_id, path, _KARPATHY_SPLITS[split], captions, where)
    return collector.records(splits, on_missing, max_captions, image_dir)


def _lines(path: str) -> list[tuple[int, str]]:
    """Returns the (1-based line number, text) of the non-blank lines of a text file."""
    text = _read_text(path)
    return [(n, line.rstrip("\r")) for n, line in enumerate(text.split("\n"), 1) if line.strip()]


def read_flickr8k(
    token_file: str,
    split_dir: str,
    image_dir: str,
    *,
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
    max_captions: int = 5,
) -> list[Record]:
    """Reads the raw Flickr8k text files.

    `token_file` holds lines `<name>.jpg#<n>\\t<caption>`; `split_dir` holds
    `Flickr_8k.{train,dev,test}Images.txt` (one file name a line; "dev" is "val").
    Captioned images that no split file lists are dropped (and counted in a warning).

    Args:
      token_file: Path of `Flickr8k.token.txt`.
      split_dir: Folder of the three split files.
      image_dir: Folder of the images.
      splits: Splits to return (subset of "train", "val", "test"); None for all.
      on_missing: "error" or "skip" for images absent on disk.
      max_captions: Keep at most this many captions per image (paper §5.1: 5).

    Returns:
      The records, in order of first appearance in the token file; image id is the file
      name without extension.

    Raises:
      DatasetError: On unreadable, non-UTF-8 or malformed files, an image listed in two
        split files, or missing images with on_missing="error".
    """
    splits = _check_options(splits, on_missing, max_captions)
    split_of: dict[str, tuple[str, str]] = {}
    for split, name in FLICKR8K_SPLIT_FILES.items():
        split_file = os.path.join(split_dir, name)
        for n, line in _lines(split_file):
            filename = line.strip()
            where = f"{split_file}, line {n}"
            previous = split_of.setdefault(filename, (split, where))
            if previous[0] != split:
                raise DatasetError(f"{filename} is listed at {previous[1]} and at {where}")
    collector = _Collector(token_file)
    unlisted = collections.Counter()
    for n, line in _lines(token_file):
        name, tab, caption = line.partition("\t")
        filename, hash_, index = name.rpartition("#")
        if not tab or not hash_ or not index.strip().isdigit():
            problem = "has no tab" if not tab else "does not start with <image name>#<n>"
            raise DatasetError(
                f"{token_file}, line {n}: {problem}; expected "
                f"'<image>.jpg#<n>\\t<caption>', got {line!r:.80}"
            )
        filename = filename.strip()
        if filename not in split_of:
            unlisted[filename] += 1
            continue
        image_id = os.path.splitext(filename)[0]
        path = os.path.join(image_dir, filename)
        collector.add(image_id, path, split_of[filename][0], [caption], f"line {n}")
    if unlisted:
        logging.warning(
            "%s: dropped %d image(s) that no split file in %s lists: %s",
            token_file,
            len(unlisted),
            split_dir,
            preview(list(unlisted)),
        )
    # Listed images without any token line are counted as uncaptioned by `records`.
    for filename, (split, where) in split_of.items():
        collector.add(
            os.path.splitext(filename)[0], os.path.join(image_dir, filename), split, [], where
        )
    return collector.records(splits, on_missing, max_captions, image_dir)


def read_coco(
    captions_json: str,
    image_dir: str,
    *,
    split: str,
    on_missing: str = "error",
    max_captions: int = 5,
) -> list[Record]:
    """Reads an official COCO captions file (`captions_train2014.json`, ...).

    Args:
      captions_json: The JSON file: {"images": [{"id", "file_name"}], "annotations":
        [{"image_id", "caption"}]}.
      image_dir: Folder holding the `file_name`s (e.g. `<root>/val2014`).
      split: Split given to every record: "train", "val" or "test".
      on_missing: "error" or "skip" for images absent on disk.
      max_captions: Keep at most this many captions per image (paper §5.1: 5).

    Returns:
      The records in the order of "images", captions in the order of "annotations";
      image id is `str(id)`.

    Raises:
      DatasetError: On unreadable, non-UTF-8, malformed or inconsistent input, or on
        missing images with on_missing="error".
    """
    (split,) = _check_options((split,), on_missing, max_captions)
    collector = _collect_coco(captions_json, image_dir, lambda ids: dict.fromkeys(ids, split))
    return collector.records((split,), on_missing, max_captions, image_dir)


def _collect_coco(captions_json: str, image_dir: str, assign) -> _Collector:
    """Parses an official COCO captions file into a `_Collector`.

    `assign` maps the list of image ids (in the order of "images") to {image id: split}.
    """
    data = _read_json(captions_json)
    images = _get(data, "images", "the top-level object", captions_json, list)
    annotations = _get(data, "annotations", "the top-level object", captions_json, list)
    listed = []
    for i, image in enumerate(images):
        where = f"images[{i}]"
        image_id = str(_get(image, "id", where, captions_json, (int, str)))
        path = os.path.join(image_dir, _get(image, "file_name", where, captions_json, str))
        listed.append((image_id, path, where))
    split_of = assign([image_id for image_id, _, _ in listed])
    collector = _Collector(captions_json)
    known = {}
    for image_id, path, where in listed:
        collector.add(image_id, path, split_of[image_id], [], where)
        known[image_id] = path
    for i, annotation in enumerate(annotations):
        where = f"annotations[{i}]"
        image_id = str(_get(annotation, "image_id", where, captions_json, (int, str)))
        caption = _get(annotation, "caption", where, captions_json, str)
        if image_id not in known:
            raise DatasetError(
                f"{captions_json}: {where} refers to image_id {image_id}, which 'images' "
                "does not list"
            )
        collector.add(image_id, known[image_id], split_of[image_id], [caption], where)
    return collector


def _id_order(image_id: str):
    """Sort key: numeric ids (COCO's) in numeric order, then any others as strings."""
    return (0, int(image_id), "") if image_id.isdigit() else (1, 0, image_id)


def coco_val2014_splits(image_ids: Iterable[str]) -> dict[str, str]:
    """Splits the val2014 images into val, test and train, by image id.

    In increasing id order the first `COCO_VAL_IMAGES` (5,000) images go to val, the next
    `COCO_TEST_IMAGES` (5,000) to test and the rest to train: with the 40,504 images of
    val2014 and train2014's 82,783 the sizes are those of Karpathy's split (113,287 /
    5,000 / 5,000), not its images. A val2014 with fewer than 15,000 images gives a third
    (rounded down) to each of val and test, so tiny sets still have all three splits.

    Args:
      image_ids: The image ids of val2014 (repeats are ignored).

    Returns:
      {image id: "val", "test" or "train"}.
    """
    ordered = sorted(dict.fromkeys(image_ids), key=_id_order)
    num_val = min(COCO_VAL_IMAGES, len(ordered) // 3)
    num_test = min(COCO_TEST_IMAGES, len(ordered) // 3)
    held_out = ["val"] * num_val + ["test"] * num_test
    return {
        image_id: held_out[i] if i < len(held_out) else "train"
        for i, image_id in enumerate(ordered)
    }


def read_coco_official(
    data_dir: str,
    *,
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
    max_captions: int = 5,
) -> list[Record]:
    """Reads COCO 2014 from the official caption files, which have no test split.

    `data_dir/annotations/captions_train2014.json` gives train, its images in
    `data_dir/train2014/`; `data_dir/annotations/captions_val2014.json` (images in
    `data_dir/val2014/`) is split by `coco_val2014_splits`. That is not Karpathy's split,
    so scores are not comparable with those of the paper (a warning says so).

    Args:
      data_dir: The COCO root folder.
      splits: Splits to return (subset of "train", "val", "test"); None for all.
      on_missing: "error" or "skip" for images absent on disk.
      max_captions: Keep at most this many captions per image (paper §5.1: 5).

    Returns:
      The records of train2014 then val2014, each in the order of its "images"; image id
      is `str(id)`.

    Raises:
      DatasetError: On unreadable, non-UTF-8, malformed or inconsistent input, or on
        missing images with on_missing="error".
    """
    splits = _check_options(splits, on_missing, max_captions)
    records = []
    for folder, name in COCO_OFFICIAL_FILES.items():
        if folder == "train2014":
            if "train" not in splits:
                continue
            assign = lambda ids: dict.fromkeys(ids, "train")
        else:
            assign = coco_val2014_splits
        captions_json = os.path.join(data_dir, name)
        image_dir = os.path.join(data_dir, folder)
        collector = _collect_coco(captions_json, image_dir, assign)
        records += collector.records(splits, on_missing, max_captions, image_dir)
    counts = collections.Counter(r.image_id for r in records)
    twice = [image_id for image_id, n in counts.items() if n > 1]
    if twice:
        files = " and ".join(os.path.join(data_dir, n) for n in COCO_OFFICIAL_FILES.values())
        raise DatasetError(f"coco: image id(s) {preview(twice)} are listed in both {files}")
    logging.warning(
        "coco: reading the official caption files in %s. Splits: train2014 -> train; "
        "val2014 by image id: the first %d -> val, the next %d -> test, the rest -> train "
        "(a third each to val and test if val2014 has fewer than %d images). These are the "
        "sizes of Karpathy's split, not its images: scores are not comparable with results "
        "on Karpathy's test split. Images per split: %s",
        data_dir,
        COCO_VAL_IMAGES,
        COCO_TEST_IMAGES,
        3 * max(COCO_VAL_IMAGES, COCO_TEST_IMAGES),
        split_counts(records),
    )
    return records


def _tfds_index(index_path: str, image_dir: str) -> list[dict] | None:
    """Returns the cached index of a TFDS split if it and all its images are present."""
    if not os.path.exists(index_path):
        return None
    try:
        entries = _read_json(index_path)["images"]
        if all(os.path.exists(os.path.join(image_dir, e["filename"])) for e in entries):
            return entries
    except (DatasetError, KeyError, TypeError) as e:
        logging.warning("%s: unreadable cache index (%s); rebuilding it", index_path, e)
    return None


def read_tfds(
    split: str,
    *,
    data_dir: str | None = None,
    image_dir: str | None = None,
    download: bool = False,
    max_captions: int = 5,
) -> list[Record]:
    """Reads a split of TFDS `coco_captions` (Karpathy's splits of COCO 2014).

    TFDS stores image bytes, not paths: the first read of a split writes each image's
    JPEG bytes unchanged to `image_dir/<image id>.jpg` (files already there are kept, so
    an interrupted run resumes) and, once the split is complete, an index
    `image_dir/<split>_index.json`; later reads use the index and skip TFDS.

    Args:
      split: TFDS split: "train", "val", "test" or "restval" (records get "train").
      data_dir: TFDS data dir; None for the TFDS default (`~/tensorflow_datasets`).
      image_dir: Image cache; default `<data_dir>/coco_captions_images`.
      download: Download and prepare the dataset (about 38 GB) if it is not there.
      max_captions: Keep at most this many captions per image (paper §5.1: 5).

    Returns:
      The records in TFDS order; image id is the COCO id.

    Raises:
      DatasetError: If the dataset is not prepared and download is False, or a caption
        is not valid UTF-8.
    """
    if split not in TFDS_SPLITS:
        raise ValueError(f"unknown TFDS coco_captions split {split!r}; expected {TFDS_SPLITS}")
    _check_options(None, "error", max_captions)
    import tensorflow_datasets as tfds

    builder = tfds.builder("coco_captions", data_dir=data_dir)
    image_dir = image_dir or os.path.join(data_dir or builder.data_dir_root, TFDS_IMAGE_DIR)
    index_path = os.path.join(image_dir, f"{split}_index.json")
    source = f"TFDS coco_captions/{split}"
    entries = _tfds_index(index_path, image_dir)
    if entries is None:
        if download:
            builder.download_and_prepare()
        try:
            # SkipDecoding yields the stored JPEG bytes, written out unchanged below.
            ds = builder.as_dataset(
                split=split,
                shuffle_files=False,
                decoders={"image": tfds.decode.SkipDecoding()},
            )
        except AssertionError as e:
            raise DatasetError(
                f"{source}: the dataset is not prepared in {data_dir or builder.data_dir_root}; "
                "run `tfds build coco_captions --data_dir=<data_dir>` or pass download=True"
            ) from e
        os.makedirs(image_dir, exist_ok=True)
        entries = []
        for example in ds.as_numpy_iterator():
            image_id = str(int(example["image/id"]))
            filename = f"{image_id}.jpg"
            if not os.path.exists(os.path.join(image_dir, filename)):
                files.write_bytes(os.path.join(image_dir, filename), example["image"])
            try:
                captions = [t.decode("utf-8") for t in example["captions"]["text"]]
            except UnicodeDecodeError as e:
                raise DatasetError(f"{source}: image {image_id} has a non-UTF-8 caption") from e
            entries.append({"image_id": image_id, "filename": filename, "captions": captions})
            if len(entries) % 10000 == 0:
                logging.info("%s: %d images written to %s", source, len(entries), image_dir)
        files.write_bytes(index_path, json.dumps({"split": split, "images": entries}).encode())
    collector = _Collector(source)
    record_split = _KARPATHY_SPLITS[split]
    for i, entry in enumerate(entries):
        path = os.path.join(image_dir, entry["filename"])
        collector.add(entry["image_id"], path, record_split, entry["captions"], f"example {i}")
    return collector.records((record_split,), "error", max_captions, image_dir)


def _image_dir(data_dir: str, dataset: str) -> str:
    """Returns the first existing image folder of a Flickr dataset (else the usual name)."""
    candidates = _IMAGE_DIRS[dataset]
    for name in candidates:
        if os.path.isdir(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    return os.path.join(data_dir, candidates[0])


def load_records(
    dataset: str,
    data_dir: str,
    *,
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
) -> list[Record]:
    """Reads a dataset by name from the layout documented at the top of this module.

    Args:
      dataset: One of "shapes", "flickr8k", "flickr30k", "coco", "coco_captions_tfds".
      data_dir: The dataset's root folder (for "coco_captions_tfds", the TFDS data dir).
      splits: Splits to return (subset of "train", "val", "test"); None for all.
      on_missing: "error" or "skip" for images absent on disk (not used by the TFDS
        reader, which writes its images itself).

    Returns:
      The records, at most 5 captions per image.

    Raises:
      ValueError: For an unknown dataset name.
      DatasetError: If the expected files are absent or hold bad input.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {list(DATASETS)}")
    splits = _check_options(splits, on_missing, 5)
    if dataset == "coco_captions_tfds":
        records = []
        for split in splits:
            for tfds_split in ("train", "restval") if split == "train" else (split,):
                records += read_tfds(tfds_split, data_dir=data_dir)
        return records
    json_path = os.path.join(data_dir, f"dataset_{dataset}.json")
    image_dir = _image_dir(data_dir, dataset) if dataset in _IMAGE_DIRS else data_dir
    if dataset == "flickr8k" and not os.path.exists(json_path):
        token_file = os.path.join(data_dir, FLICKR8K_TOKEN_FILE)
        if os.path.exists(token_file):
            return read_flickr8k(
                token_file, data_dir, image_dir, splits=splits, on_missing=on_missing
            )
        raise DatasetError(
            f"flickr8k: found neither {json_path} nor {token_file}; see the layout in "
            "sat_tf/data/datasets.py"
        )
    if dataset == "coco" and not os.path.exists(json_path):
        official = [os.path.join(data_dir, name) for name in COCO_OFFICIAL_FILES.values()]
        absent = [path for path in official if not os.path.exists(path)]
        if not absent:
            return read_coco_official(data_dir, splits=splits, on_missing=on_missing)
        raise DatasetError(
            f"coco: found neither {json_path} nor the official caption files "
            f"{' and '.join(official)} (absent: {', '.join(absent)}); see the layout in "
            "sat_tf/data/datasets.py"
        )
    if not os.path.exists(json_path):
        hint = " (generate it with sat_tf/data/shapes.py)" if dataset == "shapes" else ""
        raise DatasetError(f"{dataset}: {json_path} not found{hint}")
    return read_karpathy(json_path, image_dir, splits=splits, on_missing=on_missing)
