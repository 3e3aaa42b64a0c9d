"""Garbage collection never removes what a concurrent save needs.

Deterministic versions of the races: a save runs *during* the mark phase (between
the collection's start and its sweep), writing new objects and referencing
objects that were garbage when the collection started.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.store.tenant import TenantStore

TENANT = "default"
WAIT = 30.0


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path / "data", fsync_interval=3600.0)
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


def during_mark(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """Run `action` once, inside the collection's mark phase."""
    original = TenantStore.closure
    done = False

    def closure(self: TenantStore, *args: Any, **kwargs: Any) -> set[str]:
        nonlocal done
        if not done:
            done = True
            action()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TenantStore, "closure", closure)


def save(engine: Engine, session: str, data: bytes) -> str:
    return engine.checkpoints.save_state(TENANT, session, SaveInput(data=data)).checkpoint.digest


def test_a_save_during_the_mark_phase_keeps_its_new_objects(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.sessions.create(TENANT, "a")
    save(engine, "a", os.urandom(100_000))
    late = os.urandom(100_000)
    during_mark(monkeypatch, lambda: save(engine, "a", late) and None)
    engine.admin.collect_garbage(TENANT)
    assert engine.checkpoints.load_state(TENANT, "a").data == late
    assert engine.admin.verify(TENANT).ok


def test_a_save_during_the_mark_phase_revives_objects_that_were_garbage(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(200_000)
    engine.sessions.create(TENANT, "old")
    save(engine, "old", data)
    engine.sessions.delete(TENANT, "old")  # its objects are garbage now
    engine.sessions.create(TENANT, "kept")
    save(engine, "kept", b"small state")
    # The same bytes again, saved after the mark phase read kept's checkpoints:
    # every chunk dedups against the garbage objects.
    during_mark(monkeypatch, lambda: save(engine, "kept", data) and None)
    report = engine.admin.collect_garbage(TENANT)
    assert engine.checkpoints.load_state(TENANT, "kept").data == data
    assert report.objects_removed == 0
    assert engine.admin.verify(TENANT).ok


def test_garbage_is_collected_when_nothing_races(engine: Engine) -> None:
    engine.sessions.create(TENANT, "gone")
    save(engine, "gone", os.urandom(200_000))
    engine.sessions.delete(TENANT, "gone")
    report = engine.admin.collect_garbage(TENANT)
    assert report.objects_removed > 0 and report.bytes_freed > 0
    assert engine.admin.stats(TENANT).objects == 0


def test_two_concurrent_collections_never_sweep_what_a_save_revived(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """GC2 must not reset GC1's record of revived objects.

    GC1 is held inside its mark phase while a save dedups against garbage
    objects (reviving them) and GC2 is started. Were GC2 to reset the record,
    GC1 would sweep the revived objects (DATA_LOSS after a restart) or crash on
    the reset (INTERNAL). Collections of one tenant are single-flight: GC2 waits
    for GC1.
    """
    data = os.urandom(200_000)
    engine.sessions.create(TENANT, "old")
    save(engine, "old", data)
    engine.sessions.delete(TENANT, "old")
    engine.sessions.create(TENANT, "kept")
    save(engine, "kept", b"small state")

    in_mark, release = threading.Event(), threading.Event()

    def hold_gc1() -> None:
        save(engine, "kept", data)  # revives the garbage chunks
        in_mark.set()
        assert release.wait(WAIT)

    during_mark(monkeypatch, hold_gc1)
    errors: list[BaseException] = []

    def collect() -> None:
        try:
            engine.admin.collect_garbage(TENANT)
        except BaseException as exc:  # reported below
            errors.append(exc)

    gc1 = threading.Thread(target=collect)
    gc1.start()
    assert in_mark.wait(WAIT)
    gc2 = threading.Thread(target=collect)
    gc2.start()
    gc2.join(0.5)  # GC2 runs to its end here when collections may overlap
    release.set()
    gc1.join(WAIT)
    gc2.join(WAIT)
    assert not errors, errors
    assert engine.checkpoints.load_state(TENANT, "kept").data == data
    engine.close()
    reopened = Engine(tmp_path / "data", fsync_interval=3600.0)
    reopened.open()
    try:
        assert reopened.checkpoints.load_state(TENANT, "kept").data == data
        assert reopened.admin.verify(TENANT).ok
    finally:
        reopened.close()


def test_write_times_are_kept_only_while_a_collection_runs(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GC's per-object write times cost memory only during a collection.

    Kept for every object ever written, they grew the daemon by ~100 bytes per
    save for as long as it ran.
    """
    engine.sessions.create(TENANT, "a")
    objects = engine.sessions.store.tenant(TENANT).objects
    for _ in range(20):
        save(engine, "a", os.urandom(50_000))
    assert not objects._written_at
    seen: list[int] = []
    during_mark(
        monkeypatch,
        lambda: (save(engine, "a", os.urandom(50_000)), seen.append(len(objects._written_at))),
    )
    engine.admin.collect_garbage(TENANT)
    assert seen and seen[0] >= 1  # the save during the mark phase was recorded
    assert not objects._written_at  # and forgotten once the collection ended
