"""Storage faults, recovery and compaction, in-process on `Engine` over a tmp dir.

- A full disk (ENOSPC) during a journal append fails that one mutation with
  RESOURCE_EXHAUSTED and leaves no partial record; reads keep working and the
  next write after the fault clears succeeds (docs/storage.md, "Limits").
- ENOSPC while object files are written (in the background) loses nothing.
- Closing and reopening an engine replays its journals to the same state.
- Compacted journals (a tiny ``compact_min_bytes``) keep every checkpoint.
- Telling a torn tail from damage costs work in proportion to the tail.

A *crash* here is a copy of the data directory taken while the engine runs:
it holds what a SIGKILL at that moment leaves on disk (the page cache survives
a daemon crash). Journals are copied before objects, so a background write or
compaction that runs during the copy can only add to what the copy holds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stratad import native
from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.domain.models import SessionStatus
from stratad.errors import ResourceExhaustedError
from stratad.store import journal as journal_module
from stratad.store import objects as objects_module
from stratad.store.failstop import ReadOnlyError

TENANT = "default"
#: Background syncer period that never comes round during a test.
NEVER = 3600.0
WAIT_TIMEOUT = 30.0


# -- helpers -----------------------------------------------------------------------


@contextlib.contextmanager
def open_engine(data_dir: Path, **options: Any) -> Iterator[Engine]:
    engine = Engine(data_dir, **options)
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


@dataclass(frozen=True)
class Saved:
    session_id: str
    checkpoint_id: str
    data: bytes


def save(engine: Engine, session_id: str, data: bytes, **options: Any) -> Saved:
    result = engine.checkpoints.save_state(TENANT, session_id, SaveInput(data=data, **options))
    assert result.checkpoint.digest == native.digest_hex(data)
    return Saved(session_id, result.checkpoint.checkpoint_id, data)


def assert_loads(engine: Engine, saved: Saved) -> None:
    loaded = engine.checkpoints.load_state(TENANT, saved.session_id, saved.checkpoint_id)
    assert loaded.data == saved.data, f"{saved.checkpoint_id} came back different"
    assert loaded.checkpoint.digest == native.digest_hex(saved.data)


def journal_file(data_dir: Path, session_id: str) -> Path:
    return data_dir / "tenants" / TENANT / "sessions" / session_id / "journal"


def snapshot_of_disk(data_dir: Path, into: Path) -> Path:
    """Copy what is on disk now (journals first, then objects); see the module docstring."""
    tenants = data_dir / "tenants"
    for part in ("sessions", "objects"):
        for tenant in sorted(tenants.iterdir()):
            for root, _, files in os.walk(tenant / part):
                target = into / "tenants" / Path(root).relative_to(tenants)
                target.mkdir(parents=True, exist_ok=True)
                for name in files:
                    with contextlib.suppress(FileNotFoundError):  # renamed meanwhile
                        shutil.copy2(Path(root) / name, target / name)
    return into


def session_view(engine: Engine, session_id: str) -> dict[str, Any]:
    """Everything a client can learn about a session, and its replayed state."""
    checkpoints, _ = engine.checkpoints.list_checkpoints(TENANT, session_id, page_size=1000)
    return {
        "info": engine.sessions.info(TENANT, session_id),
        "checkpoints": checkpoints,
        "data": {
            cp.checkpoint_id: engine.checkpoints.load_state(
                TENANT, session_id, cp.checkpoint_id
            ).data
            for cp in checkpoints
        },
        "state": engine.sessions.live(TENANT, session_id).state.to_json(),
    }


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(0.005)


def journal_compacted(path: Path) -> bool:
    """Does the journal start with a snapshot record (it was compacted)?"""
    records = journal_module.read_records(path).records
    return bool(records) and records[0].kind == "snapshot"


def wait_for_compaction(path: Path) -> None:
    wait_until(lambda: journal_compacted(path), f"{path} is compacted")


def growing_states(rng: random.Random, start: int = 40_000, step: int = 3_000) -> Iterator[bytes]:
    """A state that grows at the end, as an agent's conversation does: multi-chunk."""
    state = rng.randbytes(start)
    while True:
        yield state
        state += rng.randbytes(rng.randint(1, step))


# -- disk full -----------------------------------------------------------------------


class DiskFull:
    """ENOSPC for journal appends and for appends to object packs, each after a
    partial write (half the bytes reach the file first)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.journal_appends = False
        self.object_files = False
        self.failures = 0
        self._real_write = os.write
        self._real_writev = os.writev
        self._real_pwritev = os.pwritev
        self._partial_written = False
        # store/journal.py appends with os.pwritev (os.write elsewhere), as
        # object packs do; only journal and pack fds are failed.
        monkeypatch.setattr(os, "write", self._write)
        monkeypatch.setattr(os, "writev", self._writev)
        monkeypatch.setattr(os, "pwritev", self._pwritev)

    def _error(self) -> OSError:
        self.failures += 1
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def _write(self, fd: int, data: Any) -> int:
        if self.journal_appends and _is_journal(fd):
            if not self._partial_written:  # half a record reaches the file first
                self._partial_written = True
                return self._real_write(fd, bytes(data[: len(data) // 2]))
            raise self._error()
        return self._real_write(fd, data)

    def _writev(self, fd: int, buffers: Any) -> int:
        if self.journal_appends and _is_journal(fd):
            return self._write(fd, b"".join(buffers))
        return self._real_writev(fd, buffers)

    def _pwritev(self, fd: int, buffers: Any, offset: int) -> int:
        if self.journal_appends and _is_journal(fd):
            data = b"".join(buffers)
            if not self._partial_written:  # half a record reaches the file first
                self._partial_written = True
                return os.pwrite(fd, data[: len(data) // 2], offset)
            raise self._error()
        if self.object_files and _is_pack(fd):
            data = b"".join(buffers)
            os.pwrite(fd, data[: len(data) // 2], offset)
            raise self._error()
        return self._real_pwritev(fd, buffers, offset)

    def clear(self) -> None:
        self.journal_appends = self.object_files = False
        self._partial_written = False


def _is_journal(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").endswith(f"{os.sep}journal")
    except OSError:
        return False


def _is_pack(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").endswith(objects_module.PACK_SUFFIX)
    except OSError:
        return False


@pytest.fixture
def disk_full(monkeypatch: pytest.MonkeyPatch) -> DiskFull:
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to tell journal writes from others")
    return DiskFull(monkeypatch)


def test_disk_full_during_a_save_leaves_no_partial_record(
    tmp_path: Path, disk_full: DiskFull
) -> None:
    rng = random.Random(1)
    with open_engine(tmp_path / "data") as engine:
        engine.sessions.create(TENANT, "agent")
        earlier = [save(engine, "agent", rng.randbytes(1000)),
                   save(engine, "agent", rng.randbytes(150_000))]  # fmt: skip
        path = journal_file(tmp_path / "data", "agent")
        # Its records; the zeros preallocated after them (store/journal.py) may go.
        records_end = engine.sessions.live(TENANT, "agent").journal.size
        journal_before = path.read_bytes()[:records_end]
        info_before = engine.sessions.info(TENANT, "agent")

        disk_full.journal_appends = True
        retried = rng.randbytes(150_000)
        with pytest.raises(ResourceExhaustedError, match="disk full"):
            save(engine, "agent", retried, checkpoint_id="after-the-fault")
        assert disk_full.failures == 1
        assert path.read_bytes() == journal_before, "a partial record was left behind"
        assert engine.sessions.info(TENANT, "agent") == info_before
        for saved in earlier:  # reads keep working on a full disk
            assert_loads(engine, saved)

        disk_full.clear()
        # The ID of the failed save was not taken; the same save now succeeds.
        after = save(engine, "agent", retried, checkpoint_id="after-the-fault")
        assert engine.sessions.info(TENANT, "agent").version == info_before.version + 1
        for saved in [*earlier, after]:
            assert_loads(engine, saved)

    with open_engine(tmp_path / "data") as engine:
        for saved in [*earlier, after]:
            assert_loads(engine, saved)
        assert engine.admin.verify().ok


def test_disk_full_while_creating_a_session(tmp_path: Path, disk_full: DiskFull) -> None:
    with open_engine(tmp_path / "data") as engine:
        disk_full.journal_appends = True
        with pytest.raises(ResourceExhaustedError):
            engine.sessions.create(TENANT, "agent")
        disk_full.clear()
        assert engine.sessions.list(TENANT)[0] == []
        engine.sessions.create(TENANT, "agent")
        saved = save(engine, "agent", b"first state")
    with open_engine(tmp_path / "data") as engine:
        assert_loads(engine, saved)


def test_save_retried_after_disk_full_survives_a_crash(tmp_path: Path, disk_full: DiskFull) -> None:
    rng = random.Random(2)
    # No background tick: objects stay where the save path leaves them.
    with open_engine(tmp_path / "data", fsync_interval=NEVER) as engine:
        engine.sessions.create(TENANT, "agent")
        first = save(engine, "agent", rng.randbytes(150_000))
        disk_full.journal_appends = True
        retried = rng.randbytes(150_000)
        with pytest.raises(ResourceExhaustedError):
            save(engine, "agent", retried)
        disk_full.clear()
        acknowledged = save(engine, "agent", retried)
        crashed = snapshot_of_disk(tmp_path / "data", tmp_path / "crashed")

    with open_engine(crashed) as engine:
        assert_loads(engine, first)
        assert_loads(engine, acknowledged)


def test_disk_full_for_object_files_loses_nothing(tmp_path: Path, disk_full: DiskFull) -> None:
    rng = random.Random(3)
    states = growing_states(rng)
    acknowledged: list[Saved] = []
    # Background ticks (object writes, compactions) every few ms.
    with open_engine(tmp_path / "data", fsync_interval=0.005, compact_min_bytes=64 << 10) as engine:
        engine.sessions.create(TENANT, "agent")
        acknowledged.append(save(engine, "agent", next(states)))
        disk_full.object_files = True
        for _ in range(20):
            # Failing the save is allowed; losing it after success is not.
            with contextlib.suppress(ResourceExhaustedError):
                acknowledged.append(save(engine, "agent", next(states)))
        wait_until(lambda: disk_full.failures > 0, "the background syncer hit the full disk")
        for saved in acknowledged:  # reads keep working
            assert_loads(engine, saved)
        disk_full.clear()
        acknowledged.append(save(engine, "agent", next(states)))
        crashed = snapshot_of_disk(tmp_path / "data", tmp_path / "crashed")

    for data_dir in (tmp_path / "data", crashed):
        with open_engine(data_dir) as engine:
            # Failed appends were cut off: no half entry in the middle of a pack.
            assert not engine.sessions.store.tenant(TENANT).objects.damaged_packs
            for saved in acknowledged:
                assert_loads(engine, saved)
            assert engine.admin.verify().ok


def test_disk_full_while_a_save_flushes_its_backlog_loses_nothing_after_a_crash(
    tmp_path: Path, disk_full: DiskFull, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC inside commit_objects (a writer helping the syncer) loses no retried save.

    Were the failed save to leave its objects indexed but carried by no journal
    record, the retry would find them "present" and be journaled without them,
    so it would be acknowledged with its chunks only in memory: DATA_LOSS after
    SIGKILL.
    """
    monkeypatch.setattr(objects_module, "MAX_PENDING_BYTES", 0)  # every put flushes
    rng = random.Random(4)
    with open_engine(tmp_path / "data", fsync_interval=NEVER) as engine:
        engine.sessions.create(TENANT, "agent")
        first = save(engine, "agent", rng.randbytes(150_000))
        disk_full.object_files = True
        retried = rng.randbytes(150_000)
        with pytest.raises(ResourceExhaustedError, match="disk full"):
            save(engine, "agent", retried)
        disk_full.clear()
        # Nothing flushes from here on: the retry's objects stay in memory
        # unless its journal record carries them.
        monkeypatch.setattr(objects_module, "MAX_PENDING_BYTES", 1 << 40)
        acknowledged = save(engine, "agent", retried)
        crashed = snapshot_of_disk(tmp_path / "data", tmp_path / "crashed")

    with open_engine(crashed) as engine:
        assert_loads(engine, first)
        assert_loads(engine, acknowledged)
        assert engine.admin.verify().ok


def test_a_restart_on_a_full_disk_serves_reads_and_resumes_writes_when_space_returns(
    tmp_path: Path, disk_full: DiskFull
) -> None:
    """Recovery must write the objects journals carry; on a full disk the daemon
    must still start (not exit with "disk full during object write")."""
    rng = random.Random(5)
    with open_engine(tmp_path / "data", fsync_interval=NEVER) as engine:
        engine.sessions.create(TENANT, "agent")
        acknowledged = [save(engine, "agent", rng.randbytes(150_000)) for _ in range(3)]
        # SIGKILL now: the objects exist only as the journal's inline copies.
        crashed = snapshot_of_disk(tmp_path / "data", tmp_path / "crashed")

    disk_full.object_files = True
    with open_engine(crashed, fsync_interval=0.01) as engine:
        assert engine.store.read_only
        for saved in acknowledged:
            assert_loads(engine, saved)
        with pytest.raises(ReadOnlyError) as refused:
            save(engine, "agent", b"while the disk is full")
        assert refused.value.grpc_status == "RESOURCE_EXHAUSTED"
        assert refused.value.reason == "READ_ONLY"
        with pytest.raises(ReadOnlyError):
            engine.sessions.create(TENANT, "new")
        assert engine.sessions.info(TENANT, "agent").checkpoint_count == 3

        disk_full.clear()  # space returns: the background syncer notices
        wait_until(lambda: not engine.store.read_only, "writes resume")
        acknowledged.append(save(engine, "agent", rng.randbytes(150_000)))

    with open_engine(crashed) as engine:
        assert not engine.store.read_only
        for saved in acknowledged:
            assert_loads(engine, saved)
        assert engine.admin.verify().ok


# -- recovery and compaction -----------------------------------------------------------


def build_history(engine: Engine, rng: random.Random) -> list[str]:
    """Sessions touched by every kind of mutation; returns their IDs."""
    sessions = engine.sessions
    sessions.create(TENANT, "main", labels={"team": "a"})
    sessions.create(TENANT, "retained", keep_last=3)
    states = growing_states(rng)
    for step in range(8):
        save(engine, "main", next(states), metadata={"step": step})
        save(engine, "retained", rng.randbytes(rng.randint(0, 3000)))
    save(engine, "main", b"", namespace="scratch")
    named = engine.checkpoints.create_checkpoint(TENANT, "main", name="milestone")
    first = engine.checkpoints.list_checkpoints(TENANT, "main", page_size=1000)[0][-1]
    engine.checkpoints.delete_checkpoint(TENANT, first.checkpoint_id)
    engine.checkpoints.set_status(TENANT, "main", SessionStatus.PAUSED)
    save(engine, "main", next(states), checkpoint_id="while-paused")
    engine.checkpoints.set_status(TENANT, "main", SessionStatus.ACTIVE)
    engine.checkpoints.restore_checkpoint(TENANT, named.checkpoint_id, make_current=True)
    sessions.create(TENANT, "doomed")
    save(engine, "doomed", b"gone soon")
    sessions.delete(TENANT, "doomed")
    engine.checkpoints.fork_session(TENANT, "while-paused", new_session_id="fork")
    save(engine, "fork", next(states))
    return ["main", "retained", "fork"]


def test_reopened_engine_replays_to_identical_state(tmp_path: Path) -> None:
    with open_engine(tmp_path / "data") as engine:
        session_ids = build_history(engine, random.Random(4))
        before = {sid: session_view(engine, sid) for sid in session_ids}
        listed = engine.sessions.list(TENANT)[0]
    with open_engine(tmp_path / "data") as engine:
        assert engine.sessions.list(TENANT)[0] == listed
        assert [s.session_id for s in listed] == sorted(session_ids)
        for sid in session_ids:
            assert session_view(engine, sid) == before[sid], sid
        assert engine.admin.verify().ok


def test_compacted_journals_keep_every_checkpoint(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with open_engine(data_dir, compact_min_bytes=1, fsync_interval=0.005) as engine:
        session_ids = build_history(engine, random.Random(5))
        for sid in session_ids:
            wait_for_compaction(journal_file(data_dir, sid))
        # Records after the snapshot replay on top of it.
        extra = [save(engine, sid, f"after compaction {sid}".encode()) for sid in session_ids]
        before = {sid: session_view(engine, sid) for sid in session_ids}
        crashed = snapshot_of_disk(data_dir, tmp_path / "crashed")
    for reopened in (data_dir, crashed):
        with open_engine(reopened) as engine:
            for sid in session_ids:
                assert session_view(engine, sid) == before[sid], (reopened, sid)
            for saved in extra:
                assert_loads(engine, saved)
            assert engine.admin.verify().ok


def test_compaction_racing_concurrent_saves_loses_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    acknowledged: list[Saved] = []
    errors: list[BaseException] = []

    def writer(engine: Engine, session_id: str, seed: int) -> None:
        rng = random.Random(seed)
        states = growing_states(rng, start=20_000, step=2_000)
        try:
            for step in range(40):
                data = next(states) if step % 3 else rng.randbytes(500)
                acknowledged.append(save(engine, session_id, data))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    with open_engine(data_dir, compact_min_bytes=1, fsync_interval=0.002) as engine:
        session_ids = ["one", "two", "shared"]
        for sid in session_ids:
            engine.sessions.create(TENANT, sid)
        threads = [
            threading.Thread(target=writer, args=(engine, sid, seed))
            for seed, sid in enumerate([*session_ids, "shared"])
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_TIMEOUT * 4)
        assert not any(t.is_alive() for t in threads), "writers did not finish"
        assert not errors, errors
        for sid in session_ids:
            wait_for_compaction(journal_file(data_dir, sid))
        crashed = snapshot_of_disk(data_dir, tmp_path / "crashed")
    for reopened in (data_dir, crashed):
        with open_engine(reopened) as engine:
            for saved in acknowledged:
                assert_loads(engine, saved)
            for sid in session_ids:
                count = sum(s.session_id == sid for s in acknowledged)
                assert engine.sessions.info(TENANT, sid).version == count + 1
            assert engine.admin.verify().ok


# -- torn tails ------------------------------------------------------------------------

#: Bytes of a large save record an interrupted append leaves behind.
TORN_TAIL_BYTES = 1 << 20


def test_classifying_a_torn_tail_costs_work_in_proportion_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(6)
    create = journal_module.Record("create", {"v": 1, "at": 0.0, "state": {}})
    frames = [native.encode_frame(rng.randbytes(8192)) for _ in range(TORN_TAIL_BYTES // 8192)]
    body = {"v": 2, "at": 0.0, "objects": [native.frame_digest_hex(f) for f in frames]}
    save_record = journal_module.Record("save", body, frames).encode()
    path = tmp_path / "journal"
    path.write_bytes(create.encode() + save_record[: len(save_record) - 100])

    checked = 0
    real_crc32 = zlib.crc32

    def counting_crc32(data: bytes, value: int = 0) -> int:
        nonlocal checked
        checked += len(data)
        return real_crc32(data, value)

    monkeypatch.setattr(zlib, "crc32", counting_crc32)
    replay = journal_module.read_records(path)
    assert replay.corrupt_at is None and replay.torn_bytes == len(save_record) - 100
    assert [r.kind for r in replay.records] == ["create"]
    tail = replay.torn_bytes
    assert checked <= 4 * (tail + replay.valid_bytes), (
        f"checksummed {checked / tail:.0f} times the {tail} bytes of the torn tail"
    )
