"""Fine-tuning `--init_from` a model of another vocabulary: the vocabulary grown on the new
data, the word weights grown so that the source's probabilities hold, a vocabulary that
does not start with the source's refused, and the settings taken from the source."""

import dataclasses
import io
import json
import os
import re

import numpy as np
import tensorflow as tf
from fixtures import scenes, tiny_model
from PIL import Image

from sat_tf.config import Config
from sat_tf.data.vocab import SPECIALS, UNK_ID, Vocab
from sat_tf.model.show_attend_tell import build_model
from sat_tf.serving import inference, preset
from sat_tf.training import train_lib
from sat_tf.training import workdir as workdir_lib

# A model on cached (4, 6) features of a 2 x 2 grid.
SMALL = Config(use_feature_cache=True, embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0)
SOURCE = Vocab([*SPECIALS, "a", "red", "square", "on", "top"])
# Three words that SOURCE lacks, appended after its 9.
GROWN = Vocab([*SOURCE.words, "blue", "circle", "dog"])


def _random_weights(model, seed):
    rng = np.random.default_rng(seed)
    for w in model.weights:
        w.assign(rng.normal(size=w.shape).astype(np.float32))
    return model


def _save_workdir(workdir, config, vocab, model):
    """A finished workdir of `model`: config.json, vocab.txt, best weights and best.json."""
    workdir_lib.check_workdir(config, workdir)
    workdir_lib.save_weights_atomically(model, os.path.join(workdir, inference.BEST_WEIGHTS))
    workdir_lib.write_best_info(workdir, vocab, epoch=1)
    vocab.save(os.path.join(workdir, inference.VOCAB_FILE))


def _fine_tuning(root, source_config, model):
    """The settings of a run on a Flickr8k-layout folder of `CAPTIONS` fine-tuned from a
    finished workdir of `model` (`source_config`, `SOURCE`) with the words seen twice
    added: dataset, data_dir, cache_dir, init_from, new_word_min_count; the two folders
    are made under `root`."""
    source = os.path.join(root, "source")
    _save_workdir(source, source_config, SOURCE, model)
    data_dir = os.path.join(root, "data")
    _write_flickr8k(data_dir, CAPTIONS)
    return dict(
        dataset="flickr8k",
        data_dir=data_dir,
        cache_dir=os.path.join(root, "cache"),
        init_from=source,
        new_word_min_count=2,
    )


def _log_softmax(logits):
    """float64 log-probabilities of (..., V) logits."""
    logits = np.asarray(logits, np.float64)
    top = logits.max(axis=-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


class GrowWordWeightsTest(tf.test.TestCase):
    def test_a_hand_computed_case(self):
        # V = 5 (ids 0..3 special, 4 a word), m = 2, k = 3: log(k + 1) = log 4.
        embedding = np.arange(10, dtype=np.float32).reshape(5, 2)
        kernel = np.arange(10, 20, dtype=np.float32).reshape(2, 5)
        bias = np.array([0.0, 1.0, 2.0, 3.0, 4.0], np.float32)
        grown = workdir_lib.grow_word_weights(embedding, kernel, bias, 3)
        self.assertAllEqual(grown[0], [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]] + [[6, 7]] * 3)
        self.assertAllEqual(
            grown[1], [[10, 11, 12, 13, 14, 13, 13, 13]] + [[15, 16, 17, 18, 19] + [18] * 3]
        )
        log4 = np.log(4.0)
        self.assertAllClose(grown[2], [0, 1, 2, 3 - log4, 4] + [3 - log4] * 3, atol=1e-6)
        self.assertEqual(grown[2].dtype, np.float32)
        # The source's arrays are left as they were.
        self.assertEqual(bias[UNK_ID], 3.0)


class GrownVocabularyTest(tf.test.TestCase):
    """A source grown by k words gives the source's probabilities: each old word but
    `<unk>` keeps its own, `<unk>` and the new words share `<unk>`'s."""

    def check_preserved(self, source_logits, grown_logits, k):
        source, grown = _log_softmax(source_logits), _log_softmax(grown_logits)
        old = source.shape[-1]
        self.assertEqual(grown.shape[-1], old + k)
        kept = [i for i in range(old) if i != UNK_ID]
        self.assertAllClose(grown[..., kept], source[..., kept], atol=1e-4, rtol=0)
        shared = [UNK_ID, *range(old, old + k)]
        together = np.log(np.exp(grown[..., shared]).sum(axis=-1))
        self.assertAllClose(together, source[..., UNK_ID], atol=1e-4, rtol=0)
        for i in shared:
            self.assertAllClose(grown[..., i], source[..., UNK_ID] - np.log(k + 1), atol=1e-4)
        # Not a trivial agreement: the words' probabilities differ across the vocabulary.
        self.assertGreater(np.ptp(source[..., kept]), 1.0)

    def check_word_weights(self, model, trained, k):
        old = trained.vocab_size
        embedding = model.decoder.embedding.embeddings.numpy()
        source_embedding = trained.decoder.embedding.embeddings.numpy()
        self.assertAllEqual(embedding[:old], source_embedding)
        self.assertAllEqual(embedding[old:], np.tile(source_embedding[UNK_ID], (k, 1)))
        kernel = model.decoder.deep_output.kernel.numpy()
        self.assertAllEqual(kernel[:, :old], trained.decoder.deep_output.kernel.numpy())
        bias, source_bias = model.decoder.deep_output.bias.numpy(), trained.decoder.deep_output.bias
        kept = [i for i in range(old) if i != UNK_ID]
        self.assertAllEqual(bias[kept], source_bias.numpy()[kept])

    def test_from_a_workdir_on_cached_features(self):
        source = os.path.join(self.get_temp_dir(), "source")
        trained = _random_weights(build_model(SMALL, len(SOURCE), (4, 6), (2, 2)), seed=1)
        _save_workdir(source, SMALL, SOURCE, trained)
        model = _random_weights(build_model(SMALL, len(GROWN), (4, 6), (2, 2)), seed=2)
        workdir_lib.load_initial_weights(model, SMALL, GROWN, source)
        self.check_word_weights(model, trained, 3)
        mine, theirs = (preset.weight_variables(m, with_encoder=True) for m in (model, trained))
        self.assertEqual(mine.keys(), theirs.keys())
        for key in sorted(theirs.keys() - set(workdir_lib.WORD_WEIGHTS)):
            self.assertAllEqual(mine[key], theirs[key], key)

        rng = np.random.default_rng(3)
        features = rng.normal(size=(2, 4, 6)).astype(np.float32)
        # Inputs of old words (<unk> among them), and the same with the new words where
        # the source read <unk>.
        captions = np.array([[1, 4, 3, 5, 6, 2], [1, 3, 7, 3, 8, 2]], np.int32)
        renamed = np.array([[1, 4, 9, 5, 6, 2], [1, 11, 7, 10, 8, 2]], np.int32)
        source_logits = trained({"features": features, "caption": captions})["logits"]
        for inputs in (captions, renamed):
            logits = model({"features": features, "caption": inputs})["logits"]
            self.check_preserved(source_logits, logits, 3)

    def test_from_a_preset_on_images(self):
        trained, vocab, config = tiny_model(attention="soft")
        folder = os.path.join(self.get_temp_dir(), "p")
        preset.save(trained, vocab, config, folder, name="p")
        self.assertEqual(workdir_lib.source_vocab(folder).words, vocab.words)
        grown = Vocab([*vocab.words, "dog", "cat"])
        model = build_model(config, len(grown))
        workdir_lib.load_initial_weights(model, config, grown, folder)
        stored, _, _ = inference.load_preset(folder)  # the float16 weights, as loaded
        self.check_word_weights(model, stored, 2)
        images = scenes(0, 2).astype(np.float32)
        captions = np.array([[1, 4, 3, 6, 2], [1, 3, 3, 5, 2]], np.int32)
        source_logits = stored({"image": images, "caption": captions})["logits"]
        logits = model({"image": images, "caption": captions})["logits"]
        self.check_preserved(source_logits, logits, 2)


class RefusedVocabularyTest(tf.test.TestCase):
    """A run whose vocabulary does not start with the source's words is refused."""

    def setUp(self):
        super().setUp()
        self.source = os.path.join(self.get_temp_dir(), "source")
        trained = _random_weights(build_model(SMALL, len(SOURCE), (4, 6), (2, 2)), seed=1)
        _save_workdir(self.source, SMALL, SOURCE, trained)

    def test_another_order_or_fewer_words(self):
        swapped = [*SPECIALS, "red", "a", "square", "on", "top", "blue"]
        for words in (swapped, SOURCE.words[:-1]):
            vocab = Vocab(words)
            model = build_model(SMALL, len(vocab), (4, 6), (2, 2))
            message = (
                f"--init_from={self.source}: its weights were trained with another vocabulary "
                "than this run's, which does not start with its words: the weights had 9 words "
                f"(fingerprint {SOURCE.fingerprint}), this run's vocabulary has {len(vocab)} "
                f"words (fingerprint {vocab.fingerprint})"
            )
            with self.assertRaisesRegex(ValueError, f"^{re.escape(message)}$"):
                workdir_lib.load_initial_weights(model, SMALL, vocab, self.source)

    def test_a_vocab_txt_that_is_not_the_weights(self):
        Vocab([*SOURCE.words, "extra"]).save(os.path.join(self.source, inference.VOCAB_FILE))
        model = build_model(SMALL, len(GROWN), (4, 6), (2, 2))
        with self.assertRaisesRegex(
            ValueError,
            f"^--init_from={self.source}: vocab.txt is not the vocabulary its weights were "
            "trained with: the weights had 9 words",
        ):
            workdir_lib.load_initial_weights(model, SMALL, GROWN, self.source)

    def test_a_preset_of_another_vocabulary(self):
        trained, vocab, config = tiny_model(attention="soft")
        folder = os.path.join(self.get_temp_dir(), "p")
        preset.save(trained, vocab, config, folder, name="p")
        other = Vocab([*SPECIALS, *reversed(vocab.words[4:])])
        with self.assertRaisesRegex(
            ValueError,
            f"holds another model:\\n  the vocabulary: {vocab.fingerprint} vs this run's "
            f"{other.fingerprint}, which does not start with its words$",
        ):
            workdir_lib.load_initial_weights(build_model(config, len(other)), config, other, folder)


class ConfigFromSourceTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.source = os.path.join(self.get_temp_dir(), "source")
        os.makedirs(self.source)
        self.saved = Config(
            dataset="coco",
            vocab_size=5000,
            encoder="efficientnet_lite0_head_dilated",
            encoder_weights="imagenet",
            image_size=224,
            use_feature_cache=True,
            attention="hard",
            hard_gate=False,
            hidden_dim=512,
            embed_dim=128,
            global_context=True,
            learning_rate=1e-3,
            beam_size=3,
            length_penalty=0.5,
            block_repeats=False,
            block_bad_endings=True,
            tags=False,
            tag_threshold=0.4,
            max_decode_length=20,
        )
        self.saved.save(os.path.join(self.source, inference.CONFIG_FILE))

    def run_config(self, **given):
        base = {"dataset": "flickr8k", "init_from": self.source, "learning_rate": 1e-4}
        config = Config(**{**base, **given})
        return workdir_lib.config_from_source(config, set(base) | set(given), self.source)

    def test_takes_the_sources_model_features_and_decoding(self):
        config = self.run_config(beam_size=5)
        want = dataclasses.replace(
            self.saved,
            dataset="flickr8k",
            vocab_size=10000,
            init_from=self.source,
            learning_rate=1e-4,
            beam_size=5,
        )
        self.assertEqual(config, want)

    def test_a_given_setting_that_agrees_is_kept(self):
        config = self.run_config(
            hidden_dim=512, crop_fraction=224 / 256, attention="hard", use_feature_cache=False
        )
        self.assertEqual((config.hidden_dim, config.crop_fraction), (512, 224 / 256))
        self.assertFalse(config.use_feature_cache)  # a decoder on features starts one on images
        self.assertEqual(config.encoder, "efficientnet_lite0_head_dilated")

    def test_a_fine_tuned_encoder_reads_images(self):
        config = self.run_config(fine_tune_encoder=True)
        self.assertFalse(config.use_feature_cache)
        self.assertEqual(config.encoder_weights, "imagenet")

    def test_a_contradicting_setting_is_refused_in_one_line(self):
        which = f"contradicts --init_from={self.source}, which has"
        cases = [
            (
                {"encoder": "shapes_cnn"},
                f"--encoder=shapes_cnn {which} --encoder=efficientnet_lite0_head_dilated: "
                "leave it out",
            ),
            ({"hidden_dim": 256}, f"--hidden_dim=256 {which} --hidden_dim=512: leave it out"),
            ({"encoder_weights": ""}, f"--encoder_weights='' {which} --encoder_weights=imagenet"),
            ({"crop_fraction": 0.5}, f"--crop_fraction=0.5 {which} --crop_fraction=0.875"),
            ({"hard_gate": True}, f"--hard_gate=True {which} --hard_gate=False"),
            ({"global_context": False}, f"--global_context=False {which} --global_context=True"),
            (
                {"attention": "soft"},
                f"--attention=soft \\(a score and the gate beta\\) {which} --attention=hard "
                "\\(a score, no gate\\): their layers differ",
            ),
        ]
        for given, message in cases:
            with self.subTest(given=given):
                with self.assertRaisesRegex(ValueError, f"^{message}"):
                    self.run_config(**given)

    def test_images_do_not_start_a_run_on_features(self):
        on_images = dataclasses.replace(self.saved, use_feature_cache=False, attention="soft")
        on_images.save(os.path.join(self.source, inference.CONFIG_FILE))
        with self.assertRaisesRegex(
            ValueError, "^--use_feature_cache=True contradicts .*--use_feature_cache=False"
        ):
            self.run_config(use_feature_cache=True)
        # Soft attention starts gated hard attention; hard_gate stays the run's.
        config = self.run_config(attention="hard")
        self.assertEqual((config.attention, config.hard_gate), ("hard", True))
        with self.assertRaisesRegex(ValueError, "^--attention=hard \\(a score, no gate\\) "):
            self.run_config(attention="hard", hard_gate=False)

    def test_a_missing_source_is_named(self):
        missing = os.path.join(self.get_temp_dir(), "missing")
        with self.assertRaisesRegex(
            ValueError, f"^--init_from={missing} is not a finished workdir: config.json is missing$"
        ):
            workdir_lib.config_from_source(Config(init_from=missing), set(), missing)

    def test_from_a_preset(self):
        trained, vocab, config = tiny_model(attention="soft", beam_size=3)
        folder = os.path.join(self.get_temp_dir(), "p")
        preset.save(trained, vocab, config, folder, name="p")
        taken = workdir_lib.config_from_source(Config(init_from=folder), {"init_from"}, folder)
        self.assertEqual((taken.embed_dim, taken.hidden_dim, taken.beam_size), (8, 16, 3))
        self.assertEqual(taken.max_decode_length, config.max_decode_length)


def _write_flickr8k(root, captions):
    """A Karpathy `dataset_flickr8k.json` of training images, one a list of captions."""
    image_dir = os.path.join(root, "Flicker8k_Dataset")
    os.makedirs(image_dir)
    entries = []
    for i, texts in enumerate(captions):
        pixels = np.random.default_rng(i).integers(0, 256, (40, 40, 3), np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG")
        with open(os.path.join(image_dir, f"{i}.jpg"), "wb") as f:
            f.write(buffer.getvalue())
        sentences = [{"raw": t} for t in texts]
        entries.append(
            {"filename": f"{i}.jpg", "imgid": i, "split": "train", "sentences": sentences}
        )
    with open(os.path.join(root, "dataset_flickr8k.json"), "w") as f:
        json.dump({"images": entries}, f)


# dog 4, blue 3, circle 2, the 2, cat 1; "a" and "red" SOURCE has.
CAPTIONS = [
    ["A blue dog.", "a dog, the circle"],
    ["Dog on top", "the blue circle"],
    ["blue dog, red cat"],
]


class FineTuneTest(tf.test.TestCase):
    def test_one_step_from_a_workdir_on_data_of_other_words(self):
        # At a learning rate too small to move them, the run's best weights are the
        # source's grown ones, which fresh weights could not be.
        root = self.get_temp_dir()
        settings = dict(image_size=32, embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0)
        source_config = Config(**settings)
        trained = _random_weights(build_model(source_config, len(SOURCE)), seed=1)
        config = Config(
            **_fine_tuning(root, source_config, trained),
            learning_rate=1e-12,
            batch_size=4,
            steps_per_epoch=1,
            epochs=1,
            **settings,
        )
        workdir = os.path.join(root, "run")
        train_lib.train_and_evaluate(config, workdir)
        model, vocab, _ = inference.load_workdir(workdir)
        self.assertEqual(vocab.words, [*SOURCE.words, "dog", "blue", "circle", "the"])
        want = workdir_lib.grow_word_weights(
            trained.decoder.embedding.embeddings.numpy(),
            trained.decoder.deep_output.kernel.numpy(),
            trained.decoder.deep_output.bias.numpy(),
            4,
        )
        got = (
            model.decoder.embedding.embeddings,
            model.decoder.deep_output.kernel,
            model.decoder.deep_output.bias,
        )
        for g, w in zip(got, want, strict=True):
            self.assertAllClose(g, w, atol=1e-6, rtol=0)


if __name__ == "__main__":
    tf.test.main()
