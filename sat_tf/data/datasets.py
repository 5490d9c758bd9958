"""Caption datasets by name: `load_records(dataset, data_dir)` finds a dataset's files in
the layout it comes in and returns one `Record` per image.

Every reader returns a list of `Record`s: one per image, its captions as raw strings
(stripped of surrounding whitespace; tokenization happens in `vocab.py`), at most
`max_captions` of them (5, as in the paper §5.1: "each image has 5 reference sentences"),
in a deterministic order (the order of the source file). Splits are Karpathy's: `train`,
`val`, `test`; `restval` is folded into `train`. The exception is COCO read from the
official caption files, which have no test split (see `sat_tf/data/coco.py`).

Expected directory layouts:

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
                        Without the Karpathy JSON, the token file of flickr30k.tar.gz
                        and the split files of Flickr30k Entities are read instead:
                        <data_dir>/results_20130124.token
                        <data_dir>/{train,val,test}.txt     (image ids, one a line)
    coco                <data_dir>/dataset_coco.json
                        <data_dir>/train2014/COCO_train2014_<id>.jpg
                        <data_dir>/val2014/COCO_val2014_<id>.jpg
                        or the 2017 folders <data_dir>/{train,val}2017/<id>.jpg; without
                        the Karpathy JSON, the official caption files of either release:
                        <data_dir>/annotations/captions_{train,val}2014.json (or 2017)
                        (`sat_tf/data/coco.py` says how they are found and split)
    coco_captions_tfds  <data_dir>/coco_captions/2014/<version>/  (prepared by `tfds build`)
                        <data_dir>/coco_captions_images/<id>.jpg  (written on first read)
                        <data_dir>/coco_captions_images/<split>_index.json
    folder              one captions file with one's own images, in any subfolders:
                        <data_dir>/metadata.jsonl or metadata.csv  (Hugging Face
                        imagefolder), or one in each of train/, validation/, test/
                        <data_dir>/captions.txt with Images/  (Kaggle's Flickr8k),
                        results.csv with flickr30k_images/, or another *.csv or *.tsv
                        <data_dir>/annotations/<name>.json  (COCO-format captions, or
                        at the top), the images in any subfolder
                        or the file `captions` names; split by a `split` column, the
                        train/val/test folders or a hash of the image's path (80/10/10)
                        as `sat_tf/data/folder.py` says

The Flickr image folder may also be named `Flickr8k_Dataset/` or `Images/` (Flickr8k),
`flickr30k_images/` or `Images/` (Flickr30k), as other mirrors unpack them; the first
folder that exists is used. The bad-input policy, the same for every reader, is in
`sat_tf/data/records.py`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from sat_tf.config import DATASETS
from sat_tf.data import coco, flickr, folder
from sat_tf.data.coco import (
    COCO_TEST_IMAGES,
    COCO_VAL_IMAGES,
    read_coco,
    read_coco_official,
    split_by_image_id,
)
from sat_tf.data.coco_tfds import TFDS_IMAGE_DIR, TFDS_SPLITS, read_tfds
from sat_tf.data.flickr import (
    FLICKR8K_SPLIT_FILES,
    FLICKR8K_TOKEN_FILE,
    FLICKR30K_SPLIT_FILES,
    FLICKR30K_TOKEN_FILE,
    read_flickr8k,
    read_token_file,
)
from sat_tf.data.folder import read_folder
from sat_tf.data.records import (
    SPLITS,
    DatasetError,
    Record,
    check_options,
    read_karpathy,
    split_counts,
)

# The readers' public names, importable from here as before they had modules of their own.
__all__ = [
    "COCO_TEST_IMAGES",
    "COCO_VAL_IMAGES",
    "FLICKR30K_SPLIT_FILES",
    "FLICKR30K_TOKEN_FILE",
    "FLICKR8K_SPLIT_FILES",
    "FLICKR8K_TOKEN_FILE",
    "SPLITS",
    "TFDS_IMAGE_DIR",
    "TFDS_SPLITS",
    "DatasetError",
    "Record",
    "load_records",
    "read_coco",
    "read_coco_official",
    "read_flickr8k",
    "read_folder",
    "read_karpathy",
    "read_tfds",
    "read_token_file",
    "split_by_image_id",
    "split_counts",
]


def load_records(
    dataset: str,
    data_dir: str,
    *,
    captions: str = "",
    splits: Sequence[str] | None = None,
    on_missing: str = "error",
) -> list[Record]:
    """Reads a dataset by name from the layout documented at the top of this module.

    Args:
      dataset: One of "shapes", "flickr8k", "flickr30k", "coco", "coco_captions_tfds",
        "folder".
      data_dir: The dataset's root folder (for "coco_captions_tfds", the TFDS data dir).
      captions: For "folder", its captions file (relative to `data_dir` or absolute);
        "" to find it by the conventions of `sat_tf/data/folder.py`. Other datasets
        take "" only.
      splits: Splits to return (subset of "train", "val", "test"); None for all.
      on_missing: "error" or "skip" for images absent on disk (not used by the TFDS
        reader, which writes its images itself).

    Returns:
      The records, at most 5 captions per image.

    Raises:
      ValueError: For an unknown dataset name, or `captions` with another dataset than
        "folder".
      DatasetError: If the expected files are absent or hold bad input.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {list(DATASETS)}")
    if captions and dataset != "folder":
        raise ValueError(
            f"captions={captions!r} is read for dataset 'folder' only, not {dataset!r}"
        )
    splits = check_options(splits, on_missing, 5)
    if dataset == "folder":
        return folder.read_folder(data_dir, captions=captions, splits=splits, on_missing=on_missing)
    if dataset == "coco_captions_tfds":
        records = []
        for split in splits:
            for tfds_split in ("train", "restval") if split == "train" else (split,):
                records += read_tfds(tfds_split, data_dir=data_dir)
        return records
    if dataset == "coco":
        return coco.read_layout(data_dir, splits=splits, on_missing=on_missing)
    json_path = os.path.join(data_dir, f"dataset_{dataset}.json")
    if dataset in flickr.IMAGE_DIRS:
        if not os.path.exists(json_path):
            return flickr.read_raw(dataset, data_dir, splits=splits, on_missing=on_missing)
        image_dir = flickr.image_folder(data_dir, dataset)
    elif not os.path.exists(json_path):
        raise DatasetError(
            f"{dataset}: {json_path} not found (generate it with sat_tf/data/shapes.py)"
        )
    else:
        image_dir = data_dir
    return read_karpathy(json_path, image_dir, splits=splits, on_missing=on_missing)
