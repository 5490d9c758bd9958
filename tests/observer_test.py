"""Tests for sat_tf.server.observer: the states are TF Serving's ModelVersionStatus states
in their order, a watcher that raises is logged and never reaches the server, and the
interfaces take what the server hands them (their no-op methods called as it calls
them)."""

import logging

from absl.testing import absltest
from tensorflow_serving.apis import get_model_status_pb2

from sat_tf.server import observer


class ObserverTest(absltest.TestCase):
    def test_states_are_tf_servings(self):
        names = get_model_status_pb2.ModelVersionStatus.State.keys()
        self.assertEqual([n for n in names if n != "UNKNOWN"], list(observer.STATES))

    def test_a_watcher_that_raises_is_logged(self):
        def broken(status):
            raise RuntimeError(f"cannot follow {status.version}")

        status = observer.VersionStatus("sat", 3, "AVAILABLE")
        with self.assertLogs("sat_tf.server.observer", logging.ERROR) as logs:
            observer.tell("a listener", broken, status)
        self.assertIn("a listener failed", logs.output[0])
        self.assertIn("RuntimeError: cannot follow 3", logs.output[0])
        heard = []
        observer.tell("a listener", heard.append, status)
        self.assertEqual(heard, [status])

    def test_the_interfaces_take_what_the_server_hands_them(self):
        listener, watcher = observer.Listener(), observer.Observer()
        listener.version_changed(observer.VersionStatus("sat", 1, "END", "DATA_LOSS", "corrupt"))
        listener.draining()
        watcher.request(
            model="sat", api="predict", entrypoint="REST", code="OK", seconds=0.1, examples=2
        )
        watcher.batch(
            model="sat", signature="serving_default", sizes=(2, 1), padding=1,
            queued_seconds=(0.01, 0.02),
        )  # fmt: skip
        watcher.warmup(
            model="sat", version=1, path="/m/1/assets.extra", code="OK", seconds=1.5, records=2
        )


if __name__ == "__main__":
    absltest.main()
