"""Quiet TensorFlow's C++ logging in tests; tests run on the CPU."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

# The test classes that read fixtures.trained_run, the one training a test process does:
# under `pytest -n N --dist loadscope` they go to the same worker, so the run is trained
# once per session instead of once per worker that meets one of them.
SHARED_RUN_CLASSES = (
    "tests/scripts_test.py::CaptionEvaluateScriptTest",
    "tests/train_lib_test.py::TrainAndEvaluateTest",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            scope = super()._split_scope(nodeid)
            return "trained_run" if scope in SHARED_RUN_CLASSES else scope

    return Scheduling(config, log)
