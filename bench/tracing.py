"""What OpenTelemetry tracing costs a save: sequential SaveState with tracing off and on.

Three `stratad serve` daemons (durability `fsync`, the default) run side by
side:

- ``off``: tracing off (the OpenTelemetry packages are not even imported);
- ``otlp, ratio 1``: ``--tracing otlp``, every call traced (a SERVER span
  and its journal, commit, fsync and object spans) and exported in batches;
- ``otlp, ratio 0``: ``--tracing otlp --trace-sample-ratio 0``, the
  interceptor and hooks run but no span is recorded.

The spans go to an OTLP/gRPC receiver in this process (the collector's
TraceService, counting what arrives), so exporting is real work on the same
2 cores. One client saves a 3 KB state (different each time) sequentially;
rounds alternate between the daemons and the table reports, per daemon, the
median and p99 of every call, the overhead of the median over ``off``, and
the daemon's CPU time per call (all its threads, the span exporter's
included: the figure that does not depend on what else the machine runs).

Usage: python bench/tracing.py [--quick] [--calls N] [--rounds R]
(needs the otel extra: pip install -e '.[otel]').
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import daemon_process
from _report import fmt_time, machine_facts, markdown_table, median, percentile, write_section

import stratad

STATE_BYTES = 3_000
HEADING = "## Tracing overhead (bench/tracing.py)"


class CountingReceiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP trace receiver that counts the spans it is sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans = 0

    def Export(self, request: Any, context: Any) -> Any:
        count = sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
        with self._lock:
            self.spans += count
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.contextmanager
def receiver() -> Iterator[tuple[CountingReceiver, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = CountingReceiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(0)


def state(i: int) -> bytes:
    head = f'{{"step": {i}, "notes": "'.encode()
    return head + b"x" * (STATE_BYTES - len(head) - 2) + b'"}'


def save_round(client: stratad.Client, session: str, start: int, calls: int) -> list[float]:
    seconds = []
    for i in range(start, start + calls):
        data = state(i)
        began = time.perf_counter()
        client.save_state(session, data)
        seconds.append(time.perf_counter() - began)
    return seconds


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few calls, for a smoke run")
    parser.add_argument("--calls", type=int, default=100, help="calls per round and daemon")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    calls, rounds = (50, 2) if args.quick else (args.calls, args.rounds)

    with receiver() as (collector, port), tempfile.TemporaryDirectory() as tmp:
        endpoint = f"http://127.0.0.1:{port}"
        modes = {
            "off": [],
            "otlp, ratio 1": ["--tracing", "otlp", "--otlp-endpoint", endpoint],
            "otlp, ratio 0": [
                *("--tracing", "otlp", "--otlp-endpoint", endpoint),
                *("--trace-sample-ratio", "0"),
            ],
        }
        with contextlib.ExitStack() as stack:
            clients, pids = {}, {}
            for n, (mode, extra) in enumerate(modes.items()):
                address, proc = stack.enter_context(daemon_process(Path(tmp) / f"d{n}", *extra))
                client = stack.enter_context(stratad.Client(address))
                client.create_session("bench")
                save_round(client, "bench", 0, 20)  # warm up: channel, code paths
                clients[mode], pids[mode] = client, proc.pid
            results: dict[str, list[float]] = {mode: [] for mode in modes}
            cpu = dict.fromkeys(modes, 0.0)
            for r in range(rounds):
                for mode, client in clients.items():
                    before = cpu_seconds(pids[mode])
                    results[mode] += save_round(client, "bench", 20 + r * calls, calls)
                    # Includes the export thread's work for spans of this round
                    # still batched when it ends: attributed to the next round.
                    cpu[mode] += cpu_seconds(pids[mode]) - before
        exported = collector.spans  # the daemons flushed their batches as they stopped

    base = median(results["off"])
    base_cpu = cpu["off"] / len(results["off"])
    rows = []
    for mode, seconds in results.items():
        mid = median(seconds)
        per_call_cpu = cpu[mode] / len(seconds)
        overhead = "" if mode == "off" else f"{(mid - base) * 1e6:+.0f} µs ({mid / base - 1:+.0%})"
        cpu_overhead = "" if mode == "off" else f"{(per_call_cpu - base_cpu) * 1e6:+.0f} µs"
        rows.append(
            [
                mode,
                fmt_time(mid),
                fmt_time(percentile(seconds, 99)),
                overhead,
                fmt_time(per_call_cpu),
                cpu_overhead,
            ]
        )
    facts = (
        f"{machine_facts()}. `python bench/tracing.py`: {rounds} rounds x {calls} sequential "
        f"SaveState of {STATE_BYTES} B per daemon, durability fsync, three daemons side by "
        "side (tracing off, otlp ratio 1, otlp ratio 0) in alternating rounds; spans go to "
        "an OTLP receiver in the benchmark process, on the same cores."
    )
    headers = ["tracing", "median per call", "p99", "median overhead", "daemon CPU per call"]
    table = markdown_table([*headers, "CPU overhead"], rows)
    footer = (
        f"Load average after the run: {os.getloadavg()[0]:.1f}. Spans exported to the "
        f"receiver: {exported}. What it means: "
        "[observability.md](observability.md#what-it-costs)."
    )
    print(facts, table, footer, sep="\n\n")
    if not args.quick:
        write_section(HEADING, "\n\n".join([HEADING, facts, table, footer]) + "\n")


if __name__ == "__main__":
    main()
