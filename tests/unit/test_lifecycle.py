"""The idle-session sweep and scheduled GC (domain/lifecycle.py), in process.

Time passes by making sessions older (``age``: their last write and read move
back), so the domain's own clock stays the real one. The races are
made deterministic by running the competing write inside the sweep, between
its choice of candidates and the deletion.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from obstore.store import MemoryStore

from stratad.domain.admin import GcReport
from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.domain.lifecycle import KEEP_LABEL, Lifecycle
from stratad.errors import NotFoundError, ResourceExhaustedError
from stratad.store.remote import RemoteTier

TENANT = "default"
TTL = 600.0
WAIT = 30.0


def age(engine: Engine, seconds: float) -> None:
    """Make every loaded session's last write and last read ``seconds`` older."""
    for live in engine.sessions.all_sessions():
        with live.lock:
            live.state.updated_at -= seconds
            live.accessed_at -= seconds


class Recorder:
    """A LifecycleObserver that remembers what it was told."""

    def __init__(self) -> None:
        self.expired: list[tuple[str, str]] = []
        self.collected: list[tuple[str, GcReport]] = []

    def session_expired(self, tenant: str, session_id: str) -> None:
        self.expired.append((tenant, session_id))

    def scheduled_gc(self, tenant: str, report: GcReport) -> None:
        self.collected.append((tenant, report))


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path / "data", fsync_interval=3600.0)
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


def lifecycle_of(engine: Engine, **kwargs: float) -> Lifecycle:
    kwargs.setdefault("idle_ttl", TTL)
    return Lifecycle(engine.sessions, engine.admin, **kwargs)


def save(engine: Engine, session: str, data: bytes, tenant: str = TENANT) -> None:
    engine.checkpoints.save_state(tenant, session, SaveInput(data=data))


def session_ids(engine: Engine, tenant: str = TENANT) -> list[str]:
    return sorted(s.state.session_id for s in engine.sessions.sessions_of(tenant))


def test_sessions_idle_past_the_ttl_are_deleted_the_others_kept(engine: Engine) -> None:
    lifecycle = lifecycle_of(engine)
    recorder = Recorder()
    lifecycle.observers.append(recorder)
    for name in ("old", "read", "written", "kept"):
        engine.sessions.create(TENANT, name, labels={KEEP_LABEL: "true"} if name == "kept" else {})
        save(engine, name, name.encode() * 1000)
    engine.sessions.create("other", "old-too")

    assert lifecycle.sweep() == []  # nothing is idle yet
    age(engine, TTL + 1)
    # Touched now: a read of one, a write to another.
    engine.checkpoints.load_state(TENANT, "read")
    save(engine, "written", b"new")

    assert sorted(lifecycle.sweep()) == [("default", "old"), ("other", "old-too")]
    assert session_ids(engine) == ["kept", "read", "written"]
    assert session_ids(engine, "other") == []
    with pytest.raises(NotFoundError):
        engine.checkpoints.load_state(TENANT, "old")
    assert sorted(recorder.expired) == [("default", "old"), ("other", "old-too")]
    assert lifecycle.stats.sessions_expired == 2

    # The objects only the expired session held are garbage for the next GC.
    report = engine.admin.collect_garbage(TENANT)
    assert report.objects_removed >= 1
    assert engine.checkpoints.load_state(TENANT, "read").data == b"read" * 1000


def test_a_load_state_counts_as_a_touch(engine: Engine) -> None:
    lifecycle = lifecycle_of(engine)
    engine.sessions.create(TENANT, "s")
    save(engine, "s", b"x")
    age(engine, TTL / 2)
    engine.checkpoints.load_state(TENANT, "s")
    age(engine, TTL / 2 + 1)  # past the TTL since the save, not since the load
    assert lifecycle.sweep() == []
    age(engine, TTL / 2)
    assert lifecycle.sweep() == [(TENANT, "s")]


def test_listing_and_getting_a_session_do_not_touch_it(engine: Engine) -> None:
    lifecycle = lifecycle_of(engine)
    engine.sessions.create(TENANT, "s")
    age(engine, TTL + 1)
    engine.sessions.list(TENANT)
    engine.sessions.info(TENANT, "s")
    assert lifecycle.sweep() == [(TENANT, "s")]


def test_a_save_arriving_while_the_sweep_decides_wins(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep has listed the session as idle; a save lands before the deletion."""
    lifecycle = lifecycle_of(engine, idle_ttl=0.001)
    engine.sessions.create(TENANT, "busy")
    save(engine, "busy", b"first")
    age(engine, 60)
    original = lifecycle._idle_sessions

    def idle_then_saved(cutoff: float) -> list:  # type: ignore[type-arg]
        found = original(cutoff)
        assert [c.session_id for c in found] == ["busy"]
        save(engine, "busy", b"second")  # the writer takes the session's lock first
        # Its time must not decide it: the version alone shows it changed.
        engine.sessions.live(TENANT, "busy").state.updated_at = 0.0
        return found

    monkeypatch.setattr(lifecycle, "_idle_sessions", idle_then_saved)
    assert lifecycle.sweep() == []
    assert engine.checkpoints.load_state(TENANT, "busy").data == b"second"
    assert lifecycle.stats.sessions_expired == 0


def test_a_read_arriving_while_the_sweep_decides_wins(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    lifecycle = lifecycle_of(engine)
    engine.sessions.create(TENANT, "reader")
    age(engine, TTL + 1)
    original = lifecycle._idle_sessions

    def idle_then_read(cutoff: float) -> list:  # type: ignore[type-arg]
        found = original(cutoff)
        engine.sessions.live(TENANT, "reader").accessed_at = time.time()  # a read's touch
        return found

    monkeypatch.setattr(lifecycle, "_idle_sessions", idle_then_read)
    assert lifecycle.sweep() == []
    assert session_ids(engine) == ["reader"]


def test_a_session_deleted_meanwhile_is_skipped(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    lifecycle = lifecycle_of(engine)
    engine.sessions.create(TENANT, "a")
    engine.sessions.create(TENANT, "b")
    age(engine, TTL + 1)
    original = lifecycle._idle_sessions

    def then_deleted(cutoff: float) -> list:  # type: ignore[type-arg]
        found = original(cutoff)
        engine.sessions.delete(TENANT, "a")  # DeleteSession by a client
        return found

    monkeypatch.setattr(lifecycle, "_idle_sessions", then_deleted)
    assert lifecycle.sweep() == [(TENANT, "b")]
    assert lifecycle.stats.failures == 0


def test_expiry_survives_a_restart_as_a_deletion(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "data", fsync_interval=3600.0)
    engine.open()
    engine.sessions.create(TENANT, "gone")
    engine.sessions.create(TENANT, "stays", labels={KEEP_LABEL: "TRUE"})
    age(engine, TTL + 1)
    assert lifecycle_of(engine).sweep() == [(TENANT, "gone")]
    engine.close()
    reopened = Engine(tmp_path / "data", fsync_interval=3600.0)
    reopened.open()
    try:
        assert session_ids(reopened) == ["stays"]
    finally:
        reopened.close()


def test_a_restart_gives_every_session_a_fresh_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads are kept in memory only: after a restart a session counts as touched."""
    engine = Engine(tmp_path / "data", fsync_interval=3600.0)
    engine.open()
    long_ago = time.time() - 10 * TTL
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: long_ago)
        engine.sessions.create(TENANT, "s")  # journaled as written long ago
    engine.close()
    reopened = Engine(tmp_path / "data", fsync_interval=3600.0)
    reopened.open()
    try:
        assert reopened.sessions.info(TENANT, "s").updated_at == long_ago
        assert lifecycle_of(reopened).sweep() == []
        age(reopened, TTL + 1)
        assert lifecycle_of(reopened).sweep() == [(TENANT, "s")]
    finally:
        reopened.close()


def test_nothing_expires_while_the_store_is_read_only(engine: Engine) -> None:
    lifecycle = lifecycle_of(engine, gc_interval=1.0)
    engine.sessions.create(TENANT, "s")
    age(engine, TTL + 1)
    engine.store.enter_read_only(ResourceExhaustedError("disk full", reason="DISK_FULL"))
    assert lifecycle.sweep() == []
    assert lifecycle.collect_garbage() == []
    assert lifecycle.stats.skipped == 2
    assert session_ids(engine) == ["s"]


def test_nothing_expires_after_a_storage_failure(engine: Engine) -> None:
    lifecycle = lifecycle_of(engine)
    engine.sessions.create(TENANT, "s")
    age(engine, TTL + 1)
    engine.store.fail_stop.trip("a journal fsync", OSError(errno.EIO, "I/O error"))
    assert lifecycle.sweep() == []
    assert engine.sessions.loaded(TENANT, "s") is not None


def test_scheduled_gc_collects_every_tenant(engine: Engine) -> None:
    lifecycle = Lifecycle(engine.sessions, engine.admin, gc_interval=3600.0)
    recorder = Recorder()
    lifecycle.observers.append(recorder)
    for tenant in ("default", "t2"):
        engine.sessions.create(tenant, "s")
        save(engine, "s", os.urandom(50_000), tenant)
        engine.sessions.delete(tenant, "s")
    reports = dict(lifecycle.collect_garbage())
    assert sorted(reports) == ["default", "t2"]
    assert all(r.objects_removed >= 1 for r in reports.values())
    assert [t for t, _ in recorder.collected] == sorted(reports)
    assert lifecycle.stats.gc_runs == 2


def test_the_background_threads_run_and_stop(engine: Engine) -> None:
    """Tiny intervals: the threads expire and collect on their own; stop() ends them."""
    lifecycle = Lifecycle(
        engine.sessions, engine.admin, idle_ttl=0.01, sweep_interval=0.01, gc_interval=0.01
    )
    engine.sessions.create(TENANT, "short-lived")
    save(engine, "short-lived", os.urandom(50_000))
    lifecycle.start()
    try:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            gone = engine.sessions.loaded(TENANT, "short-lived") is None
            if (
                gone
                and lifecycle.stats.gc_runs >= 1
                and not len(engine.store.tenant(TENANT).objects)
            ):
                break
            time.sleep(0.01)
        assert engine.sessions.loaded(TENANT, "short-lived") is None
        assert lifecycle.stats.sessions_expired == 1
        assert len(engine.store.tenant(TENANT).objects) == 0  # collected after the expiry
    finally:
        lifecycle.stop()
    assert all(not t.is_alive() for t in lifecycle._threads)
    assert lifecycle.stats.failures == 0


def test_a_failing_pass_is_logged_and_the_thread_lives_on(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lifecycle = Lifecycle(engine.sessions, engine.admin, gc_interval=0.01)
    calls = 0
    original = engine.admin.collect_garbage

    def flaky(tenant: str = "") -> GcReport:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(errno.EIO, "I/O error")
        return original(tenant)

    monkeypatch.setattr(engine.admin, "collect_garbage", flaky)
    engine.sessions.create(TENANT, "s")
    lifecycle.start()
    try:
        deadline = time.monotonic() + WAIT
        while lifecycle.stats.gc_runs < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        lifecycle.stop()
    assert lifecycle.stats.failures >= 1
    assert lifecycle.stats.gc_runs >= 1
    assert "scheduled GC failed" in caplog.text


def test_delete_checks_only_if_again_under_the_lock_at_the_deletion(engine: Engine) -> None:
    """A write between the first look and the deletion (here: the test's only_if
    says so on its second call) keeps the session."""
    engine.sessions.create(TENANT, "s")
    answers = iter([True, False])
    assert engine.sessions.delete(TENANT, "s", only_if=lambda live: next(answers)) is False
    assert session_ids(engine) == ["s"]
    assert engine.sessions.delete(TENANT, "s", only_if=lambda live: True) is True
    assert session_ids(engine) == []


def test_an_expired_replicated_session_leaves_a_tombstone(tmp_path: Path) -> None:
    """Expiry is DeleteSession: no other daemon hydrates the session back."""
    remote = RemoteTier(MemoryStore())
    engines = []
    for name in ("a", "b"):
        engine = Engine(tmp_path / name, fsync_interval=0.02)
        engine.replicate_to(remote, mode="sync", node_id=name, lag=0.02, lease=0.5)
        engine.open()
        engines.append(engine)
    a, b = engines
    try:
        a.sessions.create(TENANT, "replicated")
        save(a, "replicated", b"state")
        age(a, TTL + 1)
        assert lifecycle_of(a).sweep() == [(TENANT, "replicated")]
        with pytest.raises(NotFoundError):
            b.checkpoints.load_state(TENANT, "replicated")
        assert b.sessions.list(TENANT)[0] == []
    finally:
        for engine in engines:
            engine.close()
