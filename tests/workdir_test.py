"""Tests for sat_tf.training.workdir: a workdir that holds another model, or best weights
selected on another validation score, is refused, and a run starts from another workdir's
weights only where they are this model's."""

import dataclasses
import os
import tempfile

import numpy as np
import tensorflow as tf

from sat_tf.config import Config
from sat_tf.data.vocab import SPECIALS, Vocab
from sat_tf.model.encoder import ImageEncoder
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference
from sat_tf.training import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CheckWorkdirTest(tf.test.TestCase):
    """The gate changes the weights of hard attention only."""

    def _workdir(self, config):
        workdir = self.get_temp_dir()
        workdir_lib.check_workdir(config, workdir)
        return workdir

    def test_hard_gate_must_match(self):
        workdir = self._workdir(Config(attention="hard", hard_gate=False))
        with self.assertRaisesRegex(ValueError, "--hard_gate: workdir has False, this run True"):
            workdir_lib.check_workdir(Config(attention="hard"), workdir)
        workdir_lib.check_workdir(Config(attention="hard", hard_gate=False), workdir)

    def test_hard_gate_is_ignored_for_soft(self):
        workdir = self._workdir(Config(hard_gate=False))
        workdir_lib.check_workdir(Config(), workdir)


class ResumeSelectionTest(tf.test.TestCase):
    """A workdir's best weights are resumed only under the score they were selected on."""

    def _workdir(self, **best_info):
        workdir = tempfile.mkdtemp(dir=self.get_temp_dir())
        workdir_lib.check_workdir(Config(), workdir)
        with open(os.path.join(workdir, inference.BEST_WEIGHTS), "wb") as f:
            f.write(b"weights")
        vocab = Vocab([*SPECIALS, "a"])
        workdir_lib.write_best_info(workdir, vocab, epoch=2, **best_info)
        return workdir

    def test_another_score_is_refused_and_the_config_kept(self):
        cases = [
            ({"selected_on": "val_bleu4", "val_bleu4": 0.2, "val_cider": 0.5}, "cider", "bleu4"),
            ({"selected_on": "val_cider", "val_bleu4": 0.2, "val_cider": 0.5}, "bleu4", "cider"),
            ({"val_bleu4": 0.2}, "cider", "bleu4"),  # written before selected_on existed
        ]
        for info, this_run, kept in cases:
            with self.subTest(info=info, this_run=this_run):
                workdir = self._workdir(**info)
                config_path = os.path.join(workdir, inference.CONFIG_FILE)
                Config(selection_metric=kept).save(config_path)
                message = (
                    f"best.json: best.weights.h5 was selected on val_{kept}, this run selects "
                    f"on val_{this_run}; resume with --selection_metric={kept} "
                )
                with self.assertRaisesRegex(ValueError, message):
                    workdir_lib.check_workdir(Config(selection_metric=this_run), workdir)
                self.assertEqual(Config.load(config_path).selection_metric, kept)
                workdir_lib.check_workdir(Config(selection_metric=kept), workdir)

    def test_weights_not_selected_on_a_score_take_either(self):
        # A run without a validation split keeps its last epoch, with no scores.
        workdir = self._workdir()
        for metric in ("cider", "bleu4"):
            workdir_lib.check_workdir(Config(selection_metric=metric), workdir)

    def test_a_workdir_without_best_weights_takes_either(self):
        workdir = self._workdir(selected_on="val_bleu4", val_bleu4=0.2)
        os.remove(os.path.join(workdir, inference.BEST_WEIGHTS))
        workdir_lib.check_workdir(Config(selection_metric="cider"), workdir)


# A model on cached (4, 6) features of a 2 x 2 grid, small enough to build in a moment.
SMALL = Config(use_feature_cache=True, embed_dim=8, hidden_dim=16, attention_dim=8)
VOCAB = Vocab([*SPECIALS, "a", "red", "square"])


def _model(config, seed):
    model = build_model(config, len(VOCAB), feature_shape=(4, 6), grid=(2, 2))
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    return model


class LoadInitialWeightsTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.source = self.get_temp_dir()
        workdir_lib.check_workdir(SMALL, self.source)  # writes config.json
        self.trained = _model(SMALL, seed=1)
        workdir_lib.save_weights_atomically(
            self.trained, os.path.join(self.source, inference.BEST_WEIGHTS)
        )
        workdir_lib.write_best_info(self.source, VOCAB, epoch=2)

    def test_gated_hard_attention_starts_from_soft_weights(self):
        config = dataclasses.replace(SMALL, attention="hard")
        model = _model(config, seed=2)
        workdir_lib.load_initial_weights(model, config, VOCAB, self.source)
        self.assertEqual(len(model.weights), len(self.trained.weights))
        for got, want in zip(model.weights, self.trained.weights, strict=True):
            self.assertEqual(got.path.split("/", 1)[1], want.path.split("/", 1)[1])
            self.assertAllEqual(got, want)

    def test_other_layers_are_refused(self):
        cases = [
            (
                dataclasses.replace(SMALL, attention="hard", hard_gate=False),
                "--attention: .*, this run hard: their",
            ),
            (dataclasses.replace(SMALL, attention="none"), "--attention: .*, this run none: their"),
            (dataclasses.replace(SMALL, hidden_dim=32), "--hidden_dim: .* has 16, this run 32"),
        ]
        for config, message in cases:
            model = _model(config, seed=3)
            with self.assertRaisesRegex(ValueError, f"holds another model:\\n  {message}"):
                workdir_lib.load_initial_weights(model, config, VOCAB, self.source)

    def test_another_vocabulary_is_refused(self):
        other = Vocab([*SPECIALS, "a", "blue", "circle"])
        model = _model(SMALL, seed=4)
        with self.assertRaisesRegex(
            ValueError, r"trained with another vocabulary.*this run's vocabulary has 7 words"
        ):
            workdir_lib.load_initial_weights(model, SMALL, other, self.source)

    def test_unfinished_workdir_is_named(self):
        os.remove(os.path.join(self.source, inference.BEST_WEIGHTS))
        with self.assertRaisesRegex(
            ValueError, f"--init_from={self.source} is not a finished workdir: best.weights.h5"
        ):
            workdir_lib.load_initial_weights(_model(SMALL, 5), SMALL, VOCAB, self.source)


class FineTuneFromCachedFeaturesTest(tf.test.TestCase):
    """A decoder trained on cached features starts a run that trains its encoder too."""

    def setUp(self):
        super().setUp()
        # The "pretrained" encoder: a shapes CNN whose weights a file holds.
        encoder = ImageEncoder("shapes_cnn", 32)
        encoder.build((None, 32, 32, 3))
        rng = np.random.default_rng(0)
        for w in encoder.weights:
            w.assign(rng.uniform(0.5, 1.5, size=w.shape).astype(np.float32))
        self.encoder_path = os.path.join(self.get_temp_dir(), "encoder.weights.h5")
        encoder.net.save_weights(self.encoder_path)
        self.images = rng.uniform(0, 255, size=(2, 32, 32, 3)).astype(np.float32)
        self.features = encoder(self.images)  # (2, 16, 50): 4 x 4 cells
        self.config = dataclasses.replace(
            SMALL,
            image_size=32,
            encoder_weights=self.encoder_path,
            use_feature_cache=False,
            fine_tune_encoder=True,
        )
        cached = dataclasses.replace(self.config, use_feature_cache=True)
        self.source = os.path.join(self.get_temp_dir(), "cached")
        workdir_lib.check_workdir(cached, self.source)
        self.trained = build_model(cached, len(VOCAB), feature_shape=(16, 50), grid=(4, 4))
        for w in self.trained.weights:
            w.assign(rng.normal(size=w.shape).astype(np.float32))
        workdir_lib.save_weights_atomically(
            self.trained, os.path.join(self.source, inference.BEST_WEIGHTS)
        )
        workdir_lib.write_best_info(self.source, VOCAB, epoch=2)

    def test_starts_with_the_trained_decoder_over_the_pretrained_encoder(self):
        model = build_model(self.config, len(VOCAB))
        encoder_before = [w.numpy() for w in model.encoder.weights]
        workdir_lib.load_initial_weights(model, self.config, VOCAB, self.source)
        for got, want in zip(model.encoder.weights, encoder_before, strict=True):
            self.assertAllEqual(got, want)
        for got, want in zip(model.decoder.weights, self.trained.decoder.weights, strict=True):
            self.assertAllEqual(got, want)
        # The whole model on images gives the trained model's outputs on their features.
        caption = tf.constant([[1, 4, 5, 6, 2], [1, 5, 6, 2, 0]])
        from_images = model({"image": self.images, "caption": caption})
        from_features = self.trained({"features": self.features, "caption": caption})
        self.assertAllClose(from_images, from_features, atol=1e-5)
        # Training keeps the pretrained encoder's batch-normalisation statistics.
        encoded = model.encode({"image": self.images}, training=True)
        self.assertAllClose(encoded, self.features, atol=1e-5)

    def test_a_grown_vocabulary_over_the_pretrained_encoder(self):
        VOCAB.save(os.path.join(self.source, inference.VOCAB_FILE))
        grown = Vocab([*VOCAB.words, "blue", "circle"])
        model = build_model(self.config, len(grown))
        encoder_before = [w.numpy() for w in model.encoder.weights]
        workdir_lib.load_initial_weights(model, self.config, grown, self.source)
        for got, want in zip(model.encoder.weights, encoder_before, strict=True):
            self.assertAllEqual(got, want)
        # Old words but <unk> (3) keep their log-probabilities; <unk> and the two new
        # words share <unk>'s.
        caption = tf.constant([[1, 4, 3, 6, 2], [1, 5, 8, 2, 0]])
        source_caption = tf.where(caption >= len(VOCAB), 3, caption)
        mine = tf.nn.log_softmax(model({"image": self.images, "caption": caption})["logits"])
        theirs = self.trained({"features": self.features, "caption": source_caption})["logits"]
        theirs = tf.nn.log_softmax(theirs)
        self.assertAllClose(mine[..., :3], theirs[..., :3], atol=1e-4)
        self.assertAllClose(mine[..., 4:7], theirs[..., 4:], atol=1e-4)
        shared = tf.reduce_logsumexp(tf.gather(mine, [3, 7, 8], axis=-1), axis=-1)
        self.assertAllClose(shared, theirs[..., 3], atol=1e-4)
        self.assertAllClose(mine[..., 7], theirs[..., 3] - np.log(3.0), atol=1e-4)

    def test_features_of_another_encoder_or_crop_are_refused(self):
        other = os.path.join(self.get_temp_dir(), "other.weights.h5")
        cases = [
            ({"encoder_weights": other}, f"--encoder_weights: .* has .*, this run '{other}'"),
            ({"crop_fraction": 0.5}, "--crop_fraction: .*cropped to 1, this run crops to 0.5"),
        ]
        for change, message in cases:
            config = dataclasses.replace(self.config, **change)
            model = build_model(self.config, len(VOCAB))
            with self.assertRaisesRegex(ValueError, f"holds another model:\\n  {message}"):
                workdir_lib.load_initial_weights(model, config, VOCAB, self.source)

    def test_a_fine_tuned_run_does_not_start_a_run_on_cached_features(self):
        source = os.path.join(self.get_temp_dir(), "images")
        workdir_lib.check_workdir(self.config, source)
        model = build_model(self.config, len(VOCAB))
        workdir_lib.save_weights_atomically(model, os.path.join(source, inference.BEST_WEIGHTS))
        workdir_lib.write_best_info(source, VOCAB, epoch=1)
        with self.assertRaisesRegex(ValueError, "--use_feature_cache: .* has False, this run True"):
            workdir_lib.load_initial_weights(self.trained, self.trained_config(), VOCAB, source)

    def trained_config(self):
        return dataclasses.replace(self.config, use_feature_cache=True)


if __name__ == "__main__":
    tf.test.main()


class RunConfigTest(tf.test.TestCase):
    """`run_config`: the settings of a run on a user's folder, from scratch or a source."""

    def test_a_folder_from_scratch_takes_the_grid_presets_recipe(self):
        from sat_tf.serving import preset

        recipe = preset.read(workdir_lib.FOLDER_RECIPE).config
        config = workdir_lib.run_config(
            Config(dataset="folder", data_dir="/photos", learning_rate=5e-4),
            {"dataset", "data_dir", "learning_rate"},
        )
        self.assertEqual(config.encoder, "efficientnet_lite0_head_dilated")
        for name in ("encoder", "encoder_weights", "image_size", "hidden_dim", "vocab_size"):
            self.assertEqual(getattr(config, name), getattr(recipe, name), name)
        self.assertTrue(config.use_feature_cache)
        self.assertEqual(config.beam_size, recipe.beam_size)
        self.assertEqual(config.learning_rate, 5e-4)  # given: kept
        self.assertEqual(config.selection_metric, "cider")
        self.assertEqual(config.epochs, workdir_lib.FOLDER_SETTINGS["epochs"])
        self.assertEqual(config.data_dir, "/photos")

    def test_a_folder_from_a_source_keeps_the_sources_model(self):
        source = tempfile.mkdtemp()
        saved = Config(encoder="shapes_cnn", image_size=112, hidden_dim=16, beam_size=2)
        saved.save(os.path.join(source, "config.json"))
        config = workdir_lib.run_config(
            Config(dataset="folder", init_from=source, epochs=2), {"dataset", "init_from", "epochs"}
        )
        # The source's model and decoding, the recipe's optimisation, the given epochs.
        self.assertEqual(
            (config.encoder, config.hidden_dim, config.beam_size), ("shapes_cnn", 16, 2)
        )
        self.assertEqual(config.dropout, 0.5)
        self.assertEqual(config.epochs, 2)
        with self.assertRaisesRegex(ValueError, "--hidden_dim=32 contradicts --init_from="):
            workdir_lib.run_config(
                Config(dataset="folder", init_from=source, hidden_dim=32),
                {"dataset", "init_from", "hidden_dim"},
            )

    def test_other_datasets_are_left_as_given(self):
        config = Config(dataset="shapes", epochs=1)
        self.assertEqual(workdir_lib.run_config(config, {"epochs"}), config)


class CopyTagTableTest(tf.test.TestCase):
    def test_the_sources_table_is_copied_byte_for_byte(self):
        source, workdir = tempfile.mkdtemp(), tempfile.mkdtemp()
        with open(os.path.join(source, inference.BEST_INFO), "w") as f:
            f.write("{}")
        self.assertFalse(workdir_lib.copy_tag_table(source, workdir))
        self.assertEqual(os.listdir(workdir), [])
        table = "class\tword\nn02123045\tcat|kitty\n"
        with open(os.path.join(source, "tags.tsv"), "w", encoding="utf-8") as f:
            f.write(table)
        self.assertTrue(workdir_lib.copy_tag_table(source, workdir))
        with open(os.path.join(workdir, "tags.tsv"), encoding="utf-8") as f:
            self.assertEqual(f.read(), table)

    def test_a_shipped_presets_table(self):
        workdir = tempfile.mkdtemp()
        self.assertTrue(workdir_lib.copy_tag_table("flickr8k_lite0_grid14_soft", workdir))
        from sat_tf.serving import preset

        shipped = os.path.join(preset.resolve("flickr8k_lite0_grid14_soft"), "tags.tsv")
        with open(shipped, "rb") as a, open(os.path.join(workdir, "tags.tsv"), "rb") as b:
            self.assertEqual(a.read(), b.read())
