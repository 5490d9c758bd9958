"""Tests for sat_tf.config: defaults, validation, the JSON file and the help strings."""

import dataclasses
import json
import os
import tempfile

from absl.testing import parameterized

from sat_tf import config as config_lib
from sat_tf.config import CHOICES, Config

POSITIVE = (
    "vocab_size",
    "max_caption_length",
    "image_size",
    "embed_dim",
    "hidden_dim",
    "attention_dim",
    "batch_size",
    "epochs",
    "beam_size",
    "max_decode_length",
)
NON_NEGATIVE = (
    "steps_per_epoch",
    "eval_images",
    "early_stopping_patience",
    "alpha_c",
    "clip_norm",
    "num_train",
    "num_val",
    "num_test",
    "seed",
    "reinforce_weight",
    "entropy_weight",
)


class ValidateTest(parameterized.TestCase):
    def test_defaults_are_valid(self):
        config = Config()
        config.validate()
        self.assertEqual(
            (config.dataset, config.encoder, config.image_size), ("shapes", "shapes_cnn", 112)
        )
        self.assertEqual((config.attention, config.batch_size), ("soft", 64))

    def test_choices_are_fields(self):
        names = {f.name for f in dataclasses.fields(Config)}
        self.assertContainsSubset(set(CHOICES), names)

    @parameterized.parameters(
        *[(name, value) for name, values in CHOICES.items() for value in values]
    )
    def test_every_choice_is_accepted(self, name, value):
        self.assertEqual(getattr(Config(**{name: value}), name), value)

    @parameterized.named_parameters(*[(name, name) for name in CHOICES])
    def test_bad_choice_names_the_flag_and_the_choices(self, name):
        with self.assertRaises(ValueError) as raised:
            Config(**{name: "bogus"})
        message = str(raised.exception)
        self.assertIn(f"--{name}='bogus'", message)
        for value in CHOICES[name]:
            self.assertIn(repr(value), message)

    @parameterized.parameters(*[(name, value) for name in POSITIVE for value in (0, -1)])
    def test_positive(self, name, value):
        with self.assertRaisesRegex(ValueError, f"--{name}={value}"):
            Config(**{name: value})
        self.assertEqual(getattr(Config(**{name: 1}), name), 1)

    @parameterized.named_parameters(*[(name, name) for name in NON_NEGATIVE])
    def test_non_negative(self, name):
        with self.assertRaisesRegex(ValueError, f"--{name}=-1"):
            Config(**{name: -1})
        self.assertEqual(getattr(Config(**{name: 0}), name), 0)

    @parameterized.parameters(
        ("dropout", -0.1, 0.0),
        ("dropout", 1.0, 0.99),
        ("hard_mix_prob", -0.01, 0.0),
        ("hard_mix_prob", 1.01, 1.0),
        ("baseline_decay", -0.01, 0.0),
        ("baseline_decay", 1.01, 1.0),
        ("learning_rate", 0.0, 1e-6),
        ("learning_rate", -1e-3, 1.0),
    )
    def test_ranges(self, name, bad, good):
        with self.assertRaisesRegex(ValueError, f"--{name}={bad}"):
            Config(**{name: bad})
        self.assertEqual(getattr(Config(**{name: good}), name), good)

    def test_global_context_needs_attention(self):
        with self.assertRaisesRegex(ValueError, "--global_context contradicts --attention=none"):
            Config(attention="none", global_context=True)
        for attention in ("soft", "hard"):
            self.assertTrue(Config(attention=attention, global_context=True).global_context)

    def test_location_prior_needs_attention(self):
        with self.assertRaisesRegex(ValueError, "--location_prior contradicts --attention=none"):
            Config(attention="none", location_prior=True)
        for attention in ("soft", "hard"):
            self.assertTrue(Config(attention=attention, location_prior=True).location_prior)

    def test_validate_after_a_change(self):
        config = Config()
        config.batch_size = 0
        with self.assertRaisesRegex(ValueError, "--batch_size=0"):
            config.validate()

    @parameterized.named_parameters(
        ("int_as_string", "batch_size", "8"),
        ("int_as_float", "batch_size", 8.5),
        ("float_as_string", "dropout", "0.1"),
        ("bool_as_string", "jit_compile", "false"),
        ("string_as_int", "data_dir", 3),
    )
    def test_wrong_type_names_the_key(self, name, value):
        with self.assertRaisesRegex(ValueError, name):
            Config.from_dict({name: value})

    def test_int_for_float_is_accepted(self):
        self.assertEqual(Config.from_dict({"dropout": 0, "learning_rate": 1}).learning_rate, 1)


class GivenSettingsTest(parameterized.TestCase):
    """`check_given_settings`: explicit settings that cannot act with the attention."""

    @parameterized.named_parameters(
        ("none", "none", 0.01),
        ("hard", "hard", 0.5),
        ("tiny", "none", 1e-9),
    )
    def test_penalty_given_without_soft_attention(self, attention, alpha_c):
        config = Config(attention=attention, alpha_c=alpha_c)
        with self.assertRaises(ValueError) as raised:
            config_lib.check_given_settings(config, {"attention", "alpha_c"})
        message = str(raised.exception)
        self.assertStartsWith(message, f"--alpha_c={alpha_c} contradicts --attention={attention}:")
        self.assertIn("soft attention only", message)
        self.assertNotIn("\n", message)

    @parameterized.parameters(
        *[(name, attention) for name in config_lib.HARD_ONLY for attention in ("soft", "none")]
    )
    def test_hard_setting_given_without_hard_attention(self, name, attention):
        # The value is the default: giving it at all is the contradiction.
        config = Config(attention=attention)
        with self.assertRaises(ValueError) as raised:
            config_lib.check_given_settings(config, {name})
        message = str(raised.exception)
        default = dataclasses.asdict(Config())[name]
        self.assertStartsWith(message, f"--{name}={default} contradicts --attention={attention}:")
        self.assertIn("setting of hard attention", message)
        self.assertNotIn("\n", message)

    @parameterized.named_parameters(
        ("penalty_off_without_attention", "none", {"alpha_c"}, {"alpha_c": 0.0}),
        ("penalty_off_with_hard", "hard", {"alpha_c"}, {"alpha_c": 0}),
        ("penalty_with_soft", "soft", {"alpha_c"}, {"alpha_c": 1.0}),
        ("hard_settings_with_hard", "hard", set(config_lib.HARD_ONLY), {"hard_mix_prob": 0.0}),
        ("unrelated", "none", {"batch_size", "dropout", "seed"}, {"batch_size": 3}),
    )
    def test_consistent_settings_pass(self, attention, given, values):
        config = Config(attention=attention, **values)
        self.assertIsNone(config_lib.check_given_settings(config, given))

    @parameterized.parameters(*CHOICES["attention"])
    def test_defaults_never_contradict(self, attention):
        # The default penalty is not zero, yet `--attention=none` alone is a valid run.
        self.assertGreater(Config().alpha_c, 0)
        config_lib.check_given_settings(Config(attention=attention), {"attention"})


class FileTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp()

    def test_absolute_paths(self):
        previous = os.getcwd()
        os.makedirs(os.path.join(self.dir, "runs", "base"))
        try:
            os.chdir(self.dir)
            config = Config(
                data_dir="data/shapes",
                cache_dir="cache",
                init_from="runs/base",
                captions="captions.csv",
            )
            absolute = config_lib.absolute_paths(config)
            real = os.path.realpath(self.dir)
            self.assertEqual(os.path.realpath(absolute.data_dir), f"{real}/data/shapes")
            self.assertEqual(os.path.realpath(absolute.cache_dir), f"{real}/cache")
            self.assertEqual(os.path.realpath(absolute.init_from), f"{real}/runs/base")
            self.assertTrue(os.path.isabs(absolute.data_dir))
            self.assertEqual(absolute.feature_dir, "")  # the default stays the default
            self.assertEqual(absolute.captions, "captions.csv")  # relative to data_dir
            # A preset's name is not a path here.
            named = config_lib.absolute_paths(Config(init_from="flickr8k_lite0_grid14_soft"))
            self.assertEqual(named.init_from, "flickr8k_lite0_grid14_soft")
        finally:
            os.chdir(previous)

    def test_round_trip(self):
        config = Config(
            dataset="coco",
            data_dir="/data/coco",
            encoder="resnet50",
            encoder_weights="/w/resnet.weights.h5",
            image_size=224,
            batch_size=3,
            dropout=0.5,
            learning_rate=4e-4,
            jit_compile=True,
            mixed_precision="mixed_float16",
            attention="hard",
        )
        path = os.path.join(self.dir, "config.json")
        config.save(path)
        self.assertEqual(Config.load(path), config)
        self.assertEqual(os.listdir(self.dir), ["config.json"])
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
        self.assertEqual(values, dataclasses.asdict(config))
        self.assertEqual(list(values), sorted(values))
        self.assertIs(values["jit_compile"], True)

    def test_missing_keys_take_defaults(self):
        path = os.path.join(self.dir, "partial.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"batch_size": 3}, f)
        self.assertEqual(Config.load(path), Config(batch_size=3))

    @parameterized.parameters(
        # A hard-attention config written before the key existed had the old behaviour.
        ("hard_gate", False, True),
        ("hard_decoding", "argmax", "expected"),
    )
    def test_hard_config_without_a_later_key_keeps_the_old_behaviour(self, key, old, new):
        path = os.path.join(self.dir, "config.json")
        for attention, value in (("hard", old), ("soft", new)):
            values = dataclasses.asdict(Config(attention=attention))
            del values[key]
            with open(path, "w", encoding="utf-8") as f:
                json.dump(values, f)
            self.assertEqual(getattr(Config.load(path), key), value)
        Config(attention="hard").save(path)
        self.assertEqual(getattr(Config.load(path), key), new)

    def test_unknown_key_is_named(self):
        path = os.path.join(self.dir, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"batch_size": 3, "colour": "red", "zoom": 2}, f)
        with self.assertRaisesRegex(ValueError, "colour, zoom"):
            Config.load(path)

    def test_bad_value_in_file(self):
        path = os.path.join(self.dir, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"attention": "loud"}, f)
        with self.assertRaisesRegex(ValueError, "--attention='loud'"):
            Config.load(path)

    @parameterized.named_parameters(
        ("missing", None),
        ("not_json", b"{batch_size: 3"),
        ("not_utf8", b'{"data_dir": "caf\xe9"}'),
    )
    def test_unreadable_file_is_named(self, data):
        path = os.path.join(self.dir, "broken_config.json")
        if data is not None:
            with open(path, "wb") as f:
                f.write(data)
        with self.assertRaisesRegex(ValueError, "broken_config.json"):
            Config.load(path)


class OneSourceTest(parameterized.TestCase):
    @parameterized.named_parameters(*[(name, name) for name in CHOICES])
    def test_check_choice_reads_choices(self, name):
        for value in CHOICES[name]:
            config_lib.check_choice(name, value)
        with self.assertRaises(ValueError) as raised:
            config_lib.check_choice(name, "bogus")
        choices = ", ".join(map(repr, CHOICES[name]))
        self.assertEqual(str(raised.exception), f"{name}='bogus' is not one of {choices}")

    def test_added_fields_fill_what_a_saved_config_lacks(self):
        later = {"global_context": False, "start_state": "mean", "location_prior": False}
        self.assertEqual(
            config_lib.with_added_fields({"attention": "soft"}), {"attention": "soft", **later}
        )
        hard = config_lib.with_added_fields({"attention": "hard", "start_state": "learned"})
        self.assertEqual(
            hard,
            {"attention": "hard", **later, "start_state": "learned"}
            | {"hard_gate": False, "hard_decoding": "argmax"},
        )
        names = {f.name for f in dataclasses.fields(Config)}
        self.assertContainsSubset(set(config_lib.ADDED_FIELDS), names)

    def test_arguments_are_the_settings_a_function_names(self):
        def part(seed, beam_size, vocab_size, other=1):
            del seed, beam_size, vocab_size, other

        config = Config(seed=3, beam_size=2)
        self.assertEqual(
            config_lib.arguments(part, config, leave_out=("vocab_size",)),
            {"seed": 3, "beam_size": 2},
        )

    def test_named_groups_are_settings(self):
        names = {f.name for f in dataclasses.fields(Config)}
        for group in (config_lib.HARD_ONLY, config_lib.DECODING_FIELDS, config_lib.MODEL_FIELDS):
            self.assertContainsSubset(set(group), names)


class DifferencesTest(parameterized.TestCase):
    def test_names_each_differing_setting_with_both_values_in_the_order_asked(self):
        mine = Config(seed=1, epochs=6, attention="hard")
        theirs = Config(seed=2, epochs=10, attention="hard")
        self.assertEqual(mine.differences(theirs), [("seed", 1, 2), ("epochs", 6, 10)])
        self.assertEqual(
            mine.differences(theirs, ["epochs", "attention", "seed"]),
            [("epochs", 6, 10), ("seed", 1, 2)],
        )
        self.assertEqual(theirs.differences(mine, ["epochs"]), [("epochs", 10, 6)])

    def test_equal_configs_and_unasked_settings_give_nothing(self):
        self.assertEqual(Config().differences(Config()), [])
        self.assertEqual(Config(seed=1).differences(Config(seed=2), ["epochs"]), [])


class HelpTest(parameterized.TestCase):
    def test_every_field_has_help(self):
        rows = list(config_lib.fields_with_help())
        fields = dataclasses.fields(Config)
        self.assertEqual([name for name, *_ in rows], [f.name for f in fields])
        defaults = Config()
        for name, default, kind, help_text in rows:
            self.assertIn(kind, (str, int, float, bool), name)
            self.assertIsInstance(default, kind, name)
            self.assertEqual(default, getattr(defaults, name))
            self.assertIsInstance(help_text, str)
            self.assertGreater(len(help_text.strip()), 5, name)
            self.assertNotIn("\n", help_text, name)


if __name__ == "__main__":
    parameterized.absltest.main()


def test_the_encoder_help_names_every_backbone_of_the_registry():
    from sat_tf.backbones import registry

    help_text = next(h for name, _, _, h in config_lib.fields_with_help() if name == "encoder")
    listed = help_text.split(":", 1)[1].rstrip(".").split(", ")
    assert [name.strip() for name in listed] == list(registry.REGISTRY)


def test_every_setting_is_in_one_section():
    names = [f.name for f in dataclasses.fields(Config)]
    listed = [name for names in config_lib.SECTIONS.values() for name in names]
    assert sorted(listed) == sorted(names)
    assert set(config_lib.ESSENTIAL) <= set(names)
    assert config_lib.section_of("tag_threshold") == "decoding"
