"""Fixture writers shared by the dataset and end-to-end tests: official COCO caption files
and TFDS `coco_captions` served through `tfds.testing.mock_data`."""

import functools
import io
import json
import os

import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image


def coco_file_name(folder: str, image_id: int) -> str:
    """The official image file name, e.g. `COCO_val2014_000000000042.jpg`."""
    return f"COCO_{folder}_{image_id:012d}.jpg"


def write_coco_captions(root: str, folder: str, captions, jpegs) -> str:
    """Writes `root/annotations/captions_<folder>.json` in the official COCO format and
    its images `root/<folder>/COCO_<folder>_<id>.jpg`.

    Args:
      root: The COCO root folder.
      folder: "train2014" or "val2014".
      captions: {image id (int): [caption, ...]}, in file order; "annotations" lists the
        captions of all images interleaved (first captions first), as the real files mix
        images.
      jpegs: {image id: JPEG bytes}; an image without an entry is listed but not written.

    Returns:
      The path of the JSON file.
    """
    image_dir = os.path.join(root, folder)
    os.makedirs(image_dir, exist_ok=True)
    images = []
    for image_id in captions:
        file_name = coco_file_name(folder, image_id)
        width, height = 640, 480
        if image_id in jpegs:
            with open(os.path.join(image_dir, file_name), "wb") as f:
                f.write(jpegs[image_id])
            width, height = Image.open(io.BytesIO(jpegs[image_id])).size
        images.append(
            {
                "license": 1,
                "file_name": file_name,
                "coco_url": f"http://images.cocodataset.org/{folder}/{file_name}",
                "height": height,
                "width": width,
                "date_captured": "2013-11-14 11:18:45",
                "id": image_id,
            }
        )
    annotations = []
    for k in range(max((len(c) for c in captions.values()), default=0)):
        for image_id, texts in captions.items():
            if k < len(texts):
                annotations.append(
                    {"image_id": image_id, "id": 1000 + len(annotations), "caption": texts[k]}
                )
    data = {
        "info": {"description": "COCO 2014 Dataset", "year": 2014},
        "licenses": [{"id": 1, "name": "Attribution License", "url": ""}],
        "images": images,
        "annotations": annotations,
    }
    path = os.path.join(root, "annotations", f"captions_{folder}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def mock_coco_captions(examples, calls=None):
    """`tfds.testing.mock_data` serving known examples of TFDS `coco_captions`.

    The default random generator of `mock_data` cannot build `coco_captions`: it draws an
    independent length for each field of the `captions` Sequence (text and id), which
    `Sequence.encode_example` rejects. So the fake `_as_dataset` below encodes known
    examples with the builder's own features and decodes them with the caller's decoders,
    the path real TFRecords take.

    Args:
      examples: {TFDS split: [(image id, JPEG bytes, [caption, ...]), ...]}.
      calls: If a list, each split that is read is appended to it.

    Returns:
      The `mock_data` context manager.
    """

    def as_dataset(builder, split, decoders=None, read_config=None, shuffle_files=False):
        if calls is not None:
            calls.append(str(split))
        features = builder.info.features
        parts = []
        for image_id, jpeg, captions in examples[str(split)]:
            example = {
                "image": jpeg,
                "image/filename": coco_file_name("val2014", image_id),
                "image/id": image_id,
                "objects": [],
                "captions": [{"text": t, "id": 100 * image_id + k} for k, t in enumerate(captions)],
            }
            encoded = tf.nest.map_structure(tf.constant, features.encode_example(example))
            parts.append(tf.data.Dataset.from_tensors(encoded))
        ds = functools.reduce(tf.data.Dataset.concatenate, parts)
        return ds.map(functools.partial(features.decode_example, decoders=decoders))

    return tfds.testing.mock_data(as_dataset_fn=as_dataset)
