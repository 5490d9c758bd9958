"""Tests for sat_tf.server.options: sat-serve's flags are the settings' fields with their
defaults and help, and the defaults that sat-serve shares with tensorflow_model_server are
TF Serving's (model_servers/main.cc and server.h, written out here by hand)."""

import dataclasses

from absl.testing import absltest

from sat_tf.cli import serve
from sat_tf.server.options import ServerOptions

TF_SERVING = {
    "port": 8500,
    "rest_api_port": 8501,
    "rest_api_timeout_in_ms": 30_000,
    "batching_parameters_file": "",
    "file_system_poll_wait_seconds": 1,
    "max_num_load_retries": 5,
    "load_retry_interval_micros": 60_000_000,
}


class OptionsTest(absltest.TestCase):
    def test_defaults_shared_with_tf_serving(self):
        defaults = ServerOptions()
        self.assertEqual({k: getattr(defaults, k) for k in TF_SERVING}, TF_SERVING)

    def test_the_flags_are_the_fields(self):
        fields = {f.name: f for f in dataclasses.fields(ServerOptions)}
        self.assertEqual(set(serve.FLAGS), set(fields))
        for name, field in fields.items():
            flag = serve.FLAGS[name]
            self.assertEqual(flag.default, field.default, name)
            self.assertEqual(flag.help, field.metadata["help"], name)
            self.assertIsInstance(flag.default, field.type, name)


if __name__ == "__main__":
    absltest.main()
