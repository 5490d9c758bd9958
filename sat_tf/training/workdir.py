"""The workdir of a run: its files, the check that it holds the same model, and starting
from another run's weights (`sat_tf.serving.inference.load_workdir` loads a trained
workdir), also on data of other words: the settings come from the source (`config_from_source`),
the vocabulary is the source's grown (`Vocab.grow`), and so are its word weights
(`grow_word_weights`).

A workdir holds `config.json`, `vocab.txt`, `best.weights.h5` (best validation BLEU-4,
paper §4.3, or CIDEr: `--selection_metric`) with `best.json` (its epoch, scores and
vocabulary fingerprint),
`val_history.json`, `backup/` (the state `BackupAndRestore` resumes from),
`tensorboard/`, and the evaluation outputs `captions_<split>.json` and
`metrics_<split>.json`; a run on cached features (`--use_feature_cache`) also keeps
`features.json`, the settings of its features.
"""

import dataclasses
import json
import os
from collections.abc import Collection

import numpy as np

from sat_tf.config import (
    DECODING_FIELDS,
    MODEL_FIELDS,
    SELECTION_METRICS,
    Config,
    absolute_paths,
    check_given_settings,
    encoder_crop_fraction,
)
from sat_tf.data import vocab as vocab_lib
from sat_tf.data.tokens import UNK_ID
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import preset, tags
from sat_tf.serving.inference import BEST_INFO, BEST_WEIGHTS, check_weights_vocab
from sat_tf.serving.preset import CONFIG_FILE, FEATURES_FILE, VOCAB_FILE
from sat_tf.utils import files

HISTORY_FILE = "val_history.json"
# The weights with a row (the embedding E) or a column (the output layer L_o, paper
# eq. 7) per word, keyed as `preset.weight_variables` keys them: a grown vocabulary grows them.
WORD_WEIGHTS = (
    "decoder/embedding/embeddings",
    "decoder/deep_output/kernel",
    "decoder/deep_output/bias",
)
# What a run `--init_from` another takes from it when not given (`config_from_source`):
# the settings of its weights but those of the new data, of its features, and its
# decoding.
SOURCE_FIELDS = tuple(k for k in MODEL_FIELDS if k not in ("dataset", "vocab_size")) + (
    "encoder_weights",
    "crop_fraction",
    "hard_gate",
)


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
    preset (a name or folder: `sat_tf.serving.preset`) (`--init_from`).

    The run's vocabulary may extend the source's (`Vocab.grow`: the source's words
    first, with their ids); then the word weights grow too (`grow_word_weights`).

    Raises:
      ValueError: naming what `source` lacks or what differs: a model setting other
        than the attention, the dataset and the vocabulary size, the layers the
        attention has (a score, the gate), or a vocabulary of its weights that this
        run's does not start with.
    """
    if _from_preset(source):
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
    new_words = _new_words_of_workdir(source, paths[1], vocab)
    if onto_images or new_words:
        trained = _trained_model(model, saved, len(vocab) - new_words, paths[2])
        _copy_weights(model, trained, not onto_images, new_words, paths[2])
    else:
        model.load_weights(paths[2])


def _from_preset(source: str) -> bool:
    """Whether `--init_from=source` names a preset rather than a finished workdir."""
    return not os.path.exists(os.path.join(source, BEST_INFO)) and _is_preset(source)


def _is_preset(source: str) -> bool:
    from sat_tf.serving import (
        preset,  # presets are read by inference; training only starts from one
    )

    try:
        preset.read_metadata(preset.resolve(source))
    except ValueError:
        return False
    return True


def _added_words(trained_vocab, vocab) -> int | None:
    """How many words `vocab` has after those of `trained_vocab`, or None when it does
    not start with them."""
    if vocab.words[: len(trained_vocab)] != trained_vocab.words:
        return None
    return len(vocab) - len(trained_vocab)


def _new_words_of_workdir(source: str, info_path: str, vocab) -> int:
    """`_added_words` of the vocabulary the weights of the workdir `source` were trained
    with (its `vocab.txt`, checked against `best.json` at `info_path`): without that file,
    0 for the same vocabulary as `best.json`'s."""
    vocab_path = os.path.join(source, VOCAB_FILE)
    if os.path.exists(vocab_path):
        trained_vocab = vocab_lib.Vocab.load(vocab_path)
        check_weights_vocab(
            info_path,
            trained_vocab,
            f"--init_from={source}: {VOCAB_FILE} is not the vocabulary its weights were "
            "trained with",
            VOCAB_FILE,
        )
        added = _added_words(trained_vocab, vocab)
        if added is not None:
            return added
    check_weights_vocab(
        info_path,
        vocab,
        f"--init_from={source}: its weights were trained with another vocabulary than this "
        "run's, which does not start with its words",
        "this run's vocabulary",
    )
    return 0


def _load_preset_weights(model, config: Config, vocab, source: str) -> None:
    """`load_initial_weights` from a preset (name or folder) with this run's settings."""
    from sat_tf.serving import inference

    trained, trained_vocab, saved = inference.load_preset(source)
    onto_images, diff = _differences(saved, config, source)
    if onto_images:
        diff.append(f"--use_feature_cache: the preset {source} reads cached features")
    new_words = _added_words(trained_vocab, vocab)
    if new_words is None:
        diff.append(
            f"the vocabulary: {trained_vocab.fingerprint} vs this run's {vocab.fingerprint}, "
            "which does not start with its words"
        )
    if diff:
        raise ValueError(f"--init_from={source} holds another model:\n  " + "\n  ".join(diff))
    _copy_weights(model, trained, True, new_words, source)


def _differences(saved: Config, config: Config, source: str):
    """(whether a model on cached features starts one on images, the model settings
    `saved` (the run `source` was trained with) and `config` differ in). The dataset
    and the vocabulary size may differ: the vocabulary is compared on its own."""
    # A decoder trained on cached features may start an encoder fine-tune: its features
    # came from the same pretrained encoder, cropped the same way.
    onto_images = saved.use_feature_cache and not config.use_feature_cache
    compared = [k for k in MODEL_FIELDS if k not in ("attention", "dataset", "vocab_size")]
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


def _trained_model(model, saved: Config, vocab_size: int, path: str):
    """The model of the run `saved` over `vocab_size` words with the weights at `path`;
    trained on cached features, it reads those of `model` (of its encoder, for a model
    on images)."""
    if not saved.use_feature_cache:
        trained = build_model(saved, vocab_size, load_encoder_weights=False)
    else:
        if model.encoder is not None:
            height, width, depth = model.encoder.feature_grid()
        else:
            (height, width), depth = model.grid, model.feature_dim
        trained = build_model(
            saved, vocab_size, feature_shape=(height * width, depth), grid=(height, width)
        )
    trained.load_weights(path)
    return trained


def _copy_weights(model, trained, with_encoder: bool, new_words: int, where: str) -> None:
    """Assigns to each weight of `model` the weight of `trained` of the same path (the
    encoder's only `with_encoder`: without, `model`'s encoder keeps its pretrained
    weights, which made the features `trained` read), the word weights grown by
    `new_words` words (`grow_word_weights`)."""
    # Keyed by their paths below the model's own (numbered) name, as the presets store them.
    mine = preset.weight_variables(model, with_encoder)
    theirs = {k: v.numpy() for k, v in preset.weight_variables(trained, with_encoder).items()}
    if mine.keys() != theirs.keys():
        only_there = sorted(theirs.keys() - mine.keys())
        only_here = sorted(mine.keys() - theirs.keys())
        part = "model" if with_encoder else "model's decoder"
        raise ValueError(
            f"{where}: its weights do not fit this {part} (only there: {only_there}; "
            f"only here: {only_here})"
        )
    if new_words:
        grown = grow_word_weights(*(theirs[k] for k in WORD_WEIGHTS), new_words)
        theirs.update(zip(WORD_WEIGHTS, grown, strict=True))
    for key, weight in mine.items():
        weight.assign(theirs[key])


def grow_word_weights(embedding, kernel, bias, new_words: int):
    """The word weights of a vocabulary grown by k = `new_words` words after the source's.

    The source read and wrote each new word as `<unk>`, so each starts as `<unk>`: its
    embedding row is `<unk>`'s (teacher-forced inputs give what they gave), its column
    of the output layer L_o (paper eq. 7) is `<unk>`'s, and its bias, as `<unk>`'s own,
    is `<unk>`'s less log(k + 1). The k + 1 words then share exp(`<unk>`'s logit)
    evenly, the softmax's sum stays the same, and for every input each other word
    keeps its probability exactly while `<unk>` and the new words together hold
    `<unk>`'s.

    Args:
      embedding: (V, m) the source's word embeddings.
      kernel: (m, V) the kernel of its L_o (`deep_output`).
      bias: (V,) the bias of L_o.
      new_words: k.

    Returns:
      (embedding (V + k, m), kernel (m, V + k), bias (V + k,)), rows and columns of the
      source's ids unchanged but `<unk>`'s bias.
    """
    unk = slice(UNK_ID, UNK_ID + 1)
    share = float(np.log1p(new_words))
    embedding = np.concatenate([embedding, np.repeat(embedding[unk], new_words, axis=0)])
    kernel = np.concatenate([kernel, np.repeat(kernel[:, unk], new_words, axis=1)], axis=1)
    bias = np.concatenate([bias, np.full(new_words, bias[UNK_ID] - share, bias.dtype)])
    bias[UNK_ID] -= share
    return embedding, kernel, bias


def source_vocab(source: str):
    """The vocabulary of the model `--init_from=source` names: the `vocab.txt` of a
    finished workdir or of a preset.

    Raises:
      ValueError: naming the source and what it lacks.
    """
    if _from_preset(source):
        from sat_tf.serving import preset

        return preset.read(source).vocab
    path = os.path.join(source, VOCAB_FILE)
    if not os.path.exists(path):
        raise ValueError(f"--init_from={source} is not a finished workdir: {VOCAB_FILE} is missing")
    return vocab_lib.Vocab.load(path)


def _source_config(source: str) -> Config:
    """The settings the model `--init_from=source` names was trained with."""
    if _from_preset(source):
        from sat_tf.serving import preset

        return preset.read(source).config
    path = os.path.join(source, CONFIG_FILE)
    if not os.path.exists(path):
        raise ValueError(
            f"--init_from={source} is not a finished workdir: {CONFIG_FILE} is missing"
        )
    return Config.load(path)


def config_from_source(config: Config, given: Collection[str], source: str) -> Config:
    """The settings of a run `--init_from=source`: the source's encoder, feature geometry,
    sizes and decoding where the run gives none of its own.

    Each setting of `SOURCE_FIELDS` and `DECODING_FIELDS` not in `given` takes the
    source's value (`dataset` and `vocab_size` belong to the new data). A setting of
    `SOURCE_FIELDS` given must be the source's but where `load_initial_weights` starts
    another model: `--attention` may differ while its layers do not (soft and gated
    hard attention), and a source on cached features may start a run on images
    (`--use_feature_cache=false`; a run that gives `--fine_tune_encoder` reads images).
    `hard_gate` comes from a source with hard attention only, where it decides the
    layers; `--crop_fraction` is compared by the crop it makes. Decoding settings given
    are kept.

    Args:
      config: the settings of the run.
      given: names of the settings given explicitly (command line or flagfile).
      source: `config.init_from`, a finished workdir or a preset.

    Returns:
      `config` with the source's values.

    Raises:
      ValueError: one line naming a given setting that contradicts the source, or what
        the source lacks.
    """
    saved = _source_config(source)
    taken = {k: getattr(saved, k) for k in DECODING_FIELDS if k not in given}
    for name in SOURCE_FIELDS:
        mine, theirs = getattr(config, name), getattr(saved, name)
        if name not in given:
            if name == "use_feature_cache" and config.fine_tune_encoder:
                taken[name] = False
            elif name != "hard_gate" or saved.attention == "hard":
                taken[name] = theirs
            continue
        if name == "crop_fraction":
            mine = mine or encoder_crop_fraction(taken.get("encoder", config.encoder))
            theirs = saved.effective_crop_fraction
        agrees = (
            mine == theirs
            or name == "attention"
            or (name == "hard_gate" and saved.attention != "hard")
            or (name == "use_feature_cache" and theirs and not mine)
        )
        if not agrees:
            raise ValueError(
                f"--{name}={_shown(mine)} contradicts --init_from={source}, which has "
                f"--{name}={_shown(theirs)}: leave it out"
            )
    chosen = dataclasses.replace(config, **taken)
    if _weight_layout(chosen) != _weight_layout(saved):
        raise ValueError(
            f"--attention={chosen.attention} ({_layers(chosen)}) contradicts "
            f"--init_from={source}, which has --attention={saved.attention} "
            f"({_layers(saved)}): their layers differ"
        )
    return chosen


# A run on a user's own folder (`--dataset=folder`) trains as the shipped grid preset
# was trained: its encoder, sizes, decoding and optimisation (from scratch), or its
# optimisation alone (`--init_from`, whose source gives the rest); then these values,
# for a few hundred to a few thousand photos (BUILD_NOTES.md, "Your own photos").
FOLDER_RECIPE = "flickr8k_lite0_grid14_soft"
TRAINING_FIELDS = (
    "vocab_size",
    "dropout",
    "alpha_c",
    "optimizer",
    "learning_rate",
    "lr_schedule",
    "clip_norm",
    "batch_size",
    "eval_images",
)
FOLDER_SETTINGS = {"selection_metric": "cider", "epochs": 20, "early_stopping_patience": 4}


def resolved_config(config: Config, given: Collection[str]) -> Config:
    """The settings of a run as sat-train resolves them, and sat-extract-features and its
    Beam twin with it, so that a feature cache is written with the settings training
    reads it with: the folders absolute (`absolute_paths`), then `run_config`.

    Raises:
      ValueError: as `run_config`.
    """
    return run_config(absolute_paths(config), given)


def run_config(config: Config, given: Collection[str]) -> Config:
    """The settings a run trains with: `config`, with for the settings not `given` those
    of `--init_from`'s source (`config_from_source`) and, for `--dataset=folder`, the
    recipe of `FOLDER_RECIPE` and `FOLDER_SETTINGS`.

    Raises:
      ValueError: one line for a given setting that contradicts the source, or for
        given settings that contradict each other (`check_given_settings`).
    """
    if config.init_from:
        config = config_from_source(config, given, config.init_from)
    if config.dataset == "folder":
        recipe = _source_config(FOLDER_RECIPE)
        names = TRAINING_FIELDS
        if not config.init_from:
            names += SOURCE_FIELDS + DECODING_FIELDS
        values = {k: getattr(recipe, k) for k in names} | FOLDER_SETTINGS
        config = dataclasses.replace(config, **{k: v for k, v in values.items() if k not in given})
    check_given_settings(config, given)
    return config


def copy_tag_table(source: str, workdir: str) -> bool:
    """Copies the tag table of `--init_from`'s source (`tags.tsv` of a preset or a
    workdir) into the workdir, where `inference.load_workdir` finds it: a grown
    vocabulary keeps the old words' ids, and the table names tags by their words, so
    new words it holds become tags too. Returns whether the source had one."""
    folder = _preset_folder(source) if _from_preset(source) else source
    path = os.path.join(folder, tags.TAGS_FILE)
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        files.write_text(os.path.join(workdir, tags.TAGS_FILE), f.read())
    return True


def _preset_folder(source: str) -> str:
    from sat_tf.serving import preset

    return preset.resolve(source)


def _shown(value) -> str:
    """A setting's value as a flag takes it."""
    if value == "":
        return "''"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _layers(config: Config) -> str:
    """The layers of the decoder's attention, in words (`_weight_layout`)."""
    score, gated = _weight_layout(config)
    if not score:
        return "no score"
    return "a score and the gate beta" if gated else "a score, no gate"


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
