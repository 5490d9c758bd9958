"""The console commands as a user runs them: each in a fresh process, stdout and stderr
captured (not a terminal). Without -v they print no TensorFlow C++ or absl-format log
line, no TensorFlow, Keras or absl warning, no escape sequence or carriage return, and
the package's own messages as plain lines; with -v the log lines are back. Exit
statuses: 0 after a run and after --help, 1 for a flag or value that is not accepted."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from sat_tf.data import shapes

PRESET = "flickr8k_lite0_grid14_soft"
# TensorFlow's C++ log lines and absl's Python ones: `I1201 19:47:01.921285 ... x.py:145] `.
LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d", re.M)
NOISE = {
    "log line": LOG_LINE,
    # absl's and TensorFlow's loggers (`WARNING:tensorflow:`), Python's warnings.
    "warning": re.compile(r"WARNING:|Warning:"),
    "escape or carriage return": re.compile(r"[\x1b\r\b]"),
}
SHAPES = ("--num_train=16", "--num_val=4", "--num_test=4")


def command(name, *args):
    """(exit status, stdout, stderr) of `python -m sat_tf.cli.<name> args` in a fresh
    process, with no TF_CPP_MIN_LOG_LEVEL of the tests' own (conftest sets one)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-m", f"sat_tf.cli.{name}", *args],
        capture_output=True,
        env=env,
        timeout=600,
    )
    # Bytes decoded here: text=True would read a carriage return as a line break.
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def assert_quiet(*outputs):
    for text in outputs:
        for kind, pattern in NOISE.items():
            found = [line for line in text.split("\n") if pattern.search(line)]
            assert not found, f"{kind}: {found[:5]}"


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("shapes"))
    shapes.generate(data_dir, num_train=16, num_val=4, num_test=4)
    return data_dir


def test_extract_features_plain_lines_and_with_v_absl_lines(shapes_dir, tmp_path):
    flags = (f"--data_dir={shapes_dir}", *SHAPES, "--shard_size=12", "--allow_random_encoder")
    code, stdout, stderr = command("extract_features", *flags, f"--cache_dir={tmp_path / 'a'}")
    assert code == 0, stderr[-3000:]
    assert_quiet(stdout, stderr)
    lines = stderr.splitlines()
    # shapes_cnn has no pretrained weights: the package's one warning, then one line a shard.
    assert lines[0] == "warning: features: the shapes_cnn encoder has random weights"
    assert [line.split(",")[0] for line in lines[1:]] == [
        "features: shard-00000-of-00002.tfrecord done",
        "features: shard-00001-of-00002.tfrecord done",
    ]
    # Keras's progress bar: one line when all 24 images are done.
    (bar,) = [line for line in stdout.splitlines() if "/24" in line]
    assert re.fullmatch(r"24/24 - \d+s - \d+ms/image", bar), bar
    assert stdout.splitlines()[-1].startswith("24 images, 196 x 50 float16 features in 2 shards")

    code, _, stderr = command("extract_features", "-v", *flags, f"--cache_dir={tmp_path / 'b'}")
    assert code == 0, stderr[-3000:]
    assert re.search(
        r"^W\d{4} [\d:.]+ +\d+ extract\.py:\d+\] features: the shapes_cnn encoder has random"
        " weights$",
        stderr,
        re.M,
    ), stderr[-3000:]
    assert len(LOG_LINE.findall(stderr)) >= 3, stderr[-3000:]


def test_caption_with_a_shipped_preset(tmp_path):
    photo = str(tmp_path / "photo.png")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)).save(photo)
    code, stdout, stderr = command("caption", photo, f"--preset={PRESET}")
    assert code == 0, stderr[-3000:]
    assert stdout.startswith(f"{photo}: ")
    assert_quiet(stdout, stderr)


@pytest.mark.parametrize(
    "name, args, code, printed",
    [
        ("export", ["--help"], 0, None),
        (
            "evaluate",
            ["--no_such_flag"],
            1,
            "error: Unknown command line flag 'no_such_flag' (--helpfull lists the flags)",
        ),
        (
            "evaluate",
            ["--beam_size=two"],
            1,
            "error: flag --beam_size=two: invalid literal for int() with base 10: 'two'",
        ),
    ],
)
def test_exit_statuses(name, args, code, printed):
    got, stdout, stderr = command(name, *args)
    assert (got, stderr.splitlines()) == (code, [printed] if printed else []), stderr[-3000:]
    assert_quiet(stdout, stderr)
    if "--help" in args:
        assert "--[no]verbose: -v: show TensorFlow's" in stdout


def test_what_asks_for_log_lines():
    from sat_tf import cli

    asked = {
        ("-v",): True,
        ("--verbose",): True,
        ("--verbose=true",): True,
        ("-v", "1"): True,  # absl's --verbosity
        ("--verbosity=0",): True,
        ("--verbose", "--noverbose"): False,
        ("--verbose=false",): False,
        ("photo.jpg", "v"): False,
        ("--", "-v"): False,
    }
    assert {args: cli.verbose(["sat-caption", *args]) for args in asked} == asked


def test_the_python_api_leaves_logging_alone():
    script = (
        "import json, os, sys, warnings\n"
        "from sat_tf import Captioner\n"
        "import tensorflow as tf\n"
        "print(json.dumps([os.environ.get('TF_CPP_MIN_LOG_LEVEL'), tf.get_logger().level,\n"
        "    'sat_tf.cli' in sys.modules, [str(f[3]) for f in warnings.filters]]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    level, logger_level, cli_loaded, modules = json.loads(done.stdout.splitlines()[-1])
    assert (level, logger_level, cli_loaded) == (None, 0, False)
    assert not [m for m in modules if "keras" in m]


def test_train_prints_one_plain_line_an_epoch(shapes_dir, tmp_path):
    code, stdout, stderr = command(
        "train",
        *(f"--data_dir={shapes_dir}", *SHAPES, f"--cache_dir={tmp_path / 'cache'}"),
        f"--workdir={tmp_path / 'run'}",
        *("--epochs=2", "--steps_per_epoch=2", "--batch_size=8", "--eval_images=4"),
        *("--embed_dim=8", "--hidden_dim=16", "--attention_dim=8", "--max_decode_length=8"),
        "--nochoose_decoding",
    )
    assert code == 0, stderr[-3000:]
    assert_quiet(stdout, stderr)
    lines = stderr.splitlines()
    (line,) = [line for line in lines if line.startswith("training on ")]
    assert line.startswith("training on 16 images (80 captions), 2 steps per epoch"), line
    assert [line.split(":")[0] for line in lines if line.startswith("epoch ")] == [
        "epoch 1",
        "epoch 2",
    ]
    epochs = [line for line in stdout.splitlines() if line.startswith(("Epoch ", "2/2 - "))]
    assert [line.split(" - ")[0] for line in epochs] == ["Epoch 1/2", "2/2", "Epoch 2/2", "2/2"]
    assert json.loads(stdout[stdout.index("\n{") :])["BLEU-4"] >= 0
