"""Every setting of a sat_tf run, its default and a one-line help string.

The defaults train on the built-in `shapes` dataset; `configs/*.flags` list only what
differs for Flickr8k, Flickr30k and COCO. The console commands' flags (`sat-train`, ...)
are generated from the fields of `Config` by `sat_tf/cli/flags_lib.py`. The parts that
take a setting hold no default of their own (they read `Config.<name>`, or are given
every value by `arguments`) and check its allowed values with `check_choice`; a saved
config is read with the values of `ADDED_FIELDS` for the settings it predates.
"""

import dataclasses
import hashlib
import inspect
import json
import os
from collections.abc import Collection, Iterable
from typing import Any

from sat_tf.utils import files

DATASETS = ("shapes", "flickr8k", "flickr30k", "coco", "coco_captions_tfds", "folder")
ATTENTIONS = ("soft", "hard", "none")
ATTENTION_SCORES = ("additive", "dot", "scaled_dot")
HARD_DECODINGS = ("argmax", "expected")
START_STATES = ("mean", "learned")
# --selection_metric -> the key of its validation score in the epoch logs and in
# `val_history.json`.
SELECTION_METRICS = {"bleu4": "val_bleu4", "cider": "val_cider"}
CHOICES = {
    "dataset": DATASETS,
    "attention": ATTENTIONS,
    "attention_score": ATTENTION_SCORES,
    "optimizer": ("adam", "rmsprop"),
    "lr_schedule": ("constant", "cosine"),
    "strategy": ("default", "mirrored", "multi_worker"),
    "mixed_precision": ("", "mixed_bfloat16", "mixed_float16"),
    "on_missing": ("error", "skip"),
    "reinforce_reward": ("sequence", "to_go"),
    "reinforce_baseline": ("moving_average", "argmax"),
    "hard_decoding": HARD_DECODINGS,
    "start_state": START_STATES,
    "selection_metric": tuple(SELECTION_METRICS),
    "scst_baseline": ("mean", "greedy"),
}

# Choices and defaults of command flags that are not settings of a run, here (no
# TensorFlow) so that the commands define their flags before it loads: the export's
# TFLite weight quantizations ("dynamic": dynamic-range quantization, int8 weights with
# float activations, quantized per product at run time), the principal directions and
# the threshold's quantile of the off-world statistics (`serving/off_world.py`), and
# the runtimes that caption (`serving/litert.py`).
QUANTIZATIONS = ("dynamic",)
RUNTIMES = ("auto", "litert", "tensorflow")
OFF_WORLD_COMPONENTS = 64
OFF_WORLD_QUANTILE = 0.99


def check_choice(name: str, value, prefix: str = "") -> None:
    """Raises ValueError unless `value` is one of `CHOICES[name]`: the one check of a
    setting's allowed values, for `Config` and for the parts given the setting.

    Args:
      name: the setting, a key of `CHOICES`.
      value: its value.
      prefix: put before the name in the message (`Config` names the flag: "--").
    """
    choices = CHOICES[name]
    if value not in choices:
        raise ValueError(f"{prefix}{name}={value!r} is not one of {', '.join(map(repr, choices))}")


# The settings that decide the model's weights: a workdir or a preset made with other
# values holds another model.
MODEL_FIELDS = (
    "dataset",
    "vocab_size",
    "encoder",
    "image_size",
    "use_feature_cache",
    "attention",
    "attention_score",
    "embed_dim",
    "hidden_dim",
    "attention_dim",
    "global_context",
    "start_state",
    "location_prior",
)

# The centre crop the ImageNet backbones were trained with (paper 5.4: 224 of 256); the
# encoders listed after it, trained from scratch here, see the whole frame.
IMAGENET_CROP_FRACTION = 224 / 256
FULL_FRAME_ENCODERS = ("shapes_cnn",)

# Settings of hard attention (paper 4.1): REINFORCE, entropy, baseline, the mix with the
# expected context, and the gate.
HARD_ONLY = (
    "reinforce_weight",
    "entropy_weight",
    "reinforce_reward",
    "reinforce_baseline",
    "baseline_decay",
    "hard_mix_prob",
    "hard_warmup_steps",
    "hard_gate",
    "hard_decoding",
)

# The settings of captioning that a trained model carries with it: a run --init_from it
# takes them where they are not given.
DECODING_FIELDS = (
    "beam_size",
    "length_penalty",
    "block_repeats",
    "block_bad_endings",
    "tags",
    "tag_threshold",
    "max_decode_length",
)

# The settings by subject, in the order the commands' help lists them: `--help` shows
# `ESSENTIAL` (what a first run sets), `--helpfull` every section under its heading.
ESSENTIAL = ("dataset", "data_dir", "captions", "init_from", "encoder", "attention", "epochs",
             "batch_size", "learning_rate", "beam_size")  # fmt: skip
SECTIONS = {
    "data": ("dataset", "data_dir", "captions", "on_missing", "num_train", "num_val", "num_test",
             "vocab_size", "new_word_min_count", "max_caption_length"),
    "encoder and features": ("encoder", "encoder_weights", "image_size", "crop_fraction",
                             "fine_tune_encoder", "use_feature_cache", "feature_dir", "cache_dir"),
    "model": ("attention", "attention_score", "global_context", "start_state", "location_prior",
              "embed_dim", "hidden_dim", "attention_dim", "dropout", "alpha_c"),
    "hard attention": HARD_ONLY,
    "training": ("init_from", "seed", "optimizer", "learning_rate", "lr_schedule", "clip_norm",
                 "batch_size", "epochs", "steps_per_epoch", "eval_images",
                 "early_stopping_patience", "selection_metric"),
    "self-critical training": ("scst", "scst_samples", "scst_baseline", "scst_entropy_weight"),
    "decoding": ("choose_decoding", *DECODING_FIELDS),
    "system": ("strategy", "mixed_precision", "jit_compile"),
}  # fmt: skip


def section_of(name: str) -> str:
    """The `SECTIONS` heading of a setting."""
    return next(section for section, names in SECTIONS.items() if name in names)


# Settings added after configs were first saved, with the value that a config saved
# before the setting existed was made with: a saved config (a workdir's or a preset's
# config.json, the fields a preset's metadata.json records) without the key means that
# value, where `Config`'s default is the one for new runs. Settings of hard attention
# (`HARD_ONLY`) are filled in hard-attention configs only; the others never read them.
ADDED_FIELDS = {
    "hard_gate": False,  # hard attention had no gate
    "hard_decoding": "argmax",  # and captioned at argmax alpha
    "global_context": False,
    "start_state": "mean",
    "location_prior": False,
}


def with_added_fields(values: dict) -> dict:
    """A saved config's `values` with each setting of `ADDED_FIELDS` that they lack."""
    hard = values.get("attention") == "hard"
    added = {k: v for k, v in ADDED_FIELDS.items() if hard or k not in HARD_ONLY}
    return {**added, **values}


def _field(default, help_text):
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass
class Config:
    """All settings of a run. `help(Config)` or `--helpfull` lists them with their help."""

    dataset: str = _field("shapes", "Dataset to train on.")
    data_dir: str = _field("data/shapes", "Folder with the dataset (generated for shapes).")
    captions: str = _field(
        "",
        "--dataset=folder: the captions file (metadata.jsonl or metadata.csv, a CSV/TSV of "
        "image and caption columns, or a COCO-format captions JSON), relative to --data_dir "
        "or absolute; '' = found in --data_dir by the conventions of sat_tf/data/folder.py.",
    )
    on_missing: str = _field("error", "Images listed but missing: stop, or skip them.")
    num_train: int = _field(8000, "shapes: number of training images.")
    num_val: int = _field(1000, "shapes: number of validation images.")
    num_test: int = _field(1000, "shapes: number of test images.")
    seed: int = _field(0, "Seed for data generation, shuffling, initialisation, sampling.")
    init_from: str = _field(
        "",
        "A finished workdir (or a preset: name or folder) whose best weights this run "
        "starts from instead of fresh ones "
        "(its model settings but the attention must be this run's), e.g. hard attention from "
        "a converged soft model, or a run that also trains the encoder from a run on cached "
        "features of that encoder; '' = fresh weights.",
    )

    vocab_size: int = _field(10000, "Most frequent training words kept (paper 5.1).")
    new_word_min_count: int = _field(
        3,
        "--init_from a model of another vocabulary: a word of this run's training captions "
        "that the source's vocabulary lacks is added when it occurs at least this often.",
    )
    max_caption_length: int = _field(40, "Longer training captions are cut to this many words.")

    encoder: str = _field(
        "shapes_cnn",
        "Backbone (sat_tf/backbones/registry.py): shapes_cnn, vgg19, resnet50, resnet101, "
        "inception_v3, efficientnet_b0, efficientnet_lite0, efficientnet_lite2, "
        "efficientnet_lite0_head, efficientnet_lite2_head, efficientnet_lite0_head_dilated, "
        "efficientnet_lite2_head_dilated.",
    )
    encoder_weights: str = _field("", "'' (random), 'imagenet', or a weights file path.")
    image_size: int = _field(112, "Square input size of the encoder.")
    crop_fraction: float = _field(
        0.0,
        "Share of the resized shorter side kept by the centre crop: 0 = the encoder's own "
        "(224/256 for ImageNet backbones, paper 5.4); 1 = resize the whole frame, uncropped.",
    )
    fine_tune_encoder: bool = _field(
        False, "Train a pretrained encoder too (an encoder without weights is always trained)."
    )
    use_feature_cache: bool = _field(
        False, "Read encoder features from TFRecord shards (extract_features.py)."
    )
    feature_dir: str = _field(
        "", "Folder of feature shards; default <cache_dir>/<dataset>-<hash>/features_<encoder>."
    )
    cache_dir: str = _field(
        "data/cache",
        "Where files derived from a dataset (feature shards, vocabulary) go, one folder per "
        "dataset folder; nothing is ever written into --data_dir.",
    )

    attention: str = _field("soft", "Attention: soft (4.2), hard (4.1) or none (ablation).")
    attention_score: str = _field(
        "additive",
        "Score f_att: additive (Bahdanau), dot (a^T W h) or scaled_dot (a^T W h / sqrt(n)).",
    )
    global_context: bool = _field(
        False,
        "Soft or hard attention: also feed the mean annotation (the no-attention context) "
        "to the LSTM and the output at every step, beside the attended one. Not in the "
        "paper.",
    )
    start_state: str = _field(
        "mean",
        "h_0, c_0: mean, from the mean annotation (paper eq. 5), or learned, two trained "
        "vectors the same for every image, so that the image reaches the decoder only "
        "through the attended context. learned is not in the paper.",
    )
    location_prior: bool = _field(
        False,
        "Soft or hard attention: the score also learns one vector per grid cell, added to "
        "W_a a_i, so it can prefer places as well as content (a learned location prior). "
        "Not in the paper.",
    )
    embed_dim: int = _field(64, "Word embedding size m.")
    hidden_dim: int = _field(256, "LSTM size n.")
    attention_dim: int = _field(64, "Hidden size of the additive score.")
    dropout: float = _field(0.2, "Dropout before the output layer L_o (paper 3.1.2).")
    alpha_c: float = _field(
        0.002,
        "Doubly stochastic penalty weight lambda (paper 4.2.1); 0 turns it off. Soft "
        "attention only: hard and none ignore the default; a value > 0 given is an error.",
    )
    reinforce_weight: float = _field(1.0, "Hard attention: weight lambda_r of the REINFORCE term.")
    entropy_weight: float = _field(0.002, "Hard attention: weight lambda_e of the entropy term.")
    reinforce_reward: str = _field(
        "to_go",
        "Hard attention: reward of s_t: the whole caption's log-likelihood (sequence, "
        "paper 4.1) or that of the words from t on (to_go).",
    )
    reinforce_baseline: str = _field(
        "argmax",
        "Hard attention: baseline: moving averages (moving_average, paper 4.1) or the "
        "caption's reward at argmax alpha (argmax).",
    )
    baseline_decay: float = _field(0.9, "Hard attention: moving-average baseline decay.")
    hard_mix_prob: float = _field(
        0.5, "Hard attention: probability a sequence uses the expected context instead."
    )
    hard_warmup_steps: int = _field(
        625,
        "Hard attention: steps at the start that use only the expected context, before "
        "sampling and REINFORCE start; 0 = none (paper 4.1).",
    )
    hard_gate: bool = _field(
        True,
        "Hard attention: scale the sampled annotation by the gate beta_t of soft attention "
        "(paper 4.2.1; the original code's `selector` gates both); false = the paper's "
        "hard model.",
    )
    hard_decoding: str = _field(
        "expected",
        "Hard attention: the context when captioning: the annotation at argmax alpha "
        "(argmax) or the expected one, sum_i alpha_i a_i (expected, the original code's "
        "test-time default).",
    )

    optimizer: str = _field("adam", "Optimizer: adam (Flickr30k, COCO) or rmsprop (Flickr8k).")
    learning_rate: float = _field(2e-3, "Peak learning rate.")
    lr_schedule: str = _field(
        "cosine", "Learning rate: constant, or cosine decay to 0 over all training steps."
    )
    clip_norm: float = _field(5.0, "Global gradient norm clip; 0 turns it off.")
    batch_size: int = _field(64, "Captions per batch (all of one length, paper 4.3).")
    epochs: int = _field(3, "Training epochs.")
    steps_per_epoch: int = _field(0, "Batches per epoch; 0 = one pass over the training set.")
    eval_images: int = _field(500, "Validation images captioned after each epoch; 0 = all.")
    early_stopping_patience: int = _field(
        0, "Stop after this many epochs without a better --selection_metric score."
    )
    selection_metric: str = _field(
        "bleu4",
        "Validation score that picks the best epoch and drives early stopping: bleu4 "
        "(coco-caption BLEU-4, paper 4.3) or cider (CIDEr-D).",
    )
    scst: bool = _field(
        False,
        "Self-critical sequence training (Rennie et al. 2017) instead of cross-entropy: "
        "sample --scst_samples captions an image, reward their CIDEr-D against the "
        "image's references (<end> counted, document frequencies of the training "
        "references), loss -(r - b) log p(sample). A second stage: start it from a "
        "cross-entropy run or preset with --init_from. Not in the paper.",
    )
    scst_samples: int = _field(5, "Self-critical training: captions sampled per image (K).")
    scst_baseline: str = _field(
        "mean",
        "Self-critical training: baseline b of a sample: the mean reward of the image's "
        "other K - 1 samples (mean) or the reward of its greedy caption (greedy).",
    )
    scst_entropy_weight: float = _field(
        0.0,
        "Self-critical training: weight of an entropy bonus, the loss less this times "
        "the entropy of the word distributions summed over each sample's steps (it "
        "resists the distribution turning peaky and the vocabulary shrinking); 0 = off.",
    )

    choose_decoding: bool = _field(
        True,
        "After training, choose the beam size, length penalty, repeat and ending blocking "
        "(and hard attention's context) on the validation images by --selection_metric "
        "and keep them with the model (sat_tf/training/decoding_choice.py); the decoding "
        "flags given explicitly are kept as given. false = decode as the flags say.",
    )
    beam_size: int = _field(1, "Beam size for evaluation and captioning (1 = greedy).")
    max_decode_length: int = _field(50, "Longest caption generated.")
    length_penalty: float = _field(0.0, "Beam length normalisation exponent; 0 = off.")
    block_repeats: bool = _field(
        True, "Captioning never emits a word a third time in a row, nor a trigram twice."
    )
    block_bad_endings: bool = _field(
        False, "Captioning never ends a caption on a, the, with, of, ... (tokens.BAD_ENDINGS)."
    )
    tags: bool = _field(
        True,
        "Captioning names the photo's tag (its encoder's ImageNet head through the preset's "
        "tag table, tags.tsv) where it is confident: constrained beam search. Presets "
        "without a tag table caption as without.",
    )
    tag_threshold: float = _field(
        0.7, "Probability a tag needs before the caption must name it (--tags)."
    )

    strategy: str = _field("default", "tf.distribute strategy.")
    mixed_precision: str = _field("", "Keras mixed precision policy ('' = float32).")
    jit_compile: bool = _field(
        False,
        "Compile captioning (greedy and beam search) with XLA; also the train step where a GPU "
        "is present (on CPUs XLA made it slower).",
    )

    def __post_init__(self):
        self.validate()

    @property
    def decodes_at_a_cell(self) -> bool:
        """Whether captioning reads one cell per word: hard attention at argmax alpha."""
        return self.attention == "hard" and self.hard_decoding == "argmax"

    @property
    def selection_key(self) -> str:
        """The key of the `--selection_metric` score in the epoch logs and the history."""
        return SELECTION_METRICS[self.selection_metric]

    @property
    def effective_crop_fraction(self) -> float:
        """The centre-crop share the run uses: `--crop_fraction`, else its encoder's."""
        return self.crop_fraction or encoder_crop_fraction(self.encoder)

    def validate(self):
        """Raises ValueError naming the first setting of the wrong type or out of range."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kinds = (int, float) if f.type is float else (f.type,)
            if isinstance(value, bool) != (f.type is bool) or not isinstance(value, kinds):
                raise ValueError(f"--{f.name}={value!r} is not a {f.type.__name__}")
        for name in CHOICES:
            check_choice(name, getattr(self, name), prefix="--")
        positive = ("vocab_size", "max_caption_length", "image_size", "embed_dim", "hidden_dim")
        positive += ("attention_dim", "batch_size", "epochs", "beam_size", "max_decode_length")
        positive += ("new_word_min_count",)
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}={getattr(self, name)} must be at least 1")
        non_negative = ("steps_per_epoch", "eval_images", "early_stopping_patience", "alpha_c")
        non_negative += ("clip_norm", "num_train", "num_val", "num_test", "seed")
        non_negative += ("reinforce_weight", "entropy_weight", "hard_warmup_steps")
        non_negative += ("scst_entropy_weight",)
        if self.scst_samples < 1:
            raise ValueError(f"--scst_samples={self.scst_samples} must be at least 1")
        if self.scst and self.scst_baseline == "mean" and self.scst_samples < 2:
            raise ValueError(
                f"--scst_samples={self.scst_samples}: the mean baseline (of the other "
                "samples of the image) needs at least 2"
            )
        if self.scst and self.batch_size < self.scst_samples:
            raise ValueError(
                f"--batch_size={self.batch_size} counts sampled captions under --scst: it "
                f"must hold at least one image's --scst_samples={self.scst_samples}"
            )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"--{name}={getattr(self, name)} must not be negative")
        if not 0.0 <= self.crop_fraction <= 1.0:
            raise ValueError(f"--crop_fraction={self.crop_fraction} must lie in [0, 1]")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout={self.dropout} must lie in [0, 1)")
        for name in ("hard_mix_prob", "baseline_decay", "tag_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name}={getattr(self, name)} must lie in [0, 1]")
        if self.learning_rate <= 0:
            raise ValueError(f"--learning_rate={self.learning_rate} must be positive")
        if self.global_context and self.attention == "none":
            raise ValueError(
                "--global_context contradicts --attention=none: it adds the mean annotation "
                "beside an attended context, and none has no other context than that mean"
            )
        if self.location_prior and self.attention == "none":
            raise ValueError(
                "--location_prior contradicts --attention=none: it is a term of the "
                "attention score, and none has no score"
            )

    def differences(
        self, other: "Config", names: Iterable[str] | None = None
    ) -> list[tuple[str, Any, Any]]:
        """(name, this config's value, `other`'s value) of each setting in `names` (every
        field when None), in that order, where the two configs differ. Callers word the
        message: a workdir, `--init_from` and a seed table each name the two sides their
        own way."""
        if names is None:
            names = [f.name for f in dataclasses.fields(self)]
        return [
            (name, getattr(self, name), getattr(other, name))
            for name in names
            if getattr(self, name) != getattr(other, name)
        ]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def load(cls, path: str) -> "Config":
        """Reads a config written by `save` (the `config.json` of a workdir or a preset);
        a setting it lacks takes the value of `ADDED_FIELDS`, else the default."""
        try:
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read config {path}: {e}") from e
        if isinstance(values, dict):
            values = with_added_fields(values)
        return cls.from_dict(values)

    def save(self, path: str) -> None:
        """Writes the config as JSON atomically (temp file + rename)."""
        files.write_text(path, self.to_json())


_NAMES = frozenset(f.name for f in dataclasses.fields(Config))


def arguments(function, config: Config, leave_out=()) -> dict:
    """{name: value} of `config` for each parameter of `function` (or class) named like
    one of its settings, but those in `leave_out`."""
    names = inspect.signature(function).parameters
    return {n: getattr(config, n) for n in names if n in _NAMES and n not in leave_out}


def encoder_crop_fraction(encoder: str) -> float:
    """The centre-crop share an encoder was trained with (`image_io.resize_and_crop`)."""
    return 1.0 if encoder in FULL_FRAME_ENCODERS else IMAGENET_CROP_FRACTION


# The settings that name a file or folder of the machine: a workdir keeps them absolute.
PATH_FIELDS = ("data_dir", "cache_dir", "feature_dir", "init_from")


def absolute_paths(config: Config) -> Config:
    """`config` with its folders (`PATH_FIELDS`) as absolute paths, so that a workdir's
    config finds its data and cache from any working directory. A folder elsewhere
    (`s3://...`) and `--init_from` naming no file or folder here (a shipped preset's
    name, a URL) stay as given; `--captions` is relative to `--data_dir` and stays as
    given."""
    values = {}
    for name in PATH_FIELDS:
        value = getattr(config, name)
        if value and "://" not in value and (name != "init_from" or os.path.exists(value)):
            values[name] = os.path.abspath(value)
    return dataclasses.replace(config, **values)


def derived_dir(config: Config) -> str:
    """`<cache_dir>/<dataset>-<hash of the data folder's real path>`: the folder for the
    files derived from one dataset folder (two copies of a dataset, such as original and
    resized photos, never share features)."""
    real = os.path.realpath(config.data_dir).encode("utf-8")
    return os.path.join(
        config.cache_dir, f"{config.dataset}-{hashlib.sha256(real).hexdigest()[:8]}"
    )


def check_given_settings(config: Config, given: Collection[str]) -> None:
    """Raises ValueError when a setting given explicitly has no effect with the attention.

    The doubly stochastic penalty (paper 4.2.1) acts on soft attention only, and the
    REINFORCE settings (paper 4.1) on hard attention only; asking for one with another
    attention is a contradiction, not something to ignore. Only explicit settings count:
    a default never contradicts (hard and none simply leave the default `alpha_c` unused).

    Args:
      config: the settings of the run.
      given: names of the settings the user gave explicitly (command line or flagfile).

    Raises:
      ValueError: one line naming both settings and why they contradict each other.
    """
    for name in HARD_ONLY:
        if name in given and config.attention != "hard":
            raise ValueError(
                f"--{name}={getattr(config, name)} contradicts --attention={config.attention}: "
                f"it is a setting of hard attention (paper 4.1); leave it out or use "
                f"--attention=hard"
            )
    if "alpha_c" in given and config.alpha_c > 0 and config.attention != "soft":
        raise ValueError(
            f"--alpha_c={config.alpha_c} contradicts --attention={config.attention}: the "
            f"doubly stochastic penalty (paper 4.2.1) acts on soft attention only; use "
            f"--alpha_c=0, leave it out or use --attention=soft"
        )


def fields_with_help():
    """Yields `(name, default, type, help)` for every field of `Config`."""
    for f in dataclasses.fields(Config):
        yield f.name, f.default, f.type, f.metadata["help"]
