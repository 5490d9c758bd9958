"""Tests for presets: the round trip of a tiny model, every refusal of a bad preset, making
a preset from a workdir, the scripts' --preset, and the shipped preset on a real Flickr8k
photo (the download of a preset's archive over HTTPS: download_test.py)."""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from absl.testing import parameterized
from fixtures import MAX_LENGTH, WORDS, run_main, scenes, tiny_model, without_java

from sat_tf.cli import caption as caption_cli
from sat_tf.cli import flags_lib
from sat_tf.config import ADDED_FIELDS, CHOICES, HARD_ONLY, Config
from sat_tf.data import vocab as vocab_lib
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference, preset
from sat_tf.training import publish, scoring
from sat_tf.training import workdir as workdir_lib
from sat_tf.utils import files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLICKR8K = os.environ.get("SAT_TF_FLICKR8K", os.path.join(ROOT, "..", "shared", "data", "flickr8k"))
FEATURE_SHAPE, FEATURE_GRID = (4, 6), (2, 2)
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def tiny_feature_model(seed=4):
    """A tiny model on cached (4, 6) features whose greedy captions differ by features."""
    keras.utils.set_random_seed(seed)
    config = Config(
        use_feature_cache=True,
        embed_dim=8,
        hidden_dim=16,
        attention_dim=8,
        dropout=0.0,
        max_decode_length=MAX_LENGTH,
    )
    model = build_model(config, len(WORDS), FEATURE_SHAPE, FEATURE_GRID)
    rng = np.random.default_rng(seed)
    for variable in model.decoder.weights:
        variable.assign(rng.normal(size=variable.shape).astype(np.float32))
    bias = model.decoder.deep_output.bias.numpy()
    bias[[vocab_lib.PAD_ID, vocab_lib.START_ID]] = -30.0
    model.decoder.deep_output.bias.assign(bias)
    return model, vocab_lib.Vocab(WORDS), config


def float16_rounded(model):
    """`model` with every weight rounded to float16 and back: what a preset holds."""
    for variable in model.weights:
        variable.assign(variable.numpy().astype(np.float16).astype(np.float32))
    return model


def generate(model, batch):
    result = model.generate(batch, max_length=MAX_LENGTH)
    return type(result)(*(x.numpy() for x in result))


def rewrite_metadata(directory, change):
    """Applies `change` to metadata.json and records every file's new size and sha256."""
    path = os.path.join(directory, preset.METADATA_FILE)
    with open(path, encoding="utf-8") as f:
        metadata = json.load(f)
    change(metadata)
    for name in metadata["files"]:
        file = os.path.join(directory, name)
        metadata["files"][name] = {
            "bytes": os.path.getsize(file),
            "sha256": files.sha256_of(file),
        }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f)


def edit_json(path, change):
    with open(path, encoding="utf-8") as f:
        values = json.load(f)
    change(values)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(values, f, indent=2, sort_keys=True)


def flip_byte(path, position=None):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        i = len(data) // 2 if position is None else position
        data[i] ^= 0xFF
        f.seek(0)
        f.write(data)


def truncate(path, keep=0.5):
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * keep))


# How each damaged copy of a preset (`PresetTest._bad`) is refused.
BAD = {
    "weights_flipped": r"weights\.npz fails its checksum: sha256 [0-9a-f]{64}, metadata\.json "
    r"records [0-9a-f]{64}; the file was changed or damaged$",
    "weights_truncated": r"weights\.npz is truncated: [\d,]+ of [\d,]+ bytes$",
    "weights_missing": r"weights\.npz is missing$",
    "vocab_replaced": r"vocab\.txt is not the vocabulary of its weights: it has 12 words "
    r"\(fingerprint \w+\), the weights were trained with 12 \(fingerprint \w+\)$",
    "vocab_longer": r"vocab\.txt is not the vocabulary of its weights: it has 13 words",
    "config_model_field": r"config\.json is not the configuration of its weights: "
    r"hidden_dim=32 in config\.json, 16 in metadata\.json$",
    "config_other_field": r"config\.json fails its checksum",
    "config_and_metadata": r"weights\.npz does not fit the model of config\.json: "
    r"decoder/L_h/kernel is \(16, 8\) in weights\.npz, \(32, 8\) in the model",
    "metadata_missing": r"is not a sat_tf preset: metadata\.json is missing$",
    "metadata_truncated": r"metadata\.json is truncated or damaged \(not JSON",
    "metadata_newer": r"format version 2; this sat_tf reads version 1; upgrade sat_tf$",
    "pickled_weights": r"cannot read weights\.npz: Object arrays cannot be loaded when "
    r"allow_pickle=False",
}


class PresetTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.images = scenes(0, 4).astype(np.float32)
        cls.features = np.random.default_rng(7).normal(size=(4, *FEATURE_SHAPE)).astype(np.float32)

        model, vocab, config = tiny_model()
        cls.image_dir = os.path.join(cls.root, "tiny_image")
        cls.image_metadata = preset.save(model, vocab, config, cls.image_dir, name="tiny_image")
        cls.image_original = generate(model, {"image": cls.images})
        cls.image_want = generate(float16_rounded(model), {"image": cls.images})

        model, vocab, config = tiny_feature_model()
        cls.feature_dir = os.path.join(cls.root, "tiny_features")
        preset.save(model, vocab, config, cls.feature_dir, name="tiny_features")
        cls.feature_want = generate(float16_rounded(model), {"features": cls.features})

    def copy(self, source):
        target = os.path.join(tempfile.mkdtemp(dir=self.root), os.path.basename(source))
        shutil.copytree(source, target)
        return target

    def test_image_model_round_trip(self):
        model, vocab, config = inference.load_preset(self.image_dir)
        got = generate(model, {"image": self.images})
        self.assertAllEqual(got.tokens, self.image_want.tokens)
        self.assertAllEqual(got.length, self.image_want.length)
        self.assertAllClose(got.log_prob, self.image_want.log_prob, atol=1e-5)
        # float16 weights leave these captions as the float32 model wrote them.
        self.assertAllEqual(got.tokens, self.image_original.tokens)
        self.assertGreater(len({tuple(t) for t in got.tokens}), 1)
        self.assertEqual(vocab.words, WORDS)
        self.assertEqual((config.hidden_dim, config.embed_dim), (16, 8))
        self.assertEqual({v.dtype for v in model.weights}, {"float32"})
        self.assertEqual(self.image_metadata["model"]["encoder_in_weights"], True)

        with np.load(os.path.join(self.image_dir, preset.WEIGHTS_FILE)) as stored:
            self.assertEqual({stored[k].dtype for k in stored.files}, {np.dtype(np.float16)})
            self.assertIn("decoder/init_h/kernel", stored.files)
            self.assertIn("encoder/conv0/kernel", stored.files)
            self.assertEqual(
                self.image_metadata["model"]["parameters"],
                sum(stored[k].size for k in stored.files),
            )
            again = os.path.join(self.root, "saved_again")
            preset.save(model, vocab, config, again, name="tiny_image")
            with np.load(os.path.join(again, preset.WEIGHTS_FILE)) as resaved:
                self.assertCountEqual(resaved.files, stored.files)
                for key in stored.files:
                    self.assertAllEqual(resaved[key], stored[key])

    def test_feature_model_round_trip(self):
        model, _, config = inference.load_preset(self.feature_dir)
        self.assertIsNone(model.encoder)
        self.assertEqual((model.grid, model.feature_dim), (FEATURE_GRID, FEATURE_SHAPE[1]))
        self.assertTrue(config.use_feature_cache)
        got = generate(model, {"features": self.features})
        self.assertAllEqual(got.tokens, self.feature_want.tokens)
        self.assertAllClose(got.log_prob, self.feature_want.log_prob, atol=1e-5)
        self.assertGreater(len({tuple(t) for t in got.tokens}), 1)
        with open(os.path.join(self.feature_dir, preset.FEATURES_FILE)) as f:
            features = json.load(f)
        self.assertEqual(features["feature_shape"], list(FEATURE_SHAPE))
        self.assertEqual(features["grid"], list(FEATURE_GRID))

    def test_metadata(self):
        metadata = preset.verify(self.image_dir)
        self.assertEqual(metadata["name"], "tiny_image")
        self.assertEqual(metadata["vocab_fingerprint"], vocab_lib.Vocab(WORDS).fingerprint)
        self.assertCountEqual(
            metadata["files"], [preset.WEIGHTS_FILE, preset.VOCAB_FILE, preset.CONFIG_FILE]
        )
        for name, entry in metadata["files"].items():
            path = os.path.join(self.image_dir, name)
            self.assertEqual(entry["bytes"], os.path.getsize(path))
            with open(path, "rb") as f:
                self.assertEqual(entry["sha256"], hashlib.sha256(f.read()).hexdigest())
        self.assertIn(preset.FEATURES_FILE, preset.verify(self.feature_dir)["files"])

    def test_shipped_names(self):
        shipped = tempfile.mkdtemp(dir=self.root)
        with mock.patch.object(preset, "PRESETS_DIR", shipped):
            self.assertEqual(preset.names(), [])
            with self.assertRaisesRegex(ValueError, r"unknown preset 'tiny_image'; .*none"):
                inference.load_preset("tiny_image")
            shutil.copytree(self.image_dir, os.path.join(shipped, "tiny_image"))
            os.makedirs(os.path.join(shipped, ".tiny.tmp123"))
            self.assertEqual(preset.names(), ["tiny_image"])
            model, _, _ = inference.load_preset("tiny_image")
            got = generate(model, {"image": self.images})
            self.assertAllEqual(got.tokens, self.image_want.tokens)
            with self.assertRaisesRegex(
                ValueError, r"^unknown preset 'flickr8k'; shipped presets: tiny_image; or give"
            ):
                inference.load_preset("flickr8k")
        with self.assertRaisesRegex(ValueError, r"preset folder \./no/such/folder does not exist"):
            inference.load_preset("./no/such/folder")

    def _bad(self, source, case):
        """Damages a copy of `source` as `case` says."""
        directory = self.copy(source)
        weights = os.path.join(directory, preset.WEIGHTS_FILE)
        vocab = os.path.join(directory, preset.VOCAB_FILE)
        config = os.path.join(directory, preset.CONFIG_FILE)
        metadata = os.path.join(directory, preset.METADATA_FILE)
        if case == "weights_flipped":
            flip_byte(weights)
        elif case == "weights_truncated":
            truncate(weights)
        elif case == "weights_missing":
            os.remove(weights)
        elif case == "vocab_replaced":
            vocab_lib.Vocab([*WORDS[:-1], "bottom"]).save(vocab)
        elif case == "vocab_longer":
            vocab_lib.Vocab([*WORDS, "bottom"]).save(vocab)
        elif case == "config_model_field":
            edit_json(config, lambda c: c.update(hidden_dim=32))
        elif case == "config_other_field":
            edit_json(config, lambda c: c.update(beam_size=4))
        elif case == "config_and_metadata":
            edit_json(config, lambda c: c.update(hidden_dim=32))
            rewrite_metadata(directory, lambda m: m["config"].update(hidden_dim=32))
        elif case == "metadata_missing":
            os.remove(metadata)
        elif case == "metadata_truncated":
            truncate(metadata)
        elif case == "metadata_newer":
            rewrite_metadata(directory, lambda m: m.update(format_version=2))
        elif case == "pickled_weights":
            with open(weights, "wb") as f:
                np.savez(f, **{"decoder/init_h/kernel": np.array([{"x": 1}], dtype=object)})
            rewrite_metadata(directory, lambda m: None)
        elif case == "features_missing":
            os.remove(os.path.join(directory, preset.FEATURES_FILE))
        return directory

    @parameterized.named_parameters((case, case, message) for case, message in BAD.items())
    def test_bad_preset_is_refused(self, case, message):
        directory = self._bad(self.image_dir, case)
        with self.assertRaises(ValueError) as raised:
            inference.load_preset(directory)
        text = str(raised.exception)
        self.assertRegex(text, message)
        self.assertIn(directory, text)
        self.assertNotIn("\n", text)

    def test_feature_preset_without_features_json_is_refused(self):
        directory = self._bad(self.feature_dir, "features_missing")
        with self.assertRaisesRegex(ValueError, r"^preset .*: features\.json is missing$"):
            inference.load_preset(directory)

    def test_metadata_from_before_a_later_field(self):
        # A preset made before a checked field existed (`global_context`, `start_state`,
        # `location_prior`) has no such key in its metadata: it was trained with the
        # value of `config.ADDED_FIELDS`, so a config.json without the key loads and one
        # with another value is refused. (The settings of hard attention: below.)
        added = {k: v for k, v in ADDED_FIELDS.items() if k not in HARD_ONLY}
        self.assertEqual(set(added), {"global_context", "start_state", "location_prior"})
        for field, default in added.items():
            directory = self.copy(self.image_dir)
            rewrite_metadata(directory, lambda m, field=field: m["config"].pop(field))
            _, _, config = inference.load_preset(directory)
            self.assertEqual(getattr(config, field), default)
            if isinstance(default, bool):
                changed = not default
            else:
                changed = next(v for v in CHOICES[field] if v != default)
            config_path = os.path.join(directory, preset.CONFIG_FILE)
            edit_json(
                config_path, lambda c, field=field, changed=changed: c.update({field: changed})
            )
            with self.assertRaisesRegex(ValueError, f"{field}={changed!r} in config.json"):
                inference.load_preset(directory)

    def test_hard_preset_from_before_the_gate(self):
        # A hard-attention preset made before `hard_gate` and `hard_decoding` existed
        # names neither, in config.json nor in metadata.json: it had no gate and
        # captioned at argmax alpha (`config.ADDED_FIELDS`), and loads as such.
        model, vocab, config = tiny_model(attention="hard", hard_gate=False, hard_decoding="argmax")
        directory = os.path.join(tempfile.mkdtemp(dir=self.root), "old_hard")
        preset.save(model, vocab, config, directory, name="old_hard")
        want = generate(float16_rounded(model), {"image": self.images})
        path = os.path.join(directory, preset.CONFIG_FILE)
        edit_json(path, lambda c: [c.pop(k) for k in ("hard_gate", "hard_decoding")])
        rewrite_metadata(directory, lambda m: m["config"].pop("hard_gate"))
        loaded, _, loaded_config = inference.load_preset(directory)
        self.assertEqual((loaded_config.hard_gate, loaded_config.hard_decoding), (False, "argmax"))
        self.assertIsNone(loaded.decoder.beta)
        got = generate(loaded, {"image": self.images})
        self.assertAllEqual(got.tokens, want.tokens)

    def test_shipped_configs_lack_later_fields_and_load(self):
        # The shipped presets' config.json were written before `tags`, `global_context`,
        # ... (and `block_repeats`, which `sat-make-preset --choose_decoding` writes with
        # the rest of the decoding it chooses): each missing setting takes its
        # `ADDED_FIELDS` value, else Config's default, and the files stay as shipped.
        names = {f.name for f in dataclasses.fields(Config)}
        for name in preset.names():
            path = os.path.join(preset.PRESETS_DIR, name, preset.CONFIG_FILE)
            with open(path, encoding="utf-8") as f:
                values = json.load(f)
            missing = names - set(values)
            self.assertContainsSubset({"tags", "global_context"}, missing)
            config = Config.load(path)
            for field in missing:
                expected = ADDED_FIELDS.get(field, getattr(Config, field))
                if field in HARD_ONLY and values["attention"] != "hard":
                    expected = getattr(Config, field)
                self.assertEqual(getattr(config, field), expected, (name, field))
            preset.verify(os.path.join(preset.PRESETS_DIR, name))

    def test_save_refuses(self):
        model, vocab, config = tiny_model()
        with self.assertRaisesRegex(ValueError, r"preset name 'Tiny Model' must be lowercase"):
            preset.save(model, vocab, config, os.path.join(self.root, "x"), name="Tiny Model")
        model.decoder.init_h.bias.assign(np.full([16], 1e5, np.float32))
        with self.assertRaisesRegex(ValueError, r"weight decoder/init_h/bias holds 100000"):
            preset.save(model, vocab, config, os.path.join(self.root, "y"), name="y")

    def test_pack_is_deterministic(self):
        first, second = (os.path.join(self.root, f"{n}.tar.gz") for n in ("first", "second"))
        digest = publish.pack(self.image_dir, first)
        self.assertEqual(publish.pack(self.image_dir, second), digest)
        self.assertEqual(files.sha256_of(first), digest)


def tiny_workdir(root):
    """A workdir of `tiny_model` whose config names a tiny shapes dataset in `root`."""
    model, vocab, config = tiny_model()
    config = dataclasses.replace(
        config, data_dir=os.path.join(root, "shapes"), num_train=12, num_val=2, num_test=4
    )
    workdir = os.path.join(root, "run")
    os.makedirs(workdir)
    config.save(os.path.join(workdir, inference.CONFIG_FILE))
    vocab.save(os.path.join(workdir, inference.VOCAB_FILE))
    model.save_weights(os.path.join(workdir, inference.BEST_WEIGHTS))
    workdir_lib.write_best_info(
        workdir, vocab, epoch=3, selected_on="val_cider", val_bleu4=0.5, val_cider=1.25
    )
    return workdir


class MakePresetTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = without_java(self)

    def test_make_evaluates_the_float16_preset(self):
        root = self.root
        workdir = tiny_workdir(root)
        presets = os.path.join(root, "presets")
        commands = dict(train_command="python scripts/train.py x", make_command="python m.py y")
        metadata = publish.make(workdir, presets, "tiny", description="a tiny one", **commands)
        self.assertEqual(os.listdir(presets), ["tiny"])
        self.assertEqual(preset.verify(os.path.join(presets, "tiny")), metadata)
        self.assertEqual(metadata["trained_with"], "python scripts/train.py x")
        self.assertEqual(metadata["made_with"], "python m.py y")
        self.assertEqual(
            metadata["trained_model"],
            {"best_epoch": 3, "val_bleu4": 0.5, "val_cider": 1.25, "selected_on": "val_cider"},
        )
        self.assertIn("cpu", metadata["measured_on"])
        scores = metadata["scores"]
        self.assertEqual((scores["split"], scores["dataset"]), ("test", "shapes"))
        for beam in preset.BEAM_SIZES:
            for key in ("BLEU-4", "CIDEr", "ROUGE-L", "paper BLEU-4 (no BP)"):
                self.assertIn(key, scores[f"beam_{beam}"])

        # The stored scores are those of the loaded preset, evaluated again.
        model, vocab, config = inference.load_preset(os.path.join(presets, "tiny"))
        outputs = os.path.join(root, "outputs")
        again = scoring.evaluate_images(model, vocab, config, outputs, "test", 3)
        self.assertEqual(publish.score_differences(scores["beam_3"], again), [])
        self.assertEqual(publish.stored_scores(metadata, 3), scores["beam_3"])
        self.assertIsNone(publish.stored_scores(metadata, 3, split="val"))
        self.assertNotEqual(publish.score_differences(scores["beam_3"], scores["beam_1"]), [])
        with self.assertRaisesRegex(ValueError, r"lies in the dataset folder"):
            scoring.evaluate_images(
                model, vocab, config, os.path.join(config.data_dir, "out"), "test"
            )

        with self.assertRaisesRegex(ValueError, r"tiny exists; pass --overwrite"):
            publish.make(workdir, presets, "tiny", **commands)
        with mock.patch.object(preset, "MAX_BYTES", 1000):
            with self.assertRaisesRegex(ValueError, r"would take 0\.\d MB, more than the 0 MB"):
                publish.make(workdir, presets, "tiny", overwrite=True, **commands)
        self.assertEqual(os.listdir(presets), ["tiny"])
        self.assertEqual(preset.verify(os.path.join(presets, "tiny")), metadata)
        os.makedirs(os.path.join(presets, "other"))
        with self.assertRaisesRegex(ValueError, r"other exists and is not a preset"):
            publish.make(workdir, presets, "other", overwrite=True, **commands)

    def test_rescore_measures_the_stored_scores_again(self):
        root = self.root
        presets = os.path.join(root, "presets")
        commands = dict(train_command="python scripts/train.py x", make_command="python m.py y")
        made = publish.make(tiny_workdir(root), presets, "tiny", **commands)
        folder = os.path.join(presets, "tiny")
        stale = json.loads(json.dumps(made))
        for beam in preset.BEAM_SIZES:
            stale["scores"][f"beam_{beam}"]["BLEU-4"] = -1.0
        preset.write_metadata(folder, stale)
        weights = files.sha256_of(os.path.join(folder, preset.WEIGHTS_FILE))
        again = publish.rescore(folder, command="sat-make-preset --rescore=tiny")
        self.assertEqual(again["rescored_with"], "sat-make-preset --rescore=tiny")
        for beam in preset.BEAM_SIZES:
            key = f"beam_{beam}"
            self.assertEqual(
                publish.score_differences(made["scores"][key], again["scores"][key]), []
            )
        self.assertEqual(preset.verify(folder), again)
        self.assertEqual(files.sha256_of(os.path.join(folder, preset.WEIGHTS_FILE)), weights)

    def test_grounding_scores_are_stored_in_the_metadata(self):
        root = self.root
        presets = os.path.join(root, "presets")
        commands = dict(train_command="python scripts/train.py x", make_command="python m.py y")
        publish.make(tiny_workdir(root), presets, "tiny", **commands)
        folder = os.path.join(presets, "tiny")
        report = {"hit": 0.6, "centre": 0.5, "random": 0.3, "mass": 0.45, "area_share": 0.3}
        report.update(words=48, photos=80, per_category={"person": {}})
        stored = publish.store_grounding(folder, report, {"coco_dir": "mini", "beam_size": 3})
        want = {k: report[k] for k in publish.GROUNDING_KEYS}
        self.assertEqual(stored["grounding"], {**want, "coco_dir": "mini", "beam_size": 3})
        self.assertEqual(preset.verify(folder)["grounding"], stored["grounding"])
        # A report that splits off the off-centre words keeps that split too.
        off_centre = {"words": 17, "photos": 12, "hit": 0.18, "centre": 0.0, "random": 0.1}
        stored = publish.store_grounding(folder, {**report, "off_centre": off_centre}, {})
        self.assertEqual(stored["grounding"], {**want, "off_centre": off_centre})
        self.assertEqual(preset.verify(folder)["grounding"], stored["grounding"])
        # And the interval of hit - centre (none when no word was scored).
        interval = {"mean": 0.1, "low": -0.05, "high": 0.2, "level": 0.95, "photos": 40}
        stored = publish.store_grounding(folder, {**report, "hit_minus_centre": interval}, {})
        self.assertEqual(stored["grounding"], {**want, "hit_minus_centre": interval})
        stored = publish.store_grounding(folder, {**report, "hit_minus_centre": None}, {})
        self.assertEqual(stored["grounding"], want)
        del report["mass"]
        with self.assertRaisesRegex(ValueError, r"missing \['mass'\]"):
            publish.store_grounding(folder, report, {})


class ModelSourceFlagsTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("workdir", ["--workdir=runs/a"], ("workdir", "runs/a")),
        ("preset", ["--preset=flickr8k"], ("preset", "flickr8k")),
    )
    def test_one_source(self, args, want):
        values = flags.FlagValues()
        flags_lib.define_model_source(values)
        values(["prog", *args])
        self.assertEqual(flags_lib.model_source(values), want)

    @parameterized.named_parameters(
        ("both", ["--workdir=runs/a", "--preset=p"], r"give --workdir or --preset, not both"),
        ("neither", [], r"give --workdir=<a trained workdir> or --preset="),
    )
    def test_exactly_one_source(self, args, message):
        values = flags.FlagValues()
        flags_lib.define_model_source(values)
        values(["prog", *args])
        with self.assertRaisesRegex(ValueError, message):
            flags_lib.model_source(values)


def run_scripts(runs, cwd):
    """Runs `{key: [script, *args]}` (paths from the repository root) in parallel.

    Returns:
      {key: (exit code, stdout, stderr)}.
    """
    procs = {
        key: subprocess.Popen(
            [sys.executable, os.path.join(ROOT, script), *args],
            cwd=cwd,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key, (script, *args) in runs.items()
    }
    results = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        results[key] = (proc.returncode, stdout, stderr)
    return results


def save_tiny_preset(cls):
    """For a test class's `setUpClass`: `tiny_model()` saved as the preset "tiny" in
    `cls.directory`, below a temporary `cls.root` removed after the class. Returns the
    model, vocabulary and config saved."""
    cls.root = tempfile.mkdtemp()
    cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
    model, vocab, config = tiny_model()
    cls.directory = os.path.join(cls.root, "tiny")
    preset.save(model, vocab, config, cls.directory, name="tiny")
    return model, vocab, config


class PresetScriptsTest(tf.test.TestCase):
    """caption.py, evaluate.py and export.py with --preset, on a tiny preset."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        model, vocab, _ = save_tiny_preset(cls)
        cls.want = generate(float16_rounded(model), {"image": scenes(0, 4).astype(np.float32)})
        cls.vocab = vocab
        cls.photo = os.path.join(cls.root, "photo.png")
        from PIL import Image

        Image.fromarray(scenes(0, 1)[0]).save(cls.photo)

    def test_caption_with_a_preset(self):
        code, stdout, stderr = run_main(
            caption_cli.main, "sat-caption", self.photo, f"--preset={self.directory}", cwd=self.root
        )
        self.assertEqual(code, 0, stderr[-2000:])
        n = int(self.want.length[0])
        words = " ".join(self.vocab.decode(self.want.tokens[0][:n]))
        self.assertIn(f"{self.photo}: {words}\n", stdout)

    @pytest.mark.slow
    def test_evaluate_and_export_with_a_preset(self):
        workdir = tiny_workdir(self.root)
        presets = os.path.join(self.root, "made")
        commands = dict(train_command="train", make_command="make")
        metadata = publish.make(workdir, presets, "tiny", **commands)
        made = os.path.join(presets, "tiny")
        outputs = os.path.join(self.root, "evaluation")
        export = os.path.join(self.root, "export")
        results = run_scripts(
            {
                "evaluate": ["scripts/evaluate.py", f"--preset={made}", f"--output_dir={outputs}"],
                "export": [
                    "export/export.py",
                    f"--preset={made}",
                    f"--output={export}",
                    "--tflite",
                    "--quantize=dynamic",
                ],
            },
            self.root,
        )
        for key in results:
            self.assertEqual(results[key][0], 0, results[key][2][-2000:])
        with open(os.path.join(outputs, "metrics_test.json")) as f:
            scores = json.load(f)
        self.assertEqual(publish.score_differences(metadata["scores"]["beam_1"], scores), [])
        self.assertIn("beam 1: these are equal", results["evaluate"][1])
        for name in ("saved_model.pb", "caption.tflite", "caption_int8.tflite"):
            self.assertTrue(os.path.exists(os.path.join(export, name)), name)


def _first_test_photo():
    listing = os.path.join(FLICKR8K, "Flickr_8k.testImages.txt")
    if not os.path.exists(listing):
        return None
    with open(listing, encoding="utf-8") as f:
        name = next(line.strip() for line in f if line.strip())
    path = os.path.join(FLICKR8K, "Flicker8k_Dataset", name)
    return path if os.path.exists(path) else None


# Run in a fresh interpreter from an empty folder: only the installed package is importable.
CAPTION_SCRIPT = """
import json
import sys

import numpy as np

from sat_tf.serving import inference
from sat_tf.data import image_io
from sat_tf.serving.inference import feature_encoder

photo, names = sys.argv[1], sys.argv[2:]
captions = {}
for name in names:
    model, vocab, config = inference.load_preset(name)
    image = image_io.load_image_file(photo, config.image_size, config.effective_crop_fraction)
    encoder = feature_encoder(model, config) if model.encoder is None else None
    out = inference.make_caption_fn(model, config, 1, encoder)({"image": image.numpy()[None]})
    captions[name] = vocab.decode(out.tokens[0][: int(out.length[0])].numpy())
print(json.dumps(captions))
"""


class ShippedPresetTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        if not preset.names():
            self.skipTest(
                f"no preset is shipped yet: {preset.PRESETS_DIR} holds none (make one with "
                "scripts/make_preset.py)"
            )

    def need_photos(self):
        self.photo = _first_test_photo()
        if self.photo is None:
            self.skipTest(
                f"no Flickr8k test photo under {os.path.abspath(FLICKR8K)} (set SAT_TF_FLICKR8K "
                "to the folder of Flickr_8k.testImages.txt and Flicker8k_Dataset/)"
            )

    def test_shipped_presets_are_complete(self):
        for name in preset.names():
            folder = os.path.join(preset.PRESETS_DIR, name)
            metadata = preset.verify(folder)
            self.assertEqual(metadata["name"], name)
            size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
            self.assertLessEqual(size, preset.MAX_BYTES, name)
            self.assertNotEmpty(metadata["trained_with"], name)
            self.assertNotEmpty(metadata["made_with"], name)
            self.assertIn("cpu", metadata["measured_on"], name)
            self.assertEqual(metadata["model"]["weights_dtype"], "float16")
            for beam in preset.BEAM_SIZES:
                scores = publish.stored_scores(metadata, beam)
                for key in (
                    "BLEU-1",
                    "BLEU-4",
                    "METEOR",
                    "ROUGE-L",
                    "CIDEr",
                    "paper BLEU-4 (no BP)",
                ):
                    self.assertIn(key, scores, f"{name} beam {beam}")

    def test_fresh_process_captions_a_flickr8k_photo(self):
        self.need_photos()
        cwd = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, cwd, ignore_errors=True)
        env = {k: v for k, v in ENV.items() if not k.startswith("PYTHON")}
        # One process captions with every preset: each loads from the installed package.
        done = subprocess.run(
            [sys.executable, "-c", CAPTION_SCRIPT, self.photo, *preset.names()],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        captions = json.loads(done.stdout.strip().splitlines()[-1])
        self.assertCountEqual(captions, preset.names())
        for name, words in captions.items():
            self.assertNotEmpty(words, name)
            vocab = vocab_lib.Vocab.load(os.path.join(preset.PRESETS_DIR, name, preset.VOCAB_FILE))
            self.assertContainsSubset(words, set(vocab.words) - set(vocab_lib.SPECIALS))

    @pytest.mark.slow
    def test_evaluate_reproduces_the_stored_metrics(self):
        self.need_photos()
        outputs = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, outputs, ignore_errors=True)
        for name in preset.names():
            metadata = preset.verify(os.path.join(preset.PRESETS_DIR, name))
            runs = {
                beam: [
                    "scripts/evaluate.py",
                    f"--preset={name}",
                    f"--data_dir={FLICKR8K}",
                    "--split=test",
                    f"--beam_size={beam}",
                    f"--output_dir={os.path.join(outputs, name, str(beam))}",
                ]
                for beam in preset.BEAM_SIZES
            }
            for beam, (code, stdout, stderr) in run_scripts(runs, outputs).items():
                self.assertEqual(code, 0, stderr[-3000:])
                folder = os.path.join(outputs, name, str(beam))
                (metrics_file,) = [f for f in os.listdir(folder) if f.startswith("metrics_test")]
                with open(os.path.join(folder, metrics_file)) as f:
                    scores = json.load(f)
                stored = publish.stored_scores(metadata, beam)
                self.assertEqual(
                    publish.score_differences(stored, scores), [], f"{name} beam {beam}"
                )
                self.assertIn("these are equal", stdout)


if __name__ == "__main__":
    tf.test.main()
