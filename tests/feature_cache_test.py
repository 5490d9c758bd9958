"""Tests for sat_tf.data.feature_cache and the feature-cache path of training, on tiny
datasets written in the exact on-disk formats: read -> vocabulary -> extract -> train ->
decode (the extraction's own tests: extract_test.py); a cache on S3 (moto, in this
process) read from a local copy that copies only the shards that changed."""

import collections
import contextlib
import io
import json
import os
import shutil
import tempfile
from unittest import mock

import fixtures
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized
from PIL import Image

from sat_tf.config import Config
from sat_tf.data import datasets, feature_cache, input_pipeline
from sat_tf.data.vocab import UNK, Vocab
from sat_tf.evaluation import metrics
from sat_tf.model.encoder import ImageEncoder
from sat_tf.serving import inference, preset
from sat_tf.training import extract, scoring, train_lib
from sat_tf.utils import filesystem

IMAGE_SIZE = 32  # shapes_cnn has stride 8: a 4 x 4 grid of 48 + 2 channels.
GRID, DEPTH = (4, 4), 50
# (file stem, width, height, split) in caption-file order; splits are interleaved.
IMAGES = (
    ("dog", 48, 40, "train"),
    ("cat", 30, 52, "val"),
    ("bird", 64, 64, "train"),
    ("fish", 40, 24, "test"),
    ("frog", 33, 47, "val"),
    ("cow", 50, 36, "train"),
)
LONG_CAPTION = "a dog runs on the green grass near a red house and a tree"


def _captions(stem):
    captions = [
        f"a {stem} sits here",
        f"the {stem} is small",
        f"A {stem}, outside.",
        f"one {stem} on grass",
        f"a brown {stem}",
    ]
    if stem == "dog":
        captions[0] = LONG_CAPTION
    return captions


def _jpeg_bytes(width, height, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def write_flickr8k(root, raw=False):
    """Flickr8k as distributed: `Flicker8k_Dataset/*.jpg` plus Karpathy's
    `dataset_flickr8k.json`, or (raw) `Flickr8k.token.txt` and the three split files."""
    image_dir = os.path.join(root, "Flicker8k_Dataset")
    os.makedirs(image_dir)
    for seed, (stem, width, height, _) in enumerate(IMAGES):
        with open(os.path.join(image_dir, f"{stem}.jpg"), "wb") as f:
            f.write(_jpeg_bytes(width, height, seed))
    if raw:
        lines = [
            f"{stem}.jpg#{n}\t{caption}"
            for stem, *_ in IMAGES
            for n, caption in enumerate(_captions(stem))
        ]
        with open(os.path.join(root, datasets.FLICKR8K_TOKEN_FILE), "w") as f:
            f.write("\n".join(lines) + "\n")
        for split, name in datasets.FLICKR8K_SPLIT_FILES.items():
            with open(os.path.join(root, name), "w") as f:
                f.write("".join(f"{s}.jpg\n" for s, _, _, sp in IMAGES if sp == split))
        return
    entries = [
        {
            "filename": f"{stem}.jpg",
            "imgid": i,
            "split": split,
            "sentids": list(range(5 * i, 5 * i + 5)),
            "sentences": [
                {"raw": c, "tokens": c.lower().split(), "imgid": i, "sentid": 5 * i + j}
                for j, c in enumerate(_captions(stem))
            ],
        }
        for i, (stem, _, _, split) in enumerate(IMAGES)
    ]
    with open(os.path.join(root, "dataset_flickr8k.json"), "w") as f:
        json.dump({"dataset": "flickr8k", "images": entries}, f)


# COCO ids of IMAGES, out of file order. train2014 holds dog and bird; the others sit in
# val2014, cow as one of Karpathy's "restval" images (train).
COCO_IDS = {"dog": 9, "cat": 42, "bird": 74, "fish": 30, "frog": 61, "cow": 25}
COCO_TRAIN2014 = ("dog", "bird")
# val2014 by id: cow 25, fish 30, cat 42, frog 61; a third of 4 is 1 image each for val
# and test (datasets.split_by_image_id).
COCO_OFFICIAL_SPLITS = {
    "dog": "train",
    "bird": "train",
    "cow": "val",
    "fish": "test",
    "cat": "train",
    "frog": "train",
}


def _coco_images():
    """(stem, folder, COCO id, JPEG bytes, Karpathy split) of IMAGES."""
    return [
        (
            stem,
            "train2014" if stem in COCO_TRAIN2014 else "val2014",
            COCO_IDS[stem],
            _jpeg_bytes(width, height, seed),
            "restval" if stem == "cow" else split,
        )
        for seed, (stem, width, height, split) in enumerate(IMAGES)
    ]


def write_coco(root, official=False):
    """COCO 2014 as distributed: `train2014/`, `val2014/` plus Karpathy's `dataset_coco.json`,
    or (official) `annotations/captions_{train,val}2014.json`."""
    images = _coco_images()
    if official:
        for folder in ("train2014", "val2014"):
            fixtures.write_coco_captions(
                root,
                folder,
                {i: _captions(stem) for stem, f, i, _, _ in images if f == folder},
                {i: jpeg for _, f, i, jpeg, _ in images if f == folder},
            )
        return
    entries = []
    for n, (stem, folder, image_id, jpeg, split) in enumerate(images):
        filename = fixtures.coco_file_name(folder, image_id)
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        with open(os.path.join(root, folder, filename), "wb") as f:
            f.write(jpeg)
        entries.append(
            {
                "filepath": folder,
                "sentids": list(range(5 * n, 5 * n + 5)),
                "filename": filename,
                "imgid": n,
                "split": split,
                "sentences": [
                    {"tokens": c.lower().split(), "raw": c, "imgid": n, "sentid": 5 * n + j}
                    for j, c in enumerate(_captions(stem))
                ],
                "cocoid": image_id,
            }
        )
    with open(os.path.join(root, "dataset_coco.json"), "w") as f:
        json.dump({"images": entries, "dataset": "coco"}, f)


def mock_tfds_coco():
    """TFDS `coco_captions` holding IMAGES in Karpathy's splits (cow in restval)."""
    examples = collections.defaultdict(list)
    for stem, _, image_id, jpeg, split in _coco_images():
        examples[split].append((image_id, jpeg, _captions(stem)))
    return fixtures.mock_coco_captions(examples)


def encoder_weights(path):
    """A fixed shapes_cnn encoder, saved so that every extraction uses the same weights."""
    tf.keras.utils.set_random_seed(1)
    ImageEncoder("shapes_cnn", IMAGE_SIZE).net.save_weights(path)
    return path


def read_shard(path):
    """{image_id: (L, D) float16} parsed with plain protobuf, not with the module's reader."""
    out = {}
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        example = tf.train.Example.FromString(record)
        feature = example.features.feature
        shape = tuple(feature["shape"].int64_list.value)
        data = feature["features"].bytes_list.value[0]
        out[feature["image_id"].bytes_list.value[0].decode()] = np.frombuffer(data, "<f2").reshape(
            shape
        )
    return out


class _Extracted:
    """On one Flickr8k folder whose features are extracted once a class (`extracted`, its
    index `index`); each test gets a copy of them in `out`. A mixin of the cache's tests
    below and of extract_test.py's."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = tempfile.mkdtemp()
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        write_flickr8k(cls.root)
        cls.weights = encoder_weights(os.path.join(cls.root, "encoder.weights.h5"))
        records = datasets.load_records("flickr8k", cls.root)
        cls.records = sorted(records, key=lambda r: feature_cache.SPLIT_ORDER[r.split])
        cls.extracted = os.path.join(cls.root, "extracted")
        cls.index = cls._extract_to(cls.records, cls.extracted)

    def setUp(self):
        super().setUp()
        self.out = os.path.join(self.get_temp_dir(), "features")
        shutil.copytree(self.extracted, self.out)

    @classmethod
    def _extract_to(cls, records, out, **kwargs):
        args = dict(shard_size=2, batch_size=2, progress=False)
        args.update(kwargs)
        return extract.extract_features(
            records,
            args.pop("encoder", "shapes_cnn"),
            args.pop("weights", cls.weights),
            args.pop("image_size", IMAGE_SIZE),
            out,
            **args,
        )

    def _extract(self, records=None, **kwargs):
        return self._extract_to(self.records if records is None else records, self.out, **kwargs)

    def _shards(self):
        return sorted(n for n in os.listdir(self.out) if n.startswith("shard-"))

    def _features(self, records):
        ds, shape = feature_cache.feature_dataset(self.out, records)
        return np.stack(list(ds.as_numpy_iterator())), shape


class FeatureCacheTest(_Extracted, tf.test.TestCase, parameterized.TestCase):
    def test_subsets_stream_in_record_order(self):
        full, _ = self._features(self.records)
        subset = [self.records[i] for i in (1, 4, 5)]
        part, _ = self._features(subset)
        self.assertAllEqual(part, full[[1, 4, 5]])
        with self.assertRaisesRegex(ValueError, "extraction order"):
            feature_cache.feature_dataset(self.out, subset[::-1])
        stranger = datasets.Record("horse", "horse.jpg", ("a horse",), "train")
        with self.assertRaisesRegex(ValueError, "no features for 1 of 2 images: horse"):
            feature_cache.feature_dataset(self.out, [self.records[0], stranger])
        with self.assertRaisesRegex(ValueError, "image_size: the cache has 32, this run 64"):
            feature_cache.feature_dataset(self.out, subset, image_size=64)

    def test_captions_over_the_max_length_are_cut(self):
        train = [r for r in self.records if r.split == "train"]
        vocab = Vocab.build(c for r in train for c in r.captions)
        cached, _ = feature_cache.feature_dataset(self.out, train)
        with self.assertLogs(level="WARNING") as logs:
            ds = input_pipeline.train_dataset(
                train,
                vocab,
                image_size=IMAGE_SIZE,
                crop_fraction=1.0,
                batch_size=1,
                max_words=4,
                features=cached,
            )
        long_ones = sum(len(c.split()) > 4 for r in train for c in r.captions)
        self.assertIn(
            f"{long_ones} of {sum(len(r.captions) for r in train)} training", logs.output[0]
        )
        captions = {tuple(b["caption"][0].numpy()) for b in ds.take(60)}
        cut = (1, *vocab.ids(LONG_CAPTION.split()[:4]), 2)
        self.assertIn(cut, captions)
        self.assertLen(captions, 15)
        self.assertLessEqual(max(len(c) for c in captions), 6)

    def test_a_cache_elsewhere_is_read_from_a_local_copy_kept_up_to_date(self):
        cache_dir = os.path.join(self.get_temp_dir(), "cache")
        with fixtures.fake_s3() as bucket:
            address = f"{bucket}/features"
            fixtures.upload_folder(self.out, address)
            local = feature_cache.local_copy(address, cache_dir)
            self.assertStartsWith(local, os.path.join(cache_dir, "copies", "s3-"))
            self.assertEqual(sorted(os.listdir(local)), sorted(os.listdir(self.out)))
            for name in os.listdir(self.out):
                with open(os.path.join(local, name), "rb") as a:
                    with open(os.path.join(self.out, name), "rb") as b:
                        self.assertEqual(a.read(), b.read(), name)
            mtimes = {n: os.stat(os.path.join(local, n)).st_mtime_ns for n in self._shards()}
            shard = self._shards()[1]
            with open(os.path.join(self.out, self._shards()[0]), "rb") as f:
                other = f.read() + b"!"  # another size: copied again
            filesystem.write_bytes(f"{address}/{shard}", other)
            self.assertEqual(feature_cache.local_copy(address, cache_dir), local)
        after = {n: os.stat(os.path.join(local, n)).st_mtime_ns for n in self._shards()}
        self.assertEqual([after[n] == mtimes[n] for n in self._shards()], [True, False, True])
        self.assertEqual(feature_cache.local_copy(self.out, cache_dir), self.out)  # local


def _bleu4_only(references, hypotheses, **_):
    return {"BLEU-4": metrics.bleu4(references, hypotheses)}


class _EndToEnd:
    """Each dataset layout read, its vocabulary built, its features extracted, a model
    trained on them and its captions decoded. Flickr8k's Karpathy layout runs by default
    (EndToEndTest); the other four share every step after reading, which the readers'
    tests (datasets_test, flickr_test, coco_tfds_test) check for them, and run
    with the slow tests (EndToEndOtherLayoutsTest)."""

    def _layout(self, dataset, layout, counts):
        root = self.get_temp_dir()
        data_dir = os.path.join(root, dataset)
        os.makedirs(data_dir)
        ids = {stem: str(i) for stem, i in COCO_IDS.items()}
        split_of = {stem: split for stem, _, _, split in IMAGES}
        if dataset == "flickr8k":
            write_flickr8k(data_dir, raw=layout == "raw")
            ids = {stem: stem if layout == "raw" else str(n) for n, (stem, *_) in enumerate(IMAGES)}
        elif dataset == "coco":
            write_coco(data_dir, official=layout == "official")
            if layout == "official":
                split_of = COCO_OFFICIAL_SPLITS
        with mock_tfds_coco() if layout == "tfds" else contextlib.nullcontext():
            self._read_vocab_extract_train_decode(dataset, data_dir, root, ids, split_of, counts)

    def _read_vocab_extract_train_decode(self, dataset, data_dir, root, ids, split_of, counts):
        records = datasets.load_records(dataset, data_dir)
        self.assertEqual({r.image_id: r.split for r in records}, {ids[s]: split_of[s] for s in ids})
        self.assertEqual(datasets.split_counts(records), counts)
        config = Config(
            dataset=dataset,
            data_dir=data_dir,
            cache_dir=os.path.join(root, "cache"),
            encoder="shapes_cnn",
            encoder_weights=encoder_weights(os.path.join(root, "encoder.weights.h5")),
            image_size=IMAGE_SIZE,
            use_feature_cache=True,
            vocab_size=12,
            max_caption_length=8,
            embed_dim=8,
            hidden_dim=16,
            attention_dim=8,
            batch_size=2,
            epochs=1,
            steps_per_epoch=2,
            eval_images=0,
            max_decode_length=5,
        )
        data_files = sorted(os.walk(data_dir))
        index = extract.extract_for_config(config, shard_size=4, progress=False)
        feature_dir = feature_cache.feature_dir_of(config)
        self.assertEqual(os.path.basename(feature_dir), "features_shapes_cnn")
        self.assertEqual(os.path.dirname(os.path.dirname(feature_dir)), config.cache_dir)
        self.assertEqual(index["num_shards"], 2)
        # Shards hold val, then test, then train images (feature_cache.SPLIT_ORDER).
        split_by_id = {ids[s]: split_of[s] for s in ids}
        stored = [split_by_id[i] for shard in index["shards"] for i in shard["image_ids"]]
        self.assertEqual(
            stored,
            ["val"] * counts["val"] + ["test"] * counts["test"] + ["train"] * counts["train"],
        )
        workdir = os.path.join(root, "run")
        with mock.patch.object(metrics, "coco_scores", _bleu4_only):
            scores = train_lib.train_and_evaluate(config, workdir)
        self.assertBetween(scores["BLEU-4"], 0.0, 1.0)
        # Features and vocabulary went to the cache: the data folder is as it was.
        self.assertEqual(sorted(os.walk(data_dir)), data_files)

        counter = collections.Counter(
            w.strip(",.").lower()
            for stem, split in split_of.items()
            if split == "train"
            for c in _captions(stem)
            for w in c.split()
        )
        top = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:12]
        vocab = Vocab.load(os.path.join(workdir, inference.VOCAB_FILE))
        self.assertEqual(vocab.words[4:], [w for w, _ in top])
        with open(os.path.join(os.path.dirname(feature_dir), "vocab_12.txt")) as f:
            self.assertEqual(f.read().split("\n")[:-1], vocab.words)
        with open(os.path.join(workdir, preset.FEATURES_FILE)) as f:
            self.assertEqual(json.load(f)["feature_shape"], [16, DEPTH])

        model, vocab, config = inference.load_workdir(workdir)
        self.assertIsNone(model.encoder)
        self.assertEqual(model.grid, GRID)
        test = [r for r in datasets.load_records(dataset, data_dir) if r.split == "test"]
        self.assertEqual([r.image_id for r in test], [ids["fish"]])
        results = scoring.caption_records(model, test, vocab, config)
        self.assertLen(results, 1)
        words, alpha = results[0]["words"], results[0]["alpha"]
        self.assertLessEqual(len(words), 5)
        self.assertContainsSubset(words, [UNK, *(w for w, _ in top)])
        rows = min(len(words) + 1, config.max_decode_length)
        self.assertEqual(alpha.shape, (rows, 16))
        self.assertAllClose(alpha.sum(axis=1), np.ones(rows), atol=1e-5)
        with open(os.path.join(workdir, "captions_test.json")) as f:
            self.assertEqual(json.load(f)[0]["caption"], " ".join(words))


class EndToEndTest(_EndToEnd, tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("flickr8k_karpathy", "flickr8k", "karpathy", {"train": 3, "val": 2, "test": 1}),
    )
    def test_read_vocab_extract_train_decode(self, dataset, layout, counts):
        self._layout(dataset, layout, counts)


@pytest.mark.slow
class EndToEndOtherLayoutsTest(_EndToEnd, tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("coco_official", "coco", "official", {"train": 4, "val": 1, "test": 1}),
        ("flickr8k_raw", "flickr8k", "raw", {"train": 3, "val": 2, "test": 1}),
        ("coco_karpathy", "coco", "karpathy", {"train": 3, "val": 2, "test": 1}),
        ("coco_captions_tfds", "coco_captions_tfds", "tfds", {"train": 3, "val": 2, "test": 1}),
    )
    def test_read_vocab_extract_train_decode(self, dataset, layout, counts):
        self._layout(dataset, layout, counts)


if __name__ == "__main__":
    tf.test.main()
