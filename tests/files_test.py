"""Tests for sat_tf.utils.files: the staged folder (complete or absent) and the file
checksum."""

import os
import stat

import pytest

from sat_tf.utils import files


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


def test_undone_on_failure_removes_what_the_block_added(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "kept.json").write_text("old")
    with pytest.raises(ValueError, match="refused"):
        with files.undone_on_failure(str(folder)):
            (folder / "kept.json").write_text("new")  # was there: stays, as written
            (folder / "config.json").write_text("{}")
            (folder / "backup").mkdir()
            (folder / "backup" / "state").write_text("x")
            raise ValueError("refused")
    assert sorted(os.listdir(folder)) == ["kept.json"]
    assert (folder / "kept.json").read_text() == "new"


def test_undone_on_failure_removes_the_folder_it_made(tmp_path):
    folder = tmp_path / "new" / "run"
    with pytest.raises(KeyboardInterrupt):
        with files.undone_on_failure(str(folder)):
            folder.mkdir(parents=True)
            (folder / "vocab.txt").write_text("<pad>")
            raise KeyboardInterrupt
    assert not folder.exists()
    assert (tmp_path / "new").exists()  # made before the block: not the block's


def test_undone_on_failure_keeps_everything_on_success(tmp_path):
    folder = tmp_path / "run"
    with files.undone_on_failure(str(folder)):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    assert os.listdir(folder) == ["config.json"]
