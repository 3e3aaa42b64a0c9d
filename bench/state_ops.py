"""Structured session state: mutation throughput, BuildContext latency, disk use with compaction.

(a) Mutation RPCs/s with 16 concurrent clients (one grpc.aio channel each):
    RecordDecision, UpdateFluid and UpdateTaskStatus, each on 16 sessions (one
    per client) and on one session shared by all 16, beside a bare gRPC echo
    server answering the same request bytes in the same run; and the same RPCs
    on a second daemon with durability `interval`, to show what the fsync
    before each answer costs. Rounds are interleaved (echo, then each RPC) and
    the median round is reported.
(b) BuildContext latency (default budget, 2,000 tokens) on a session holding
    10,000 decisions, sequential calls from one client, beside GetCognitiveStats
    and the echo round trip.
(c) Disk bytes after 100,000 decisions (16 clients, one session) with the
    daemon's journal compaction, and the time a restart takes to replay them.

stratad runs as a daemon subprocess with durability `fsync` (every
acknowledged update is on disk) unless a row says otherwise.

Usage: python bench/state_ops.py [--quick]   (--quick: small sizes, no doc update)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import daemon, echo_server
from _report import (
    DOC,
    disk_usage,
    fmt_bytes,
    fmt_time,
    machine_facts,
    markdown_table,
    median,
    percentile,
    write_section,
)

from stratad.api.v1 import (
    cognitive_pb2,
    cognitive_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from stratad.store.journal import Record

HEADING = "## Structured state (bench/state_ops.py)"
#: No metrics endpoint: its fixed default port may be taken by another daemon.
DAEMON_ARGS = ("--metrics-listen", "off")
CLIENTS = 16
ROUNDS = 5
TARGET_RATIO = 0.6
INTERVAL = " (durability interval)"
STATUSES = (
    task_pb2.TASK_STATUS_PENDING,
    task_pb2.TASK_STATUS_IN_PROGRESS,
    task_pb2.TASK_STATUS_COMPLETED,
    task_pb2.TASK_STATUS_FAILED,
)


# -- helpers ---------------------------------------------------------------------------------


@dataclass
class Run:
    name: str
    calls: int
    seconds: float
    latencies: list[float]

    @property
    def throughput(self) -> float:
        return self.calls / self.seconds


async def drive(name: str, per_client: int, one: Callable[[int, int], Awaitable[Any]]) -> Run:
    latencies: list[float] = []

    async def client(c: int) -> None:
        for i in range(per_client):
            started = time.perf_counter()
            await one(c, i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(CLIENTS)))
    return Run(name, CLIENTS * per_client, time.perf_counter() - started, latencies)


def session_of(layout: str, c: int) -> str:
    return "shared" if layout == "shared" else f"s{c}"


async def setup_sessions(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
        for session_id in ["shared", *(f"s{c}" for c in range(CLIENTS))]:
            await sessions.CreateSession(session_pb2.CreateSessionRequest(session_id=session_id))
            await cognitive.Initialize(
                cognitive_pb2.InitializeRequest(session_id=session_id, goal="benchmark")
            )


def decision_request(session_id: str, c: int, i: int) -> cognitive_pb2.RecordDecisionRequest:
    return cognitive_pb2.RecordDecisionRequest(
        session_id=session_id,
        step=i,
        decision=f"client {c} chose option {i % 7} for step {i}",
        rationale="cheapest path that satisfies the constraints",
    )


def fluid_request(session_id: str, c: int, i: int) -> cognitive_pb2.UpdateFluidRequest:
    return cognitive_pb2.UpdateFluidRequest(
        session_id=session_id, progress=(i % 100) / 100, current_sub_goal=f"step {i}", step_count=i
    )


def status_request(session_id: str, c: int, i: int) -> task_pb2.UpdateTaskStatusRequest:
    return task_pb2.UpdateTaskStatusRequest(
        session_id=session_id, task_id=f"task-{c}-{i % 50}", status=STATUSES[i % 4]
    )


BUILDERS: dict[str, Callable[[str, int, int], Any]] = {
    "RecordDecision": decision_request,
    "UpdateFluid": fluid_request,
    "UpdateTaskStatus": status_request,
}


async def echo_run(address: str, per_client: int) -> Run:
    channels = [grpc.aio.insecure_channel(address) for _ in range(CLIENTS)]
    calls = [ch.unary_unary("/bench.Echo/Unary") for ch in channels]
    payload = decision_request("s0", 0, 0).SerializeToString()
    try:
        return await drive(
            "echo server, unary", per_client, lambda c, i: calls[c](payload, timeout=30)
        )
    finally:
        for ch in channels:
            await ch.close()


async def stratad_run(address: str, rpc: str, layout: str, per_client: int) -> Run:
    channels = [grpc.aio.insecure_channel(address) for _ in range(CLIENTS)]
    stubs: list[Any] = []
    for ch in channels:
        cog = cognitive_pb2_grpc.CognitiveStateServiceStub(ch)
        tasks = task_pb2_grpc.TaskServiceStub(ch)
        stubs.append(getattr(tasks if rpc == "UpdateTaskStatus" else cog, rpc))
    build = BUILDERS[rpc]

    async def one(c: int, i: int) -> None:
        await stubs[c](build(session_of(layout, c), c, i), timeout=30)

    sessions = "1 shared session" if layout == "shared" else f"{CLIENTS} sessions"
    try:
        return await drive(f"{rpc}, {sessions}", per_client, one)
    finally:
        for ch in channels:
            await ch.close()


# -- (a) throughput ----------------------------------------------------------------------------


def bench_throughput(per_client: int) -> list[tuple[str, list[Run]]]:
    """Per path, one Run per round; rounds interleave every path.

    Two daemons: the default durability `fsync`, and `interval` (fsync every
    100 ms in the background), which shows what the disk costs.
    """
    runs: dict[str, list[Run]] = {}

    def add(r: Run, suffix: str = "") -> None:
        r.name += suffix
        runs.setdefault(r.name, []).append(r)

    with (
        echo_server() as echo,
        tempfile.TemporaryDirectory() as tmp,
        daemon(Path(tmp) / "fsync", *DAEMON_ARGS) as durable,
        daemon(Path(tmp) / "interval", *DAEMON_ARGS, "--durability", "interval") as relaxed,
    ):
        asyncio.run(setup_sessions(durable))
        asyncio.run(setup_sessions(relaxed))
        for _ in range(ROUNDS):
            add(asyncio.run(echo_run(echo, per_client)))
            for layout in ("own", "shared"):
                for rpc in BUILDERS:
                    add(asyncio.run(stratad_run(durable, rpc, layout, per_client)))
            for rpc in BUILDERS:
                add(asyncio.run(stratad_run(relaxed, rpc, "own", per_client)), INTERVAL)
            line = ", ".join(f"{n} {v[-1].throughput:.0f}/s" for n, v in runs.items())
            print("  round:", line, flush=True)
    return list(runs.items())


def median_run(rounds: Sequence[Run]) -> Run:
    return sorted(rounds, key=lambda r: r.throughput)[len(rounds) // 2]


def throughput_table(
    results: Sequence[tuple[str, list[Run]]],
) -> tuple[str, list[tuple[str, float]]]:
    echo = median_run(dict(results)["echo server, unary"]).throughput
    rows: list[list[str]] = []
    verdicts: list[tuple[str, float]] = []
    for name, rounds in results:
        r = median_run(rounds)
        ratio = r.throughput / echo
        latencies = [x for run in rounds for x in run.latencies]
        is_echo = name.startswith("echo")
        met = "" if is_echo else ("yes" if ratio >= TARGET_RATIO else "**no**")
        rows.append([
            name, str(r.calls), f"{r.throughput:.0f}",
            " / ".join(f"{x.throughput:.0f}" for x in rounds),
            f"{median(latencies) * 1e3:.2f}", f"{percentile(latencies, 0.99) * 1e3:.2f}",
            "1.00x" if is_echo else f"{ratio:.2f}x", met,
        ])  # fmt: skip
        if not is_echo:
            verdicts.append((name, ratio))
    headers = ["path", "calls/round", "calls/s (median)", "rounds", "p50 ms", "p99 ms",
               "vs echo", f">= {TARGET_RATIO}x?"]  # fmt: skip
    return markdown_table(headers, rows), verdicts


# -- (b) BuildContext latency ----------------------------------------------------------------


async def fill_decisions(address: str, session_id: str, total: int) -> float:
    """Record `total` decisions with 16 concurrent clients; returns the seconds it took."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(CLIENTS)]
    stubs = [cognitive_pb2_grpc.CognitiveStateServiceStub(ch) for ch in channels]
    per_client = total // CLIENTS

    async def one(c: int, i: int) -> None:
        await stubs[c].RecordDecision(decision_request(session_id, c, i), timeout=60)

    try:
        return (await drive("fill", per_client, one)).seconds
    finally:
        for ch in channels:
            await ch.close()


async def timed_calls(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        out.append(time.perf_counter() - started)
    return out


def bench_build_context(decisions: int, samples: int) -> list[list[str]]:
    rows = []
    with (
        echo_server() as echo,
        tempfile.TemporaryDirectory() as tmp,
        daemon(Path(tmp) / "data", *DAEMON_ARGS) as address,
    ):

        async def run() -> dict[str, Any]:
            async with grpc.aio.insecure_channel(address) as channel:
                sessions = session_pb2_grpc.SessionServiceStub(channel)
                cog = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
                await sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="big"))
                await cog.Initialize(cognitive_pb2.InitializeRequest(
                    session_id="big", goal="Build a user management API",
                    constraints=["Use PostgreSQL", "REST only"],
                    success_criteria=["CRUD endpoints", "Auth middleware"],
                ))  # fmt: skip
                await fill_decisions(address, "big", decisions)
                build = cognitive_pb2.BuildContextRequest(session_id="big")
                whole = cognitive_pb2.BuildContextRequest(session_id="big", max_tokens=1 << 20)
                stats = cognitive_pb2.GetCognitiveStatsRequest(session_id="big")
                first = await cog.BuildContext(build)
                return {
                    "built": first,
                    "build": await timed_calls(lambda: cog.BuildContext(build), samples),
                    "whole": await timed_calls(lambda: cog.BuildContext(whole), 5),
                    "stats": await timed_calls(lambda: cog.GetCognitiveStats(stats), samples),
                    "count": (await cog.GetCognitiveStats(stats)).decisions_count,
                }

        got = asyncio.run(run())

        async def echo_latency() -> list[float]:
            async with grpc.aio.insecure_channel(echo) as channel:
                call = channel.unary_unary("/bench.Echo/Unary")
                return await timed_calls(lambda: call(b"x" * 64), samples)

        echo_times = asyncio.run(echo_latency())
    built = got["built"]
    note = (f"{built.estimated_tokens} tokens, {built.omitted_items} of "
            f"{got['count']} items left out")  # fmt: skip
    for name, times, what in (
        (f"BuildContext (2,000 tokens), {got['count']:,} decisions", got["build"], note),
        (f"BuildContext (whole log, no truncation), {got['count']:,} decisions", got["whole"],
         "every decision rendered"),
        (f"GetCognitiveStats, {got['count']:,} decisions", got["stats"], ""),
        ("echo server round trip", echo_times, "transport floor"),
    ):  # fmt: skip
        rows.append([name, str(len(times)), fmt_time(median(times)),
                     fmt_time(percentile(times, 0.99)), what])  # fmt: skip
    return rows


# -- (c) disk use with compaction ------------------------------------------------------------------


def bench_disk(decisions: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        with daemon(data, *DAEMON_ARGS) as address:

            async def run() -> float:
                async with grpc.aio.insecure_channel(address) as channel:
                    sessions = session_pb2_grpc.SessionServiceStub(channel)
                    cog = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
                    await sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="big"))
                    await cog.Initialize(
                        cognitive_pb2.InitializeRequest(session_id="big", goal="g")
                    )
                return await fill_decisions(address, "big", decisions)

            seconds = asyncio.run(run())
            time.sleep(1.0)  # let a pending compaction (background tick) finish
            journal = data / "tenants" / "default" / "sessions" / "big" / "journal"
            journal_bytes = journal.stat().st_size
            apparent, allocated = disk_usage(data)
        record = len(typical_record(decision_request("big", 15, decisions // CLIENTS - 1)))
        started = time.perf_counter()
        with daemon(data, *DAEMON_ARGS) as address:
            restart = time.perf_counter() - started

            async def count() -> int:
                async with grpc.aio.insecure_channel(address) as channel:
                    cog = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
                    stats = cognitive_pb2.GetCognitiveStatsRequest(session_id="big")
                    return int((await cog.GetCognitiveStats(stats)).decisions_count)

            recovered = asyncio.run(count())
    return {
        "decisions": decisions, "seconds": seconds, "journal": journal_bytes,
        "apparent": apparent, "allocated": allocated, "uncompacted": record * decisions,
        "restart": restart, "recovered": recovered,
    }  # fmt: skip


def typical_record(request: cognitive_pb2.RecordDecisionRequest) -> bytes:
    """The journal record a RecordDecision appends (as domain/cognitive.py writes it)."""
    at = time.time()
    entry = {"step": request.step, "decision": request.decision,
             "rationale": request.rationale, "timestamp": at}  # fmt: skip
    return Record("cognitive.decision", {"v": 123_456, "at": at, "entry": entry}).encode()


def disk_table(d: dict[str, Any]) -> str:
    rows = [
        ["decisions recorded (16 clients, 1 session)", f"{d['decisions']:,}"],
        ["time to record them", f"{d['seconds']:.1f} s ({d['decisions'] / d['seconds']:.0f}/s)"],
        ["session journal after compaction", fmt_bytes(d["journal"])],
        ["whole data directory (apparent / allocated)",
         f"{fmt_bytes(d['apparent'])} / {fmt_bytes(d['allocated'])}"],
        ["per decision on disk", f"{d['apparent'] / d['decisions']:.0f} B"],
        ["journal without compaction (estimate: records appended)", fmt_bytes(d["uncompacted"])],
        ["restart (replay) until SERVING", f"{d['restart']:.2f} s"],
        ["decisions after the restart", f"{d['recovered']:,}"],
    ]  # fmt: skip
    return markdown_table(["measure", "value"], rows)


def explain(durable: Sequence[float], relaxed: Sequence[float]) -> str:
    return (
        "Where the time goes: an acknowledged update waits for its journal's fsync; the "
        "group committer shares one fsync (for many journals, one syncfs(2) of the whole "
        "filesystem) among all updates that arrived meanwhile, so with 16 clients each keeping "
        "one call in flight, throughput is at most 16 updates per fsync round trip, and on "
        "this shared machine other jobs keep the disk busy. Without that wait (durability "
        f"`interval`) the same RPCs reach {median(relaxed):.2f}x the echo baseline (median "
        f"of the rows), against {median(durable):.2f}x with `fsync`. The daemon beats the "
        "echo server because its port is served by the native front door (docs/design.md): "
        "HTTP/2 and gRPC framing in Rust, off the GIL, where the echo server is a grpc.aio "
        "server paying that framing in Python; what the daemon spends in Python per update "
        "is the interceptors, the servicer and the journal append (the structured-state "
        "logic itself is 40-70 µs per update, in-process). Behind grpc.aio "
        "(`front = python`) the same RPCs measured 0.49-0.55x (2026-11-25). A single "
        "session shared by all clients needs one "
        "fdatasync per batch instead of a syncfs, which is why it is often faster than 16 "
        "sessions here. Each update is answered from the committer thread as soon as its "
        "fsync returns, not after the event loop has resumed the call (docs/design.md); "
        "before that change the `fsync` rows measured 1.01-1.36x (2026-11-26, one run)."
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; do not update the doc")
    args = parser.parse_args(argv)
    per_client = 20 if args.quick else 100
    context_decisions = 1_600 if args.quick else 10_000
    disk_decisions = 8_000 if args.quick else 100_000
    samples = 50 if args.quick else 300

    print(f"(a) mutation throughput, {CLIENTS} clients x {per_client} calls, {ROUNDS} rounds",
          flush=True)  # fmt: skip
    throughput = bench_throughput(per_client)
    table_a, verdicts = throughput_table(throughput)
    print(f"(b) BuildContext on {context_decisions} decisions", flush=True)
    rows_b = bench_build_context(context_decisions, samples)
    print(f"(c) disk after {disk_decisions} decisions", flush=True)
    disk = bench_disk(disk_decisions)

    durable = [r for name, r in verdicts if INTERVAL not in name]
    relaxed = [r for name, r in verdicts if INTERVAL in name]
    section = "\n".join([
        HEADING, "",
        f"Command: `python bench/state_ops.py`. Measured {machine_facts()}.",
        "stratad runs as a daemon subprocess with durability `fsync` (every acknowledged",
        "update is on disk before its answer); the echo server is a bare grpc.aio server",
        "answering the same request bytes with no work, started in the same run.", "",
        f"### (a) Mutation RPCs/s, {CLIENTS} concurrent clients", "",
        f"Each client has its own channel and keeps one call in flight; {ROUNDS} interleaved",
        "rounds, the median round reported (all rounds listed). \"16 sessions\": one session",
        "per client; \"1 shared session\": all 16 update the same session (its lock and",
        "journal are shared; group commit still gives one fsync per batch). Rows marked",
        "\"durability interval\" come from a second daemon that fsyncs in the background every",
        "100 ms instead of before each answer.", "",
        table_a, "",
        f"Target: every mutation RPC >= {TARGET_RATIO}x the echo baseline. With durability",
        f"`fsync`: {'met' if min(durable) >= TARGET_RATIO else 'NOT met'} (lowest "
        f"{min(durable):.2f}x, highest {max(durable):.2f}x); with `interval`: "
        f"{'met' if min(relaxed) >= TARGET_RATIO else 'NOT met'} (lowest {min(relaxed):.2f}x).",
        "", explain(durable, relaxed), "",
        "### (b) BuildContext latency", "",
        f"Sequential calls from one client on a session with {context_decisions:,} decisions.",
        "BuildContext walks the decision log newest first only until the budget is full, so",
        "its cost does not grow with the log; rendering the whole log is shown for contrast.",
        "",
        markdown_table(["call", "samples", "p50", "p99", "note"], rows_b), "",
        "### (c) Disk use with journal compaction", "",
        "A session journal is rewritten as one snapshot record when it outgrows 128 KiB and",
        "twice its last snapshot, so disk use stays within a small multiple of the",
        "live state instead of growing with every update. Measured while the daemon runs:",
        "the open journal's preallocated zeros (at most 1/8 of it; docs/storage.md) count.", "",
        disk_table(disk), "",
    ])  # fmt: skip
    print(section)
    if not args.quick:
        write_section(HEADING, section)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
