"""The TFLite files the LiteRT runtime captions with, built once per model and decoding
into the user's cache, beside downloaded presets and ported weights (docs/design.md
§7.3).

A file is keyed by a fingerprint of what decides its captions: a preset's metadata.json
(which holds the sha256 of every file of the preset) or a workdir's files, the decoding
settings (`DECODING_FIELDS`) and the package's version. `build` makes it with
TensorFlow (`sat_tf.serving.tflite`, from `inference.load`), under a file lock, so that
two processes that need it at once build it once: the second waits and takes the first's.
It lands in `<cache>/litert/<fingerprint>/` in one rename, with `litert.json` (and the
off-world statistics), all the LiteRT captioner reads besides the file
(`sat_tf.serving.litert`). Finding a file
(`fingerprint`, `find`) needs no TensorFlow. The cache keeps the `KEEP` files used last.
"""

import dataclasses
import hashlib
import json
import os
import time

from absl import logging

import sat_tf
from sat_tf.config import Config
from sat_tf.serving import off_world_stats
from sat_tf.utils import files

FOLDER = "litert"
INFO_FILE = "litert.json"
# The graph's version: a change of its outputs or decoding makes every file anew.
FORMAT = 1
# The settings of a config that the file's graph fixes.
DECODING_FIELDS = (
    "beam_size",
    "max_decode_length",
    "length_penalty",
    "block_repeats",
    "block_bad_endings",
    "tags",
    "tag_threshold",
    "hard_decoding",
)
# A workdir's files that decide its captions (`inference.load`, `tags`, `off_world`).
WORKDIR_FILES = (
    "config.json",
    "vocab.txt",
    "best.weights.h5",
    os.path.join("backup", "latest.weights.h5"),
    "tags.tsv",
    "off_world.npz",
)
# How long a process waits for another one's build before it gives up.
LOCK_SECONDS = 1800.0
KEEP = 8


def root(cache_dir: str | None = None) -> str:
    """The folder of the built files: `<cache>/litert` (`files.cache_dir`)."""
    return os.path.join(cache_dir or files.cache_dir(), FOLDER)


def decoding(config: Config) -> dict:
    """The settings of `config` that a file's graph fixes (`DECODING_FIELDS`)."""
    return {name: getattr(config, name) for name in DECODING_FIELDS}


def fingerprint(kind: str, directory: str, config: Config) -> str:
    """The key of a model's file: its preset's metadata.json (the sha256 of every file of
    it) or its workdir's files, with the decoding of `config` and the package's version.

    Args:
      kind: "preset" or "workdir".
      directory: the preset folder or the workdir.
      config: its config, with the decoding it captions with.
    """
    digest = hashlib.sha256()
    head = {"format": FORMAT, "sat_tf": sat_tf.__version__, "kind": kind}
    digest.update(json.dumps({**head, "decoding": decoding(config)}, sort_keys=True).encode())
    names = ["metadata.json"] if kind == "preset" else WORKDIR_FILES
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            digest.update(f"{name}\0{files.sha256_of(path)}\0".encode())
    return digest.hexdigest()[:24]


def find(key: str, cache_dir: str | None = None) -> str | None:
    """The folder of the built file of `key`, or None where it has not been built."""
    folder = os.path.join(root(cache_dir), key)
    return folder if os.path.isfile(os.path.join(folder, INFO_FILE)) else None


def read_info(folder: str) -> dict:
    """The `litert.json` of a built file's folder.

    Raises:
      ValueError: naming the file when it is not the info of a built file.
    """
    path = os.path.join(folder, INFO_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        os.path.getsize(os.path.join(folder, info["tflite"]["file"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not the info of a LiteRT model ({e}); delete {folder}") from e
    return info


class _Lock:
    """An exclusive `fcntl.flock` on a file, taken within `seconds` (polled, so a wait
    can be reported and bounded), released on exit."""

    def __init__(self, path, seconds, waiting):
        self.path, self.seconds, self.waiting = path, seconds, waiting

    def __enter__(self):
        import fcntl

        self.file = open(self.path, "a")  # noqa: SIM115 - held until __exit__
        deadline, told = time.monotonic() + self.seconds, False
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.file.close()
                    raise ValueError(
                        f"another process has built the LiteRT model for {self.seconds:.0f} s "
                        f"and holds {self.path}; wait for it, or stop it and run again"
                    ) from None
                if not told:
                    self.waiting()
                    told = True
                time.sleep(0.2)

    def __exit__(self, *unused):
        self.file.close()  # closing the file releases the lock


def build(
    kind: str, directory: str, config: Config, cache_dir: str | None = None, loaded=None
) -> str:
    """The folder of the file of a model and decoding, built with TensorFlow unless it is
    in the cache; another process's build of the same file is waited for, never repeated.

    Args:
      kind, directory, config: as for `fingerprint`.
      cache_dir: None for `files.cache_dir()`.
      loaded: the `inference.Trained` of `directory`, when the caller has read it.

    Returns:
      the folder (`find`).

    Raises:
      ValueError: when the model cannot be read or converted, or another process's
        build holds the lock longer than `LOCK_SECONDS`.
    """
    key = fingerprint(kind, directory, config)
    folder = os.path.join(root(cache_dir), key)
    if find(key, cache_dir):
        return folder
    os.makedirs(root(cache_dir), exist_ok=True)

    def waiting():
        logging.info("waiting for another process that builds the LiteRT model %s", folder)

    with _Lock(f"{folder}.lock", LOCK_SECONDS, waiting):
        if find(key, cache_dir):
            return folder
        logging.info(
            "building the LiteRT model of %s once (TensorFlow, about a minute) into %s",
            directory,
            folder,
        )
        _build(kind, directory, config, folder, loaded)
    prune(cache_dir, keep=KEEP)
    return folder


def _build(kind, directory, config, folder, loaded):
    from sat_tf.serving import exporting, inference, tflite

    start = time.monotonic()
    trained = loaded or inference.load(directory, kind=kind)
    config = dataclasses.replace(trained.config, **decoding(config))
    model, vocab, stats = trained.model, trained.vocab, trained.off_world
    encoder = inference.feature_encoder(model, config)
    spec = exporting.export_spec(model, encoder, config, vocab=vocab, off_world=stats)
    with files.staged_dir(folder) as staged:
        entry = tflite.write(staged, model, encoder, vocab, spec)["tflite"]
        if stats is not None:  # the whole statistics, beside the threshold the file holds
            off_world_stats.save(stats, os.path.join(staged, off_world_stats.FILE))
        info = {
            "format": FORMAT,
            "sat_tf_version": sat_tf.__version__,
            "source": os.path.abspath(directory),
            "kind": kind,
            "decoding": decoding(config),
            "tflite": entry,
            "image_size": spec.image_size,
            "crop_fraction": spec.crop_fraction,
            "grid": list(spec.grid),
            "tagger": model.tagger is not None,
            "off_world_threshold": None if stats is None else stats.threshold,
            "decodes_at_a_cell": config.decodes_at_a_cell,
            "built_seconds": round(time.monotonic() - start, 1),
        }
        files.write_json(os.path.join(staged, INFO_FILE), info, indent=2, sort_keys=True)


def prune(cache_dir: str | None = None, keep: int = KEEP) -> list[str]:
    """Removes all but the `keep` files used last (their info's modification time, which
    `touch` sets); returns the folders removed."""
    import shutil

    base = root(cache_dir)
    folders = [os.path.join(base, n) for n in os.listdir(base)] if os.path.isdir(base) else []
    built = [f for f in folders if os.path.isfile(os.path.join(f, INFO_FILE))]
    built.sort(key=lambda f: os.path.getmtime(os.path.join(f, INFO_FILE)), reverse=True)
    for folder in built[keep:]:
        shutil.rmtree(folder, ignore_errors=True)
    return built[keep:]


def touch(folder: str) -> None:
    """Marks a built file as used now (`prune` keeps the files used last)."""
    try:
        os.utime(os.path.join(folder, INFO_FILE))
    except OSError:  # a read-only cache is still read
        pass
