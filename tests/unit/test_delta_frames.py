"""Delta frames in the store: a growing state's rewritten last chunk is stored
as a delta on the chunk it replaces (docs/storage.md, "Delta frames").

In-process on `Engine` over a temp dir: what is stored, what reads return
after a restart (no cached contents), GC keeping bases, damage, and the
copies that must stand alone (other sessions' journals, replication).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratad import native
from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.errors import DataLossError
from stratad.store.crypto import Keyring, new_master_key_text, parse_master_key
from stratad.store.journal import read_records
from stratad.store.objects import NO_SIZE_LIMIT, ObjectStore

TENANT = "default"
WORDS = [
    "the",
    "agent",
    "decided",
    "to",
    "call",
    "the",
    "search",
    "tool",
    "because",
    "the",
    "user",
    "asked",
    "about",
    "revenue",
]


def conversation(steps: int, seed: int = 7) -> Iterator[bytes]:
    """States of a chat that grows by one message per step (like the reference workload)."""
    rng = random.Random(seed)
    messages: list[dict[str, str]] = []
    for step in range(steps):
        messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=80))})
        yield json.dumps({"messages": messages, "step": step}).encode()


def open_engine(path: Path) -> Engine:
    engine = Engine(path, fsync_interval=3600.0)
    engine.open()
    return engine


def objects_of(engine: Engine) -> ObjectStore:
    return engine.store.tenant(TENANT).objects


def save(engine: Engine, session: str, data: bytes) -> str:
    return engine.checkpoints.save_state(
        TENANT, session, SaveInput(data=data)
    ).checkpoint.checkpoint_id


def load(engine: Engine, session: str, checkpoint_id: str) -> bytes:
    return engine.checkpoints.load_state(TENANT, session, checkpoint_id).data


def delta_depths(store: ObjectStore) -> dict[str, int]:
    return {d: store.delta_depth(d) for d in store.digests()}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


def test_a_growing_state_stores_its_new_tail_as_deltas_and_reads_back_after_restart(
    data_dir: Path,
) -> None:
    engine = open_engine(data_dir)
    saved: dict[str, bytes] = {}
    plain_bytes = 0
    try:
        engine.sessions.create(TENANT, "chat")
        for state in conversation(150):
            saved[save(engine, "chat", state)] = state
        store = objects_of(engine)
        depths = delta_depths(store)
        # What framing each object on its own would have cost.
        for digest in depths:
            plain_bytes += len(native.encode_frame(store.get(digest, NO_SIZE_LIMIT)))
        stored = store.stored_bytes
    finally:
        engine.close()
    assert sum(1 for d in depths.values() if d) > len(depths) // 3
    assert max(depths.values()) <= native.MAX_DELTA_DEPTH
    assert stored < plain_bytes / 2, (stored, plain_bytes)  # what users see on disk

    engine = open_engine(data_dir)  # nothing remembered: every chain decoded from disk
    try:
        for checkpoint_id, state in saved.items():
            assert load(engine, "chat", checkpoint_id) == state
        assert engine.admin.verify(TENANT).ok
    finally:
        engine.close()


def test_gc_keeps_the_bases_of_kept_deltas(data_dir: Path) -> None:
    """Retention drops the checkpoints whose chunks are the kept ones' delta bases."""
    engine = open_engine(data_dir)
    try:
        engine.sessions.create(TENANT, "chat", keep_last=3)
        kept: dict[str, bytes] = {}
        for state in conversation(60):
            kept[save(engine, "chat", state)] = state
            kept = dict(list(kept.items())[-3:])
        store = objects_of(engine)
        assert any(delta_depths(store).values())
        report = engine.admin.collect_garbage(TENANT)
        assert report.objects_removed > 0  # the dropped checkpoints' own objects went
        # Without the journal's inline copies, a restart cannot bring back a
        # base GC wrongly removed: the packs alone must hold every base.
        engine.sessions.compact(TENANT, "chat")
    finally:
        engine.close()
    engine = open_engine(data_dir)
    try:
        for checkpoint_id, state in kept.items():
            assert load(engine, "chat", checkpoint_id) == state
        assert engine.admin.verify(TENANT).ok
    finally:
        engine.close()


def test_a_damaged_base_fails_its_deltas_with_data_loss_never_wrong_data(data_dir: Path) -> None:
    engine = open_engine(data_dir)
    try:
        engine.sessions.create(TENANT, "chat")
        saved = {save(engine, "chat", s): s for s in conversation(40)}
        # Drop the journal's inline copies, from which a restart would repair the damage.
        engine.sessions.compact(TENANT, "chat")
        store = objects_of(engine)
        depths = delta_depths(store)
        deepest = max(depths, key=lambda d: depths[d])
        base = native.frame_delta_base(store.read_frame(deepest))
        assert base is not None
        path, offset, length = store.locate(base[0])
    finally:
        engine.close()
    with open(path, "r+b") as f:  # damage the middle of the base's payload
        middle = offset + (native.FRAME_HEADER_SIZE + length) // 2
        f.seek(middle)
        damaged = bytes(b ^ 0xFF for b in f.read(4))
        f.seek(middle)
        f.write(damaged)
    engine = open_engine(data_dir)
    try:
        failed = 0
        for checkpoint_id, state in saved.items():
            try:
                assert load(engine, "chat", checkpoint_id) == state
            except DataLossError:
                failed += 1
        assert failed >= 2  # the base's own checkpoint and at least one delta on it
        report = engine.admin.verify(TENANT)
        corrupt = {c.digest for c in report.corrupt}
        assert base[0] in corrupt and deepest in corrupt
    finally:
        engine.close()


def test_copies_for_other_journals_and_replication_stand_alone(data_dir: Path) -> None:
    """A record of another session, or a replicated pack, never needs a base it lacks."""
    engine = open_engine(data_dir)
    try:
        engine.sessions.create(TENANT, "a")
        states = list(conversation(30))
        for state in states:
            save(engine, "a", state)
        store = objects_of(engine)
        deltas = [d for d, depth in delta_depths(store).items() if depth]
        assert deltas
        for digest in deltas:
            frame = store.read_plain_frame(digest)
            assert native.frame_delta_base(frame) is None
            assert native.decode_frame(frame, NO_SIZE_LIMIT) == store.get(digest, NO_SIZE_LIMIT)
        # Session b saves the same state while a's objects are not yet in a synced pack.
        engine.sessions.create(TENANT, "b")
        save(engine, "b", states[-1])
        journal = data_dir / "tenants" / TENANT / "sessions" / "b" / "journal"
        carried = [blob for r in read_records(journal).records for blob in r.blobs]
    finally:
        engine.close()
    assert carried
    assert all(native.frame_delta_base(frame) is None for frame in carried)


def test_delta_frames_under_encryption_at_rest(data_dir: Path) -> None:
    """Sealed pack entries hold delta frames like plain ones: reads, GC and Verify."""
    key = parse_master_key(new_master_key_text().encode(), "test key")
    engine = Engine(data_dir, keyring=Keyring(key), fsync_interval=3600.0)
    engine.open()
    try:
        engine.sessions.create(TENANT, "chat", keep_last=5)
        kept: dict[str, bytes] = {}
        for state in conversation(80):
            kept[save(engine, "chat", state)] = state
            kept = dict(list(kept.items())[-5:])
        assert any(delta_depths(objects_of(engine)).values())
        engine.admin.collect_garbage(TENANT)
        engine.sessions.compact(TENANT, "chat")  # only the sealed packs hold the objects
    finally:
        engine.close()
    engine = Engine(data_dir, keyring=Keyring(key), fsync_interval=3600.0)
    engine.open()
    try:
        for checkpoint_id, state in kept.items():
            assert load(engine, "chat", checkpoint_id) == state
        assert engine.admin.verify(TENANT).ok
    finally:
        engine.close()
