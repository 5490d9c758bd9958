"""Tests for sat_tf.server.manager in this process, over copies of the tiny export: the
version lifecycle as TF Serving runs it (a new version loads before the old one goes, a
broken one is tried 1 + max_num_load_retries times, listed with its error and left out
while the old one serves, tried anew once it leaves and comes back, a rollback serves the
previous version), a start whose model never loads, a request that holds a version
through its unload, several models with labels and a live config reload, and what
listeners and observers hear."""

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from fixtures import encode, scenes, wait_until
from google.protobuf import text_format
from server_process import add_version
from tensorflow_serving.config import model_server_config_pb2

from sat_tf.server import batching, manager, model_config, observer
from sat_tf.server.errors import ServingError

PARAMETERS = batching.BatchingParameters(
    max_batch_size=16, batch_timeout_micros=0, num_batch_threads=1
)


class Heard(observer.Listener, observer.Observer):
    """Every event a listener and an observer hear."""

    def __init__(self):
        self.states, self.drains, self.warmups, self.batches = [], 0, [], []

    def version_changed(self, status):
        self.states.append((status.model, status.version, status.state, status.error_code))

    def draining(self):
        self.drains += 1

    def warmup(self, model, version, path, code, seconds, records):
        self.warmups.append((model, version, code, records))

    def batch(self, model, signature, sizes, padding, queued_seconds):
        self.batches.append((model, signature, sum(sizes)))


def config_of(text):
    return text_format.Parse(text, model_server_config_pb2.ModelServerConfig())


class ManagerTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(dir=self.get_temp_dir())
        self.base = os.path.join(self.root, "sat")
        os.makedirs(self.base)
        self.heard = Heard()
        self.image = np.array([encode(scenes(0, 1)[0], "PNG")], dtype=object)

    def start(self, config=None, **overrides):
        # No warm-up unless a test asks: it runs 17 images at each load.
        options = {"parameters": PARAMETERS, "poll_wait_seconds": 0.05, "warmup_iterations": 0}
        options.update(overrides)
        config = config or model_config.single_model_config("sat", self.base)
        served = manager.Manager(config, manager.ManagerOptions(**options), self.heard)
        served.add_listener(self.heard)
        self.addCleanup(served.stop)
        served.start()
        return served

    def states(self, served, name="sat"):
        try:
            return [(s.version, s.state, s.error_code) for s in served.status(name)]
        except ServingError:  # none yet
            return []

    def wait_for(self, served, want, name="sat"):
        wait_until(lambda: self.states(served, name) == want, 60, f"states {want}")

    def predict(self, served, version=None, label=None):
        with served.servable("sat", version, label) as held:
            return held.version, held.predict("", {"image_bytes": self.image})["caption"][0]

    def test_a_new_version_then_a_rollback(self):
        add_version(self.base, 1)
        served = self.start()
        self.assertEqual(self.states(served), [(1, "AVAILABLE", "OK")])
        add_version(self.base, 2)
        self.wait_for(served, [(2, "AVAILABLE", "OK"), (1, "END", "OK")])
        self.assertEqual(self.predict(served)[0], 2)
        shutil.rmtree(os.path.join(self.base, "2"))
        self.wait_for(served, [(2, "END", "OK"), (1, "AVAILABLE", "OK")])
        self.assertEqual(self.predict(served)[0], 1)
        # version 1 was loaded before version 2 left: never a moment without a version
        sequence = [(v, s) for _, v, s, _ in self.heard.states]
        self.assertLess(sequence.index((1, "AVAILABLE"), 3), sequence.index((2, "UNLOADING")))

    def test_broken_versions_are_retried_listed_and_left_out(self):
        add_version(self.base, 1)
        served = self.start(max_num_load_retries=2, load_retry_interval_seconds=0.05)
        for version, broken, code in ((2, "model", "DATA_LOSS"), (3, "warmup", "DATA_LOSS")):
            add_version(self.base, version, broken)
            self.wait_for(
                served,
                [(version, "END", code)]
                + ([(2, "END", "DATA_LOSS")] if version == 3 else [])
                + [(1, "AVAILABLE", "OK")],
            )
            (status,) = served.status("sat", version)
            self.assertIn(os.path.join(self.base, str(version)), status.error_message)
            tries = [s for _, v, s, _ in self.heard.states if v == version and s == "LOADING"]
            self.assertLen(tries, 1 + 2 * 2)  # three tries: each LOADING, and two retries wait
            self.assertEqual(self.predict(served)[0], 1)
        self.assertNotIn(3, [v for _, v, *_ in self.heard.warmups])  # never got to its warm-up

    def test_a_failed_version_is_tried_again_once_it_comes_back(self):
        add_version(self.base, 1)
        served = self.start(max_num_load_retries=0)
        add_version(self.base, 2, "model")
        self.wait_for(served, [(2, "END", "DATA_LOSS"), (1, "AVAILABLE", "OK")])
        os.rename(os.path.join(self.base, "2"), os.path.join(self.root, "away"))
        record = served._models["sat"].versions[2]
        wait_until(lambda: not record.aspired, 30, "version 2 seen gone")
        shutil.rmtree(os.path.join(self.root, "away"))
        add_version(self.base, 2)  # fixed, under the same number
        self.wait_for(served, [(2, "AVAILABLE", "OK"), (1, "END", "OK")])

    def test_a_start_whose_model_never_loads(self):
        add_version(self.base, 4, "model")
        served = manager.Manager(
            model_config.single_model_config("sat", self.base),
            manager.ManagerOptions(PARAMETERS, 0.05, 1, 0.01),
        )
        self.addCleanup(served.stop)
        with self.assertRaises(ServingError) as raised:
            served.start()
        self.assertEqual(raised.exception.code, "UNKNOWN")
        self.assertStartsWith(
            raised.exception.message, "model sat did not become available (version 4: DATA_LOSS: "
        )

    def test_an_empty_base_path_waits_for_versions(self):
        served = self.start()
        with self.assertRaisesRegex(ServingError, "Could not find any versions of model sat"):
            served.status("sat")
        with self.assertRaisesRegex(ServingError, r"Servable not found for request: Latest\(sat\)"):
            self.predict(served)
        add_version(self.base, 1)
        self.wait_for(served, [(1, "AVAILABLE", "OK")])

    def test_a_request_holds_its_version_through_the_unload(self):
        add_version(self.base, 1)
        served = self.start()
        with served.servable("sat") as held:
            add_version(self.base, 2)
            wait_until(lambda: served.status("sat", 1)[0].state == "UNLOADING", 60)
            self.assertEqual(self.predict(served)[0], 2)  # new requests get version 2
            caption = held.predict("", {"image_bytes": self.image})["caption"][0]
            self.assertEqual(served.status("sat", 1)[0].state, "UNLOADING")
        self.wait_for(served, [(2, "AVAILABLE", "OK"), (1, "END", "OK")])
        self.assertEqual(caption, self.predict(served)[1])
        with self.assertRaisesRegex(ServingError, r"Specific\(sat, 1\)"):
            self.predict(served, 1)

    def test_models_labels_and_a_reload(self):
        add_version(self.base, 1)
        add_version(self.base, 2)
        other = os.path.join(self.root, "other")
        os.makedirs(other)
        add_version(other, 7)
        served = self.start(
            config_of(
                f'model_config_list {{ config {{ name: "sat" base_path: "{self.base}" '
                'model_platform: "tensorflow" model_version_policy { all {} } '
                'version_labels { key: "stable" value: 1 } '
                'version_labels { key: "canary" value: 2 } } }'
            )
        )
        self.assertEqual(self.predict(served, label="stable")[0], 1)
        self.assertEqual(self.predict(served, label="canary")[0], 2)
        self.assertEqual(self.predict(served)[0], 2)
        self.assertEqual(served.resolve("sat", "stable"), 1)
        with self.assertRaisesRegex(ServingError, "Unrecognized servable version label: beta"):
            self.predict(served, label="beta")
        served.reload_config(
            config_of(
                f'model_config_list {{ config {{ name: "sat" base_path: "{self.base}" '
                f'model_platform: "tensorflow" }} config {{ name: "other" base_path: "{other}" '
                'model_platform: "tensorflow" } }'
            )
        )
        self.assertEqual(self.states(served), [(2, "AVAILABLE", "OK"), (1, "END", "OK")])
        self.assertEqual(self.states(served, "other"), [(7, "AVAILABLE", "OK")])
        with self.assertRaisesRegex(ServingError, "Unrecognized servable version label: stable"):
            self.predict(served, label="stable")
        bad = config_of(
            f'model_config_list {{ config {{ name: "other" base_path: "{other}" '
            'model_platform: "tensorflow" version_labels { key: "old" value: 6 } } }'
        )
        with self.assertRaises(ServingError) as raised:
            served.reload_config(bad)
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        self.assertIn("version 6 of model other, which is not currently", raised.exception.message)
        wait_until(lambda: "sat" not in served._models, 30, "model sat removed")
        with self.assertRaisesRegex(ServingError, "Could not find any versions of model sat"):
            served.status("sat")

    def test_a_label_for_a_version_not_loaded_when_allowed(self):
        add_version(self.base, 1)
        config = config_of(
            f'model_config_list {{ config {{ name: "sat" base_path: "{self.base}" '
            'model_platform: "tensorflow" version_labels { key: "next" value: 2 } } }'
        )
        served = self.start(config, allow_version_labels_for_unavailable_models=True)
        self.assertEqual(served.resolve("sat", "next"), 2)
        with self.assertRaisesRegex(ServingError, r"Specific\(sat, 2\)"):
            self.predict(served, label="next")

    def test_what_listeners_and_observers_hear(self):
        add_version(self.base, 1)
        served = self.start(warmup_iterations=1)
        self.assertEqual(
            self.heard.states,
            [("sat", 1, "START", "OK"), ("sat", 1, "LOADING", "OK"), ("sat", 1, "AVAILABLE", "OK")],
        )
        self.assertEqual(self.heard.warmups, [("sat", 1, "OK", 2)])
        self.assertEqual(
            sorted(self.heard.batches),
            [("sat", "serving_default", 1), ("sat", "serving_default", 16)],
        )
        served.drain()
        self.assertTrue(served.draining.is_set())
        self.assertEqual(self.heard.drains, 1)

    def test_configs_it_cannot_serve(self):
        for text, message in (
            (
                'model_config_list { config { name: "a" model_platform: "tensorflow" } }',
                r'the model config: model_config_list.config\[0\] \(model "a"\).base_path: empty',
            ),
            (
                'model_config_list { config { name: "a" base_path: "/a" '
                'model_platform: "tensorflow" } config { name: "a" base_path: "/b" '
                'model_platform: "tensorflow" } }',
                r"config\[1\] \(model \"a\"\).name: the model is listed twice",
            ),
            (
                'model_config_list { config { name: "a" base_path: "/a" '
                'model_platform: "pytorch" } }',
                "model_platform: 'pytorch'",
            ),
        ):
            with self.assertRaisesRegex(ServingError, message) as raised:
                manager.Manager(config_of(text))
            self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")


if __name__ == "__main__":
    tf.test.main()
