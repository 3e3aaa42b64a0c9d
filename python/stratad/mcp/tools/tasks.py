"""The ``task_update`` tool: a task's status and result in the session (TaskService)."""

from __future__ import annotations

from typing import Any

from stratad.api.v1 import task_pb2
from stratad.errors import InvalidArgumentError
from stratad.mcp.tools.arguments import TaskUpdateArgs
from stratad.mcp.tools.base import WRITES, Call, Output, Toolbox
from stratad.mcp.tools.convert import json_value
from stratad.values import to_py

toolbox = Toolbox()
tool = toolbox.tool


_TASK_STATUS = {
    "pending": task_pb2.TASK_STATUS_PENDING,
    "in_progress": task_pb2.TASK_STATUS_IN_PROGRESS,
    "completed": task_pb2.TASK_STATUS_COMPLETED,
    "failed": task_pb2.TASK_STATUS_FAILED,
}
_TASK_STATUS_NAMES = {v: k for k, v in _TASK_STATUS.items()}


@tool("task_update", "Update a task's status and result", TaskUpdateArgs, WRITES)
async def task_update(call: Call, args: TaskUpdateArgs) -> Output:
    """Set a task's status (pending, in_progress, completed, failed) and/or store its result
    (any JSON value) in the session, e.g. for the sub-tasks of a plan. The task is created
    on first use, and so is the session."""
    given = args.model_fields_set
    if args.status is None and "result" not in given:
        raise InvalidArgumentError("give status, result or both", reason="NOTHING_TO_UPDATE")
    value = json_value(args.result, "result") if "result" in given else None
    await call.ensure_session(args.session_id)
    version = 0
    status = ""
    if args.status is not None:
        request = task_pb2.UpdateTaskStatusRequest(
            session_id=args.session_id, task_id=args.task_id, status=_TASK_STATUS[args.status]
        )
        response = await call.ask(call.link.tasks.UpdateTaskStatus, request)
        version = response.version
        status = _TASK_STATUS_NAMES.get(response.task.status, "")
    if value is not None:
        store = task_pb2.StoreTaskResultRequest(
            session_id=args.session_id, task_id=args.task_id, result=value
        )
        version = (await call.ask(call.link.tasks.StoreTaskResult, store)).version
    get = task_pb2.GetTaskResultRequest(session_id=args.session_id, task_id=args.task_id)
    current = await call.ask(call.link.tasks.GetTaskResult, get)
    out: dict[str, Any] = {
        "task_id": args.task_id,
        "status": _TASK_STATUS_NAMES.get(current.status, status or None),
        "has_result": current.has_result,
        "version": max(version, current.version),
    }
    if current.has_result:
        out["result"] = to_py(current.result, "result")
    return Output(out)


__all__ = ["toolbox"]
