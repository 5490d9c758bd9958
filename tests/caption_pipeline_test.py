"""Tests for sat_tf.pipelines.caption_pipeline on the DirectRunner's batch engine: the rows
of a tiny export equal its signature called directly and sat-caption's lines, every
kind of bad file is a row with its status and reason, and the counts are Beam metrics."""

import atexit
import functools
import glob
import json
import os
import shutil
import tempfile
from unittest import mock

import tensorflow as tf
from admission_test import png_bomb
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from fixtures import encode, run_main, scenes, tiny_workdir

from sat_tf.cli import caption as caption_cli
from sat_tf.data import image_io
from sat_tf.pipelines import caption_pipeline, caption_rows
from sat_tf.serving import exporting

OPTIONS = ["--runner=FnApiRunner", "--direct_running_mode=in_memory"]


@functools.cache
def tiny_export():
    """(the tiny model's workdir, its export), made once per process."""
    root = tempfile.mkdtemp(prefix="caption_pipeline_test_")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    workdir, model, vocab, config = tiny_workdir(root)
    export = os.path.join(root, "export")
    exporting.export(model, vocab, config, export)
    return workdir, export


def photo_folder(root):
    """Writes 5 photos (mixed sizes and formats) and one bad file of each kind into
    `root`; returns ([good paths], {bad path: status})."""
    good = []
    for i, image in enumerate([*scenes(0, 4), scenes(3, 1, 90, 130)[0]]):
        fmt = ("PNG", "JPEG")[i % 2]
        good.append(os.path.join(root, f"photo{i}.{fmt.lower()}"))
        with open(good[-1], "wb") as f:
            f.write(encode(image, fmt))
    png = encode(scenes(4, 1)[0], "PNG")
    bad = {
        "empty.png": (b"", image_io.EMPTY),
        "notes.jpg": (b"shopping list: milk, eggs\n", image_io.NOT_AN_IMAGE),
        "cut.png": (png[: len(png) // 2], image_io.CORRUPT),
        "bomb.png": (png_bomb(), image_io.TOO_MANY_PIXELS),
    }
    for name, (data, _) in bad.items():
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
    return good, {os.path.join(root, name): status for name, (_, status) in bad.items()}


def read_rows(prefix):
    """{path: row} of every line of the files `<prefix>-*.jsonl`, each path once."""
    rows = {}
    for name in sorted(glob.glob(f"{prefix}-*-of-*.jsonl")):
        with open(name, encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                assert row["path"] not in rows, row["path"]
                rows[row["path"]] = row
    return rows


class CaptionPipelineTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.workdir, cls.export = tiny_export()
        photos = os.path.join(cls.root, "photos")
        os.makedirs(photos)
        cls.good, cls.bad = photo_folder(photos)
        cls.missing = os.path.join(cls.root, "elsewhere", "*.jpg")
        cls.prefix = os.path.join(cls.root, "out", "captions")
        cls.counts = caption_pipeline.run(
            cls.export,
            [os.path.join(photos, "*"), cls.missing],
            cls.prefix,
            PipelineOptions(OPTIONS),
            batch_size=3,
        )
        cls.rows = read_rows(cls.prefix)

    def test_every_file_once_and_counted(self):
        self.assertCountEqual(self.rows, [*self.good, *self.bad, self.missing])
        self.assertEqual(self.counts, {"captioned": len(self.good), "refused": len(self.bad) + 1})

    def test_rows_equal_the_export_called_directly(self):
        data = []
        for path in self.good:
            with open(path, "rb") as f:
                data.append(f.read())
        outputs = tf.saved_model.load(self.export).signatures["serving_default"](
            image_bytes=tf.constant(data)
        )
        outputs = {k: v.numpy() for k, v in outputs.items()}
        captions = set()
        for i, path in enumerate(self.good):
            want = caption_rows.export_row(path, {k: v[i] for k, v in outputs.items()})
            got = self.rows[path]
            self.assertAllClose(got.pop("score"), want.pop("score"), rtol=1e-5)
            self.assertEqual(got, want)
            captions.add(want["caption"])
        self.assertGreater(len(captions), 2)  # the captions depend on the photo

    def test_rows_equal_sat_caption_output(self):
        output = os.path.join(self.root, "sat_caption.jsonl")
        code, _, stderr = run_main(
            caption_cli.main,
            "sat-caption",
            f"--workdir={self.workdir}",
            f"--output={output}",
            *self.good,
        )
        self.assertEqual(code, 0, stderr)
        with open(output, encoding="utf-8") as f:
            want = [json.loads(line) for line in f]
        self.assertLen(want, len(self.good))
        for row in want:
            got = dict(self.rows[row["path"]])
            self.assertAllClose(got.pop("score"), row.pop("score"), rtol=1e-5)
            self.assertEqual(got, row)

    def test_each_bad_file_is_a_row_with_its_status_and_reason(self):
        reasons = {
            image_io.EMPTY: "is empty (0 bytes)",
            image_io.NOT_AN_IMAGE: "is not a JPEG, PNG",
            image_io.CORRUPT: "truncated or corrupt",
            image_io.TOO_MANY_PIXELS: "529,000,000 pixels (23000 x 23000)",
        }
        for path, status in self.bad.items():
            row = self.rows[path]
            self.assertEqual(sorted(row), ["error", "path", "status"])
            self.assertEqual(row["status"], status, row)
            self.assertStartsWith(row["error"], path)
            self.assertIn(reasons[status], row["error"])
        row = self.rows[self.missing]
        self.assertEqual(row["status"], caption_rows.MISSING)
        self.assertStartsWith(row["error"], f"no file {self.missing!r}")

    def test_a_file_that_cannot_be_read_is_a_row(self):
        folder = os.path.join(self.root, "a_folder.jpg")
        os.makedirs(folder, exist_ok=True)
        gone = os.path.join(self.root, "gone.jpg")
        for path in (folder, gone):
            (row,) = caption_pipeline.ReadFiles().process((path, 10))
            self.assertEqual(row.tag, "refused")
            self.assertEqual(row.value["status"], caption_rows.MISSING)
            self.assertStartsWith(row.value["error"], f"{path} cannot be read")


class SizeFirstTest(tf.test.TestCase):
    """A file's listed size decides before its bytes: one over the limit is a row naming
    its size and is never opened; one that grew past it since it was listed is refused."""

    def test_a_file_over_the_limit_is_refused_unread(self):
        path = os.path.join(self.get_temp_dir(), "huge.jpg")
        with open(path, "wb") as f:
            f.write(b"\xff\xd8\xff" + bytes(997))
        ((listed_path, size),) = caption_pipeline.Match().process(path)
        self.assertEqual((listed_path, size), (path, 1000))
        read = caption_pipeline.ReadFiles(max_image_bytes=999)
        with mock.patch.object(FileSystems, "open", side_effect=AssertionError("read")):
            (row,) = read.process((path, size))
        self.assertEqual(row.tag, "refused")
        self.assertEqual(row.value["status"], caption_rows.TOO_LARGE)
        self.assertEqual(
            row.value["error"],
            f"{path} is 1,000 bytes, more than the 999 bytes a photo may have "
            "(--max_image_bytes); it was not read",
        )
        ((got, data),) = caption_pipeline.ReadFiles(max_image_bytes=1000).process((path, size))
        self.assertEqual((got, len(data)), (path, 1000))
        (row,) = read.process((path, 10))  # listed small, grown since
        self.assertEqual(row.value["status"], caption_rows.TOO_LARGE)
        self.assertIn("grew past the 999 bytes", row.value["error"])
