"""Writing files so that a kill never leaves a half-written one under the final name:
every writer goes through `atomic_path` (a temporary name beside the target, renamed
over it once complete), every folder written as a whole through `staged_dir`."""

import contextlib
import hashlib
import json
import os
import shutil
import tempfile

# The environment variable naming the folder of downloads and ported weights.
CACHE_ENV = "SAT_TF_CACHE"


def cache_dir() -> str:
    """Where downloads and ported weights are kept: `$SAT_TF_CACHE`, else `~/.cache/sat_tf`."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "sat_tf")


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path in the target's folder; renames it to `path` when the
    block ends without an error and removes it otherwise. The temporary name keeps the
    file's extension (`.tmp<pid>-<name>`), for writers that choose a format by it."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".tmp{os.getpid()}-{name}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def is_temporary(name):
    """Whether a file name is one of `atomic_path`'s temporary names."""
    return name.startswith(".tmp")


def sha256_of(path) -> str:
    """The sha256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_bytes(path, data: bytes):
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def write_text(path, text: str):
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path, value, **dump_args):
    """`json.dump(value)` atomically; `dump_args` as for `json.dumps`."""
    write_text(path, json.dumps(value, **dump_args))


def replace_dir(tmp, output):
    """Moves the finished folder `tmp` to `output`, replacing an earlier folder there.

    A replaced folder is moved aside first, so `output` is briefly absent; a reader
    such as a model server is better given a new folder than an overwritten one.
    """
    if not os.path.exists(output):
        os.replace(tmp, output)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.old", dir=os.path.dirname(output))
    os.replace(output, old)
    os.replace(tmp, output)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(output):
    """Yields a new empty folder beside `output` to write a whole folder into.

    When the block ends without an error the folder replaces `output` (`replace_dir`),
    so a reader never sees a partial one; on an error (or a KeyboardInterrupt) it is
    removed and `output` is left as it was. The folder is readable by all (0o755), as
    a folder made by `os.makedirs` would be.
    """
    output = os.path.abspath(output)
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.tmp", dir=parent)
    try:
        os.chmod(tmp, 0o755)
        yield tmp
        replace_dir(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def undone_on_failure(folder):
    """Removes what the block added to `folder` (and `folder` itself, if the block made
    it and left it empty) when the block raises: a command refused half-way leaves the
    folder as it found it. Files that were there before are left as they are."""
    existed = os.path.isdir(folder)
    before = set(os.listdir(folder)) if existed else set()
    try:
        yield
    except BaseException:
        if os.path.isdir(folder):
            for name in set(os.listdir(folder)) - before:
                path = os.path.join(folder, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.remove(path)
            if not existed and not os.listdir(folder):
                os.rmdir(folder)
        raise
