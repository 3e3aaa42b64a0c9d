"""Concurrency: 8 processes x 500 mixed structured-state updates on one session, nothing lost.

AIWhisperer and Cogency serialize writers with file locks (and still lose
updates when two processes read-modify-write one file). With stratad each
update is one atomic call, so eight agent processes hammering the same session
concurrently must leave every single update in place:

- task status updates (a task per update, its status from the update),
- decisions appended to the cognitive decision log,
- global state: a key per update, and appends to one shared ``file_paths`` list,
- fluid updates (the last writer wins; only the version count can tell).

Each worker is this file run as a script (a real separate process).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from stratad.api.v1 import (
    cognitive_pb2,
    cognitive_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)

PROCESSES = 8
UPDATES = 500
SESSION = "shared"
STATUSES = (
    task_pb2.TASK_STATUS_PENDING,
    task_pb2.TASK_STATUS_IN_PROGRESS,
    task_pb2.TASK_STATUS_COMPLETED,
    task_pb2.TASK_STATUS_FAILED,
)


def string_value(text: str) -> struct_pb2.Value:
    return struct_pb2.Value(string_value=text)


def worker(target: str, worker_id: int, updates: int) -> None:
    """One agent process: `updates` mixed updates, each acknowledged before the next."""
    with grpc.insecure_channel(target) as channel:
        tasks = task_pb2_grpc.TaskServiceStub(channel)
        cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
        for j in range(updates):
            name = f"p{worker_id}-{j}"
            kind = j % 5
            if kind == 0:
                request = task_pb2.UpdateTaskStatusRequest(
                    session_id=SESSION, task_id=name, status=STATUSES[j % 4]
                )
                tasks.UpdateTaskStatus(request, timeout=60)
            elif kind in (1, 3):
                decision = cognitive_pb2.RecordDecisionRequest(
                    session_id=SESSION, step=j, decision=name, rationale=f"by {worker_id}"
                )
                cognitive.RecordDecision(decision, timeout=60)
            elif kind == 2:
                update = task_pb2.UpdateGlobalStateRequest(
                    session_id=SESSION, key=name, value=string_value(name)
                )
                if j % 2:  # one shared list: appends must not overwrite each other
                    update.key = "file_paths"
                    update.mode = task_pb2.GLOBAL_UPDATE_MODE_APPEND
                tasks.UpdateGlobalState(update, timeout=60)
            else:
                fluid = cognitive_pb2.UpdateFluidRequest(
                    session_id=SESSION, progress=j / updates, step_count=j
                )
                cognitive.UpdateFluid(fluid, timeout=60)


def expected(worker_id: int, updates: int) -> dict[str, Any]:
    out: dict[str, Any] = {"tasks": {}, "decisions": set(), "keys": set(), "paths": set()}
    for j in range(updates):
        name = f"p{worker_id}-{j}"
        kind = j % 5
        if kind == 0:
            out["tasks"][name] = STATUSES[j % 4]
        elif kind in (1, 3):
            out["decisions"].add((j, name, f"by {worker_id}"))
        elif kind == 2:
            (out["paths"] if j % 2 else out["keys"]).add(name)
    return out


def test_eight_processes_lose_no_update(
    start_daemon: Callable[..., Any], stratad_env: dict[str, str]
) -> None:
    daemon = start_daemon()
    with grpc.insecure_channel(daemon.target) as channel:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
        tasks = task_pb2_grpc.TaskServiceStub(channel)
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id=SESSION), timeout=30)
        cognitive.Initialize(
            cognitive_pb2.InitializeRequest(session_id=SESSION, goal="concurrency"), timeout=30
        )
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, daemon.target, str(n), str(UPDATES)], env=stratad_env
            )
            for n in range(PROCESSES)
        ]
        codes = [p.wait(timeout=300) for p in procs]
        elapsed = time.monotonic() - started
        assert codes == [0] * PROCESSES, daemon.output()
        print(f"{PROCESSES * UPDATES} updates from {PROCESSES} processes in {elapsed:.1f} s")

        state = cognitive.GetCognitiveState(
            cognitive_pb2.GetCognitiveStateRequest(session_id=SESSION), timeout=60
        )
        listed = tasks.ListTasks(task_pb2.ListTasksRequest(session_id=SESSION), timeout=60)
        global_state = tasks.GetGlobalState(
            task_pb2.GetGlobalStateRequest(session_id=SESSION), timeout=60
        )
        session = sessions.GetSession(session_pb2.GetSessionRequest(session_id=SESSION))

    want: dict[str, Any] = {"tasks": {}, "decisions": set(), "keys": set(), "paths": set()}
    for n in range(PROCESSES):
        mine = expected(n, UPDATES)
        want["tasks"].update(mine["tasks"])
        for name in ("decisions", "keys", "paths"):
            want[name] |= mine[name]

    assert {t.task_id: t.status for t in listed.tasks} == want["tasks"]
    decisions = [(d.step, d.decision, d.rationale) for d in state.state.insights.decision_log]
    assert len(decisions) == len(want["decisions"]) and set(decisions) == want["decisions"]
    values = json_format.MessageToDict(global_state.value)
    paths = values.pop("file_paths")
    assert len(paths) == len(want["paths"]) and set(paths) == want["paths"]
    assert values == {k: k for k in want["keys"]}
    # create + initialize + one version per update: no update was merged or dropped
    assert session.session.version == 2 + PROCESSES * UPDATES


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
