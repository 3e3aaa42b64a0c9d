"""Fail-stop after a failed fsync: nothing more is written, nothing more is served.

A mutation is applied in memory when its journal record is appended, before
the fsync that makes it durable. If that fsync fails (EIO, a vanished disk),
the in-memory state holds a change that may never reach the disk, and the
kernel may already have dropped the dirty pages: retrying the fsync can
report success for data that is gone (the "fsyncgate" lesson PostgreSQL
learned in 2018). The only safe answer is PostgreSQL's: stop. From the first
failed fsync of a journal or of an object pack:

- every later write and read RPC is refused with UNAVAILABLE
  (reason STORAGE_FAILED), so the unacknowledged state is never served;
- no compaction or background sync runs (a snapshot would make the
  unacknowledged state durable);
- the daemon exits with `EXIT_STORAGE_FAILED`, and its restart replays the
  journals from what the disk really holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from stratad.errors import ResourceExhaustedError, UnavailableError

log = logging.getLogger(__name__)

#: The daemon's exit status after a storage failure (see docs/storage.md).
EXIT_STORAGE_FAILED = 75  # EX_TEMPFAIL: restart me


class StorageFailedError(UnavailableError):
    """A write could not be made durable; the daemon refuses all work until restarted."""

    default_reason = "STORAGE_FAILED"


class ReadOnlyError(ResourceExhaustedError):
    """The daemon started on a full disk and serves reads only until space returns."""

    default_reason = "READ_ONLY"


class FailStop:
    """The data directory's failure latch, shared by every journal and object store.

    It also carries the (recoverable) read-only mode: a daemon that restarts
    on a full disk cannot write the objects its journals carry, so it serves
    reads and refuses writes until the background syncer manages to write
    them (see Store.retry_read_only).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._error: StorageFailedError | None = None
        self._listeners: list[Callable[[StorageFailedError], None]] = []
        self.read_only: ReadOnlyError | None = None

    @property
    def error(self) -> StorageFailedError | None:
        return self._error

    def check(self) -> None:
        """Raise the failure if storage has failed."""
        if self._error is not None:
            raise self._error

    def check_writable(self) -> None:
        """Raise the failure, or the read-only error, if nothing may be written."""
        self.check()
        if self.read_only is not None:
            raise self.read_only

    def trip(self, what: str, exc: OSError) -> StorageFailedError:
        """Record that `what` failed with `exc`; return the error to raise.

        The first failure wins and is what every later call reports.
        """
        with self._lock:
            first = self._error is None
            if first:
                self._error = StorageFailedError(
                    f"storage failed ({what}: {exc.strerror or exc}); stratad refuses all "
                    "reads and writes until it is restarted, and a restart recovers what "
                    "the disk holds",
                    metadata={"operation": what, "errno": str(exc.errno or "")},
                )
            error = self._error
            assert error is not None
            listeners = list(self._listeners) if first else []
        if first:
            log.critical("%s", error.message)
        for listener in listeners:
            listener(error)
        return error

    def on_trip(self, listener: Callable[[StorageFailedError], None]) -> None:
        """Call `listener(error)` (from the failing thread) at the first failure."""
        with self._lock:
            self._listeners.append(listener)
            error = self._error
        if error is not None:
            listener(error)
