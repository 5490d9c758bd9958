"""Tests for sat_tf.serving.demo and scripts/demo.py: captions equal the SavedModel's own
`serving_default` outputs, bad uploads get one-line messages while the server goes on,
20 concurrent requests, and the script writes nothing outside its temporary folders.

The exports are a tiny untrained model, written once per process (`exports`) through
`demo.export_decodings`, the path `scripts/demo.py --workdir` takes.
"""

import atexit
import base64
import concurrent.futures
import functools
import io
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
import requests
import tensorflow as tf
from absl.testing import absltest, parameterized
from fixtures import encode, run_main, scenes, tiny_model, tiny_workdir
from PIL import Image

from sat_tf.data import image_io
from sat_tf.evaluation import visualize
from sat_tf.server import batching
from sat_tf.serving import inference, off_world, warmup

# The `demo` extra (pip install -e ".[demo]"): without Flask these tests are skipped.
pytest.importorskip("flask")

from sat_tf.cli import demo as demo_cli  # noqa: E402
from sat_tf.server import demo  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLICKR8K = os.path.join(os.path.dirname(REPO), "shared", "data", "flickr8k")
# Files a library writes in $HOME when imported: Keras's config, matplotlib's font cache.
LIBRARY_CACHES = (
    ".keras",
    os.path.join(".cache", "matplotlib"),
    os.path.join(".config", "matplotlib"),
)


@functools.cache
def exports():
    """(the tiny model's workdir, [greedy export, beam-3 export]), made once per process."""
    root = tempfile.mkdtemp(prefix="demo_test_")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    workdir = tiny_workdir(root)[0]
    return workdir, demo.export_decodings(
        inference.load_workdir(workdir), os.path.join(root, "exports")
    )


def photo():
    """(name, bytes) of a real photo: the first Flickr8k test image when the data is
    here (never copied into the repo), else a generated 300 x 400 JPEG."""
    listing = os.path.join(FLICKR8K, "Flickr_8k.testImages.txt")
    if os.path.exists(listing):
        with open(listing, encoding="utf-8") as f:
            name = f.readline().strip()
        path = os.path.join(FLICKR8K, "Flicker8k_Dataset", name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                return name, f.read()
    return "generated.jpg", encode(scenes(7, 1, 300, 400)[0], "JPEG", quality=90)


def bad_uploads():
    """{case: (file name, bytes, words the message must hold)} for the four bad inputs."""
    noise = np.random.default_rng(0).integers(0, 256, (2600, 2700, 3), dtype=np.uint8)
    return {
        "text": (
            "notes.jpg",
            b"shopping list: milk, eggs\n" * 4,
            "notes.jpg (104 bytes) is text, not a JPEG",
        ),
        "empty": ("empty.jpg", b"", "empty.jpg is empty (0 bytes)"),
        "large": (
            "large.bmp",
            encode(noise, "BMP"),
            "20.1 MB; the demo takes images up to 10.0 MB",
        ),
        "wide": (
            "wide.png",
            encode(np.full((100, 10000, 3), 90, np.uint8), "PNG"),
            "wide.png is 10000 x 100 pixels, 100:1",
        ),
    }


def signature_outputs(path, data):
    """`serving_default` of a separately loaded SavedModel for one image, as NumPy."""
    outputs = tf.saved_model.load(path).signatures["serving_default"](
        image_bytes=tf.constant([data])
    )
    return {k: v.numpy()[0] for k, v in outputs.items()}


def decode_data_url(url):
    """(h, w, 3) uint8 pixels of a `data:image/...;base64,` URL."""
    header, payload = url.split(",", 1)
    assert header.startswith("data:image/"), header
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"))


def start_server(app):
    """`demo.serve(app, 0)` running in a daemon thread; returns (server, base URL)."""
    server = demo.serve(app, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{demo.HOST}:{server.port}"


def post(url, name, data, beam_size=None):
    fields = {} if beam_size is None else {"beam_size": str(beam_size)}
    return requests.post(
        f"{url}/api/caption", files={"image": (name, data)}, data=fields, timeout=60
    )


@pytest.mark.long(1)
@pytest.mark.scope_group("exports")
class DemoTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir, cls.export_dirs = exports()
        cls.captioners = demo.load_captioners(cls.export_dirs)
        cls.samples = tempfile.mkdtemp(prefix="demo_samples_")
        cls.addClassCleanup(shutil.rmtree, cls.samples, ignore_errors=True)
        for i, image in enumerate(scenes(3, 2, 120, 160)):
            Image.fromarray(image).save(os.path.join(cls.samples, f"sample{i}.png"))
        cls.app = demo.create_app(cls.captioners, demo.find_samples(cls.samples))
        cls.server, cls.url = start_server(cls.app)
        cls.addClassCleanup(cls.server.shutdown)
        cls.photo_name, cls.photo = photo()
        cls.want = {
            beam: signature_outputs(path, cls.photo)
            for beam, path in zip((1, 3), cls.export_dirs, strict=True)
        }

    def assertGood(self, beam_size=1):
        response = post(self.url, self.photo_name, self.photo, beam_size)
        self.assertEqual(response.status_code, 200, response.text[:300])
        self.assertEqual(response.json()["caption"], self.want[beam_size]["caption"].decode())
        return response.json()

    def test_info_offers_both_decodings(self):
        info = requests.get(f"{self.url}/api/info", timeout=10).json()
        self.assertEqual([d["name"] for d in info["decodings"]], ["greedy", "beam 3"])
        self.assertEqual([d["export"] for d in info["decodings"]], self.export_dirs)
        self.assertEqual(info["model"]["grid"], [14, 14])
        self.assertEqual([s["name"] for s in info["samples"]], ["sample0.png", "sample1.png"])
        self.assertEqual(info["limits"]["max_bytes"], 10 * 2**20)

    def test_page_and_assets(self):
        page = requests.get(self.url, timeout=10)
        self.assertEqual(page.headers["Content-Type"], "text/html; charset=utf-8")
        self.assertIn('<script src="/demo.js">', page.text)
        self.assertNotRegex(page.text, r"https?://")
        for name, kind in (("demo.js", "text/javascript"), ("demo.css", "text/css")):
            asset = requests.get(f"{self.url}/{name}", timeout=10)
            self.assertEqual(asset.status_code, 200)
            self.assertTrue(asset.headers["Content-Type"].startswith(kind))
            self.assertNotRegex(asset.text, r"https?://")

    @parameterized.parameters(1, 3)
    def test_caption_is_the_signature_output(self, beam_size):
        page = self.assertGood(beam_size)
        want = self.want[beam_size]
        length = int(want["length"])
        words = want["caption"].decode().split(" ") if length else []
        self.assertLen(words, length)
        self.assertEqual(page["decoding"], demo.decoding_name(beam_size))
        self.assertEqual(page["length"], length)
        self.assertAllClose(page["log_prob"], want["log_prob"], atol=1e-6)
        ends = length < want["attention"].shape[0]
        self.assertEqual(page["words"], words + ["<end>"] * ends)
        self.assertLen(page["attention"], length + ends)
        self.assertIsNone(page["cells"])
        self.assertEqual(page["file"], self.photo_name)
        self.assertIsNone(page["off_world_score"])

    @parameterized.parameters(1, 3)
    def test_the_beams_captions_are_the_signatures(self, beam_size):
        """A beam export's page lists the beam's captions from `caption_alternatives`,
        each with its probability and the overlays of its own attention; a greedy
        export's, its one caption."""
        page = self.assertGood(beam_size)
        captioner = self.captioners[0 if beam_size == 1 else 1]
        path = self.export_dirs[0 if beam_size == 1 else 1]
        self.assertEqual(
            captioner.signature, "serving_default" if beam_size == 1 else "caption_alternatives"
        )
        want = tf.saved_model.load(path).signatures[captioner.signature](
            image_bytes=tf.constant([self.photo])
        )
        want.setdefault("attentions", want["attention"][:, None])
        found = want["log_probs"].numpy()[0] > -np.inf
        texts = [t.decode() for t in want["captions"].numpy()[0][found]]
        alternatives = page["alternatives"]
        self.assertEqual([a["caption"] for a in alternatives], texts)
        self.assertLen(alternatives, beam_size)  # the tiny model fills its beam
        self.assertLen(set(texts), beam_size)
        self.assertAllClose([a["log_prob"] for a in alternatives], want["log_probs"][0], atol=1e-5)
        self.assertAllClose(
            [a["probability"] for a in alternatives], np.exp([a["log_prob"] for a in alternatives])
        )
        for key in ("caption", "log_prob", "length", "words", "attention", "cells"):
            self.assertEqual(page[key], alternatives[0][key], key)
        fraction = captioner.info["crop_fraction"]
        crop = image_io.decode_image(tf.constant(self.photo), demo.DISPLAY_SIZE, fraction)
        crop = np.clip(np.round(crop.numpy()), 0, 255).astype(np.uint8)
        attentions = want["attentions"].numpy()[0]
        for j, alternative in enumerate(alternatives):
            length = len(alternative["caption"].split()) if alternative["caption"] else 0
            self.assertEqual(alternative["length"], length)
            ends = length < attentions.shape[1]
            self.assertEqual(alternative["words"][length:], ["<end>"] * ends)
            self.assertLen(alternative["attention"], length + ends)
            for t, url in enumerate(alternative["attention"]):
                heat = visualize.upsample_attention(attentions[j, t].ravel(), (14, 14), (224, 224))
                expected = visualize.overlay_attention(crop, heat).astype(float)
                self.assertLess(np.abs(decode_data_url(url) - expected).mean(), 3.0, (j, t))

    def test_pictures_are_the_visualize_overlays(self):
        page = self.assertGood(1)
        want = self.want[1]
        fraction = self.captioners[0].info["crop_fraction"]
        crop = image_io.decode_image(tf.constant(self.photo), demo.DISPLAY_SIZE, fraction)
        crop = np.clip(np.round(crop.numpy()), 0, 255).astype(np.uint8)
        image = decode_data_url(page["image"])
        self.assertEqual(image.shape, (demo.DISPLAY_SIZE, demo.DISPLAY_SIZE, 3))
        self.assertLess(np.abs(image.astype(float) - crop).mean(), 4.0)
        overlays = [decode_data_url(url) for url in page["attention"]]
        for t, overlay in enumerate(overlays):
            heat = visualize.upsample_attention(want["attention"][t].ravel(), (14, 14), (224, 224))
            expected = visualize.overlay_attention(crop, heat).astype(float)
            self.assertLess(np.abs(overlay - expected).mean(), 3.0, f"panel {t}")
        differences = [np.abs(a.astype(float) - b).mean() for a, b in itertools.pairwise(overlays)]
        self.assertGreater(max(differences), 5.0)

    @parameterized.named_parameters(
        ("text", "text"), ("empty", "empty"), ("large", "large"), ("wide", "wide")
    )
    def test_bad_upload_gets_one_line_and_the_server_goes_on(self, case):
        name, data, words = bad_uploads()[case]
        response = post(self.url, name, data)
        self.assertIn(response.status_code, (400, 413))
        message = response.json()["error"]
        self.assertNotIn("\n", message)
        if case == "large":
            self.assertEqual(response.status_code, 413)
            self.assertIn("the upload is 20.1 MB; the demo takes images up to 10.0 MB", message)
        else:
            self.assertIn(words, message)
        self.assertGood()

    def test_other_refusals_are_one_line(self):
        noise = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        truncated = encode(noise, "PNG")[:2000]
        huge = encode(np.zeros((8000, 7000, 3), np.uint8), "PNG")
        cases = [
            (
                post(self.url, "cut.png", truncated),
                400,
                "cut.png (2000 bytes) is a truncated or corrupt PNG",
            ),
            (
                post(self.url, "huge.png", huge),
                400,
                "huge.png is 7000 x 8000 pixels (56 megapixels)",
            ),
            (post(self.url, "a.png", self.photo, beam_size=2), 400, "beam_size='2' is not offered"),
            (requests.post(f"{self.url}/api/caption", timeout=10), 400, "holds no image"),
            (requests.get(f"{self.url}/api/caption", timeout=10), 405, "405 Method Not Allowed"),
            (requests.get(f"{self.url}/samples/5", timeout=10), 404, "there is no sample 5"),
        ]
        for response, status, words in cases:
            self.assertEqual(response.status_code, status, response.text[:300])
            self.assertIn(words, response.json()["error"])
            self.assertNotIn("\n", response.json()["error"])
        self.assertGood()

    def test_samples_are_served(self):
        with open(os.path.join(self.samples, "sample1.png"), "rb") as f:
            self.assertEqual(requests.get(f"{self.url}/samples/1", timeout=10).content, f.read())

    def test_20_concurrent_requests(self):
        beams = [1, 3] * 10
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            responses = list(
                pool.map(lambda b: post(self.url, self.photo_name, self.photo, b), beams)
            )
        for beam, response in zip(beams, responses, strict=True):
            self.assertEqual(response.status_code, 200, response.text[:300])
            self.assertEqual(response.json()["caption"], self.want[beam]["caption"].decode())

    def test_load_captioners_refusals(self):
        greedy, beam = self.export_dirs
        with self.assertRaisesRegex(ValueError, "one or two export folders, got 3"):
            demo.load_captioners([greedy, beam, greedy])
        with self.assertRaisesRegex(ValueError, "both decode with beam size 1"):
            demo.load_captioners([greedy, greedy])
        with self.assertRaisesRegex(ValueError, "has no sat_tf_export.json"):
            demo.load_captioners([self.workdir])
        with self.assertRaisesRegex(ValueError, "is not a directory"):
            demo.load_captioners([os.path.join(self.workdir, "missing")])
        with self.assertRaisesRegex(ValueError, "holds no .jpg"):
            demo.find_samples(self.workdir)

    def test_busy_port_is_a_one_line_error(self):
        with self.assertRaisesRegex(ValueError, f"cannot serve on 127.0.0.1:{self.server.port}: "):
            demo.serve(self.app, self.server.port)


@pytest.mark.long(1)
@pytest.mark.scope_group("exports")
class BatchedDemoTest(tf.test.TestCase):
    """The page's captions through sat-serve's batcher: concurrent uploads share calls of
    the signature, each getting what it gets alone, and the export's warm-up runs first."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        _, cls.export_dirs = exports()
        # A batch waits up to 2 s for 8 uploads: the 8 sent together share one call.
        cls.parameters = batching.BatchingParameters(
            max_batch_size=8, batch_timeout_micros=2_000_000
        )
        cls.captioners = demo.load_captioners(cls.export_dirs[:1], cls.parameters)
        cls.server, cls.url = start_server(demo.create_app(cls.captioners))
        cls.addClassCleanup(cls.server.shutdown)

    def test_warm_up_requests_run_at_load(self):
        (captioner,) = self.captioners
        logged = warmup.read_warmup(os.path.join(captioner.path, warmup.WARMUP_FILE))
        self.assertEqual([len(r.inputs["image_bytes"].string_val) for r in logged], [1, 16])
        self.assertEqual(captioner.warmup_requests, 2)
        fresh = demo.ExportedCaptioner(captioner.path, self.parameters)
        self.addCleanup(fresh.close)
        # 1 image, then 16 in batches of at most 8
        self.assertEqual(fresh.servable.batchers["serving_default"].calls, 3)

    def test_concurrent_uploads_share_calls_and_get_what_they_get_alone(self):
        good = [encode(x, "PNG") for x in scenes(11, 7, 96, 128)]
        truncated = ("cut.png", good[0][: len(good[0]) // 2])
        uploads = [(f"p{i}.png", data) for i, data in enumerate(good)]
        uploads.insert(3, truncated)
        batcher = self.captioners[0].servable.batchers["serving_default"]
        before = batcher.calls
        barrier = threading.Barrier(len(uploads))

        def send(upload):
            barrier.wait(10)
            return post(self.url, *upload)

        with concurrent.futures.ThreadPoolExecutor(len(uploads)) as pool:
            responses = list(pool.map(send, uploads))
        self.assertBetween(batcher.calls - before, 1, len(uploads) - 1)
        for (name, data), response in zip(uploads, responses, strict=True):
            if name == "cut.png":
                self.assertEqual(response.status_code, 400)
                self.assertStartsWith(response.json()["error"], "cut.png (")
                self.assertIn("is a truncated or corrupt PNG", response.json()["error"])
                continue
            self.assertEqual(response.status_code, 200, response.text[:300])
            page, alone = response.json(), signature_outputs(self.export_dirs[0], data)
            self.assertEqual(page["caption"], alone["caption"].decode(), name)
            self.assertEqual(page["length"], int(alone["length"]))
            # float32 products of another batch size round differently (batching_test), the
            # folded encoder's convolutions among them: a few units in 1e-6 of each feature
            self.assertAllClose(page["log_prob"], alone["log_prob"], rtol=1e-5, atol=1e-5)


def snapshot(folder):
    """{relative path: (size, mtime)} of every file under `folder`."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            stat = os.stat(path)
            files[os.path.relpath(path, folder)] = (stat.st_size, stat.st_mtime_ns)
    return files


@pytest.mark.long(1)
@pytest.mark.scope_group("exports")
class ScriptTest(tf.test.TestCase):
    @pytest.mark.slow
    def test_workdir_demo_writes_only_temporary_files(self):
        # Slow: scripts/demo.py in a fresh process (TensorFlow imported again) with its
        # own HOME and TMPDIR; DemoTest serves the same page in the test process.
        workdir, _ = exports()
        root = tempfile.mkdtemp(prefix="demo_script_")
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        cwd, home, tmp = (os.path.join(root, d) for d in ("cwd", "home", "tmp"))
        for folder in (cwd, home, tmp):
            os.makedirs(folder)
        before = snapshot(workdir)
        assets = snapshot(os.path.join(REPO, "sat_tf", "serving", "demo_assets"))
        env = dict(
            os.environ,
            HOME=home,
            TMPDIR=tmp,
            PYTHONDONTWRITEBYTECODE="1",
            TF_CPP_MIN_LOG_LEVEL="3",
            CUDA_VISIBLE_DEVICES="",
        )
        for name in ("MPLCONFIGDIR", "KERAS_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
            env.pop(name, None)
        script = os.path.join(REPO, "scripts", "demo.py")
        proc = subprocess.Popen(
            [sys.executable, script, f"--workdir={workdir}", "--port=0"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.addCleanup(proc.kill)
        line = ""
        while "http://" not in line:
            line = proc.stdout.readline()
            self.assertTrue(line, "scripts/demo.py stopped before serving")
        url = line.split("at ", 1)[1].split(" ", 1)[0].rstrip("/")
        exported = os.listdir(tmp)
        name, data = photo()
        for beam in (1, 3):
            response = post(url, name, data, beam)
            self.assertEqual(response.status_code, 200, response.text[:300])
        self.assertEqual(post(url, "notes.jpg", b"not an image").status_code, 400)
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(timeout=60), 0)

        folders = [n for n in exported if not n.startswith("__autograph_generated_file")]
        self.assertLen(folders, 1)
        self.assertStartsWith(folders[0], "sat_tf_demo_")
        self.assertEqual(os.listdir(cwd), [])
        self.assertEqual(os.listdir(tmp), [])
        written = [p for p in snapshot(home) if not p.startswith(LIBRARY_CACHES)]
        self.assertEqual(written, [])
        self.assertEqual(snapshot(workdir), before)
        self.assertEqual(snapshot(os.path.join(REPO, "sat_tf", "serving", "demo_assets")), assets)

    def test_flag_errors_are_one_line(self):
        workdir, export_dirs = exports()
        cases = {
            "both": ([f"--workdir={workdir}", f"--export={export_dirs[0]}"], "not both"),
            "three": ([f"--export={','.join(export_dirs)}", f"--export={export_dirs[0]}"], "got 3"),
            "preset_and_export": (["--preset=x", f"--export={export_dirs[0]}"], "not both"),
            "unknown_preset": (["--preset=no_such_preset"], "no_such_preset"),
        }
        for key, (args, message) in cases.items():
            code, _, stderr = run_main(demo_cli.main, "sat-demo", *args)
            self.assertEqual(code, 1, stderr)
            errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
            self.assertLen(errors, 1, stderr)
            self.assertIn(message, errors[0], key)


class OffWorldPageTest(tf.test.TestCase):
    def test_page_shows_the_exports_off_world_score(self):
        model, vocab, config = tiny_model()
        pooled = [
            off_world.pool(model.encoder(scenes(seed, 30).astype(np.float32))).numpy()
            for seed in (1, 2)
        ]
        stats = off_world.calibrate(off_world.fit(pooled[0], 4), pooled[1], 0.9)
        (path,) = demo.export_decodings(
            (model, vocab, config), self.get_temp_dir(), beam_sizes=(1,), off_world=stats
        )
        black = np.zeros((1, 112, 112, 3), np.float32)
        want, flagged = off_world.score(model.encoder(black), stats)
        page = demo.caption_page(
            demo.ExportedCaptioner(path),
            encode(black[0].astype(np.uint8), "PNG"),
            "black.png",
            demo.Limits(),
        )

        self.assertAllClose(page["off_world_score"], want[0], atol=1e-4)
        self.assertTrue(page["off_world"])
        self.assertTrue(flagged[0])
        self.assertAllClose(page["off_world_threshold"], stats.threshold)


if __name__ == "__main__":
    absltest.main()
