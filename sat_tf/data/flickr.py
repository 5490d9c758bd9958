"""Flickr8k and Flickr30k from their own text files, when Karpathy's JSON is absent.

Both datasets ship a token file of lines `<name>.jpg#<n>\\t<caption>` (Flickr8k's
`Flickr8k.token.txt`, Flickr30k's `results_20130124.token`) and a split as lists of
images, one a line:

    flickr8k   Flickr_8k.{train,dev,test}Images.txt   file names; "dev" is the val split
    flickr30k  {train,val,test}.txt                   image ids without `.jpg` (the split
                                                      files of Flickr30k Entities)

A split line may give the file name or the id without extension; both name the same image.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence

from absl import logging

from sat_tf.data.records import (
    Collector,
    DatasetError,
    Record,
    check_options,
    text_lines,
)
from sat_tf.utils.messages import preview

FLICKR8K_TOKEN_FILE = "Flickr8k.token.txt"
FLICKR8K_SPLIT_FILES = {
    "train": "Flickr_8k.trainImages.txt",
    "val": "Flickr_8k.devImages.txt",
    "test": "Flickr_8k.testImages.txt",
}
FLICKR30K_TOKEN_FILE = "results_20130124.token"
FLICKR30K_SPLIT_FILES = {"train": "train.txt", "val": "val.txt", "test": "test.txt"}
TOKEN_FILES = {"flickr8k": FLICKR8K_TOKEN_FILE, "flickr30k": FLICKR30K_TOKEN_FILE}
SPLIT_FILES = {"flickr8k": FLICKR8K_SPLIT_FILES, "flickr30k": FLICKR30K_SPLIT_FILES}

# Image folder names as the datasets' archives and other mirrors unpack them; the first
# that exists is used.
IMAGE_DIRS = {
    "flickr8k": ("Flicker8k_Dataset", "Flickr8k_Dataset", "Images"),
    "flickr30k": ("flickr30k-images", "flickr30k_images", "Images"),
}


def image_folder(data_dir: str, dataset: str) -> str:
    """Returns the first existing image folder of a Flickr dataset (else the usual name)."""
    candidates = IMAGE_DIRS[dataset]
    for name in candidates:
        if os.path.isdir(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    return os.path.join(data_dir, candidates[0])


def _file_name(line: str) -> str:
    name = line.strip()
    return name if os.path.splitext(name)[1] else name + ".jpg"


def read_token_file(
    token_file: str,
    split_files: Mapping[str, str],
    image_dir: str,
    *,
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
    max_captions: int = 5,
) -> list[Record]:
    """Reads a Flickr token file with its split files.

    Captioned images that no split file lists are dropped (and counted in a warning).

    Args:
      token_file: Lines `<name>.jpg#<n>\\t<caption>`.
      split_files: {split: path of a file listing its images, one a line}.
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
    splits = check_options(splits, on_missing, max_captions)
    split_of: dict[str, tuple[str, str]] = {}
    for split, split_file in split_files.items():
        for n, line in text_lines(split_file):
            filename = _file_name(line)
            where = f"{split_file}, line {n}"
            previous = split_of.setdefault(filename, (split, where))
            if previous[0] != split:
                raise DatasetError(f"{filename} is listed at {previous[1]} and at {where}")
    collector = Collector(token_file)
    unlisted = collections.Counter()
    for n, line in text_lines(token_file):
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
            "%s: dropped %d image(s) that no split file (%s) lists: %s",
            token_file,
            len(unlisted),
            ", ".join(split_files.values()),
            preview(list(unlisted)),
        )
    # Listed images without any token line are counted as uncaptioned by `records`.
    for filename, (split, where) in split_of.items():
        collector.add(
            os.path.splitext(filename)[0], os.path.join(image_dir, filename), split, [], where
        )
    return collector.records(splits, on_missing, max_captions, image_dir)


def read_flickr8k(
    token_file: str,
    split_dir: str,
    image_dir: str,
    *,
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
    max_captions: int = 5,
) -> list[Record]:
    """Reads the raw Flickr8k text files: `token_file` (`Flickr8k.token.txt`) and
    `split_dir/Flickr_8k.{train,dev,test}Images.txt`; the rest as `read_token_file`."""
    split_files = {s: os.path.join(split_dir, n) for s, n in FLICKR8K_SPLIT_FILES.items()}
    return read_token_file(
        token_file,
        split_files,
        image_dir,
        splits=splits,
        on_missing=on_missing,
        max_captions=max_captions,
    )


def read_raw(
    dataset: str, data_dir: str, *, splits: Sequence[str] | None, on_missing: str
) -> list[Record]:
    """Reads `data_dir`'s token and split files of "flickr8k" or "flickr30k" (the names
    in this module's docstring), its images in `image_folder(data_dir, dataset)`.

    Raises:
      DatasetError: Naming the files that are absent, or on bad input.
    """
    token_file = os.path.join(data_dir, TOKEN_FILES[dataset])
    split_files = {s: os.path.join(data_dir, n) for s, n in SPLIT_FILES[dataset].items()}
    json_path = os.path.join(data_dir, f"dataset_{dataset}.json")
    if not os.path.exists(token_file):
        raise DatasetError(
            f"{dataset}: found neither {json_path} nor {token_file}; see the layout in "
            "sat_tf/data/datasets.py"
        )
    absent = [path for path in split_files.values() if not os.path.exists(path)]
    if absent:
        source = " (from Flickr30k Entities)" if dataset == "flickr30k" else ""
        raise DatasetError(
            f"{dataset}: found {token_file} but not its split file(s) {', '.join(absent)}"
            f"{source}; or use Karpathy's {json_path}"
        )
    image_dir = image_folder(data_dir, dataset)
    records = read_token_file(
        token_file, split_files, image_dir, splits=splits, on_missing=on_missing
    )
    logging.info("%s: read %s with the split files in %s", dataset, token_file, data_dir)
    return records
