"""Replication to object storage, in-process (docs/replication.md).

Several `Engine`s (daemons) with their own data directories share one remote:
obstore's `MemoryStore` (its in-memory backend, with the same conditional-write
semantics as S3), and a ``file://`` directory (obstore's `LocalStore`, whose
conditional replaces store/remote.py does under lock files). The same
scenarios run against a real S3 server in tests/e2e/test_replication_s3.py,
and against a directory with real daemons in
tests/e2e/test_replication_file_url.py.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
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
from stratad.store import remote as remote_mod
from stratad.store.remote import (
    FailureLog,
    Head,
    LeaseLostError,
    RemoteTier,
    RemoteUnavailableError,
)

TENANT = "acme"
LEASE = 0.5
PYTHON_SOURCE = Path(__file__).resolve().parents[2] / "python"


@pytest.fixture(params=["memory", "file"])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> RemoteTier:
    """The object storage the daemons of a test share."""
    if request.param == "memory":
        return RemoteTier(MemoryStore())
    directory = tmp_path / "remote"
    directory.mkdir()
    return RemoteTier.from_url(directory.as_uri())


@pytest.fixture
def daemons(tmp_path: Path, remote: RemoteTier) -> Iterator[Callable[..., Engine]]:
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
    # A segment the session's HEAD lists (an earlier one may already be
    # superseded by a rebase, and a daemon hydrating never reads it).
    path = RemoteTier.session_path(TENANT, "s1")
    head = a.replicator.remote.read_head(path)
    assert head is not None
    segment = f"{path}/seg/{head.head.segments[-1]}"
    assert segment in paths
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


# -- file:// directories: conditional replaces under a lock file ----------------------


@pytest.fixture
def directory(tmp_path: Path) -> RemoteTier:
    root = tmp_path / "remote"
    root.mkdir()
    return RemoteTier.from_url(root.as_uri())


def test_a_directory_replaces_a_head_only_at_the_version_read(directory: RemoteTier) -> None:
    path = RemoteTier.session_path(TENANT, "s1")
    first = directory.write_head(path, Head("a", 1, time.time() + 10, ["s0"], 1), None)
    with pytest.raises(LeaseLostError):  # If-None-Match: it exists
        directory.write_head(path, Head("b", 1, time.time() + 10, [], 0), None)
    read = directory.read_head(path)
    assert read is not None and read.version == first and read.head.owner == "a"

    second = directory.write_head(path, Head("a", 1, time.time() + 10, ["s0", "s1"], 2), first)
    assert second != first
    with pytest.raises(LeaseLostError):  # If-Match on a version replaced meanwhile
        directory.write_head(path, Head("b", 2, time.time() + 10, ["s0"], 1), first)
    current = directory.read_head(path)
    assert current is not None and current.head.segments == ["s0", "s1"]
    assert current.version == second
    with pytest.raises(LeaseLostError):  # If-Match on an object that is not there
        directory.write_head(RemoteTier.session_path(TENANT, "s2"), current.head, second)
    assert directory.local_root is not None
    assert (directory.local_root / path / "HEAD.lock").exists()


def test_a_directory_condemns_packs_conditionally(directory: RemoteTier) -> None:
    directory.write_condemned(TENANT, {"p1": 1.0}, None)
    listed, version = directory.read_condemned(TENANT)
    assert listed == {"p1": 1.0} and version is not None
    directory.write_condemned(TENANT, {"p1": 1.0, "p2": 2.0}, version)
    with pytest.raises(LeaseLostError):  # another collection wrote it meanwhile
        directory.write_condemned(TENANT, {}, version)
    assert directory.read_condemned(TENANT)[0] == {"p1": 1.0, "p2": 2.0}


#: A daemon's share of `test_processes_racing_on_one_directory_never_lose_an_update`:
#: replaces the HEAD, each time conditionally on the one it read, until it
#: made ROUNDS replaces; prints how many attempts the others beat.
RACER = """
import sys
from stratad.store.remote import LeaseLostError, RemoteTier
remote, me, rounds = RemoteTier.from_url(sys.argv[1]), sys.argv[2], int(sys.argv[3])
path, won, lost = RemoteTier.session_path("acme", "s1"), 0, 0
while won < rounds:
    current = remote.read_head(path)
    head = current.head
    head.segments.append(f"{me}-{won}")
    head.next_seq += 1
    try:
        remote.write_head(path, head, current.version)
        won += 1
    except LeaseLostError:
        lost += 1
print(lost)
"""


def test_processes_racing_on_one_directory_never_lose_an_update(
    directory: RemoteTier, tmp_path: Path
) -> None:
    """Four processes read-modify-write one HEAD: every replace builds on the last.

    A replace that was not conditional (or whose condition was checked outside
    the lock) would overwrite another's segment: the HEAD would end up with
    fewer segments than replaces were acknowledged.
    """
    path = RemoteTier.session_path(TENANT, "s1")
    directory.write_head(path, Head("racers", 1, 0.0, [], 0), None)
    env = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}
    assert directory.local_root is not None
    url, racers, rounds = directory.local_root.as_uri(), 4, 25
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, url, f"r{n}", str(rounds)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(racers)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs
    final = directory.read_head(path)
    assert final is not None
    assert final.head.next_seq == racers * rounds
    assert sorted(final.head.segments) == sorted(
        f"r{n}-{k}" for n in range(racers) for k in range(rounds)
    )
    print(f"{sum(int(o) for o in outputs)} replaces lost a race and were retried")


def test_threads_racing_on_one_directory_never_lose_an_update(directory: RemoteTier) -> None:
    """The same race between threads of one process (fcntl locks alone belong to
    the process: two of its threads would both hold one), through two tiers."""
    path = RemoteTier.session_path(TENANT, "s1")
    directory.write_head(path, Head("racers", 1, 0.0, [], 0), None)
    assert directory.local_root is not None
    other = RemoteTier.from_url(directory.local_root.as_uri())
    racers, rounds = 6, 20

    def race(tier: RemoteTier, me: str) -> None:
        won = 0
        while won < rounds:
            current = tier.read_head(path)
            assert current is not None
            head = current.head
            head.segments.append(f"{me}-{won}")
            head.next_seq += 1
            try:
                tier.write_head(path, head, current.version)
                won += 1
            except LeaseLostError:
                pass

    threads = [
        threading.Thread(target=race, args=(directory if n % 2 else other, f"t{n}"))
        for n in range(racers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    final = directory.read_head(path)
    assert final is not None and final.head.next_seq == racers * rounds
    assert len(set(final.head.segments)) == racers * rounds
    assert not remote_mod._THREAD_LOCKS  # no entry left behind per object


HOLDER = """
import sys, time
from pathlib import Path
from stratad.store.remote import _locked
with _locked(Path(sys.argv[1]), 5.0):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_lock_dies_with_its_process(
    directory: RemoteTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon SIGKILLed while it replaces a HEAD leaves no lock behind."""
    path = RemoteTier.session_path(TENANT, "s1")
    version = directory.write_head(path, Head("a", 1, 0.0, [], 0), None)
    assert directory.local_root is not None
    lock = directory.local_root / path / "HEAD.lock"
    env = {**os.environ, "PYTHONPATH": str(PYTHON_SOURCE)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        monkeypatch.setattr(remote_mod, "LOCAL_LOCK_TIMEOUT", 0.2)
        with pytest.raises(RemoteUnavailableError, match="stayed locked"):
            directory.write_head(path, Head("b", 2, 0.0, [], 0), version)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    directory.write_head(path, Head("b", 2, 0.0, [], 0), version)
    current = directory.read_head(path)
    assert current is not None and current.head.owner == "b"


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(RemoteUnavailableError, match="file:// needs an existing directory"):
        RemoteTier.from_url((tmp_path / "nowhere").as_uri())


def test_a_failure_that_lasts_is_reported_once_then_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("test.failures")
    failures = FailureLog(logger, every=3600.0)
    with caplog.at_level(logging.INFO, logger="test.failures"):
        for n in range(50):
            failures.failed("shipping", f"refused ({n})")
        assert [r.getMessage() for r in caplog.records] == [
            "shipping failed: refused (0) (while this lasts, reported again every 3600s)"
        ]
        assert failures.failing() == ["shipping"]
        failures.recovered("shipping")
        failures.recovered("shipping")  # once
        assert len(caplog.records) == 2
        assert caplog.records[1].getMessage().startswith("shipping works again after ")
        assert "(50 failed attempts)" in caplog.records[1].getMessage()
        failures.failed("shipping", "refused again")  # a new outage: reported at once
        assert caplog.records[-1].levelno == logging.WARNING and len(caplog.records) == 3

    every = FailureLog(logger, every=0.0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test.failures"):
        every.failed("k", "one")
        every.failed("k", "two")
    assert "k still failing after " in caplog.records[1].getMessage()
    assert "(2 attempts): two" in caplog.records[1].getMessage()


def test_async_shipping_reports_a_lasting_failure_once_and_catches_up(
    daemons: Callable[..., Engine],
    remote: RemoteTier,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = daemons("a", mode="async")
    assert a.replicator is not None
    a.sessions.create(TENANT, "s1")
    calls: list[int] = []

    def refused(path: str, name: str, data: bytes) -> None:
        calls.append(len(data))
        raise RemoteUnavailableError("object storage failed while writing: refused")

    with caplog.at_level(logging.INFO, logger="stratad.domain.replication"):
        with monkeypatch.context() as patched:
            patched.setattr(remote, "put_segment", refused)
            save(a, "s1", os.urandom(20_000))
            wait_for(lambda: len(calls) >= 10, "ten shipping rounds")
            assert a.replicator.status()["bytes_behind"] > 0
        wait_for(lambda: a.replicator.status()["bytes_behind"] == 0, "caught up")  # type: ignore[union-attr]
        wait_for(lambda: any("works again" in r.getMessage() for r in caplog.records), "recovery")
    assert a.replicator.status()["lag_seconds"] == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("shipping sessions to object storage failed: 1 of 1 sessions")
    assert "acme/s1: object storage failed while writing: refused" in warnings[0]


def test_head_versions_of_a_directory_are_its_content(directory: RemoteTier) -> None:
    """Not LocalStore's e-tag (inode, mtime, size), which a reused inode can repeat."""
    path = RemoteTier.session_path(TENANT, "s1")
    head = Head("a", 1, 5.0, ["x"], 1)
    version = directory.write_head(path, head, None)
    assert version == {"content": native.digest_hex(head.to_bytes())}
    read = directory.read_head(path)
    assert read is not None and read.version == version
