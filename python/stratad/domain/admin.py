"""Store administration: garbage collection, verification and statistics."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stratad import tracing
from stratad.domain.models import Checkpoint, roots
from stratad.domain.sessions import LiveSession, SessionManager
from stratad.errors import DataLossError
from stratad.store import manifest
from stratad.store.tenant import ROOT_MANIFEST, TenantStore

if TYPE_CHECKING:
    from stratad.domain.replication import Replicator

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    objects_removed: int = 0
    bytes_freed: int = 0
    objects_kept: int = 0
    seconds: float = 0.0
    #: In object storage, when the daemon replicates (see docs/replication.md).
    remote_packs_deleted: int = 0
    remote_bytes_freed: int = 0
    remote_packs_condemned: int = 0


@dataclass
class CorruptObject:
    tenant: str
    digest: str
    problem: str
    sessions: list[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    objects_checked: int = 0
    corrupt: list[CorruptObject] = field(default_factory=list)
    damaged_sessions: list[str] = field(default_factory=list)
    #: The same for object storage, when the daemon replicates (else empty).
    remote_objects_checked: int = 0
    remote_corrupt: list[CorruptObject] = field(default_factory=list)
    remote_damaged_sessions: list[str] = field(default_factory=list)
    remote_damaged_library: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        local_ok = not self.corrupt and not self.damaged_sessions
        remote_ok = not self.remote_corrupt and not self.remote_damaged_sessions
        return local_ok and remote_ok and not self.remote_damaged_library


@dataclass
class StoreStats:
    tenants: int = 0
    sessions: int = 0
    checkpoints: int = 0
    objects: int = 0
    logical_bytes: int = 0  # sum of the sizes of every checkpoint's state
    unique_bytes: int = 0  # uncompressed bytes of the distinct chunks referenced
    stored_bytes: int = 0  # objects (frame bytes) + journals on disk

    @property
    def dedup_ratio(self) -> float:
        return self.logical_bytes / self.unique_bytes if self.unique_bytes else 1.0

    @property
    def compression_ratio(self) -> float:
        objects = self.stored_bytes
        return self.unique_bytes / objects if objects else 1.0


class Admin:
    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions
        self.store = sessions.store
        #: Set by the engine when sessions replicate to object storage.
        self.replicator: Replicator | None = None

    def _tenants(self, tenant: str) -> list[TenantStore]:
        if tenant:  # an unknown tenant has nothing to collect, verify or count
            found = self.store.find_tenant(tenant)
            return [found] if found is not None else []
        return [self.store.tenant(name) for name in self.store.existing_tenant_names()]

    # -- garbage collection ------------------------------------------------------

    def collect_garbage(self, tenant: str = "") -> GcReport:
        """Mark every object a checkpoint reaches; sweep the rest.

        Objects written or newly referenced after the collection started are
        recorded in `gc_touched` by the writers and never swept. Collections of
        one tenant never overlap: a second caller waits for the running one.
        """
        report = GcReport()
        started = time.monotonic()
        with tracing.span("stratad.gc", {"stratad.tenant": tenant or "*"}):
            for store in self._tenants(tenant):
                self._collect_tenant(store, report)
                self._collect_remote(store.name, report)
            tracing.annotate(
                {
                    "stratad.gc.objects_removed": report.objects_removed,
                    "stratad.gc.bytes_freed": report.bytes_freed,
                }
            )
        report.seconds = time.monotonic() - started
        return report

    def _collect_remote(self, tenant: str, report: GcReport) -> None:
        replicator = self.replicator
        if replicator is None:
            return
        remote = replicator.collect_remote(tenant)
        report.remote_packs_deleted += remote.packs_deleted
        report.remote_bytes_freed += remote.bytes_freed
        report.remote_packs_condemned += remote.packs_condemned

    def _collect_tenant(self, store: TenantStore, report: GcReport) -> None:
        with store.gc_running:
            with store.objects.collecting() as started:
                self._mark_and_sweep(store, report, started)
            store.objects.write_tombstones()
            packs, freed = store.objects.compact()
            if packs:
                log.info("tenant %s: compacted %d packs, %d bytes freed", store.name, packs, freed)

    def _mark_and_sweep(self, store: TenantStore, report: GcReport, started: float) -> None:
        with store.gc_lock:
            store.gc_touched = set()
        try:
            marked: set[str] = set()
            for _, cp in self._checkpoints(store):
                for root, kind in roots(cp):
                    if root not in marked:
                        marked |= store.closure(root, kind)
            # Delta frames need their bases, which no checkpoint may list.
            marked = store.objects.with_bases(marked)
            for digest in store.objects.digests():
                if digest in marked:
                    report.objects_kept += 1
                    continue
                with store.gc_lock:
                    spared = digest in store.gc_touched or store.objects.written_after(
                        digest, started
                    )
                    if not spared:
                        report.bytes_freed += store.objects.delete(digest)
                        report.objects_removed += 1
                        continue
                report.objects_kept += 1
        finally:
            with store.gc_lock:
                store.gc_touched = None

    def _checkpoints(self, store: TenantStore) -> Iterator[tuple[LiveSession, Checkpoint]]:
        for live in self.sessions.sessions_of(store.name):
            with live.lock:
                checkpoints = list(live.state.checkpoints.values())
            for cp in checkpoints:
                yield live, cp

    # -- verification --------------------------------------------------------------

    def verify(self, tenant: str = "") -> VerifyReport:
        """Re-hash every object; name the corrupt ones and the sessions they affect."""
        with tracing.span("stratad.verify", {"stratad.tenant": tenant or "*"}):
            report = self._verify(tenant)
            tracing.annotate(
                {
                    "stratad.verify.objects_checked": report.objects_checked,
                    "stratad.verify.corrupt": len(report.corrupt),
                }
            )
        return report

    def _verify(self, tenant: str) -> VerifyReport:
        report = VerifyReport()
        stores = self._tenants(tenant)
        for store in stores:
            bad: dict[str, CorruptObject] = {}
            for digest in store.objects.digests():
                report.objects_checked += 1
                problem = store.objects.verify(digest)
                if problem is not None:
                    bad[digest] = CorruptObject(store.name, digest, problem)
            self._attribute(store, bad, report)
            report.corrupt.extend(bad.values())
            for live in self.sessions.sessions_of(store.name):
                if live.damaged:
                    report.damaged_sessions.append(f"{store.name}/{live.state.session_id}")
        # Object storage may hold a tenant this daemon has nothing of locally
        # (e.g. only its crystal library, which has no objects).
        for name in dict.fromkeys([*(s.name for s in stores), *([tenant] if tenant else [])]):
            self._verify_remote(name, report)
        return report

    def _verify_remote(self, tenant: str, report: VerifyReport) -> None:
        replicator = self.replicator
        if replicator is None:
            return
        remote = replicator.verify_remote(tenant)
        report.remote_objects_checked += remote.objects_checked
        report.remote_corrupt.extend(CorruptObject(tenant, d, p) for d, p in remote.corrupt)
        report.remote_damaged_sessions.extend(f"{tenant}/{s}" for s in remote.damaged_sessions)
        report.remote_damaged_library.extend(
            f"{tenant}/{s}" for s in remote.damaged_library_segments
        )

    def _attribute(
        self, store: TenantStore, bad: dict[str, CorruptObject], report: VerifyReport
    ) -> None:
        """Find the sessions whose checkpoints reach a corrupt or missing object."""
        for live, cp in self._checkpoints(store):
            for root, kind in roots(cp):
                self._attribute_root(store, live, root, kind, bad)

    def _attribute_root(
        self, store: TenantStore, live: LiveSession, root: str, kind: str,
        bad: dict[str, CorruptObject],
    ) -> None:  # fmt: skip
        try:
            reached = store.closure(root, kind)
        except DataLossError as exc:
            reached = {root}
            bad.setdefault(root, CorruptObject(store.name, root, str(exc)))
        for digest in reached:
            if digest not in bad and not store.objects.has(digest):
                bad[digest] = CorruptObject(store.name, digest, "missing")
            if digest in bad and live.state.session_id not in bad[digest].sessions:
                bad[digest].sessions.append(live.state.session_id)

    # -- statistics ------------------------------------------------------------------

    def stats(self, tenant: str = "") -> StoreStats:
        stats = StoreStats()
        for store in self._tenants(tenant):
            stats.tenants += 1
            stats.objects += len(store.objects)
            stats.stored_bytes += store.objects.stored_bytes
            chunks: dict[str, int] = {}
            for live in self.sessions.sessions_of(store.name):
                stats.sessions += 1
                stats.stored_bytes += live.log.size
            for _, cp in self._checkpoints(store):
                stats.checkpoints += 1
                stats.logical_bytes += cp.size
                try:
                    entries = store.entries_of(cp.root, cp.root_kind, cp.size)
                except DataLossError:
                    continue
                chunks.update(manifest.iter_entries(entries))
                if cp.root_kind == ROOT_MANIFEST:
                    chunks.setdefault(cp.root, 0)
            stats.unique_bytes += sum(chunks.values())
        return stats
