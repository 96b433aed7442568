"""chatapp.user_files: private folders and files whatever the umask, atomic replaces."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from chatapp import user_files
from tests.test_catalog import _mode, open_umask  # noqa: F401 (a fixture)


def test_new_folders_are_private_existing_ones_keep_their_mode(tmp_path: Path,
                                                               open_umask: None) -> None:
    tmp_path.chmod(0o755)
    folder = user_files.private_dir(tmp_path / "a" / "b")
    assert _mode(tmp_path / "a") == _mode(folder) == 0o700
    assert _mode(tmp_path) == 0o755


def test_specchats_own_folders_are_tightened(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state" / "specchat"
    (state / "auto-policy").mkdir(parents=True)
    for folder in (tmp_path / "state", state, state / "auto-policy"):
        folder.chmod(0o755)
    monkeypatch.setattr(user_files, "user_state_dir", lambda app: str(tmp_path / "state" / app))
    user_files.private_dir(state / "auto-policy")
    assert _mode(state) == _mode(state / "auto-policy") == 0o700
    assert _mode(tmp_path / "state") == 0o755  # above specchat's folder: not specchat's


def test_a_file_where_a_folder_should_be_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    with pytest.raises(NotADirectoryError) as error:
        user_files.private_dir(tmp_path / "afile" / "sub")
    assert error.value.errno == errno.ENOTDIR


def test_write_private_replaces_atomically_and_privately(tmp_path: Path,
                                                         open_umask: None) -> None:
    path = tmp_path / "f.json"
    path.write_text("old")
    path.chmod(0o644)
    user_files.write_private(path, b"new")
    assert path.read_bytes() == b"new" and _mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.json"
    path.write_text("old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        user_files.write_private(path, b"new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_log_appends_and_is_tightened(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "logs" / "crash.log"
    with user_files.open_private_log(path) as log:
        log.write("one\n")
    path.chmod(0o644)
    with user_files.open_private_log(path) as log:
        log.write("two\n")
    assert path.read_text() == "one\ntwo\n"
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700


def test_create_private_file_keeps_the_content(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "db" / "history.sqlite3"
    user_files.create_private_file(path)
    assert path.read_bytes() == b"" and _mode(path) == 0o600 and _mode(path.parent) == 0o700
    path.write_bytes(b"data")
    path.chmod(0o644)
    user_files.create_private_file(path)
    assert path.read_bytes() == b"data" and _mode(path) == 0o600


@pytest.mark.parametrize("text", [None, "{not json", "[1, 2]", "\xff\xfe"])
def test_remembered_json_that_is_missing_or_damaged_reads_as_empty(tmp_path: Path,
                                                                   text: str | None) -> None:
    path = tmp_path / "state.json"
    if text is not None:
        path.write_bytes(text.encode("latin-1"))
    assert user_files.read_json_object(path) == {}


def test_remember_json_writes_privately_and_skips_a_failed_write(tmp_path: Path,
                                                                 open_umask: None) -> None:
    path = tmp_path / "state" / "memory.json"
    user_files.remember_json(path, {"a": 1.5, "b": [1, 2]}, indent=1)
    assert path.read_text() == '{\n "a": 1.5,\n "b": [\n  1,\n  2\n ]\n}'
    assert _mode(path.parent) == 0o700 and _mode(path) == 0o600
    assert user_files.read_json_object(path) == {"a": 1.5, "b": [1, 2]}
    (tmp_path / "afile").write_text("")
    user_files.remember_json(tmp_path / "afile" / "memory.json", {"a": 1})  # no folder: skipped
    assert (tmp_path / "afile").read_text() == ""
