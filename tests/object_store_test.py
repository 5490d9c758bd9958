"""Both Beam pipelines where Beam runs (slow tests): photos, models and outputs on an S3
store (a moto server on a free port of 127.0.0.1) reached only through Beam's --s3_*
options, never AWS_* variables or ~/.aws (the commands run with neither), in worker
processes (`--direct_running_mode=multi_processing`, two of them) and through Beam's
portable runner and its Python job service, with a LOOPBACK environment and with an
EXTERNAL worker pool (`worker_pool_main`) whose workers are processes of their own, as
on a cluster. Each run leaves nothing in the working directory, nothing in TMPDIR and no
object in the bucket but the inputs and the outputs."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from unittest import mock

import pytest
import tensorflow as tf
from caption_pipeline_test import photo_folder, tiny_export
from extract_pipeline_test import SHARDS, CocoCache
from feature_cache_test import IMAGE_SIZE, _bleu4_only
from fixtures import run_main, s3_client, upload_folder

from sat_tf.cli import caption as caption_cli
from sat_tf.cli import caption_beam
from sat_tf.cli import train as train_cli
from sat_tf.data import feature_cache
from sat_tf.evaluation import metrics
from sat_tf.pipelines import caption_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "store"
# Past the photos of `photo_folder` (at most ~40 KB), below HUGE.
MAX_BYTES = 100_000
HUGE = 300_000
SECONDS = 120  # the most a server may take to answer, or a command to end


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(ready, what):
    """Polls `ready()` every 0.1 s until it is true, for at most `SECONDS`."""
    deadline = time.monotonic() + SECONDS
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not start within {SECONDS} s")
        time.sleep(0.1)


def answers(url):
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except OSError:
        return False
    return True


def listens(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class Store:
    """A mixin: a moto S3 server for the class, its bucket, an environment without AWS_*
    variables whose HOME and TMPDIR are empty folders of the class (also this process's
    for the class: botocore reads neither), and the store's --s3_* options (`s3`)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.scratch = tempfile.mkdtemp(prefix="object_store_")
        cls.addClassCleanup(shutil.rmtree, cls.scratch, ignore_errors=True)
        cls.home, cls.tmp = os.path.join(cls.scratch, "home"), os.path.join(cls.scratch, "tmp")
        os.makedirs(cls.home)
        os.makedirs(cls.tmp)
        cls.env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        cls.env.update(HOME=cls.home, TMPDIR=cls.tmp, PYTHONPATH=ROOT)
        environ = cls.enterClassContext(mock.patch.dict(os.environ, cls.env))
        for name in [k for k in environ if k.startswith("AWS_")]:
            del environ[name]
        port = free_port()
        cls.endpoint = f"http://127.0.0.1:{port}"
        cls.moto_log = os.path.join(cls.scratch, "moto.log")
        cls.start(["-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], cls.moto_log)
        wait_for(lambda: answers(f"{cls.endpoint}/moto-api/"), "the moto server")
        cls.client = s3_client(cls.endpoint)
        cls.client.create_bucket(Bucket=BUCKET)
        cls.s3 = [
            f"--s3_endpoint_url={cls.endpoint}",
            "--s3_access_key_id=k",
            "--s3_secret_access_key=s",
            "--s3_region_name=us-east-1",
        ]

    @classmethod
    def start(cls, args, log):
        """Starts `python args` in the class's environment until the class ends."""
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, *args], env=cls.env, stdout=out, stderr=subprocess.STDOUT
            )

        def stop():
            process.terminate()
            process.wait(timeout=SECONDS)

        cls.addClassCleanup(stop)
        return process

    def command(self, script, *args):
        """(exit status, stdout, stderr) of `python scripts/<script>.py args` in a fresh
        process, in an empty working directory, which stays empty."""
        cwd = tempfile.mkdtemp(dir=self.scratch)
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "scripts", f"{script}.py"), *args],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=10 * SECONDS,
        )
        self.assertEqual(os.listdir(cwd), [], done.stderr[-3000:])
        return done.returncode, done.stdout, done.stderr

    def objects(self, prefix=""):
        """{key: size} of the bucket's objects under `prefix`."""
        found = self.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        return {o["Key"]: o["Size"] for o in found}

    def read(self, key) -> bytes:
        return self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def setUp(self):
        super().setUp()
        self.tmp_before = set(os.listdir(self.tmp))
        self.keys_before = set(self.objects())

    def assertNothingLeftBehind(self, inputs, outputs, beam_staged=False):
        """The bucket holds what it held when the test began, `inputs` and keys under the
        `outputs` prefixes, and no temporary object; TMPDIR holds nothing new, or
        (`beam_staged`: a portable runner, whose launcher and job service stage the
        pipeline's files there) nothing new of the package's (its temporary names begin
        with `sat_`)."""
        keys = set(self.objects())
        made = keys - set(inputs) - self.keys_before
        self.assertEqual({k for k in made if not k.startswith(tuple(outputs))}, set())
        self.assertEqual([k for k in keys if ".tmp" in k or "beam-temp" in k], [])
        new = set(os.listdir(self.tmp)) - self.tmp_before
        if beam_staged:
            new = {n for n in new if n.startswith("sat_")}
        self.assertEqual(new, set())


@pytest.mark.slow
class CaptionPipelineOnS3Test(Store, tf.test.TestCase):
    """sat-caption-beam on photos and an export on S3, in two worker processes, and
    through the portable runner (LOOPBACK, and an EXTERNAL pool)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir, export = tiny_export()
        photos = os.path.join(cls.scratch, "photos")
        os.makedirs(photos)
        cls.good, bad = photo_folder(photos)
        with open(os.path.join(photos, "huge.jpg"), "wb") as f:
            f.write(b"\xff\xd8\xff" + bytes(HUGE - 3))
        cls.bad = {f"s3://{BUCKET}/photos/{os.path.basename(p)}": s for p, s in bad.items()}
        cls.bad[f"s3://{BUCKET}/photos/huge.jpg"] = caption_rows.TOO_LARGE
        cls.inputs = upload_folder(export, f"s3://{BUCKET}/export", cls.client)
        cls.inputs += upload_folder(photos, f"s3://{BUCKET}/photos", cls.client)
        cls.inputs = [p[len(f"s3://{BUCKET}/") :] for p in cls.inputs]
        output = os.path.join(cls.scratch, "sat_caption.jsonl")
        code, _, stderr = run_main(
            caption_cli.main,
            "sat-caption",
            f"--workdir={cls.workdir}",
            f"--output={output}",
            *cls.good,
        )
        assert code == 0, stderr
        with open(output, encoding="utf-8") as f:
            cls.want = {os.path.basename(row["path"]): row for row in map(json.loads, f)}

    def caption_args(self, output):
        return [
            f"--export=s3://{BUCKET}/export",
            f"--input=s3://{BUCKET}/photos/*",
            f"--output=s3://{BUCKET}/{output}/captions",
            f"--max_image_bytes={MAX_BYTES}",
            *self.s3,
        ]

    def assertRowsRight(self, output, stdout, beam_staged=False):
        """Every photo once: the good ones with sat-caption's captions, the bad ones
        (the huge one among them, never read) as error rows; nothing left behind."""
        rows = {}
        for key in self.objects(f"{output}/"):
            for line in self.read(key).decode().splitlines():
                row = json.loads(line)
                self.assertNotIn(row["path"], rows)
                rows[row["path"]] = row
        good = {f"s3://{BUCKET}/photos/{os.path.basename(p)}" for p in self.good}
        self.assertEqual(set(rows), good | set(self.bad))
        alike = sum(rows[p]["caption"] == self.want[p.rsplit("/", 1)[1]]["caption"] for p in good)
        self.assertGreaterEqual(alike / len(good), 0.98)
        for path, status in self.bad.items():
            self.assertEqual(rows[path]["status"], status, rows[path])
        huge = rows[f"s3://{BUCKET}/photos/huge.jpg"]["error"]
        self.assertIn(f"is {HUGE:,} bytes, more than the {MAX_BYTES:,} bytes", huge)
        with open(self.moto_log, encoding="utf-8", errors="replace") as f:
            reads = [line for line in f if "GET /store/photos/huge.jpg" in line]
        self.assertEqual(reads, [])
        self.assertEqual(
            stdout,
            f"captioned {len(good)}, refused {len(self.bad)}: "
            f"s3://{BUCKET}/{output}/captions-*.jsonl\n",
        )
        self.assertNothingLeftBehind(self.inputs, [f"{output}/"], beam_staged)

    def test_two_worker_processes(self):
        code, stdout, stderr = self.command(
            "caption_beam",
            *self.caption_args("processes"),
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        )
        self.assertEqual(code, caption_beam.REFUSED, stderr[-3000:])
        self.assertRowsRight("processes", stdout)

    def portable(self, output, *environment):
        """sat-caption-beam through a job service of its own, in this process."""
        port = free_port()
        self.start(
            ["-m", "apache_beam.runners.portability.local_job_service_main", f"--port={port}"],
            os.path.join(self.scratch, f"job_service_{output}.log"),
        )
        wait_for(lambda: listens(port), "the job service")
        args = ["--runner=PortableRunner", f"--job_endpoint=localhost:{port}", *environment]
        with mock.patch.object(tempfile, "tempdir", self.tmp):  # this process's TMPDIR
            code, stdout, stderr = run_main(
                caption_beam.main, "sat-caption-beam", *self.caption_args(output), *args
            )
        self.assertEqual(code, caption_beam.REFUSED, stderr[-3000:])
        self.assertRowsRight(output, stdout, beam_staged=True)

    def test_portable_loopback(self):
        self.portable("loopback", "--environment_type=LOOPBACK")

    def test_portable_external_worker_pool(self):
        port = free_port()
        self.start(
            ["-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
            os.path.join(self.scratch, "worker_pool.log"),
        )
        wait_for(lambda: listens(port), "the worker pool")
        self.portable(
            "external", "--environment_type=EXTERNAL", f"--environment_config=localhost:{port}"
        )


@pytest.mark.slow
class FeaturePipelineOnS3Test(Store, CocoCache, tf.test.TestCase):
    """sat-extract-features-beam from photos on S3 to a cache on S3, in two worker
    processes, equal to sat-extract-features' local one; sat-train trains on it."""

    def test_the_cache_written_to_s3_and_trained_on_from_there(self):
        inputs = upload_folder(self.data_dir, f"s3://{BUCKET}/coco", self.client)
        inputs = [p[len(f"s3://{BUCKET}/") :] for p in inputs]
        address = f"s3://{BUCKET}/features"
        settings = [
            "--dataset=coco",
            "--encoder=shapes_cnn",
            f"--encoder_weights={self.weights}",
            f"--image_size={IMAGE_SIZE}",
            f"--feature_dir={address}",
            f"--cache_dir={os.path.join(self.scratch, 'cache')}",
        ]
        code, stdout, stderr = self.command(
            "extract_features_beam",
            f"--data_dir=s3://{BUCKET}/coco",
            *settings,
            "--shard_size=2",
            "--extract_batch_size=2",
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
            *self.s3,
        )
        self.assertEqual(code, 0, stderr[-3000:])
        self.assertEqual(
            stdout.splitlines()[-1], "shards: 3 encoded, 0 complete from an earlier run"
        )
        self.assertEqual(
            set(self.objects("features/")),
            {f"features/{n}" for n in [*SHARDS, feature_cache.INDEX_FILE]},
        )
        self.assertNothingLeftBehind(inputs, ["features/"])
        with mock.patch.object(metrics, "coco_scores", _bleu4_only):
            code, stdout, stderr = run_main(
                train_cli.main,
                "sat-train",
                f"--workdir={os.path.join(self.scratch, 'run')}",
                f"--data_dir={self.data_dir}",
                *settings,
                "--use_feature_cache",
                *("--vocab_size=12", "--max_caption_length=8", "--embed_dim=8"),
                *("--hidden_dim=16", "--attention_dim=8", "--batch_size=2", "--epochs=1"),
                *("--steps_per_epoch=2", "--eval_images=0", "--max_decode_length=5"),
                *self.s3,
            )
        self.assertEqual(code, 0, stderr[-3000:])
        scores = json.loads(re.search(r"^\{$.*^\}$", stdout, re.M | re.S)[0])
        self.assertBetween(scores["BLEU-4"], 0.0, 1.0)
        copy = os.path.join(self.scratch, "cache", "copies")
        (folder,) = os.listdir(copy)
        self.assertSameCache(os.path.join(copy, folder), self.serial)
        # Training read the copy and wrote nothing to the bucket.
        self.assertEqual(set(self.objects()), set(inputs) | set(self.objects("features/")))
        self.assertEqual(len(self.objects("features/")), len(SHARDS) + 1)


if __name__ == "__main__":
    tf.test.main()
