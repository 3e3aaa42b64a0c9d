"""SIGKILL of the daemon under structured-state load: every acknowledged update survives.

Writer threads (each with its own channel) update one session as fast as they
can: decisions, errors, task statuses, task results, global state keys and
appends to a shared list, fluid updates and, per tenant and user, profile
updates. Each records the updates whose response it received
(*acknowledged*). The daemon is killed with SIGKILL at a random moment,
restarted on the same data directory, and every acknowledged update must be
there (an update in flight at the kill may or may not be). The session's
version must count exactly the updates present, so none was applied twice.

``CRASH_SEED`` (random unless set) picks the kill moments; each test prints it.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from stratad.api.v1 import (
    cognitive_pb2,
    cognitive_pb2_grpc,
    profile_pb2,
    profile_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)

BASE_SEED = int(os.environ.get("CRASH_SEED") or random.SystemRandom().randrange(1 << 32))
ROUNDS = 3
SLOW_ROUNDS = 20
WRITERS = 6
KILL_DELAY_RANGE = (0.3, 1.5)
SESSION = "crashy"


@dataclass
class Acked:
    decisions: set[str] = field(default_factory=set)
    errors: set[str] = field(default_factory=set)
    tasks: dict[str, int] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    profile_updates: int = 0
    #: Updates sent whose answer never came (the kill): present or not.
    in_flight: int = 0
    sent: int = 0

    def merge(self, other: Acked) -> None:
        self.decisions |= other.decisions
        self.errors |= other.errors
        self.tasks.update(other.tasks)
        self.results.update(other.results)
        self.keys |= other.keys
        self.paths |= other.paths
        self.profile_updates += other.profile_updates
        self.in_flight += other.in_flight
        self.sent += other.sent


def write(target: str, writer: int, rnd: int, acked: Acked, stop: threading.Event) -> None:
    """Update until the daemon goes away; record what was acknowledged."""
    channel = grpc.insecure_channel(target)
    cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
    tasks = task_pb2_grpc.TaskServiceStub(channel)
    profiles = profile_pb2_grpc.ProfileServiceStub(channel)
    j = 0
    try:
        while not stop.is_set():
            name = f"r{rnd}-w{writer}-{j}"
            kind = j % 7
            acked.sent += 1
            acked.in_flight += 1
            if kind == 0:
                cognitive.RecordDecision(
                    cognitive_pb2.RecordDecisionRequest(session_id=SESSION, step=j, decision=name),
                    timeout=30,
                )
                acked.decisions.add(name)
            elif kind == 1:
                cognitive.RecordError(
                    cognitive_pb2.RecordErrorRequest(session_id=SESSION, step=j, error=name),
                    timeout=30,
                )
                acked.errors.add(name)
            elif kind == 2:
                status = task_pb2.TASK_STATUS_COMPLETED if j % 2 else task_pb2.TASK_STATUS_FAILED
                tasks.UpdateTaskStatus(
                    task_pb2.UpdateTaskStatusRequest(
                        session_id=SESSION, task_id=name, status=status
                    ),
                    timeout=30,
                )
                acked.tasks[name] = status
            elif kind == 3:
                tasks.StoreTaskResult(
                    task_pb2.StoreTaskResultRequest(
                        session_id=SESSION, task_id=name, result=struct_pb2.Value(string_value=name)
                    ),
                    timeout=30,
                )
                acked.results[name] = name
            elif kind == 4:
                request = task_pb2.UpdateGlobalStateRequest(
                    session_id=SESSION, key=name, value=struct_pb2.Value(string_value=name)
                )
                if j % 2:
                    request.key, request.mode = "file_paths", task_pb2.GLOBAL_UPDATE_MODE_APPEND
                tasks.UpdateGlobalState(request, timeout=30)
                (acked.paths if j % 2 else acked.keys).add(name)
            elif kind == 5:
                cognitive.UpdateFluid(
                    cognitive_pb2.UpdateFluidRequest(session_id=SESSION, step_count=j), timeout=30
                )
            else:
                profiles.UpdateProfile(
                    profile_pb2.UpdateProfileRequest(user_id=f"user{writer}", goals=[name]),
                    timeout=30,
                )
                acked.profile_updates += 1
            acked.in_flight -= 1
            j += 1
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc  # type: ignore[attr-defined]
    finally:
        channel.close()


def state_of(target: str) -> dict[str, Any]:
    with grpc.insecure_channel(target) as channel:
        cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
        tasks = task_pb2_grpc.TaskServiceStub(channel)
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        profiles = profile_pb2_grpc.ProfileServiceStub(channel)
        insights = cognitive.GetCognitiveState(
            cognitive_pb2.GetCognitiveStateRequest(session_id=SESSION), timeout=60
        ).state.insights
        listed = tasks.ListTasks(
            task_pb2.ListTasksRequest(session_id=SESSION, include_results=True), timeout=60
        ).tasks
        values = json_format.MessageToDict(
            tasks.GetGlobalState(task_pb2.GetGlobalStateRequest(session_id=SESSION)).value
        )
        version = sessions.GetSession(session_pb2.GetSessionRequest(session_id=SESSION)).session
        counts = 0
        for writer in range(WRITERS):
            try:
                profile = profiles.GetProfile(
                    profile_pb2.GetProfileRequest(user_id=f"user{writer}"), timeout=30
                ).profile
            except grpc.RpcError:
                continue
            counts += profile.interaction_count
        return {
            "decisions": [d.decision for d in insights.decision_log],
            "errors": [e.error for e in insights.error_journal],
            "tasks": {t.task_id: t for t in listed},
            "paths": values.pop("file_paths", []),
            "values": values,
            "version": version.version,
            "profile_updates": counts,
        }


@pytest.mark.parametrize(
    "rnd",
    [pytest.param(r, marks=pytest.mark.slow if r >= ROUNDS else ()) for r in range(SLOW_ROUNDS)],
)
def test_sigkill_under_load_keeps_every_acknowledged_update(
    start_daemon: Callable[..., Any], tmp_path: Any, rnd: int
) -> None:
    seed = BASE_SEED + rnd
    print(f"CRASH_SEED={BASE_SEED} round {rnd}")
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    daemon = start_daemon(data_dir=data_dir)
    with grpc.insecure_channel(daemon.target) as channel:
        session_pb2_grpc.SessionServiceStub(channel).CreateSession(
            session_pb2.CreateSessionRequest(session_id=SESSION), timeout=30
        )
        cognitive_pb2_grpc.CognitiveStateServiceStub(channel).Initialize(
            cognitive_pb2.InitializeRequest(session_id=SESSION, goal="survive"), timeout=30
        )
    stop = threading.Event()
    per_writer = [Acked() for _ in range(WRITERS)]
    threads = [
        threading.Thread(target=write, args=(daemon.target, n, rnd, per_writer[n], stop))
        for n in range(WRITERS)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while any(a.sent - a.in_flight < 3 for a in per_writer) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(*KILL_DELAY_RANGE))
    daemon.signal(signal.SIGKILL)
    daemon.wait(30)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    acked = Acked()
    for a in per_writer:
        acked.merge(a)
    assert acked.sent - acked.in_flight > 20, "the daemon died before any real load"
    print(f"{acked.sent - acked.in_flight} acknowledged, {acked.in_flight} in flight at the kill")

    restarted = start_daemon(data_dir=data_dir, listen=None)
    got = state_of(restarted.target)
    assert acked.decisions <= set(got["decisions"])
    assert len(got["decisions"]) == len(set(got["decisions"]))  # nothing applied twice
    assert acked.errors <= set(got["errors"])
    for task_id, status in acked.tasks.items():
        assert got["tasks"][task_id].status == status
    for task_id, result in acked.results.items():
        stored: Any = json_format.MessageToDict(got["tasks"][task_id].result)
        assert stored == result
    assert acked.keys <= set(got["values"])
    assert acked.paths <= set(got["paths"]) and len(got["paths"]) == len(set(got["paths"]))
    assert acked.profile_updates <= got["profile_updates"]
    assert got["profile_updates"] <= acked.profile_updates + acked.in_flight
    # every session update is one version: acknowledged ones plus at most the in-flight ones
    session_acked = acked.sent - acked.in_flight - acked.profile_updates
    assert 2 + session_acked <= got["version"] <= 2 + session_acked + acked.in_flight
    restarted.stop()
