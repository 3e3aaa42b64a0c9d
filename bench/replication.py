"""Replication: save throughput local-only, async and sync, and bytes in object storage.

The growing conversation (the reference workload, bench/_workload.py) saved
step by step through gRPC by one client, fsync on, three daemons in the same
run: replication off, async (shipped every replication_lag_ms) and sync
(acknowledged once in object storage). Object storage is a real S3 server:
SeaweedFS on loopback, started by scripts/s3-test-server.sh (built and
cached in .tools/ on first use). Reports checkpoints/s, median and p99 save
latency, bytes on the local disk and bytes (and objects) in the bucket.

With --library, the tenant-library writes instead (docs/replication.md,
"Tenant libraries"): Crystallize, RecordReuse and UpdateProfile through gRPC
by one client, off / async / sync, and what the library streams leave in the
bucket (bounded by their bases).

Usage: python bench/replication.py [--steps N] [--quick]   (--quick: 200 steps, no doc update)
       python bench/replication.py --library [--ops N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import obstore
from obstore.store import S3Store

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _workload
from _daemon import daemon
from _report import (
    disk_usage,
    fmt_bytes,
    machine_facts,
    markdown_table,
    median,
    percentile,
    write_section,
)

import stratad
from stratad.api.v1 import crystal_pb2, crystal_pb2_grpc, profile_pb2, profile_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "s3-test-server.sh"
HEADING = "## Replication (bench/replication.py)"
LIBRARY_HEADING = "## Replication of tenant libraries (bench/replication.py --library)"
BUCKET = "stratad-test"
ACCESS_KEY, SECRET_KEY = "stratad-test", "stratad-test-secret"


@dataclass
class Result:
    mode: str
    steps: int
    latencies: list[float]
    local_bytes: int
    remote_bytes: int
    remote_objects: int

    @property
    def cps(self) -> float:
        return self.steps / sum(self.latencies)


def ports_free(base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


@contextmanager
def s3_server(tmp: Path) -> Iterator[str]:
    subprocess.run(["bash", str(SCRIPT), "build"], check=True)
    base = next(p for p in range(21000, 60000, 10) if ports_free(p, 10))
    directory = tmp / "s3"
    directory.mkdir()
    out = subprocess.run(
        ["bash", str(SCRIPT), "start", str(directory), str(base)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    endpoint = next(
        line.split("=", 1)[1] for line in out.splitlines() if line.startswith("endpoint=")
    )
    try:
        yield endpoint
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(directory)], check=False)


def remote_usage(endpoint: str, prefix: str) -> tuple[int, int]:
    store = S3Store(
        BUCKET, endpoint=endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
        region="us-east-1", client_options={"allow_http": True},
    )  # fmt: skip
    size = count = 0
    for batch in obstore.list(store, prefix + "/"):
        for meta in batch:
            size += meta["size"]
            count += 1
    return size, count


def run(mode: str, steps: int, endpoint: str, tmp: Path) -> Result:
    data_dir = tmp / f"data-{mode}"
    prefix = f"bench-{mode}-{int(time.time())}"
    extra = [] if mode == "off" else [
        "--replication", mode, "--remote-url", f"s3://{BUCKET}/{prefix}",
        "--replication-lag-ms", "1000",
    ]  # fmt: skip
    latencies: list[float] = []
    with daemon(data_dir, *extra) as address, stratad.Client(address) as client:
        client.create_session("conversation")
        for state in _workload.conversation_states(steps):
            started = time.perf_counter()
            client.save_state("conversation", state, content_type="application/json")
            latencies.append(time.perf_counter() - started)
        assert client.load_state("conversation").data == state
        if mode == "async":
            time.sleep(2.5)  # two shipping periods: everything is in the bucket
    local, _ = disk_usage(data_dir)
    remote, objects = remote_usage(endpoint, prefix) if mode != "off" else (0, 0)
    return Result(mode, steps, latencies, local, remote, objects)


def table(results: list[Result]) -> str:
    base = next(r for r in results if r.mode == "off")
    rows = [
        [
            r.mode if r.mode != "off" else "off (local only)",
            f"{r.cps:,.0f}",
            f"{r.cps / base.cps:.2f}x",
            f"{median(r.latencies) * 1000:.2f} ms",
            f"{percentile(r.latencies, 99) * 1000:.2f} ms",
            fmt_bytes(r.local_bytes),
            fmt_bytes(r.remote_bytes) if r.mode != "off" else "-",
            f"{r.remote_objects:,}" if r.mode != "off" else "-",
        ]
        for r in results
    ]
    headers = ["replication", "checkpoints/s", "vs local", "median save", "p99 save",
               "local disk", "in object storage", "objects in bucket"]  # fmt: skip
    return markdown_table(headers, rows)


@dataclass
class LibraryResult:
    mode: str
    #: Seconds per call, by RPC.
    latencies: dict[str, list[float]]
    remote_bytes: int
    remote_objects: int


def run_library(mode: str, ops: int, endpoint: str, tmp: Path) -> LibraryResult:
    """`ops` rounds of Crystallize + RecordReuse + UpdateProfile, one client."""
    prefix = f"bench-library-{mode}-{int(time.time())}"
    extra = [] if mode == "off" else [
        "--replication", mode, "--remote-url", f"s3://{BUCKET}/{prefix}",
        "--replication-lag-ms", "1000",
    ]  # fmt: skip
    latencies: dict[str, list[float]] = {"Crystallize": [], "RecordReuse": [], "UpdateProfile": []}
    with daemon(tmp / f"library-{mode}", *extra) as address, stratad.Client(address) as client:
        crystals = crystal_pb2_grpc.CrystalServiceStub(client.channel)
        profiles = profile_pb2_grpc.ProfileServiceStub(client.channel)
        no_eviction = crystal_pb2.SetCrystalLibraryConfigRequest(max_crystals=10 * ops)
        client.call(crystals.SetCrystalLibraryConfig, no_eviction)
        first = ""
        for i in range(ops):
            step = crystal_pb2.TraceStep(decision=f"step {i}", tool=f"tool-{i}")  # novel tools
            calls = [
                ("Crystallize", crystals.Crystallize, crystal_pb2.CrystallizeRequest(
                    goal=f"handle request kind {i} for the billing team", success_score=0.9,
                    execution_trace=[step], session_id="bench")),
                ("RecordReuse", crystals.RecordReuse,
                 crystal_pb2.RecordReuseRequest(crystal_id=first, success=i % 2 == 0)),
                ("UpdateProfile", profiles.UpdateProfile, profile_pb2.UpdateProfileRequest(
                    user_id=f"user-{i % 50}", goals=[f"goal {i}"], interests=[f"topic {i}"])),
            ]  # fmt: skip
            for name, method, request in calls if first else calls[:1]:
                started = time.perf_counter()
                response = client.call(method, request)
                latencies[name].append(time.perf_counter() - started)
                if not first:
                    first = response.crystal.crystal_id
        if mode == "async":
            time.sleep(2.5)  # two shipping periods: everything is in the bucket
    remote, objects = remote_usage(endpoint, prefix) if mode != "off" else (0, 0)
    return LibraryResult(mode, latencies, remote, objects)


def library_table(results: list[LibraryResult]) -> str:
    rows = []
    for r in results:
        row = [r.mode if r.mode != "off" else "off (local only)"]
        for calls in r.latencies.values():
            row.append(
                f"{len(calls) / sum(calls):,.0f}/s, p50 {median(calls) * 1000:.2f} ms, "
                f"p99 {percentile(calls, 99) * 1000:.2f} ms"
            )
        row.append(fmt_bytes(r.remote_bytes) if r.mode != "off" else "-")
        row.append(f"{r.remote_objects:,}" if r.mode != "off" else "-")
        rows.append(row)
    headers = ["replication", "Crystallize", "RecordReuse", "UpdateProfile",
               "library in object storage", "objects"]  # fmt: skip
    return markdown_table(headers, rows)


def library_section(ops: int, text: str) -> str:
    return f"""{LIBRARY_HEADING}

{machine_facts()}. `python bench/replication.py --library --ops {ops}`. One client
calls Crystallize (a novel crystal each time), RecordReuse (of the first
crystal) and UpdateProfile (50 users in turn) {ops} times each through gRPC
(fsync on), on three daemons in the same run: replication off, async and sync;
object storage is SeaweedFS on loopback (scripts/s3-test-server.sh). On a
shared 2-core machine only large differences mean something (off vs async
is within the noise: async adds nothing to the write path).

{text}

- `sync` acknowledges each write once a segment holding it is in object
  storage: one PUT per call here (one client; concurrent writers share a
  segment). `async` ships every `replication_lag_ms` off the write path.
- The bucket holds this daemon's library stream: after every 32 segments it
  is compacted into one base (its live crystals, its reuse counters, the
  profiles it wrote last) and the generation before the previous base is
  deleted, so the object count stays at most 66 per daemon and tenant
  whatever the number of writes.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--library", action="store_true", help="tenant-library writes instead")
    parser.add_argument("--ops", type=int, default=500, help="--library: calls of each RPC")
    parser.add_argument("--quick", action="store_true", help="200 steps, no doc update")
    args = parser.parse_args()
    steps = 200 if args.quick else args.steps
    modes = ("off", "async", "sync")
    with tempfile.TemporaryDirectory() as name, s3_server(Path(name)) as endpoint:
        os.environ.update({
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true",
        })  # fmt: skip
        if args.library:
            ops = 100 if args.quick else args.ops
            lib_results = [run_library(mode, ops, endpoint, Path(name)) for mode in modes]
            text = library_table(lib_results)
            print(text)
            if not args.quick:
                write_section(LIBRARY_HEADING, library_section(ops, text))
            return
        results = [run(mode, steps, endpoint, Path(name)) for mode in modes]
    text = table(results)
    print(text)
    if args.quick:
        return
    logical = sum(len(s) for s in _workload.conversation_states(steps))
    section = f"""{HEADING}

{machine_facts()}. `python bench/replication.py` (steps: {steps}). One client saves the
growing conversation step by step through gRPC (fsync on); the three daemons
run one after the other in the same run, object storage is SeaweedFS on loopback
(scripts/s3-test-server.sh). The states add up to {fmt_bytes(logical)}.

{text}

- `sync` pays one round trip for the segment and one for the conditional HEAD
  write per save (plus one for a pack when the save adds objects); on loopback
  that is the whole difference to `off`. Over a real network, expect the
  object store's PUT latency twice per save.
- `async` costs the save path nothing: shipping runs on a background thread
  every `replication_lag_ms`.
- The bucket holds the objects once (packs) plus the journal segments. The
  HEAD is rebased on the whole local journal every 256 segments and at each
  local compaction; the segments a rebase replaces are deleted at the next
  one. In `sync` mode every save is a segment and (when it adds objects) a
  pack with its index: that is the object count. The journal records carry
  the new objects too, so `sync` uploads them twice; folding packs into the
  segments would halve its PUTs (not done yet).
- The p99 of `sync` is the rebase at a local compaction: the whole journal
  (at most twice its last snapshot, or 128 KiB) is uploaded inside that save.
"""
    write_section(HEADING, section)


if __name__ == "__main__":
    main()
