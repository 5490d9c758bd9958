"""Tests for sat_tf/server/protos/: every `.proto` there, generated again with grpcio-tools
as its header says, gives the committed `_pb2.py` byte for byte; no module is left without
its `.proto`; the protobuf runtime setup.py asks for is the one the modules were generated
for, and grpcio-tools is pinned to the minor that generated them."""

import glob
import os
import re
import subprocess
import sys
import tempfile

from absl.testing import absltest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join("sat_tf", "server", "protos")
VERSION = re.compile(r"^# Protobuf Python Version: (\d+\.\d+\.\d+)$", re.M)


def protos():
    return sorted(glob.glob(os.path.join(ROOT, FOLDER, "*.proto")))


def setup_pin(package):
    """The version specifier setup.py gives `package` (its first mention)."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        found = re.search(rf'"{re.escape(package)}([<>=!~][^"]*)"', f.read())
    return found.group(1) if found else None


class ProtosTest(absltest.TestCase):
    def test_every_module_is_what_its_proto_generates(self):
        self.assertNotEmpty(protos())
        with tempfile.TemporaryDirectory() as out:
            for proto in protos():
                relative = os.path.relpath(proto, ROOT)
                done = subprocess.run(
                    [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--python_out={out}"]
                    + [relative],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                self.assertEqual(done.returncode, 0, done.stderr)
                module = relative[: -len(".proto")] + "_pb2.py"
                with open(os.path.join(out, module), "rb") as f:
                    generated = f.read()
                with open(os.path.join(ROOT, module), "rb") as f:
                    committed = f.read()
                self.assertEqual(committed, generated, f"{module} is not what {relative} gives")

    def test_every_module_has_its_proto(self):
        modules = glob.glob(os.path.join(ROOT, FOLDER, "*_pb2.py"))
        self.assertEqual(
            sorted(m[: -len("_pb2.py")] for m in modules),
            [p[: -len(".proto")] for p in protos()],
        )

    def test_setup_asks_for_the_runtime_and_compiler_that_made_them(self):
        versions = set()
        for proto in protos():
            with open(proto[: -len(".proto")] + "_pb2.py", encoding="utf-8") as f:
                versions.update(VERSION.findall(f.read()))
        (version,) = versions
        self.assertEqual(setup_pin("protobuf"), f">={version},<{int(version.split('.')[0]) + 1}")
        from grpc_tools import protoc

        del protoc  # imported: the compiler the first test ran is installed
        from importlib import metadata

        tools = metadata.version("grpcio-tools")
        major, minor = tools.split(".")[:2]
        self.assertEqual(setup_pin("grpcio-tools"), f"=={major}.{minor}.*")


if __name__ == "__main__":
    absltest.main()
