"""Who should serve gRPC: grpc.aio, a second Python process per core, or the native front door?

The comparison behind the choice of how to get past Python gRPC's own cost.
One run measures, with the same 16-client unary load (bench/checkpoints.py's
(b): 8 KB states, one call in flight per client):

- the bare grpc.aio echo server, one process (the "transport ceiling" the
  other benchmarks compare with);
- two echo processes sharing the port (SO_REUSEPORT): the best a daemon
  made of one Python gRPC server per core could do, since each process pays
  the same grpc.aio cost per call;
- stratad SaveState with ``front = python`` (grpc.aio serves the port);
- stratad SaveState with ``front = native`` (rust/stratad-front serves it);
- the same over the daemon's unix socket (``listen_unix``), whose header
  blocks pass the front door's relay (rust/stratad-front/src/unix.rs).

Besides calls/s it reports the CPU time each side spends per call (server:
the daemon's or echo processes' user+system time; client: this process's),
which is what decides throughput on a machine where clients and daemon share
the cores. Run: ``python bench/front.py`` (``--quick`` for a smoke run that
does not touch docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import resource
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checkpoints as cb
from _daemon import daemon_process, free_port, process
from _report import machine_facts, markdown_table, median, percentile, write_section

import stratad

HEADING = "## Who serves gRPC (bench/front.py)"
CLIENTS = cb.CLIENTS
ROUNDS = 5


@dataclass
class Row:
    name: str
    rates: list[float]
    server_us: list[float]
    client_us: list[float]
    latencies: list[float]

    @property
    def rate(self) -> float:
        return median(self.rates)


def _cpu_seconds(pids: Sequence[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(
    name: str, pids: Sequence[int], run: Callable[[], Awaitable[cb.ConcurrencyResult]]
) -> Row:
    row = Row(name, [], [], [], [])
    asyncio.run(run())  # warm-up round: connections, caches
    for _ in range(ROUNDS):
        server0, client0 = _cpu_seconds(pids), _own_cpu()
        result = asyncio.run(run())
        server1, client1 = _cpu_seconds(pids), _own_cpu()
        row.rates.append(result.throughput)
        row.server_us.append((server1 - server0) / result.calls * 1e6)
        row.client_us.append((client1 - client0) / result.calls * 1e6)
        row.latencies.extend(result.latencies)
    print(f"  {name}: {row.rate:.0f}/s", flush=True)
    return row


def echo_run(address: str, per_client: int) -> Callable[[], Awaitable[cb.ConcurrencyResult]]:
    return lambda: cb.echo_unary(address, per_client)


def stratad_run(address: str, per_client: int) -> Callable[[], Awaitable[cb.ConcurrencyResult]]:
    rounds = itertools.count()

    async def run() -> cb.ConcurrencyResult:
        # New sessions and new states every round: nothing deduplicates
        # against an earlier round (as in bench/checkpoints.py's one round).
        first = next(rounds) * per_client
        tag = uuid.uuid4().hex[:8]
        clients = [stratad.AsyncClient(address, chunked_uploads=False) for _ in range(CLIENTS)]
        for c, client in enumerate(clients):
            await client.create_session(f"{tag}-{c}")

        async def one(c: int, i: int) -> None:
            await clients[c].save_state(f"{tag}-{c}", cb.eight_kb_state(c, first + i))

        try:
            return await cb.drive("save", per_client, one)
        finally:
            for client in clients:
                await client.close()

    return run


@contextlib.contextmanager
def echo_processes(count: int) -> Iterator[tuple[str, list[int]]]:
    """``count`` echo servers on one port (SO_REUSEPORT when more than one)."""
    address = f"127.0.0.1:{free_port()}"
    script = str(Path(__file__).resolve().parent / "_echo.py")
    extra = ["--reuseport"] if count > 1 else []
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(process([sys.executable, script, address, *extra], address))
            for _ in range(count)
        ]
        yield address, [p.pid for p in procs]


def bench(per_client: int) -> list[Row]:
    rows = []
    with echo_processes(1) as (address, pids):
        rows.append(
            measure("echo server (grpc.aio), 1 process", pids, echo_run(address, per_client))
        )
    with echo_processes(2) as (address, pids):
        rows.append(
            measure(
                "echo server (grpc.aio), 2 processes, one port", pids, echo_run(address, per_client)
            )
        )
    for front in ("python", "native"):
        with (
            tempfile.TemporaryDirectory() as tmp,
            daemon_process(Path(tmp) / "data", "--front", front) as (address, proc),
        ):
            rows.append(
                measure(
                    f"stratad SaveState, front = {front}",
                    [proc.pid],
                    stratad_run(address, per_client),
                )
            )
    with tempfile.TemporaryDirectory() as tmp:
        unix = f"unix:{tmp}/stratad.sock"
        with daemon_process(Path(tmp) / "data", "--listen-unix", unix) as (_, proc):
            rows.append(
                measure(
                    "stratad SaveState, front = native, unix socket",
                    [proc.pid],
                    stratad_run(unix, per_client),
                )
            )
    return rows


def table(rows: Sequence[Row]) -> str:
    echo = rows[0].rate
    body = []
    for row in rows:
        body.append([
            row.name,
            f"{row.rate:.0f}",
            " / ".join(f"{r:.0f}" for r in row.rates),
            f"{median(row.server_us):.0f}",
            f"{median(row.client_us):.0f}",
            f"{percentile(row.latencies, 0.5) * 1e3:.2f}",
            f"{percentile(row.latencies, 0.99) * 1e3:.2f}",
            f"{row.rate / echo:.2f}x",
        ])  # fmt: skip
    headers = ["server", "calls/s (median)", "rounds", "server CPU µs/call",
               "client CPU µs/call", "p50 ms", "p99 ms", "vs 1 echo process"]  # fmt: skip
    return markdown_table(headers, body)


def bound_of_python_processes(rows: Sequence[Row]) -> str:
    """What one grpc.aio daemon process per core could reach at best here."""
    named = {r.name: r for r in rows}
    python = named["stratad SaveState, front = python"]
    cores = os.cpu_count() or 1
    per_call = median(python.server_us) + median(python.client_us)
    bound = cores * 1e6 / per_call
    echo = rows[0].rate
    return (
        f"A daemon of one grpc.aio process per core pays the `front = python` "
        f"server cost on every call, {median(python.server_us):.0f} µs, in whichever "
        f"process serves it; with the clients' {median(python.client_us):.0f} µs on the "
        f"same {cores} cores, all cores busy would give at most {bound:.0f} calls/s "
        f"({bound / echo:.2f}x the echo baseline), before the cost of sharing sessions "
        f"between processes (locks, journals and caches per session would need a "
        f"cross-process owner). The second echo row shows that adding a process does "
        f"not add a core."
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run; do not update the doc")
    args = parser.parse_args(argv)
    per_client = 20 if args.quick else 200
    rows = bench(per_client)
    section = "\n".join([
        HEADING, "",
        f"Command: `python bench/front.py`. Measured {machine_facts()}.",
        f"{CLIENTS} clients in this process (grpc.aio channels, one call in flight each),",
        f"8 KB requests; {ROUNDS} rounds of {CLIENTS * per_client} calls after a warm-up round,",
        "the median round reported. stratad runs with durability `fsync`.", "",
        table(rows), "",
        bound_of_python_processes(rows), "",
        CONCLUSION,
    ])  # fmt: skip
    print(section)
    if not args.quick:
        write_section(HEADING, section)


CONCLUSION = """\
The choice: the native front door (rust/stratad-front, docs/design.md).
It takes HTTP/2 and gRPC framing off the GIL, which is where a grpc.aio
server spends most of its CPU per call, while the daemon keeps one process,
one store and one set of handlers: the same servicers and interceptors run
on the event loop, fed in batches. It serves every listener by default
(`front = auto`): TCP, TLS, mTLS and unix sockets."""


if __name__ == "__main__":
    main()
