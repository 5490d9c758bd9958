"""Tests for sat_tf.training.workdir: a workdir that holds another model is refused."""

import os

import tensorflow as tf

from sat_tf.config import Config
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


if __name__ == "__main__":
    tf.test.main()
