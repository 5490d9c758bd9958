"""Tests for sat_tf.serving.tflite: the TFLite file of a tiny model decodes as
`ShowAttendTell.generate` does (beam search with its K hypotheses, a tag made to be
said, the off-world score), in builtin ops only, run in LiteRT's interpreter; the greedy
option; the entries of the export's info."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from fixtures import MAX_LENGTH, scenes, tiny_model

from sat_tf.data import image_io
from sat_tf.serving import exporting, tags, tflite
from sat_tf.serving import off_world as off_world_lib
from sat_tf.serving.tags import TagRow

BEAM = 3


def _interpreter(flatbuffer):
    interpreter = pytest.importorskip("ai_edge_litert.interpreter").Interpreter
    return interpreter(model_content=flatbuffer)


def _tagged_model():
    """fixtures.tiny_model with a two-class tagger ("circle", "square") whose
    probabilities differ from photo to photo, and off-world statistics of its features."""
    model, vocab, config = tiny_model()
    rng = np.random.default_rng(5)
    kernel = rng.normal(size=(model.feature_dim, 2)).astype(np.float32) * 0.3
    rows = [TagRow(0, "n0", "circle", "circle", ""), TagRow(1, "n1", "square", "square", "")]
    model.tagger = tags.Tagger.from_rows(rows, vocab, kernel, np.zeros(2, np.float32))
    features = model.encoder(scenes(7, 24).astype(np.float32))
    pooled = off_world_lib.pool(features).numpy()
    stats = off_world_lib.calibrate(off_world_lib.fit(pooled[:16], 3), pooled[16:], 0.5)
    config = dataclasses.replace(config, beam_size=BEAM, tag_threshold=0.93, length_penalty=1.0)
    return model, vocab, config, stats


class BeamFileTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model, cls.vocab, cls.config, cls.stats = _tagged_model()
        encoder = cls.model.encoder
        cls.spec = exporting.export_spec(
            cls.model, encoder, cls.config, vocab=cls.vocab, off_world=cls.stats
        )
        function = tflite.caption_function(cls.model, encoder, cls.vocab, cls.spec)
        cls.flatbuffer = tflite.convert(function)
        cls.pixels = image_io.resize_and_crop(scenes(0, 8, 120, 140), 112, 1.0).numpy()

    def want(self, pixels):
        """`ShowAttendTell.generate` with the spec's decoding and its K hypotheses."""
        batch = {"image": tf.constant(pixels)}
        result = self.model.generate(
            batch,
            self.spec.tag_threshold,
            max_length=MAX_LENGTH,
            beam_size=BEAM,
            length_penalty=1.0,
            block_repeats=self.config.block_repeats,
            num_return=BEAM,
        )
        score, flag = off_world_lib.score(self.model.encoder(batch["image"]), self.stats)
        return result, score.numpy(), flag.numpy()

    def test_builtin_ops_only(self):
        interpreter = _interpreter(self.flatbuffer)
        ops = {op["op_name"] for op in interpreter._get_ops_details()}
        self.assertIn("WHILE", ops)
        self.assertEqual([op for op in ops if "flex" in op.lower()], [])

    def test_outputs_are_generates(self):
        runner = _interpreter(self.flatbuffer).get_signature_runner()
        want, scores, flags = self.want(self.pixels)
        words = np.array([w.encode() for w in self.vocab.words] + [b""], dtype=object)
        tagged = 0
        for i in range(len(self.pixels)):
            out = runner(image=self.pixels[i : i + 1])
            self.assertCountEqual(out, tflite.OUTPUTS + tflite.OFF_WORLD_OUTPUTS)
            self.assertAllEqual(out["nbest_tokens"][0], want.tokens[i])
            self.assertAllEqual(out["nbest_length"][0], want.length[i])
            self.assertAllClose(out["log_probs"][0], want.log_prob[i], atol=1e-4)
            maps = want.attention[i].numpy().reshape(BEAM, MAX_LENGTH, 14, 14)
            self.assertAllClose(out["nbest_attention"][0], maps, atol=1e-4)
            self.assertEqual(out["nbest_words"][0].tolist(), words[want.tokens[i]].tolist())
            # The caption is the best of the K.
            self.assertAllEqual(out["tokens"][0], want.tokens[i][0])
            self.assertAllEqual(out["words"][0], out["nbest_words"][0][0])
            self.assertEqual(int(out["length"][0]), int(want.length[i][0]))
            self.assertAllClose(out["log_prob"][0], want.log_prob[i][0], atol=1e-4)
            self.assertAllClose(out["attention"][0], maps[0], atol=1e-4)
            self.assertEqual(int(out["tag"][0]), int(want.tag[i]))
            self.assertEqual(out["tag_word"][0], words[int(want.tag[i])])
            self.assertAllClose(out["tag_prob"][0], want.tag_prob[i], atol=1e-5)
            self.assertAllClose(out["off_world_score"][0], scores[i], atol=1e-3)
            self.assertEqual(bool(out["off_world"][0]), bool(flags[i]))
            tagged += int(want.tag[i]) >= 0
        # Both kinds of photo were met: tagged ones (the constrained search) and others.
        self.assertBetween(tagged, 1, len(self.pixels) - 1)
        self.assertBetween(int(np.sum(flags)), 1, len(self.pixels) - 1)

    def test_greedy_file(self):
        folder = self.get_temp_dir()
        written = tflite.write(
            folder, self.model, self.model.encoder, self.vocab, self.spec, greedy=True
        )
        self.assertIsNone(written["tflite_int8"])
        entry = written["tflite"]
        self.assertEqual(
            (entry["decoding"], entry["beam_size"], entry["tags"]), ("greedy", 1, False)
        )
        self.assertTrue(entry["off_world"])
        with open(f"{folder}/{tflite.TFLITE_FILE}", "rb") as f:
            runner = _interpreter(f.read()).get_signature_runner()
        want = self.model.generate(
            {"image": tf.constant(self.pixels)},
            max_length=MAX_LENGTH,
            block_repeats=self.config.block_repeats,
        )
        for i in range(len(self.pixels)):
            out = runner(image=self.pixels[i : i + 1])
            self.assertAllEqual(out["tokens"][0], want.tokens[i])
            self.assertAllEqual(out["nbest_tokens"][0], want.tokens[i][None])
            self.assertAllClose(out["log_probs"][0], want.log_prob[i][None], atol=1e-4)
            self.assertEqual((int(out["tag"][0]), out["tag_word"][0]), (-1, b""))

    def test_info(self):
        entry = tflite.info("x.tflite", b"12345", self.spec, quantize="dynamic")
        self.assertEqual(entry["bytes"], 5)
        self.assertEqual(entry["input"]["image"], [1, 112, 112, 3])
        self.assertEqual((entry["decoding"], entry["beam_size"]), ("beam", BEAM))
        self.assertEqual((entry["grid"], entry["max_length"]), ([14, 14], MAX_LENGTH))
        self.assertEqual(
            (entry["tags"], entry["off_world"], entry["weights"]), (True, True, "int8")
        )
        with self.assertRaisesRegex(ValueError, "--quantize='int4' is not one of 'dynamic'"):
            tflite.check_quantize("int4")


if __name__ == "__main__":
    tf.test.main()
