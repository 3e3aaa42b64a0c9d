"""The log engine (store/log.py): recovery reports, durable appends, atomic compaction.

Crashes are simulated in-process as the store fault tests do (test_store_faults.py,
test_fsync_failure.py): the fsync calls are wrapped to remember what each file
held when it was last made durable, and a crash at a step of a compaction is an
exception raised there, after which a copy of the disk is recovered.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stratad.store import fsync as fsync_module
from stratad.store import journal as journal_mod
from stratad.store.journal import Record
from stratad.store.log import Encoded, Log, Reader, Recovery, records
from stratad.store.store import Store

T = "acme"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "data", durability="fsync")
    yield s
    s.close()


def journal_path(store: Store) -> Path:
    return store.tenant(T).root / "things" / "journal"


def recovered(data_dir: Path, reads: bool = False) -> tuple[Log, list[Record], Recovery, Store]:
    store = Store(data_dir, durability="fsync")
    log = Log(store, data_dir / "tenants" / T / "things" / "journal")
    seen: list[Record] = []
    assert log.exists()
    found = log.recover(lambda record, start, end: seen.append(record), reads=reads)
    return log, seen, found, store


def write(store: Store, n: int, start: int = 0) -> Log:
    log = Log(store, journal_path(store))
    log.create(reads=True)
    for i in range(start, start + n):
        log.append(Record("put", {"i": i})).wait()
    return log


def numbers(seen: list[Record]) -> list[int]:
    out: list[int] = []
    for record in seen:
        if record.kind == "snapshot":
            out = list(record.body["all"])
        else:
            out.append(record.body["i"])
    return out


def test_recover_reports_a_torn_tail_and_cuts_it(store: Store) -> None:
    size = write(store, 3).size
    path = journal_path(store)
    store.close()
    with path.open("ab") as f:
        f.write(b"\x40\x00\x00\x00\x01\x02")  # a header promising more than follows
    written = path.stat().st_size
    log, seen, found, again = recovered(store.data_dir)
    assert numbers(seen) == [0, 1, 2]
    assert found.torn and not found.zero_tail and found.cut_bytes == written - size
    assert found.damaged_at is None and path.stat().st_size == size == found.valid_bytes
    log.append(Record("put", {"i": 3})).wait()
    again.close()
    assert numbers(recovered(store.data_dir)[1]) == [0, 1, 2, 3]


def test_recover_reports_a_zero_tail_quietly(store: Store) -> None:
    size = write(store, 2).size
    path = journal_path(store)
    store.close()
    with path.open("ab") as f:
        f.write(bytes(4096))  # preallocated space a crash left
    written = path.stat().st_size
    _, seen, found, again = recovered(store.data_dir)
    again.close()
    assert numbers(seen) == [0, 1]
    assert found.zero_tail and not found.torn and found.cut_bytes == written - size
    assert path.stat().st_size == size


def test_recover_reports_damage_and_leaves_it(store: Store) -> None:
    write(store, 3)
    path = journal_path(store)
    store.close()
    data = bytearray(path.read_bytes())
    ends = [end for _, _, end in records(bytes(data))]
    data[ends[0] + 10] ^= 0xFF  # a flipped bit in the second record
    path.write_bytes(bytes(data))
    _, seen, found, again = recovered(store.data_dir)
    again.close()
    assert numbers(seen) == [0]
    assert found.damaged_at == ends[0] and found.cut_bytes == 0
    assert path.read_bytes() == bytes(data)  # never cut


def test_a_refused_record_is_damage(store: Store) -> None:
    write(store, 3)
    store.close()
    again = Store(store.data_dir, durability="fsync")
    log = Log(again, journal_path(again))
    assert log.exists()

    def apply(record: Record, start: int, end: int) -> None:
        if record.body["i"] == 1:
            raise KeyError("no such thing")

    found = log.recover(apply, refused=(KeyError,))
    again.close()
    assert found.damaged_at is not None and "no such thing" in found.error


def test_records_iterates_with_offsets(store: Store) -> None:
    log = write(store, 4)
    data = journal_path(store).read_bytes()[: log.size]
    found = list(records(data))
    assert [r.body["i"] for r, _, _ in found] == [0, 1, 2, 3]
    assert found[0][1] == 0 and found[-1][2] == log.size
    for (_, _, end), (_, start, _) in itertools.pairwise(found):
        assert end == start
    _, start, end = found[2]
    assert log.read_at(start, end - start) == data[start:end]


class Durable:
    """What every file held when it was last fsynced (a crash keeps only that)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.images: dict[str, bytes] = {}
        for name in ("fsync", "fdatasync"):
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))
        monkeypatch.setattr(fsync_module, "_SYNCFS", None)

    def _wrap(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            real(fd)
            target = os.readlink(f"/proc/self/fd/{fd}")
            if os.path.isfile(target):
                with open(target, "rb") as f:
                    self.images[target] = f.read()

        return sync

    def crash(self, path: Path, into: Path) -> Path:
        """A data directory holding only the durable image of the journal at `path`."""
        target = into / "tenants" / T / "things" / "journal"
        target.parent.mkdir(parents=True)
        target.write_bytes(self.images[str(path)])
        return into


def test_an_acknowledged_append_survives_a_crash(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    durable = Durable(monkeypatch)
    log = write(store, 5)
    unsynced = log.append(Record("put", {"i": 99}))  # never waited for
    assert unsynced.end == log.size
    crashed = durable.crash(journal_path(store), tmp_path / "crashed")
    _, seen, found, again = recovered(crashed)
    again.close()
    assert numbers(seen)[:5] == [0, 1, 2, 3, 4]
    assert found.damaged_at is None


class Crash(BaseException):
    """The process dies here (not an error anything may catch)."""


def snapshot(log: Log, upto: int) -> Callable[[Reader], list[Record]]:
    def build(reader: Reader) -> list[Record]:
        first = list(records(reader.read(0, log.size)))
        assert [r.body["i"] for r, _, _ in first] == list(range(upto))
        return [Record("snapshot", {"all": list(range(upto))})]

    return build


STEPS = ["write", "fsync", "rename", "fsync_dir"]


@pytest.mark.parametrize("step", STEPS)
def test_compaction_is_atomic_under_a_crash_at_each_step(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    log = write(store, 10)

    def crash_at(name: str) -> Callable[..., None]:
        def hook(*args: object) -> None:
            raise Crash(name)

        return hook

    if step == "write":
        real_write = journal_mod._write_all

        def torn_write(fd: int, data: bytes) -> None:
            real_write(fd, data[: len(data) // 2])
            raise Crash(step)

        monkeypatch.setattr(journal_mod, "_write_all", torn_write)
    elif step == "fsync":
        monkeypatch.setattr(journal_mod, "fsync_or_trip", crash_at(step))
    elif step == "rename":
        monkeypatch.setattr(os, "replace", crash_at(step))
    else:
        monkeypatch.setattr(journal_mod, "fsync_dir_or_trip", crash_at(step))
    with pytest.raises(Crash):
        log.compact(snapshot(log, 10))
    monkeypatch.undo()
    copy = tmp_path / "after-crash"
    shutil.copytree(store.data_dir / "tenants", copy / "tenants")
    again_log, seen, found, again = recovered(copy)
    assert numbers(seen) == list(range(10))  # the old journal, or the whole snapshot
    assert found.damaged_at is None
    assert not (copy / "tenants" / T / "things" / "journal.tmp").exists()  # cleaned up
    again_log.create()
    again_log.append(Record("put", {"i": 10})).wait()
    again.close()
    assert numbers(recovered(copy)[1]) == list(range(11))


def test_compaction_swaps_in_the_snapshot(store: Store) -> None:
    log = write(store, 10)
    before = log.append(Record("put", {"i": 10}))
    log.compact(snapshot(log, 11))
    before.wait()  # the old journal was synced: nothing to wait for
    after = log.append(Encoded(journal_mod.seal_record(Record("put", {"i": 11}).encode(), None)))
    after.wait()
    assert log.read_at(0, 4) == journal_path(store).read_bytes()[:4]
    store.close()
    assert numbers(recovered(store.data_dir)[1]) == list(range(12))


def test_guarded_compaction_marks_held_for_io_and_runs_the_barrier(store: Store) -> None:
    log = write(store, 4)
    lock = threading.Lock()
    seen: list[bool] = []
    log.compact_guarded(
        lock,
        lambda: seen.append(log.held_for_io and not lock.locked()),
        lambda: True,
        snapshot(log, 4),
        lambda: seen.append(lock.locked()),
    )
    assert seen == [True, True] and not log.held_for_io
    log.compact_guarded(lock, lambda: None, lambda: False, snapshot(log, 99))  # not due: no-op
    store.close()
    assert numbers(recovered(store.data_dir)[1]) == [0, 1, 2, 3]
