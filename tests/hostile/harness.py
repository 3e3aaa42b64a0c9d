"""The daemon under attack, the well-behaved client beside it, and the checks after.

- `Daemon`: a ``stratad serve`` subprocess (started by the ``hostile_daemon``
  fixture, conftest.py) with its listeners as `Endpoint`s, its RSS and open
  descriptors read from /proc, its log.
- `Sampler`: samples RSS and descriptors every 50 ms while a case runs (peaks).
- `GoodClient`: a thread doing what an agent and a kubelet probe do: a health
  Check (1 s deadline, kubelet's default ``timeoutSeconds``) and a SaveState
  (2 s deadline), over and over, on a grpcio channel of its own; it records
  every error and every call's latency.
- `Verdict`: collects a case's checks and observations, prints one report,
  then fails with every broken check listed (not only the first).

Bounds (the documented constants the checks use):

- RSS: at most the idle daemon's RSS (measured after a warm-up) plus
  `MAX_INFLIGHT_BYTES` (the daemon's budget for requests, set in the test
  config) plus `RSS_SLACK` (64 MiB: what the budget does not cover and no
  attack should grow: the allocator's retained pages, transport buffers of
  the calls in progress, the good client's own states).
- Descriptors: the daemon's sockets, pipes and other non-data descriptors at
  most `FD_SLACK` above what they were after the warm-up (files under the
  data directory are journals of sessions the case created, not leaks).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from h2attack import Endpoint

from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc, session_pb2, session_pb2_grpc

MIB = 1 << 20
#: max_inflight_bytes of every daemon in this suite: small, so the RSS bound means something.
MAX_INFLIGHT_BYTES = 64 * MIB
#: RSS allowed on top of the idle daemon and MAX_INFLIGHT_BYTES (module doc).
RSS_SLACK = 64 * MIB
#: Non-data descriptors allowed above the warmed-up baseline once a case is over.
FD_SLACK = 8
#: How long released resources may take to come back after a case: past the
#: front door's 10 s TLS-handshake / HTTP/2-preface timeout, which is how long
#: a connection that never finishes its handshake is held.
RELEASE_SECONDS = 12.0
#: The good client's deadlines: a kubelet gRPC probe's default timeout, and a save's.
HEALTH_DEADLINE = 1.0
SAVE_DEADLINE = 2.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


# --- the daemon --------------------------------------------------------------------


@dataclass
class Daemon:
    """A running ``stratad serve``; ``endpoint`` is the listener under attack."""

    proc: subprocess.Popen[bytes]
    endpoint: Endpoint
    data_dir: Path
    log_path: Path
    token: str | None = None
    inspector: str = ""
    baseline_rss: int = 0
    baseline_fds: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        """Resident set size in bytes (0 once the process is gone)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def fds(self) -> tuple[int, int]:
        """(every open descriptor, those not under the data directory)."""
        base = f"/proc/{self.pid}/fd"
        data = str(self.data_dir.resolve())
        total = other = 0
        try:
            names = os.listdir(base)
        except OSError:
            return 0, 0
        for name in names:
            try:
                target = os.readlink(f"{base}/{name}")
            except OSError:
                continue
            total += 1
            if not target.startswith(data):
                other += 1
        return total, other

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def errors_since(self, offset: int) -> list[str]:
        """ERROR/CRITICAL records and tracebacks the daemon logged after byte ``offset``."""
        with self.log_path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        found = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                if "Traceback" in line or " ERROR " in line:
                    found.append(line[:300])
                continue
            if isinstance(record, dict) and record.get("level") in ("error", "critical"):
                exc = str(record.get("exception", "")).strip().splitlines()
                tail = f" [{exc[-1]}]" if exc else ""
                found.append(f"{record.get('logger')}: {record.get('message')}"[:240] + tail)
        return found

    def metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def warm_up(self) -> None:
        """A first session, save, load and health check (so that lazily opened
        things exist), then note the idle RSS and descriptors."""
        error = fresh_call_error(self.endpoint, self.metadata(), "warm-up")
        assert error is None, f"warm-up failed: {error}"
        time.sleep(0.3)
        self.baseline_rss = self.rss()
        self.baseline_fds = self.fds()[1]

    @property
    def rss_limit(self) -> int:
        return self.baseline_rss + MAX_INFLIGHT_BYTES + RSS_SLACK


class Sampler:
    """Samples the daemon's RSS (every 50 ms) and descriptors (every 200 ms) on a
    thread; ``peak_rss`` and ``peak_fds`` (all descriptors) are the highest seen."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.peak_rss = daemon.rss()
        self.peak_fds = daemon.fds()[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(0.05):
            self.peak_rss = max(self.peak_rss, self.daemon.rss())
            n += 1
            if n % 4 == 0:
                self.peak_fds = max(self.peak_fds, self.daemon.fds()[0])


# --- well-behaved calls ------------------------------------------------------------


def _code(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    return code.name if code is not None else "?"


def fresh_call_error(
    endpoint: Endpoint, metadata: Sequence[tuple[str, str]], session: str
) -> str | None:
    """On a new connection: health Check, CreateSession, SaveState, LoadState.
    None if all worked, else what failed."""
    md = list(metadata)
    channel = endpoint.channel()
    try:
        health = health_pb2_grpc.HealthStub(channel)
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        step = "health Check"
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=5.0).status
        if status != health_pb2.HealthCheckResponse.SERVING:
            return f"health status {status}"
        step = "CreateSession"
        session_id = f"{session}-{time.monotonic_ns()}"
        create = session_pb2.CreateSessionRequest(session_id=session_id)
        sessions.CreateSession(create, timeout=5.0, metadata=md)
        step = "SaveState"
        save = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=b"fresh")
        checkpoints.SaveState(save, timeout=5.0, metadata=md)
        step = "LoadState"
        load = checkpoint_pb2.LoadStateRequest(session_id=session_id)
        data = checkpoints.LoadState(load, timeout=5.0, metadata=md).data
        return None if data == b"fresh" else f"LoadState returned {data[:20]!r}"
    except grpc.RpcError as exc:
        return f"{step}: {_code(exc)} {exc.details() if hasattr(exc, 'details') else exc}"
    finally:
        channel.close()


@dataclass
class GoodReport:
    calls: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies, 0.99) * 1000

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 0.50) * 1000

    def summary(self) -> str:
        worst = max(self.latencies, default=0.0) * 1000
        return (
            f"good client: {self.calls} calls, {len(self.errors)} errors, "
            f"p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, max {worst:.1f} ms"
        )


class GoodClient:
    """The well-behaved client that runs alongside each attack (module doc).

    ``start()`` creates its session (before the attack), then the thread
    alternates a health Check and a 1 KiB SaveState, 10 ms apart, until
    ``stop()``, which returns the `GoodReport`.
    """

    def __init__(self, endpoint: Endpoint, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.endpoint = endpoint
        self.metadata = list(metadata)
        self.report = GoodReport()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="good-client", daemon=True)
        self._channel = endpoint.channel()
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(self._channel)
        self.session_id = f"good-{time.monotonic_ns()}"
        self._t0 = time.monotonic()

    def start(self) -> GoodClient:
        sessions = session_pb2_grpc.SessionServiceStub(self._channel)
        request = session_pb2.CreateSessionRequest(session_id=self.session_id)
        sessions.CreateSession(request, timeout=5.0, metadata=self.metadata)
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> GoodReport:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._channel.close()
        return self.report

    def __enter__(self) -> GoodClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _timed(self, name: str, call: Callable[[], Any]) -> None:
        start = time.monotonic()
        try:
            call()
        except grpc.RpcError as exc:
            elapsed = time.monotonic() - start
            details = exc.details() if hasattr(exc, "details") else str(exc)
            self.report.errors.append(
                f"{name} at +{start - self._t0:.1f}s: {_code(exc)} {details!r} after {elapsed:.2f}s"
            )
            self.report.latencies.append(elapsed)
        else:
            self.report.latencies.append(time.monotonic() - start)
        self.report.calls += 1

    def _run(self) -> None:
        data = os.urandom(512).hex().encode()  # 1 KiB
        check = health_pb2.HealthCheckRequest()
        while not self._stop.is_set():
            self._timed("health", lambda: self._health.Check(check, timeout=HEALTH_DEADLINE))
            save = checkpoint_pb2.SaveStateRequest(session_id=self.session_id, data=data)
            self._timed(
                "save",
                lambda save=save: self._checkpoints.SaveState(
                    save, timeout=SAVE_DEADLINE, metadata=self.metadata
                ),
            )
            self._stop.wait(0.01)


# --- the verdict ---------------------------------------------------------------------


@dataclass
class Verdict:
    """A case's checks and observations; `finish` adds the after-case checks,
    prints everything and fails listing every broken check."""

    case: str
    daemon: Daemon
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log_offset: int = 0
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.log_offset = self.daemon.log_size()

    def note(self, text: str) -> None:
        self.notes.append(text)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, bool(ok), detail))
        return bool(ok)

    def good_client(self, report: GoodReport) -> None:
        self.note(report.summary())
        errors = report.errors
        shown = "; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else "")
        self.check("good client: 0 errors", not errors, shown)

    def rss(self, sampler: Sampler) -> None:
        limit = self.daemon.rss_limit
        self.check(
            "RSS within idle + max_inflight_bytes + RSS_SLACK",
            sampler.peak_rss <= limit,
            f"peak {sampler.peak_rss / MIB:.0f} MiB, limit {limit / MIB:.0f} MiB "
            f"(idle {self.daemon.baseline_rss / MIB:.0f} MiB)",
        )

    def finish(self, *, clean_log: bool = False) -> None:
        """After the attack is closed: descriptors back, RSS back, a fresh call
        works, the daemon alive; then print and assert. What the daemon logged
        at ERROR during the case is noted, and is a failed check only where
        the case requires a clean log (``clean_log``)."""
        daemon = self.daemon
        deadline = time.monotonic() + RELEASE_SECONDS
        fds = daemon.fds()[1]
        while fds > daemon.baseline_fds + FD_SLACK and time.monotonic() < deadline:
            time.sleep(0.1)
            fds = daemon.fds()[1]
        self.check("daemon alive", daemon.alive, f"exit code {daemon.proc.returncode}")
        self.check(
            "descriptors back near baseline",
            fds <= daemon.baseline_fds + FD_SLACK,
            f"{fds} non-data fds, baseline {daemon.baseline_fds} (+{FD_SLACK} allowed)",
        )
        rss = daemon.rss()
        self.check(
            "RSS back within bound",
            rss <= daemon.rss_limit,
            f"{rss / MIB:.0f} MiB after, limit {daemon.rss_limit / MIB:.0f} MiB",
        )
        error = "the daemon died"
        if daemon.alive:
            error = fresh_call_error(daemon.endpoint, daemon.metadata(), "fresh")
        self.check("a fresh call succeeds", error is None, error or "")
        logged = daemon.errors_since(self.log_offset)
        detail = f"{len(logged)} lines, first: {logged[0]}" if logged else ""
        if clean_log:
            self.check("no ERROR logged", not logged, detail)
        elif logged:
            self.note(f"daemon logged at ERROR: {detail}")
        self.note(f"case took {time.monotonic() - self.started:.1f}s")
        self.report()
        failed = [f"{name}: {detail}" for name, ok, detail in self.checks if not ok]
        assert not failed, f"{self.case}:\n  " + "\n  ".join(failed)

    def report(self) -> None:
        print(f"\n=== {self.case} ===")
        for text in self.notes:
            print(f"  {text}")
        for name, ok, detail in self.checks:
            print(f"  [{'ok' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}")


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@contextlib.contextmanager
def raised_nofile(minimum: int) -> Any:
    """Raise this process's soft RLIMIT_NOFILE to ``minimum`` (if the hard limit allows)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(max(soft, minimum), hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
