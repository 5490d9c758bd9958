"""The preset format: trained captioners that the package ships or downloads.

A preset is a folder of weights.npz (float16, no pickle; a frozen ImageNet encoder left
out), vocab.txt, config.json, features.json (cached-feature models) and metadata.json
(name, model fields, vocabulary fingerprint, the test scores of these very weights, the
machine, the commands, and the sha256 and size of every other file): docs/design.md §8.
`read(source)` gives the config, vocabulary and feature geometry of a shipped name, a
folder, or the https:// URL of an archive (`download.py`, `#sha256=<hex>` on the URL),
every file checked against metadata.json first (a bad one is refused with a one-line
ValueError); `load_weights(model, stored)` fills a model built from them. This module
never builds a model: `inference.load` does. `sat_tf/training/publish.py` makes, packs
and scores presets. Finding a preset (`resolve`, `names`) needs no TensorFlow, so the
commands check `--preset` before it loads; the vocabulary is read with it.
"""

import datetime
import json
import os
import re
import zipfile
import zlib
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

import sat_tf
from sat_tf.config import MODEL_FIELDS, Config, with_added_fields
from sat_tf.utils import files
from sat_tf.utils.files import sha256_of
from sat_tf.utils.messages import preview

if TYPE_CHECKING:
    from sat_tf.data import vocab as vocab_lib

# The shipped presets: data of the package, beside its subpackages.
PRESETS_DIR = os.path.join(os.path.dirname(os.path.abspath(sat_tf.__file__)), "presets")
WEIGHTS_FILE = "weights.npz"
METADATA_FILE = "metadata.json"
CONFIG_FILE, VOCAB_FILE, FEATURES_FILE = "config.json", "vocab.txt", "features.json"
FORMAT = "sat_tf preset"
FORMAT_VERSION = 1
# What a preset may take in git.
MAX_BYTES = 25 * 10**6
# Config fields that decide the model and its captions; metadata.json repeats them, so
# that a config.json edited after the preset was made is named, field by field.
CHECKED_FIELDS = MODEL_FIELDS + (
    "encoder_weights",
    "crop_fraction",
    "hard_gate",
    "max_decode_length",
    "length_penalty",
)
BEAM_SIZES = (1, 3)
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


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


def resolve(source: str, cache_dir: str | None = None) -> str:
    """The folder of a preset: a shipped preset's, the folder given, or that of a URL's
    archive in the cache (downloaded if it is not there yet: `download.cached_folder`).

    Raises:
      ValueError: for an unknown name (listing the shipped ones), a folder that does
        not exist, or a failed download.
    """
    if not isinstance(source, str) or not source:
        raise ValueError(f"a preset is a shipped name, a folder or an https:// URL, not {source!r}")
    if "://" in source:
        from sat_tf.serving import download  # HTTPS and archives: not for a shipped preset

        root = os.path.join(cache_dir or download.default_cache_dir(), "presets")
        return download.cached_folder(source, root, METADATA_FILE, check=_check)
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
    from sat_tf.data import vocab as vocab_lib  # TensorFlow: not for `resolve`

    vocab = vocab_lib.Vocab.load(os.path.join(directory, VOCAB_FILE))
    if vocab.fingerprint != metadata["vocab_fingerprint"]:
        raise ValueError(
            f"preset {where}: {VOCAB_FILE} is not the vocabulary of its weights: it has "
            f"{len(vocab)} words (fingerprint {vocab.fingerprint}), the weights were trained "
            f"with {metadata.get('vocab_words')} (fingerprint {metadata['vocab_fingerprint']})"
        )
    config = Config.load(os.path.join(directory, CONFIG_FILE))
    # A preset made before a field existed does not record it (`config.ADDED_FIELDS`).
    recorded = with_added_fields(metadata["config"])
    diff = [
        f"{k}={getattr(config, k)!r} in {CONFIG_FILE}, {recorded.get(k)!r} in {METADATA_FILE}"
        for k in CHECKED_FIELDS
        if getattr(config, k) != recorded.get(k)
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


def file_entries(directory, file_names):
    """{name: {"bytes", "sha256"}} of files of a preset folder, as metadata.json lists them."""
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
    parameters = save_weights(model, os.path.join(directory, WEIGHTS_FILE), with_encoder)
    vocab.save(os.path.join(directory, VOCAB_FILE))
    config.save(os.path.join(directory, CONFIG_FILE))
    written = [WEIGHTS_FILE, VOCAB_FILE, CONFIG_FILE]
    model_info = {
        "parameters": parameters,
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
        "files": file_entries(directory, written),
    }
    write_metadata(directory, metadata)
    return metadata


def write_metadata(directory: str, metadata: dict) -> None:
    """Writes metadata.json (indented, keys sorted), atomically."""
    files.write_json(os.path.join(directory, METADATA_FILE), metadata, indent=2, sort_keys=True)


class Stored(NamedTuple):
    """A preset read and checked (`read`): what building its model takes.

    Attributes:
      directory: the preset folder.
      config: the `Config` it was trained with.
      vocab: its `Vocab`.
      feature_shape: (L, D) of a model trained on cached features, else None.
      grid: (H, W) of those features, else None.
      encoder_in_weights: whether weights.npz holds the encoder's weights (else a
        frozen ImageNet encoder's come from `config.encoder_weights`).
    """

    directory: str
    config: Config
    vocab: "vocab_lib.Vocab"
    feature_shape: tuple | None
    grid: tuple | None
    encoder_in_weights: bool


def read(source: str, cache_dir: str | None = None) -> Stored:
    """Reads and checks a preset: its config, vocabulary and feature geometry.

    Args:
      source: a shipped preset's name (`names()`), a preset folder, or the https:// URL
        of a preset archive, optionally ending in `#sha256=<hex>` (`download`).
      cache_dir: where downloads are kept (in `presets/`); None for
        `download.default_cache_dir()`.

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
        feature_shape, grid = read_features(directory, f"preset {directory}")
    return Stored(directory, config, vocab, feature_shape, grid, _encoder_in_weights(config))


def read_features(directory: str, where: str):
    """((L, D), (H, W) or None) of the cached features a model of `directory` (a preset
    or a workdir) was trained on, from its features.json; a file written before the grid
    was stored has none (the model then takes a square grid).

    Raises:
      ValueError: beginning with `where`, when the file is missing or unreadable.
    """
    path = os.path.join(directory, FEATURES_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
        feature_shape = tuple(int(n) for n in stored["feature_shape"])
        grid = tuple(int(n) for n in stored["grid"]) if stored.get("grid") else None
    except FileNotFoundError as e:
        raise ValueError(f"{where} lacks {FEATURES_FILE}") from e
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: cannot read {FEATURES_FILE}: {e}") from e
    return feature_shape, grid


def load_weights(model, stored: Stored) -> None:
    """Loads a preset's float16 weights into `model` (float32), built from `stored`.

    Raises:
      ValueError: naming the preset, when the weights do not fit the model.
    """
    path = os.path.join(stored.directory, WEIGHTS_FILE)
    try:
        read_weights(model, path, stored.encoder_in_weights, CONFIG_FILE)
    except ValueError as e:
        raise ValueError(f"preset {stored.directory}: {e}") from e


# weights.npz: each weight keyed by its variable path without the model's name
# (`decoder/init_h/kernel`), the encoder's under `encoder/`, so the file does not depend
# on how Keras numbers layers in a process; float16 arrays, read without pickle and cast
# back to each variable's dtype (float32).


def weight_variables(model, with_encoder: bool) -> dict:
    """{key: variable} of the weights stored; the encoder's only `with_encoder`."""
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


def save_weights(model, path: str, with_encoder: bool) -> int:
    """Writes the model's weights in float16 to `path` atomically.

    Returns:
      the number of values written.

    Raises:
      ValueError: for a weight beyond float16's range, naming it.
    """
    arrays = {k: _float16(k, v.numpy()) for k, v in weight_variables(model, with_encoder).items()}
    with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return int(sum(a.size for a in arrays.values()))


def read_weights(model, path: str, with_encoder: bool, model_source: str) -> None:
    """Assigns the weights of `path` to the model's variables.

    Args:
      model: a built model of the same architecture.
      path: an .npz file written by `save_weights`.
      with_encoder: whether the file holds the encoder's weights.
      model_source: how errors name what the model was built from (`config.json`).

    Raises:
      ValueError: for a file that cannot be read (or holds pickled objects), or whose
        keys or shapes are not the model's, naming up to five differences.
    """
    name = path.rsplit("/", 1)[-1]
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(f"cannot read {name}: {e}") from e
    wanted = weight_variables(model, with_encoder)
    problems = []
    if missing := sorted(set(wanted) - set(arrays)):
        problems.append(f"it lacks {preview(missing)}")
    if extra := sorted(set(arrays) - set(wanted)):
        problems.append(f"the model has no {preview(extra)}")
    for key in sorted(set(wanted) & set(arrays)):
        want, got = tuple(wanted[key].shape), tuple(arrays[key].shape)
        if want != got:
            problems.append(f"{key} is {got} in {name}, {want} in the model")
    if problems:
        raise ValueError(
            f"{name} does not fit the model of {model_source}: " + "; ".join(problems[:5])
        )
    for key, variable in wanted.items():
        variable.assign(arrays[key].astype(variable.dtype))
