"""Tests for sat_tf.cli.table (sat-table): the seed table's means and standard deviations
by hand with the grounding columns, grounding reports checked, and the seeds of a row
refused unless they are runs of one recipe."""

import json
import os

import tensorflow as tf
from fixtures import run_main

from sat_tf import config
from sat_tf.cli import table as table_cli


class SeedTableTest(tf.test.TestCase):
    def test_runs_of_one_name_are_seeds_with_their_grounding(self):
        folder = self.get_temp_dir()

        def write(name, payload):
            path = os.path.join(folder, name)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(payload, f)
            return path

        grounding = {"hit": 0.5, "centre": 0.4, "random": 0.3, "mass": 0.45, "area_share": 0.3}
        runs = [
            "soft="
            + write("s0.json", {"BLEU-4": 0.2, "METEOR": 0.2, "CIDEr": 0.5})
            + ","
            + write(
                "g0.json", {**grounding, "hit": 0.6, "off_centre": {"hit": 0.25, "random": 0.1}}
            ),
            "soft="
            + write("s1.json", {"BLEU-4": 0.3, "METEOR": 0.2, "CIDEr": 0.5})
            + ","
            + write("g1.json", grounding),
            "none=" + write("n0.json", {"BLEU-4": 0.25, "METEOR": 0.2, "CIDEr": 0.4}),
        ]
        code, out, err = run_main(table_cli.main, "sat-table", "--seeds", *runs)
        self.assertEqual(code, 0, err)
        # BLEU-4 sd: |0.2 - 0.3| / sqrt(2) = 0.0707; hit sd the same for 0.6 and 0.5 / 10.
        # Only the first report splits off the off-centre words (a report written before
        # the split has none): one run each in those two columns.
        self.assertIn(
            "| soft | 2 | 0.250 ± 0.071 | 0.200 ± 0.000 | 0.500 ± 0.000 | 0.550 ± 0.071 "
            "| 0.400 ± 0.000 | 0.450 ± 0.000 | 0.250 (1) | 0.100 (1) |\n",
            out,
        )
        self.assertIn("| none | 1 | 0.250 | 0.200 | 0.400 | n/a | n/a | n/a | n/a | n/a |\n", out)

    def test_a_second_file_that_is_not_a_grounding_report_is_refused(self):
        folder = self.get_temp_dir()
        path = os.path.join(folder, "m.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"BLEU-4": 0.2}, f)
        code, _, err = run_main(table_cli.main, "sat-table", "--seeds", f"soft={path},{path}")
        self.assertNotEqual(code, 0)
        self.assertIn(f"{path} is not a grounding report", err)

    def test_seeds_of_one_row_are_runs_of_one_recipe(self):
        folder = self.get_temp_dir()

        def run_dir(name, **settings):
            workdir = os.path.join(folder, name)
            os.makedirs(workdir)
            config.Config(**settings).save(os.path.join(workdir, "config.json"))
            path = os.path.join(workdir, "metrics_test.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"BLEU-4": 0.2, "METEOR": 0.2, "CIDEr": 0.5}, f)
            return path

        s0 = run_dir("s0", seed=0, epochs=6)
        # Seed, paths and decoding may differ between seeds.
        s1 = run_dir("s1", seed=1, epochs=6, beam_size=5, cache_dir="/elsewhere")
        other = run_dir("other", seed=2, epochs=10, attention="hard")
        code, out, err = run_main(table_cli.main, "sat-table", "--seeds", f"a={s0}", f"a={s1}")
        self.assertEqual(code, 0, err)
        self.assertIn("| a | 2 |", out)
        code, _, err = run_main(table_cli.main, "sat-table", "--seeds", f"a={s0}", f"a={other}")
        self.assertNotEqual(code, 0)
        self.assertIn("row 'a' mixes runs of other settings", err)
        self.assertIn(f"--epochs: {s0} has 6, {other} 10", err)
        self.assertIn(f"--attention: {s0} has 'soft', {other} 'hard'", err)
        self.assertNotIn("--seed:", err)
        # Other row names keep them apart.
        code, _, err = run_main(table_cli.main, "sat-table", "--seeds", f"a={s0}", f"b={other}")
        self.assertEqual(code, 0, err)
        code, _, err = run_main(table_cli.main, "sat-table", "--seeds", f"a={s0}", f"a={s0}")
        self.assertNotEqual(code, 0)
        self.assertIn(f"row 'a' lists {s0} twice", err)


if __name__ == "__main__":
    tf.test.main()
