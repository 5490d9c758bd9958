"""The records of a dataset whose folder is elsewhere (`--data_dir=s3://...`, `gs://`,
`hdfs://`), read by the package's own dataset readers.

The readers read a local folder: its caption files, and which image files exist. So the
folder's listing (Beam's `FileSystems.match`, metadata only) is laid out in a local
temporary folder, the shadow: each caption file (any file that is not an image by its
extension) copied, each image an empty stand-in, never downloaded. The readers read the
shadow as they read any copy of the dataset; each record's image path is then turned
back into the path elsewhere, which the pipeline's workers read. The image ids and the
records' fingerprint (file names) are those of a local copy of the same folder, so the
cache is the one `sat-extract-features` writes from it. The shadow is removed at the end.
"""

import dataclasses
import os
import shutil
import tempfile

from sat_tf.data.folder import IMAGE_EXTENSIONS
from sat_tf.training import extract
from sat_tf.utils import filesystem

# The datasets whose files are not all in the folder: generated here, or TFDS's.
LOCAL_ONLY = ("shapes", "coco_captions_tfds")


def _shadow(data_dir, folder) -> int:
    """Lays `data_dir`'s listing out in the local `folder` (caption files copied, images
    as empty stand-ins); returns the number of images."""
    FileSystems = filesystem.beam_filesystems(data_dir)
    root = data_dir.rstrip("/") + "/"
    found = FileSystems.match([root + "**"])[0].metadata_list
    if not found:
        raise ValueError(f"--data_dir={data_dir}: no file found under it")
    images = 0
    for metadata in found:
        relative = metadata.path[len(root) :]
        local = os.path.normpath(os.path.join(folder, *relative.split("/")))
        if not relative or not local.startswith(os.path.join(folder, "")):
            continue  # the folder's own marker, or a name that leads outside it
        os.makedirs(os.path.dirname(local), exist_ok=True)
        if relative.lower().endswith(IMAGE_EXTENSIONS):
            open(local, "wb").close()
            images += 1
        else:
            with open(local, "wb") as sink:
                sink.write(filesystem.read_bytes(metadata.path))
    return images


def records_of(config) -> list:
    """`extract.records_of(config)` for a `config.data_dir` elsewhere: the records in
    extraction order, their image paths in `config.data_dir`.

    Raises:
      ValueError: for a dataset that cannot be read from elsewhere (`LOCAL_ONLY`), an
        empty folder, or as the dataset's reader.
    """
    if config.dataset in LOCAL_ONLY:
        raise ValueError(
            f"--dataset={config.dataset} is read from a local --data_dir only, not "
            f"{config.data_dir}"
        )
    root = config.data_dir.rstrip("/")
    folder = tempfile.mkdtemp(prefix="sat_dataset_listing_")
    try:
        _shadow(config.data_dir, folder)
        records = extract.records_of(dataclasses.replace(config, data_dir=folder))
    except ValueError as e:  # the reader names the shadow's files: name the folder's
        raise ValueError(str(e).replace(folder, root)) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return [
        dataclasses.replace(r, image_path=_elsewhere(r.image_path, folder, root)) for r in records
    ]


def _elsewhere(path, folder, root) -> str:
    relative = os.path.relpath(path, folder).replace(os.sep, "/")
    return f"{root}/{relative}"
