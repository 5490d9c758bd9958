"""Tests for the console commands, run in process (`main(argv)`): the entry points that
setup.py declares, the scripts that stay shims of them, --help without log lines, the
demo without Flask, sat-export's length, sat-train's help (sat-caption: caption_test.py;
flagfiles and a command run twice in one process: flags_lib_test.py; sat-table's seeds:
table_test.py)."""

import contextlib
import importlib
import io
import os
import re
import runpy
import subprocess
import sys
from unittest import mock

import tensorflow as tf
from api_test import PRESET

import sat_tf
import sat_tf.cli
from sat_tf import config
from sat_tf.cli import flags_lib
from sat_tf.cli import train as train_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "train": "scripts/train.py",
    "evaluate": "scripts/evaluate.py",
    "caption": "scripts/caption.py",
    "export": "export/export.py",
    "demo": "scripts/demo.py",
    "extract_features": "scripts/extract_features.py",
    "table": "scripts/table.py",
    "make_preset": "scripts/make_preset.py",
    "grounding": "scripts/grounding.py",
    "off_world": "scripts/off_world.py",
    "serve": "scripts/serve.py",
    "caption_beam": "scripts/caption_beam.py",
    "extract_features_beam": "scripts/extract_features_beam.py",
}


def run_main(main, *argv, cwd=None):
    """(exit status, stdout, stderr) of `main(argv)` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        os.chdir(previous)
    return code, out.getvalue(), err.getvalue()


def declared_entry_points():
    """setup.py's console_scripts, read by running setup.py with `setup` replaced."""
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with mock.patch("setuptools.setup") as setup:
            runpy.run_path(os.path.join(ROOT, "setup.py"))
    finally:
        os.chdir(cwd)
    scripts = setup.call_args.kwargs["entry_points"]["console_scripts"]
    return dict(re.fullmatch(r"\s*(\S+)\s*=\s*(\S+)\s*", s).groups() for s in scripts)


class EntryPointsTest(tf.test.TestCase):
    def test_every_command_is_declared_and_has_a_main(self):
        declared = declared_entry_points()
        want = {f"sat-{name.replace('_', '-')}": f"sat_tf.cli.{name}:main" for name in COMMANDS}
        self.assertEqual(declared, want)
        for target in declared.values():
            module, function = target.split(":")
            self.assertTrue(callable(getattr(importlib.import_module(module), function)), target)

    def test_scripts_are_shims_of_the_commands(self):
        for name, script in COMMANDS.items():
            with open(os.path.join(ROOT, script), encoding="utf-8") as f:
                text = f.read()
            code = [line for line in text.splitlines() if line]
            self.assertEqual(
                code[1:], [f"from sat_tf.cli.{name} import main", "raise SystemExit(main())"]
            )


class QuietCommandsTest(tf.test.TestCase):
    def test_help_exits_0_for_every_command(self):
        for name in COMMANDS:
            module = importlib.import_module(f"sat_tf.cli.{name}")
            for flag in ("--help", "-h", "--helpfull"):
                self.assertEqual(run_main(module.main, f"sat-{name}", flag)[0], 0, (name, flag))
            self.assertNotRegex(module.__doc__, r"python (scripts|export)/", name)

    def test_help_prints_no_log_line(self):
        done = subprocess.run(
            [sys.executable, "scripts/caption.py", "--help"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": ""},
            capture_output=True,
            text=True,
        )
        self.assertEqual((done.returncode, done.stderr), (0, ""))
        self.assertIn("flickr8k_lite0_grid14_soft", done.stdout)
        self.assertIn("--max_image_pixels", done.stdout)
        self.assertTrue(sat_tf.cli.verbose(["sat-caption", "-v", "1"]))
        self.assertTrue(sat_tf.cli.verbose(["sat-caption", "--verbosity=1"]))
        self.assertFalse(sat_tf.cli.verbose(["sat-caption", "photo.jpg"]))

    def test_the_demo_without_flask_says_which_install_brings_it(self):
        with mock.patch.dict(sys.modules, {"flask": None}):
            for name in ("sat_tf.cli.demo", "sat_tf.server.demo"):
                sys.modules.pop(name, None)
            demo_cli = importlib.import_module("sat_tf.cli.demo")
            self.assertEqual(run_main(demo_cli.main, "sat-demo", "--help")[0], 0)
            code, _, stderr = run_main(demo_cli.main, "sat-demo", f"--preset={PRESET}")
        self.assertEqual(code, 1)
        self.assertEqual(
            stderr,
            "error: the demo needs Flask, which sat_tf installs with its demo extra: "
            'pip install "sat_tf[demo]"\n',
        )
        for name in ("sat_tf.cli.demo", "sat_tf.server.demo"):
            sys.modules.pop(name, None)


def test_sat_demo_serves_the_default_preset_without_a_model_flag(tmp_path):
    from sat_tf.cli import demo as demo_cli

    loaded = mock.Mock(off_world="stats")
    loaded.__getitem__ = lambda self, key: ("model", "vocab", "config")[key]
    demo_cli.FLAGS.unparse_flags()  # what an earlier test parsed
    demo_cli.FLAGS(["sat-demo"])
    try:
        with (
            mock.patch.object(demo_cli, "load_trained", return_value=loaded) as load,
            mock.patch("sat_tf.server.demo.export_decodings", return_value=["a", "b"]) as export,
        ):
            assert demo_cli.export_dirs(str(tmp_path)) == ["a", "b"]
        assert demo_cli.FLAGS.preset == flags_lib.DEFAULT_PRESET
        load.assert_called_once_with(demo_cli.FLAGS)
        export.assert_called_once_with(
            ("model", "vocab", "config"), str(tmp_path), off_world="stats"
        )
    finally:
        demo_cli.FLAGS.unparse_flags()


def test_sat_export_exports_with_the_max_decode_length_given(tmp_path):
    from sat_tf.cli import export as export_cli

    output = str(tmp_path / "1")
    trained = ("model", "vocab", "config", "off-world", None)
    with (
        mock.patch.object(export_cli, "load_trained", return_value=trained),
        mock.patch("sat_tf.serving.exporting.export", return_value={"max_length": 7}) as export,
    ):
        argv = ["sat-export", f"--preset={PRESET}", f"--output={output}"]
        code, out, err = run_main(export_cli.main, *argv, "--max_decode_length=7")
    assert code == 0, err
    assert export.call_args.kwargs["max_length"] == 7
    assert '"max_length": 7' in out


def test_sat_train_help_reads_by_task_and_lists_each_flag_once():
    code, out, _ = run_main(train_cli.main, "sat-train", "--help")
    assert code == 0
    assert run_main(train_cli.main, "sat-train", "-h")[1] == out
    first_lines = "\n".join(out.splitlines()[:25])
    for name in ("dataset", "data_dir", "workdir"):
        assert f"\n  --{name}: " in first_lines, name
    listed = re.findall(r"^  --(?:\[no\])?(\w+):", out, flags=re.MULTILINE)
    assert sorted(listed) == sorted([*train_cli.FLAGS, "verbose"])
    head = ["dataset", "data_dir", "workdir", "captions", "init_from", "epochs", "encoder"]
    head += ["attention", "batch_size", "learning_rate", "beam_size", "verbose"]
    rest = [name for names in config.SECTIONS.values() for name in names if name not in head]
    assert listed == head + rest
    program = os.path.basename(sys.argv[0])
    headings = re.findall(r"^(\S.*):$", out.split("\nflags:\n", 1)[1], flags=re.MULTILINE)
    numbered = [f"{program} settings, {i}. {s}" for i, s in enumerate(config.SECTIONS, 1)]
    assert headings == [program, *numbered]
    assert out.endswith("\nTry --helpfull to get a list of all flags.\n")


def test_sat_train_helpfull_is_absls_list_with_a_heading_per_section():
    code, out, _ = run_main(train_cli.main, "sat-train", "--helpfull")
    assert code == 0 and "absl.flags:" in out
    headings = re.findall(r"^\S+ settings, \d+\. (.+):$", out, flags=re.MULTILINE)
    assert headings == list(config.SECTIONS)
    for section, names in config.SECTIONS.items():
        block = out.split(f". {section}:\n", 1)[1].split("\n\n", 1)[0]
        shown = re.findall(r"^  --(?:\[no\])?(\w+)", block, flags=re.MULTILINE)
        assert sorted(shown) == sorted(n for n in names if n not in config.ESSENTIAL), section


if __name__ == "__main__":
    tf.test.main()
