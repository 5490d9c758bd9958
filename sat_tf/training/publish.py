"""Publishing a trained model as a preset: made from a workdir, evaluated as users will
load it, and packed into an archive for download (the format is
`sat_tf/serving/preset.py`)."""

import dataclasses
import gzip
import json
import os
import shutil
import tarfile
import tempfile

from absl import logging

from sat_tf.config import DECODING_FIELDS, Config
from sat_tf.evaluation import coco_grounding
from sat_tf.serving import inference, off_world, preset, tags
from sat_tf.training import decoding_choice, prepare, scoring
from sat_tf.utils import files, machine


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
    there (float16 weights, as users load it), evaluated on `split` from the image
    files (`scoring.evaluate_images`) greedily, with beam 3 and with its own beam size
    (`stored_beams`), and renamed into place once complete: the stored scores are those
    of the shipped weights.

    Args:
      workdir: a trained workdir (`inference.load_workdir`).
      output_root: the folder of presets (`preset.PRESETS_DIR` for a shipped preset).
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
        if not os.path.isfile(os.path.join(target, preset.METADATA_FILE)):
            raise ValueError(f"{target} exists and is not a preset; refusing to replace it")
    model, vocab, config = inference.load_workdir(workdir)
    best = {}
    best_path = os.path.join(workdir, inference.BEST_INFO)
    if os.path.exists(best_path):
        with open(best_path, encoding="utf-8") as f:
            best = json.load(f)
    with files.staged_dir(target) as tmp:
        preset.save(
            model,
            vocab,
            config,
            tmp,
            name=name,
            description=description,
            trained_with=train_command,
            made_with=make_command,
            trained_model={
                "best_epoch": best.get("epoch"),
                "val_bleu4": best.get("val_bleu4"),
                **{k: best[k] for k in ("val_cider", "selected_on") if k in best},
            },
        )
        _carry_workdir_files(workdir, tmp)
        size = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
        if size > preset.MAX_BYTES:
            raise ValueError(
                f"the preset would take {size / 1e6:.1f} MB, more than the "
                f"{preset.MAX_BYTES / 1e6:.0f} MB a preset may take"
            )
        metadata = _store_scores(tmp, data_dir or config.data_dir, split)
    return metadata


# Files of a workdir that its preset carries when present: the tag table (a run
# `--init_from` a preset keeps the preset's, which names words of the grown vocabulary
# too) and the off-world statistics (`sat-off-world --workdir`, from its training photos).
CARRIED = (tags.TAGS_FILE, off_world.FILE)
_WITHOUT = {
    tags.TAGS_FILE: "captions without tags (a run from scratch has no tag table; "
    "scripts/build_tag_table.py makes one)",
    off_world.FILE: "gives no off-world score (run `sat-off-world --workdir=<the workdir>` "
    "first to fit it to the run's training photos)",
}


def _carry_workdir_files(workdir: str, directory: str) -> None:
    """Copies `CARRIED` files of the workdir into the preset folder and lists them in its
    metadata.json; says in one line each what the preset lacks."""
    carried = [name for name in CARRIED if os.path.isfile(os.path.join(workdir, name))]
    for name in CARRIED:
        if name not in carried:
            logging.info("%s holds no %s: the preset %s", workdir, name, _WITHOUT[name])
    if not carried:
        return
    for name in carried:
        with files.atomic_path(os.path.join(directory, name)) as tmp:
            shutil.copyfile(os.path.join(workdir, name), tmp)
    metadata = preset.read_metadata(directory)
    metadata["files"] = {**metadata["files"], **preset.file_entries(directory, carried)}
    preset.write_metadata(directory, metadata)


def rescore(
    directory: str, *, data_dir: str | None = None, split: str = "test", command=""
) -> dict:
    """Measures a preset's stored scores again with today's code (its weights, vocabulary
    and config unchanged), as `make` measures them, and rewrites its metadata.json.

    Args:
      directory: the preset's folder.
      data_dir: the dataset folder to evaluate on; None for the one its config names.
      split: the split whose scores are stored.
      command: the command that rescored it, stored as `rescored_with`.

    Returns:
      the metadata written.
    """
    preset.verify(directory)
    metadata = _store_scores(directory, data_dir, split)
    if command:
        metadata["rescored_with"] = command
        preset.write_metadata(directory, metadata)
    return metadata


def stored_beams(config) -> list[int]:
    """The beam sizes whose scores a preset stores: `preset.BEAM_SIZES` and its own."""
    return sorted({*preset.BEAM_SIZES, config.beam_size})


def _store_scores(directory, data_dir, split):
    """Loads the preset at `directory` as users load it, scores it on `split` of
    `data_dir` (None: its config's) from the image files at each of `stored_beams`
    (greedy, beam 3 and its own beam size; the rest of the decoding its config's), and
    stores the scores and the machine in its metadata."""
    shipped, shipped_vocab, shipped_config = inference.load_preset(directory)
    evaluated = dataclasses.replace(shipped_config, data_dir=data_dir or shipped_config.data_dir)
    scores = {"split": split, "dataset": shipped_config.dataset, "inputs": "image files"}
    with tempfile.TemporaryDirectory() as outputs:
        for beam in stored_beams(shipped_config):
            scores[f"beam_{beam}"] = scoring.evaluate_images(
                shipped, shipped_vocab, evaluated, outputs, split, beam
            )
    metadata = preset.read_metadata(directory)
    metadata.update(scores=scores, measured_on=machine.describe())
    preset.write_metadata(directory, metadata)
    return metadata


def choose_decoding(
    directory: str, *, data_dir: str | None = None, split: str = "test", command: str = ""
) -> dict:
    """Chooses a preset's decoding on its validation split, as a run's is chosen after
    training (`decoding_choice.choose`, by the config's `--selection_metric`, from the
    preset's own decoding), and measures its stored scores again with that decoding.

    The validation photos are captioned from the image files, as users caption (a model
    on cached features gets the backbone that made them, `inference.feature_encoder`).
    The preset's config.json then holds the chosen decoding (its other keys as they
    were, `_write_decoding`), `decoding_choice.DECODING_FILE` in the folder keeps every
    setting tried with its validation scores (BLEU-4 and CIDEr as selection computes
    them, and the coco-caption scores under "coco-caption"), metadata.json lists both
    files, repeats the config's checked fields, says under "decoding" what was chosen
    and how, and stores the `split` scores at each of `stored_beams` (`_store_scores`).
    The folder is rewritten as a whole (`files.staged_dir`): a failure leaves it as it
    was.

    Args:
      directory: the preset's folder.
      data_dir: the dataset folder; None for the one its config names.
      split: the split whose scores are stored.
      command: the command that chose it, stored under "decoding" and as `rescored_with`.

    Returns:
      the metadata written.
    """
    preset.verify(directory)
    model, vocab, config = inference.load_preset(directory)
    evaluated = dataclasses.replace(
        config, data_dir=data_dir or config.data_dir, use_feature_cache=False
    )
    with tempfile.TemporaryDirectory() as outputs:
        data = prepare.prepare_data(evaluated, outputs, vocab=vocab)
    records = data.splits["val"]
    if not records:
        raise ValueError(f"the val split of {config.dataset} in {evaluated.data_dir} is empty")
    encoder = inference.feature_encoder(model, config) if model.encoder is None else None
    chosen, tried = decoding_choice.choose(
        model, records, vocab, evaluated, data.objects, model.grid, encoder=encoder, full=True
    )
    logging.info(
        "decoding chosen on %d validation images: %s",
        len(records),
        decoding_choice.describe(chosen),
    )
    # Only the decoding changes: the data folder and the feature cache stay the config's.
    kept = dataclasses.replace(config, **{n: getattr(chosen, n) for n, _ in decoding_choice.SEARCH})
    decoding = {
        **decoding_choice.record(kept, tried, len(records)),
        "split": "val",
        "dataset": config.dataset,
        "inputs": "image files",
        "chosen_with": command,
    }
    with files.staged_dir(directory) as tmp:
        for name in preset.read_metadata(directory)["files"]:
            shutil.copyfile(os.path.join(directory, name), os.path.join(tmp, name))
        shutil.copyfile(
            os.path.join(directory, preset.METADATA_FILE), os.path.join(tmp, preset.METADATA_FILE)
        )
        _write_decoding(os.path.join(tmp, preset.CONFIG_FILE), kept)
        files.write_json(
            os.path.join(tmp, decoding_choice.DECODING_FILE), decoding, indent=2, sort_keys=True
        )
        metadata = preset.read_metadata(tmp)
        metadata["config"].update(
            {k: getattr(kept, k) for k in preset.CHECKED_FIELDS if k in DECODING_FIELDS}
        )
        metadata["decoding"] = {k: v for k, v in decoding.items() if k != "tried"}
        if command:
            metadata["rescored_with"] = command
        preset.write_metadata(tmp, metadata)
        add_file(tmp, preset.CONFIG_FILE)
        add_file(tmp, decoding_choice.DECODING_FILE)
        preset.verify(tmp)
        metadata = _store_scores(tmp, data_dir, split)
    return metadata


def _write_decoding(path: str, config) -> None:
    """Writes `config`'s decoding (the `decoding_choice.SEARCH` settings; hard
    attention's context only for hard attention) into the config.json at `path`, its
    other keys as they were: a config saved before later settings existed still lacks
    them and still reads them as `config.ADDED_FIELDS` says.

    Raises:
      ValueError: when the file would not read back as `config`.
    """
    with open(path, encoding="utf-8") as f:
        values = json.load(f)
    for name, _ in decoding_choice.SEARCH:
        if name != "hard_decoding" or config.attention == "hard":
            values[name] = getattr(config, name)
    files.write_text(path, json.dumps(values, indent=2, sort_keys=True))
    if Config.load(path) != config:
        raise ValueError(f"{path} does not read back as the chosen decoding")


def pack(directory: str, path: str) -> str:
    """Writes a checked preset folder as a .tar.gz archive for `preset.download`.

    The archive holds one folder named after the preset, with every file's time, owner
    and mode fixed, so the same preset always packs to the same bytes.

    Returns:
      the archive's sha256 (hex), for the URL's `#sha256=` fragment.
    """
    metadata = preset.verify(directory)
    with files.atomic_path(path) as tmp:
        with (
            open(tmp, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as compressed,
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for name in [preset.METADATA_FILE, *sorted(metadata["files"])]:
                source = os.path.join(directory, name)
                entry = tarfile.TarInfo(f"{metadata['name']}/{name}")
                entry.size, entry.mode = os.path.getsize(source), 0o644
                with open(source, "rb") as f:
                    tar.addfile(entry, f)
    return preset.sha256_of(path)


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


# What a preset's metadata keeps of a grounding report (`coco_grounding.measure`).
GROUNDING_KEYS = coco_grounding.SCORES + ("words", "photos")


def store_grounding(directory: str, report: dict, about: dict) -> dict:
    """Records a grounding report's overall scores in a preset's metadata.json, under
    "grounding", with what they were measured on (`about`: the COCO folder, beam size,
    photos scored), the same scores over the off-centre words and the interval of hit -
    centre where the report has them, and returns the metadata written."""
    metadata = preset.read_metadata(directory)
    missing = [k for k in GROUNDING_KEYS if k not in report]
    if missing:
        raise ValueError(f"a grounding report has {', '.join(GROUNDING_KEYS)}; missing {missing}")
    metadata["grounding"] = {**{k: report[k] for k in GROUNDING_KEYS}, **about}
    if "off_centre" in report:
        metadata["grounding"]["off_centre"] = dict(report["off_centre"])
    if report.get("hit_minus_centre"):
        metadata["grounding"]["hit_minus_centre"] = dict(report["hit_minus_centre"])
    preset.write_metadata(directory, metadata)
    return metadata


def add_file(directory: str, name: str) -> dict:
    """Lists (or relists) a file of a preset folder in its metadata.json, with its size
    and checksum, and returns the metadata written."""
    metadata = preset.read_metadata(directory)
    metadata["files"][name] = preset.file_entries(directory, [name])[name]
    preset.write_metadata(directory, metadata)
    return metadata
