"""Tests for sat_tf.files: the staged folder (complete or absent) and the file checksum."""

import os
import stat

import pytest

from sat_tf import files


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_staged_dir_appears_complete(tmp_path):
    target = tmp_path / "out" / "1"
    with files.staged_dir(str(target)) as folder:
        assert os.path.dirname(folder) == str(target.parent)
        assert not target.exists()
        with open(os.path.join(folder, "a.txt"), "w", encoding="utf-8") as f:
            f.write("new")
    assert os.listdir(target.parent) == ["1"]
    assert os.listdir(target) == ["a.txt"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755


def test_staged_dir_replaces_an_earlier_folder(tmp_path):
    target = tmp_path / "1"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with files.staged_dir(str(target)) as folder:
        with open(os.path.join(folder, "new.txt"), "w", encoding="utf-8") as f:
            f.write("new")
    assert os.listdir(tmp_path) == ["1"]
    assert os.listdir(target) == ["new.txt"]


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_staged_dir_failure_leaves_the_target_as_it_was(tmp_path, error):
    target = tmp_path / "1"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(type(error)):
        with files.staged_dir(str(target)) as folder:
            with open(os.path.join(folder, "partial.txt"), "w", encoding="utf-8") as f:
                f.write("partial")
            raise error
    assert os.listdir(tmp_path) == ["1"]
    assert os.listdir(target) == ["old.txt"]
    assert _read(target / "old.txt") == "old"


def test_staged_dir_failure_without_an_earlier_folder_leaves_nothing(tmp_path):
    with pytest.raises(ValueError, match="bad"):
        with files.staged_dir(str(tmp_path / "new")):
            raise ValueError("bad")
    assert os.listdir(tmp_path) == []


def test_sha256_of(tmp_path):
    path = tmp_path / "abc"
    path.write_bytes(b"abc")
    # The SHA-256 of "abc", FIPS 180-2 appendix B.1.
    assert files.sha256_of(path) == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
