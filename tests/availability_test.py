"""Tests for sat_tf.server.availability: TF Serving's availability-preserving policy on
the situations of its own tests (availability_preserving_policy_test.cc) and on the ones
an operator meets (a new version, a broken one, a rollback), each with the action worked
out by hand."""

from absl.testing import absltest, parameterized

from sat_tf.server.availability import Snapshot, next_action


def snapshots(*versions):
    """Snapshots from (version, state, aspired) triples."""
    return [Snapshot(*v) for v in versions]


class NextActionTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("nothing", [], None),
        ("first_load_newest_first", [(1, "START", True), (2, "START", True)], ("load", 2)),
        (
            "new_version_loads_before_the_old_goes",
            [(1, "AVAILABLE", False), (2, "START", True)],
            ("load", 2),
        ),
        (
            "old_goes_once_the_new_serves",
            [(1, "AVAILABLE", False), (2, "AVAILABLE", True)],
            ("unload", 1),
        ),
        ("a_loading_version_keeps_the_old", [(1, "AVAILABLE", False), (2, "LOADING", True)], None),
        ("a_broken_version_keeps_the_old", [(1, "AVAILABLE", False), (2, "END", True)], None),
        (
            "rollback_loads_the_previous_first",
            [(1, "START", True), (2, "AVAILABLE", False)],
            ("load", 1),
        ),
        (
            "rollback_then_unloads_the_removed",
            [(1, "AVAILABLE", True), (2, "AVAILABLE", False)],
            ("unload", 2),
        ),
        (
            "nothing_aspired_unloads_the_lowest",
            [(3, "AVAILABLE", False), (4, "AVAILABLE", False)],
            ("unload", 3),
        ),
        (
            "two_old_serving_the_lowest_goes",
            [(1, "AVAILABLE", False), (2, "AVAILABLE", False), (3, "LOADING", True)],
            ("unload", 1),
        ),
        (
            "unloads_come_before_loads",
            [(1, "AVAILABLE", True), (2, "AVAILABLE", False), (3, "START", True)],
            ("unload", 2),
        ),
        ("settled", [(1, "END", False), (2, "AVAILABLE", True)], None),
    )
    def test_next_action(self, versions, want):
        self.assertEqual(next_action(snapshots(*versions)), want)


if __name__ == "__main__":
    absltest.main()
