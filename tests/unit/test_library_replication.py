"""Replication of tenant libraries (crystals, profiles) with several writers, in-process.

Several `Engine`s (daemons) with their own data directories share one obstore
`MemoryStore`; `sync_all()` is one replication round (ship, then merge), run
by hand so that the interleavings are the test's. The same scenarios run
against a real S3 server with real daemons in tests/e2e/test_library_replication_s3.py.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from obstore.store import MemoryStore

from stratad.domain import library_replication
from stratad.domain.crystals import Crystal, Outcome, TraceStep
from stratad.domain.engine import Engine
from stratad.domain.stamps import HybridClock
from stratad.errors import NotFoundError
from stratad.store.remote import RemoteTier

TENANT = "acme"


@pytest.fixture
def remote() -> RemoteTier:
    return RemoteTier(MemoryStore())


@pytest.fixture
def daemons(tmp_path: Path, remote: RemoteTier) -> Iterator[Callable[..., Engine]]:
    opened: list[Engine] = []

    def start(name: str, *, mode: str = "sync", data: str = "") -> Engine:
        engine = Engine(tmp_path / (data or name), fsync_interval=0.02)
        # A long lag: the rounds in these tests are run by hand (sync_all).
        engine.replicate_to(remote, mode=mode, node_id=name, lag=3600, lease=5)
        engine.open()
        opened.append(engine)
        return engine

    yield start
    for engine in opened:
        engine.close()


def crystallize(engine: Engine, goal: str, *tools: str, session: str = "s") -> Crystal:
    steps = [TraceStep(decision=f"use {t}", tool=t) for t in tools]
    result = engine.crystals.crystallize(TENANT, goal, steps, 0.8, session)
    assert result.outcome is Outcome.CREATED and result.crystal is not None
    return result.crystal


def library(engine: Engine) -> list[Crystal]:
    listed, token = engine.crystals.list(TENANT, page_size=1000)
    assert token == ""
    return listed


def sync(*engines: Engine) -> None:
    """Two rounds on every daemon: each ships, then each merges everybody's."""
    for _ in range(2):
        for engine in engines:
            assert engine.library_replicator is not None
            engine.library_replicator.sync_all()


def test_the_hybrid_clock_exceeds_the_wall_and_every_stamp_observed() -> None:
    wall = [1_800_000_000.0]
    clock = HybridClock("a", wall=lambda: wall[0])
    first = clock.now()
    assert clock.now() > first  # same millisecond: the counter orders them
    ahead = HybridClock("b", wall=lambda: wall[0] + 60).now()  # a clock a minute ahead
    clock.observe(ahead)
    assert clock.now() > ahead  # written after seeing it: ordered after it
    assert first & 0xFFFF == clock.tag


def test_an_empty_daemon_serves_the_same_library_and_profiles(
    daemons: Callable[..., Engine],
) -> None:
    a = daemons("a")
    made = [crystallize(a, f"deploy service {n} to the cluster", f"tool{n}") for n in range(4)]
    a.crystals.record_reuse(TENANT, made[0].crystal_id, True)
    a.crystals.record_reuse(TENANT, made[0].crystal_id, False)
    a.crystals.delete(TENANT, made[3].crystal_id)
    a.crystals.set_config(TENANT, max_crystals=50, min_success_score=0.5)
    a.profiles.update(TENANT, "ann", {"goals": ["ship it"], "preferences": {"tone": "dry"}})
    a.profiles.update(TENANT, "bob", {"expertise": ["rust"]})
    a.profiles.delete(TENANT, "bob")

    b = daemons("b")  # empty data directory: it catches up at start
    assert library(b) == library(a) and len(library(b)) == 3
    query = "deploy service 7 to the cluster"
    assert b.crystals.query(TENANT, query, 5) == a.crystals.query(TENANT, query, 5)
    assert b.crystals.config(TENANT) == a.crystals.config(TENANT)
    assert b.crystals.get(TENANT, made[0].crystal_id).reuse_count == 2
    assert b.profiles.get(TENANT, "ann") == a.profiles.get(TENANT, "ann")
    with pytest.raises(NotFoundError):
        b.profiles.get(TENANT, "bob")
    with pytest.raises(NotFoundError):
        b.crystals.get(TENANT, made[3].crystal_id)


def test_concurrent_writers_converge_to_the_union_with_every_reuse_counted(
    daemons: Callable[..., Engine],
) -> None:
    a, b = daemons("a"), daemons("b")
    shared = crystallize(a, "summarize the quarterly report", "pdf_reader")
    sync(a, b)
    # Both daemons write at once, neither seeing the other's writes yet.
    for n in range(3):
        crystallize(a, f"resize image number {n} for web", f"img{n}", session="sa")
        crystallize(b, f"translate document {n} into french", f"tr{n}", session="sb")
    for _ in range(3):
        a.crystals.record_reuse(TENANT, shared.crystal_id, True)
        b.crystals.record_reuse(TENANT, shared.crystal_id, False)
    a.profiles.update(TENANT, "ann", {"goals": ["from a"]})
    time.sleep(0.005)  # a later millisecond: the stamps order the two updates by wall clock
    b.profiles.update(TENANT, "ann", {"goals": ["from b"]})  # the later update wins whole
    b.crystals.set_config(TENANT, max_crystals=77)
    sync(a, b)

    assert library(a) == library(b) and len(library(a)) == 7
    merged = a.crystals.get(TENANT, shared.crystal_id)
    assert merged.reuse_count == 6  # 3 + 3: no increment lost
    assert merged.effectiveness == pytest.approx((0.8 + 3) / 7)
    assert a.profiles.get(TENANT, "ann") == b.profiles.get(TENANT, "ann")
    assert a.profiles.get(TENANT, "ann")["goals"] == ["from b"]
    assert a.crystals.config(TENANT).max_crystals == 77
    query = "translate document 9 into french"
    assert a.crystals.query(TENANT, query, 10) == b.crystals.query(TENANT, query, 10)


def test_deletes_win_over_older_writes_wherever_they_arrive(
    daemons: Callable[..., Engine],
) -> None:
    a, b = daemons("a"), daemons("b")
    doomed = crystallize(a, "rotate the access keys weekly", "vault")
    a.profiles.update(TENANT, "cy", {"goals": ["g"]})
    sync(a, b)
    b.crystals.delete(TENANT, doomed.crystal_id)
    b.profiles.delete(TENANT, "cy")
    a.crystals.record_reuse(TENANT, doomed.crystal_id, True)  # concurrent, on the old copy
    sync(a, b)
    for engine in (a, b):
        with pytest.raises(NotFoundError):
            engine.crystals.get(TENANT, doomed.crystal_id)
        with pytest.raises(NotFoundError):
            engine.profiles.get(TENANT, "cy")
    # A profile written after the deletion lives again, everywhere.
    a.profiles.update(TENANT, "cy", {"goals": ["again"]})
    sync(a, b)
    assert b.profiles.get(TENANT, "cy")["goals"] == ["again"]


def test_a_restart_replays_the_merged_library(
    daemons: Callable[..., Engine], tmp_path: Path
) -> None:
    a, b = daemons("a"), daemons("b")
    shared = crystallize(a, "label the support tickets", "classifier")
    crystallize(b, "cluster the customer feedback", "embedder")
    sync(a, b)
    b.crystals.record_reuse(TENANT, shared.crystal_id, True)
    b.profiles.update(TENANT, "dee", {"interests": ["jazz"]})
    sync(a, b)
    before = (library(a), a.profiles.get(TENANT, "dee"))
    a.close()
    # The same data directory, no bucket round needed to serve what was merged.
    again = Engine(tmp_path / "a", fsync_interval=0.02)
    again.open()
    try:
        assert (library(again), again.profiles.get(TENANT, "dee")) == before
        assert again.crystals.get(TENANT, shared.crystal_id).reuse_count == 1
    finally:
        again.close()


def test_streams_stay_bounded_and_a_new_daemon_still_gets_everything(
    daemons: Callable[..., Engine], remote: RemoteTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(library_replication, "COMPACT_EVERY", 4)
    fetched: list[tuple[str, str]] = []
    get = remote.get_library_segment

    def counted(tenant: str, node: str, seq: int, kind: str) -> bytes | None:
        fetched.append((node, kind))
        return get(tenant, node, seq, kind)

    monkeypatch.setattr(remote, "get_library_segment", counted)
    a, b = daemons("a"), daemons("b")
    made = []
    for n in range(12):
        made.append(crystallize(a, f"index repository {n} for search", f"idx{n}"))
        sync(a, b)  # b keeps up, segment by segment
    for crystal in made[:5]:
        a.crystals.record_reuse(TENANT, crystal.crystal_id, True)
    segments = remote.list_library(TENANT)["a"]
    # The last two bases and at most 4 segments after each (17 written so far).
    assert len(segments) <= 2 * 5, segments
    assert [kind for _, kind in segments].count("snap") <= 2
    status = a.library_replicator.status() if a.library_replicator else {}
    assert status["library_segments"] == len(segments)
    assert status["library_records_behind"] == 0
    # b merged every segment as it came: it never downloaded a compaction.
    assert ("a", "snap") not in fetched and ("a", "seg") in fetched

    c = daemons("c")  # a newcomer starts from the compaction
    assert library(c) == library(a) and len(library(c)) == 12
    assert ("a", "snap") in fetched
    sync(a, b)
    assert library(b) == library(a)


def test_a_daemon_that_lost_its_disk_but_kept_its_node_id_keeps_its_share(
    daemons: Callable[..., Engine], tmp_path: Path
) -> None:
    a = daemons("a", data="a-disk")
    mine = crystallize(a, "backfill the analytics tables", "sql")
    a.profiles.update(TENANT, "eve", {"goals": ["g"]})
    a.close()
    shutil.rmtree(tmp_path / "a-disk")
    a2 = daemons("a", data="a-new-disk")  # a StatefulSet pod back on a fresh volume
    assert a2.crystals.get(TENANT, mine.crystal_id) == mine
    crystallize(a2, "vacuum the warehouse nightly", "sql2")  # ships a new segment
    b = daemons("b")
    assert len(library(b)) == 2 and b.profiles.get(TENANT, "eve")["goals"] == ["g"]


def test_async_mode_ships_on_the_next_round(daemons: Callable[..., Engine]) -> None:
    a = daemons("a", mode="async")
    crystallize(a, "draft the release notes", "git")
    assert a.library_replicator is not None
    assert a.library_replicator.status()["library_records_behind"] == 1
    b = daemons("b")
    assert library(b) == []  # not shipped yet: acknowledged locally only
    sync(a, b)
    assert len(library(b)) == 1
    assert a.library_replicator.status()["library_records_behind"] == 0


def test_a_damaged_segment_is_reported_and_the_other_streams_still_merge(
    daemons: Callable[..., Engine], remote: RemoteTier
) -> None:
    a = daemons("a")
    crystallize(a, "compress the nightly backups", "zstd")
    good = remote.get_library_segment(TENANT, "a", 0, "base")
    assert good is not None
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF  # bit rot in the middle of a record
    remote.put_library_segment(TENANT, "x", 0, "seg", bytes(damaged))
    b = daemons("b")
    assert len(library(b)) == 1  # a's stream merged; x's refused
    sync(a, b)
    assert b.library_replicator is not None
    assert b.library_replicator.status()["library_damaged_segments"] == 1
    crystallize(a, "prune the old container images", "registry")
    sync(a, b)
    assert len(library(b)) == 2
    verified = b.admin.verify(TENANT)  # Verify names it
    assert not verified.ok
    assert verified.remote_damaged_library == [
        f"{TENANT}/x/000000000000.seg: a record fails its checksum"
    ]


def test_a_library_written_before_replication_is_published_when_it_is_turned_on(
    daemons: Callable[..., Engine], tmp_path: Path
) -> None:
    local = Engine(tmp_path / "a", fsync_interval=0.02)  # replication off
    local.open()
    try:
        old = crystallize(local, "archive the finished projects", "tar")
        local.crystals.record_reuse(TENANT, old.crystal_id, True)
        local.crystals.set_config(TENANT, max_crystals=99)
        local.profiles.update(TENANT, "fay", {"goals": ["from before"]})
    finally:
        local.close()
    a = daemons("a")  # the same data directory, now replicating
    crystallize(a, "send the weekly digest email", "smtp")
    b = daemons("b")
    assert library(b) == library(a) and len(library(b)) == 2
    assert b.crystals.get(TENANT, old.crystal_id) == a.crystals.get(TENANT, old.crystal_id)
    assert b.crystals.get(TENANT, old.crystal_id).reuse_count == 1
    assert b.crystals.config(TENANT).max_crystals == 99
    assert b.profiles.get(TENANT, "fay")["goals"] == ["from before"]


def test_async_writes_a_crash_kept_from_shipping_are_shipped_at_the_next_start(
    daemons: Callable[..., Engine], remote: RemoteTier, tmp_path: Path
) -> None:
    crashed = Engine(tmp_path / "a", fsync_interval=0.02)
    replicator = crashed.replicate_to(remote, mode="async", node_id="a", lag=3600, lease=5)
    crashed.open()
    kept = crystallize(crashed, "reconcile the payment ledger", "ledger")
    crashed.profiles.update(TENANT, "gus", {"goals": ["g"]})
    shipping = replicator.library
    assert shipping is not None and shipping.status()["library_records_behind"] == 2
    shipping.ship = lambda *args, **kwargs: None  # type: ignore[method-assign]  # the crash
    crashed.close()
    assert remote.list_library(TENANT).get("a", []) == []  # never shipped

    daemons("a")  # restarted on its disk: its first round publishes what it holds
    b = daemons("b")
    assert b.crystals.get(TENANT, kept.crystal_id) == kept
    assert b.profiles.get(TENANT, "gus")["goals"] == ["g"]


def test_restarts_under_new_node_ids_do_not_pile_up_streams(
    daemons: Callable[..., Engine], remote: RemoteTier, tmp_path: Path
) -> None:
    def run(node: str, disk: str, work: Callable[[Engine], None]) -> None:
        engine = Engine(tmp_path / disk, fsync_interval=0.02)
        engine.replicate_to(remote, mode="sync", node_id=node, lag=3600, lease=5)
        engine.open()
        try:
            work(engine)
        finally:
            engine.close()

    made: list[Crystal] = []
    for n in range(3):  # the default node ID (host and PID) changes with every restart

        def write(engine: Engine, n: int = n) -> None:
            made.append(crystallize(engine, f"restart number {n} of the worker", f"t{n}"))
            engine.profiles.update(TENANT, f"user{n}", {"goals": [f"g{n}"]})

        run(f"pid{n}", "disk", write)
    assert sorted(remote.list_library(TENANT)) == ["pid2"]  # pid0 and pid1 were adopted
    # The same pod name on a fresh volume: its base names what it adopted...
    shutil.rmtree(tmp_path / "disk")
    run("pid2", "fresh", lambda e: e.crystals.record_reuse(TENANT, made[0].crystal_id, True))
    # ...so that a restart under yet another ID still publishes all of it.
    run("pid3", "fresh", lambda e: crystallize(e, "one more after the restarts", "t9") and None)
    assert sorted(remote.list_library(TENANT)) == ["pid3"]
    b = daemons("b")
    assert len(library(b)) == 4
    goals = [b.profiles.get(TENANT, f"user{n}")["goals"] for n in range(3)]
    assert goals == [["g0"], ["g1"], ["g2"]]
    assert b.crystals.get(TENANT, made[0].crystal_id).reuse_count == 1


def test_the_streams_of_a_daemon_gone_with_its_volume_are_adopted(
    daemons: Callable[..., Engine], remote: RemoteTier, tmp_path: Path
) -> None:
    gone = Engine(tmp_path / "pod-x", fsync_interval=0.02)  # a Deployment pod, replaced
    gone.replicate_to(remote, mode="sync", node_id="pod-x", lag=3600, lease=5)  # later on
    gone.open()  # an empty volume under another name
    made = crystallize(gone, "compact the event store", "kafka")
    gone.profiles.update(TENANT, "hal", {"goals": ["g"]})
    gone.close()
    assert "pod-x" in remote.heartbeats()
    # A live daemon for which anything silent for more than 0 s is gone.
    live = Engine(tmp_path / "pod-y", fsync_interval=0.02)
    live.replicate_to(remote, mode="sync", node_id="pod-y", lag=3600, lease=5, gc_grace=0.0)
    live.open()
    try:
        assert sorted(remote.list_library(TENANT)) == ["pod-y"]  # pod-x's stream adopted
        assert "pod-x" not in remote.heartbeats()
    finally:
        live.close()
    b = daemons("b")
    assert b.crystals.get(TENANT, made.crystal_id) == made
    assert b.profiles.get(TENANT, "hal")["goals"] == ["g"]


def test_a_long_outage_cannot_make_the_async_queue_grow_without_bound(
    daemons: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(library_replication, "MAX_QUEUED_BYTES", 4096)
    a = daemons("a", mode="async")
    for n in range(20):  # nothing shipped meanwhile (no round runs)
        crystallize(a, f"render report page {n} as pdf", f"pdf{n}")
        a.profiles.update(TENANT, f"u{n}", {"goals": [f"g{n}"]})
    assert a.library_replicator is not None
    stream = a.library_replicator._stream(TENANT)
    assert stream.rebase and stream.queued_bytes <= 4096  # dropped: a base will carry it
    assert a.library_replicator.status()["library_records_behind"] == 40
    b = daemons("b")
    sync(a, b)
    assert len(library(b)) == 20 and b.profiles.get(TENANT, "u19")["goals"] == ["g19"]
    assert a.library_replicator.status()["library_records_behind"] == 0


def test_two_daemons_with_different_old_versions_agree_on_one(
    daemons: Callable[..., Engine], tmp_path: Path
) -> None:
    for name, goal, limit in (("a", "plan A", 10), ("b", "plan B", 20)):
        local = Engine(tmp_path / name, fsync_interval=0.02)  # before replication
        local.open()
        try:
            local.profiles.update(TENANT, "ivy", {"goals": [goal]})
            local.crystals.set_config(TENANT, max_crystals=limit)
        finally:
            local.close()
    a, b = daemons("a"), daemons("b")
    sync(a, b)
    assert a.profiles.get(TENANT, "ivy") == b.profiles.get(TENANT, "ivy")
    assert a.crystals.config(TENANT) == b.crystals.config(TENANT)


def test_a_reader_stuck_at_a_damaged_segment_goes_on_from_the_next_base(
    daemons: Callable[..., Engine], remote: RemoteTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(library_replication, "COMPACT_EVERY", 3)
    a, b = daemons("a"), daemons("b")
    crystallize(a, "first of the batch jobs", "j0")
    sync(a, b)
    put = remote.put_library_segment

    def rotting(tenant: str, node: str, seq: int, kind: str, data: bytes) -> None:
        if kind == "seg" and seq == 2:  # the next segment b needs arrives damaged
            data = data[:-3] + bytes(3)
        put(tenant, node, seq, kind, data)

    monkeypatch.setattr(remote, "put_library_segment", rotting)
    crystallize(a, "second of the batch jobs", "j1")
    sync(a, b)
    assert b.library_replicator is not None
    assert b.library_replicator.status()["library_damaged_segments"] == 1
    assert len(library(b)) == 1  # stuck before the damaged segment
    for n in range(2, 5):  # a compacts into a snapshot, which b merges instead
        crystallize(a, f"batch job number {n} of many", f"j{n}")
    sync(a, b)
    assert library(b) == library(a) and len(library(b)) == 5
