"""What several test modules share: tiny images and models, the tiny training settings,
one tiny training run per test process, the layer round-trip check, official COCO
caption files and TFDS `coco_captions` served through `tfds.testing.mock_data`, dataset
files for the readers (JPEGs, Karpathy's JSON), a user's photo folder."""

import atexit
import contextlib
import dataclasses
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
from unittest import mock

import keras
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging
from PIL import Image

from sat_tf.cli import train as train_cli
from sat_tf.config import Config, absolute_paths
from sat_tf.data import vocab as vocab_lib
from sat_tf.evaluation import java_tools
from sat_tf.model.show_attend_tell import build_model

# Eight named colours of flat test images.
COLOURS = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
}

# Settings of a training run that takes seconds on the shapes set.
TINY = dict(
    num_train=40,
    num_val=6,
    num_test=6,
    embed_dim=8,
    hidden_dim=16,
    attention_dim=8,
    batch_size=8,
    steps_per_epoch=3,
    eval_images=6,
    max_decode_length=10,
    epochs=1,
)


# The shared run of `trained_run`: hard attention decoded at argmax, so that its pictures
# outline a cell.
TRAINED = {**TINY, "attention": "hard", "hard_decoding": "argmax"}


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """A finished `sat-train` run on a tiny shapes set; its files are read-only to tests
    (copy `workdir` before changing anything in it)."""

    root: str
    workdir: str
    data_dir: str
    config: Config
    scores: dict
    stdout: str


def without_java(test) -> str:
    """For a test case's `setUp`: no Java until the test ends (the Python tokenizer and no
    METEOR, as on a machine without Java: the Java programs take longer than the rest)
    and a temporary folder, removed after the test. Returns the folder."""
    patch = mock.patch.object(java_tools, "find_java", lambda: None)
    patch.start()
    test.addCleanup(patch.stop)
    root = tempfile.mkdtemp()
    test.addCleanup(shutil.rmtree, root, ignore_errors=True)
    return root


def run_main(main, *argv, cwd=None):
    """(exit status, stdout, stderr) of a console command's `main(argv)` run in this
    process; stderr holds what it printed and what it logged through absl."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.get_absl_handler().python_handler
    stream = handler.stream
    previous = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        handler.stream = err
        # INFO, where absl's app.run puts --verbosity in a fresh process. In this one
        # TensorFlow's SavedModel writer may have set it (to WARNING) first, and app.run
        # keeps a flag that was set, which would hide the command's log lines.
        logging.set_verbosity(logging.INFO)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        handler.stream = stream
        os.chdir(previous)
    return code, out.getvalue(), err.getvalue()


@functools.cache
def trained_run() -> TrainedRun:
    """`sat-train` with the TRAINED settings, run in this process once: the trained
    workdir that tests which only read one share (the training itself is tested in
    train_lib_test's resume and callbacks_test's early stopping)."""
    root = tempfile.mkdtemp(prefix="trained_run_")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    workdir, data_dir = os.path.join(root, "run"), os.path.join(root, "data")
    flags = [f"--{k}={v}" for k, v in TRAINED.items()]
    code, stdout, stderr = run_main(
        train_cli.main, "sat-train", f"--workdir={workdir}", f"--data_dir={data_dir}", *flags
    )
    if code != 0:
        raise AssertionError(f"sat-train exited with {code}:\n{stderr[-3000:]}")
    scores = json.loads(re.search(r"^\{$.*^\}$", stdout, re.M | re.S)[0])
    # The run's settings, with the decoding it chose on its validation images.
    with open(os.path.join(workdir, "decoding.json"), encoding="utf-8") as f:
        chosen = json.load(f)["chosen"]
    # The workdir keeps its folders absolute (config.absolute_paths).
    config = absolute_paths(Config(data_dir=data_dir, **{**TRAINED, **chosen}))
    return TrainedRun(root, workdir, data_dir, config, scores, stdout)


WORDS = [*vocab_lib.SPECIALS, "a", "big", "small", "red", "blue", "circle", "square", "top"]
MAX_LENGTH = 8


def encode(pixels, fmt, mode=None, **kwargs):
    """Bytes of `pixels` (H, W, 3) uint8 saved by PIL as `fmt`, converted to `mode` first."""
    image = Image.fromarray(pixels)
    if mode:
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def scenes(seed, count, height=112, width=112):
    """uint8 (count, H, W, 3): a flat background with one coloured square each."""
    rng = np.random.default_rng(seed)
    side = min(height, width) // 4
    images = np.empty((count, height, width, 3), np.uint8)
    for image in images:
        image[:] = rng.integers(0, 256, 3)
        y, x = rng.integers(0, min(height, width) - side, 2)
        image[y : y + side, x : x + side] = rng.integers(0, 256, 3)
    return images


def tiny_model(seed=2, **settings):
    """A built shapes_cnn model whose captions depend on the image.

    With seed 2 the four `scenes(0, 4)` get 3 different greedy captions (seeds 0 and 3
    end every caption at once); the tests check that they differ before comparing.

    Batch-norm scales of 2 keep the untrained encoder's features apart, N(0, 1) decoder
    weights make the words depend on them; `<pad>` and `<start>` get a large negative
    output bias (a trained model never emits them), `<end>` a positive one, so captions
    stop at different lengths. `settings` are further `Config` values.
    """
    keras.utils.set_random_seed(seed)
    config = Config(
        embed_dim=8,
        hidden_dim=16,
        attention_dim=8,
        dropout=0.0,
        max_decode_length=MAX_LENGTH,
        **settings,
    )
    model = build_model(config, len(WORDS))
    for variable in model.encoder.weights:
        if variable.path.endswith("gamma"):
            variable.assign(np.full(variable.shape, 2.0, np.float32))
    rng = np.random.default_rng(seed + 1)
    for variable in model.decoder.weights:
        variable.assign(rng.normal(size=variable.shape).astype(np.float32))
    bias = model.decoder.deep_output.bias.numpy()
    bias[[vocab_lib.PAD_ID, vocab_lib.START_ID]] = -30.0
    bias[vocab_lib.END_ID] = 1.0
    model.decoder.deep_output.bias.assign(bias)
    return model, vocab_lib.Vocab(WORDS), config


def tiny_workdir(root: str, **settings):
    """(workdir, model, vocab, config): `tiny_model(**settings)` saved as a trained
    workdir in root/workdir (its config, vocabulary and best weights)."""
    from sat_tf.serving import inference

    model, vocab, config = tiny_model(**settings)
    workdir = os.path.join(root, "workdir")
    os.makedirs(workdir)
    config.save(os.path.join(workdir, inference.CONFIG_FILE))
    vocab.save(os.path.join(workdir, inference.VOCAB_FILE))
    model.save_weights(os.path.join(workdir, inference.BEST_WEIGHTS))
    return workdir, model, vocab, config


# The captions of `write_photo_folder`'s photos: photo i has the i-th and the next.
FOLDER_CAPTIONS = ("a red square", "a blue square on top", "a big circle", "a small red circle")


def write_photo_folder(folder: str, count: int = 12) -> str:
    """A user's folder (`--dataset=folder`): `count` JPEGs of `scenes` in images/ and a
    Kaggle-style captions.txt (image,caption), two captions a photo. The split by the
    hash of the names gives 12 photos 9 train, 2 val and 1 test. Returns `folder`."""
    os.makedirs(os.path.join(folder, "images"))
    rows = ["image,caption"]
    for i, pixels in enumerate(scenes(0, count)):
        name = f"p{i}.jpg"
        Image.fromarray(pixels).save(os.path.join(folder, "images", name))
        for k in (i, i + 1):
            rows.append(f"{name},{FOLDER_CAPTIONS[k % len(FOLDER_CAPTIONS)]}")
    with open(os.path.join(folder, "captions.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(rows) + "\n")
    return folder


def coco_file_name(folder: str, image_id: int) -> str:
    """The official image file name: `COCO_val2014_000000000042.jpg` in the 2014 folders,
    `000000000042.jpg` in the 2017 ones."""
    if folder.endswith("2017"):
        return f"{image_id:012d}.jpg"
    return f"COCO_{folder}_{image_id:012d}.jpg"


def write_coco_captions(root: str, folder: str, captions, jpegs) -> str:
    """Writes `root/annotations/captions_<folder>.json` in the official COCO format and
    its images `root/<folder>/<coco_file_name>`.

    Args:
      root: The COCO root folder.
      folder: "train2014", "val2014", "train2017" or "val2017".
      captions: {image id (int): [caption, ...]}, in file order; "annotations" lists the
        captions of all images interleaved (first captions first), as the real files mix
        images.
      jpegs: {image id: JPEG bytes}; an image without an entry is listed but not written.

    Returns:
      The path of the JSON file.
    """
    image_dir = os.path.join(root, folder)
    os.makedirs(image_dir, exist_ok=True)
    images = []
    for image_id in captions:
        file_name = coco_file_name(folder, image_id)
        width, height = 640, 480
        if image_id in jpegs:
            with open(os.path.join(image_dir, file_name), "wb") as f:
                f.write(jpegs[image_id])
            width, height = Image.open(io.BytesIO(jpegs[image_id])).size
        images.append(
            {
                "license": 1,
                "file_name": file_name,
                "coco_url": f"http://images.cocodataset.org/{folder}/{file_name}",
                "height": height,
                "width": width,
                "date_captured": "2013-11-14 11:18:45",
                "id": image_id,
            }
        )
    annotations = []
    for k in range(max((len(c) for c in captions.values()), default=0)):
        for image_id, texts in captions.items():
            if k < len(texts):
                annotations.append(
                    {"image_id": image_id, "id": 1000 + len(annotations), "caption": texts[k]}
                )
    data = {
        "info": {"description": f"COCO {folder[-4:]} Dataset", "year": int(folder[-4:])},
        "licenses": [{"id": 1, "name": "Attribution License", "url": ""}],
        "images": images,
        "annotations": annotations,
    }
    path = os.path.join(root, "annotations", f"captions_{folder}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def mock_coco_captions(examples, calls=None):
    """`tfds.testing.mock_data` serving known examples of TFDS `coco_captions`.

    The default random generator of `mock_data` cannot build `coco_captions`: it draws an
    independent length for each field of the `captions` Sequence (text and id), which
    `Sequence.encode_example` rejects. So the fake `_as_dataset` below encodes known
    examples with the builder's own features and decodes them with the caller's decoders,
    the path real TFRecords take.

    Args:
      examples: {TFDS split: [(image id, JPEG bytes, [caption, ...]), ...]}.
      calls: If a list, each split that is read is appended to it.

    Returns:
      The `mock_data` context manager.
    """

    def as_dataset(builder, split, decoders=None, read_config=None, shuffle_files=False):
        if calls is not None:
            calls.append(str(split))
        features = builder.info.features
        parts = []
        for image_id, jpeg, captions in examples[str(split)]:
            example = {
                "image": jpeg,
                "image/filename": coco_file_name("val2014", image_id),
                "image/id": image_id,
                "objects": [],
                "captions": [{"text": t, "id": 100 * image_id + k} for k, t in enumerate(captions)],
            }
            encoded = tf.nest.map_structure(tf.constant, features.encode_example(example))
            parts.append(tf.data.Dataset.from_tensors(encoded))
        ds = functools.reduce(tf.data.Dataset.concatenate, parts)
        return ds.map(functools.partial(features.decode_example, decoders=decoders))

    return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def check_round_trip(test, layer, *args, output=lambda y: y, atol=1e-6):
    """`from_config(get_config())` gives the same config and, with the layer's weights
    copied in, the same output for `layer(*args)` (`output` picks what to compare).

    Returns:
      the clone.
    """
    config = layer.get_config()
    clone = type(layer).from_config(config)
    test.assertEqual(clone.get_config(), config)
    clone(*args)
    for src, dst in zip(layer.weights, clone.weights, strict=True):
        test.assertEqual(src.path, dst.path)
        dst.assign(src)
    test.assertAllClose(output(clone(*args)), output(layer(*args)), atol=atol)
    return clone


def check_saved_model_file(test, model, inputs, expected, atol=1e-6):
    """A `.keras` file of `model` loads in safe mode and gives `expected` for `inputs`.

    Returns:
      the loaded model.
    """
    path = os.path.join(test.get_temp_dir(), f"{model.name}.keras")
    keras.saving.save_model(model, path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    test.assertAllClose(loaded(inputs), expected, atol=atol)
    return loaded


@contextlib.contextmanager
def offline(keras_home):
    """No network for `keras.utils.get_file` (each download fails as without DNS), and an
    empty Keras cache folder under `keras_home`."""
    from keras.src.backend import config as keras_config
    from keras.src.utils import file_utils

    def no_network(url, *args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    with (
        mock.patch.object(keras_config, "_KERAS_DIR", keras_home),
        mock.patch.object(file_utils, "urlretrieve", no_network),
    ):
        yield


# Dataset files on disk, for the readers' tests (records, flickr, coco_tfds, datasets).
def jpeg_bytes(color) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, "JPEG")
    return buffer.getvalue()


def write_file(path: str, data) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def write_jpegs(root: str, *names: str) -> None:
    for i, name in enumerate(names):
        write_file(os.path.join(root, name), jpeg_bytes((40 * i, 100, 200)))


def karpathy_entry(filename, imgid, split, captions, **extra):
    sentences = [
        {"raw": c, "tokens": c.split(), "imgid": imgid, "sentid": 10 * imgid + k}
        for k, c in enumerate(captions)
    ]
    return {
        "filename": filename,
        "imgid": imgid,
        "split": split,
        "sentids": [s["sentid"] for s in sentences],
        "sentences": sentences,
        **extra,
    }


def write_karpathy(path: str, entries, name="flickr8k") -> str:
    return write_file(path, json.dumps({"dataset": name, "images": entries}, indent=1))


# An object store for the tests of the filesystem layer: S3 as moto fakes it in this
# process (the slow tests use a moto server, tests/object_store_test.py).
S3_OPTIONS = ["--s3_access_key_id=k", "--s3_secret_access_key=s", "--s3_region_name=us-east-1"]


def s3_client(endpoint_url=None):
    """A boto3 S3 client with the tests' keys: the store's own side, which makes buckets
    and puts what a user's photos and models would be."""
    import boto3

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )


@contextlib.contextmanager
def fake_s3(bucket="photos"):
    """A bucket of moto's in-process S3, with Beam's `FileSystems` set to reach it;
    yields its address `s3://<bucket>`. Both are undone when the block ends."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions
    from moto import mock_aws

    with mock_aws():
        s3_client().create_bucket(Bucket=bucket)
        FileSystems.set_options(PipelineOptions(S3_OPTIONS))
        try:
            yield f"s3://{bucket}"
        finally:
            FileSystems.set_options(None)


def upload_folder(folder, address, client=None):
    """Puts every file under the local `folder` at `address` (`s3://bucket/prefix`) with
    the store's own client (`s3_client()` by default); returns the addresses written."""
    client = client or s3_client()
    bucket, _, prefix = address[len("s3://") :].partition("/")
    written = []
    for parent, _, names in os.walk(folder):
        for name in sorted(names):
            relative = os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/")
            key = f"{prefix.rstrip('/')}/{relative}" if prefix else relative
            with open(os.path.join(parent, name), "rb") as f:
                client.put_object(Bucket=bucket, Key=key, Body=f.read())
            written.append(f"s3://{bucket}/{key}")
    return written


# The modules a process that captions without TensorFlow may not import.
TENSORFLOW_MODULES = ("tensorflow", "keras", "tensorflow_text")
# Prints, last, the top-level modules of `TENSORFLOW_MODULES` (and Pillow's, PIL) that a
# script run by `fresh_python` imported.
PRINT_HEAVY_MODULES = (
    "\nimport sys as _sys\n"
    "print(sorted({m.split('.')[0] for m in _sys.modules} & {'tensorflow', 'keras', "
    "'tensorflow_text', 'PIL'}))"
)


def fresh_python(script, *args, timeout=300):
    """(status, stdout lines, stderr) of `python -c script args` in a fresh process of
    this checkout's package, with `PRINT_HEAVY_MODULES` run after the script."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", script + PRINT_HEAVY_MODULES, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
        timeout=timeout,
    )
    return done.returncode, done.stdout.strip().splitlines(), done.stderr


@functools.cache
def tiny_export() -> str:
    """`tiny_model()` exported once per test process by `exporting.export` (with its
    warm-up file): the path of its version folder, which tests copy and never change."""
    from sat_tf.serving import exporting

    root = tempfile.mkdtemp(prefix="tiny_export_")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    model, vocab, config = tiny_model()
    exporting.export(model, vocab, config, os.path.join(root, "1"))
    return os.path.join(root, "1")


def wait_until(condition, timeout=30.0, what="the condition"):
    """Polls `condition()` every 5 ms until it is true; fails the test after `timeout`
    seconds, naming `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(0.005)
