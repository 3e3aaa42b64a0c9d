"""Prometheus metrics: what operators scrape from ``metrics_listen`` (HTTP, /metrics).

Every daemon has its own `CollectorRegistry` (several in-process servers in
one test process never share counters). The metrics are:

- gRPC, named as go-grpc-prometheus names them so that existing dashboards
  work: ``grpc_server_started_total``, ``grpc_server_handled_total`` and the
  latency histogram ``grpc_server_handling_seconds``, labelled by
  ``grpc_type``, ``grpc_service``, ``grpc_method`` and (when finished)
  ``grpc_code``. They are fed by `RequestInterceptor`, of which `Metrics` is
  an observer.
- the journal: ``stratad_journal_fsync_seconds`` (every journal fsync).
- the store, computed at scrape time and reused for ``metrics_stats_interval``
  seconds (walking every checkpoint is not free): ``stratad_store_*`` bytes
  logical / unique / stored, dedup and compression ratios, objects,
  checkpoints, tenants; ``stratad_sessions{status}`` and
  ``stratad_sessions_open`` (active + paused) are counted on every scrape.
- maintenance: ``stratad_gc_*`` and ``stratad_verify_*`` from the results
  of the CollectGarbage and Verify calls and of scheduled collections
  (``gc_interval``, also counted in ``stratad_scheduled_gc_runs_total``), by
  tenant; ``stratad_sessions_expired_total``, sessions the idle-session
  sweep deleted. Tenant names come from
  callers, so they are label values only for the first
  ``metrics_tenant_labels`` existing tenants seen (`TenantLabels`); every
  other tenant is ``_other``. No other metric has a tenant label.
- ``stratad_build_info{version}`` and the process collector's ``process_*``.

docs/deploy.md lists them with their meaning and example alerts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stratad import __version__
from stratad.domain.admin import GcReport, StoreStats
from stratad.domain.models import SessionStatus
from stratad.errors import UnavailableError
from stratad.server.interceptors import CallInfo, CallResult
from stratad.store import journal

if TYPE_CHECKING:
    from stratad.domain.engine import Engine

_log = logging.getLogger(__name__)

#: Latency buckets (seconds): a small unary call takes ~1 ms here, a large
#: state tens of ms, GC and Verify of a big store minutes.
RPC_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 300.0,
)  # fmt: skip
#: Journal fsync buckets (seconds): from a fast NVMe (~50 us) to a struggling disk.
FSYNC_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5,
)  # fmt: skip

ADMIN_SERVICE = "stratad.api.v1.AdminService"
#: The tenant label of every tenant without a label value of its own.
OTHER_TENANTS = "_other"


class TenantLabels:
    """Tenant names as label values, for at most `limit` tenants: series stay bounded.

    A tenant gets its own value when first seen while fewer than `limit` have
    one, and only if it exists (`exists`): a caller cannot use up the names
    with made-up tenants. The rest share OTHER_TENANTS.
    """

    def __init__(self, limit: int, exists: Callable[[str], bool] = lambda _: True) -> None:
        self._limit = limit
        self._exists = exists
        self._named: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, tenant: str) -> str:
        with self._lock:
            if tenant in self._named:
                return tenant
            if len(self._named) < self._limit and self._exists(tenant):
                self._named.add(tenant)
                return tenant
        return OTHER_TENANTS


class MetricsStartError(UnavailableError):
    """The metrics endpoint could not listen (address taken or invalid)."""


class Metrics:
    """The daemon's metrics registry, its gRPC call observer and its HTTP endpoint."""

    def __init__(
        self,
        engine: Engine | None,
        data_dir: Path | None,
        stats_interval: float = 30.0,
        tenant_labels: int = 0,
    ) -> None:
        # No `*_created` series: they double the output and no dashboard reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        rpc_labels = ["grpc_type", "grpc_service", "grpc_method"]
        self.rpc_started = Counter(
            "grpc_server_started", "gRPC calls started on the server.", rpc_labels, registry=r
        )
        self.rpc_handled = Counter(
            "grpc_server_handled",
            "gRPC calls completed on the server, by status code.",
            [*rpc_labels, "grpc_code"],
            registry=r,
        )
        # labels() validates and locks on every lookup: the children of the
        # per-call metrics are kept by label values (one per method and status,
        # and only registered methods reach an observer).
        self._started_children: dict[tuple[str, ...], Any] = {}
        self._finished_children: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self.rpc_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from the start of a call to its status, by method and status code.",
            [*rpc_labels, "grpc_code"],
            buckets=RPC_BUCKETS,
            registry=r,
        )
        self.fsync_seconds = Histogram(
            "stratad_journal_fsync_seconds",
            "Duration of each journal fsync (group commit: one fsync may cover many writes).",
            buckets=FSYNC_BUCKETS,
            registry=r,
        )
        self.gc_runs = Counter(
            "stratad_gc_runs", "Garbage collections completed.", ["tenant"], registry=r
        )
        self.gc_objects_removed = Counter(
            "stratad_gc_objects_removed", "Objects removed by GC.", ["tenant"], registry=r
        )
        self.gc_bytes_freed = Counter(
            "stratad_gc_bytes_freed", "Bytes freed by GC.", ["tenant"], registry=r
        )
        self.gc_last_seconds = Gauge(
            "stratad_gc_last_duration_seconds", "Duration of the last GC.", ["tenant"], registry=r
        )
        self.gc_last_kept = Gauge(
            "stratad_gc_last_objects_kept", "Objects the last GC kept.", ["tenant"], registry=r
        )
        self.gc_last_time = Gauge(
            "stratad_gc_last_run_timestamp_seconds",
            "Unix time the last GC finished.",
            ["tenant"],
            registry=r,
        )
        self.sessions_expired = Counter(
            "stratad_sessions_expired",
            "Sessions deleted by the idle-session sweep (session_idle_ttl).",
            registry=r,
        )
        self.scheduled_gc_runs = Counter(
            "stratad_scheduled_gc_runs",
            "Garbage collections started by gc_interval (also counted in stratad_gc_runs).",
            ["tenant"],
            registry=r,
        )
        self.verify_runs = Counter(
            "stratad_verify_runs", "Verifications completed.", ["tenant"], registry=r
        )
        self.verify_last_ok = Gauge(
            "stratad_verify_last_ok",
            "1 if the last verification found no problem, else 0.",
            ["tenant"],
            registry=r,
        )
        self.verify_last_checked = Gauge(
            "stratad_verify_last_objects_checked",
            "Objects the last verification re-hashed.",
            ["tenant"],
            registry=r,
        )
        self.verify_last_corrupt = Gauge(
            "stratad_verify_last_corrupt_objects",
            "Corrupt or missing objects the last verification found.",
            ["tenant"],
            registry=r,
        )
        self.verify_last_damaged = Gauge(
            "stratad_verify_last_damaged_sessions",
            "Sessions with a damaged journal the last verification found.",
            ["tenant"],
            registry=r,
        )
        self.verify_last_time = Gauge(
            "stratad_verify_last_run_timestamp_seconds",
            "Unix time the last verification finished.",
            ["tenant"],
            registry=r,
        )
        build = Gauge("stratad_build_info", "stratad version.", ["version"], registry=r)
        build.labels(version=__version__).set(1)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        if engine is not None:
            r.register(StoreCollector(engine, stats_interval))
        store = engine.store if engine is not None else None
        self.tenant_label = TenantLabels(
            tenant_labels, lambda t: store is None or store.find_tenant(t) is not None
        )
        self._data_dir = str(data_dir.resolve()) if data_dir is not None else None
        self._http: Any = None
        self._thread: threading.Thread | None = None
        #: The address the endpoint listens on (HOST:PORT with the real port), once started.
        self.address = ""

    # -- gRPC calls (a RequestInterceptor observer) -------------------------------

    def call_started(self, call: CallInfo) -> None:
        labels = (call.kind, call.service, call.name)
        started = self._started_children.get(labels)
        if started is None:
            started = self._started_children[labels] = self.rpc_started.labels(*labels)
        started.inc()

    def call_finished(self, result: CallResult) -> None:
        call = result.call
        labels = (call.kind, call.service, call.name, result.code)
        children = self._finished_children.get(labels)
        if children is None:
            children = (self.rpc_handled.labels(*labels), self.rpc_seconds.labels(*labels))
            self._finished_children[labels] = children
        children[0].inc()
        children[1].observe(result.seconds)
        if call.service == ADMIN_SERVICE and result.code == "OK" and result.response is not None:
            self._admin_result(call, result.response)

    def _admin_result(self, call: CallInfo, response: Any) -> None:
        tenant = self.tenant_label(call.tenant)
        now = time.time()
        if call.name == "CollectGarbage":
            self._gc_done(tenant, response, now)
        elif call.name == "Verify":
            self.verify_runs.labels(tenant).inc()
            self.verify_last_ok.labels(tenant).set(1 if response.ok else 0)
            self.verify_last_checked.labels(tenant).set(response.objects_checked)
            self.verify_last_corrupt.labels(tenant).set(len(response.corrupt_objects))
            self.verify_last_damaged.labels(tenant).set(len(response.damaged_sessions))
            self.verify_last_time.labels(tenant).set(now)

    def _gc_done(self, tenant: str, report: Any, now: float) -> None:
        """A collection (a call's response or a domain GcReport: the same fields)."""
        self.gc_runs.labels(tenant).inc()
        self.gc_objects_removed.labels(tenant).inc(report.objects_removed)
        self.gc_bytes_freed.labels(tenant).inc(report.bytes_freed)
        self.gc_last_seconds.labels(tenant).set(report.seconds)
        self.gc_last_kept.labels(tenant).set(report.objects_kept)
        self.gc_last_time.labels(tenant).set(now)

    # -- the lifecycle (a LifecycleObserver; see domain/lifecycle.py) ------------------

    def session_expired(self, tenant: str, session_id: str) -> None:
        self.sessions_expired.inc()

    def scheduled_gc(self, tenant: str, report: GcReport) -> None:
        label = self.tenant_label(tenant)
        self.scheduled_gc_runs.labels(label).inc()
        self._gc_done(label, report, time.time())

    # -- journal fsyncs -------------------------------------------------------------

    def _on_fsync(self, path: Path, seconds: float) -> None:
        # Observers are process-wide: count only this daemon's journals.
        if self._data_dir is None or str(path).startswith(self._data_dir):
            self.fsync_seconds.observe(seconds)

    # -- the HTTP endpoint -------------------------------------------------------------

    def start(self, listen: str) -> str:
        """Serve /metrics on ``listen`` (HOST:PORT; port 0 picks one); return HOST:PORT."""
        host, _, port = listen.rpartition(":")
        bind_host = host[1:-1] if host.startswith("[") else host
        try:
            self._http, self._thread = start_http_server(
                int(port), bind_host, registry=self.registry
            )
        except OSError as exc:
            raise MetricsStartError(
                f"cannot serve metrics on {listen}: {exc.strerror or exc}"
            ) from None
        journal.FSYNC_OBSERVERS.append(self._on_fsync)
        self.address = f"{host}:{self._http.server_port}"
        return self.address

    def stop(self) -> None:
        """Stop the endpoint and stop observing fsyncs (idempotent)."""
        if self._on_fsync in journal.FSYNC_OBSERVERS:
            journal.FSYNC_OBSERVERS.remove(self._on_fsync)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class StoreCollector(Collector):
    """Store and session gauges, computed when Prometheus scrapes."""

    def __init__(self, engine: Engine, interval: float) -> None:
        self._engine = engine
        self._interval = interval
        self._lock = threading.Lock()
        self._stats: StoreStats | None = None
        self._stats_at = 0.0
        self._stats_seconds = 0.0

    def describe(self) -> list[Any]:
        return []  # computed lazily: do not walk the store at registration

    def collect(self) -> Iterator[Any]:
        yield from self._session_metrics()
        yield from self._replication_metrics()
        stats = self._store_stats()
        if stats is None:
            return
        gauges: list[tuple[str, str, float]] = [
            ("stratad_store_tenants", "Tenants with data.", stats.tenants),
            ("stratad_store_checkpoints", "Checkpoints of every session.", stats.checkpoints),
            ("stratad_store_objects", "Object files (chunks and manifests).", stats.objects),
            (
                "stratad_store_logical_bytes",
                "Sum of the sizes of every checkpoint's state.",
                stats.logical_bytes,
            ),
            (
                "stratad_store_unique_bytes",
                "Uncompressed bytes of the distinct chunks referenced.",
                stats.unique_bytes,
            ),
            (
                "stratad_store_stored_bytes",
                "Bytes on disk: objects (frame bytes in packs) and journals.",
                stats.stored_bytes,
            ),
            (
                "stratad_store_dedup_ratio",
                "logical_bytes / unique_bytes (1 = no sharing).",
                stats.dedup_ratio,
            ),
            (
                "stratad_store_compression_ratio",
                "unique_bytes / stored_bytes.",
                stats.compression_ratio,
            ),
            (
                "stratad_store_stats_duration_seconds",
                "Time the last computation of the store metrics took.",
                self._stats_seconds,
            ),
            (
                "stratad_store_stats_timestamp_seconds",
                "Unix time the store metrics were computed.",
                self._stats_at,
            ),
        ]
        for name, help_text, value in gauges:
            yield GaugeMetricFamily(name, help_text, value=value)

    def _replication_metrics(self) -> Iterator[GaugeMetricFamily]:
        replicator = self._engine.replicator
        if replicator is None:
            return
        status = replicator.status()
        for name, help_text, key in (
            ("stratad_replication_lag_seconds",
             "Age of the oldest acknowledged write not yet in object storage.", "lag_seconds"),
            ("stratad_replication_bytes_behind",
             "Journal bytes acknowledged locally and not yet shipped.", "bytes_behind"),
            ("stratad_replication_objects_queued",
             "Objects waiting for their upload.", "objects_queued"),
            ("stratad_replication_sessions_owned",
             "Sessions whose lease this daemon holds or held last.", "sessions_owned"),
            ("stratad_replication_last_shipment_seconds",
             "Duration of the last shipment (objects, segment, HEAD).", "last_shipment_seconds"),
            ("stratad_replication_library_records_behind",
             "Crystal and profile records acknowledged locally, not yet in object storage.",
             "library_records_behind"),
            ("stratad_replication_library_lag_seconds",
             "Age of the oldest such library record.", "library_lag_seconds"),
            ("stratad_replication_library_segments",
             "Segments of this daemon's library streams in object storage.", "library_segments"),
            ("stratad_replication_library_damaged_segments",
             "Library segments of other daemons that failed their checksums.",
             "library_damaged_segments"),
        ):  # fmt: skip
            if key in status:
                yield GaugeMetricFamily(name, help_text, value=float(status[key]))

    def _session_metrics(self) -> Iterator[GaugeMetricFamily]:
        counts = dict.fromkeys(SessionStatus, 0)
        for live in self._engine.sessions.all_sessions():
            counts[live.state.status] = counts.get(live.state.status, 0) + 1
        by_status = GaugeMetricFamily("stratad_sessions", "Sessions by status.", labels=["status"])
        for status, n in counts.items():
            by_status.add_metric([status.value], n)
        yield by_status
        yield GaugeMetricFamily(
            "stratad_sessions_open",
            "Sessions that are active or paused.",
            value=counts[SessionStatus.ACTIVE] + counts[SessionStatus.PAUSED],
        )

    def _store_stats(self) -> StoreStats | None:
        with self._lock:  # one computation at a time; concurrent scrapes share it
            now = time.time()
            if self._stats is None or now - self._stats_at >= self._interval:
                started = time.perf_counter()
                try:
                    self._stats = self._engine.admin.stats()
                except Exception:
                    _log.warning("computing store metrics failed", exc_info=True)
                    return self._stats
                self._stats_seconds = time.perf_counter() - started
                self._stats_at = now
            return self._stats


__all__ = ["OTHER_TENANTS", "Metrics", "MetricsStartError", "StoreCollector", "TenantLabels"]
