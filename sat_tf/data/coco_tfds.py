"""TFDS `coco_captions` (Karpathy's split of COCO 2014) read into `Record`s.

TFDS stores image bytes, not paths: the first read of a split writes each image's JPEG
bytes unchanged to `<data_dir>/coco_captions_images/<id>.jpg` with an index per split.
"""

from __future__ import annotations

import json
import os

from absl import logging

from sat_tf.data.records import (
    KARPATHY_SPLITS,
    Collector,
    DatasetError,
    Record,
    check_options,
    read_json,
)
from sat_tf.utils import files

TFDS_SPLITS = ("train", "val", "test", "restval")
TFDS_IMAGE_DIR = "coco_captions_images"


def _tfds_index(index_path: str, image_dir: str) -> list[dict] | None:
    """Returns the cached index of a TFDS split if it and all its images are present."""
    if not os.path.exists(index_path):
        return None
    try:
        entries = read_json(index_path)["images"]
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
    check_options(None, "error", max_captions)
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
            root = data_dir or builder.data_dir_root
            raise DatasetError(
                f"{source}: no prepared data in {builder.data_dir}: run `tfds build "
                f"coco_captions --data_dir={root}` once (it downloads COCO 2014, about 38 GB), "
                "or read COCO's own files with --dataset=coco"
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
    collector = Collector(source)
    record_split = KARPATHY_SPLITS[split]
    for i, entry in enumerate(entries):
        path = os.path.join(image_dir, entry["filename"])
        collector.add(entry["image_id"], path, record_split, entry["captions"], f"example {i}")
    return collector.records((record_split,), "error", max_captions, image_dir)
