"""Tests for the script flags: scripts/flags_lib.py in process, train.py as a user runs it."""

import os
import re
import subprocess
import sys
import tempfile

from absl import flags
from absl.testing import absltest, parameterized

from sat_tf import config as config_lib
from sat_tf.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import flags_lib  # noqa: E402

# TensorFlow's own start-up lines (C++ log format and the absl pre-init warning).
_TF_NOISE = re.compile(
    r"^([IWEF]\d{4} |WARNING: All log messages before absl::InitializeLog|"
    r"To enable the following instructions|This TensorFlow binary is optimized)"
)


def _flag_values(*args, only=None):
    values = flags.FlagValues()
    flags_lib.define_config_flags(values, only=only)
    values(["prog", *args])
    return values


class FlagsLibTest(parameterized.TestCase):
    def test_parsed_values_and_defaults(self):
        config = flags_lib.config_from_flags(_flag_values("--batch_size=3", "--attention=hard"))
        self.assertEqual(config, Config(batch_size=3, attention="hard"))
        self.assertEqual((config.batch_size, config.attention), (3, "hard"))
        self.assertEqual(config.hidden_dim, Config().hidden_dim)

    def test_types(self):
        config = flags_lib.config_from_flags(
            _flag_values(
                "--dropout=0.5",
                "--jit_compile",
                "--nofine_tune_encoder",
                "--mixed_precision=mixed_float16",
                "--encoder_weights=/w/x.h5",
                "--epochs=2",
            )
        )
        self.assertEqual(config.dropout, 0.5)
        self.assertIs(config.jit_compile, True)
        self.assertIs(config.fine_tune_encoder, False)
        self.assertEqual(config.mixed_precision, "mixed_float16")
        self.assertEqual(config.encoder_weights, "/w/x.h5")
        self.assertEqual(config.epochs, 2)
        self.assertIsInstance(config.epochs, int)

    def test_one_flag_per_field_with_its_help_and_default(self):
        values = _flag_values()
        for name, default, _, help_text in config_lib.fields_with_help():
            self.assertEqual(values[name].default, default, name)
            self.assertTrue(values[name].help.endswith(help_text), name)
        self.assertEqual(flags_lib.config_from_flags(values), Config())

    @parameterized.named_parameters(
        ("enum", "--attention=bogus", "attention"),
        ("integer", "--batch_size=many", "batch_size"),
        ("float", "--dropout=half", "dropout"),
        ("unknown", "--bogus_flag=1", "bogus_flag"),
    )
    def test_parse_errors_name_the_flag(self, arg, name):
        with self.assertRaisesRegex(flags.Error, name):
            _flag_values(arg)

    def test_invalid_value_names_the_flag(self):
        with self.assertRaisesRegex(ValueError, "--batch_size=0"):
            flags_lib.config_from_flags(_flag_values("--batch_size=0"))

    def test_only(self):
        values = _flag_values("--seed=4", only={"seed", "batch_size"})
        self.assertNotIn("attention", values)
        self.assertEqual(flags_lib.config_from_flags(values), Config(seed=4))

    def test_flagfile(self):
        path = os.path.join(tempfile.mkdtemp(), "run.flags")
        with open(path, "w", encoding="utf-8") as f:
            f.write("# tiny run\n--batch_size=5\n--attention=none\n--nojit_compile\n")
        config = flags_lib.config_from_flags(_flag_values(f"--flagfile={path}", "--batch_size=6"))
        self.assertEqual(config, Config(batch_size=6, attention="none"))


class TrainScriptTest(parameterized.TestCase):
    """Runs scripts/train.py in subprocesses (all four at once: each imports TensorFlow)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = tempfile.mkdtemp()
        flagfile = os.path.join(cls.dir, "bad.flags")
        with open(flagfile, "w", encoding="utf-8") as f:
            f.write("--batch_size=4\n--no_such_setting=3\n")
        workdir = f"--workdir={os.path.join(cls.dir, 'run')}"
        runs = {
            "flagfile": [f"--flagfile={flagfile}", workdir],
            "choice": ["--attention=bogus", workdir],
            "value": ["--batch_size=0", workdir],
            "help": ["--helpfull"],
        }
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        script = os.path.join(ROOT, "scripts", "train.py")
        procs = {
            key: subprocess.Popen(
                [sys.executable, script, *args],
                cwd=cls.dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for key, args in runs.items()
        }
        cls.results = {}
        for key, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=600)
            lines = [line for line in stderr.splitlines() if line.strip()]
            lines = [line for line in lines if not _TF_NOISE.match(line)]
            cls.results[key] = (proc.returncode, stdout, lines)

    @parameterized.parameters("flagfile", "choice", "value")
    def test_bad_flags_stop_with_a_short_message(self, key):
        code, _, lines = self.results[key]
        self.assertNotEqual(code, 0)
        self.assertLessEqual(len(lines), 3, lines)
        self.assertNotIn("Traceback", "\n".join(lines))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "run")))

    def test_unknown_flag_in_flagfile_is_named(self):
        self.assertIn("no_such_setting", "\n".join(self.results["flagfile"][2]))

    def test_bad_choice_names_the_flag_and_the_choices(self):
        message = "\n".join(self.results["choice"][2])
        self.assertIn("--attention=bogus", message)
        for value in config_lib.CHOICES["attention"]:
            self.assertIn(value, message)

    def test_bad_value_is_one_line(self):
        self.assertEqual(self.results["value"][2], ["error: --batch_size=0 must be at least 1"])

    def test_helpfull_lists_every_field_with_its_help(self):
        text = " ".join(self.results["help"][1].split())
        self.assertIn("--workdir:", text)
        for name, _, _, help_text in config_lib.fields_with_help():
            help_text = re.escape(" ".join(help_text.split()))
            self.assertRegex(text, rf"--(\[no\])?{name}: (<[^>]*>: )?{help_text}")


if __name__ == "__main__":
    absltest.main()
