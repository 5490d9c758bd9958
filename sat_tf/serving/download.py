"""Downloading a folder packed as a .tar.gz archive over HTTPS into a cache, once.

The archive is streamed to a scratch folder with a timeout on every read (a server that
stops sending is given up on, not waited for), trusting the system's certificate
authorities or `$SSL_CERT_FILE`; it is checked against the URL's `#sha256=<hex>`
fragment when there is one and against its declared length, and unpacked only if every
member is a plain file or folder inside it that the archive's first file (the marker, a
preset's metadata.json) lists, and their sizes add up to at most `UNPACKED_FACTOR` times
what it lists: files nobody asked for are refused, and a small archive cannot fill the
disk. A URL without `#sha256=` is downloaded with a warning saying what was not checked.
The unpacked files, once checked, enter the cache in one rename (`files.staged_dir`): a
reader never sees a partial folder, a failed download leaves nothing behind, and the next
call tries again.
"""

import hashlib
import http.client
import json
import os
import posixpath
import re
import ssl
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib

from absl import logging

from sat_tf.utils import files

CACHE_ENV = files.CACHE_ENV
RECORD_FILE = "download.json"
# Seconds a connection or a single read may wait for the server before the download is
# given up (not the whole transfer's limit).
TIMEOUT_SECONDS = 60.0
_CHUNK_BYTES = 1 << 20
# An archive unpacks to at most this many times the bytes its marker lists (plus the
# marker): what is listed must match exactly anyway (`check`), the margin only keeps the
# message about a wrong size the checker's, while a gzip bomb stops at the first header.
UNPACKED_FACTOR = 4
MAX_MARKER_BYTES = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


# Where downloads are kept (in `presets/`): `$SAT_TF_CACHE`, else `~/.cache/sat_tf`.
default_cache_dir = files.cache_dir


def _expected_sha256(url, fragment):
    if not fragment:
        return None
    key, _, value = fragment.partition("=")
    if key != "sha256" or not _SHA256.match(value.lower()):
        raise ValueError(f"the fragment #{fragment} of {url} is not sha256=<64 hex digits>")
    return value.lower()


def _stream(address: str, archive: str, timeout: float) -> tuple[int, str]:
    """Writes the body at `address` to `archive`.

    Returns:
      (its size in bytes, its sha256).
    """
    request = urllib.request.Request(address, headers={"User-Agent": "sat_tf"})
    digest, size = hashlib.sha256(), 0
    with (
        urllib.request.urlopen(
            request, timeout=timeout, context=ssl.create_default_context()
        ) as response,
        open(archive, "wb") as out,
    ):
        declared = response.headers.get("Content-Length")
        while chunk := response.read(_CHUNK_BYTES):
            out.write(chunk)
            digest.update(chunk)
            size += len(chunk)
    if declared is not None and declared.isdigit() and size < int(declared):
        raise ConnectionError(f"retrieval incomplete: got only {size} out of {declared} bytes")
    return size, digest.hexdigest()


def _download(address: str, archive: str, expected: str | None, timeout: float):
    """Downloads `address` to `archive` and checks its sha256.

    Returns:
      (its size in bytes, its sha256).
    """
    logging.info("downloading %s", address)
    try:
        size, sha256 = _stream(address, archive, timeout)
    except urllib.error.HTTPError as e:
        raise ValueError(f"cannot download {address}: HTTP {e.code} {e.reason}") from e
    except (TimeoutError, urllib.error.URLError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError):
            reason = f"the server sent nothing for {timeout:g} s (timed out)"
        raise ValueError(f"cannot download {address}: {reason}") from e
    except (OSError, http.client.HTTPException) as e:
        raise ValueError(f"cannot download {address}: {e}") from e
    if expected is not None and sha256 != expected:
        raise ValueError(
            f"the archive downloaded from {address} has sha256 {sha256}, "
            f"the URL's #sha256= says {expected}: it is damaged or another file"
        )
    logging.info("downloaded %s bytes from %s", f"{size:,}", address)
    return size, sha256


def listed_files(marker: bytes, where: str) -> dict[str, int]:
    """The files a marker lists, {name: bytes}: its JSON `files` map (a preset's
    metadata.json: {name: {"bytes": ..., "sha256": ...}}).

    Raises:
      ValueError: when the marker is not such JSON.
    """
    try:
        listed = json.loads(marker.decode("utf-8"))["files"]
        sizes = {name: entry["bytes"] for name, entry in listed.items()}
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: its first file does not list the files ({e})") from None
    bad = [n for n, size in sizes.items() if not isinstance(size, int) or size < 0]
    if bad or any(n != posixpath.basename(n) or n in ("", ".", "..") for n in sizes):
        raise ValueError(f"{where}: its first file lists {sorted(sizes)!r}, not file sizes")
    return sizes


def _unpack(archive: str, folder: str, address: str, marker: str) -> None:
    """Unpacks `archive` into `folder`, refusing members other than files and folders,
    names that would land outside it, files that `marker` (the first file, at the top or
    in the one folder) does not list, and more bytes than `UNPACKED_FACTOR` times what
    it lists. Headers are read one by one, so a refusal comes before the data that
    follows is decompressed."""
    where = f"the archive from {address}"
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members, allowed, limit, total = [], None, 0, 0
            while (member := tar.next()) is not None:
                name = posixpath.normpath(member.name)
                if name.startswith(("/", "../")) or name == "..":
                    raise ValueError(
                        f"{where} holds {member.name!r}, which would land outside its folder"
                    )
                if not (member.isfile() or member.isdir()) or member.issparse():
                    raise ValueError(
                        f"{where} holds {member.name!r}, which is neither a file nor a folder"
                    )
                if allowed is None and member.isfile():
                    if posixpath.basename(name) != marker or name.count("/") > 1:
                        raise ValueError(
                            f"{where} does not begin with {marker}: {member.name!r} comes first"
                        )
                    if member.size > MAX_MARKER_BYTES:
                        raise ValueError(f"{where}: its {marker} has {member.size:,} bytes")
                    listed = listed_files(tar.extractfile(member).read(), where)
                    top = posixpath.dirname(name)
                    allowed = {posixpath.join(top, n) for n in listed} | {name}
                    limit = member.size + UNPACKED_FACTOR * sum(listed.values())
                elif allowed is not None and name not in allowed and name != top:
                    raise ValueError(
                        f"{where} holds {member.name!r}, which its {marker} does not list: "
                        "refused, nothing unpacked"
                    )
                total += member.size
                if allowed is not None and total > limit:
                    raise ValueError(
                        f"{where} unpacks to over {limit:,} bytes, more than {UNPACKED_FACTOR} "
                        f"times what its {marker} lists: refused, nothing unpacked"
                    )
                members.append(member)
            options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(folder, members=members, **options)
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise ValueError(
            f"the archive from {address} is truncated or not a .tar.gz archive ({e})"
        ) from e


def _fetch(address: str, expected: str | None, scratch: str, marker: str, timeout: float):
    """Downloads and unpacks an archive into `scratch`.

    Returns:
      (the archive's size, its sha256, the unpacked folder that holds `marker`: the
      archive's top, or its one folder).
    """
    archive = os.path.join(scratch, "archive.tar.gz")
    size, sha256 = _download(address, archive, expected, timeout)
    folder = os.path.join(scratch, "unpacked")
    _unpack(archive, folder, address, marker)
    entries = os.listdir(folder) if os.path.isdir(folder) else []
    if len(entries) == 1 and os.path.isdir(os.path.join(folder, entries[0])):
        folder = os.path.join(folder, entries[0])
    if not os.path.isfile(os.path.join(folder, marker)):
        raise ValueError(f"the archive from {address} holds no {marker}")
    return size, sha256, folder


def cached_folder(
    url: str, cache_dir: str, marker: str, check=None, timeout: float | None = None
) -> str:
    """The cache's folder of an archive's files, downloaded if it is not there yet.

    Args:
      url: `https://...` of a .tar.gz archive, optionally ending in `#sha256=<hex>`.
      cache_dir: the folder of cached downloads.
      marker: a file the archive must hold (at its top or in its one folder).
      check: `check(folder, url)` raises ValueError for unpacked files that may not
        enter the cache.
      timeout: seconds the connection and each read may wait for the server
        (`TIMEOUT_SECONDS` when None).

    Returns:
      the folder; it also holds `download.json` (the URL, the archive's size and sha256).

    Raises:
      ValueError: for another scheme than https, a bad fragment, a failed, stalled,
        truncated or corrupt download, or files that `check` refuses.
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
    if expected is None:
        # Refusing would leave a host without checksums unusable; the files are still
        # checked against the marker's sizes and sha256s (`check`), which catches damage
        # but not a substituted archive whose marker matches its own files.
        logging.warning(
            "%s has no #sha256=<hex>: the archive is trusted on TLS alone (its files are "
            "checked against its own %s, not against a checksum you chose); add "
            "#sha256= to pin it",
            address,
            marker,
        )
    os.makedirs(cache_dir, exist_ok=True)
    scratch_dir = tempfile.TemporaryDirectory(prefix=".download", dir=cache_dir)
    with files.staged_dir(target) as staged, scratch_dir as scratch:
        size, sha256, unpacked = _fetch(
            address, expected, scratch, marker, TIMEOUT_SECONDS if timeout is None else timeout
        )
        for name in os.listdir(unpacked):
            os.replace(os.path.join(unpacked, name), os.path.join(staged, name))
        if check is not None:
            check(staged, address)
        record = {"url": address, "bytes": size, "sha256": sha256}
        files.write_json(os.path.join(staged, RECORD_FILE), record, indent=2)
    return target
