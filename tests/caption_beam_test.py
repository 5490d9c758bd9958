"""Tests for sat-caption-beam (sat_tf.cli.caption_beam): its flags apart from the Beam
pipeline options, the refusals before anything runs, a run from a workdir on the
DirectRunner's batch engine, and an import that loads neither TensorFlow nor Beam."""

import os
import shutil
import subprocess
import sys
import tempfile

import tensorflow as tf
from caption_pipeline_test import photo_folder, read_rows, tiny_export
from fixtures import run_main

from sat_tf.cli import caption_beam

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FlagsTest(tf.test.TestCase):
    def test_own_flags_and_pipeline_options_apart(self):
        argv = ["sat-caption-beam", "--export=e", "--input", "a*.jpg", "--runner", "DirectRunner"]
        argv += ["--direct_num_workers=2", "-v", "--batch_size", "4", "--save_main_session"]
        argv += ["--input=b.jpg"]
        own, pipeline = caption_beam.split_args(argv)
        self.assertEqual(
            own,
            ["sat-caption-beam", "--export=e", "--input", "a*.jpg", "-v", "--batch_size", "4"]
            + ["--input=b.jpg"],
        )
        self.assertEqual(
            pipeline,
            ["--runner", "DirectRunner", "--direct_num_workers=2", "--save_main_session"],
        )

    def test_default_options_are_the_measured_local_ones(self):
        options = caption_beam.pipeline_options([]).get_all_options()
        self.assertEqual(options["runner"], "FnApiRunner")
        self.assertEqual(options["direct_running_mode"], "multi_threading")
        self.assertEqual(options["direct_num_workers"], 2)
        given = caption_beam.pipeline_options(["--runner=DirectRunner"]).get_all_options()
        self.assertEqual(given["direct_running_mode"], "in_memory")  # Beam's own default

    def test_an_unknown_flag_is_named_with_the_closest(self):
        with self.assertRaisesRegex(
            ValueError, "unknown flag --direct_num_worker=2: .*did you mean --direct_num_workers"
        ):
            caption_beam.pipeline_options(["--direct_num_worker=2"])

    def test_refusals_before_anything_runs(self):
        cases = {
            ("--output=o",): "give --input=",
            ("--input=a.jpg",): "give --output=",
            ("--input=a", "--output=o", "--export=e", "--preset=p"): "give --export or --preset",
            (
                "--input=a",
                "--output=o",
                "--preset=p",
                "--runner=DataflowRunner",
            ): "DataflowRunner's workers cannot read",
            (
                "--input=a",
                "--output=o",
                "--export=e",
                "--direct_num_worker=2",
            ): "unknown flag --direct_num_worker=2",
        }
        for flags, message in cases.items():
            code, stdout, stderr = run_main(caption_beam.main, "sat-caption-beam", *flags)
            self.assertEqual(code, 1, flags)
            self.assertStartsWith(stderr, "error: ")
            self.assertIn(message, stderr)
            self.assertEqual(stderr.count("\n"), 1, stderr)

    def test_import_loads_neither_tensorflow_nor_beam(self):
        script = (
            "import sys; sys.argv = ['sat-caption-beam', '-v']; import sat_tf.cli.caption_beam; "
            "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))"
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.strip(), "[]")


class CommandTest(tf.test.TestCase):
    def test_a_workdir_exported_and_captioned(self):
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        good, bad = photo_folder(root)
        workdir, _ = tiny_export()
        prefix = os.path.join(root, "out", "c")
        code, stdout, stderr = run_main(
            caption_beam.main,
            "sat-caption-beam",
            f"--workdir={workdir}",
            f"--input={os.path.join(root, '*.png')}",
            f"--input={os.path.join(root, '*.jpeg')}",
            f"--output={prefix}",
            "--direct_running_mode=in_memory",
            "--num_shards=2",
        )
        refused = [p for p in bad if p.endswith(".png")]
        self.assertEqual(code, caption_beam.REFUSED, stderr)
        self.assertEqual(
            stdout, f"captioned {len(good)}, refused {len(refused)}: {prefix}-*.jsonl\n"
        )
        self.assertIn(f"error: {len(refused)} photos not captioned", stderr)
        self.assertLen(os.listdir(os.path.dirname(prefix)), 2)
        rows = read_rows(prefix)
        self.assertCountEqual(rows, [*good, *refused])
        self.assertCountEqual([p for p in rows if "error" in rows[p]], refused)
