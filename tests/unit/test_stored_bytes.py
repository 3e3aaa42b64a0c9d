"""The running counters quotas read agree with a walk of the store (GetStoreStats)."""

from __future__ import annotations

import os
from pathlib import Path

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.store.journal import read_records

TENANT = "default"


def open_engine(path: Path) -> Engine:
    # compact_min_bytes small: compactions happen within the test.
    engine = Engine(path, fsync_interval=3600.0, compact_min_bytes=64 << 10)
    engine.open()
    return engine


def assert_counted(engine: Engine) -> None:
    tenant = engine.store.tenant(TENANT)
    walked = engine.admin.stats(TENANT).stored_bytes
    # What the records take (an open journal's file also has preallocated
    # zeros after them: store/journal.py).
    journals = (tenant.root / "sessions").rglob("journal")
    records = sum(read_records(path).valid_bytes for path in journals)
    assert tenant.stored_bytes == walked
    assert tenant.journal_bytes.bytes == records


def save(engine: Engine, session_id: str, data: bytes) -> str:
    result = engine.checkpoints.save_state(TENANT, session_id, SaveInput(data=data))
    return result.checkpoint.checkpoint_id


def test_counters_follow_saves_forks_compaction_deletion_gc_and_restart(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "data")
    try:
        engine.sessions.create(TENANT, "a")
        first = save(engine, "a", os.urandom(50_000))
        assert_counted(engine)
        for _ in range(5):  # past compact_min_bytes
            save(engine, "a", os.urandom(30_000))
        engine.sessions.compact_requested()
        engine.sessions.compact(TENANT, "a")
        assert_counted(engine)
        engine.checkpoints.fork_session(TENANT, first, new_session_id="f")
        engine.sessions.create(TENANT, "b")
        save(engine, "b", os.urandom(10_000))
        assert_counted(engine)
        engine.checkpoints.delete_checkpoint(TENANT, first)
        engine.sessions.delete(TENANT, "b")
        assert_counted(engine)
        engine.admin.collect_garbage(TENANT)
        assert_counted(engine)
        before = engine.store.tenant(TENANT).stored_bytes
    finally:
        engine.close()
    engine = open_engine(tmp_path / "data")
    try:
        assert engine.store.tenant(TENANT).stored_bytes == before
        assert_counted(engine)
    finally:
        engine.close()
