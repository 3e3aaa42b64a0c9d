"""Session journals stay small: compaction thresholds and the journal's encoding."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import random
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest

from stratad import native
from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.domain.models import Checkpoint, SessionState, SessionStatus
from stratad.domain.sessions import COMPACT_FACTOR, COMPACT_MIN_BYTES, IDLE_COMPACT_MIN_BYTES
from stratad.errors import DataLossError
from stratad.store.journal import read_records

TENANT = "default"
#: Data written by stratad before journal records were lean and compressed (see make.py there).
LEGACY = Path(__file__).parent / "data" / "journals-before-compression"


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


# -- lean checkpoints ----------------------------------------------------------------


def checkpoint(**changes: Any) -> Checkpoint:
    base = Checkpoint(
        checkpoint_id="ckpt-1",
        session_id="s",
        version=7,
        parent_id="",
        namespace="",
        name="",
        content_type="",
        metadata={},
        created_at=1795644640.1471112,
        size=548,
        digest="ab" * 32,
        root="ab" * 32,
        root_kind="chunk",
    )
    return dataclasses.replace(base, **changes)


VARIANTS = [
    {},
    {"parent_id": "ckpt-0", "stored_bytes": 1693},
    {"root": "cd" * 32, "root_kind": "manifest"},
    {"namespace": "ns", "name": "pinned", "content_type": "application/json"},
    {"metadata": {"a": [1, {"b": None}], "": ""}},
    {"structured": {"root": "ef" * 32, "root_kind": "chunk", "size": 3, "digest": "ef" * 32}},
    {"writes": [{"task_id": "t", "idx": 0, "channel": "c", "type": "json", "value": "e30="}]},
    {"session_id": "another-session"},  # a copy's checkpoint may name its source
    {"version": 9, "created_at": 1.0},  # not the record's own
    {"size": 0, "digest": "", "root": "", "root_kind": ""},  # an empty state
]


@pytest.mark.parametrize("changes", VARIANTS)
def test_a_lean_checkpoint_rebuilds_an_identical_one(changes: dict[str, Any]) -> None:
    cp = checkpoint(**changes)
    lean = json.loads(json.dumps(cp.to_record("s", 7, 1795644640.1471112)))
    assert (
        Checkpoint.from_json(lean, session_id="s", version=7, created_at=1795644640.1471112) == cp
    )
    # Without record context (snapshots, copies) the version and time stay in.
    lean = json.loads(json.dumps(cp.to_record("s")))
    assert {"version", "created_at"} <= lean.keys()
    assert Checkpoint.from_json(lean, session_id="s") == cp
    # The full form (API, archives, journals of older versions) still reads.
    assert Checkpoint.from_json(json.loads(json.dumps(cp.to_json()))) == cp


def test_a_lean_checkpoint_leaves_out_what_the_reader_rebuilds() -> None:
    cp = checkpoint()
    assert cp.to_record("s", 7, cp.created_at) == {
        "checkpoint_id": "ckpt-1",
        "size": 548,
        "digest": "ab" * 32,
        "root_kind": "chunk",
    }
    assert len(json.dumps(cp.to_record("s", 7, cp.created_at))) < len(json.dumps(cp.to_json())) / 2


def test_lean_checkpoints_keep_the_memory_sharing() -> None:
    """Interned strings and shared empty containers, as for the full form."""
    a, b = (
        Checkpoint.from_json(
            json.loads(json.dumps(checkpoint(checkpoint_id=i, namespace="n-s").to_record("s"))),
            session_id="".join(["s"]),  # an equal string, not the same object
        )
        for i in ("ckpt-a", "ckpt-b")
    )
    assert a.session_id is b.session_id is sys.intern("s")
    assert a.namespace is b.namespace
    assert a.metadata is b.metadata and a.structured is b.structured and a.writes is b.writes


def test_a_lean_checkpoint_without_its_context_is_data_loss() -> None:
    lean = checkpoint().to_record("s", 7, 1.5)
    with pytest.raises(DataLossError, match="session_id"):
        Checkpoint.from_json(lean)
    with pytest.raises(DataLossError, match="version"):
        Checkpoint.from_json(lean, session_id="s")


def test_snapshots_store_lean_checkpoints_and_replay_them(tmp_path: Path) -> None:
    state = SessionState("s", SessionStatus.ACTIVE, 9, {"l": "v"}, 1.0, 2.0, head="ckpt-b")
    for i, changes in enumerate(VARIANTS):
        cp = checkpoint(checkpoint_id=f"ckpt-{i}", **changes)
        state.checkpoints[cp.checkpoint_id] = cp
    raw = json.loads(json.dumps(state.to_record()))
    assert all("session_id" not in c for c in raw["checkpoints"][:-3])
    assert SessionState.from_json(raw) == state
    assert SessionState.from_json(json.loads(json.dumps(state.to_json()))) == state


def test_snapshot_parents_are_implied_by_the_order_and_rebuilt_exactly() -> None:
    state = SessionState("s", SessionStatus.ACTIVE, 9, {}, 1.0, 2.0)
    parents = {
        "c1": "c0",  # the first one's parent was dropped by retention: named
        "c2": "c1",  # a line of saves: implied
        "c3": "c2",
        "c4": "",  # a new line: "" named
        "c5": "c4",
        "c6": "c2",  # a branch from an earlier checkpoint: named
        "c7": "",
    }
    for cp_id, parent in parents.items():
        state.checkpoints[cp_id] = checkpoint(checkpoint_id=cp_id, parent_id=parent)
    raw = json.loads(json.dumps(state.to_record()))
    written = {c["checkpoint_id"]: c.get("parent_id") for c in raw["checkpoints"]}
    assert written == {
        "c1": "c0", "c2": None, "c3": None, "c4": "", "c5": None, "c6": "c2", "c7": "",
    }  # fmt: skip
    back = SessionState.from_json(raw)
    assert back == state
    # The implied parent is the previous checkpoint's ID string itself (memory).
    assert back.checkpoints["c3"].parent_id is back.checkpoints["c2"].checkpoint_id


def test_save_records_are_lean_and_replay_to_the_same_checkpoints(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    engine = Engine(data_dir, fsync_interval=3600.0)
    engine.open()
    try:
        engine.sessions.create(TENANT, "s")
        states = [bytes(range(256)) * 40 * (i + 1) for i in range(4)]  # 1 chunk, then several
        for i, data in enumerate(states):
            meta = {"step": i} if i % 2 else {}
            engine.checkpoints.save_state(TENANT, "s", SaveInput(data=data, metadata=meta))
        engine.checkpoints.create_checkpoint(TENANT, "s", name="pin")
        before = checkpoints_of(engine, "s")
    finally:
        engine.close()
    saves = [r for r in read_records(journal_path(data_dir, "s")).records if r.kind == "save"]
    assert len(saves) == 5
    assert all(record.blobs for record in saves[:4])  # objects carried inline...
    for record in saves:
        assert "objects" not in record.body  # ...their digests are in the frames' headers
        assert "dropped" not in record.body
        cp = record.body["checkpoint"]
        assert not {"session_id", "version", "created_at"} & cp.keys()
    digests = {native.frame_digest_hex(b) for r in saves for b in r.blobs}
    assert {cp.root for cp in before} <= digests
    engine = Engine(data_dir, fsync_interval=3600.0)
    engine.open()
    try:
        assert checkpoints_of(engine, "s") == before
        for cp, data in zip(before, states, strict=False):
            assert engine.checkpoints.load_state(TENANT, "s", cp.checkpoint_id).data == data
    finally:
        engine.close()


# -- journals written by older versions ------------------------------------------------


def check_legacy(engine: Engine, expected: dict[str, Any]) -> None:
    for sid, want in expected.items():
        st = engine.sessions.live(TENANT, sid).state
        got = {
            "version": st.version,
            "status": st.status.value,
            "head": st.head,
            "labels": st.labels,
            "forked_from": st.forked_from,
            "keep_last": st.keep_last,
            "created_at": st.created_at,
            "updated_at": st.updated_at,
            "structured": st.structured,
        }
        assert got == {k: v for k, v in want.items() if k != "checkpoints"}, sid
        assert [c.to_json() for c in st.checkpoints.values()] == [
            c["checkpoint"] for c in want["checkpoints"]
        ]
        for c in want["checkpoints"]:
            loaded = engine.checkpoints.load_state(TENANT, sid, c["checkpoint"]["checkpoint_id"])
            assert hashlib.sha256(loaded.data).hexdigest() == c["sha256"]


def test_journals_written_before_compression_replay_unchanged(tmp_path: Path) -> None:
    """The migration: an older version's journals (plain, full JSON records; a snapshot
    among them) open as they are, take new records, compact, and reopen the same."""
    data_dir = tmp_path / "data"
    shutil.copytree(LEGACY / "data", data_dir)
    expected = json.loads((LEGACY / "expected.json").read_text())
    old = read_records(journal_path(data_dir, "legacy"))
    assert old.records[0].kind == "snapshot" and len(old.records) > 10
    assert b"\x28\xb5\x2f\xfd" not in journal_path(data_dir, "legacy").read_bytes()[:64]
    engine = Engine(data_dir, fsync_interval=3600.0)
    report = engine.open()
    try:
        assert report.get("sessions") == 3
        assert not any(report.get(k) for k in ("torn_tails_cut", "damaged_sessions"))
        assert report.get("objects_restored", 0) == 0  # the packs hold them all
        check_legacy(engine, expected)
        # New (lean, compressed) records follow the old ones in the same file.
        saved = engine.checkpoints.save_state(TENANT, "legacy", SaveInput(data=b"new" * 500))
    finally:
        engine.close()
    engine = Engine(data_dir, fsync_interval=3600.0)
    engine.open()
    try:
        live = engine.sessions.live(TENANT, "legacy")
        assert live.state.head == saved.checkpoint.checkpoint_id
        kept = {k: v for k, v in expected.items() if k != "legacy"}
        check_legacy(engine, kept)
        for sid in expected:
            engine.sessions.compact(TENANT, sid)
        after = {sid: checkpoints_of(engine, sid) for sid in expected}
    finally:
        engine.close()
    engine = Engine(data_dir, fsync_interval=3600.0)
    engine.open()
    try:
        check_legacy(engine, kept)
        assert {sid: checkpoints_of(engine, sid) for sid in expected} == after
        data = engine.checkpoints.load_state(TENANT, "legacy", saved.checkpoint.checkpoint_id).data
        assert data == b"new" * 500
    finally:
        engine.close()


# -- idle compaction ---------------------------------------------------------------------


def test_an_idle_session_is_compacted_once_down_to_its_snapshot(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    engine = Engine(data_dir, fsync_interval=3600.0)  # ticks only when called below
    engine.open()
    try:
        engine.sessions.create(TENANT, "s")
        engine.sessions.create(TENANT, "tiny")
        for i in range(12):  # ~24 KB of records: under the size threshold, over the idle one
            state = random.Random(i).randbytes(2000)  # incompressible: stored as it is
            engine.checkpoints.save_state(TENANT, "s", SaveInput(data=state))
        engine.checkpoints.save_state(TENANT, "tiny", SaveInput(data=b"small"))
        live = engine.sessions.live(TENANT, "s")
        tail = live.journal.size
        assert IDLE_COMPACT_MIN_BYTES <= tail < COMPACT_MIN_BYTES
        before = checkpoints_of(engine, "s")
        engine.sessions.compact_requested()  # written just now: not idle yet
        assert live.journal.size == tail
        # Replicated sessions are left alone (another daemon may own them by then).
        engine.sessions.idle_compact_seconds = 0.0
        engine.sessions.replicator = cast(Any, object())
        engine.sessions.compact_requested()
        engine.sessions.replicator = None
        assert live.journal.size == tail
        # Written again, then idle: compacted to its snapshot; a tiny tail is not.
        engine.checkpoints.save_state(TENANT, "s", SaveInput(data=b"again"))
        engine.sessions.compact_requested()
        assert live.journal.size == live.snapshot_bytes < tail
        tiny = engine.sessions.live(TENANT, "tiny")
        assert tiny.snapshot_bytes == 0
        assert read_records(journal_path(data_dir, "s")).records[0].kind == "snapshot"
        size = live.journal.size
        engine.sessions.compact_requested()  # once per idle spell
        assert live.journal.size == size
        after = checkpoints_of(engine, "s")
        assert after[:-1] == before
    finally:
        engine.close()
