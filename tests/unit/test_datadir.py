"""The data directory: creation, the exclusive lock and the FORMAT check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stratad.errors import FailedPreconditionError
from stratad.store.datadir import (
    FORMAT_TEXT,
    DataDirError,
    DataDirFormatError,
    DataDirLockedError,
    open_data_dir,
)


def test_creates_directory_format_and_lock(tmp_path: Path) -> None:
    root = tmp_path / "a" / "data"
    with open_data_dir(root) as data_dir:
        assert data_dir.path == root
        assert (root / "FORMAT").read_text() == FORMAT_TEXT
        assert (root / "LOCK").read_text() == f"{os.getpid()}\n"


def test_second_open_is_refused_naming_lock_and_pid(tmp_path: Path) -> None:
    # flock locks belong to the open file, so a second open in the same
    # process conflicts just like another daemon would.
    with open_data_dir(tmp_path) as first:
        with pytest.raises(DataDirLockedError) as excinfo:
            open_data_dir(tmp_path)
        assert not first.closed
    error = excinfo.value
    assert error.holder_pid == os.getpid()
    assert f"PID {os.getpid()}" in error.message
    assert str(tmp_path / "LOCK") in error.message
    assert "in use" in error.message
    assert isinstance(error, FailedPreconditionError)


def test_lock_is_released_on_close(tmp_path: Path) -> None:
    data_dir = open_data_dir(tmp_path)
    data_dir.close()
    data_dir.close()  # idempotent
    assert data_dir.closed
    assert (tmp_path / "LOCK").read_text() == ""  # no stale PID left behind
    open_data_dir(tmp_path).close()


def test_existing_format_is_accepted(tmp_path: Path) -> None:
    open_data_dir(tmp_path).close()
    open_data_dir(tmp_path).close()
    assert (tmp_path / "FORMAT").read_text() == FORMAT_TEXT


@pytest.mark.parametrize("content", ["stratad-format 2\n", "", "something else"])
def test_unknown_format_is_refused_and_unlocked(tmp_path: Path, content: str) -> None:
    (tmp_path / "FORMAT").write_text(content)
    with pytest.raises(DataDirFormatError, match="refusing to start"):
        open_data_dir(tmp_path)
    (tmp_path / "FORMAT").write_text(FORMAT_TEXT)
    open_data_dir(tmp_path).close()  # the failed open did not keep the lock


def test_path_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(DataDirError, match="cannot create data directory"):
        open_data_dir(path)


def test_stale_lock_file_from_a_dead_process_does_not_block(tmp_path: Path) -> None:
    (tmp_path / "LOCK").write_text("999999\n")
    with open_data_dir(tmp_path):
        assert (tmp_path / "LOCK").read_text() == f"{os.getpid()}\n"
