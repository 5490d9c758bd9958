"""MS COCO as it is downloaded: the 2014 or the 2017 release, with Karpathy's split or the
official caption files.

The two releases hold the same photos with the same image ids under other names and
another split of the files (2017's train2017 is train2014 plus most of val2014):

    2014   train2014/COCO_train2014_<12-digit id>.jpg   annotations/captions_train2014.json
           val2014/COCO_val2014_<12-digit id>.jpg       annotations/captions_val2014.json
    2017   train2017/<12-digit id>.jpg                  annotations/captions_train2017.json
           val2017/<12-digit id>.jpg                    annotations/captions_val2017.json

`find_layout(data_dir)` says which one a folder holds:
  * Karpathy's `dataset_coco.json` (its split, by `cocoid`, applies to either release)
    with both image folders of one release; else
  * the official caption files of one release, each with its image folder. These have no
    test split: train is train; val is split by image id (`split_by_image_id`: the first
    5,000 images to val, the next 5,000 to test, the rest to train; a third each to val
    and test when there are fewer than 15,000). A folder with train alone (or val alone)
    has that half split the same way, so that 80 photos of train2017 still give a train,
    a val and a test split. These are not Karpathy's images: scores are not comparable
    with the paper's, and a warning says so.
A folder that holds files of both releases, a caption file without its image folder (or
the reverse), or Karpathy's JSON with one image folder of the two, is refused, naming them.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence

from absl import logging

from sat_tf.data.records import (
    Collector,
    DatasetError,
    Record,
    check_options,
    read_json,
    read_karpathy,
    require,
    split_counts,
)
from sat_tf.utils.messages import preview

RELEASES = ("2014", "2017")
KARPATHY_FILE = "dataset_coco.json"
# Images (by image id) that `split_by_image_id` gives to val and to test: the sizes of
# Karpathy's split, not its images.
COCO_VAL_IMAGES = 5000
COCO_TEST_IMAGES = 5000


def caption_file(folder: str) -> str:
    """The official caption file of an image folder, relative to the COCO root."""
    return os.path.join("annotations", f"captions_{folder}.json")


def image_file_name(folder: str, image_id: int | str) -> str:
    """The official file name of image `image_id` in `folder` ("train2014", "val2017", ...)."""
    number = f"{int(image_id):012d}"
    return f"COCO_{folder}_{number}.jpg" if folder.endswith("2014") else f"{number}.jpg"


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a COCO folder holds, as `find_layout` found it.

    Attributes:
      data_dir: The COCO root folder.
      release: "2014" or "2017".
      karpathy: Whether Karpathy's `dataset_coco.json` gives captions and split.
      halves: The official halves present, ("train", "val"), ("train",) or ("val",); with
        Karpathy's JSON always both image folders.
    """

    data_dir: str
    release: str
    karpathy: bool
    halves: tuple[str, ...]

    def folders(self) -> list[str]:
        return [f"{half}{self.release}" for half in self.halves]

    def describe(self) -> str:
        folders = " and ".join(f"{f}/" for f in self.folders())
        if self.karpathy:
            return f"Karpathy's {KARPATHY_FILE} with the COCO {self.release} images {folders}"
        files = " and ".join(caption_file(f) for f in self.folders())
        return f"the official COCO {self.release} caption files {files} with {folders}"


def _present(data_dir: str, release: str, with_captions: bool) -> list[str]:
    names = []
    for half in ("train", "val"):
        folder = f"{half}{release}"
        candidates = (folder, caption_file(folder)) if with_captions else (folder,)
        names += [n for n in candidates if os.path.exists(os.path.join(data_dir, n))]
    return names


def find_layout(data_dir: str) -> Layout:
    """Finds which COCO layout `data_dir` holds (this module's docstring lists them).

    Raises:
      DatasetError: For a mix of releases, a missing half, or no layout, naming the files.
    """
    karpathy = os.path.exists(os.path.join(data_dir, KARPATHY_FILE))
    found = {r: _present(data_dir, r, with_captions=not karpathy) for r in RELEASES}
    if all(found.values()):
        listed = "; ".join(f"COCO {r}: {', '.join(found[r])}" for r in RELEASES)
        raise DatasetError(
            f"coco: {data_dir} mixes files of two releases ({listed}); the releases hold "
            "the same photos under other names: keep one release's files in the folder"
        )
    release = "2017" if found["2017"] else "2014"
    if karpathy:
        karpathy_path = os.path.join(data_dir, KARPATHY_FILE)
        absent = [f for f in (f"train{release}", f"val{release}") if f not in found[release]]
        if len(absent) == 2:
            raise DatasetError(
                f"coco: found {karpathy_path} but no image folder: expected train2014/ and "
                f"val2014/, or train2017/ and val2017/, in {data_dir}"
            )
        if absent:
            raise DatasetError(
                f"coco: {karpathy_path} takes images from both train{release}/ and "
                f"val{release}/, but {os.path.join(data_dir, absent[0])} does not exist"
            )
        return Layout(data_dir, release, True, ("train", "val"))
    halves = []
    for half in ("train", "val"):
        folder = f"{half}{release}"
        captions = caption_file(folder)
        have = [n for n in (folder, captions) if n in found[release]]
        if len(have) == 1:
            missing = captions if have == [folder] else folder
            raise DatasetError(
                f"coco: found {os.path.join(data_dir, have[0])} but not "
                f"{os.path.join(data_dir, missing)}, the other half of COCO {release} {half}"
            )
        if have:
            halves.append(half)
    if not halves:
        raise DatasetError(
            f"coco: {data_dir} holds no COCO layout: expected {KARPATHY_FILE} with train2014/ "
            "and val2014/ (or train2017/ and val2017/), or annotations/captions_train2014.json "
            "with train2014/ (or the 2017 names) and the val ones; see sat_tf/data/coco.py"
        )
    return Layout(data_dir, release, False, tuple(halves))


def _id_order(image_id: str):
    """Sort key: numeric ids (COCO's) in numeric order, then any others as strings."""
    return (0, int(image_id), "") if image_id.isdigit() else (1, 0, image_id)


def split_by_image_id(image_ids: Iterable[str]) -> dict[str, str]:
    """Splits images into val, test and train, by image id.

    In increasing id order the first `COCO_VAL_IMAGES` (5,000) images go to val, the next
    `COCO_TEST_IMAGES` (5,000) to test and the rest to train: with the 40,504 images of
    val2014 and train2014's 82,783 the sizes are those of Karpathy's split (113,287 /
    5,000 / 5,000), not its images. Fewer than 15,000 images give a third (rounded down)
    to each of val and test, so small sets still have all three splits.

    Args:
      image_ids: The image ids (repeats are ignored).

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


def caption_entries(path: str):
    """The entries of a COCO-format captions file ({"images": [{"id", "file_name"}],
    "annotations": [{"image_id", "caption"}]}), checked, in file order.

    Returns:
      (images, each (where, image id as a string, file name, the entry itself);
      annotations, each (where, image id, caption)).

    Raises:
      DatasetError: for a file that is not such JSON, an entry without its fields, or
        an annotation of an image id that "images" does not list.
    """
    data = read_json(path)
    images = require(data, "images", "the top-level object", path, list)
    annotations = require(data, "annotations", "the top-level object", path, list)
    listed = []
    for i, image in enumerate(images):
        where = f"images[{i}]"
        image_id = str(require(image, "id", where, path, (int, str)))
        listed.append((where, image_id, require(image, "file_name", where, path, str), image))
    ids = {image_id for _, image_id, _, _ in listed}
    captions = []
    for i, annotation in enumerate(annotations):
        where = f"annotations[{i}]"
        image_id = str(require(annotation, "image_id", where, path, (int, str)))
        caption = require(annotation, "caption", where, path, str)
        if image_id not in ids:
            raise DatasetError(
                f"{path}: {where} refers to image_id {image_id}, which 'images' does not list"
            )
        captions.append((where, image_id, caption))
    return listed, captions


def _collect(captions_json: str, image_dir: str, assign) -> Collector:
    """Parses an official COCO captions file into a `Collector`.

    `assign` maps the list of image ids (in the order of "images") to {image id: split}.
    """
    images, annotations = caption_entries(captions_json)
    split_of = assign([image_id for _, image_id, _, _ in images])
    collector = Collector(captions_json)
    paths = {}
    for where, image_id, file_name, _ in images:
        paths[image_id] = os.path.join(image_dir, file_name)
        collector.add(image_id, paths[image_id], split_of[image_id], [], where)
    for where, image_id, caption in annotations:
        collector.add(image_id, paths[image_id], split_of[image_id], [caption], where)
    return collector


def read_coco(
    captions_json: str,
    image_dir: str,
    *,
    split: str,
    on_missing: str = "error",
    max_captions: int = 5,
) -> list[Record]:
    """Reads one official COCO captions file (`captions_train2014.json`, ...).

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
    (split,) = check_options((split,), on_missing, max_captions)
    collector = _collect(captions_json, image_dir, lambda ids: dict.fromkeys(ids, split))
    return collector.records((split,), on_missing, max_captions, image_dir)


def read_coco_official(
    data_dir: str,
    *,
    release: str = "2014",
    halves: Sequence[str] = ("train", "val"),
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
    max_captions: int = 5,
) -> list[Record]:
    """Reads COCO from the official caption files, which have no test split.

    `data_dir/annotations/captions_train<release>.json` gives train, its images in
    `data_dir/train<release>/`; `captions_val<release>.json` (images in
    `val<release>/`) is split by `split_by_image_id`, and so is train when it is the only
    half. That is not Karpathy's split, so scores are not comparable with those of the
    paper (a warning says so).

    Args:
      data_dir: The COCO root folder.
      release: "2014" or "2017".
      halves: The official halves to read: ("train", "val"), ("train",) or ("val",).
      splits: Splits to return (subset of "train", "val", "test"); None for all.
      on_missing: "error" or "skip" for images absent on disk.
      max_captions: Keep at most this many captions per image (paper §5.1: 5).

    Returns:
      The records of train then val, each in the order of its "images"; image id is
      `str(id)`.

    Raises:
      DatasetError: On unreadable, non-UTF-8, malformed or inconsistent input, or on
        missing images with on_missing="error".
    """
    splits = check_options(splits, on_missing, max_captions)
    records, read = [], []
    for half in halves:
        folder = f"{half}{release}"
        if half == "train" and "val" in halves:
            if "train" not in splits:
                continue
            assign = lambda ids: dict.fromkeys(ids, "train")
        else:
            assign = split_by_image_id
        captions_json = os.path.join(data_dir, caption_file(folder))
        image_dir = os.path.join(data_dir, folder)
        collector = _collect(captions_json, image_dir, assign)
        records += collector.records(splits, on_missing, max_captions, image_dir)
        read.append(captions_json)
    counts = collections.Counter(r.image_id for r in records)
    twice = [image_id for image_id, n in counts.items() if n > 1]
    if twice:
        raise DatasetError(
            f"coco: image id(s) {preview(twice)} are listed in both {' and '.join(read)}"
        )
    return records


def _karpathy_locator(data_dir: str, release: str) -> Callable[[str], str] | None:
    """For 2017, maps a `cocoid` to its file in val2017/ if there, else in train2017/."""
    if release == "2014":
        return None
    val_dir, train_dir = (os.path.join(data_dir, f) for f in ("val2017", "train2017"))
    in_val = set(os.listdir(val_dir))

    def locate(image_id: str) -> str:
        if not image_id.isdigit():
            raise DatasetError(
                f"coco: {os.path.join(data_dir, KARPATHY_FILE)} gives image id {image_id!r}, "
                "which is not a COCO id (`cocoid`): the 2017 file names are made of it"
            )
        name = image_file_name("val2017", image_id)
        return os.path.join(val_dir if name in in_val else train_dir, name)

    return locate


def read_layout(
    data_dir: str, *, splits: Sequence[str] | None = None, on_missing: str = "error"
) -> list[Record]:
    """Reads the COCO layout `find_layout` finds in `data_dir`, and logs one line saying
    which it is (a warning for the official files, whose split is not Karpathy's).

    Raises:
      DatasetError: As `find_layout`, or on bad input.
    """
    layout = find_layout(data_dir)
    if layout.karpathy:
        records = read_karpathy(
            os.path.join(data_dir, KARPATHY_FILE),
            data_dir,
            splits=splits,
            on_missing=on_missing,
            locate=_karpathy_locator(data_dir, layout.release),
        )
        logging.info("coco: reading %s in %s", layout.describe(), data_dir)
        return records
    records = read_coco_official(
        data_dir,
        release=layout.release,
        halves=layout.halves,
        splits=splits,
        on_missing=on_missing,
    )
    divided = f"val{layout.release}" if "val" in layout.halves else f"train{layout.release}"
    rest = f"; train{layout.release} -> train" if len(layout.halves) == 2 else ""
    logging.warning(
        "coco: reading %s in %s (no Karpathy %s). Splits: %s by image id: the first %d -> "
        "val, the next %d -> test, the rest -> train (a third each to val and test under "
        "%d images)%s. These are the sizes of Karpathy's split, not its images: scores are "
        "not comparable with results on Karpathy's test split. Images per split: %s",
        layout.describe(),
        data_dir,
        KARPATHY_FILE,
        divided,
        COCO_VAL_IMAGES,
        COCO_TEST_IMAGES,
        3 * max(COCO_VAL_IMAGES, COCO_TEST_IMAGES),
        rest,
        split_counts(records),
    )
    return records
