"""The data directory: created on first start, owned by one daemon at a time.

``<data>/LOCK`` carries an exclusive ``flock`` for as long as the daemon runs,
and the owner's PID so that a second daemon can say who holds it. The lock is
on the open file, so the kernel drops it when the process dies however it
dies: a stale LOCK file never blocks a restart.

``<data>/FORMAT`` names the on-disk layout version; a directory written by a
layout this code does not know is refused rather than misread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType
from typing import Final

from stratad.errors import FailedPreconditionError
from stratad.store.fsync import DIR_MODE, FILE_MODE, fsync_dir

LOCK_NAME: Final = "LOCK"
FORMAT_NAME: Final = "FORMAT"
FORMAT_VERSION: Final = 1
FORMAT_TEXT: Final = f"stratad-format {FORMAT_VERSION}\n"


class DataDirError(FailedPreconditionError):
    """The data directory cannot be used."""


class DataDirLockedError(DataDirError):
    """Another process holds the data directory's lock."""

    def __init__(self, message: str, holder_pid: int | None) -> None:
        super().__init__(message)
        self.holder_pid = holder_pid


class DataDirFormatError(DataDirError):
    """FORMAT is missing where expected, unreadable, or names an unknown layout."""


class DataDir:
    """An open, locked data directory. Use `open_data_dir` to get one."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    @property
    def closed(self) -> bool:
        return self._lock_fd is None

    def close(self) -> None:
        """Release the lock. Safe to call twice."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        # Clear our PID before unlocking: afterwards the file belongs to
        # whichever daemon locks it next, and we must not touch it.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> DataDir:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "locked"
        return f"DataDir({str(self.path)!r}, {state})"


def open_data_dir(path: Path | str) -> DataDir:
    """Create (if needed), lock and format-check the data directory at ``path``.

    Raises `DataDirLockedError` if another process owns it and
    `DataDirFormatError` if it holds a layout this version cannot read.
    """
    root = Path(path).absolute()
    try:
        root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise DataDirError(f"cannot create data directory {root}: {exc.strerror}") from None
    lock_fd = _lock(root)
    try:
        _check_format(root)
    except BaseException:
        DataDir(root, lock_fd).close()
        raise
    return DataDir(root, lock_fd)


def _lock(root: Path) -> int:
    """Take the exclusive lock on <root>/LOCK and record our PID in it."""
    lock_path = root / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    except OSError as exc:
        raise DataDirError(f"cannot open lock file {lock_path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _read_pid(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise _locked_error(root, lock_path, holder) from None
        raise DataDirError(f"cannot lock {lock_path}: {exc.strerror}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _read_pid(fd: int) -> int | None:
    # The holder may be between taking the lock and writing its PID.
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _locked_error(root: Path, lock_path: Path, holder: int | None) -> DataDirLockedError:
    who = f"PID {holder}" if holder is not None else "a process whose PID is not recorded yet"
    return DataDirLockedError(
        f"data directory {root} is in use by another stratad ({who}; lock file {lock_path})",
        holder,
    )


def _check_format(root: Path) -> None:
    """Write FORMAT on first start; on later starts, refuse a layout we do not know."""
    format_path = root / FORMAT_NAME
    try:
        text = format_path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        _write_durably(format_path, FORMAT_TEXT)
        return
    except OSError as exc:
        raise DataDirFormatError(f"cannot read {format_path}: {exc.strerror}") from None
    if text.strip() != FORMAT_TEXT.strip():
        raise DataDirFormatError(
            f"{format_path} says {text.strip()[:80]!r} but this stratad reads only "
            f"{FORMAT_TEXT.strip()!r}; refusing to start on {root}"
        )


def _write_durably(path: Path, text: str) -> None:
    # Temp file + fsync + rename + directory fsync: FORMAT is either absent or
    # complete, never empty, after a crash during the first start.
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
    fsync_dir(path.parent)


__all__ = [
    "FORMAT_TEXT",
    "FORMAT_VERSION",
    "DataDir",
    "DataDirError",
    "DataDirFormatError",
    "DataDirLockedError",
    "open_data_dir",
]
