"""Tests for sat-caption-beam (sat_tf.cli.caption_beam; its options: launch_test.py): the
refusals before anything runs (a local path for a remote runner among them, no process
or connection started), a run from a workdir on the DirectRunner's batch engine that
leaves nothing behind, and an import that loads neither TensorFlow nor Beam."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from unittest import mock

import tensorflow as tf
from caption_pipeline_test import photo_folder, read_rows, tiny_export
from fixtures import run_main

from sat_tf.cli import caption_beam

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FlagsTest(tf.test.TestCase):
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
            ): "--preset / --workdir export to a local folder, which the workers of "
            "DataflowRunner cannot read",
            ("--input=a", "--output=o", "--export=e", "--max_image_bytes=0"): (
                "--max_image_bytes=0 must be at least 1"
            ),
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

    def test_remote_runners_refuse_local_paths_before_anything_starts(self):
        remote = "s3://bucket/"
        cases = {
            ("--runner=FlinkRunner", f"--export={remote}e", "--input=photos/*.jpg"): (
                "--input=photos/*.jpg is a path on this machine, which the workers of "
                "FlinkRunner cannot read"
            ),
            ("--runner=DataflowRunner", "--export=exports/1", f"--input={remote}*.jpg"): (
                "--export=exports/1 is a path on this machine, which the workers of "
                "DataflowRunner cannot read"
            ),
            (
                "--runner=PortableRunner",
                "--environment_type=EXTERNAL",
                f"--export={remote}e",
                f"--input={remote}*.jpg",
                "--output=runs/c",
            ): "--output=runs/c is a path on this machine, which the workers of PortableRunner",
        }
        for flags, message in cases.items():
            output = () if any(f.startswith("--output") for f in flags) else ("--output=s3://b/o",)
            with (
                mock.patch.object(subprocess, "Popen", side_effect=AssertionError("started")),
                mock.patch.object(socket, "create_connection", side_effect=AssertionError("net")),
            ):
                code, stdout, stderr = run_main(
                    caption_beam.main, "sat-caption-beam", *flags, *output
                )
            self.assertEqual((code, stdout), (1, ""), flags)
            self.assertStartsWith(stderr, f"error: {message}")
            self.assertIn("give one on a filesystem they share (gs://, s3://, hdfs://)", stderr)
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
        cwd, temp = os.path.join(root, "cwd"), os.path.join(root, "tmp")
        os.makedirs(cwd)
        os.makedirs(temp)
        with mock.patch.object(tempfile, "tempdir", temp):
            code, stdout, stderr = run_main(
                caption_beam.main,
                "sat-caption-beam",
                f"--workdir={workdir}",
                f"--input={os.path.join(root, '*.png')}",
                f"--input={os.path.join(root, '*.jpeg')}",
                f"--output={prefix}",
                "--direct_running_mode=in_memory",
                "--num_shards=2",
                cwd=cwd,
            )
        # The temporary export is removed, nothing lands in the working directory.
        self.assertEqual((os.listdir(temp), os.listdir(cwd)), ([], []))
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
