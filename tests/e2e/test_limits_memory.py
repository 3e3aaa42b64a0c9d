"""The in-flight budget bounds a real daemon's memory (docs/limits.md).

Six clients save 60 MiB of incompressible data each, at once, into a daemon
with a 512 MiB budget. Each save is charged 6 x 60 MiB = 360 MiB, so one
fits at a time: the others get RESOURCE_EXHAUSTED (OVERLOADED) unless they
arrive after an earlier one finished. Without a budget the same run peaks
at about 1.7 GiB (docs/limits.md has the figures and the command).

The peak resident memory (VmHWM) must stay under the budget plus the
baseline: the daemon's own memory when idle, plus what gRPC's transport holds
for the messages while they arrive (each call's request, whole, before any
Python code sees it: 6 x 60 MiB here), which no budget can refuse.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc, session_pb2, session_pb2_grpc
from stratad.sdk.client import error_info

MIB = 1 << 20
SAVES = 6
STATE = 60 * MIB
BUDGET = 512 * MIB
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 80 * MIB),
    ("grpc.max_receive_message_length", 80 * MIB),
]


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def save(target: str, session_id: str, data: bytes) -> Any:
    """One SaveState on a channel of its own (so the transfers run side by side)."""
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        request = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=data)
        try:
            return stub.SaveState(request, timeout=300)
        except grpc.RpcError as exc:
            return exc


def test_concurrent_large_saves_stay_within_the_budget(start_daemon: Callable[..., Any]) -> None:
    daemon = start_daemon("--max-message-bytes", str(64 * MIB), "--max-inflight-bytes", str(BUDGET))
    with grpc.insecure_channel(daemon.target, options=CHANNEL_OPTIONS) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        for i in range(SAVES):
            sessions.CreateSession(session_pb2.CreateSessionRequest(session_id=f"s{i}"), timeout=30)
        idle_kib = status_kib(daemon.pid, "VmRSS")
        states = [bytes([i]) + os.urandom(STATE - 1) for i in range(SAVES)]
        results: list[Any] = [None] * SAVES

        def run(i: int) -> None:
            results[i] = save(daemon.target, f"s{i}", states[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(SAVES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak_kib = status_kib(daemon.pid, "VmHWM")

        saved = [
            i for i, r in enumerate(results) if isinstance(r, checkpoint_pb2.SaveStateResponse)
        ]
        refused = [r for r in results if isinstance(r, grpc.RpcError)]
        assert saved, "no save went through"
        assert refused, "every save was admitted: the budget did not act"
        for error in refused:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
            info = error_info(error)
            assert info is not None and info.reason == "OVERLOADED", error.details()
        stub = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        for i in saved:
            loaded = stub.LoadState(checkpoint_pb2.LoadStateRequest(session_id=f"s{i}"), timeout=60)
            assert loaded.data == states[i]

    transport_kib = SAVES * STATE // 1024
    limit_kib = BUDGET // 1024 + idle_kib + transport_kib
    print(
        f"\npeak RSS {peak_kib // 1024} MiB (idle {idle_kib // 1024} MiB, "
        f"limit {limit_kib // 1024} MiB); {len(saved)} saved, {len(refused)} refused"
    )
    assert peak_kib < limit_kib
