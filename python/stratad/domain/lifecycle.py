"""Background upkeep: expire idle sessions, collect garbage on a schedule.

Both are off by default; `Lifecycle` runs whichever the configuration turns on
(``session_idle_ttl``, ``gc_interval``) on a thread of its own, and the server
starts and stops it with the daemon.

Idle sessions
    A session is *touched* by every write to it (any record of its journal:
    saves, pending writes, status changes, structured state; the journal
    keeps the time, `SessionState.updated_at`) and by every read of its state
    (LoadState, and reads of its cognitive state, tasks or agent state; kept
    in memory, `LiveSession.accessed_at`). Listing sessions, GetSession and
    watching do not touch it: an operator looking around keeps nothing alive.
    When the daemon loads a session (at start, or hydrated from object
    storage) it counts as touched then: a restart forgets the reads before it
    and so grants every session a full TTL rather than expire one early.

    Every ``lifecycle_sweep_interval`` the sweep deletes each session untouched
    for longer than ``session_idle_ttl`` through `SessionManager.delete`, the
    path DeleteSession takes (its journal goes, a replicated session gets its
    tombstone; the objects only it referenced are freed by the next GC). The
    idleness test is made again under the session's lock at the moment of the
    deletion, so a write or read that gets there first keeps the session.
    A session labelled ``stratad.dev/keep=true`` never expires, nor does a
    damaged one (it is evidence for the operator, see Verify). Each daemon
    expires the sessions it has loaded.

Scheduled GC
    Every ``gc_interval`` (plus up to 10% of random jitter, so that daemons
    started together do not collect together) `Admin.collect_garbage` runs for
    each tenant in turn: the same single-flight collection as CollectGarbage,
    which a concurrent manual call simply waits for.

Neither runs while the store is fail-stopped or read-only: a deletion is a
write, and a failed store must not be touched until it restarts.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from stratad.domain.admin import Admin, GcReport
from stratad.domain.sessions import LiveSession, SessionManager
from stratad.errors import StratadError

log = logging.getLogger(__name__)

#: The label that exempts a session from the idle TTL (value "true").
KEEP_LABEL = "stratad.dev/keep"
#: Scheduled GC waits gc_interval plus up to this fraction of it.
GC_JITTER = 0.1


class LifecycleObserver(Protocol):
    """Told what the lifecycle did (the Prometheus metrics are one)."""

    def session_expired(self, tenant: str, session_id: str) -> None: ...

    def scheduled_gc(self, tenant: str, report: GcReport) -> None: ...


@dataclass
class LifecycleStats:
    sweeps: int = 0
    sessions_expired: int = 0
    gc_runs: int = 0
    #: Passes skipped because the store was fail-stopped or read-only.
    skipped: int = 0
    failures: int = 0


@dataclass(frozen=True)
class _Candidate:
    """A session the sweep found idle, with what it saw then."""

    tenant: str
    session_id: str
    version: int


@dataclass
class Lifecycle:
    """The idle-session sweep and the GC schedule of one daemon."""

    sessions: SessionManager
    admin: Admin
    #: Seconds a session may stay untouched; 0 = never expire.
    idle_ttl: float = 0.0
    sweep_interval: float = 60.0
    #: Seconds between scheduled collections; 0 = none.
    gc_interval: float = 0.0
    clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)
    observers: list[LifecycleObserver] = field(default_factory=list)
    stats: LifecycleStats = field(default_factory=LifecycleStats)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.idle_ttl > 0 or self.gc_interval > 0

    # -- the background threads --------------------------------------------------

    def start(self) -> None:
        if self.idle_ttl > 0:
            self._spawn("stratad-idle-sweep", self._sweep_loop)
            log.info(
                "idle sessions expire after %gs (checked every %gs; label %s=true keeps one)",
                self.idle_ttl, self.sweep_interval, KEEP_LABEL,
            )  # fmt: skip
        if self.gc_interval > 0:
            self._spawn("stratad-scheduled-gc", self._gc_loop)
            log.info("garbage is collected every %gs (+ up to 10%% jitter)", self.gc_interval)

    def stop(self) -> None:
        """Stop and wait: a running GC finishes its tenant, a sweep its session."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.sweep_interval):
            self._guarded("idle-session sweep", self.sweep)

    def _gc_loop(self) -> None:
        while not self._stop.wait(self.gc_interval * (1 + GC_JITTER * self.rng.random())):
            self._guarded("scheduled GC", self.collect_garbage)

    def _guarded(self, what: str, run: Callable[[], object]) -> None:
        # A failed pass is logged and retried next time: the thread must live on.
        try:
            run()
        except Exception:
            self.stats.failures += 1
            log.exception("%s failed; retrying in the next interval", what)

    def _store_usable(self, what: str) -> bool:
        try:
            self.sessions.store.fail_stop.check_writable()
        except StratadError as exc:
            self.stats.skipped += 1
            log.warning("%s skipped: %s", what, exc.message)
            return False
        return True

    # -- one pass of each (what the threads run; tests call them directly) ---------

    def sweep(self) -> list[tuple[str, str]]:
        """Delete the sessions idle for longer than the TTL; the (tenant, id) deleted."""
        if self.idle_ttl <= 0 or not self._store_usable("idle-session sweep"):
            return []
        self.stats.sweeps += 1
        cutoff = self.clock() - self.idle_ttl
        expired = []
        for candidate in self._idle_sessions(cutoff):
            if self._stop.is_set():
                break
            if self._expire(candidate, cutoff):
                expired.append((candidate.tenant, candidate.session_id))
        return expired

    def _idle_sessions(self, cutoff: float) -> list[_Candidate]:
        found = []
        for live in self.sessions.all_sessions():
            with live.lock:
                if is_idle(live, cutoff) and not live.damaged and not live.deleted:
                    found.append(_Candidate(*live.key, live.state.version))
        return found

    def _expire(self, candidate: _Candidate, cutoff: float) -> bool:
        """Delete one session if it is still idle and unchanged when its lock is taken."""
        tenant, session_id = candidate.tenant, candidate.session_id
        try:
            deleted = self.sessions.delete(
                tenant,
                session_id,
                only_if=lambda live: (
                    live.state.version == candidate.version and is_idle(live, cutoff)
                ),
            )
        except StratadError as exc:  # gone meanwhile, owned by another daemon, ...
            log.info("idle session %s/%s not expired: %s", tenant, session_id, exc.message)
            return False
        if not deleted:
            log.debug("session %s/%s was touched while expiring it: kept", tenant, session_id)
            return False
        self.stats.sessions_expired += 1
        log.info(
            "expired session %s/%s: untouched for more than %gs (session_idle_ttl)",
            tenant, session_id, self.idle_ttl,
        )  # fmt: skip
        for observer in self.observers:
            observer.session_expired(tenant, session_id)
        return True

    def collect_garbage(self) -> list[tuple[str, GcReport]]:
        """One scheduled collection of every tenant; each tenant's report."""
        if self.gc_interval <= 0 or not self._store_usable("scheduled GC"):
            return []
        reports = []
        for tenant in self.sessions.store.existing_tenant_names():
            if self._stop.is_set():
                break
            report = self.admin.collect_garbage(tenant)
            self.stats.gc_runs += 1
            log.info(
                "scheduled GC of tenant %s: removed %d objects (%d bytes), kept %d, in %.2fs",
                tenant, report.objects_removed, report.bytes_freed, report.objects_kept,
                report.seconds,
            )  # fmt: skip
            for observer in self.observers:
                observer.scheduled_gc(tenant, report)
            reports.append((tenant, report))
        return reports


def idle_since(live: LiveSession) -> float:
    """When the session was last written or read (call under its lock)."""
    return max(live.state.updated_at, live.accessed_at)


def is_idle(live: LiveSession, cutoff: float) -> bool:
    """Untouched since ``cutoff`` and not kept by its label (call under its lock)."""
    if live.state.labels.get(KEEP_LABEL, "").lower() == "true":
        return False
    return idle_since(live) < cutoff


__all__ = ["GC_JITTER", "KEEP_LABEL", "Lifecycle", "LifecycleObserver", "LifecycleStats"]
