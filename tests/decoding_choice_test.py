"""The decoding search: coordinate ascent over decoding_choice.SEARCH, scored by a table."""

import itertools
import json
import os
import tempfile
from unittest import mock

from absl.testing import absltest

from sat_tf.config import Config
from sat_tf.training import decoding_choice
from sat_tf.training.prepare import Data


class _Decoder:
    hard_decoding = "expected"


class _Model:
    decoder = _Decoder()
    grid = (2, 2)


def _key(config):
    return (config.beam_size, config.length_penalty, config.block_repeats, config.block_bad_endings)


def _search(table, config, fixed=(), metric="BLEU-4"):
    """`decoding_choice.choose` with captioning replaced by a lookup of `table`
    ({(beam, length penalty, block repeats, block bad endings): score}); returns the
    chosen config, what was tried and the configs captioned, in order."""
    captioned = []

    def caption_records(model, records, vocab, candidate, encoder=None):
        captioned.append(candidate)
        return [table[_key(candidate)]]

    def score_captions(records, results, objects, grid, image_size):
        return {metric: results[0], "other": 0.0}

    with (
        mock.patch.object(decoding_choice, "caption_records", caption_records),
        mock.patch.object(decoding_choice, "score_captions", score_captions),
    ):
        chosen, tried = decoding_choice.choose(_Model(), ["r"], None, config, fixed=fixed)
    return chosen, tried, captioned


class ChooseTest(absltest.TestCase):
    def test_each_setting_in_turn_from_the_runs_own(self):
        # Start: greedy, repeats blocked. Beam: 1 -> 0.50, 3 -> 0.60, 5 -> 0.55 (repeats
        # blocked); length penalty at beam 3: 0 -> 0.60, 1 -> 0.65; then repeats allowed
        # at beam 3, lp 1: 0.70 beats 0.65; then bad endings blocked: 0.69 < 0.70.
        table = {
            k: 0.0 for k in itertools.product((1, 3, 5), (0.0, 1.0), (False, True), (False, True))
        }
        table[1, 0.0, True, False] = 0.50
        table[3, 0.0, True, False] = 0.60
        table[5, 0.0, True, False] = 0.55
        table[3, 1.0, True, False] = 0.65
        table[3, 1.0, False, False] = 0.70
        table[3, 1.0, False, True] = 0.69
        chosen, tried, captioned = _search(table, Config(block_repeats=True))
        self.assertEqual(_key(chosen), (3, 1.0, False, False))
        # Every distinct setting captioned once: 3 beams, 1 more penalty, 1 more repeat
        # setting, 1 more ending setting.
        self.assertEqual(
            [_key(c) for c in captioned],
            [
                (1, 0.0, True, False),
                (3, 0.0, True, False),
                (5, 0.0, True, False),
                (3, 1.0, True, False),
                (3, 1.0, False, False),
                (3, 1.0, False, True),
            ],
        )
        self.assertEqual([t["scores"]["BLEU-4"] for t in tried], [0.5, 0.6, 0.55, 0.65, 0.7, 0.69])
        self.assertNotIn("length_penalty", tried[0])  # no length penalty at greedy
        self.assertNotIn("hard_decoding", tried[0])  # soft attention

    def test_a_tie_keeps_the_simplest_value(self):
        table = dict.fromkeys(
            itertools.product((1, 3, 5), (0.0, 1.0), (False, True), (False, True)), 0.4
        )
        chosen, _, captioned = _search(table, Config(beam_size=3, length_penalty=1.0))
        self.assertEqual(_key(chosen), (1, 1.0, False, False))
        # At greedy the length penalty is not searched.
        self.assertEqual(len(captioned), 5)

    def test_fixed_settings_are_not_searched(self):
        table = dict.fromkeys(
            itertools.product((1, 3, 5), (0.0, 1.0), (False, True), (False, True)), 0.1
        )
        table[5, 0.0, True, False] = 0.9  # best, but the beam is fixed at 3
        table[3, 0.0, True, True] = 0.3
        config = Config(beam_size=3, block_repeats=True)
        chosen, _, captioned = _search(table, config, fixed={"beam_size", "block_repeats"})
        self.assertEqual(_key(chosen), (3, 0.0, True, True))
        self.assertEqual({c.beam_size for c in captioned}, {3})
        self.assertEqual({c.block_repeats for c in captioned}, {True})

    def test_hard_attention_also_chooses_its_context(self):
        scores = {"expected": 0.3, "argmax": 0.5}
        captioned = []
        model = _Model()
        model.decoder = _Decoder()

        def caption_records(model_, records, vocab, candidate, encoder=None):
            # The candidate's config says how to decode; the model is not changed.
            self.assertEqual(model_.decoder.hard_decoding, "expected")
            captioned.append(candidate.hard_decoding)
            return [scores[candidate.hard_decoding]]

        def score_captions(records, results, objects, grid, image_size):
            return {"CIDEr": results[0]}

        config = Config(attention="hard", selection_metric="cider")
        with (
            mock.patch.object(decoding_choice, "caption_records", caption_records),
            mock.patch.object(decoding_choice, "score_captions", score_captions),
        ):
            chosen, _ = decoding_choice.choose(model, ["r"], None, config)
        self.assertEqual(chosen.hard_decoding, "argmax")
        self.assertEqual(model.decoder.hard_decoding, "expected")
        # Beams 1, 3 and 5, repeats allowed, bad endings blocked (all tied, so the
        # simplest kept), then the context, searched last.
        self.assertEqual(captioned, ["expected"] * 5 + ["argmax"])


class ChooseAndKeepTest(absltest.TestCase):
    def test_the_workdir_keeps_the_choice(self):
        table = dict.fromkeys(
            itertools.product((1, 3, 5), (0.0, 1.0), (False, True), (False, True)), 0.2
        )
        table[1, 0.0, False, False] = 0.8
        workdir = tempfile.mkdtemp()
        data = Data({"train": ["t"], "val": ["v1", "v2", "v3"], "test": []}, None, None)
        config = Config(block_repeats=True, eval_images=2)
        with (
            mock.patch.object(
                decoding_choice,
                "caption_records",
                lambda m, r, v, c, encoder=None: [table[_key(c)]],
            ),
            mock.patch.object(
                decoding_choice, "score_captions", lambda r, res, o, g, s: {"BLEU-4": res[0]}
            ),
        ):
            chosen = decoding_choice.choose_and_keep(_Model(), data, config, workdir, {"seed"})
        self.assertFalse(chosen.block_repeats)
        self.assertEqual(Config.load(os.path.join(workdir, "config.json")), chosen)
        with open(os.path.join(workdir, decoding_choice.DECODING_FILE), encoding="utf-8") as f:
            kept = json.load(f)
        self.assertEqual(kept["images"], 2)
        self.assertEqual(kept["fixed"], [])
        self.assertEqual(
            kept["chosen"], {"beam_size": 1, "block_repeats": False, "block_bad_endings": False}
        )

    def test_nothing_is_chosen_without_validation_images_or_when_off(self):
        workdir = tempfile.mkdtemp()
        for splits, config in (
            ({"train": ["t"], "val": [], "test": []}, Config()),
            ({"train": ["t"], "val": ["v"], "test": []}, Config(choose_decoding=False)),
        ):
            data = Data(splits, None, None)
            self.assertIs(decoding_choice.choose_and_keep(_Model(), data, config, workdir), config)
        self.assertEqual(os.listdir(workdir), [])


class DescribeTest(absltest.TestCase):
    def test_phrases(self):
        self.assertEqual(decoding_choice.describe(Config()), "greedy, repeats blocked")
        self.assertEqual(
            decoding_choice.describe(
                Config(beam_size=3, length_penalty=1.0, block_repeats=False, block_bad_endings=True)
            ),
            "beam 3, length penalty 1, repeats allowed, bad endings blocked",
        )


if __name__ == "__main__":
    absltest.main()
