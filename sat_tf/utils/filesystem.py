"""One filesystem layer for the files the feature cache and the Beam pipelines read and
write: a local path goes through `os`, any other (`s3://`, `gs://`, `hdfs://`) through
Apache Beam's `FileSystems` (the package's `beam` extra; `gs://` also Beam's `gcp`).

A file elsewhere is written whole: from a local temporary file, uploaded when it is
complete (`atomic_path`), so a reader never sees half of one (an object store shows an
object only when its upload ends), as a local file is renamed into place. What
TensorFlow must read as a file (a TFRecord shard) is read from a local copy
(`local_file`, `mirror`). `FileSystems` reads its settings (an S3 endpoint and keys, an
HDFS host) from Beam's pipeline options: a command takes Beam's `--s3_*` and `--hdfs_*`
flags apart from its own (`split_options`) and sets them (`set_options`).
"""

import contextlib
import os
import re
import shutil
import tempfile

from sat_tf.utils import files

_SCHEME = re.compile(r"^([a-zA-Z][-a-zA-Z0-9+.]*)://")
# Beam's options of the filesystems a command reaches without a pipeline.
OPTION_PREFIXES = ("--s3_", "--hdfs_")
# What each filesystem needs installed beyond Beam: {scheme: (a module, the extra)}.
_NEEDS = {"s3": ("boto3", "beam"), "gs": ("google.cloud.storage", "gcp")}


def scheme(path: str) -> str | None:
    """The scheme of a path (`s3`, `gs`, ...), None for a local one (file:// included)."""
    found = _SCHEME.match(path)
    return None if found is None or found[1].lower() == "file" else found[1].lower()


def is_remote(path: str) -> bool:
    return scheme(path) is not None


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def beam_filesystems(path: str):
    """Beam's `FileSystems` for a path elsewhere, once what its scheme needs is checked.

    Raises:
      ValueError: naming the path and the extra to install, when Beam (or the scheme's
        client library) is missing.
    """
    kind = scheme(path)
    module, extra = _NEEDS.get(kind, ("apache_beam", "beam"))
    try:
        from apache_beam.io.filesystems import FileSystems

        __import__(module)
    except ImportError:
        raise ValueError(
            f"{path}: reading and writing {kind}:// needs Apache Beam's filesystems and "
            f"{module}: pip install 'sat_tf[{extra}]'"
        ) from None
    return FileSystems


def split_options(argv):
    """(argv without Beam's filesystem options, those options): the arguments that
    begin with `OPTION_PREFIXES`, with a value that follows as the next argument."""
    kept, options = [], []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith(OPTION_PREFIXES):
            kept.append(arg)
            continue
        options.append(arg)
        if "=" not in arg and args and not args[0].startswith("-"):
            options.append(args.pop(0))
    return kept, options


def set_options(options) -> None:
    """Gives Beam's `FileSystems` these pipeline options (a list of arguments such as
    `--s3_endpoint_url=...`, or `PipelineOptions`); nothing for none."""
    if not options:
        return
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    if isinstance(options, list | tuple):
        options = PipelineOptions(list(options))
    FileSystems.set_options(options)


def join(folder: str, name: str) -> str:
    if is_remote(folder):
        return folder.rstrip("/") + "/" + name
    return os.path.join(folder, name)


def exists(path: str) -> bool:
    if is_remote(path):
        return beam_filesystems(path).exists(path)
    return os.path.exists(_local(path))


def size(path: str) -> int:
    """The size of a file in bytes, from the filesystem's metadata (never its bytes).

    Raises:
      FileNotFoundError: naming the path when there is no such file.
    """
    if not is_remote(path):
        return os.path.getsize(_local(path))
    found = beam_filesystems(path).match([path])[0].metadata_list
    if not found:
        raise FileNotFoundError(f"{path} does not exist")
    return found[0].size_in_bytes


def _stream(path: str, write=False):
    """A file elsewhere opened through `FileSystems`, its bytes as they are (a `.gz`
    name is not decompressed)."""
    from apache_beam.io.filesystem import CompressionTypes

    FileSystems = beam_filesystems(path)
    how = FileSystems.create if write else FileSystems.open
    return how(path, compression_type=CompressionTypes.UNCOMPRESSED)


def read_bytes(path: str) -> bytes:
    if not is_remote(path):
        with open(_local(path), "rb") as f:
            return f.read()
    with _stream(path) as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> None:
    """Writes a whole file (`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def files_in(folder: str) -> dict[str, int]:
    """{name: size} of the files directly in `folder` (none when it does not exist)."""
    if not is_remote(folder):
        folder = _local(folder)
        if not os.path.isdir(folder):
            return {}
        paths = (os.path.join(folder, n) for n in os.listdir(folder))
        return {os.path.basename(p): os.path.getsize(p) for p in paths if os.path.isfile(p)}
    prefix = folder.rstrip("/") + "/"
    found = beam_filesystems(folder).match([prefix + "*"])[0].metadata_list
    names = {m.path[len(prefix) :]: m.size_in_bytes for m in found}
    return {n: s for n, s in names.items() if n and "/" not in n}


def delete(path: str) -> None:
    if is_remote(path):
        beam_filesystems(path).delete([path])
    else:
        os.remove(_local(path))


def make_folder(folder: str) -> None:
    """Makes a local folder (and its parents); a folder elsewhere needs none."""
    if not is_remote(folder):
        os.makedirs(_local(folder), exist_ok=True)


@contextlib.contextmanager
def atomic_path(path: str):
    """Yields a local path to write the file `path` into; when the block ends without an
    error the file is renamed into place (`files.atomic_path`) or, elsewhere, uploaded
    whole; the temporary file is removed in any case."""
    if not is_remote(path):
        with files.atomic_path(_local(path)) as tmp:
            yield tmp
        return
    beam_filesystems(path)
    handle, tmp = tempfile.mkstemp(prefix="sat_upload_", suffix=os.path.basename(path))
    os.close(handle)
    try:
        yield tmp
        with open(tmp, "rb") as source, _stream(path, write=True) as sink:
            shutil.copyfileobj(source, sink, 1 << 20)
    finally:
        os.remove(tmp)


@contextlib.contextmanager
def local_file(path: str):
    """Yields a local path holding the file `path`: itself, or a temporary copy removed
    when the block ends."""
    if not is_remote(path):
        yield _local(path)
        return
    handle, tmp = tempfile.mkstemp(prefix="sat_download_", suffix=os.path.basename(path))
    try:
        with os.fdopen(handle, "wb") as sink, _stream(path) as source:
            shutil.copyfileobj(source, sink, 1 << 20)
        yield tmp
    finally:
        os.remove(tmp)


def mirror(folder: str, local: str, names) -> int:
    """Copies the files `names` of `folder` into the local folder `local`, but those
    already there with the same size; returns how many were copied."""
    os.makedirs(local, exist_ok=True)
    sizes = files_in(folder)
    copied = 0
    for name in names:
        target = os.path.join(local, name)
        if os.path.exists(target) and os.path.getsize(target) == sizes.get(name):
            continue
        with files.atomic_path(target) as tmp, open(tmp, "wb") as sink:
            with _stream(join(folder, name)) as source:
                shutil.copyfileobj(source, sink, 1 << 20)
        copied += 1
    return copied
