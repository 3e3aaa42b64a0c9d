"""Replication to object storage, in-process (issue #12; docs/replication.md).

Several `Engine`s (daemons) with their own data directories share one
obstore `MemoryStore` (obstore's in-memory backend, with the same
conditional-write semantics as S3). The same scenarios run against a real
S3 server in tests/e2e/test_replication_s3.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import obstore
import pytest
from obstore.store import MemoryStore

from stratad import native
from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.errors import AlreadyExistsError, FailedPreconditionError, NotFoundError
from stratad.store.remote import RemoteTier

TENANT = "acme"
LEASE = 0.5


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    remote = RemoteTier(MemoryStore())
    opened: list[Engine] = []

    def start(
        name: str, *, mode: str = "sync", data: str = "", gc_grace: float = 3600.0, **options: int
    ) -> Engine:
        engine = Engine(tmp_path / (data or name), fsync_interval=0.02, **options)  # type: ignore[arg-type]
        engine.replicate_to(
            remote, mode=mode, node_id=name, lag=0.02, lease=LEASE, gc_grace=gc_grace
        )
        engine.open()
        opened.append(engine)
        return engine

    yield start
    for engine in opened:
        engine.close()


def save(engine: Engine, session: str, data: bytes) -> str:
    return engine.checkpoints.save_state(
        TENANT, session, SaveInput(data=data)
    ).checkpoint.checkpoint_id


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def test_a_daemon_with_an_empty_data_dir_serves_every_acknowledged_checkpoint(
    daemons: Callable[..., Engine],
) -> None:
    a = daemons("a")
    a.sessions.create(TENANT, "s1", labels={"team": "x"})
    saved = {save(a, "s1", os.urandom(50_000) + bytes([n]) * 100_000): n for n in range(6)}
    a.cognitive.initialize(TENANT, "s1", goal="plan the trip")
    named = a.checkpoints.create_checkpoint(TENANT, "s1", name="milestone")

    b = daemons("b")  # nothing on disk: everything comes from object storage
    for checkpoint_id, n in saved.items():
        data = b.checkpoints.load_state(TENANT, "s1", checkpoint_id).data
        assert data[-100_000:] == bytes([n]) * 100_000
    assert b.sessions.info(TENANT, "s1").labels == {"team": "x"}
    listed, _ = b.checkpoints.list_checkpoints(TENANT, "s1", page_size=100)
    assert len(listed) == 7 and named.checkpoint_id in {c.checkpoint_id for c in listed}
    assert b.cognitive.state(TENANT, "s1").result["crystallized"]["goal"] == "plan the trip"
    assert b.admin.verify(TENANT).ok


def test_one_writer_at_a_time_and_no_forked_history(daemons: Callable[..., Engine]) -> None:
    a = daemons("a")
    a.sessions.create(TENANT, "s1")
    first = save(a, "s1", b"from a")
    b = daemons("b")
    assert b.checkpoints.load_state(TENANT, "s1").data == b"from a"
    with pytest.raises(FailedPreconditionError) as held:
        save(b, "s1", b"from b while a holds the lease")
    assert held.value.reason == "LEASE_HELD" and "'a'" in held.value.message

    time.sleep(LEASE * 1.1)  # a stops writing; its lease runs out
    second = save(b, "s1", b"from b")
    with pytest.raises(FailedPreconditionError) as lost:
        save(a, "s1", b"from a, too late")
    assert lost.value.reason == "LEASE_HELD"
    # a now serves b's history, not its stale copy.
    assert a.checkpoints.load_state(TENANT, "s1").data == b"from b"
    c = daemons("c")
    history = [cp.checkpoint_id for cp in c.checkpoints.list_checkpoints(TENANT, "s1")[0]]
    assert sorted(history) == sorted([first, second])


def test_async_mode_ships_within_the_lag(daemons: Callable[..., Engine]) -> None:
    a = daemons("a", mode="async")
    assert a.replicator is not None
    a.sessions.create(TENANT, "s1")
    ids = [save(a, "s1", os.urandom(20_000)) for _ in range(5)]
    wait_for(lambda: a.replicator.status()["bytes_behind"] == 0, "shipped")  # type: ignore[union-attr]
    b = daemons("b")
    listed = b.checkpoints.list_checkpoints(TENANT, "s1", page_size=100)[0]
    assert {c.checkpoint_id for c in listed} == set(ids)


def test_compacted_journals_rebase_their_remote_history(daemons: Callable[..., Engine]) -> None:
    a = daemons("a", compact_min_bytes=64 << 10)
    a.sessions.create(TENANT, "s1")
    ids = [save(a, "s1", os.urandom(30_000)) for _ in range(12)]
    wait_for(lambda: a.sessions.live(TENANT, "s1").snapshot_bytes > 0, "a compaction")
    ids.append(save(a, "s1", b"after the compaction"))
    b = daemons("b")
    listed = b.checkpoints.list_checkpoints(TENANT, "s1", page_size=100)[0]
    assert {c.checkpoint_id for c in listed} == set(ids)
    assert b.checkpoints.load_state(TENANT, "s1").data == b"after the compaction"


def test_deleted_sessions_stay_deleted_and_ids_are_unique_across_daemons(
    daemons: Callable[..., Engine],
) -> None:
    a = daemons("a")
    a.sessions.create(TENANT, "s1")
    save(a, "s1", b"x")
    b = daemons("b")
    with pytest.raises(AlreadyExistsError):
        b.sessions.create(TENANT, "s1")
    a.sessions.delete(TENANT, "s1")
    c = daemons("c")
    with pytest.raises(NotFoundError):
        c.checkpoints.load_state(TENANT, "s1")
    c.sessions.create(TENANT, "s1")  # the ID is free again
    assert save(c, "s1", b"new life")


def test_verify_re_hashes_object_storage_and_replays_remote_histories(
    daemons: Callable[..., Engine],
) -> None:
    a = daemons("a")
    a.sessions.create(TENANT, "s1")
    save(a, "s1", os.urandom(200_000))
    clean = a.admin.verify(TENANT)
    assert clean.ok and clean.remote_objects_checked > 0
    assert a.replicator is not None
    store = a.replicator.remote.store
    paths = [m["path"] for batch in obstore.list(store, f"tenants/{TENANT}/") for m in batch]
    pack = next(p for p in paths if p.endswith(".pack"))
    segment = next(p for p in paths if "/seg/" in p)
    data = bytearray(bytes(obstore.get(store, pack).bytes()))
    data[len(data) // 2] ^= 0xFF  # bit rot in the middle of the pack
    obstore.put(store, pack, bytes(data))
    obstore.put(store, segment, bytes(obstore.get(store, segment).bytes())[:-7])  # torn

    report = a.admin.verify(TENANT)
    assert not report.ok
    assert report.remote_corrupt and all("corrupt" in c.problem for c in report.remote_corrupt)
    assert len(report.remote_damaged_sessions) == 1
    assert report.remote_damaged_sessions[0].startswith(f"{TENANT}/s1: segment ")
    assert not report.corrupt  # the local copy is sound


def test_list_sessions_includes_sessions_other_daemons_wrote(
    daemons: Callable[..., Engine],
) -> None:
    a = daemons("a")
    for session in ("s1", "s2", "s3"):
        a.sessions.create(TENANT, session)
        save(a, session, session.encode())
    a.sessions.delete(TENANT, "s2")
    b = daemons("b")  # an empty data directory
    listed, token = b.sessions.list(TENANT)
    assert [s.session_id for s in listed] == ["s1", "s3"] and token == ""
    assert b.checkpoints.load_state(TENANT, "s3").data == b"s3"


def test_remote_garbage_is_condemned_then_deleted_and_live_data_survives(
    daemons: Callable[..., Engine],
) -> None:
    a = daemons("a", gc_grace=0.0)
    assert a.replicator is not None
    a.sessions.create(TENANT, "gone")
    save(a, "gone", os.urandom(300_000))
    a.sessions.create(TENANT, "kept")
    kept = os.urandom(300_000)
    save(a, "kept", kept)
    a.sessions.delete(TENANT, "gone")  # its packs are garbage in object storage now

    first = a.admin.collect_garbage(TENANT)
    assert first.remote_packs_condemned >= 1 and first.remote_packs_deleted == 0
    second = a.admin.collect_garbage(TENANT)
    assert second.remote_packs_deleted >= 1 and second.remote_bytes_freed > 250_000
    assert a.admin.verify(TENANT).ok  # nothing referenced went missing

    b = daemons("b")  # hydrates from what is left
    assert b.checkpoints.load_state(TENANT, "kept").data == kept


def test_a_save_never_dedups_against_a_condemned_pack(daemons: Callable[..., Engine]) -> None:
    a = daemons("a", gc_grace=0.0)
    assert a.replicator is not None
    data = os.urandom(300_000)
    a.sessions.create(TENANT, "old")
    save(a, "old", data)
    a.sessions.delete(TENANT, "old")
    assert a.admin.collect_garbage(TENANT).remote_packs_condemned >= 1
    a.replicator.remote.known_objects(TENANT)  # uploaders see the condemned list
    a.sessions.create(TENANT, "new")
    save(a, "new", data)  # the same chunks again: uploaded anew, not deduplicated
    chunk = native.digest_hex(data[: native.chunk_boundaries(data)[0][1]])
    holders = [p for p, items in a.replicator.remote.packs(TENANT).items()
               if any(d == chunk for d, _, _ in items)]  # fmt: skip
    assert len(holders) == 2, "the save relied on a pack that is about to be deleted"

    a.admin.collect_garbage(TENANT)
    b = daemons("b")
    assert b.checkpoints.load_state(TENANT, "new").data == data
    assert b.admin.verify(TENANT).ok
