"""Load test a stratad daemon: open- or closed-loop SaveState, SaveStates or LoadState traffic.

Point it at any daemon (`--address HOST:PORT`) or let it start one in a temporary
data directory (`--spawn`, the default without --address; then it also samples the
daemon's RSS every second). Open loop (`--mode open`) issues `--rate` requests per
second on a fixed schedule whatever the daemon does, and measures each latency from
the request's *scheduled* send time, so a stalled daemon shows up as latency instead
of as fewer requests (no coordinated omission); at most `--max-outstanding` requests
are in flight, the rest are dropped and counted. Closed loop (`--mode closed`) runs
`--concurrency` workers that each send the next request when the previous answers.

Prints a summary (throughput, p50/p90/p99/p99.9/max, errors by status code), a
latency histogram and throughput over time; `--json` writes all of it, `--plot` a
PNG (needs matplotlib: `pip install -e '.[bench]'`), `--doc` the "Load soak" section
of docs/benchmarks.md. Usage and examples: docs/load-testing.md.

Usage: python bench/load.py [--address HOST:PORT | --spawn] [--mode open|closed]
       [--rate N] [--concurrency C] [--duration S] [--size BYTES] [--sessions S]
       [--rpc save|saves-stream|load] [--workload random|conversation]
       [--json OUT.json] [--plot OUT.png] [--doc]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import importlib
import io
import itertools
import json
import math
import os
import random
import secrets
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _workload
from _daemon import daemon_process
from _report import DOC, fmt_bytes, machine_facts, markdown_table, write_section

from stratad.api.v1 import (
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)

HEADING = "## Load soak (bench/load.py)"
TENANT_HEADER = "x-stratad-tenant"
# A send that leaves this long after its scheduled time means the client itself
# fell behind (CPU, event loop): reported as "late", its latency still counted
# from the schedule.
LATE_AFTER = 0.010
# The growing conversation: each session cycles through this many consecutive
# steps, so the load stays stationary however long the run (states grow ~500 B/step).
CONVERSATION_STEPS = 32
# RSS counts as flat when the last sample is within this factor of the sample
# taken after the first minute (the first minute is warm-up: caches, allocator).
FLAT_RSS_FACTOR = 1.10
PROGRESS_EVERY = 10  # seconds between progress lines on stderr
CHANNEL_OPTIONS = [
    # Each channel its own TCP connection: by default gRPC shares one subchannel
    # among channels with equal arguments, and "several channels" would be one.
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def now() -> float:
    return time.perf_counter()


def heading(label: str) -> str:
    """The docs/benchmarks.md section of a --doc run: the soak, or a labelled variant."""
    return HEADING if not label else f"## Load soak, {label} (bench/load.py)"


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    address: str | None
    spawn: bool
    mode: str
    rate: float
    concurrency: int
    duration: float
    size: int
    sessions: int
    tenant: str
    rpc: str
    workload: str
    channels: int
    max_outstanding: int
    timeout: float
    keep_last: int
    keep_sessions: bool
    rss_pid: int | None
    daemon_args: tuple[str, ...]
    json_path: Path | None
    plot_path: Path | None
    doc: str | None  # None: no doc; "" the soak section; else a label for another one

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((TENANT_HEADER, self.tenant),) if self.tenant else ()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = p.add_mutually_exclusive_group()
    target.add_argument("--address", help="HOST:PORT of a running daemon")
    target.add_argument(
        "--spawn",
        action="store_true",
        help="start a daemon in a temp dir (default without --address)",
    )
    p.add_argument("--mode", choices=("open", "closed"), default="open")
    p.add_argument("--rate", type=float, default=100.0, help="open loop: requests per second")
    p.add_argument("--concurrency", type=int, default=16, help="closed loop: workers")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    p.add_argument("--size", type=int, default=8192, help="state bytes per save")
    p.add_argument("--sessions", type=int, default=16, help="sessions the requests spread over")
    p.add_argument("--tenant", default="", help="x-stratad-tenant (default: the daemon's)")
    p.add_argument("--rpc", choices=("save", "saves-stream", "load"), default="save")
    p.add_argument("--workload", choices=("random", "conversation"), default="random")
    p.add_argument("--channels", type=int, default=4, help="gRPC channels (TCP connections)")
    p.add_argument("--max-outstanding", type=int, default=1000,
                   help="open loop: requests in flight before new ones are dropped")  # fmt: skip
    p.add_argument("--timeout", type=float, default=30.0, help="deadline per request, seconds")
    p.add_argument("--keep-last", type=int, default=0,
                   help="keep_last retention of the run's sessions (0: keep all)")  # fmt: skip
    p.add_argument("--keep-sessions", action="store_true",
                   help="do not delete the sessions afterwards (--address only)")  # fmt: skip
    p.add_argument("--rss-pid", type=int, help="sample this local daemon's RSS (--address)")
    p.add_argument("--daemon-arg", action="append", default=[], metavar="ARG",
                   help="extra `stratad serve` argument with --spawn, e.g. "
                        "--daemon-arg=--durability=interval (repeatable)")  # fmt: skip
    p.add_argument("--json", type=Path, help="write the full report as JSON")
    p.add_argument("--plot", type=Path, help="write a PNG: throughput, p50/p99 (and RSS)")
    p.add_argument("--doc", nargs="?", const="", metavar="LABEL",
                   help=f"rewrite '{HEADING[3:]}' in docs/benchmarks.md; with LABEL, "
                        "a section 'Load soak, LABEL' of its own")  # fmt: skip
    return p


def parse_args(argv: Sequence[str] | None) -> Config:
    p = build_parser()
    a = p.parse_args(argv)
    if min(a.rate, a.duration, a.concurrency, a.sessions, a.channels, a.max_outstanding) <= 0:
        p.error("--rate, --duration, --concurrency, --sessions, --channels, --max-outstanding > 0")
    if a.plot is not None and (missing := missing_plot_modules()):
        # Now, not after a soak of minutes: `plot` imports them once the run is over.
        p.error(
            f"--plot needs {' and '.join(missing)}, which cannot be imported here: "
            "pip install matplotlib (or pip install -e '.[bench]' in a checkout)"
        )
    return Config(
        address=a.address, spawn=a.address is None, mode=a.mode, rate=a.rate,
        concurrency=a.concurrency, duration=a.duration, size=a.size, sessions=a.sessions,
        tenant=a.tenant, rpc=a.rpc, workload=a.workload, channels=a.channels,
        max_outstanding=a.max_outstanding, timeout=a.timeout, keep_last=a.keep_last,
        keep_sessions=a.keep_sessions, rss_pid=a.rss_pid, daemon_args=tuple(a.daemon_arg),
        json_path=a.json, plot_path=a.plot, doc=a.doc,
    )  # fmt: skip


def missing_plot_modules() -> list[str]:
    """What `plot` imports and this Python cannot: matplotlib, and Pillow
    (``PIL``, which comes with matplotlib) for `save_small_png`."""
    missing = []
    for module, name in (("matplotlib", "matplotlib"), ("PIL", "Pillow")):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(name)
    return missing


# --------------------------------------------------------------------------
# Measuring: a log-bucketed histogram, per-second windows, error counts
# --------------------------------------------------------------------------


class Histogram:
    """HDR-style latency counts in log buckets: 1% relative error from 1 µs up, fixed memory.

    A soak of hours at thousands of requests per second stays at a few hundred
    buckets, where a list of samples would grow without bound.
    """

    FLOOR = 1e-6
    GROWTH = 1.01

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0
        self.sum = 0.0
        self.max = 0.0

    def record(self, seconds: float) -> None:
        ratio = max(seconds, self.FLOOR) / self.FLOOR
        index = math.ceil(math.log(ratio) / math.log(self.GROWTH) - 1e-9)
        self.counts[index] = self.counts.get(index, 0) + 1
        self.total += 1
        self.sum += seconds
        self.max = max(self.max, seconds)

    def merge(self, other: Histogram) -> None:
        for index, count in other.counts.items():
            self.counts[index] = self.counts.get(index, 0) + count
        self.total += other.total
        self.sum += other.sum
        self.max = max(self.max, other.max)

    def upper(self, index: int) -> float:
        return self.FLOOR * self.GROWTH**index

    def percentile(self, q: float) -> float:
        """The upper bound of the bucket holding the q-quantile (never above the max)."""
        if not self.total:
            return math.nan
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return min(self.upper(index), self.max)
        return self.max

    def buckets(self) -> list[tuple[float, int]]:
        """(upper bound in seconds, count) of every non-empty bucket, ascending."""
        return [(self.upper(i), self.counts[i]) for i in sorted(self.counts)]


@dataclass
class Window:
    """One second of the run, by completion time."""

    completed: int = 0
    errors: int = 0
    latency: Histogram = field(default_factory=Histogram)


class Recorder:
    def __init__(self) -> None:
        self.t0 = now()
        self.end = self.t0
        self.latency = Histogram()
        self.windows: dict[int, Window] = {}
        self.errors: collections.Counter[str] = collections.Counter()
        self.scheduled: int | None = None
        self.sent = self.dropped = self.late = 0
        self.max_lag = 0.0
        # Seconds of sending: --duration, or less when a signal stopped the run.
        self.load_seconds = math.inf
        self.stop = asyncio.Event()
        self.cpu: dict[str, float | None] = {}

    def start(self, duration: float) -> None:
        self.t0 = self.end = now()
        self.load_seconds = duration

    def interrupt(self) -> None:
        """SIGINT/SIGTERM: stop sending, answer what is in flight, report; twice: abort."""
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.load_seconds = min(self.load_seconds, now() - self.t0)
        self.stop.set()
        print("stopping: waiting for requests in flight, then reporting", file=sys.stderr)

    def _window(self, t: float) -> Window:
        self.end = max(self.end, t)
        return self.windows.setdefault(int(t - self.t0), Window())

    def on_send(self, scheduled: float) -> None:
        lag = now() - scheduled
        self.sent += 1
        self.late += lag > LATE_AFTER
        self.max_lag = max(self.max_lag, lag)

    def on_ok(self, scheduled: float) -> None:
        t = now()
        window = self._window(t)
        window.completed += 1
        window.latency.record(t - scheduled)
        self.latency.record(t - scheduled)

    def on_error(self, code: str) -> None:
        self._window(now()).errors += 1
        self.errors[code] += 1


# --------------------------------------------------------------------------
# Payloads and the three RPCs
# --------------------------------------------------------------------------


class Payloads:
    """State bytes per session: fresh random bytes, or the growing conversation."""

    def __init__(self, workload: str, size: int, sessions: int) -> None:
        self._rng = random.Random(0)
        self._seq = [0] * sessions
        self._states: list[bytes] = []
        if workload == "conversation":
            first = _workload.step_of_size(size)
            steps = range(first, first + CONVERSATION_STEPS)
            self._states = [_workload.conversation_state(i) for i in steps]
        self.size = size
        self.content_type = "application/json" if self._states else "application/octet-stream"

    def next(self, session: int) -> bytes:
        n = self._seq[session]
        self._seq[session] += 1
        if self._states:
            return self._states[(session + n) % len(self._states)]
        # Fresh bytes every save: nothing dedups or compresses away.
        return self._rng.randbytes(self.size)


class RequestFailed(Exception):
    """A request that ended with a non-OK status (the name of its grpc.StatusCode)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


Send = Callable[[int], Awaitable[None]]


@dataclass
class _Stream:
    call: Any  # grpc.aio.StreamStreamCall
    pending: collections.deque[asyncio.Future[Any]]
    reader: asyncio.Task[None]


async def _read_replies(call: Any, pending: collections.deque[asyncio.Future[Any]]) -> None:
    """Hand each reply to the oldest waiting request; fail the rest when the stream ends."""
    try:
        while (reply := await call.read()) is not grpc.aio.EOF:
            future = pending.popleft()
            if not future.done():  # its sender may have timed out
                future.set_result(reply)
        error = RequestFailed((await call.code()).name)
    except grpc.aio.AioRpcError as e:
        error = RequestFailed(e.code().name)
    while pending:
        future = pending.popleft()
        if not future.done():
            future.set_exception(error)


class StreamLane:
    """One SaveStates stream shared by many senders: replies come back in request order."""

    def __init__(self, stub: Any, cfg: Config) -> None:
        self._stub = stub
        self._cfg = cfg
        self._lock = asyncio.Lock()  # grpc.aio allows one write at a time per call
        self._stream: _Stream | None = None

    def _open(self) -> _Stream:
        # A stream that broke is replaced; its waiting requests already failed.
        if self._stream is None or self._stream.reader.done():
            call = self._stub.SaveStates(metadata=self._cfg.metadata)
            pending: collections.deque[asyncio.Future[Any]] = collections.deque()
            reader = asyncio.create_task(_read_replies(call, pending))
            self._stream = _Stream(call, pending, reader)
        return self._stream

    async def save(self, request: checkpoint_pb2.SaveStateRequest) -> None:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        async with self._lock:
            stream = self._open()
            stream.pending.append(future)
            try:
                await stream.call.write(checkpoint_pb2.SaveStatesRequest(request=request))
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                future.cancel()
                code = (await stream.call.code()).name if stream.call.done() else "UNKNOWN"
                raise RequestFailed(code) from None
        reply = await asyncio.wait_for(future, self._cfg.timeout)
        if reply.HasField("error"):
            raise RequestFailed(CODE_NAMES.get(reply.error.code, str(reply.error.code)))

    async def close(self) -> None:
        if self._stream is not None and not self._stream.reader.done():
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await self._stream.call.done_writing()
            await self._stream.reader


@dataclass
class Target:
    """What the load is sent to: channels, the run's sessions, payloads."""

    cfg: Config
    channels: list[grpc.aio.Channel]
    session_ids: list[str]
    payloads: Payloads

    def checkpoints(self, i: int) -> checkpoint_pb2_grpc.CheckpointServiceStub:
        return checkpoint_pb2_grpc.CheckpointServiceStub(self.channels[i % len(self.channels)])

    def save_request(self, session: int) -> checkpoint_pb2.SaveStateRequest:
        return checkpoint_pb2.SaveStateRequest(
            session_id=self.session_ids[session],
            data=self.payloads.next(session),
            content_type=self.payloads.content_type,
        )


def unary_save(target: Target) -> Send:
    stubs = [target.checkpoints(c) for c in range(len(target.channels))]
    cfg = target.cfg

    async def send(i: int) -> None:
        request = target.save_request(i % cfg.sessions)
        await stubs[i % len(stubs)].SaveState(request, timeout=cfg.timeout, metadata=cfg.metadata)

    return send


def unary_load(target: Target) -> Send:
    stubs = [target.checkpoints(c) for c in range(len(target.channels))]
    cfg = target.cfg

    async def send(i: int) -> None:
        request = checkpoint_pb2.LoadStateRequest(session_id=target.session_ids[i % cfg.sessions])
        await stubs[i % len(stubs)].LoadState(request, timeout=cfg.timeout, metadata=cfg.metadata)

    return send


def stream_save(target: Target, lanes: list[StreamLane]) -> Send:
    lanes += [StreamLane(target.checkpoints(c), target.cfg) for c in range(len(target.channels))]

    async def send(i: int) -> None:
        await lanes[i % len(lanes)].save(target.save_request(i % target.cfg.sessions))

    return send


# --------------------------------------------------------------------------
# Setup, the two loops, RSS sampling
# --------------------------------------------------------------------------


async def setup(target: Target) -> None:
    """Create the run's sessions; for --rpc load, give each one state to load."""
    cfg = target.cfg
    stub = session_pb2_grpc.SessionServiceStub(target.channels[0])
    retention = session_pb2.RetentionPolicy(keep_last=cfg.keep_last) if cfg.keep_last else None
    await asyncio.gather(*(
        stub.CreateSession(session_pb2.CreateSessionRequest(session_id=s, retention=retention),
                           timeout=cfg.timeout, metadata=cfg.metadata)
        for s in target.session_ids
    ))  # fmt: skip
    if cfg.rpc == "load":
        save = target.checkpoints(0).SaveState
        await asyncio.gather(*(
            save(target.save_request(s), timeout=cfg.timeout, metadata=cfg.metadata)
            for s in range(cfg.sessions)
        ))  # fmt: skip


async def teardown(target: Target) -> None:
    """Delete the run's sessions from a daemon that outlives the run."""
    cfg = target.cfg
    if cfg.spawn or cfg.keep_sessions:
        return
    stub = session_pb2_grpc.SessionServiceStub(target.channels[0])
    results = await asyncio.gather(*(
        stub.DeleteSession(session_pb2.DeleteSessionRequest(session_id=s),
                           timeout=cfg.timeout, metadata=cfg.metadata)
        for s in target.session_ids
    ), return_exceptions=True)  # fmt: skip
    failed = sum(isinstance(r, BaseException) for r in results)
    if failed:
        print(f"warning: {failed} of the run's sessions could not be deleted", file=sys.stderr)


async def issue(send: Send, rec: Recorder, i: int, scheduled: float) -> None:
    try:
        await send(i)
    except grpc.aio.AioRpcError as e:
        rec.on_error(e.code().name)
    except RequestFailed as e:
        rec.on_error(e.code)
    except TimeoutError:
        rec.on_error("DEADLINE_EXCEEDED")
    else:
        rec.on_ok(scheduled)


async def open_loop(cfg: Config, send: Send, rec: Recorder) -> None:
    """Request i is due at t0 + i/rate, whether or not earlier ones have answered."""
    total = int(cfg.rate * cfg.duration)
    rec.scheduled = total
    in_flight: set[asyncio.Task[None]] = set()
    for i in range(total):
        due = rec.t0 + i / cfg.rate
        # Always yield, even when behind: completions must get to run, or a
        # backlog would be dropped whole against a cap that never drains.
        await asyncio.sleep(max(0.0, due - now()))
        if rec.stop.is_set():
            break
        if len(in_flight) >= cfg.max_outstanding:
            rec.dropped += 1
            continue
        rec.on_send(due)
        task = asyncio.create_task(issue(send, rec, i, due))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    await asyncio.gather(*in_flight)


async def closed_loop(cfg: Config, send: Send, rec: Recorder) -> None:
    """Each worker sends its next request as soon as the previous one answered."""
    deadline = rec.t0 + cfg.duration
    counter = itertools.count()

    async def worker() -> None:
        while (started := now()) < deadline and not rec.stop.is_set():
            rec.on_send(started)
            await issue(send, rec, next(counter), started)

    await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds a process has used so far (None if unknown)."""
    if pid is None:
        return None
    try:
        # Fields after the ")" that ends the command name start at stat(5)'s
        # field 3, so utime (14) and stime (15) are the 12th and 13th.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(
    before: tuple[float | None, float], after: tuple[float | None, float], rec: Recorder
) -> dict[str, float | None]:
    """CPU used during the load, in % of one core: is the daemon or this client the limit?"""
    seconds = max(now() - rec.t0, 1e-9)
    daemon = None
    if before[0] is not None and after[0] is not None:
        daemon = round((after[0] - before[0]) / seconds * 100, 1)
    return {"daemon_pct": daemon, "client_pct": round((after[1] - before[1]) / seconds * 100, 1)}


RssSample = tuple[float, int, int]  # seconds since the start, VmRSS, RssAnon (bytes)


def read_rss(pid: int) -> tuple[int, int] | None:
    """(VmRSS, RssAnon) of a process in bytes; None once it is gone.

    RssAnon is the heap alone: VmRSS also counts mapped files and libraries,
    so the two tell memory the daemon holds from pages it merely touched.
    """
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    try:
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["RssAnon"].split()[0]) * 1024
    except (KeyError, ValueError, IndexError):
        return None


def progress_line(rec: Recorder, t: int, rss: list[RssSample]) -> str:
    recent = [rec.windows.get(w, Window()) for w in range(t - PROGRESS_EVERY, t)]
    latency = Histogram()
    for w in recent:
        latency.merge(w.latency)
    rate = sum(w.completed for w in recent) / PROGRESS_EVERY
    line = f"{t:>5} s: {rate:.0f} req/s, p99 {fmt_ms(ms(latency.percentile(0.99)))} ms"
    line += f", {sum(rec.errors.values())} errors, {rec.dropped} dropped"
    return line + (f", daemon RSS {fmt_bytes(rss[-1][1])}" if rss else "")


async def monitor(rec: Recorder, pid: int | None, rss: list[RssSample]) -> None:
    """Every second from the start of the load: the daemon's RSS; every 10 s a progress line."""
    tick = 0
    while True:
        if pid and (sample := read_rss(pid)) is not None:
            rss.append((now() - rec.t0, *sample))
        if tick and tick % PROGRESS_EVERY == 0:
            # stderr: a long run shows it is alive without mixing into the tables.
            print(progress_line(rec, tick, rss), file=sys.stderr, flush=True)
        tick += 1
        await asyncio.sleep(max(0.0, rec.t0 + tick - now()))


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------


def make_sender(target: Target, lanes: list[StreamLane]) -> Send:
    if target.cfg.rpc == "load":
        return unary_load(target)
    if target.cfg.rpc == "saves-stream":
        return stream_save(target, lanes)
    return unary_save(target)


async def run(cfg: Config, address: str, pid: int | None) -> tuple[Recorder, list[RssSample]]:
    channels = [grpc.aio.insecure_channel(address, CHANNEL_OPTIONS) for _ in range(cfg.channels)]
    run_id = secrets.token_hex(4)
    session_ids = [f"load-{run_id}-{s}" for s in range(cfg.sessions)]
    target = Target(cfg, channels, session_ids, Payloads(cfg.workload, cfg.size, cfg.sessions))
    rec = Recorder()
    rss: list[RssSample] = []
    lanes: list[StreamLane] = []
    try:
        await setup(target)
        send = make_sender(target, lanes)
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, rec.interrupt)
        rec.start(cfg.duration)
        cpu_before = cpu_seconds(pid), time.process_time()
        monitoring = asyncio.create_task(monitor(rec, pid, rss))
        loop = open_loop if cfg.mode == "open" else closed_loop
        await loop(cfg, send, rec)
        rec.cpu = cpu_share(cpu_before, (cpu_seconds(pid), time.process_time()), rec)
        await asyncio.gather(*(lane.close() for lane in lanes))
        monitoring.cancel()
        await teardown(target)
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))
    return rec, rss


@contextlib.contextmanager
def daemon_under_test(cfg: Config) -> Iterator[tuple[str, int | None]]:
    """(address, pid to sample RSS of or None): the given daemon or a spawned one."""
    if cfg.address is not None:
        yield cfg.address, cfg.rss_pid
        return
    with (
        tempfile.TemporaryDirectory(prefix="stratad-load-") as tmp,
        daemon_process(Path(tmp) / "data", *cfg.daemon_args) as (address, proc),
    ):
        yield address, proc.pid


# --------------------------------------------------------------------------
# The report: a dict (the JSON), tables, a plot, the docs section
# --------------------------------------------------------------------------


def ms(seconds: float) -> float | None:
    return None if math.isnan(seconds) else round(seconds * 1e3, 3)


PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))


def latency_summary(hist: Histogram) -> dict[str, float | None]:
    summary = {name: ms(hist.percentile(q)) for name, q in PERCENTILES}
    summary["max"] = ms(hist.max) if hist.total else None
    summary["mean"] = ms(hist.sum / hist.total) if hist.total else None
    return summary


def window_rows(rec: Recorder) -> list[dict[str, Any]]:
    """Per-second figures; "drain" windows come after the last send, answering stragglers."""
    last = max(rec.windows, default=-1)
    rows = []
    for t in range(last + 1):
        w = rec.windows.get(t, Window())
        rows.append({
            "t": t, "drain": t >= rec.load_seconds, "completed": w.completed, "errors": w.errors,
            "p50_ms": ms(w.latency.percentile(0.5)), "p99_ms": ms(w.latency.percentile(0.99)),
        })  # fmt: skip
    return rows


def rss_summary(samples: list[RssSample], rec: Recorder) -> dict[str, Any] | None:
    if not samples:
        return None
    after_1min = next((rss for t, rss, _ in samples if t >= 60), None)
    end = samples[-1][1]
    # Growth per acknowledged save tells an index that grows with the stored
    # data (about constant bytes per save) from a leak (per request, any RPC).
    saves_after_1min = sum(w.completed for t, w in rec.windows.items() if t >= 60)
    per_save = (end - after_1min) / saves_after_1min if after_1min and saves_after_1min else None
    return {
        "samples": [
            {"t": round(t, 2), "bytes": rss, "anon_bytes": anon} for t, rss, anon in samples
        ],
        "start_bytes": samples[0][1],
        "after_1min_bytes": after_1min,
        "end_bytes": end,
        "end_anon_bytes": samples[-1][2],
        "peak_bytes": max(rss for _, rss, _ in samples),
        "growth_after_1min_pct": (round((end / after_1min - 1) * 100, 1) if after_1min else None),
        "growth_per_request_after_1min_bytes": None if per_save is None else round(per_save),
        "flat": end <= FLAT_RSS_FACTOR * after_1min if after_1min else None,
    }


def config_json(cfg: Config) -> dict[str, Any]:
    keys = ("mode", "rate", "concurrency", "duration", "size", "sessions", "tenant", "rpc",
            "workload", "channels", "max_outstanding", "timeout", "keep_last")  # fmt: skip
    out = {k: getattr(cfg, k) for k in keys}
    out["address"] = cfg.address or "spawned"
    out["daemon_args"] = list(cfg.daemon_args)
    return out


def build_report(cfg: Config, rec: Recorder, rss: list[RssSample]) -> dict[str, Any]:
    elapsed = max(rec.end - rec.t0, 1e-9)
    errors = sum(rec.errors.values())
    return {
        "config": config_json(cfg),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_s": round(rec.load_seconds, 3),
        "elapsed_s": round(elapsed, 3),
        "requests": {
            "scheduled": rec.scheduled,
            "sent": rec.sent,
            "completed": rec.latency.total,
            "errors": errors,
            "dropped": rec.dropped,
            "late": rec.late,
            "max_send_lag_ms": ms(rec.max_lag),
        },
        "throughput_per_s": round(rec.latency.total / elapsed, 2),
        "latency_ms": latency_summary(rec.latency),
        "histogram": [{"le_ms": ms(le), "count": n} for le, n in rec.latency.buckets()],
        "errors_by_code": dict(rec.errors.most_common()),
        "windows": window_rows(rec),
        "rss": rss_summary(rss, rec),
        "interrupted": rec.load_seconds < cfg.duration,
        "cpu_pct_of_one_core": rec.cpu,
        "host": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]},
    }


def fmt_size(n: int) -> str:
    """--size as given: 8192 is "8 KiB", not "8.19 KB"."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def load_shape(cfg: dict[str, Any]) -> str:
    if cfg["mode"] == "open":
        return f"open, {cfg['rate']:g}/s"
    return f"closed, {cfg['concurrency']} workers"


def summary_table(report: dict[str, Any]) -> str:
    cfg, req, lat = report["config"], report["requests"], report["latency_ms"]
    headers = ["load", "rpc", "size", "s", "sent", "completed", "errors", "dropped", "late",
               "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"]  # fmt: skip
    row = [load_shape(cfg), cfg["rpc"], fmt_size(cfg["size"]), f"{report['elapsed_s']:.0f}",
           str(req["sent"]), str(req["completed"]), str(req["errors"]), str(req["dropped"]),
           str(req["late"]), f"{report['throughput_per_s']:.0f}",
           *(fmt_ms(lat[k]) for k in ("p50", "p90", "p99", "p99.9", "max"))]  # fmt: skip
    return markdown_table(headers, [row])


def errors_table(report: dict[str, Any]) -> str:
    rows = [[code, str(n)] for code, n in report["errors_by_code"].items()]
    return markdown_table(["status", "count"], rows) if rows else "Errors: none."


def histogram_table(report: dict[str, Any]) -> str:
    """The log buckets folded into 1-2-5 steps: readable, still log-scaled."""
    bounds = [m * 10.0**e for e in range(-2, 6) for m in (1, 2, 5)]
    total = report["requests"]["completed"] or 1
    rows, seen, i = [], 0, 0
    buckets = report["histogram"]
    for bound in bounds:
        count = 0
        while i < len(buckets) and buckets[i]["le_ms"] <= bound:
            count += buckets[i]["count"]
            i += 1
        seen += count
        if count:
            rows.append([f"<= {bound:g}", str(count), f"{seen / total:.2%}"])
        if i == len(buckets):
            break
    return markdown_table(["latency ms", "count", "cumulative"], rows)


def time_row(label: str, group: list[dict[str, Any]]) -> list[str]:
    rates = [w["completed"] for w in group]
    worst_p99 = max((w["p99_ms"] for w in group if w["p99_ms"] is not None), default=None)
    errors = sum(w["errors"] for w in group)
    mean = sum(rates) / len(rates)
    return [label, f"{mean:.0f}", str(min(rates)), str(max(rates)), str(errors), fmt_ms(worst_p99)]


def time_table(report: dict[str, Any], max_rows: int = 20) -> str:
    """Throughput per 1-second window, folded into at most max_rows rows, then the drain."""
    loaded = [w for w in report["windows"] if not w["drain"]]
    step = max(1, math.ceil(len(loaded) / max_rows))
    rows = []
    for start in range(0, len(loaded), step):
        group = loaded[start : start + step]
        rows.append(time_row(f"{group[0]['t']}-{group[-1]['t'] + 1}", group))
    # After the last send only answers to earlier requests arrive: not a rate.
    drain = [w for w in report["windows"] if w["drain"]]
    if drain:
        rows.append(time_row(f"{drain[0]['t']}-{drain[-1]['t'] + 1} (drain)", drain))
    headers = ["seconds", "req/s (mean)", "min/s", "max/s", "errors", "worst 1-s p99 ms"]
    return markdown_table(headers, rows)


def rss_table(rss: dict[str, Any]) -> str:
    def mb(n: int | None) -> str:
        return "-" if n is None else fmt_bytes(n)

    growth, per_request = rss["growth_after_1min_pct"], rss["growth_per_request_after_1min_bytes"]
    row = [mb(rss["start_bytes"]), mb(rss["after_1min_bytes"]), mb(rss["end_bytes"]),
           mb(rss["end_anon_bytes"]), mb(rss["peak_bytes"]),
           "-" if growth is None else f"{growth:+.1f}%",
           "-" if per_request is None else f"{per_request} B"]  # fmt: skip
    headers = ["start", "after 1 min", "end", "end (anon)", "peak", "end vs 1 min",
               "growth per request after 1 min"]  # fmt: skip
    return markdown_table(headers, [row])


def rss_verdict(rss: dict[str, Any]) -> str:
    if rss["flat"] is None:
        return "The run was shorter than a minute: too short to judge whether RSS stays flat."
    limit = f"{(FLAT_RSS_FACTOR - 1):.0%}"
    if rss["flat"]:
        return f"RSS stayed flat: the end is within {limit} of the figure after the first minute."
    per_request = rss["growth_per_request_after_1min_bytes"]
    return (
        f"RSS did NOT stay flat: it grew more than {limit} after the first minute, "
        f"about {per_request} bytes per completed request."
    )


def machine_line(report: dict[str, Any]) -> str:
    """CPU of both sides and the host's load: on a shared machine, who was busy?"""
    cpu, host = report["cpu_pct_of_one_core"], report["host"]
    daemon = "" if cpu.get("daemon_pct") is None else f"daemon {cpu['daemon_pct']:.0f}%, "
    load = "/".join(f"{x:g}" for x in host["loadavg"])
    return (
        f"CPU during the load, in % of one core: {daemon}this harness {cpu['client_pct']:.0f}%. "
        f"Load average (1/5/15 min) at the end: {load} on {host['cpus']} CPUs."
    )


def print_report(report: dict[str, Any]) -> None:
    if report["interrupted"]:
        print("Interrupted: the figures cover the run until the signal.\n")
    print(summary_table(report), "", machine_line(report), "", errors_table(report), "",
          histogram_table(report), "", time_table(report), sep="\n")  # fmt: skip
    if report["rss"]:
        print("\nDaemon RSS (VmRSS, sampled every second):\n")
        print(rss_table(report["rss"]))
        print(rss_verdict(report["rss"]))


def _plot_throughput(ax: Any, t: list[float], report: dict[str, Any]) -> None:
    windows = report["windows"]
    ax.plot(t, [w["completed"] for w in windows], lw=1, label="completed/s")
    if report["requests"]["errors"]:
        ax.plot(t, [w["errors"] for w in windows], lw=1, color="red", label="errors/s")
    ax.set_ylabel("req/s")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right", fontsize=8)


def _plot_latency(ax: Any, t: list[float], windows: list[dict[str, Any]]) -> None:
    from matplotlib import ticker

    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
        ax.plot(t, [math.nan if w[key] is None else w[key] for w in windows], lw=1, label=label)
    ax.set_yscale("log")
    # 1-2-5 ticks in plain numbers: log scale keeps p50 readable beside p99 spikes.
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_ylabel("latency ms")
    ax.legend(loc="upper right", fontsize=8)


def _plot_rss(ax: Any, samples: list[dict[str, Any]]) -> None:
    t = [s["t"] for s in samples]
    ax.plot(t, [s["bytes"] / 1e6 for s in samples], lw=1, label="VmRSS")
    ax.plot(t, [s["anon_bytes"] / 1e6 for s in samples], lw=1, ls="--", label="anon")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_ylabel("daemon RSS MB")
    ax.set_ylim(bottom=0)


def plot(report: dict[str, Any], path: Path) -> None:
    """Throughput and p50/p99 per second (and RSS when sampled), 900x500 px."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    windows, rss, cfg = report["windows"], report["rss"], report["config"]
    t = [w["t"] + 0.5 for w in windows]  # a window's midpoint
    fig, axes = plt.subplots(3 if rss else 2, 1, figsize=(9, 5), dpi=100, sharex=True)
    _plot_throughput(axes[0], t, report)
    _plot_latency(axes[1], t, windows)
    if rss:
        _plot_rss(axes[2], rss["samples"])
    for ax in axes:  # after this line only answers to earlier requests arrive
        ax.axvline(report["load_s"], color="grey", lw=0.8, ls=":")
    axes[-1].set_xlabel("seconds")
    kept = f"keep_last {cfg['keep_last']}" if cfg["keep_last"] else "no retention"
    title = f"stratad {cfg['rpc']}, {load_shape(cfg)}, {fmt_size(cfg['size'])} {cfg['workload']}"
    fig.suptitle(f"{title} states, {kept}", fontsize=10)
    fig.tight_layout()
    save_small_png(fig, path)
    plt.close(fig)


def save_small_png(fig: Any, path: Path) -> None:
    """A 32-colour palette PNG: line charts look the same at a quarter of the bytes.

    Soak plots are committed under docs/; Pillow comes with matplotlib.
    """
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    buffer.seek(0)
    Image.open(buffer).convert("RGB").quantize(colors=32).save(path, optimize=True)


def describe(cfg: Config) -> str:
    """The run in words, for the docs section."""
    if cfg.mode == "closed":
        shape = f"Closed loop: {cfg.concurrency} workers, each sending its next request "
        shape += "when the previous one answered."
    else:
        shape = f"Open loop: {cfg.rate:g} requests/s on a fixed schedule, "
        shape += "latency from the schedule."
    rpc = {"save": "Unary SaveState", "saves-stream": "SaveStates (one stream per channel)",
           "load": "LoadState"}[cfg.rpc]  # fmt: skip
    what = (f"{fmt_size(cfg.size)} of random bytes (nothing dedups)" if cfg.workload == "random"
            else f"states of the growing conversation from {fmt_size(cfg.size)} up "
                 f"({CONVERSATION_STEPS} steps per session, repeated)")  # fmt: skip
    kept = (f"the sessions keep their last {cfg.keep_last} checkpoints" if cfg.keep_last
            else "the sessions keep every checkpoint (no retention), so the stored data grows "
                 "with every save")  # fmt: skip
    config = f"`{' '.join(cfg.daemon_args)}`" if cfg.daemon_args else "durability fsync"
    daemon = (f"The daemon was spawned by the harness (fresh data directory, {config}); "
              if cfg.spawn else "Against a running daemon; ")  # fmt: skip
    return (
        f"{shape} {rpc} of {what} to {cfg.sessions} sessions over "
        f"{cfg.channels} channels; {kept}. {daemon}client and daemon share the machine's cores."
    )


def doc_section(cfg: Config, report: dict[str, Any], argv: Sequence[str]) -> str:
    lines = [
        heading(cfg.doc or ""), "",
        f"Command: `python bench/load.py {shlex.join(argv)}`. Measured {machine_facts()}.",
        describe(cfg), "How to load-test any daemon, and what the soaks below show: "
        "[load-testing.md](load-testing.md#what-the-soaks-show).", "",
        *(["Interrupted: the figures cover the run until the signal.", ""]
          if report["interrupted"] else []),
        summary_table(report), "", machine_line(report), "", errors_table(report), "",
    ]  # fmt: skip
    if report["rss"]:
        lines += ["Daemon RSS (VmRSS, sampled every second):", "", rss_table(report["rss"]), "",
                  rss_verdict(report["rss"]), ""]  # fmt: skip
    if cfg.plot_path:
        rel = os.path.relpath(cfg.plot_path.resolve(), DOC.parent.resolve())
        lines += [f"![throughput, p50/p99 and daemon RSS per second]({rel})", ""]
    return "\n".join(lines)


def emit(cfg: Config, report: dict[str, Any], argv: Sequence[str]) -> None:
    print_report(report)
    if cfg.json_path:
        cfg.json_path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {cfg.json_path}")
    if cfg.plot_path:
        plot(report, cfg.plot_path)
        print(f"wrote {cfg.plot_path}")
    if cfg.doc is not None:
        write_section(heading(cfg.doc), doc_section(cfg, report, argv))
        print(f"wrote {DOC}")


def exit_on_sigterm() -> None:
    """SIGTERM outside the load exits through the `with` blocks: no orphaned daemon."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(argv)
    exit_on_sigterm()
    with daemon_under_test(cfg) as (address, pid):
        try:
            rec, rss = asyncio.run(run(cfg, address, pid))
        except grpc.aio.AioRpcError as e:
            print(f"error: {address}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
        exit_on_sigterm()  # the event loop's handler left SIG_DFL behind
        # Report before leaving: removing a spawned daemon's data directory
        # after a soak (hundreds of thousands of files) takes minutes.
        emit(cfg, build_report(cfg, rec, rss), argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
