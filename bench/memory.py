"""Peak memory of a real daemon under large saves, with and without the in-flight budget.

    python bench/memory.py       # prints the table, writes docs/benchmarks.md

Each case starts a fresh `stratad serve` (max_message_bytes 64 MiB), notes its
idle resident memory, runs its saves, and reads the peak (VmHWM of
/proc/<pid>/status). States are incompressible (os.urandom), the worst case,
except the SDK case: the reference workload's words, sent as a chunked upload
(compressed frames). docs/limits.md explains the figures.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from _daemon import free_port, process
from _report import machine_facts, markdown_table, write_section
from _workload import WORDS

import stratad
from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc

MIB = 1 << 20
OPTIONS = [
    ("grpc.max_send_message_length", 80 * MIB),
    ("grpc.max_receive_message_length", 80 * MIB),
]


@dataclass
class Case:
    name: str
    saves: int
    budget: int  # max_inflight_bytes; 0 = none
    chunked: bool = False


CASES = [
    Case("1 save of 60 MiB, no budget", 1, 0),
    Case("1 save of 60 MiB via the SDK (chunked, compressible), no budget", 1, 0, chunked=True),
    Case("6 concurrent saves of 60 MiB, no budget", 6, 0),
    Case("6 concurrent saves of 60 MiB, 512 MiB budget", 6, 512 * MIB),
]


def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def compressible(size: int) -> bytes:
    rng = random.Random(7)
    text = " ".join(rng.choice(WORDS) for _ in range(size // 4))
    return text.encode()[:size]


def raw_save(address: str, session_id: str, data: bytes) -> str:
    with grpc.insecure_channel(address, options=OPTIONS) as channel:
        stub = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        try:
            stub.SaveState(checkpoint_pb2.SaveStateRequest(session_id=session_id, data=data))
            return "OK"
        except grpc.RpcError as exc:
            return str(exc.code().name)  # type: ignore[attr-defined]


def run(case: Case) -> list[str]:
    address = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as data_dir:
        args = [sys.executable, "-m", "stratad", "serve", "--listen", address]
        args += ["--data-dir", data_dir, "--log-level", "warning", "--metrics-listen", "off"]
        args += ["--max-message-bytes", str(64 * MIB), "--max-inflight-bytes", str(case.budget)]
        with process(args, address) as proc, stratad.Client(address) as client:
            for i in range(case.saves):
                client.create_session(f"s{i}")
            idle = status_mib(proc.pid, "VmRSS")
            outcomes = saves(case, address, client)
            peak = status_mib(proc.pid, "VmHWM")
    admitted = outcomes.count("OK")
    refused = len(outcomes) - admitted
    over = (peak - idle) / 60 / max(admitted, 1) if case.saves == 1 else float("nan")
    per_save = f"{over:.1f}x" if case.saves == 1 else "-"
    return [case.name, f"{idle:.0f} MiB", f"{peak:.0f} MiB", per_save, f"{admitted} / {refused}"]


def saves(case: Case, address: str, client: stratad.Client) -> list[str]:
    if case.chunked:
        client.save_state("s0", compressible(60 * MIB))
        return ["OK"]
    states = [bytes([i]) + os.urandom(60 * MIB - 1) for i in range(case.saves)]
    outcomes = [""] * case.saves

    def one(i: int) -> None:
        outcomes[i] = raw_save(address, f"s{i}", states[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(case.saves)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def main() -> None:
    headers = ["case", "idle RSS", "peak RSS (VmHWM)", "peak over idle / state", "saved / refused"]
    rows = [run(case) for case in CASES]
    table = markdown_table(headers, rows)
    print(table)
    write_section(
        "## Memory under large saves",
        "## Memory under large saves\n\n"
        f"`python bench/memory.py` ({machine_facts()}). A fresh daemon per case "
        "(max_message_bytes 64 MiB); peak = VmHWM. See docs/limits.md.\n\n" + table + "\n",
    )


if __name__ == "__main__":
    main()
