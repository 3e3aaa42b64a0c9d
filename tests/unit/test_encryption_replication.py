"""Encryption at rest with replication to object storage (docs/security.md).

Daemons (`Engine`s with their own data directories) share one obstore
`MemoryStore`, as in tests/unit/test_replication.py, with encryption on:
packs hold sealed objects, segments sealed records, and a daemon that has
never seen a tenant adopts its wrapped data key from object storage.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import obstore
import pytest
from obstore.store import MemoryStore

from stratad.domain.checkpoints import SaveInput
from stratad.domain.crystals import TraceStep
from stratad.domain.engine import Engine
from stratad.errors import StratadError
from stratad.store.crypto import Keyring, MasterKey, new_master_key_text, parse_master_key
from stratad.store.remote import RemoteTier

TENANT = "acme"
SECRET = b"the-launch-code-is-7731-swordfish"


def master() -> MasterKey:
    return parse_master_key(new_master_key_text().encode(), "test key")


@pytest.fixture
def remote() -> RemoteTier:
    return RemoteTier(MemoryStore())


@pytest.fixture
def daemons(tmp_path: Path, remote: RemoteTier) -> Iterator[Callable[..., Engine]]:
    opened: list[Engine] = []

    def start(name: str, keyring: Keyring, *, gc_grace: float = 3600.0) -> Engine:
        engine = Engine(tmp_path / name, fsync_interval=0.02, keyring=keyring)
        engine.replicate_to(remote, mode="sync", node_id=name, lag=0.02, lease=0.5,
                            gc_grace=gc_grace)  # fmt: skip
        engine.open()
        opened.append(engine)
        return engine

    yield start
    for engine in opened:
        engine.close()


def remote_files(remote: RemoteTier) -> dict[str, bytes]:
    return {
        m["path"]: bytes(obstore.get(remote.store, m["path"]).bytes())
        for batch in obstore.list(remote.store, "tenants/")
        for m in batch
    }


def state() -> bytes:
    return os.urandom(100_000) + SECRET * 20 + os.urandom(100_000)


def test_object_storage_holds_no_plaintext_and_another_daemon_reads_it_all(
    daemons: Callable[..., Engine], remote: RemoteTier
) -> None:
    key = master()
    a = daemons("a", Keyring(key))
    a.sessions.create(TENANT, "s1")
    data = state()
    a.checkpoints.save_state(TENANT, "s1", SaveInput(data=data, metadata={"k": SECRET.decode()}))
    a.cognitive.initialize(TENANT, "s1", goal=SECRET.decode())
    files = remote_files(remote)
    assert any(p.endswith(".pack") for p in files) and any("/seg/" in p for p in files)
    assert [p for p, body in files.items() if SECRET in body or data[:64] in body] == []
    assert json.loads(files[f"tenants/{TENANT}/KEY"])["master_key_id"] == key.key_id

    b = daemons("b", Keyring(key))  # an empty data directory, the same master key
    assert b.checkpoints.load_state(TENANT, "s1").data == data
    assert b.cognitive.state(TENANT, "s1").result["crystallized"]["goal"] == SECRET.decode()
    report = b.admin.verify(TENANT)
    assert report.ok and report.remote_objects_checked > 0


def test_a_daemon_with_another_master_key_is_refused_naming_the_key(
    daemons: Callable[..., Engine],
) -> None:
    key = master()
    a = daemons("a", Keyring(key))
    a.sessions.create(TENANT, "s1")
    a.checkpoints.save_state(TENANT, "s1", SaveInput(data=state()))
    b = daemons("b", Keyring(master()))
    with pytest.raises(StratadError, match=key.key_id):
        b.checkpoints.load_state(TENANT, "s1")


def test_remote_verify_finds_a_flipped_byte_in_a_sealed_pack(
    daemons: Callable[..., Engine], remote: RemoteTier
) -> None:
    a = daemons("a", Keyring(master()))
    a.sessions.create(TENANT, "s1")
    a.checkpoints.save_state(TENANT, "s1", SaveInput(data=state()))
    pack = next(p for p in remote_files(remote) if p.endswith(".pack"))
    raw = bytearray(bytes(obstore.get(remote.store, pack).bytes()))
    raw[len(raw) // 2] ^= 0x01
    obstore.put(remote.store, pack, bytes(raw))
    report = a.admin.verify(TENANT)
    assert report.remote_corrupt and all("corrupt" in c.problem for c in report.remote_corrupt)
    assert not report.corrupt and not report.remote_damaged_sessions


def test_remote_gc_reads_sealed_histories_and_keeps_live_data(
    daemons: Callable[..., Engine],
) -> None:
    key = master()
    a = daemons("a", Keyring(key), gc_grace=0.0)
    a.sessions.create(TENANT, "gone")
    a.checkpoints.save_state(TENANT, "gone", SaveInput(data=os.urandom(300_000)))
    a.sessions.create(TENANT, "kept")
    kept = state()
    a.checkpoints.save_state(TENANT, "kept", SaveInput(data=kept))
    a.sessions.delete(TENANT, "gone")
    a.admin.collect_garbage(TENANT)
    second = a.admin.collect_garbage(TENANT)
    assert second.remote_packs_deleted >= 1
    b = daemons("b", Keyring(key))
    assert b.checkpoints.load_state(TENANT, "kept").data == kept


def test_rotation_rewraps_the_key_in_object_storage_too(
    daemons: Callable[..., Engine], remote: RemoteTier
) -> None:
    old, new = master(), master()
    a = daemons("a", Keyring(old))
    a.sessions.create(TENANT, "s1")
    data = state()
    a.checkpoints.save_state(TENANT, "s1", SaveInput(data=data))
    a.close()
    rotated = daemons("a", Keyring(new, [old]))  # the same data directory, rotating
    rotated.close()
    stored = json.loads(remote_files(remote)[f"tenants/{TENANT}/KEY"])
    assert stored["master_key_id"] == new.key_id
    b = daemons("b", Keyring(new))  # the old key is gone everywhere
    assert b.checkpoints.load_state(TENANT, "s1").data == data


def test_crystal_and_profile_streams_are_sealed_and_merge_between_encrypted_daemons(
    daemons: Callable[..., Engine], remote: RemoteTier
) -> None:
    """Library segments are sealed whole with the tenant's data key; each daemon
    seals the records it merges for its own journal and reads them back."""
    keyring = Keyring(master())
    a = daemons("a", keyring)
    steps = [TraceStep(decision=f"use {SECRET.decode()}", tool="vault")]
    made = a.crystals.crystallize(TENANT, f"unlock {SECRET.decode()}", steps, 0.9, "s")
    assert made.crystal is not None
    a.crystals.record_reuse(TENANT, made.crystal.crystal_id, True)
    a.profiles.update(TENANT, "ann", {"goals": [SECRET.decode()]})
    files = remote_files(remote)
    assert any("/library/" in p for p in files)
    assert [p for p, body in files.items() if SECRET in body] == []

    b = daemons("b", keyring)  # empty data directory: merges a's stream at start
    assert b.crystals.get(TENANT, made.crystal.crystal_id) == a.crystals.get(
        TENANT, made.crystal.crystal_id
    )
    assert b.profiles.get(TENANT, "ann") == a.profiles.get(TENANT, "ann")
    b.close()
    reopened = daemons("b", keyring)  # b's journals hold the merged records, sealed
    assert reopened.profiles.get(TENANT, "ann")["goals"] == [SECRET.decode()]
    assert reopened.crystals.get(TENANT, made.crystal.crystal_id).reuse_count == 1
    for path in (reopened.store.data_dir).rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_bytes(), path
