"""TaskService over gRPC: every RPC with good and bad input, tenancy, JSON values, events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from stratad.api.v1 import checkpoint_pb2, session_pb2, task_pb2_grpc
from stratad.api.v1 import task_pb2 as pb

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
S = "runner"


def value(v: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    json_format.ParseDict(v, out)
    return out


def py(v: struct_pb2.Value) -> Any:
    return json_format.MessageToDict(v)


class Tasks:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.stub = task_pb2_grpc.TaskServiceStub(api.channel)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.stub, name)
        return lambda request: self.api.call(method, request)

    def method(self, name: str) -> Any:
        return getattr(self.stub, name)


@pytest.fixture
def tasks(api: Api) -> Tasks:
    api.create(S)
    return Tasks(api)


def all_requests(session_id: str) -> list[tuple[str, Any]]:
    return [
        (
            "UpdateTaskStatus",
            pb.UpdateTaskStatusRequest(
                session_id=session_id, task_id="t1", status=pb.TASK_STATUS_PENDING
            ),
        ),
        (
            "StoreTaskResult",
            pb.StoreTaskResultRequest(session_id=session_id, task_id="t1", result=value(1)),
        ),
        ("GetTaskResult", pb.GetTaskResultRequest(session_id=session_id, task_id="t1")),
        ("ListTasks", pb.ListTasksRequest(session_id=session_id)),
        (
            "UpdateGlobalState",
            pb.UpdateGlobalStateRequest(session_id=session_id, key="k", value=value(1)),
        ),
        ("GetGlobalState", pb.GetGlobalStateRequest(session_id=session_id)),
    ]


def test_tasks_round_trip(api: Api, tasks: Tasks) -> None:
    response = tasks.UpdateTaskStatus(
        pb.UpdateTaskStatusRequest(session_id=S, task_id="t1", status=pb.TASK_STATUS_PENDING)
    )
    assert response.task.status == pb.TASK_STATUS_PENDING and response.version == 2
    assert not response.task.has_result
    result = {"rows": 3, "ratio": 0.5, "names": ["a", None, True], "nested": {"k": {}}}
    stored = tasks.StoreTaskResult(
        pb.StoreTaskResultRequest(session_id=S, task_id="t1", result=value(result))
    )
    assert stored.version == 3
    tasks.StoreTaskResult(pb.StoreTaskResultRequest(session_id=S, task_id="t2", result=value("x")))
    tasks.UpdateTaskStatus(
        pb.UpdateTaskStatusRequest(session_id=S, task_id="t2", status=pb.TASK_STATUS_FAILED)
    )
    got = tasks.GetTaskResult(pb.GetTaskResultRequest(session_id=S, task_id="t1"))
    assert got.has_result and py(got.result) == result and got.status == pb.TASK_STATUS_PENDING
    listed = tasks.ListTasks(pb.ListTasksRequest(session_id=S))
    assert [(t.task_id, t.status, t.has_result) for t in listed.tasks] == [
        ("t1", pb.TASK_STATUS_PENDING, True),
        ("t2", pb.TASK_STATUS_FAILED, True),
    ]
    assert not listed.tasks[0].HasField("result")
    with_results = tasks.ListTasks(pb.ListTasksRequest(session_id=S, include_results=True))
    assert py(with_results.tasks[1].result) == "x"
    failed = tasks.ListTasks(pb.ListTasksRequest(session_id=S, status=pb.TASK_STATUS_FAILED))
    assert [t.task_id for t in failed.tasks] == ["t2"]


def test_a_task_with_no_result_yet(tasks: Tasks) -> None:
    tasks.UpdateTaskStatus(
        pb.UpdateTaskStatusRequest(session_id=S, task_id="t", status=pb.TASK_STATUS_IN_PROGRESS)
    )
    got = tasks.GetTaskResult(pb.GetTaskResultRequest(session_id=S, task_id="t"))
    assert not got.has_result and not got.HasField("result")
    assert got.status == pb.TASK_STATUS_IN_PROGRESS


def test_global_state_modes(tasks: Tasks) -> None:
    def update(key: str, v: Any, mode: pb.GlobalUpdateMode.ValueType = 0) -> Any:  # type: ignore[assignment]
        request = pb.UpdateGlobalStateRequest(session_id=S, key=key, value=value(v), mode=mode)
        return py(tasks.UpdateGlobalState(request).value)

    assert update("file_paths", "a.txt", pb.GLOBAL_UPDATE_MODE_APPEND) == ["a.txt"]
    assert update("file_paths", "b.txt", pb.GLOBAL_UPDATE_MODE_APPEND) == ["a.txt", "b.txt"]
    assert update("other_context", {"a": 1}, pb.GLOBAL_UPDATE_MODE_MERGE) == {"a": 1}
    assert update("other_context", {"b": 2}, pb.GLOBAL_UPDATE_MODE_MERGE) == {"a": 1, "b": 2}
    assert update("n", 7, pb.GLOBAL_UPDATE_MODE_SET) == 7
    got = tasks.GetGlobalState(pb.GetGlobalStateRequest(session_id=S, key="file_paths"))
    assert py(got.value) == ["a.txt", "b.txt"]
    whole = tasks.GetGlobalState(pb.GetGlobalStateRequest(session_id=S))
    assert py(whole.value) == {
        "file_paths": ["a.txt", "b.txt"], "other_context": {"a": 1, "b": 2}, "n": 7
    }  # fmt: skip


BAD_REQUESTS: list[tuple[str, Any, grpc.StatusCode, str]] = [
    ("UpdateTaskStatus", pb.UpdateTaskStatusRequest(session_id=S, task_id="t"), INVALID, "status"),
    (
        "UpdateTaskStatus",
        pb.UpdateTaskStatusRequest(session_id=S, task_id="t", status=42),  # type: ignore[arg-type]
        INVALID,
        "status",
    ),
    (
        "UpdateTaskStatus",
        pb.UpdateTaskStatusRequest(session_id=S, task_id="a b", status=pb.TASK_STATUS_PENDING),
        INVALID,
        "task_id",
    ),
    ("StoreTaskResult", pb.StoreTaskResultRequest(session_id=S, task_id="t"), INVALID, "required"),
    (
        "StoreTaskResult",
        pb.StoreTaskResultRequest(
            session_id=S, task_id="t", result=struct_pb2.Value(number_value=float("nan"))
        ),
        INVALID,
        "JSON",
    ),
    (
        "StoreTaskResult",
        pb.StoreTaskResultRequest(session_id=S, task_id="t", result=value("x" * (1 << 20))),
        INVALID,
        "limit",
    ),
    ("GetTaskResult", pb.GetTaskResultRequest(session_id=S, task_id="t0"), NOT_FOUND, "t0"),
    ("GetTaskResult", pb.GetTaskResultRequest(session_id=S, task_id=""), INVALID, "task_id"),
    ("ListTasks", pb.ListTasksRequest(session_id=S, status=9), INVALID, "status"),  # type: ignore[arg-type]
    ("UpdateGlobalState", pb.UpdateGlobalStateRequest(session_id=S, key="k"), INVALID, "required"),
    (
        "UpdateGlobalState",
        pb.UpdateGlobalStateRequest(session_id=S, key="", value=value(1)),
        INVALID,
        "key",
    ),
    (
        "UpdateGlobalState",
        pb.UpdateGlobalStateRequest(session_id=S, key="k", value=value(1), mode=7),  # type: ignore[arg-type]
        INVALID,
        "mode",
    ),
    (
        "UpdateGlobalState",
        pb.UpdateGlobalStateRequest(
            session_id=S, key="k", value=value([1]), mode=pb.GLOBAL_UPDATE_MODE_MERGE
        ),
        INVALID,
        "object",
    ),
    (
        "UpdateGlobalState",
        pb.UpdateGlobalStateRequest(
            session_id=S, key="n", value=value(1), mode=pb.GLOBAL_UPDATE_MODE_APPEND
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "list",
    ),
    ("GetGlobalState", pb.GetGlobalStateRequest(session_id=S, key="missing"), NOT_FOUND, "missing"),
    ("GetGlobalState", pb.GetGlobalStateRequest(session_id=S, key="a\nb"), INVALID, "key"),
]


@pytest.mark.parametrize(("name", "request_", "code", "words"), BAD_REQUESTS)
def test_bad_input_changes_nothing(
    api: Api, tasks: Tasks, name: str, request_: Any, code: grpc.StatusCode, words: str
) -> None:
    tasks.UpdateGlobalState(pb.UpdateGlobalStateRequest(session_id=S, key="n", value=value(1)))
    api.fails(tasks.method(name), request_, code, words, keeps=S)


@pytest.mark.parametrize(("name", "request_"), all_requests("nope"))
def test_unknown_session_is_not_found(api: Api, tasks: Tasks, name: str, request_: Any) -> None:
    api.fails(tasks.method(name), request_, NOT_FOUND, "nope")


@pytest.mark.parametrize(("name", "request_"), all_requests(S))
def test_another_tenants_session_is_not_found(
    api: Api, tasks: Tasks, name: str, request_: Any
) -> None:
    api.as_tenant("intruder").fails(tasks.method(name), request_, NOT_FOUND, S)


@pytest.mark.parametrize(("name", "request_"), all_requests("-bad"))
def test_a_bad_session_id_is_invalid(api: Api, tasks: Tasks, name: str, request_: Any) -> None:
    api.fails(tasks.method(name), request_, INVALID, "session_id")


def test_expected_version(api: Api, tasks: Tasks) -> None:
    request = pb.UpdateTaskStatusRequest(
        session_id=S, task_id="t", status=pb.TASK_STATUS_PENDING, expected_version=5
    )
    api.fails(
        tasks.method("UpdateTaskStatus"), request, grpc.StatusCode.ABORTED, "version", keeps=S
    )
    request.expected_version = 1
    assert tasks.UpdateTaskStatus(request).version == 2


def test_events_and_checkpoints(api: Api, tasks: Tasks) -> None:
    tasks.UpdateTaskStatus(
        pb.UpdateTaskStatusRequest(session_id=S, task_id="t", status=pb.TASK_STATUS_PENDING)
    )
    saved = api.save(S, b"{}")
    tasks.UpdateTaskStatus(
        pb.UpdateTaskStatusRequest(session_id=S, task_id="t", status=pb.TASK_STATUS_COMPLETED)
    )
    tasks.StoreTaskResult(pb.StoreTaskResultRequest(session_id=S, task_id="t", result=value(1)))
    tasks.UpdateGlobalState(pb.UpdateGlobalStateRequest(session_id=S, key="k", value=value(1)))
    stream = api.sessions.WatchSession(
        session_pb2.WatchSessionRequest(session_id=S, from_version=1),
        timeout=10,
        metadata=api.metadata,
    )
    kinds = []
    for response in stream:
        kinds.append(response.event.kind)
        if len(kinds) == 5:
            break
    stream.cancel()
    assert kinds == ["task.status", "save", "task.status", "task.result", "task.global"]
    restore = checkpoint_pb2.RestoreCheckpointRequest(
        checkpoint_id=saved.checkpoint_id, make_current=True
    )
    api.call(api.checkpoints.RestoreCheckpoint, restore)
    listed = tasks.ListTasks(pb.ListTasksRequest(session_id=S)).tasks
    assert [(t.status, t.has_result) for t in listed] == [(pb.TASK_STATUS_PENDING, False)]
    got = tasks.GetGlobalState(pb.GetGlobalStateRequest(session_id=S))
    assert py(got.value) == {}
