"""Tests for sat_tf.cli.flags_lib: Config's fields as absl flags (values, types, defaults,
errors naming the flag, contradictions), flagfiles (looked up in configs/, nested, read as
absl reads them, every shipped one a valid config), the decoding overrides of the
commands that load a model, and flags reset between two runs in one process."""

import json
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf
from absl import flags
from absl.testing import absltest, parameterized
from fixtures import run_main

from sat_tf import config as config_lib
from sat_tf.cli import flags_lib
from sat_tf.cli import table as table_cli
from sat_tf.cli import train as train_cli
from sat_tf.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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

    def test_flagfile_names_are_looked_up_in_configs(self):
        cwd = os.getcwd()
        os.chdir(tempfile.mkdtemp())
        try:
            expanded = flags_lib.expand_flagfiles(["--flagfile=shapes_long.flags", "--seed=2"])
            with self.assertRaisesRegex(ValueError, r"'no_such\.flags' not found .*configs"):
                flags_lib.expand_flagfiles(["--flagfile", "no_such.flags"])
        finally:
            os.chdir(cwd)
        # shapes_long.flags names configs/shapes.flags first, then its own two flags.
        self.assertEqual(
            expanded,
            [
                "--dataset=shapes",
                "--data_dir=data/shapes",
                "--attention=soft",
                "--attention_score=additive",
                "--epochs=10",
                "--lr_schedule=cosine",
                "--seed=2",
            ],
        )
        config = flags_lib.config_from_flags(_flag_values(*expanded))
        self.assertEqual(config, Config(epochs=10, lr_schedule="cosine", seed=2))

    @parameterized.named_parameters(
        ("penalty_without_attention", ["--attention=none", "--alpha_c=0.01"], "--alpha_c=0.01"),
        ("penalty_with_hard", ["--alpha_c=0.5", "--attention=hard"], "--alpha_c=0.5"),
        ("hard_setting_with_soft", ["--reinforce_weight=2"], "--reinforce_weight=2.0"),
        ("default_value_given", ["--attention=none", "--hard_mix_prob=0.5"], "--hard_mix_prob"),
    )
    def test_contradicting_flags_name_both(self, args, named):
        values = _flag_values(*args)
        with self.assertRaises(ValueError) as raised:
            flags_lib.config_from_flags(values)
        message = str(raised.exception)
        self.assertStartsWith(message, f"{named}")
        self.assertIn(f"contradicts --attention={values.attention}:", message)

    @parameterized.named_parameters(
        ("no_attention_alone", ["--attention=none"], {"attention": "none"}),
        ("hard_alone", ["--attention=hard"], {"attention": "hard"}),
        ("no_penalty", ["--attention=none", "--alpha_c=0"], {"attention": "none", "alpha_c": 0.0}),
        (
            "hard_with_its_settings",
            ["--attention=hard", "--hard_mix_prob=0", "--alpha_c=0"],
            {"attention": "hard", "hard_mix_prob": 0.0, "alpha_c": 0.0},
        ),
        ("soft_with_penalty", ["--alpha_c=1"], {"alpha_c": 1.0}),
    )
    def test_consistent_flags(self, args, expected):
        self.assertEqual(flags_lib.config_from_flags(_flag_values(*args)), Config(**expected))

    def test_contradiction_in_a_flagfile(self):
        # A value from a flagfile counts as given, like one on the command line.
        path = os.path.join(tempfile.mkdtemp(), "soft.flags")
        with open(path, "w", encoding="utf-8") as f:
            f.write("--attention=soft\n--alpha_c=0.33\n")
        values = _flag_values(f"--flagfile={path}", "--attention=hard")
        with self.assertRaisesRegex(ValueError, r"^--alpha_c=0.33 contradicts --attention=hard:"):
            flags_lib.config_from_flags(values)
        self.assertEqual(
            flags_lib.config_from_flags(_flag_values(f"--flagfile={path}", "--alpha_c=0")),
            Config(alpha_c=0.0),
        )


class DecodingOverridesTest(absltest.TestCase):
    """--hard_decoding and --length_penalty of the scripts that load a model
    (`decoding_overrides`)."""

    def _values(self, *args):
        values = flags.FlagValues()
        flags_lib.define_model_source(values)
        values(["prog", *args])
        return values

    def test_changes_a_hard_models_config_before_it_captions(self):
        config = Config(attention="hard")
        new, changed = flags_lib.decoding_overrides(
            self._values("--hard_decoding=argmax", "--length_penalty=1"), config
        )
        self.assertEqual(new, Config(attention="hard", hard_decoding="argmax", length_penalty=1.0))
        self.assertEqual(changed, {"hard_decoding": "argmax", "length_penalty": 1.0})

    def test_blocking_overrides(self):
        config = Config()
        new, changed = flags_lib.decoding_overrides(
            self._values("--noblock_repeats", "--block_bad_endings"), config
        )
        self.assertEqual(changed, {"block_repeats": False, "block_bad_endings": True})
        self.assertEqual((new.block_repeats, new.block_bad_endings), (False, True))
        same = flags_lib.decoding_overrides(self._values("--block_repeats"), config)
        self.assertEqual(same, (config, {}))

    def test_tags_are_overridden(self):
        config = Config(attention="soft")
        got, changed = flags_lib.decoding_overrides(
            self._values("--notags", "--tag_threshold=0.5"), config
        )
        self.assertEqual(changed, {"tags": False, "tag_threshold": 0.5})
        self.assertEqual((got.tags, got.tag_threshold), (False, 0.5))

    def test_the_models_own_values_or_none_change_nothing(self):
        for args in ((), ("--hard_decoding=expected", "--length_penalty=0")):
            config = Config(attention="hard")
            got = flags_lib.decoding_overrides(self._values(*args), config)
            self.assertEqual(got, (config, {}))

    def test_bad_values_are_refused(self):
        cases = [
            (
                ("--hard_decoding=argmax",),
                r"^--hard_decoding=argmax is a setting of hard attention",
            ),
            (("--length_penalty=-0.5",), r"^--length_penalty=-0.5 must be >= 0"),
            (("--tag_threshold=1.5",), r"^--tag_threshold=1.5 must lie in \[0, 1\]"),
        ]
        for args, message in cases:
            with self.assertRaisesRegex(ValueError, message):
                flags_lib.decoding_overrides(self._values(*args), Config(attention="soft"))


class FlagfileTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_unknown_flag_in_a_flagfile_is_named_and_nothing_runs(self):
        path = os.path.join(self.dir, "bad.flags")
        with open(path, "w", encoding="utf-8") as f:
            f.write("--batch_size=4\n--no_such_setting=3\n")
        workdir = os.path.join(self.dir, "run")
        code, _, stderr = run_main(
            train_cli.main, "sat-train", f"--flagfile={path}", f"--workdir={workdir}"
        )
        self.assertEqual(code, 1)
        self.assertIn("no_such_setting", stderr)
        self.assertNotIn("Traceback", stderr)
        self.assertFalse(os.path.exists(workdir))

    def test_nested_names_are_found_in_configs(self):
        # flickr8k_grid14.flags names flickr8k_lite.flags, found beside it in configs/.
        expanded = flags_lib.expand_flagfiles(["--flagfile=flickr8k_grid14.flags", "--seed=3"])
        with open(os.path.join(ROOT, "configs", "flickr8k_lite.flags"), encoding="utf-8") as f:
            lite = [x.strip() for x in f if x.strip() and not x.startswith("#")]
        own = ["--encoder=efficientnet_lite0_head_dilated", "--beam_size=5", "--length_penalty=1"]
        self.assertEqual(expanded, [*lite, *own, "--seed=3"])

    def test_every_shipped_flagfile_is_a_valid_config(self):
        from absl import flags

        configs = {}
        for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
            if name.endswith(".flags"):
                values = flags.FlagValues()
                flags_lib.define_config_flags(values)
                values(["sat-train", *flags_lib.expand_flagfiles([f"--flagfile={name}"])])
                configs[name] = flags_lib.config_from_flags(values)
        self.assertIn("coco.flags", configs)
        hard = configs["flickr8k_grid14_hard.flags"]
        soft = configs["flickr8k_grid14.flags"]
        self.assertEqual(
            (hard.attention, hard.epochs, soft.attention, soft.epochs), ("hard", 10, "soft", 6)
        )
        self.assertEqual(hard.encoder, soft.encoder)
        located = configs["flickr8k_grid14_located.flags"]
        self.assertEqual((located.location_prior, located.dropout), (True, 0.3))
        self.assertEqual((soft.location_prior, soft.dropout), (False, 0.5))
        self.assertEqual(located.encoder, soft.encoder)

    def test_flagfile_without_absl_lookup_reads_the_same(self):
        # A flagfile given by its path: the lookup is not involved; absl alone agrees.
        path = os.path.join(self.dir, "run.flags")
        with open(path, "w", encoding="utf-8") as f:
            f.write("# comment\n// also a comment\n\n--batch_size=5\n--attention=none\n")
        from absl import flags

        self.assertEqual(
            flags_lib.expand_flagfiles(["--seed=1", "--flagfile", path]),
            flags.FlagValues().read_flags_from_files(["--seed=1", f"--flagfile={path}"]),
        )
        self.assertEqual(
            flags_lib.expand_flagfiles([f"--flagfile={path}"]),
            ["--batch_size=5", "--attention=none"],
        )


class RunTwiceTest(tf.test.TestCase):
    def test_flags_start_from_their_defaults_on_every_run(self):
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        metrics = os.path.join(folder, "metrics.json")
        with open(metrics, "w", encoding="utf-8") as f:
            json.dump({f"BLEU-{n}": 0.5 / n for n in range(1, 5)}, f)
        table = os.path.join(folder, "table.md")
        code, first, _ = run_main(table_cli.main, "sat-table", f"--output={table}", f"a={metrics}")
        self.assertEqual(code, 0)
        self.assertTrue(os.path.exists(table))
        os.remove(table)
        code, second, _ = run_main(table_cli.main, "sat-table", f"a={metrics}")
        self.assertEqual(code, 0)
        self.assertEqual(first, second)
        self.assertFalse(os.path.exists(table), "--output of the first run was kept")
        self.assertIn("| a (coco-caption BLEU, with brevity penalty) | 50.0 | 25.0 | 16.7 |", first)
        np.testing.assert_equal(os.listdir(folder), ["metrics.json"])


if __name__ == "__main__":
    absltest.main()
