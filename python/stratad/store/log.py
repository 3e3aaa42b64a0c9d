"""The log engine: one journal file's whole durability life, behind a narrow API.

In the spirit of etcd's `wal`: `Log.recover` replays a journal and reports what
it found (a torn tail or a crash's zero tail, both cut; damage in the middle,
left in place and reported), `append` returns a `Ticket` whose `wait` makes the
record durable through the journal's group commit, `compact` atomically
replaces the file by a snapshot (tmp, fsync, rename, directory fsync, swap) and
`compact_guarded` holds the caller's lock across those fsyncs by the
`held_for_io` + `loop_barrier` protocol (`exclusively`, for any other work
that holds it across fsyncs). `records` iterates journal bytes with each
record's offsets (replication, replay); `read` returns a range of them.

One commit path: whatever waits for records to be durable waits on tickets,
and every ticket is made durable by store/commit.py's `sync_all` (one fsync
per journal for a batch), whether a thread waits (`Ticket.wait`, `wait_all`)
or the event loop does (`GroupCommitter.wait`). Interval and `none`
durability are the journal's (store/journal.py): a ticket then costs nothing.

A log whose journal lives in a directory of its own (a session's) also owns
that directory's life: `install` (a whole journal from elsewhere, atomically)
and `retire` (moved aside before its removal).

The domain supplies only reducers (what a record does) and snapshot encoders
(the records of a compacted journal). The record format is store/journal.py's;
nothing here changes a byte on disk. Used by domain/sessions.py,
domain/profiles.py and domain/crystals/.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from stratad.store import journal as journal_mod
from stratad.store.commit import sync_all
from stratad.store.crypto import RecordCipher
from stratad.store.fsync import DIR_MODE, FILE_MODE
from stratad.store.journal import Journal, Record, RecordSealError, SizeTally

if TYPE_CHECKING:
    from stratad.store.store import Store

#: While streaming through a mapped journal, the pages already read are released
#: (they stay in the page cache) every this many bytes, so that replaying or
#: compacting a large journal does not hold all of it in the daemon's memory.
RELEASE_BYTES = 64 << 20


class Encoded(Record):
    """A record encoded (and sealed, if at all) once: appended and copied byte for byte."""

    def __init__(self, data: bytes) -> None:
        super().__init__("")
        self.data = data

    def encode(self, cipher: RecordCipher | None = None) -> bytes:
        return self.data

    def pieces(self, cipher: RecordCipher | None = None) -> list[bytes]:
        return [self.data]


def records(data: bytes, cipher: RecordCipher | None = None) -> Iterator[tuple[Record, int, int]]:
    """(record, start, end) of every valid record from the start of `data`.

    Stops at the first bytes that are not a valid record. A record framed
    correctly that does not open with `cipher` raises RecordSealError (damage).
    """
    pos = 0
    while pos < len(data):
        found = journal_mod._read_record(data, pos, cipher)
        if found is None:
            return
        record, end = found
        yield record, pos, end
        pos = end


def parse_journal(data: bytes, cipher: RecordCipher | None = None) -> journal_mod.ReplayResult:
    """Journal bytes from elsewhere (a replicated segment or history): their valid
    records, and where and why they stop (a torn tail, or damage)."""
    return journal_mod.parse_records(data, cipher)


def read_record_file(path: Path) -> list[Record]:
    """The valid records of a small record file that is only ever replaced whole
    (`Log.replace`), never appended to; [] if it is missing."""
    if not path.exists():
        return []
    return journal_mod.read_records(path).records


def _release(mapped: mmap.mmap, released: int, upto: int, every: int) -> int:
    """Drop the mapped pages in [released, upto) once there are enough; return the new mark."""
    if upto - released < every:
        return released
    end = upto - upto % mmap.PAGESIZE
    with contextlib.suppress(OSError, ValueError):
        mapped.madvise(mmap.MADV_DONTNEED, released, end - released)
    return end


@dataclass
class Recovery:
    """What `Log.recover` found after the last valid record."""

    #: Where the valid records end (the journal's size after recovery).
    valid_bytes: int = 0
    #: Bytes cut after them: a torn append, or (`zero_tail`) a crash's zeros.
    cut_bytes: int = 0
    zero_tail: bool = False
    #: Set when the bytes after the valid records are damage, not a tail: the
    #: journal is left as it is and the caller refuses writes.
    damaged_at: int | None = None
    #: Why replay stopped at `damaged_at` (a record that does not open, or the
    #: reducer refusing a record).
    error: str = ""

    @property
    def torn(self) -> bool:
        return bool(self.cut_bytes) and not self.zero_tail


@dataclass(frozen=True)
class Ticket:
    """Appended records: `wait` returns once every byte before `offset` is
    durable (group commit: store/commit.py's `sync_all`).

    Bound to the journal file it went to: after a compaction (which synced
    that file first) waiting costs nothing."""

    journal: Journal
    #: Where the record ends: durable once the journal is synced up to here.
    offset: int
    #: Where it starts (appends of encoded records).
    start: int = 0

    @property
    def end(self) -> int:
        return self.offset

    def wait(self) -> None:
        sync_all((self,))


def wait_all(tickets: Iterable[Ticket]) -> None:
    """Make every ticket durable: one fsync per journal (a batch's shared commit)."""
    sync_all(tickets)


class Reader:
    """Random reads of a mapped journal in ascending order (compaction), releasing
    the pages left behind."""

    def __init__(self, mapped: mmap.mmap, release_bytes: int) -> None:
        self._mapped = mapped
        self._every = release_bytes
        self._released = 0

    def read(self, offset: int, size: int) -> bytes:
        self._released = _release(self._mapped, self._released, offset, self._every)
        return self._mapped[offset : offset + size]


class Log:
    """One journal file of the store: recovery, appends, reads, compaction."""

    def __init__(self, store: Store, path: Path, tally: SizeTally | None = None) -> None:
        self.store = store
        self.path = path
        #: Counts the journal's bytes (a tenant's stored-bytes quota).
        self.tally = tally
        self.tmp = path.with_name(path.name + ".tmp")
        self.journal: Journal | None = None
        self.cipher: RecordCipher | None = None
        self._read_fd = -1
        #: The owner's lock is about to be, or is, held across a compaction's
        #: fsyncs: reads must not wait for it on the event loop.
        self.held_for_io = False

    # -- recovery ------------------------------------------------------------------

    def exists(self) -> bool:
        """Remove what an interrupted compaction left; is there a journal to recover?"""
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()
        return self.path.exists()

    def recover(
        self,
        apply: Callable[[Record, int, int], None],
        *,
        refused: tuple[type[Exception], ...] = (),
        release_bytes: int = RELEASE_BYTES,
        reads: bool = False,
        open_for_appends: bool = True,
    ) -> Recovery:
        """Replay the journal through `apply(record, start, end)`, cut a torn or
        zero tail, and open it for appends (and `read_at` with `reads`) unless
        `open_for_appends` is False (the caller then `open`s it, or not).

        The journal is streamed memory-mapped, releasing pages behind the
        replay. An exception of `refused` from `apply` marks the journal
        damaged at that record, like a record that does not open.
        """
        self.cipher = self.store.journal_cipher(self.path)
        found = Recovery()
        end = 0
        stops: tuple[type[Exception], ...] = (RecordSealError, *refused)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    data = cast(bytes, mapped)
                    released = 0
                    try:
                        for record, start, stop in records(data, self.cipher):
                            apply(record, start, stop)
                            end = stop
                            released = _release(mapped, released, end, release_bytes)
                    except stops as exc:
                        found.error = str(exc)
                        found.damaged_at = end
                    else:
                        if end < size:
                            if journal_mod._is_torn_tail(data, end, self.cipher):
                                found.cut_bytes = size - end
                                found.zero_tail = mapped[end:] == bytes(size - end)
                            else:
                                found.damaged_at = end
        found.valid_bytes = end
        if found.cut_bytes:
            journal_mod.truncate(self.path, end)
        if open_for_appends:
            self.open(reads=reads)
        return found

    def open(self, *, reads: bool = False) -> None:
        """Open the journal for appends (creating the file if it is missing;
        `create` also makes its entry durable)."""
        self.journal = self.store.open_journal(self.path, self.tally)
        self.cipher = self.journal.cipher
        if reads:
            self._read_fd = os.open(self.path, os.O_RDONLY)

    def create(self, *, reads: bool = False) -> None:
        """Open a journal that does not exist yet: its directory, the file, durably."""
        if self.journal is None:
            self.store.make_dirs(self.path.parent)
            self.open(reads=reads)
            self.store.fsync_dir(self.path.parent)

    def sync_new_directory(self) -> None:
        """Make a new journal's entry and its new directory's entry durable (the
        caller made the directory, and opened the journal in it)."""
        self.store.fsync_dir(self.path.parent.parent)
        self.store.fsync_dir(self.path.parent)

    # -- appends -------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.journal.size if self.journal is not None else 0

    def append(self, record: Record) -> Ticket:
        """Append (not yet durable: `Ticket.wait`); the caller serializes appends."""
        assert self.journal is not None
        start = self.journal.size
        return Ticket(self.journal, self.journal.append(record), start)

    def append_plain(self, plain: bytes) -> Ticket:
        """Append an encoded record (plaintext: sealed here when the journal is)."""
        return self.append(Encoded(journal_mod.seal_record(plain, self.cipher)))

    def ticket(self) -> Ticket:
        """What makes every record appended so far durable."""
        assert self.journal is not None
        return Ticket(self.journal, self.journal.size)

    def read_at(self, offset: int, size: int) -> bytes:
        """The stored bytes of a record (sealed, if the journal is); OSError if unreadable."""
        return os.pread(self._read_fd, size, offset)

    def read(self, start: int, end: int) -> bytes:
        """The journal's bytes in [start, end) as stored (replication ships them)."""
        if end <= start:
            return b""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.pread(fd, end - start, start)
        finally:
            os.close(fd)

    # -- compaction ----------------------------------------------------------------

    def compact(
        self,
        snapshot: Callable[[Reader], Iterable[Record]],
        *,
        release_bytes: int = RELEASE_BYTES,
    ) -> None:
        """Atomically replace the journal by `snapshot(reader)`'s records (lock held).

        The old journal is synced first (writers still waiting on it find their
        records durable); the new one is written to a tmp file, fsynced,
        renamed over the journal, the directory fsynced, then swapped in. A
        failure before the rename leaves the old journal in use.
        """
        old = self.journal
        assert old is not None
        old.sync_now()
        if self._read_fd >= 0:
            with mmap.mmap(self._read_fd, 0, access=mmap.ACCESS_READ) as mapped:
                built = snapshot(Reader(mapped, release_bytes))
                self.store.rewrite_journal(self.path, built)
        else:
            self.store.rewrite_journal(self.path, snapshot(_NO_READER))
        reads = self._read_fd >= 0
        self.journal = self.store.open_journal(self.path, self.tally)
        if reads:
            old_fd, self._read_fd = self._read_fd, os.open(self.path, os.O_RDONLY)
            os.close(old_fd)
        old.close(trim=False)

    def compact_guarded(
        self,
        lock: threading.Lock,
        loop_barrier: Callable[[], None],
        due: Callable[[], bool],
        snapshot: Callable[[Reader], Iterable[Record]],
        done: Callable[[], None] = lambda: None,
    ) -> None:
        """`compact` with `lock` held across its fsyncs, if `due()` still holds
        (then `done()`, lock still held).

        The log is marked `held_for_io` first and the lock taken once the event
        loop has finished what it was running (`loop_barrier`): reads started
        from then on run on worker threads, not on the loop.
        """
        with self.exclusively(lock, loop_barrier):
            if due():
                self.compact(snapshot)
                done()

    @contextlib.contextmanager
    def exclusively(self, lock: threading.Lock, loop_barrier: Callable[[], None]) -> Iterator[None]:
        """Hold the owner's `lock` across fsyncs (a compaction, a deletion).

        The log is marked `held_for_io` first, and the lock taken only once
        the event loop has finished what it was running (`loop_barrier`): every
        call the loop starts for the owner from then on runs on a worker thread
        (the call runner checks `held_for_io`), and no call already under way
        can be left waiting for the disk on the loop.
        """
        self.held_for_io = True
        try:
            loop_barrier()
            with lock:
                yield
        finally:
            self.held_for_io = False

    def replace(self, records: Iterable[Record]) -> None:
        """Atomically make `records` the whole file (a small record file never
        appended to, read back by `read_record_file`); no journal may be open."""
        assert self.journal is None
        self.store.rewrite_journal(self.path, records)

    # -- a journal in a directory of its own ------------------------------------------

    def install(self, data: bytes, staging: Path) -> None:
        """Make `data` this log's journal, in a new directory, atomically.

        Written and fsynced in `staging` (a new directory beside the log's,
        named by the caller so that recovery removes it if a crash leaves it),
        then renamed into place: after a crash the journal is whole or absent.
        """
        staging.mkdir(mode=DIR_MODE)
        fd = os.open(staging / self.path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.store.fsync_dir(staging)
        staging.rename(self.path.parent)
        self.store.fsync_dir(self.path.parent.parent)

    def retire(self, trash: Path, *, durable: bool = True) -> None:
        """Close the journal and move its directory to `trash` (the caller removes
        it); with `durable`, the move survives a crash before the removal."""
        if self.journal is not None:
            self.journal.close(trim=False)
        self.close()
        self.path.parent.rename(trash)
        if durable:
            self.store.fsync_dir(trash.parent)

    def close(self) -> None:
        """Release the read handle (the store closes the journals)."""
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1


class _NoReader(Reader):
    def __init__(self) -> None:
        pass

    def read(self, offset: int, size: int) -> bytes:
        raise ValueError("this log was opened without reads")


_NO_READER = _NoReader()
