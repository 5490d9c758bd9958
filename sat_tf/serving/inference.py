"""Inference without `training/`: a trained captioner from a preset or a workdir, and the
caption function that decodes batches with it.

- `load(source)`: in one read, all a captioner needs (`Trained`: the model with its
  tagger, the vocabulary, the config, the off-world statistics) of a shipped preset's
  name, a preset folder, the https:// URL of a preset archive, or a trained workdir.
- `load_preset(source)`, `load_workdir(workdir)`: (model, vocab, config) of one kind.
- `feature_encoder(model, config)`: the backbone whose features a model reads, rebuilt
  for a model trained on cached features, to caption images with it.
- `decoding_arguments(config, vocab)`: the decoding a config sets, as
  `ShowAttendTell.generate` (the one decoding function) takes it.
- `make_caption_fn(model, config)`: a `tf.function` that captions a batch.

The Python API (`api`), the console commands, the export (`exporting`) and the demo of
this package read trained models through this module.
"""

import json
import os
from typing import NamedTuple

import tensorflow as tf

from sat_tf.config import Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.data.tokens import BAD_ENDINGS
from sat_tf.model.encoder import ImageEncoder
from sat_tf.model.show_attend_tell import ShowAttendTell, build_model
from sat_tf.serving import off_world as off_world_lib
from sat_tf.serving import preset, tags
from sat_tf.serving.preset import CONFIG_FILE, VOCAB_FILE

# A workdir's files beside its config and vocabulary (`sat_tf.training.workdir` writes
# them).
BEST_WEIGHTS, BEST_INFO = "best.weights.h5", "best.json"
BACKUP_WEIGHTS = os.path.join("backup", "latest.weights.h5")
KINDS = ("preset", "workdir")


class Trained(NamedTuple):
    """A trained captioner as `load` reads it.

    Attributes:
      model: the `ShowAttendTell`, float32, with its `tagger` set (None for none).
      vocab: its `Vocab`.
      config: the `Config` it was trained with (its decoding included).
      off_world: its `off_world.Stats` (`sat-off-world`), None where it has none.
      directory: the preset folder or the workdir it was read from.
    """

    model: ShowAttendTell
    vocab: vocab_lib.Vocab
    config: Config
    off_world: off_world_lib.Stats | None
    directory: str


def kind_of(source: str) -> str:
    """ "workdir" for a folder with a config.json and no preset metadata.json, else
    "preset" (a shipped name, a preset folder, a URL)."""
    if isinstance(source, str) and os.path.isdir(source):
        has = lambda name: os.path.isfile(os.path.join(source, name))  # noqa: E731
        if has(CONFIG_FILE) and not has(preset.METADATA_FILE):
            return "workdir"
    return "preset"


def load(source: str, cache_dir: str | None = None, kind: str | None = None) -> Trained:
    """Reads a trained captioner: config, vocabulary, weights, feature geometry, tagger
    and off-world statistics, each file once.

    Args:
      source: a shipped preset's name (`sat_tf.serving.preset.names()`), a preset
        folder, the https:// URL of a preset archive (optionally ending in
        `#sha256=<hex>`), or a trained workdir (`sat-train`).
      cache_dir: where downloads are kept (in `presets/`); None for
        `sat_tf.serving.download.default_cache_dir()`.
      kind: "preset" or "workdir"; None tells them apart (`kind_of`).

    Returns:
      `Trained`. A model trained on cached features has no encoder:
      `feature_encoder(model, config)` rebuilds the backbone that made them.

    Raises:
      ValueError: one line naming the preset or workdir and what is wrong with it.
    """
    kind = kind or kind_of(source)
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: one of {', '.join(KINDS)}")
    if kind == "workdir":
        model, vocab, config = _read_workdir(source)
        directory = source
    else:
        stored = preset.read(source, cache_dir)
        model = build_model(
            stored.config,
            len(stored.vocab),
            stored.feature_shape,
            stored.grid,
            load_encoder_weights=not stored.encoder_in_weights,
        )
        preset.load_weights(model, stored)
        vocab, config, directory = stored.vocab, stored.config, stored.directory
    # A preset's tag table, or the one a run fine-tuned from a preset keeps (--init_from).
    model.tagger = tags.load_tagger(directory, vocab, config.encoder)
    return Trained(model, vocab, config, off_world_lib.load_from(directory), directory)


def load_preset(source: str, cache_dir: str | None = None):
    """(model, vocab, config) of a preset (`load`): its float16 weights in a float32 model.

    Raises:
      ValueError: one line naming the preset and what is wrong with it.
    """
    return load(source, cache_dir, kind="preset")[:3]


def load_workdir(workdir: str):
    """(model, vocab, config) of a trained workdir (`load`): its best weights, else its
    latest backup.

    Raises:
      ValueError: when the workdir lacks its files or the weights do not fit.
    """
    return load(workdir, kind="workdir")[:3]


def check_weights_vocab(info_path, vocab, what, whose):
    """Raises ValueError, beginning with `what`, when the `best.json` at `info_path` names
    another vocabulary than `vocab` (`whose` vocabulary, in the message)."""
    with open(info_path, encoding="utf-8") as f:
        info = json.load(f)
    if info.get("vocab_fingerprint") != vocab.fingerprint:
        raise ValueError(
            f"{what}: the weights had {info.get('vocab_words')} words (fingerprint "
            f"{info.get('vocab_fingerprint')}), {whose} has {len(vocab)} words (fingerprint "
            f"{vocab.fingerprint})"
        )


def _read_workdir(workdir: str):
    """(model, vocab, config) of a workdir, its weights loaded."""
    config_path = os.path.join(workdir, CONFIG_FILE)
    if not os.path.exists(config_path):
        raise ValueError(f"{workdir} is not a sat_tf workdir: {CONFIG_FILE} is missing")
    config = Config.load(config_path)
    vocab = vocab_lib.Vocab.load(os.path.join(workdir, VOCAB_FILE))
    feature_shape = grid = None
    if config.use_feature_cache:
        feature_shape, grid = preset.read_features(workdir, f"{workdir} trained on cached features")
    info_path = os.path.join(workdir, BEST_INFO)
    if os.path.exists(info_path):
        check_weights_vocab(
            info_path,
            vocab,
            f"{VOCAB_FILE} of {workdir} is not the vocabulary its weights were trained with",
            VOCAB_FILE,
        )
    model = build_model(config, len(vocab), feature_shape, grid, load_encoder_weights=False)
    for path in (
        os.path.join(workdir, BEST_WEIGHTS),
        os.path.join(workdir, BACKUP_WEIGHTS),
    ):
        if os.path.exists(path):
            try:
                model.load_weights(path)
            except ValueError as e:
                raise ValueError(
                    f"weights {path} do not fit the model of {config_path} with a "
                    f"vocabulary of {len(vocab)} words: {e}"
                ) from e
            return model, vocab, config
    raise ValueError(f"{workdir} holds no trained weights ({BEST_WEIGHTS} or backup/)")


def decoding_arguments(
    config: Config, vocab=None, beam_size=None, num_captions=1, sample=False
) -> dict:
    """`ShowAttendTell.generate`'s arguments from a config's decoding settings, read here
    once for the API, evaluation, the demo and the export: max_length, beam_size (None:
    `config.beam_size`), length_penalty, block_repeats, bad_ending_ids (the vocabulary's
    `tokens.BAD_ENDINGS` with `config.block_bad_endings`, which needs the `vocab`),
    hard_decoding (hard attention's context; None for the other models), tag_threshold
    (None with `config.tags` off) and num_return (`num_captions`).

    A beam keeps at least the `num_captions` hypotheses it returns: a beam narrower than
    that is widened to it. With `sample` the captions are drawn word by word (the
    generate call adds the seed, temperature and nucleus): beam_size 1 (a beam of one
    per state where a tag is to be said).

    Raises:
      ValueError: for a bad `num_captions`, or a beam size given with `sample`.
    """
    if config.block_bad_endings and vocab is None:
        raise ValueError("--block_bad_endings needs the vocabulary to find the bad endings")
    if isinstance(num_captions, bool) or not isinstance(num_captions, int) or num_captions < 1:
        raise ValueError(f"num_captions={num_captions!r} must be a positive integer")
    if sample and beam_size not in (None, 1):
        raise ValueError(f"beam_size={beam_size} and sampling: a drawn caption has no beam")
    beam_size = beam_size or config.beam_size
    if sample or num_captions > 1:
        beam_size = 1 if sample else max(beam_size, num_captions)
    return {
        "max_length": config.max_decode_length,
        "beam_size": beam_size,
        "length_penalty": config.length_penalty,
        "block_repeats": config.block_repeats,
        "bad_ending_ids": vocab.ids_present(BAD_ENDINGS) if config.block_bad_endings else (),
        "hard_decoding": config.hard_decoding if config.attention == "hard" else None,
        "tag_threshold": config.tag_threshold if config.tags else None,
        "num_return": num_captions,
    }


def make_caption_fn(
    model, config: Config, beam_size=None, encoder=None, vocab=None, num_captions=1, sample=False
):
    """A `tf.function` that captions a batch dict with the config's decoding
    (`decoding_arguments`): `ShowAttendTell.generate`, which with `config.tags` and a
    model that has a tagger (a preset's tag table) makes each caption say its photo's
    tag where the tag is confident.

    With `--jit_compile` XLA compiles it too, once per batch shape: it fuses the decoding
    step's small ops (BUILD_NOTES.md has the measured effect).

    Args:
      model: a `ShowAttendTell`.
      config: its settings.
      beam_size: None for `config.beam_size`.
      encoder: an encoder to run on batch["image"] first, for a model trained on cached
        features (`feature_encoder`); None feeds the batch to the model as it is.
      vocab: the model's `Vocab`; needed with `config.block_bad_endings`.
      num_captions: n, captions per image: the beam's n best (the beam widened to n
        where it is narrower), or with `sample` n drawn ones.
      sample: draw the captions (`decoding_arguments`); each call then gives the draw
        as `sampling`.

    Returns:
      the function, (batch, sampling) -> `show_attend_tell.Generated`, its fields
      (B, n, ...) for n > 1. `sampling` is None, or to draw (only with `sample`) a dict
      of tensors: sample_seed int32 (2,), temperature float32 () and, to cut each
      draw to its nucleus, top_p float32 () (`sampling.draw`).
    """
    decoding = decoding_arguments(config, vocab, beam_size, num_captions, sample)

    @tf.function(reduce_retracing=True, jit_compile=config.jit_compile, autograph=False)
    def caption(batch, sampling=None):
        if (sampling is not None) != sample:
            raise ValueError("sampling is given to a caption function made with sample=True")
        if encoder is not None:
            batch = {"features": encoder(batch["image"], training=False)}
        return model.generate(batch, **decoding, **(sampling or {}), compact=not config.jit_compile)

    return caption


def feature_encoder(model, config):
    """The encoder whose features the model reads: its own, or for a model trained on
    cached features the backbone that produced them, rebuilt from `config` (for
    captioning images with it, and for the export).

    Raises:
      ValueError: when the backbone cannot be rebuilt or its features do not fit.
    """
    if model.encoder is not None:
        return model.encoder
    if not config.encoder_weights:
        raise ValueError(
            "the model reads cached features of a randomly initialised encoder; the "
            "images need the encoder that made them (--encoder_weights of the run)"
        )
    encoder = ImageEncoder(config.encoder, config.image_size, config.encoder_weights)
    encoder.build((None, config.image_size, config.image_size, 3))  # the export tracks it
    height, width, depth = encoder.feature_grid()
    if depth != model.feature_dim or (
        model.grid and height * width != model.grid[0] * model.grid[1]
    ):
        raise ValueError(
            f"encoder {config.encoder} at {config.image_size} gives {height}x{width}x{depth} "
            f"features; the model was trained on {model.grid} x {model.feature_dim}"
        )
    return encoder
