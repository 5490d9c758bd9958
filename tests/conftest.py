"""Quiet TensorFlow's C++ logging in tests; tests run on the CPU."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from sat_tf.evaluation import java_tools  # noqa: E402  (after the environment above)

# A test process scores splits minutes apart as often as seconds apart: it keeps METEOR's
# Java process (1.1 GB) for the session instead of starting it again after each minute
# idle, as a training run does between epochs.
java_tools.METEOR_IDLE_SECONDS = 3600.0

# Classes that share what a test process makes once (a `functools.cache` function of
# theirs): under `pytest -n N --dist loadscope` each group goes to one worker, so it is
# made once per session instead of once per worker that meets one of them. Group name:
# (the function, the classes that call it); layout_test checks the lists.
SCOPE_GROUPS = {
    "trained_run": (
        "trained_run",  # fixtures.trained_run: the shared training run
        (
            "tests/scripts_test.py::CaptionEvaluateScriptTest",
            "tests/train_lib_test.py::TrainAndEvaluateTest",
        ),
    ),
    "demo_exports": (
        "exports",  # demo_test.exports: a tiny model exported greedy and beam 3
        (
            "tests/demo_browser_test.py::BrowserTest",
            "tests/demo_test.py::DemoTest",
            "tests/demo_test.py::ScriptTest",
        ),
    ),
}
_GROUP_OF = {scope: group for group, (_, scopes) in SCOPE_GROUPS.items() for scope in scopes}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            scope = super()._split_scope(nodeid)
            return _GROUP_OF.get(scope, scope)

    # pytest-xdist (3.x) would hand out the scopes with the most tests first; the order
    # that counts here is the time they take (LONGEST_FIRST).
    config.option.loadscopereorder = False
    return Scheduling(config, log)


# The classes that take longest (BUILD_NOTES.md, "Test suite time"), run first:
# pytest-xdist hands out scopes in this order, so with these at the end one worker would
# still be busy with them long after the other has finished. Order within a class is
# kept; the rest of the suite keeps its order after them. A stale entry only costs time.
LONGEST_FIRST = (
    *SCOPE_GROUPS["demo_exports"][1],  # two exports, Chromium
    "tests/show_attend_tell_test.py::ShowAttendTellTest",  # many small fits
    "tests/exporting_test.py::SignaturesTest",  # the signatures traced for one model after another
    "tests/recurrence_test.py::SoftAttentionRecurrenceTest",  # Jacobians
    *SCOPE_GROUPS["trained_run"][1],  # the shared training run and its commands
    "tests/export_test.py::ExportTest",  # two exports, a fresh process loading them
    "tests/train_lib_test.py::ResumeTest",  # three short runs
    "tests/cli_test.py::CaptionCommandTest",  # the shipped presets' commands
    "tests/decoder_test.py::AttentionDecoderTest",  # layer round trips
    "tests/distribute_test.py::MirroredTest",  # a child process with two CPU devices
)


def pytest_collection_modifyitems(config, items):
    rank = {scope: i for i, scope in enumerate(LONGEST_FIRST)}

    def key(item):
        return rank.get(item.nodeid.rsplit("::", 1)[0], len(LONGEST_FIRST))

    items.sort(key=key)
