"""Tests for sat_tf.serving.litert_cache: what a built file's fingerprint depends on, the
file built once into the cache (also by two processes at once), its info, and the
pruning of files used least recently."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import tensorflow as tf
from fixtures import tiny_model

from sat_tf.config import Config
from sat_tf.serving import litert_cache, preset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Two of these run at once on one preset and cache: each says whether it built the file.
BUILD_SCRIPT = """
import sys
from sat_tf.config import Config
from sat_tf.serving import litert_cache

built = []
_build = litert_cache._build
litert_cache._build = lambda *args: built.append(1) or _build(*args)
folder, config = sys.argv[1], Config.load(sys.argv[1] + "/config.json")
print("FOLDER", litert_cache.build("preset", folder, config), "BUILT", len(built))
"""


def tiny_preset(root, name="tiny", **settings):
    """fixtures.tiny_model saved as a preset folder; its config."""
    model, vocab, config = tiny_model(**settings)
    folder = os.path.join(root, name)
    preset.save(model, vocab, config, folder, name=name)
    return folder, config


class FingerprintTest(tf.test.TestCase):
    def test_what_the_key_depends_on(self):
        root = self.get_temp_dir()
        folder, config = tiny_preset(root)
        key = litert_cache.fingerprint("preset", folder, config)
        self.assertEqual(key, litert_cache.fingerprint("preset", folder, config))
        self.assertRegex(key, r"^[0-9a-f]{24}$")
        # A setting that does not change the captions leaves the key.
        same = dataclasses.replace(config, batch_size=config.batch_size + 1, epochs=99)
        self.assertEqual(litert_cache.fingerprint("preset", folder, same), key)
        changes = {"beam_size": 4, "length_penalty": 0.5, "block_repeats": False}
        changes.update(tags=not config.tags, tag_threshold=0.3, max_decode_length=5)
        keys = {key}
        for name, value in changes.items():
            keys.add(
                litert_cache.fingerprint(
                    "preset", folder, dataclasses.replace(config, **{name: value})
                )
            )
        self.assertLen(keys, len(changes) + 1)
        # Another preset (its metadata names other files) gets another key.
        other, _ = tiny_preset(root, "other", seed=3)
        self.assertNotEqual(litert_cache.fingerprint("preset", other, config), key)

    def test_a_workdirs_key_follows_its_weights(self):
        folder = tempfile.mkdtemp(dir=self.get_temp_dir())
        config = Config()
        config.save(os.path.join(folder, "config.json"))
        weights = os.path.join(folder, "best.weights.h5")
        with open(weights, "wb") as f:
            f.write(b"weights one")
        key = litert_cache.fingerprint("workdir", folder, config)
        with open(weights, "wb") as f:
            f.write(b"weights two")
        self.assertNotEqual(litert_cache.fingerprint("workdir", folder, config), key)
        self.assertNotEqual(litert_cache.fingerprint("preset", folder, config), key)

    def test_info_of_a_damaged_entry_names_it(self):
        cache = self.get_temp_dir()
        self.assertIsNone(litert_cache.find("0" * 24, cache))
        folder = os.path.join(litert_cache.root(cache), "1" * 24)
        os.makedirs(folder)
        with open(os.path.join(folder, litert_cache.INFO_FILE), "w") as f:
            f.write("{")
        self.assertEqual(litert_cache.find("1" * 24, cache), folder)
        with self.assertRaisesRegex(
            ValueError, f"is not the info of a LiteRT model .*; delete {folder}$"
        ):
            litert_cache.read_info(folder)

    def test_prune_keeps_the_files_used_last(self):
        cache = self.get_temp_dir()
        folders = []
        for i in range(4):
            folder = os.path.join(litert_cache.root(cache), f"{i:024d}")
            os.makedirs(folder)
            with open(os.path.join(folder, litert_cache.INFO_FILE), "w") as f:
                f.write("{}")
            os.utime(os.path.join(folder, litert_cache.INFO_FILE), (1000 + i, 1000 + i))
            folders.append(folder)
        litert_cache.touch(folders[0])  # used now
        removed = litert_cache.prune(cache, keep=2)
        self.assertEqual(sorted(removed), folders[1:3])
        self.assertEqual(
            sorted(os.listdir(litert_cache.root(cache))),
            sorted(os.path.basename(f) for f in (folders[0], folders[3])),
        )


@pytest.mark.long(20)
class BuildTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.folder, cls.config = tiny_preset(cls.root)

    def test_two_processes_build_it_once(self):
        cache = os.path.join(self.root, "cache_two")
        env = {**os.environ, "PYTHONPATH": ROOT, "SAT_TF_CACHE": cache, "TF_CPP_MIN_LOG_LEVEL": "3"}
        command = [sys.executable, "-c", BUILD_SCRIPT, self.folder]
        processes = [
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        outputs = []
        for process in processes:
            stdout, stderr = process.communicate(timeout=900)
            self.assertEqual(process.returncode, 0, stderr[-3000:])
            outputs.append(stdout.split()[-4:])
        self.assertEqual(sorted(o[3] for o in outputs), ["0", "1"])  # built once
        folders = {o[1] for o in outputs}
        self.assertLen(folders, 1)
        (folder,) = folders
        key = litert_cache.fingerprint("preset", self.folder, self.config)
        self.assertEqual(folder, os.path.join(cache, litert_cache.FOLDER, key))
        listed = sorted(os.listdir(os.path.join(cache, litert_cache.FOLDER)))
        self.assertEqual(listed, sorted([key, f"{key}.lock"]))
        info = litert_cache.read_info(folder)
        self.assertEqual(info["kind"], "preset")
        self.assertEqual(info["source"], self.folder)
        self.assertEqual(info["decoding"], litert_cache.decoding(self.config))
        self.assertEqual(
            info["tflite"]["bytes"], os.path.getsize(os.path.join(folder, info["tflite"]["file"]))
        )
        self.assertEqual((info["image_size"], info["grid"], info["tagger"]), (112, [14, 14], False))

    def test_a_built_file_is_taken_from_the_cache(self):
        cache = os.path.join(self.root, "cache_one")
        start = time.perf_counter()
        folder = litert_cache.build("preset", self.folder, self.config, cache)
        built = time.perf_counter() - start
        with open(os.path.join(folder, litert_cache.INFO_FILE), encoding="utf-8") as f:
            info = json.load(f)
        start = time.perf_counter()
        self.assertEqual(litert_cache.build("preset", self.folder, self.config, cache), folder)
        self.assertLess(time.perf_counter() - start, built / 10)
        self.assertEqual(litert_cache.read_info(folder), info)
        wider = dataclasses.replace(self.config, beam_size=self.config.beam_size + 1)
        self.assertNotEqual(litert_cache.build("preset", self.folder, wider, cache), folder)


if __name__ == "__main__":
    tf.test.main()
