"""Session journals stay small (issue #13): compaction thresholds and the journal's encoding."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.domain.sessions import COMPACT_FACTOR, COMPACT_MIN_BYTES
from stratad.store.journal import read_records

TENANT = "default"


def _workload() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "_workload.py"
    spec = importlib.util.spec_from_file_location("_workload", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def journal_path(data_dir: Path, session_id: str) -> Path:
    return data_dir / "tenants" / TENANT / "sessions" / session_id / "journal"


def checkpoints_of(engine: Engine, session_id: str) -> list[object]:
    live = engine.sessions.live(TENANT, session_id)
    with live.lock:
        return list(live.state.checkpoints.values())


def test_each_journal_kind_keeps_its_own_compaction_threshold(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "a")
    assert (engine.sessions.compact_min_bytes, engine.sessions.compact_factor) == (
        COMPACT_MIN_BYTES,
        COMPACT_FACTOR,
    )
    assert COMPACT_MIN_BYTES <= 256 << 10 and COMPACT_FACTOR <= 2
    # The per-tenant profile and crystal journals keep their larger minimum.
    assert engine.profiles.compact_min_bytes == 4 << 20
    assert engine.crystals.compact_min_bytes == 4 << 20
    # A value given to the engine applies to all three (what tests use).
    engine = Engine(tmp_path / "b", compact_min_bytes=1)
    assert engine.sessions.compact_min_bytes == 1
    assert engine.profiles.compact_min_bytes == engine.crystals.compact_min_bytes == 1


def test_a_growing_conversation_compacts_with_the_defaults(tmp_path: Path) -> None:
    """300 steps append ~600 KB of records; the journal left is bounded by the threshold."""
    data_dir = tmp_path / "data"
    engine = Engine(data_dir, fsync_interval=3600.0)  # compactions only when asked below
    engine.open()
    try:
        engine.sessions.create(TENANT, "conv")
        for state in _workload().conversation_states(300):
            engine.checkpoints.save_state(TENANT, "conv", SaveInput(data=state))
            engine.sessions.compact_requested()  # what the background tick does
        live = engine.sessions.live(TENANT, "conv")
        snapshot = live.snapshot_bytes
        assert 0 < snapshot < 80_000
        size = live.journal.size
        assert size <= max(COMPACT_MIN_BYTES, COMPACT_FACTOR * snapshot) + 4096
        before = checkpoints_of(engine, "conv")
    finally:
        engine.close()
    records = read_records(journal_path(data_dir, "conv")).records
    assert records[0].kind == "snapshot"
    # After a restart: the same checkpoints, and the threshold counts from the snapshot.
    engine = Engine(data_dir, fsync_interval=3600.0)
    engine.open()
    try:
        assert checkpoints_of(engine, "conv") == before
        assert len(before) == 300
        assert engine.sessions.live(TENANT, "conv").snapshot_bytes == snapshot
    finally:
        engine.close()


def test_snapshot_bytes_after_a_restart_is_the_first_records_size(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    engine = Engine(data_dir, fsync_interval=3600.0)
    engine.open()
    try:
        engine.sessions.create(TENANT, "s")
        for i in range(3):
            engine.checkpoints.save_state(TENANT, "s", SaveInput(data=b"x" * 1000 + bytes([i])))
        engine.sessions.compact(TENANT, "s")
        snapshot = engine.sessions.live(TENANT, "s").snapshot_bytes
        assert snapshot == journal_path(data_dir, "s").stat().st_size
        engine.checkpoints.save_state(TENANT, "s", SaveInput(data=b"y" * 1000))
        engine.sessions.create(TENANT, "never-compacted")
    finally:
        engine.close()
    engine = Engine(data_dir, fsync_interval=3600.0)
    engine.open()
    try:
        assert engine.sessions.live(TENANT, "s").snapshot_bytes == snapshot
        assert engine.sessions.live(TENANT, "never-compacted").snapshot_bytes == 0
    finally:
        engine.close()
