"""Quiet TensorFlow's C++ logging in tests; tests run on the CPU; the order in which
pytest-xdist hands out the test classes, and which go to one worker together.

Two markers on test classes, read here from the collected tests:
- `@pytest.mark.scope_group(name)`: the classes that share what a test process makes once
  (the `functools.cache` function `name` that they call). Under `pytest -n N --dist
  loadscope` each group goes to one worker, so it is made once per session instead of
  once per worker that meets one of them; layout_test checks that the marked classes are
  the ones that call it.
- `@pytest.mark.long(rank)`: the classes that take longest (BUILD_NOTES.md, "Test suite
  time"), run first in the order of their ranks: pytest-xdist hands out classes in the
  order they are collected, so with these at the end one worker would still be busy with
  them long after the other has finished. The classes of a group share its rank. Order
  within a class is kept; the rest of the suite keeps its order after them. A rank out of
  date only costs time.
"""

import math
import os
import shutil

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

from sat_tf.evaluation import java_tools  # noqa: E402  (after the environment above)

# A test process scores splits minutes apart as often as seconds apart: it keeps METEOR's
# Java process (1.1 GB) for the session instead of starting it again after each minute
# idle, as a training run does between epochs.
java_tools.METEOR_IDLE_SECONDS = 3600.0

# How a worker tells the scheduler an item's group: after its node id, as pytest-xdist's
# own `--dist loadgroup` does (the scheduler sees node ids only, never the items).
GROUP_MARK = "@"


def _rank(item):
    mark = item.get_closest_marker("long")
    return mark.args[0] if mark else math.inf


def _group(nodeid):
    """The scope group a worker wrote after `nodeid`, or None."""
    at = nodeid.rfind(GROUP_MARK)
    return nodeid[at + 1 :] if at > nodeid.rfind("]") else None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    # A worker's own `dist` option is "no": the controller tells it whether it groups.
    node.workerinput["scope_groups"] = node.config.getvalue("dist") == "loadscope"


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)
    if getattr(config, "workerinput", {}).get("scope_groups"):
        for item in items:
            mark = item.get_closest_marker("scope_group")
            if mark is not None:
                item._nodeid = f"{item.nodeid}{GROUP_MARK}{mark.args[0]}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return _group(nodeid) or super()._split_scope(nodeid)

    # pytest-xdist (3.x) would hand out the scopes with the most tests first; the order
    # that counts here is the time they take (the `long` ranks).
    config.option.loadscopereorder = False
    return Scheduling(config, log)


# metrics_test and java_tools_test: the scores of a machine without Java.
@pytest.fixture
def no_java(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "java" else real_which(name, *a, **k)
    )
