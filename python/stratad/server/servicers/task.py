"""TaskService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import grpc

from stratad.api.v1 import task_pb2, task_pb2_grpc
from stratad.domain.tasks import GlobalMode, Task, Tasks, TaskStatus
from stratad.errors import InvalidArgumentError
from stratad.server.runner import CHEAP, IO
from stratad.server.servicers.base import Servicer, tenant_of
from stratad.server.servicers.convert import timestamp
from stratad.values import set_value, to_py, to_value

STATUS_TO_PB: dict[str, task_pb2.TaskStatus.ValueType] = {
    TaskStatus.PENDING: task_pb2.TASK_STATUS_PENDING,
    TaskStatus.IN_PROGRESS: task_pb2.TASK_STATUS_IN_PROGRESS,
    TaskStatus.COMPLETED: task_pb2.TASK_STATUS_COMPLETED,
    TaskStatus.FAILED: task_pb2.TASK_STATUS_FAILED,
}
STATUS_FROM_PB: dict[int, TaskStatus] = {v: TaskStatus(k) for k, v in STATUS_TO_PB.items()}
_MODES = {
    task_pb2.GLOBAL_UPDATE_MODE_UNSPECIFIED: GlobalMode.SET,
    task_pb2.GLOBAL_UPDATE_MODE_SET: GlobalMode.SET,
    task_pb2.GLOBAL_UPDATE_MODE_APPEND: GlobalMode.APPEND,
    task_pb2.GLOBAL_UPDATE_MODE_MERGE: GlobalMode.MERGE,
}


def status_from_pb(status: int, *, required: bool) -> TaskStatus | None:
    found = STATUS_FROM_PB.get(status)
    if found is None and (required or status):
        raise InvalidArgumentError(
            "status must be PENDING, IN_PROGRESS, COMPLETED or FAILED"
            if required
            else f"unknown task status {status}"
        )
    return found


def task_to_pb(task_id: str, task: Task, *, with_result: bool) -> task_pb2.Task:
    out = task_pb2.Task(
        task_id=task_id,
        status=STATUS_TO_PB.get(task.get("status", ""), task_pb2.TASK_STATUS_UNSPECIFIED),
        has_result="result" in task,
        created_at=timestamp(task["created_at"]),
        updated_at=timestamp(task["updated_at"]),
    )
    if with_result and "result" in task:
        set_value(out.result, task["result"])
    return out


class TaskServicer(Servicer, task_pb2_grpc.TaskServiceServicer):
    @property
    def domain(self) -> Tasks:
        return self.engine.tasks

    async def UpdateTaskStatus(
        self, request: task_pb2.UpdateTaskStatusRequest, context: grpc.aio.ServicerContext
    ) -> task_pb2.UpdateTaskStatusResponse:
        status = status_from_pb(request.status, required=True)
        assert status is not None
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: task_pb2.UpdateTaskStatusResponse(
                task=task_to_pb(request.task_id, applied.result, with_result=False),
                version=applied.version,
            ),
            self.domain.update_status,
            tenant_of(context),
            request.session_id,
            request.task_id,
            status,
            expected_version=request.expected_version,
        )

    async def StoreTaskResult(
        self, request: task_pb2.StoreTaskResultRequest, context: grpc.aio.ServicerContext
    ) -> task_pb2.StoreTaskResultResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: task_pb2.StoreTaskResultResponse(version=applied.version),
            self.domain.store_result,
            tenant_of(context),
            request.session_id,
            request.task_id,
            to_py(request.result, "result"),
            expected_version=request.expected_version,
        )

    async def GetTaskResult(
        self, request: task_pb2.GetTaskResultRequest, context: grpc.aio.ServicerContext
    ) -> task_pb2.GetTaskResultResponse:
        applied = await self.calls.read(
            CHEAP, self.domain.get_task, tenant_of(context), request.session_id, request.task_id
        )
        task = applied.result
        response = task_pb2.GetTaskResultResponse(
            has_result="result" in task,
            status=STATUS_TO_PB.get(task.get("status", ""), task_pb2.TASK_STATUS_UNSPECIFIED),
            version=applied.version,
        )
        if "result" in task:
            set_value(response.result, task["result"])
        return response

    async def ListTasks(
        self, request: task_pb2.ListTasksRequest, context: grpc.aio.ServicerContext
    ) -> task_pb2.ListTasksResponse:
        status = status_from_pb(request.status, required=False)
        tenant = tenant_of(context)

        def list_tasks() -> task_pb2.ListTasksResponse:
            applied = self.domain.list_tasks(tenant, request.session_id, status)
            return task_pb2.ListTasksResponse(
                tasks=[
                    task_to_pb(task_id, task, with_result=request.include_results)
                    for task_id, task in applied.result
                ],
                version=applied.version,
            )

        return await self.calls.run(IO, list_tasks)

    async def UpdateGlobalState(
        self, request: task_pb2.UpdateGlobalStateRequest, context: grpc.aio.ServicerContext
    ) -> task_pb2.UpdateGlobalStateResponse:
        mode = _MODES.get(request.mode)
        if mode is None:
            raise InvalidArgumentError(f"unknown global state update mode {request.mode}")
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: task_pb2.UpdateGlobalStateResponse(
                value=to_value(applied.result), version=applied.version
            ),
            self.domain.update_global,
            tenant_of(context),
            request.session_id,
            request.key,
            to_py(request.value, "value"),
            mode=mode,
            expected_version=request.expected_version,
        )

    async def GetGlobalState(
        self, request: task_pb2.GetGlobalStateRequest, context: grpc.aio.ServicerContext
    ) -> task_pb2.GetGlobalStateResponse:
        applied = await self.calls.read(
            CHEAP, self.domain.get_global, tenant_of(context), request.session_id, request.key
        )
        return task_pb2.GetGlobalStateResponse(
            value=to_value(applied.result), version=applied.version
        )
