"""The workdir of a run: its files, the check that it holds the same model, and starting
from another run's weights (`sat_tf.inference.load_workdir` loads a trained workdir).

A workdir holds `config.json`, `vocab.txt`, `best.weights.h5` (best validation BLEU-4,
paper §4.3, or CIDEr: `--selection_metric`) with `best.json` (its epoch, scores and
vocabulary fingerprint),
`val_history.json`, `backup/` (the state `BackupAndRestore` resumes from),
`tensorboard/`, and the evaluation outputs `captions_<split>.json` and
`metrics_<split>.json`; a run on cached features (`--use_feature_cache`) also keeps
`features.json`, the settings of its features.
"""

import json
import os

from sat_tf import files, npz_weights
from sat_tf.config import MODEL_FIELDS, SELECTION_METRICS, Config
from sat_tf.inference import (
    BEST_INFO,
    BEST_WEIGHTS,
    CONFIG_FILE,
    FEATURES_FILE,
    check_weights_vocab,
)
from sat_tf.model.show_attend_tell import build_model

HISTORY_FILE = "val_history.json"


def write_json(path, value):
    """Writes a workdir's JSON file (indented, keys sorted), atomically."""
    files.write_json(path, value, indent=2, sort_keys=True)


def check_workdir(config: Config, workdir: str) -> None:
    """Creates the workdir, or checks that its saved config builds the same model.

    A workdir whose `best.weights.h5` was selected on one validation score is resumed
    only with the same `--selection_metric`: the kept weights and the history's scores
    of the other would not say which epoch is best.

    Raises:
      ValueError: naming each setting that differs, with both values, or when the
        workdir cannot be written.
    """
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write_test{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"workdir {workdir!r} is not writable: {e}") from e
    path = os.path.join(workdir, CONFIG_FILE)
    if os.path.exists(path):
        saved = Config.load(path)
        fields = MODEL_FIELDS + (("hard_gate",) if config.attention == "hard" else ())
        diff = [
            f"--{k}: workdir has {mine!r}, this run {theirs!r}"
            for k, mine, theirs in saved.differences(config, fields)
        ]
        if diff:
            raise ValueError(
                f"workdir {workdir} holds a different model; use another workdir or the "
                "same settings:\n  " + "\n  ".join(diff)
            )
    _check_selection(config, workdir)
    config.save(path)


def _check_selection(config: Config, workdir: str) -> None:
    info_path = os.path.join(workdir, BEST_INFO)
    if not (os.path.exists(info_path) and os.path.exists(os.path.join(workdir, BEST_WEIGHTS))):
        return
    with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    # best.json written before `selected_on` existed was always selected on BLEU-4; one
    # without validation scores was not selected (the last epoch of a run without a
    # validation split).
    selected_on = info.get("selected_on") or ("val_bleu4" if "val_bleu4" in info else None)
    if selected_on is None or selected_on == config.selection_key:
        return
    flags = {key: name for name, key in SELECTION_METRICS.items()}
    raise ValueError(
        f"{info_path}: best.weights.h5 was selected on {selected_on}, this run selects on "
        f"{config.selection_key}; resume with --selection_metric="
        f"{flags.get(selected_on, selected_on)} or train in another workdir"
    )


def _weight_layout(config: Config) -> tuple[bool, bool]:
    """(has a score, has the gate beta): what decides a decoder's layers besides the
    MODEL_FIELDS. Soft attention and gated hard attention share theirs."""
    gated = config.attention == "soft" or (config.attention == "hard" and config.hard_gate)
    return config.attention != "none", gated


def load_initial_weights(model, config: Config, vocab, source: str) -> None:
    """Starts `model` from the best weights of the finished workdir `source`, or from a
    preset (a name or folder: `sat_tf.preset`) (`--init_from`).

    Raises:
      ValueError: naming what `source` lacks or what differs: a model setting other
        than the attention, the layers the attention has (a score, the gate), or the
        vocabulary its weights were trained with.
    """
    if not os.path.exists(os.path.join(source, BEST_INFO)) and _is_preset(source):
        _load_preset_weights(model, config, vocab, source)
        return
    paths = [os.path.join(source, name) for name in (CONFIG_FILE, BEST_INFO, BEST_WEIGHTS)]
    for path in paths:
        if not os.path.exists(path):
            raise ValueError(
                f"--init_from={source} is not a finished workdir: {os.path.basename(path)} "
                "is missing"
            )
    saved = Config.load(paths[0])
    onto_images, diff = _differences(saved, config, source)
    if diff:
        raise ValueError(f"--init_from={source} holds another model:\n  " + "\n  ".join(diff))
    check_weights_vocab(
        paths[1],
        vocab,
        f"--init_from={source}: its weights were trained with another vocabulary than this run's",
        "this run's vocabulary",
    )
    if onto_images:
        _load_all_but_the_encoder(model, saved, len(vocab), paths[2])
    else:
        model.load_weights(paths[2])


def _is_preset(source: str) -> bool:
    from sat_tf import preset  # presets are read by inference; training only starts from one

    try:
        preset.read_metadata(preset.resolve(source))
    except ValueError:
        return False
    return True


def _load_preset_weights(model, config: Config, vocab, source: str) -> None:
    """`load_initial_weights` from a preset (name or folder) with this run's settings."""
    from sat_tf import inference

    trained, trained_vocab, saved = inference.load_preset(source)
    onto_images, diff = _differences(saved, config, source)
    if onto_images:
        diff.append(f"--use_feature_cache: the preset {source} reads cached features")
    if trained_vocab.words != vocab.words:
        diff.append(
            f"the vocabulary: {trained_vocab.fingerprint} vs this run's {vocab.fingerprint}"
        )
    if diff:
        raise ValueError(f"--init_from={source} holds another model:\n  " + "\n  ".join(diff))
    for mine, theirs in zip(model.weights, trained.weights, strict=True):
        mine.assign(theirs)


def _differences(saved: Config, config: Config, source: str):
    """(whether a model on cached features starts one on images, the model settings
    `saved` (the run `source` was trained with) and `config` differ in)."""
    # A decoder trained on cached features may start an encoder fine-tune: its features
    # came from the same pretrained encoder, cropped the same way.
    onto_images = saved.use_feature_cache and not config.use_feature_cache
    compared = [k for k in MODEL_FIELDS if k != "attention"]
    if onto_images:
        compared = [k for k in compared if k != "use_feature_cache"] + ["encoder_weights"]
    diff = [
        f"--{k}: {source} has {mine!r}, this run {theirs!r}"
        for k, mine, theirs in saved.differences(config, compared)
    ]
    if onto_images and saved.effective_crop_fraction != config.effective_crop_fraction:
        diff.append(
            f"--crop_fraction: {source}'s features were cropped to "
            f"{saved.effective_crop_fraction:g}, this run crops to "
            f"{config.effective_crop_fraction:g}"
        )
    saved_layout, layout = _weight_layout(saved), _weight_layout(config)
    if saved_layout != layout:
        diff.append(
            f"--attention: {source} has {saved.attention} attention"
            f"{', gated' if saved_layout[1] else ''}, this run {config.attention}"
            f"{', gated' if layout[1] else ''}: their layers differ"
        )
    return onto_images, diff


def _load_all_but_the_encoder(model, saved: Config, vocab_size: int, path: str) -> None:
    """Loads the weights at `path` of a model on cached features (`saved`) into `model`,
    which reads images: every weight but its encoder's, matched by path. The encoder
    keeps its pretrained weights, which made those features."""
    height, width, depth = model.encoder.feature_grid()
    trained = build_model(
        saved, vocab_size, feature_shape=(height * width, depth), grid=(height, width)
    )
    trained.load_weights(path)
    # Keyed by their paths below the model's own (numbered) name, as the presets store them.
    mine = npz_weights.variables(model, with_encoder=False)
    theirs = npz_weights.variables(trained, with_encoder=False)
    if mine.keys() != theirs.keys():
        only_there = sorted(theirs.keys() - mine.keys())
        only_here = sorted(mine.keys() - theirs.keys())
        raise ValueError(
            f"{path}: its weights do not fit this model's decoder (only there: {only_there}; "
            f"only here: {only_here})"
        )
    for key, weight in mine.items():
        weight.assign(theirs[key])


def save_weights_atomically(model, path):
    """`model.save_weights(path)` through a temporary file and a rename, so that a kill
    never leaves a half-written file under `path`."""
    with files.atomic_path(path) as tmp:
        model.save_weights(tmp)


def write_best_info(workdir, vocab, **values):
    """Writes `best.json`: what `best.weights.h5` was trained with (and `values`)."""
    info = {"vocab_fingerprint": vocab.fingerprint, "vocab_words": len(vocab), **values}
    write_json(os.path.join(workdir, BEST_INFO), info)


def read_history(path):
    """Per-epoch validation scores written by `EvaluationCallback` ([] if none yet)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def backed_up_epoch(workdir):
    """Epochs finished by the run whose state `BackupAndRestore` keeps in workdir/backup.

    Keras resumes `fit` at this epoch; the training data is made to start there too.
    """
    path = os.path.join(workdir, "backup", "training_metadata.json")
    if not os.path.exists(path):
        return 0
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["epoch"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read the training backup {path}: {e}") from e


def write_features_info(workdir, feature_dir, index):
    """Keeps in the workdir the settings of the cached features a run trains on."""
    keys = ("encoder", "encoder_weights", "image_size", "feature_shape", "grid")
    info = {"feature_dir": os.path.abspath(feature_dir), **{k: index[k] for k in keys}}
    write_json(os.path.join(workdir, FEATURES_FILE), info)
