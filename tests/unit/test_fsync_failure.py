"""A failed fsync stops the store (docs/storage.md, "Fault model").

The mutation is applied in memory before its journal is fsynced. When the
fsync fails, that state may never reach the disk, so it must never be served
and nothing may be acknowledged after it: every later read and write is
UNAVAILABLE (reason STORAGE_FAILED) until a restart, which replays what the
disk holds. Faults are injected in-process by replacing os.fdatasync/os.fsync.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stratad import native
from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.errors import NotFoundError
from stratad.store import fsync as fsync_module
from stratad.store.commit import SYNCFS_MIN_JOURNALS, sync_all
from stratad.store.failstop import StorageFailedError

TENANT = "default"
NEVER = 3600.0


class FsyncFault:
    """Fail the fsyncs for which `match(fd)` holds with EIO, while `armed`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.failures = 0
        self.match: Callable[[int], bool] = lambda fd: True
        real_fdatasync, real_fsync = os.fdatasync, os.fsync
        monkeypatch.setattr(os, "fdatasync", self._wrap(real_fdatasync))
        monkeypatch.setattr(os, "fsync", self._wrap(real_fsync))
        # syncfs(2) would cover the objects in one call: take the per-file path.
        monkeypatch.setattr(fsync_module, "_SYNCFS", None)

    def _wrap(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def fsync(fd: int) -> None:
            if self.armed and self.match(fd):
                self.failures += 1
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real(fd)

        return fsync


def _target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch) -> FsyncFault:
    if not os.path.exists("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to tell journal fsyncs from others")
    return FsyncFault(monkeypatch)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path / "data", fsync_interval=NEVER)
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


def save(engine: Engine, data: bytes, session: str = "agent", **options: Any) -> str:
    result = engine.checkpoints.save_state(TENANT, session, SaveInput(data=data, **options))
    return result.checkpoint.checkpoint_id


def reopen(path: Path) -> Engine:
    engine = Engine(path, fsync_interval=NEVER)
    engine.open()
    return engine


def test_a_failed_journal_fsync_is_never_served_and_stops_every_write(
    engine: Engine, fault: FsyncFault, tmp_path: Path
) -> None:
    rng = random.Random(1)
    engine.sessions.create(TENANT, "agent")
    engine.sessions.create(TENANT, "other")
    acknowledged = rng.randbytes(50_000)
    first = save(engine, acknowledged)
    save(engine, b"other's state", session="other")

    fault.match = lambda fd: _target(fd).endswith("/agent/journal")
    fault.armed = True
    failed = rng.randbytes(50_000)
    with pytest.raises(StorageFailedError) as raised:
        save(engine, failed, checkpoint_id="never-acknowledged")
    assert raised.value.grpc_status == "UNAVAILABLE"
    assert raised.value.reason == "STORAGE_FAILED"
    assert "restart" in raised.value.message
    fault.armed = False  # the disk "recovers": nothing may be trusted anyway

    # The state the failed fsync may have lost is never served...
    with pytest.raises(StorageFailedError):
        engine.checkpoints.load_state(TENANT, "agent")
    with pytest.raises(StorageFailedError):
        engine.checkpoints.load_state(TENANT, "agent", "never-acknowledged")
    with pytest.raises(StorageFailedError):
        engine.sessions.info(TENANT, "agent")
    # ...and nothing is acknowledged after it, in any session or tenant.
    for session in ("agent", "other"):
        with pytest.raises(StorageFailedError):
            save(engine, b"later", session=session)
    with pytest.raises(StorageFailedError):
        engine.sessions.create("another-tenant", "new")
    engine.close()

    # A restart recovers what the disk holds: everything acknowledged, and the
    # failed save either whole or not at all (like any unacknowledged write).
    restarted = reopen(tmp_path / "data")
    try:
        loaded = restarted.checkpoints.load_state(TENANT, "agent", first)
        assert loaded.data == acknowledged
        try:
            maybe = restarted.checkpoints.load_state(TENANT, "agent", "never-acknowledged")
            assert maybe.data == failed
        except NotFoundError:
            pass
        assert restarted.checkpoints.load_state(TENANT, "other").data == b"other's state"
        save(restarted, b"after the restart")
        assert restarted.admin.verify().ok
    finally:
        restarted.close()


def test_a_failed_object_fsync_stops_the_store(
    engine: Engine, fault: FsyncFault, tmp_path: Path
) -> None:
    """The background sync of object files fails: no journal may drop its copies."""
    engine.sessions.create(TENANT, "agent")
    data = random.Random(2).randbytes(300_000)
    checkpoint_id = save(engine, data)
    fault.match = lambda fd: "/objects/" in _target(fd)
    fault.armed = True
    with pytest.raises(StorageFailedError):
        engine.store.sync_objects()
    fault.armed = False
    with pytest.raises(StorageFailedError):
        save(engine, b"after the failure")
    with pytest.raises(StorageFailedError):
        engine.sessions.compact(TENANT, "agent")
    engine.close()
    restarted = reopen(tmp_path / "data")
    try:
        assert restarted.checkpoints.load_state(TENANT, "agent", checkpoint_id).data == data
        assert restarted.admin.verify().ok
    finally:
        restarted.close()


def test_a_failed_syncfs_in_a_group_commit_stops_the_store(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch path (one syncfs for many journals) must not fall back to fsyncs.

    Descriptors opened after a write error was recorded do not see it, so a
    fallback could report success for data the kernel dropped.
    """

    def syncfs_fails(root: Path) -> bool:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    commit: list[Any] = []
    for n in range(8):
        engine.sessions.create(TENANT, f"s{n}")
    for n in range(8):
        engine.checkpoints.save_state(
            TENANT, f"s{n}", SaveInput(data=native.digest_hex(b"%d" % n).encode()), commit=commit
        )
    monkeypatch.setattr(fsync_module, "_SYNCFS", syncfs_fails)
    monkeypatch.setattr(fsync_module, "_syncfs", syncfs_fails)
    assert len(commit) >= SYNCFS_MIN_JOURNALS
    with pytest.raises(StorageFailedError):
        sync_all(pending.ticket for pending in commit)
    with pytest.raises(StorageFailedError):
        engine.checkpoints.load_state(TENANT, "s0")
