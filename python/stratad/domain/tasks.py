"""Tasks and global state of a session (AIWhisperer's state dict).

``SessionState.structured["tasks"]``::

    {"tasks": {task_id: {"status": "pending" | "in-progress" | "completed" | "failed",
                         "result": <JSON>,           # once stored
                         "created_at": float, "updated_at": float}},
     "global_state": {key: <JSON>}}

As in AIWhisperer, updating the status or storing the result of an unknown task
creates it; a task created by its result has no status yet. Record kinds:
task.status, task.result, task.global.

The shape is `TasksFacet` (TypedDicts: the JSON above, nothing else); `parse`
checks a facet from outside against it (ReplaceStructuredState).
"""

from __future__ import annotations

import enum
from typing import Any, NotRequired, TypedDict, cast

from stratad.domain import structured as st
from stratad.domain.models import SessionState, reducer
from stratad.domain.sessions import Commit, LiveSession, SessionManager
from stratad.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from stratad.ids import validate_id

FACET = "tasks"
#: Most tasks, and most global state keys, of one session.
MAX_TASKS = 100_000
MAX_GLOBAL_KEYS = 10_000


class TaskStatus(enum.StrEnum):
    """AIWhisperer's four statuses, spelled as AIWhisperer spells them."""

    PENDING = "pending"
    IN_PROGRESS = "in-progress"
    COMPLETED = "completed"
    FAILED = "failed"


class GlobalMode(enum.StrEnum):
    SET = "set"
    APPEND = "append"
    MERGE = "merge"


# -- the facet's shape ----------------------------------------------------------------------


class Task(TypedDict):
    status: NotRequired[str]  # a TaskStatus value; none for a task created by its result
    result: NotRequired[st.Json]  # once stored
    created_at: float
    updated_at: float


class TaskChange(TypedDict, total=False):
    """What a task.status or task.result record changes."""

    status: str
    result: st.Json


class TasksFacet(TypedDict):
    """``SessionState.structured["tasks"]``."""

    tasks: dict[str, Task]  # in creation order
    global_state: st.JsonObject


def parse(raw: object) -> TasksFacet:
    """`raw` as a tasks facet, or INVALID_ARGUMENT naming the first field that is not.

    Accepts what the facet's own RPCs store (their bounds included), so a
    facet that parses is one every reader serves (see structured.py).
    """
    facet = st.want_object(raw, FACET, tuple(TasksFacet.__annotations__))
    path = f"{FACET}.tasks"
    tasks = st.want_map(facet["tasks"], path, max_items=MAX_TASKS, ids=True)
    statuses = [s.value for s in TaskStatus]
    for task_id, raw_task in tasks.items():
        where = f"{path}[{task_id!r}]"
        task = st.want_object(raw_task, where, ("created_at", "updated_at"), ("status", "result"))
        if "status" in task:
            st.want_one_of(task["status"], f"{where}.status", statuses)
        if "result" in task:
            st.want_json(task["result"], f"{where}.result")
        st.want_time(task["created_at"], f"{where}.created_at")
        st.want_time(task["updated_at"], f"{where}.updated_at")
    path = f"{FACET}.global_state"
    values = st.want_map(facet["global_state"], path, max_items=MAX_GLOBAL_KEYS)
    for key, value in values.items():
        st.want_json(value, f"{path}[{key!r}]")
    return cast(TasksFacet, facet)


def _facet(state: SessionState) -> TasksFacet:
    """The session's tasks facet, made (empty) if it has none yet: for the reducers."""
    facet: TasksFacet | None = state.structured.get(FACET)
    if facet is None:
        facet = {"tasks": {}, "global_state": {}}
        state.structured[FACET] = facet
    return facet


# The readers' views (empty when the session has no tasks facet). Typed without
# parsing: what the facet holds was written by the reducers below or passed
# `parse` (see structured.py).


def _tasks(state: SessionState) -> dict[str, Task]:
    facet: TasksFacet | None = state.structured.get(FACET)
    return facet.get("tasks", {}) if facet else {}


def _globals(state: SessionState) -> st.JsonObject:
    facet: TasksFacet | None = state.structured.get(FACET)
    return facet.get("global_state", {}) if facet else {}


# -- reducers ------------------------------------------------------------------------------

# Record bodies are the journal's JSON (models.Reducer: dict[str, Any]); each
# reducer reads the values its plan below put there into the typed facet.


def _touch(state: SessionState, task_id: str, at: float, change: TaskChange) -> None:
    tasks = _facet(state)["tasks"]
    old = tasks.get(task_id)
    if old:
        tasks[task_id] = {**old, **change, "updated_at": at}
    else:
        tasks[task_id] = {"created_at": at, **change, "updated_at": at}


@reducer("task.status")
def _apply_status(state: SessionState, body: dict[str, Any]) -> None:
    _touch(state, body["task_id"], body["at"], {"status": body["task_status"]})


@reducer("task.result")
def _apply_result(state: SessionState, body: dict[str, Any]) -> None:
    _touch(state, body["task_id"], body["at"], {"result": body["result"]})


@reducer("task.global")
def _apply_global(state: SessionState, body: dict[str, Any]) -> None:
    values = _facet(state)["global_state"]
    values[body["key"]] = merged(values.get(body["key"]), body["value"], GlobalMode(body["mode"]))


def merged(old: st.Json, value: st.Json, mode: GlobalMode) -> st.Json:
    """The new value of a global key (a new list or dict: readers may hold the old one).

    `old` is None (unset) or, for APPEND a list and for MERGE an object, and
    MERGE's `value` an object: update_global refuses anything else."""
    if mode is GlobalMode.APPEND:
        return [*(old if isinstance(old, list) else ()), value]
    if mode is GlobalMode.MERGE and isinstance(value, dict):
        return {**(old if isinstance(old, dict) else {}), **value}
    return value


# -- the service -----------------------------------------------------------------------------


class Tasks:
    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions

    def update_status(
        self,
        tenant: str,
        session_id: str,
        task_id: str,
        status: TaskStatus | str,
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[Task]:
        """Set a task's status (creating the task); the result is the task without its result."""
        validate_id(task_id, "task_id")
        task_status = _status(status)

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], Task]:
            old = _check_room(live.state, task_id)
            task: Task = {"created_at": at, "updated_at": at}
            if old:
                task = {**old, "updated_at": at}
                task.pop("result", None)
            task["status"] = task_status.value
            return {"task_id": task_id, "task_status": task_status.value}, task

        return st.mutate(
            self.sessions, tenant, session_id, expected_version, "task.status", plan, commit=commit
        )

    def store_result(
        self,
        tenant: str,
        session_id: str,
        task_id: str,
        result: st.Json,
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[None]:
        validate_id(task_id, "task_id")
        st.json_value(result, "result")

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], None]:
            _check_room(live.state, task_id)
            return {"task_id": task_id, "result": result}, None

        return st.mutate(
            self.sessions, tenant, session_id, expected_version, "task.result", plan, commit=commit
        )

    def get_task(self, tenant: str, session_id: str, task_id: str) -> st.Applied[Task]:
        """The task (status, result when stored, times); NOT_FOUND if unknown."""
        validate_id(task_id, "task_id")

        def get(state: SessionState) -> Task:
            task = _tasks(state).get(task_id)
            if task is None:
                raise NotFoundError(f"task {task_id!r} not found in session {session_id!r}")
            return task

        return st.read(self.sessions, tenant, session_id, get)

    def list_tasks(
        self, tenant: str, session_id: str, status: TaskStatus | str | None = None
    ) -> st.Applied[list[tuple[str, Task]]]:
        """(task_id, task) in creation order, optionally only those of `status`."""
        wanted = _status(status).value if status else None
        return st.read(
            self.sessions,
            tenant,
            session_id,
            lambda s: [
                (task_id, task)
                for task_id, task in _tasks(s).items()
                if wanted is None or task.get("status") == wanted
            ],
        )

    def update_global(
        self,
        tenant: str,
        session_id: str,
        key: str,
        value: st.Json,
        *,
        mode: GlobalMode | str = GlobalMode.SET,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[st.Json]:
        """Set, append to or merge into one global key; the result is its new value."""
        st.key(key, "key")
        st.json_value(value, "value")
        try:
            how = GlobalMode(mode)
        except ValueError:
            raise InvalidArgumentError(f"unknown global state update mode {mode!r}") from None
        if how is GlobalMode.MERGE and not isinstance(value, dict):
            raise InvalidArgumentError("MERGE needs an object value")

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], st.Json]:
            values = _globals(live.state)
            old = values.get(key)
            if key not in values and len(values) >= MAX_GLOBAL_KEYS:
                raise ResourceExhaustedError(
                    f"session {session_id!r} has {MAX_GLOBAL_KEYS} global state keys, the limit"
                )
            if how is GlobalMode.APPEND and old is not None and not isinstance(old, list):
                raise FailedPreconditionError(f"global state key {key!r} does not hold a list")
            if how is GlobalMode.MERGE and old is not None and not isinstance(old, dict):
                raise FailedPreconditionError(f"global state key {key!r} does not hold an object")
            new = merged(old, value, how)
            if how is not GlobalMode.SET:
                st.json_value(new, f"the value of global state key {key!r}")
            return {"key": key, "value": value, "mode": how.value}, new

        return st.mutate(
            self.sessions, tenant, session_id, expected_version, "task.global", plan, commit=commit
        )

    def get_global(self, tenant: str, session_id: str, key: str = "") -> st.Applied[st.Json]:
        """One key's value (NOT_FOUND when unset) or, with no key, the whole global state."""
        if key:
            st.key(key, "key")

        def get(state: SessionState) -> st.Json:
            values = _globals(state)
            if not key:
                return dict(values)
            if key not in values:
                raise NotFoundError(f"global state key {key!r} is not set")
            return values[key]

        return st.read(self.sessions, tenant, session_id, get)


def _status(status: TaskStatus | str) -> TaskStatus:
    try:
        return TaskStatus(status)
    except ValueError:
        allowed = ", ".join(s.value for s in TaskStatus)
        raise InvalidArgumentError(f"unknown task status {status!r} ({allowed})") from None


def _check_room(state: SessionState, task_id: str) -> Task | None:
    tasks = _tasks(state)
    old = tasks.get(task_id)
    if old is None and len(tasks) >= MAX_TASKS:
        raise ResourceExhaustedError(
            f"session {state.session_id!r} has {MAX_TASKS} tasks, the limit"
        )
    return old
