"""Tests for sat_tf.off_world on small random features."""

import json
import os

import numpy as np
import tensorflow as tf

from sat_tf import off_world
from sat_tf.cli import off_world as off_world_cli
from sat_tf.config import Config
from sat_tf.data import datasets, feature_cache, shapes
from sat_tf.model.encoder import ImageEncoder
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

    def test_calibration_flags_the_quantile_and_far_points(self):
        stats = off_world.fit(_training_vectors(), num_components=4)
        held_out = _training_vectors(num=1000, seed=5)
        stats = off_world.calibrate(stats, held_out, quantile=0.95)
        features = np.stack([held_out, held_out], axis=1)  # (N, 2, D): std 0, mean held_out
        d = off_world.distance(tf.constant(held_out), stats).numpy()

        self.assertAllClose(np.mean(d > stats.threshold), 0.05, atol=0.002)
        self.assertEqual(stats.info["held_out_photos"], 1000)
        far = off_world.distance(tf.constant(held_out[:1] + 100.0), stats)
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


if __name__ == "__main__":
    tf.test.main()
