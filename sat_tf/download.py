"""Downloading a folder packed as a .tar.gz archive over HTTPS into a cache, once.

`keras.utils.get_file` fetches the archive (trusting the system's certificate
authorities, or `$SSL_CERT_FILE`), checks it against the URL's `#sha256=<hex>` fragment
when there is one, and unpacks it, refusing members that would land outside its folder.
It unpacks into its own cache on every call, over the files of the last call; so here
it runs in a scratch folder, and the unpacked files, once checked, enter the cache in
one rename (`files.staged_dir`): a reader never sees a partial folder, a failed
download leaves nothing behind, and the next call tries again.
"""

import contextlib
import hashlib
import os
import re
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import zlib

import keras
from absl import logging

from sat_tf import files

CACHE_ENV = "SAT_TF_CACHE"
RECORD_FILE = "download.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def default_cache_dir() -> str:
    """Where downloads are kept: `$SAT_TF_CACHE`, else `~/.cache/sat_tf`."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "sat_tf")


def _expected_sha256(url, fragment):
    if not fragment:
        return None
    key, _, value = fragment.partition("=")
    if key != "sha256" or not _SHA256.match(value.lower()):
        raise ValueError(f"the fragment #{fragment} of {url} is not sha256=<64 hex digits>")
    return value.lower()


def _reason(error: Exception) -> str:
    """Why a fetch failed: get_file raises a bare Exception from urllib's error."""
    cause = error.__context__
    if isinstance(cause, urllib.error.HTTPError):
        return f"HTTP {cause.code} {cause.reason}"
    if isinstance(cause, urllib.error.URLError):
        return str(cause.reason)
    return f"{type(error).__name__}: {error}"


def _fetch(address: str, expected: str | None, scratch: str, marker: str) -> tuple[str, str]:
    """Downloads and unpacks an archive into `scratch` with `keras.utils.get_file`.

    Returns:
      (the archive's path, the unpacked folder that holds `marker`: the archive's top,
      or its one folder).
    """
    archive = os.path.join(scratch, "archive.tar.gz")
    not_archive = f"the archive from {address} is truncated or not a .tar.gz archive"
    logging.info("downloading %s", address)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its progress bar; stdout is output
            folder = keras.utils.get_file(
                os.path.basename(archive),
                address,
                file_hash=expected,
                hash_algorithm="sha256",
                cache_dir=scratch,
                cache_subdir=".",
                extract=True,
                archive_format="tar",
            )
    except ValueError as e:  # get_file's error for a hash that differs
        if expected is None or not os.path.isfile(archive):
            raise
        raise ValueError(
            f"the archive downloaded from {address} has sha256 {files.sha256_of(archive)}, "
            f"the URL's #sha256= says {expected}: it is damaged or another file"
        ) from e
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise ValueError(f"{not_archive}: {e}") from e
    except Exception as e:
        raise ValueError(f"cannot download {address}: {_reason(e)}") from e
    if not os.path.isdir(folder):  # get_file only warns when the file is no archive
        raise ValueError(not_archive)
    entries = os.listdir(folder)
    if len(entries) == 1 and os.path.isdir(os.path.join(folder, entries[0])):
        folder = os.path.join(folder, entries[0])
    if not os.path.isfile(os.path.join(folder, marker)):
        raise ValueError(f"the archive from {address} holds no {marker}")
    return archive, folder


def cached_folder(url: str, cache_dir: str, marker: str, check=None) -> str:
    """The cache's folder of an archive's files, downloaded if it is not there yet.

    Args:
      url: `https://...` of a .tar.gz archive, optionally ending in `#sha256=<hex>`.
      cache_dir: the folder of cached downloads.
      marker: a file the archive must hold (at its top or in its one folder).
      check: `check(folder, url)` raises ValueError for unpacked files that may not
        enter the cache.

    Returns:
      the folder; it also holds `download.json` (the URL, the archive's size and sha256).

    Raises:
      ValueError: for another scheme than https, a bad fragment, a failed, truncated or
        corrupt download, or files that `check` refuses.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        raise ValueError(f"{url} is not https://; downloads go over HTTPS only")
    expected = _expected_sha256(url, parts.fragment)
    address = urllib.parse.urlunsplit(parts._replace(fragment=""))
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", os.path.basename(parts.path).split(".")[0]) or "archive"
    key = hashlib.sha256(f"{address}#{expected or ''}".encode()).hexdigest()[:16]
    target = os.path.join(cache_dir, f"{stem}-{key}")
    if os.path.isdir(target):
        return target
    os.makedirs(cache_dir, exist_ok=True)
    scratch_dir = tempfile.TemporaryDirectory(prefix=".download", dir=cache_dir)
    with files.staged_dir(target) as staged, scratch_dir as scratch:
        archive, unpacked = _fetch(address, expected, scratch, marker)
        for name in os.listdir(unpacked):
            os.replace(os.path.join(unpacked, name), os.path.join(staged, name))
        if check is not None:
            check(staged, address)
        record = {
            "url": address,
            "bytes": os.path.getsize(archive),
            "sha256": files.sha256_of(archive),
        }
        files.write_json(os.path.join(staged, RECORD_FILE), record, indent=2)
    return target
