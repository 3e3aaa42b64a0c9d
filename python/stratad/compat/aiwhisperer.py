"""AIWhisperer's state management functions on stratad.

AIWhisperer saves the runner's state dict as a JSON file (temp file + rename for
atomicity, a file lock against concurrent writers). Here the same calls keep it
in a stratad daemon::

    from stratad.compat import aiwhisperer

    aiwhisperer.configure(address="127.0.0.1:50051")   # or set STRATAD_ADDRESS
    aiwhisperer.save_state(state, "run/state.json")
    state = aiwhisperer.load_state("run/state.json")

- **Paths become sessions.** ``file_path`` names a stratad session through
  `session_id_for`: ``aiwhisperer:<file name>:<16 hex>``, where the file name is
  sanitized to ID characters (others become ``_``, at most 64 kept) and the hex
  is the start of the BLAKE3 of the absolute, normalized path. Readable, yet two
  files of the same name in different directories never share state. Spellings
  of one path (relative or absolute, ``a/../b``) map to the same session;
  symlinks are not resolved. No file is read or written.
- **Each save is a checkpoint.** ``save_state`` stores ``json.dumps(state)`` as a
  new checkpoint (content type ``application/vnd.aiwhisperer.state+json``),
  creating the session on first use with ``keep_last`` checkpoints of history
  and the labels ``stratad.compat=aiwhisperer`` and ``path=<absolute path>``.
  ``load_state`` returns the newest.
- **Atomicity and locking come from stratad:** a save is one journaled,
  fsynced record, and concurrent writers of a session are serialized by the
  daemon, so a reader sees one whole state or the previous one, never a mix.
- **Errors keep the file API's shape where AIWhisperer's callers rely on it:**
  ``load_state`` of a path never saved raises ``FileNotFoundError`` (errno
  ENOENT, ``filename`` set), as opening the missing file would; a state that
  is not JSON-serializable raises ``TypeError`` as ``json.dump`` does. Other
  failures are `stratad.errors` classes (e.g. `~stratad.errors.UnavailableError`
  when no daemon answers, `~stratad.errors.DataLossError` for damaged bytes).

The module uses one blocking `stratad.Client`, created on first use from
`configure`'s settings, or else from the ``STRATAD_ADDRESS`` environment
variable (default ``127.0.0.1:50051``) and the default tenant.

AIWhisperer's task and global-state helpers (``update_task_status``,
``store_task_result``, ``get_task_result``, ``update_global_state``,
``get_global_state``) keep their original behaviour on a plain dict. On a dict
from `bind` (a `BoundState`) each is one atomic call to the daemon's
TaskService, so concurrent processes updating one session never lose each
other's updates (no file lock needed), and the dict mirrors the result::

    state = aiwhisperer.bind("run/state.json")      # the session save_state uses
    aiwhisperer.update_task_status(state, "t1", "in-progress")
    aiwhisperer.store_task_result(state, "t1", {"rows": 3})
    aiwhisperer.update_global_state(state, "other_context", {"model": "x"})
    aiwhisperer.get_task_result(state, "t1")         # read from the daemon

On a bound state the status must be one of AIWhisperer's ``pending``,
``in-progress``, ``completed``, ``failed`` (``ValueError`` otherwise), and
results and values must be JSON. The session's tasks and global state are
captured by its checkpoints: ``save_state`` of a bound session's path records
them with the saved dict.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

from stratad import native
from stratad.api.v1 import task_pb2, task_pb2_grpc
from stratad.errors import AlreadyExistsError, NotFoundError
from stratad.sdk.client import Client
from stratad.sdk.connection import TLSConfig
from stratad.sdk.constants import ADDRESS_ENV
from stratad.values import to_py, to_value

__all__ = [
    "ADDRESS_ENV",
    "CONTENT_TYPE",
    "close",
    "configure",
    "load_state",
    "save_state",
    "session_id_for",
]

CONTENT_TYPE = "application/vnd.aiwhisperer.state+json"
SESSION_PREFIX = "aiwhisperer:"
DEFAULT_KEEP_LAST = 10

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NAME_CHARS = 64
_DIGEST_CHARS = 16

StrPath = str | os.PathLike[str]


@dataclass(frozen=True)
class _Settings:
    address: str | None  # None: $STRATAD_ADDRESS or 127.0.0.1:50051
    tenant: str
    keep_last: int
    token: str | None = None
    tls: TLSConfig | bool | None = None


_lock = threading.Lock()
_settings: _Settings | None = None
_client: Client | None = None


# -- configuration -------------------------------------------------------------------


def configure(
    address: str | None = None,
    tenant: str = "",
    *,
    keep_last: int = DEFAULT_KEEP_LAST,
    token: str | None = None,
    tls: TLSConfig | bool | None = None,
) -> None:
    """Point the module at a daemon (``address`` None: ``$STRATAD_ADDRESS`` or
    ``127.0.0.1:50051``) acting as ``tenant`` (empty: ``$STRATAD_TENANT``, else
    the daemon's default), with a bearer ``token`` and ``tls`` (None: the
    STRATAD_TOKEN and STRATAD_TLS* variables; see `stratad.sdk.connection`).

    ``keep_last`` is the checkpoint history kept per path (0 keeps all); it
    applies to sessions created from now on. Any open connection is closed.
    """
    if keep_last < 0:
        raise ValueError("keep_last must not be negative")
    global _settings
    with _lock:
        _close_locked()
        _settings = _Settings(address, tenant, keep_last, token, tls)


def close() -> None:
    """Close the module's connection; the next call opens a new one."""
    with _lock:
        _close_locked()


def _close_locked() -> None:
    global _client
    if _client is not None:
        _client.close()
        _client = None


def _current() -> tuple[Client, _Settings]:
    """The module's client and settings, created on first use (thread-safe)."""
    global _client, _settings
    with _lock:
        if _settings is None:
            _settings = _Settings(None, "", DEFAULT_KEEP_LAST)
        if _client is None:
            s = _settings
            _client = Client(s.address, tenant=s.tenant, token=s.token, tls=s.tls)
        return _client, _settings


# -- paths ---------------------------------------------------------------------------------


def _absolute(file_path: StrPath) -> str:
    return os.path.abspath(os.fsdecode(file_path))


def session_id_for(file_path: StrPath) -> str:
    """The stratad session that stands for `file_path` (see the module docstring)."""
    full = _absolute(file_path)
    name = _UNSAFE.sub("_", os.path.basename(full))[:_NAME_CHARS] or "root"
    digest = native.digest_hex(full.encode("utf-8", "surrogateescape"))[:_DIGEST_CHARS]
    return f"{SESSION_PREFIX}{name}:{digest}"


# -- AIWhisperer's API -------------------------------------------------------------------------


def save_state(state: dict[str, Any], file_path: StrPath) -> None:
    """Save the state dict as JSON under `file_path` (a new checkpoint of its session)."""
    data = json.dumps(state).encode("utf-8")
    client, settings = _current()
    session_id = session_id_for(file_path)
    try:
        client.save_state(session_id, data, content_type=CONTENT_TYPE)
        return
    except NotFoundError:
        pass
    labels = {"stratad.compat": "aiwhisperer", "path": _absolute(file_path)}
    with contextlib.suppress(AlreadyExistsError):  # another writer created it meanwhile
        client.create_session(session_id, labels=labels, keep_last=settings.keep_last)
    client.save_state(session_id, data, content_type=CONTENT_TYPE)


def load_state(file_path: StrPath) -> dict[str, Any]:
    """The state dict last saved under `file_path`; FileNotFoundError if none was."""
    client, _ = _current()
    try:
        loaded = client.load_state(session_id_for(file_path))
    except NotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, "no state saved in stratad for this path", os.fsdecode(file_path)
        ) from None
    state = json.loads(loaded.data)
    if not isinstance(state, dict):
        raise ValueError(f"the state saved for {os.fsdecode(file_path)!r} is not a JSON object")
    return state


# -- AIWhisperer's task and global-state helpers -----------------------------------------------

__all__ += [
    "BoundState",
    "bind",
    "get_global_state",
    "get_task_result",
    "store_task_result",
    "update_global_state",
    "update_task_status",
]

_TASK_STATUS = {
    "pending": task_pb2.TASK_STATUS_PENDING,
    "in-progress": task_pb2.TASK_STATUS_IN_PROGRESS,
    "completed": task_pb2.TASK_STATUS_COMPLETED,
    "failed": task_pb2.TASK_STATUS_FAILED,
}
_STATUS_NAME = {v: k for k, v in _TASK_STATUS.items()}


class BoundState(dict[str, Any]):
    """A state dict bound to a stratad session: the helpers update the daemon, then the dict.

    It holds ``{"tasks": {...}, "global_state": {...}}`` as the daemon had them at
    `bind` or `refresh`, plus every update made through the helpers since.
    """

    def __init__(self, session_id: str) -> None:
        super().__init__()
        self.session_id = session_id

    def refresh(self) -> BoundState:
        """Reload the tasks and global state from the daemon (other writers' updates too)."""
        stub = _task_stub()
        listed = _call(stub.ListTasks, task_pb2.ListTasksRequest(
            session_id=self.session_id, include_results=True
        ))  # fmt: skip
        tasks: dict[str, Any] = {}
        for task in listed.tasks:
            entry: dict[str, Any] = {}
            if task.status:
                entry["status"] = _STATUS_NAME[task.status]
            if task.has_result:
                entry["result"] = to_py(task.result)
            tasks[task.task_id] = entry
        whole = _call(stub.GetGlobalState, task_pb2.GetGlobalStateRequest(
            session_id=self.session_id
        ))  # fmt: skip
        self.clear()
        self["tasks"] = tasks
        self["global_state"] = to_py(whole.value)
        return self


def bind(file_path: StrPath | None = None, *, session_id: str | None = None) -> BoundState:
    """A `BoundState` on the session of `file_path` (the one `save_state` uses) or on
    `session_id`, created when missing, holding its current tasks and global state."""
    if (file_path is None) == (session_id is None):
        raise ValueError("give either file_path or session_id")
    client, settings = _current()
    if file_path is not None:
        session_id = session_id_for(file_path)
        labels = {"stratad.compat": "aiwhisperer", "path": _absolute(file_path)}
    else:
        labels = {"stratad.compat": "aiwhisperer"}
    assert session_id is not None
    with contextlib.suppress(AlreadyExistsError):
        client.create_session(session_id, labels=labels, keep_last=settings.keep_last)
    return BoundState(session_id).refresh()


def _task_stub() -> task_pb2_grpc.TaskServiceStub:
    client, _ = _current()
    return task_pb2_grpc.TaskServiceStub(client.channel)


def _call(method: Any, request: Any) -> Any:
    client, _ = _current()
    return client.call(method, request)


def _task_entry(state: dict[str, Any], task_id: Any) -> dict[str, Any]:
    if "tasks" not in state:
        state["tasks"] = {}
    if task_id not in state["tasks"]:
        state["tasks"][task_id] = {}
    return state["tasks"][task_id]  # type: ignore[no-any-return]


def update_task_status(state: dict[str, Any], task_id: str, status: str) -> dict[str, Any]:
    """Set a task's status (creating the task); returns `state`."""
    if isinstance(state, BoundState):
        code = _TASK_STATUS.get(str(status).strip().lower().replace("_", "-"))
        if code is None:
            raise ValueError(
                f"unknown task status {status!r} (pending, in-progress, completed, failed)"
            )
        request = task_pb2.UpdateTaskStatusRequest(
            session_id=state.session_id, task_id=task_id, status=code
        )
        _call(_task_stub().UpdateTaskStatus, request)
        status = _STATUS_NAME[code]
    _task_entry(state, task_id)["status"] = status
    return state


def store_task_result(state: dict[str, Any], task_id: str, result: Any) -> dict[str, Any]:
    """Store a task's intermediate result (creating the task); returns `state`."""
    if isinstance(state, BoundState):
        request = task_pb2.StoreTaskResultRequest(
            session_id=state.session_id, task_id=task_id, result=to_value(result)
        )
        _call(_task_stub().StoreTaskResult, request)
    _task_entry(state, task_id)["result"] = result
    return state


def get_task_result(state: dict[str, Any], task_id: str) -> Any:
    """A task's result, or None if the task or its result is not found."""
    if isinstance(state, BoundState):
        request = task_pb2.GetTaskResultRequest(session_id=state.session_id, task_id=task_id)
        try:
            got = _call(_task_stub().GetTaskResult, request)
        except NotFoundError:
            return None
        if not got.has_result:
            return None
        result = to_py(got.result)
        _task_entry(state, task_id)["result"] = result
        return result
    return state.get("tasks", {}).get(task_id, {}).get("result", None)


def update_global_state(state: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """Set one key of the global state; returns `state`."""
    if isinstance(state, BoundState):
        request = task_pb2.UpdateGlobalStateRequest(
            session_id=state.session_id, key=key, value=to_value(value)
        )
        _call(_task_stub().UpdateGlobalState, request)
    if "global_state" not in state:
        state["global_state"] = {}
    state["global_state"][key] = value
    return state


def get_global_state(state: dict[str, Any], key: str) -> Any:
    """One key of the global state, or None when it is not set."""
    if isinstance(state, BoundState):
        request = task_pb2.GetGlobalStateRequest(session_id=state.session_id, key=key)
        try:
            value = to_py(_call(_task_stub().GetGlobalState, request).value)
        except NotFoundError:
            return None
        state.setdefault("global_state", {})[key] = value
        return value
    return state.get("global_state", {}).get(key, None)
