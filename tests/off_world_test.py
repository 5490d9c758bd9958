"""Tests for sat_tf.serving.off_world on small random features."""

import json
import os
import unittest

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import sat_tf
from sat_tf.cli import caption as caption_cli
from sat_tf.cli import off_world as off_world_cli
from sat_tf.config import Config
from sat_tf.data import datasets, feature_cache, shapes
from sat_tf.model.encoder import ImageEncoder
from sat_tf.serving import inference, off_world, preset
from sat_tf.training import extract
from tests import fixtures


def _training_vectors(num=400, dim=12, seed=0):
    rng = np.random.default_rng(seed)
    basis = rng.normal(size=(dim, dim))
    return rng.normal(size=(num, dim)) * np.linspace(3.0, 0.2, dim) @ basis + 5.0


class OffWorldTest(tf.test.TestCase):
    def test_pool_is_mean_and_std_over_locations(self):
        features = np.random.default_rng(1).normal(size=(2, 5, 3)).astype(np.float32)
        pooled = off_world.pool(tf.constant(features)).numpy()

        self.assertAllClose(pooled[:, :3], features.mean(axis=1), atol=1e-6)
        self.assertAllClose(pooled[:, 3:], features.std(axis=1), atol=1e-5)

    def test_distance_is_mahalanobis_under_the_ppca_covariance(self):
        train = _training_vectors()
        stats = off_world.fit(train, num_components=4)
        centred = train - train.mean(axis=0)
        covariance = centred.T @ centred / (len(train) - 1)
        eigenvalues, eigenvectors = np.linalg.eigh(covariance)
        top = eigenvectors[:, ::-1][:, :4]
        sigma2 = eigenvalues[::-1][4:].mean()
        ppca = top @ np.diag(eigenvalues[::-1][:4]) @ top.T + sigma2 * (np.eye(12) - top @ top.T)
        points = _training_vectors(num=6, seed=3) * 1.5
        expected = np.sqrt(
            np.einsum(
                "bi,ij,bj->b", points - train.mean(0), np.linalg.inv(ppca), points - train.mean(0)
            )
        )

        self.assertAllClose(off_world.distance(tf.constant(points), stats), expected, rtol=1e-4)
        self.assertAllClose(sigma2, stats.noise_variance, rtol=1e-5)

    def test_all_components_give_the_full_mahalanobis_distance(self):
        train = _training_vectors(dim=6)
        stats = off_world.fit(train, num_components=5)
        centred = train - train.mean(axis=0)
        precision = np.linalg.inv(centred.T @ centred / (len(train) - 1))
        point = np.array([[1.0, -2.0, 3.0, 0.5, 9.0, 4.0]])
        expected = np.sqrt((point - train.mean(0)) @ precision @ (point - train.mean(0)).T)

        self.assertAllClose(off_world.distance(tf.constant(point), stats), expected[0], rtol=1e-4)

    def test_score_is_the_worse_of_two_standardised_counts(self):
        rng = np.random.default_rng(4)
        photos = rng.normal(size=(300, 6, 5)) * rng.uniform(0.5, 1.5, size=(300, 1, 1)) + 1.0
        pooled = np.concatenate([photos.mean(axis=1), photos.std(axis=1)], axis=-1)
        stats = off_world.fit(pooled[:250], num_components=3)
        d = off_world.distance(tf.constant(pooled), stats).numpy()
        log_s = np.log(pooled[:, 5:].mean(axis=1) + 1e-6)
        far = (d - d[:250].mean()) / d[:250].std()
        flat = (log_s[:250].mean() - log_s) / log_s[:250].std()
        scores = off_world.pooled_score(tf.constant(pooled), stats).numpy()

        self.assertAllClose(scores, np.maximum(far, flat), atol=1e-4)
        self.assertTrue(np.any(far > flat) and np.any(flat > far))

    def test_calibration_flags_the_quantile_and_far_points(self):
        stats = off_world.fit(_training_vectors(), num_components=4)
        held_out = _training_vectors(num=1000, seed=5)
        stats = off_world.calibrate(stats, held_out, quantile=0.95)
        features = np.stack([held_out, held_out], axis=1)  # (N, 2, D): std 0, mean held_out
        scores = off_world.pooled_score(tf.constant(held_out), stats).numpy()

        self.assertAllClose(np.mean(scores > stats.threshold), 0.05, atol=0.002)
        self.assertEqual(stats.info["held_out_photos"], 1000)
        far = off_world.pooled_score(tf.constant(held_out[:1] + 100.0), stats)
        self.assertGreater(far[0], stats.threshold)
        self.assertEqual(off_world.pool(tf.constant(features)).shape, (1000, 24))

    def test_score_flags_a_flat_frame(self):
        rng = np.random.default_rng(2)
        photos = rng.normal(size=(300, 9, 4)) * rng.uniform(1.0, 1.5, size=(300, 1, 1))
        pooled = off_world.pool(tf.constant(photos, tf.float32)).numpy()
        stats = off_world.calibrate(off_world.fit(pooled[:200], num_components=3), pooled[200:])
        flat = np.zeros((1, 9, 4), np.float32)
        d, flagged = off_world.score(tf.constant(flat), stats)

        self.assertTrue(flagged[0])
        self.assertGreater(d[0], stats.threshold)
        self.assertEqual(stats.feature_dim, 4)

    def test_save_and_load_round_trip(self):
        stats = off_world.fit(_training_vectors(), num_components=3, encoder="tiny")
        stats = off_world.calibrate(stats, _training_vectors(seed=9))
        path = os.path.join(self.get_temp_dir(), "stats.npz")
        off_world.save(stats, path)
        loaded = off_world.load(path)

        for name in ("mean", "components", "variances"):
            self.assertAllEqual(getattr(loaded, name), getattr(stats, name))
        for name in ("distance_mean", "distance_sd", "log_spread_mean", "log_spread_sd"):
            self.assertAllClose(getattr(loaded, name), getattr(stats, name))
            self.assertNotIn(getattr(stats, name), (0.0, 1.0))
        self.assertAllClose(loaded.threshold, stats.threshold)
        self.assertAllClose(loaded.quantile, 0.99)
        self.assertEqual(
            loaded.info, {"photos": "400", "encoder": "tiny", "held_out_photos": "400"}
        )
        self.assertIsNone(off_world.load_from(os.path.join(self.get_temp_dir(), "none")))

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "num_components=12"):
            off_world.fit(_training_vectors(), num_components=12)
        with self.assertRaisesRegex(ValueError, "quantile=1.5"):
            off_world.calibrate(off_world.fit(_training_vectors(), 2), _training_vectors(), 1.5)
        path = os.path.join(self.get_temp_dir(), "bad.npz")
        with open(path, "w") as f:
            f.write("not an npz")
        with self.assertRaisesRegex(ValueError, "not off-world statistics"):
            off_world.load(path)


class OffWorldCommandTest(tf.test.TestCase):
    def test_workdir_statistics_from_cached_features(self):
        root = self.get_temp_dir()
        data_dir = os.path.join(root, "data")
        shapes.generate(data_dir, num_train=60, num_val=20, num_test=10)
        weights = os.path.join(root, "encoder.weights.h5")
        tf.keras.utils.set_random_seed(1)
        ImageEncoder("shapes_cnn", 112).net.save_weights(weights)
        config = Config(
            dataset="shapes",
            data_dir=data_dir,
            encoder="shapes_cnn",
            encoder_weights=weights,
            image_size=112,
            use_feature_cache=True,
            feature_dir=os.path.join(root, "features"),
        )
        extract.extract_for_config(config, shard_size=40, batch_size=30, progress=False)
        workdir = os.path.join(root, "run")
        os.makedirs(workdir)
        config.save(os.path.join(workdir, "config.json"))

        code, out, err = fixtures.run_main(
            off_world_cli.main, "sat-off-world", f"--workdir={workdir}", "--num_components=5"
        )

        self.assertEqual(code, 0, err)
        stats = off_world.load(os.path.join(workdir, off_world.FILE))
        records = datasets.load_records("shapes", data_dir)
        train = [r for r in records if r.split == "train"]
        ds, _ = feature_cache.feature_dataset(config.feature_dir, train)
        features = np.stack(list(ds.as_numpy_iterator()))  # (60, L, D)
        pooled = np.concatenate([features.mean(axis=1), features.std(axis=1)], axis=-1)
        self.assertAllClose(stats.mean, pooled.mean(axis=0), atol=1e-5)
        self.assertEqual(stats.components.shape, (5, pooled.shape[1]))
        summary = json.loads(out[: out.rindex("}") + 1])
        self.assertEqual(set(summary["flagged"]), {"train", "val", "test"})
        self.assertLessEqual(summary["flagged"]["val"], 0.05)
        self.assertAllClose(summary["threshold"], stats.threshold, atol=1e-4)
        self.assertEqual(stats.info["photos"], "60")


GRID_PRESET = "flickr8k_lite0_grid14_soft"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLICKR8K = os.environ.get("SAT_TF_FLICKR8K", os.path.join(ROOT, "..", "shared", "data", "flickr8k"))
PHOTOS = os.path.join(FLICKR8K, "Flicker8k_Dataset")
# The files of the preset's splits (the split `sat-off-world` calibrated on is "val").
SPLIT_FILES = {"val": "Flickr_8k.devImages.txt", "test": "Flickr_8k.testImages.txt"}


def _probes():
    """Photos no Flickr8k model should take for its world: flat frames, noise, one pixel."""
    noise = np.random.default_rng(0).integers(0, 256, (224, 224, 3)).astype(np.uint8)
    return {
        "black": np.zeros((224, 224, 3), np.uint8),
        "grey": np.full((224, 224, 3), 128, np.uint8),
        "noise": noise,
        "1x1": np.array([[[120, 80, 200]]], np.uint8),
    }


def _split_photos(split, count=None):
    """Paths of the first `count` (None: all) Flickr8k photos of `split`; skips the test
    when the photos are not there."""
    listing = os.path.join(FLICKR8K, SPLIT_FILES[split])
    if not os.path.isdir(PHOTOS) or not os.path.exists(listing):
        raise unittest.SkipTest(
            f"the Flickr8k photos are not in {PHOTOS} (set SAT_TF_FLICKR8K to the folder "
            "holding Flicker8k_Dataset and the split files)"
        )
    with open(listing, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()][:count]
    return [os.path.join(PHOTOS, name) for name in names]


class ShippedPresetTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.captioner = sat_tf.Captioner.from_preset(GRID_PRESET)

    def scores(self, paths, batch_size=50):
        """The off-world scores of image files, by the preset's encoder and statistics."""
        encoder = inference.feature_encoder(self.captioner.model, self.captioner.config)
        out = []
        for start in range(0, len(paths), batch_size):
            pixels = np.stack(
                [self.captioner.load_image(p) for p in paths[start : start + batch_size]]
            )
            features = encoder(pixels, training=False)
            out.append(off_world.score(features, self.captioner.off_world)[0].numpy())
        return np.concatenate(out)

    def test_real_photos_pass_while_a_black_frame_and_noise_are_flagged(self):
        photos = _split_photos("test", 12)
        probes = _probes()
        captions = self.captioner.caption([*photos, probes["black"], probes["noise"]])
        flagged = [c.off_world for c in captions]
        self.assertEqual(flagged, [False] * len(photos) + [True, True])
        threshold = self.captioner.off_world.threshold
        for path, caption in zip(photos, captions, strict=False):
            self.assertLess(caption.off_world_score, threshold, path)

    @pytest.mark.slow
    def test_flagged_rates_computed_afresh_equal_the_stored_ones(self):
        # Slow: the encoder over the 2,000 validation and test photos. The threshold is
        # the 0.99 quantile of the validation photos' scores; the stored rates were
        # computed from `sat-extract-features`'s cache, here from the image files.
        metadata = preset.verify(os.path.join(preset.PRESETS_DIR, GRID_PRESET))
        stored = metadata["off_world"]["flagged"]
        stats = self.captioner.off_world
        for split in SPLIT_FILES:
            scores = self.scores(_split_photos(split))
            self.assertLen(scores, 1000)
            if split == "val":
                self.assertAllClose(np.quantile(scores, stats.quantile), stats.threshold, atol=1e-4)
            # A photo that the last digits of another CPU's convolutions could move across
            # the threshold may count differently: one in 1,000.
            self.assertAllClose(np.mean(scores > stats.threshold), stored[split], atol=1e-3)

    def test_flat_frames_noise_and_one_pixel_are_flagged_and_captioned(self):
        probes = _probes()
        captions = self.captioner.caption(list(probes.values()))
        threshold = self.captioner.off_world.threshold
        for name, caption in zip(probes, captions, strict=True):
            self.assertTrue(caption.off_world, name)
            self.assertGreater(caption.off_world_score, threshold, name)
            self.assertNotEmpty(caption.words, name)

    def test_microscope_slide_and_galaxy_field_are_flagged(self):
        try:
            from skimage import data
        except ImportError:
            self.skipTest("scikit-image is not installed")
        captions = self.captioner.caption([data.hubble_deep_field(), data.immunohistochemistry()])
        self.assertEqual([c.off_world for c in captions], [True, True])

    def test_stored_statistics_describe_the_preset(self):
        folder = os.path.join(preset.PRESETS_DIR, GRID_PRESET)
        metadata = preset.verify(folder)
        self.assertIn(off_world.FILE, metadata["files"])
        stats = self.captioner.off_world
        self.assertEqual(stats.feature_dim, self.captioner.model.feature_dim)
        self.assertAllClose(stats.quantile, 0.99)
        self.assertLessEqual(metadata["off_world"]["flagged"]["test"], 0.02)
        self.assertLess(os.path.getsize(os.path.join(folder, off_world.FILE)), 10**6)

    def test_caption_command_writes_and_marks_the_score(self):
        folder = self.get_temp_dir()
        black = os.path.join(folder, "black.png")
        Image.fromarray(_probes()["black"]).save(black)
        output = os.path.join(folder, "captions.jsonl")
        code, out, err = fixtures.run_main(
            caption_cli.main, "sat-caption", black, f"--preset={GRID_PRESET}", f"--output={output}"
        )

        self.assertEqual(code, 0, err)
        with open(output, encoding="utf-8") as f:
            (record,) = [json.loads(line) for line in f]
        self.assertTrue(record["off_world"])
        self.assertGreater(record["off_world_score"], self.captioner.off_world.threshold)
        self.assertIn("[off-world photo: score", out)

    def test_a_preset_without_statistics_gives_none(self):
        captioner = sat_tf.Captioner.from_preset("flickr8k_lite0_soft")
        (caption,) = captioner.caption(_probes()["grey"])
        self.assertIsNone(captioner.off_world)
        self.assertIsNone(caption.off_world_score)
        self.assertIsNone(caption.off_world)


if __name__ == "__main__":
    tf.test.main()
