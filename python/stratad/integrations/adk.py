"""A Google ADK session service that keeps sessions in a stratad daemon.

    from stratad.integrations.adk import StratadSessionService

    runner = Runner(app_name="support", agent=agent,
                    session_service=StratadSessionService("127.0.0.1:50051"))

`StratadSessionService` implements ADK's `BaseSessionService` (create, get,
list and delete a session, `append_event` with its state delta, `get_user_state`)
with ADK's semantics for the `app:`, `user:` and `temp:` state scopes and
`GetSessionConfig`'s filters. How it maps onto stratad (see docs/adk.md):

- an ADK session (app, user, session ID) is one stratad session,
  ``adk.<app>.<user>.<session>``: each part is kept as it is when it is made of
  ASCII letters, digits, ``_`` and ``-``, other characters are escaped as
  ``:<hex of each UTF-8 byte>`` (``.`` is the separator, so an encoded part has
  none), and a part longer than 40 characters once encoded is ``:h<hash>``; the
  labels keep the original names;
- the session is one state: its events (one JSON object a line, in the order
  they were appended), then its session-scoped state and the session's times.
  Every `append_event` saves the whole document as a new checkpoint,
  conditional on the session's version (``expected_version``). The events are a
  prefix that only grows, so stratad's content-defined chunking and delta
  frames store (and the SDK uploads) about what the step added, not the
  history again;
- ``app:`` keys live in the global state (TaskService) of the stratad session
  ``adk-app.<app>``, ``user:`` keys in that of ``adk-user.<app>.<user>``: one
  MERGE per scope and event, applied atomically by the daemon (just before the
  event is saved), so writers in any number of processes never lose each
  other's keys; ``temp:`` keys are
  never stored (they stay in the in-memory session of the invocation, as ADK
  does);
- a session object carries the stratad version it was read or written at
  (ADK's storage marker): appending to an older copy of a session raises ADK's
  `StaleSessionError`, as DatabaseSessionService does; an event equal to one
  among the last 256 KiB of stored events (a retried append, an event
  delivered twice) is not stored again.

Errors: the ones ADK defines are raised as classes that are both the ADK error
and the `stratad.errors` class of the failure (`AlreadyExistsError`,
`SessionNotFoundError`, `StaleSessionError`; an invalid argument is a
`ValueError`); `get_session` of an unknown session is None and deleting one is
a no-op, as in ADK's own services; other failures (`UnavailableError`,
`DataLossError`, ...) are raised as the `stratad.errors` class they are.

Every call runs a blocking `stratad.Client` in a worker thread, so one service
serves every event loop (ADK's `Runner.run` starts one per call).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import string
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError as AdkAlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.platform import time as platform_time
from google.adk.platform import uuid as platform_uuid
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.protobuf import struct_pb2
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from stratad.api.v1 import checkpoint_pb2, session_pb2, task_pb2, task_pb2_grpc
from stratad.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    StratadError,
    VersionConflictError,
    session_not_found,
)
from stratad.sdk.client import Client, save_request
from stratad.sdk.connection import Connection, TLSConfig

__all__ = [
    "CONTENT_TYPE",
    "StratadSessionService",
    "app_state_id",
    "decode_part",
    "encode_part",
    "session_id_of",
    "user_state_id",
]

logger = logging.getLogger(__name__)

#: The content type of the states this service saves.
CONTENT_TYPE = "application/vnd.google.adk.session+json"
#: Session labels of the sessions this service creates.
INTEGRATION_LABEL = "stratad.integration"
APP_LABEL = "adk.app_name"
USER_LABEL = "adk.user_id"
SESSION_LABEL = "adk.session_id"
#: The daemon's idle-session sweep (session_idle_ttl) never expires sessions with it.
KEEP_LABEL = "stratad.dev/keep"
#: The global-state key of the app and user sessions that holds a scope's values.
SCOPE_KEY = "state"
#: Session state up to this size (as JSON) also goes into the checkpoint's
#: metadata, so `list_sessions` reads it without loading the events.
STATE_IN_METADATA_BYTES = 4096
#: An event equal to one of the stored events in this many bytes at the end of
#: the history is not stored again (a retried append, an event delivered twice).
DEDUP_WINDOW_BYTES = 256 << 10
#: Attempts of one append when another writer's save keeps landing first
#: (only for session objects without a storage marker; with one, a lost race
#: is a stale session).
MAX_ATTEMPTS = 16

_STALE_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
_SAFE = frozenset(string.ascii_letters + string.digits + "_-")
_HEX = frozenset("0123456789abcdef")
#: An encoded part longer than this is hashed: three parts and the prefix stay
#: within stratad's 128 characters.
_PART_BUDGET = 40
_MAX_LABEL_VALUE = 256
_HEAD = b'{"adk_session":1,"events":['
_EVENTS_END = b'\n],"state":'
_SEP = "."

#: Parses a JSON array of events in one call (several times faster than one at a time).
_EVENTS = TypeAdapter(list[Event])

P = ParamSpec("P")
R = TypeVar("R")


# -- IDs -----------------------------------------------------------------------------------


def encode_part(value: str) -> str:
    """One name (app, user or session ID) as a piece of a stratad ID.

    ASCII letters, digits, ``_`` and ``-`` are kept; any other character is
    ``:`` and two lowercase hex digits per UTF-8 byte (``.`` and ``:``
    included), so the result has no ``.`` and decodes back (`decode_part`). A
    result longer than 40 characters is ``:h`` and 24 hex digits of a BLAKE2b
    hash instead (the labels keep the name)."""
    out = "".join(c if c in _SAFE else "".join(f":{b:02x}" for b in c.encode()) for c in value)
    if len(out) > _PART_BUDGET:
        return ":h" + hashlib.blake2b(value.encode(), digest_size=12).hexdigest()
    return out


def decode_part(part: str) -> str | None:
    """The name `encode_part` encoded as `part`; None for a hashed one."""
    if part.startswith(":h"):
        return None
    raw = bytearray()
    i = 0
    while i < len(part):
        c = part[i]
        if c == ":":
            pair = part[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                raise ValueError(f"not an encoded name: {part!r}")
            raw.append(int(pair, 16))
            i += 3
        elif c in _SAFE:
            raw += c.encode()
            i += 1
        else:
            raise ValueError(f"not an encoded name: {part!r}")
    return raw.decode()


def session_id_of(app_name: str, user_id: str, session_id: str) -> str:
    """The stratad session of an ADK session."""
    return _SEP.join(("adk", encode_part(app_name), encode_part(user_id), encode_part(session_id)))


def app_state_id(app_name: str) -> str:
    """The stratad session holding an app's ``app:`` state."""
    return f"adk-app.{encode_part(app_name)}"


def user_state_id(app_name: str, user_id: str) -> str:
    """The stratad session holding a user's ``user:`` state in an app."""
    return f"adk-user.{encode_part(app_name)}.{encode_part(user_id)}"


def _sessions_prefix(app_name: str, user_id: str | None) -> str:
    parts = ["adk", encode_part(app_name)]
    if user_id is not None:
        parts.append(encode_part(user_id))
    return _SEP.join(parts) + _SEP


# -- state ----------------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    """`value` as JSON data; what has no JSON form becomes its string (as ADK's
    database services store it), with a warning."""
    try:
        return to_jsonable_python(value)
    except Exception:
        logger.warning(
            "some state values are not JSON-serializable (e.g. callables) and are stored as "
            "their string representation",
            exc_info=True,
        )
        return to_jsonable_python(value, fallback=str)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class _Scopes:
    """A state (or state delta) split by scope; ``temp:`` keys are dropped."""

    app: dict[str, Any]
    user: dict[str, Any]
    session: dict[str, Any]

    @classmethod
    def of(cls, state: Mapping[str, Any] | None) -> _Scopes:
        app: dict[str, Any] = {}
        user: dict[str, Any] = {}
        session: dict[str, Any] = {}
        for key, value in (state or {}).items():
            if key.startswith(State.APP_PREFIX):
                app[key.removeprefix(State.APP_PREFIX)] = value
            elif key.startswith(State.USER_PREFIX):
                user[key.removeprefix(State.USER_PREFIX)] = value
            elif not key.startswith(State.TEMP_PREFIX):
                session[key] = value
        return cls(app, user, session)


def _merged(
    session: Mapping[str, Any], app: Mapping[str, Any], user: Mapping[str, Any]
) -> dict[str, Any]:
    state = dict(session)
    state.update({State.APP_PREFIX + k: v for k, v in app.items()})
    state.update({State.USER_PREFIX + k: v for k, v in user.items()})
    return state


# -- the stored document --------------------------------------------------------------------


def encode_document(events: Sequence[bytes], state_json: bytes, meta: Mapping[str, Any]) -> bytes:
    """A session as one JSON object, one event a line:

        {"adk_session":1,"events":[
        {...event 0...},
        {...event 1...}
        ],"state":{...},"meta":{...}}

    The events come first, so appending one keeps every earlier byte. (JSON
    text holds no raw newline, so the lines are the events.)"""
    parts = [_HEAD]
    if events:
        parts += [b"\n", b",\n".join(events)]
    parts += [_EVENTS_END, state_json, b',"meta":', _dumps(meta), b"}"]
    return b"".join(parts)


def decode_document(data: bytes) -> tuple[list[bytes], bytes, dict[str, Any]]:
    """(event lines, state JSON, meta) of a document `encode_document` wrote."""
    stored = _Stored.parse(0, data)
    return stored.lines(), stored.state_json, stored.meta


@dataclass(frozen=True)
class _Stored:
    """A session document as stored at one version of its stratad session: its
    bytes (which the next append extends) and where its parts are."""

    version: int
    doc: bytes
    #: Offset of the newline that ends the events (before `],"state":`).
    events_end: int
    count: int
    state_json: bytes
    meta: dict[str, Any]

    @classmethod
    def parse(cls, version: int, doc: bytes) -> _Stored:
        end = doc.rfind(b"\n")
        if not doc.startswith(_HEAD + b"\n") or doc[end : end + len(_EVENTS_END)] != _EVENTS_END:
            raise ValueError("not a session document of StratadSessionService")
        tail = json.loads(b"{" + doc[end + 3 :])
        count = doc.count(b"\n", 0, end)
        return cls(version, doc, end, count, _dumps(tail["state"]), dict(tail["meta"]))

    def appended(self, line: bytes, state_json: bytes, meta: Mapping[str, Any]) -> _Stored:
        """This document with one more event, and the state and meta given (not saved yet)."""
        sep = b",\n" if self.count else b"\n"
        doc = b"".join([memoryview(self.doc)[: self.events_end], sep, line, _EVENTS_END,
                        state_json, b',"meta":', _dumps(meta), b"}"])  # fmt: skip
        end = self.events_end + len(sep) + len(line)
        return _Stored(self.version, doc, end, self.count + 1, state_json, dict(meta))

    def lines(self, last: int | None = None) -> list[bytes]:
        """The events' JSON (the `last` ones only, when given), in order."""
        if not self.count or last == 0:
            return []
        body = self.doc[len(_HEAD) + 1 : self.events_end]
        pieces = body.split(b"\n") if last is None else body.rsplit(b"\n", last)[-last:]
        return [piece.removesuffix(b",") for piece in pieces]

    def events_json(self, last: int | None = None) -> bytes:
        """The events (the `last` ones only, when given) as one JSON array."""
        if last is None:
            return self.doc[len(_HEAD) - 1 : self.events_end] + b"\n]"
        return b"[" + b",".join(self.lines(last)) + b"]"

    def holds(self, line: bytes) -> bool:
        """Whether `line` is one of the recent stored events (those in the last
        `DEDUP_WINDOW_BYTES` of them), byte for byte."""
        start = max(0, self.events_end - DEDUP_WINDOW_BYTES - len(line))
        stop = self.events_end + 1
        return (
            self.doc.find(b"\n" + line + b",\n", start, stop) >= 0
            or self.doc.find(b"\n" + line + b"\n", start, stop) >= 0
        )

    def last_is(self, line: bytes) -> bool:
        """Whether `line` is the last stored event."""
        start = self.events_end - len(line) - 1
        return self.count > 0 and self.doc[start : self.events_end] == b"\n" + line

    @property
    def size(self) -> int:
        return len(self.doc)

    @property
    def last_update_time(self) -> float:
        return float(self.meta.get("last_update_time") or 0.0)

    def last_event_id(self) -> str | None:
        if not self.count:
            return None
        start = self.doc.rfind(b"\n", 0, self.events_end) + 1
        return str(json.loads(self.doc[start : self.events_end].removesuffix(b",")).get("id"))


class _Cache:
    """The documents last read or written, by stratad session (LRU, bounded in bytes)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[str, _Stored] = collections.OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> _Stored | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: str, item: _Stored) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if item.size > self.max_bytes:
                return
            self._items[key] = item
            self._bytes += item.size
            while self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.size

    def drop(self, key: str) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.size


# -- errors ------------------------------------------------------------------------------------

_ERROR_CLASSES: dict[tuple[type[Exception], type[StratadError]], type[Exception]] = {}
_ERROR_CLASSES_LOCK = threading.Lock()


def adk_error(adk_class: type[Exception], exc: StratadError, message: str = "") -> Exception:
    """`exc` as an exception that is both `adk_class` (what ADK's callers
    catch) and `exc`'s own `stratad.errors` class (reason and metadata kept)."""
    base = type(exc)
    with _ERROR_CLASSES_LOCK:
        cls = _ERROR_CLASSES.get((adk_class, base))
        if cls is None:
            name = f"{adk_class.__name__}From{base.__name__}"

            def __init__(self: Any, message: str, reason: str, metadata: dict[str, str]) -> None:
                StratadError.__init__(self, message, reason=reason, metadata=metadata)

            def __str__(self: Any) -> str:
                return str(self.message)

            cls = type(name, (adk_class, base), {"__init__": __init__, "__str__": __str__})
            cls.__module__ = __name__
            _ERROR_CLASSES[(adk_class, base)] = cls
    error = cls(message or exc.message, exc.reason, exc.metadata)  # type: ignore[call-arg]
    return error


# -- the service ---------------------------------------------------------------------------------


class StratadSessionService(BaseSessionService):
    """An ADK session service over a stratad daemon (see the module docstring).

    Args:
        address: the daemon's gRPC address (ignored when `client` is given);
            None: ``$STRATAD_ADDRESS`` or 127.0.0.1:50051.
        tenant: the tenant to act in; "": ``$STRATAD_TENANT``, else the
            daemon's default (with auth on: the token's own tenant).
        token: bearer token; None: ``$STRATAD_TOKEN`` / ``$STRATAD_TOKEN_FILE``.
        tls: a `stratad.TLSConfig`, True or False; None: the STRATAD_TLS* variables.
        client: an existing `stratad.Client` to use (not closed by `close`).
        timeout: deadline of each call, in seconds.
        keep_last: retention of each ADK session's checkpoints (one per
            appended event; 0 = keep them all).
        keep: label the ADK sessions ``stratad.dev/keep=true``, so that the
            daemon's ``session_idle_ttl`` never expires them (the app and user
            state sessions always have it).
        cache_bytes: memory for the documents last read or written (they make
            an append one call, and a `get_session` of an unchanged session one
            small call).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        client: Client | None = None,
        timeout: float = 30.0,
        keep_last: int = 0,
        keep: bool = False,
        cache_bytes: int = 64 << 20,
    ) -> None:
        if client is not None:
            self.connection = client.connection
        else:
            self.connection = Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        self.address = self.connection.address
        self.tenant = self.connection.tenant
        self.timeout = timeout
        self.keep_last = keep_last
        self.keep = keep
        self._client = client
        self._own_client = client is None
        self._client_lock = threading.Lock()
        self._tasks: task_pb2_grpc.TaskServiceStub | None = None
        self._cache = _Cache(cache_bytes)
        self._locks: dict[str, tuple[threading.Lock, int]] = {}
        self._locks_guard = threading.Lock()

    # -- plumbing ------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        with self._client_lock:
            if self._client is None:
                self._client = Client.from_connection(self.connection, timeout=self.timeout)
            return self._client

    @property
    def tasks(self) -> task_pb2_grpc.TaskServiceStub:
        client = self.client
        with self._client_lock:
            if self._tasks is None:
                self._tasks = task_pb2_grpc.TaskServiceStub(client.channel)
            return self._tasks

    def close_sync(self) -> None:
        """Close the client this service created (not one it was given)."""
        with self._client_lock:
            if self._own_client and self._client is not None:
                self._client.close()
                self._client = None
                self._tasks = None

    async def close(self) -> None:
        self.close_sync()

    async def __aenter__(self) -> StratadSessionService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> StratadSessionService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_sync()

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """Serialize this process's appends to one session (as DatabaseSessionService
        does): a session object shared by parallel agents must not race itself."""
        with self._locks_guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._locks_guard:
                lock, users = self._locks[key]
                if users <= 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def _labels(self, app_name: str, user_id: str, session_id: str) -> dict[str, str]:
        labels = {INTEGRATION_LABEL: "adk"}
        for label, value in (
            (APP_LABEL, app_name),
            (USER_LABEL, user_id),
            (SESSION_LABEL, session_id),
        ):
            if len(value) <= _MAX_LABEL_VALUE:
                labels[label] = value
        if self.keep:
            labels[KEEP_LABEL] = "true"
        return labels

    # -- documents -----------------------------------------------------------------------

    def _load(self, key: str) -> _Stored | None:
        """The session's document as stored now (None: no such session)."""
        client = self.client
        request = checkpoint_pb2.LoadStateRequest(session_id=key)
        try:
            loaded = client.call(client.checkpoints.LoadState, request)
        except NotFoundError as exc:
            if exc.reason == "SESSION_NOT_FOUND":
                self._cache.drop(key)
                return None
            # Created, but its first save never landed (the creator died in
            # between): an empty session.
            try:
                info = client.get_session(key)
            except NotFoundError:
                self._cache.drop(key)
                return None
            created = info.created_at.ToDatetime().timestamp()
            meta = {
                "app_name": info.labels.get(APP_LABEL, ""),
                "user_id": info.labels.get(USER_LABEL, ""),
                "id": info.labels.get(SESSION_LABEL, ""),
                "created": created,
                "last_update_time": created,
            }
            stored = _Stored.parse(info.version, encode_document((), b"{}", meta))
        else:
            if loaded.content_type != CONTENT_TYPE:
                raise ValueError(
                    f"stratad session {key!r} was not written by StratadSessionService "
                    f"(content type {loaded.content_type!r})"
                )
            stored = _Stored.parse(loaded.version, loaded.data)
        self._cache.put(key, stored)
        return stored

    def _current(self, key: str) -> _Stored | None:
        """The document as stored now: the cached one when the session has not
        changed since (one small GetSession call), else loaded."""
        cached = self._cache.get(key)
        if cached is not None:
            try:
                version = self.client.get_session(key).version
            except NotFoundError:
                self._cache.drop(key)
                return None
            if version == cached.version:
                return cached
        return self._load(key)

    def _save(self, key: str, stored: _Stored, expected_version: int) -> _Stored:
        """Save `stored`'s document, conditional on `expected_version`; returns it
        at its new version (and caches it)."""
        state_json = stored.state_json
        metadata: dict[str, Any] = {
            "adk_last_update_time": stored.last_update_time,
            "adk_events": stored.count,
        }
        if len(state_json) <= STATE_IN_METADATA_BYTES:
            metadata["adk_state"] = state_json.decode()
        request = save_request(
            key,
            b"",
            content_type=CONTENT_TYPE,
            metadata=metadata,
            expected_version=expected_version,
        )
        response = self.client.save(request, stored.doc)
        saved = dataclasses.replace(stored, version=response.version)
        self._cache.put(key, saved)
        return saved

    # -- app and user state ------------------------------------------------------------

    def _scope_get(self, key: str) -> dict[str, Any]:
        request = task_pb2.GetGlobalStateRequest(session_id=key, key=SCOPE_KEY)
        try:
            response = self.client.call(self.tasks.GetGlobalState, request)
        except NotFoundError:
            return {}
        return _scope_values(response.value)

    def _scope_merge(
        self, key: str, delta: Mapping[str, Any], labels: dict[str, str]
    ) -> dict[str, Any]:
        """Set the keys of `delta` in a scope (one atomic MERGE); returns the scope's values."""
        value = struct_pb2.Value()
        value.struct_value.update(
            {k: _dumps(v).decode() for k, v in _json_safe(dict(delta)).items()}
        )
        request = task_pb2.UpdateGlobalStateRequest(
            session_id=key,
            key=SCOPE_KEY,
            value=value,
            mode=task_pb2.GLOBAL_UPDATE_MODE_MERGE,
        )
        client = self.client
        for _ in range(3):
            try:
                response = client.call(self.tasks.UpdateGlobalState, request)
                return _scope_values(response.value)
            except NotFoundError as exc:
                if exc.reason != "SESSION_NOT_FOUND":
                    raise
                client.create_session(key, labels=labels, exist_ok=True)
        response = client.call(self.tasks.UpdateGlobalState, request)
        return _scope_values(response.value)

    def _scope_labels(self, app_name: str, user_id: str | None) -> dict[str, str]:
        labels = {INTEGRATION_LABEL: "adk", KEEP_LABEL: "true"}
        if len(app_name) <= _MAX_LABEL_VALUE:
            labels[APP_LABEL] = app_name
        if user_id is not None and len(user_id) <= _MAX_LABEL_VALUE:
            labels[USER_LABEL] = user_id
        return labels

    def _write_scopes(
        self, app_name: str, user_id: str, scopes: _Scopes
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        app = user = None
        if scopes.app:
            app = self._scope_merge(
                app_state_id(app_name), scopes.app, self._scope_labels(app_name, None)
            )
        if scopes.user:
            user = self._scope_merge(
                user_state_id(app_name, user_id), scopes.user, self._scope_labels(app_name, user_id)
            )
        return app, user

    # -- blocking implementations ---------------------------------------------------------

    def _create(
        self, app_name: str, user_id: str, state: dict[str, Any] | None, session_id: str, now: float
    ) -> Session:
        key = session_id_of(app_name, user_id, session_id)
        scopes = _Scopes.of(state)
        try:
            created = self.client.create_session(
                key, labels=self._labels(app_name, user_id, session_id), keep_last=self.keep_last
            )
        except AlreadyExistsError as exc:
            raise adk_error(
                AdkAlreadyExistsError, exc, f"Session with id {session_id} already exists."
            ) from None
        meta = {
            "app_name": app_name,
            "user_id": user_id,
            "id": session_id,
            "created": now,
            "last_update_time": now,
        }
        state_json = _dumps(_json_safe(scopes.session))
        first = _Stored.parse(created.version, encode_document((), state_json, meta))
        saved = self._save(key, first, created.version)
        app, user = self._write_scopes(app_name, user_id, scopes)
        if app is None:
            app = self._scope_get(app_state_id(app_name))
        if user is None:
            user = self._scope_get(user_state_id(app_name, user_id))
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=_merged(json.loads(saved.state_json), app, user),
            last_update_time=now,
        )
        session._storage_update_marker = str(saved.version)
        return session

    def _get(
        self, app_name: str, user_id: str, session_id: str, config: GetSessionConfig | None
    ) -> tuple[_Stored, list[Event]] | None:
        stored = self._current(session_id_of(app_name, user_id, session_id))
        if stored is None:
            return None
        last = config.num_recent_events if config is not None else None
        events = _EVENTS.validate_json(stored.events_json(last)) if stored.count else []
        if config is not None and config.after_timestamp is not None:
            # As InMemorySessionService: the events after the last one older than it.
            i = len(events) - 1
            while i >= 0 and events[i].timestamp >= config.after_timestamp:
                i -= 1
            events = events[i + 1 :]
        return stored, events

    def _append(
        self,
        session: Session,
        event: Event,
        line: bytes,
        scopes: _Scopes,
    ) -> tuple[_Stored, bool]:
        """Save `event` (JSON `line`) into the session; returns the document as
        saved and whether the event is new (False: it was stored already).

        The event's `app:` and `user:` keys are merged first (one call per
        scope), once the session object is known to be current: a value the
        daemon refuses then stores nothing, and a stale session object changes
        nothing unless another writer lands between that check and the save."""
        key = session_id_of(session.app_name, session.user_id, session.id)
        marker = _marker(session)
        scoped = bool(scopes.app or scopes.user)
        with self._locked(key):
            stored = self._cache.get(key)
            if stored is None or marker is None or stored.version != marker:
                stored = self._load(key)
            elif scoped:
                stored = self._current(key)  # one small call: nobody else wrote?
            for _ in range(MAX_ATTEMPTS):
                if stored is None:
                    raise adk_error(
                        SessionNotFoundError,
                        session_not_found(key),
                        f"Session {session.id} not found.",
                    )
                if stored.holds(line):  # delivered again (a retry, a broadcast)
                    return stored, False
                _check_not_stale(session, marker, stored)
                if scoped:
                    self._write_scopes(session.app_name, session.user_id, scopes)
                    scoped = False
                state = json.loads(stored.state_json)
                state.update(_json_safe(scopes.session))
                meta = {**stored.meta, "last_update_time": event.timestamp}
                new = stored.appended(line, _dumps(state), meta)
                try:
                    return self._save(key, new, stored.version), True
                except VersionConflictError as exc:
                    stored = self._load(key)
                    if marker is not None and (stored is None or not stored.holds(line)):
                        raise adk_error(StaleSessionError, exc, _STALE_MESSAGE) from None
                except NotFoundError as exc:
                    self._cache.drop(key)
                    if exc.reason == "SESSION_NOT_FOUND":
                        raise adk_error(
                            SessionNotFoundError, exc, f"Session {session.id} not found."
                        ) from None
                    raise
            raise adk_error(
                StaleSessionError,
                VersionConflictError(f"{MAX_ATTEMPTS} attempts lost the race to other writers"),
                _STALE_MESSAGE,
            )

    def _list(self, app_name: str, user_id: str | None) -> list[Session]:
        client = self.client
        listed = list(
            client.list_sessions(prefix=_sessions_prefix(app_name, user_id), page_size=1000)
        )
        ours = [s for s in listed if s.labels.get(INTEGRATION_LABEL) == "adk"]
        app_state = self._scope_get(app_state_id(app_name))
        user_states: dict[str, dict[str, Any]] = {}
        sessions = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(8, len(ours)))) as pool:
            found_all = list(pool.map(self._listed, ours))
        for found in found_all:
            if found is None:
                continue  # deleted meanwhile
            session_id, owner, state, last_update_time = found
            if owner not in user_states:
                user_states[owner] = self._scope_get(user_state_id(app_name, owner))
            sessions.append(
                Session(
                    id=session_id,
                    app_name=app_name,
                    user_id=owner,
                    state=_merged(state, app_state, user_states[owner]),
                    last_update_time=last_update_time,
                )
            )
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return sessions

    def _listed(self, info: session_pb2.Session) -> tuple[str, str, dict[str, Any], float] | None:
        """(session ID, user ID, session state, last update) of a listed session,
        from its head checkpoint's metadata (its document only when needed)."""
        key = info.session_id
        parts = key.split(_SEP)
        session_id = info.labels.get(SESSION_LABEL) or (
            decode_part(parts[3]) if len(parts) == 4 else None
        )
        owner = info.labels.get(USER_LABEL) or (decode_part(parts[2]) if len(parts) == 4 else None)
        cached = self._cache.get(key)
        if cached is not None and cached.version == info.version:
            return (
                session_id or str(cached.meta.get("id", "")),
                owner or str(cached.meta.get("user_id", "")),
                json.loads(cached.state_json),
                cached.last_update_time,
            )
        client = self.client
        request = checkpoint_pb2.ListCheckpointsRequest(session_id=key, page_size=1)
        try:
            heads = client.call(client.checkpoints.ListCheckpoints, request).checkpoints
        except NotFoundError:
            return None
        fields = dict(heads[0].metadata.fields) if heads else {}
        if session_id is None or owner is None or "adk_state" not in fields:
            stored = self._load(key)
            if stored is None:
                return None
            return (
                str(stored.meta.get("id", "")),
                str(stored.meta.get("user_id", "")),
                json.loads(stored.state_json),
                stored.last_update_time,
            )
        last_update_time = fields["adk_last_update_time"].number_value
        return session_id, owner, json.loads(fields["adk_state"].string_value), last_update_time

    def _delete(self, app_name: str, user_id: str, session_id: str) -> None:
        key = session_id_of(app_name, user_id, session_id)
        self._cache.drop(key)
        with contextlib.suppress(NotFoundError):
            self.client.delete_session(key)

    # -- BaseSessionService ----------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        session_id = (session_id or "").strip() or platform_uuid.new_uuid()
        now = platform_time.get_time()
        return await _run(self._create, app_name, user_id, state, session_id, now)

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        session_id = session_id.strip() if session_id else session_id
        found, app, user = await asyncio.gather(
            _run(self._get, app_name, user_id, session_id, config),
            _run(self._scope_get, app_state_id(app_name)),
            _run(self._scope_get, user_state_id(app_name, user_id)),
        )
        if found is None:
            return None
        stored, events = found
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=_merged(json.loads(stored.state_json), app, user),
            events=events,
            last_update_time=stored.last_update_time,
        )
        session._storage_update_marker = str(stored.version)
        return session

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        sessions = await _run(self._list, app_name, user_id)
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        session_id = session_id.strip() if session_id else session_id
        await _run(self._delete, app_name, user_id, session_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await _run(self._scope_get, user_state_id(app_name, user_id))

    async def get_app_state(self, *, app_name: str) -> dict[str, Any]:
        """The app-scoped state (raw keys, without ``app:``); {} when there is none."""
        return await _run(self._scope_get, app_state_id(app_name))

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        delta = event.actions.state_delta if event.actions else None
        if delta:
            # Temp state is for this invocation only: in the session object,
            # never in storage (nor in the stored event's delta).
            for key, value in delta.items():
                if key.startswith(State.TEMP_PREFIX):
                    session.state[key] = value
            event.actions.state_delta = {
                k: v for k, v in delta.items() if not k.startswith(State.TEMP_PREFIX)
            }
        line = event.model_dump_json(exclude_none=True).encode()
        scopes = _Scopes.of(event.actions.state_delta if event.actions else None)
        saved, new = await _run(self._append, session, event, line, scopes)
        if not new:
            if saved.last_is(line):  # the session object is current
                session._storage_update_marker = str(saved.version)
            if any(e.id == event.id for e in session.events):
                return event
        else:
            session._storage_update_marker = str(saved.version)
        session.last_update_time = event.timestamp
        if event.actions and event.actions.state_delta:
            session.state.update(event.actions.state_delta)
        session.events.append(event)
        return event


# -- helpers ------------------------------------------------------------------------------------


async def _run(function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run a blocking method in a worker thread; invalid arguments become ValueError
    (what ADK's own services raise for them)."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except InvalidArgumentError as exc:
        raise adk_error(ValueError, exc) from None


def _scope_values(value: struct_pb2.Value) -> dict[str, Any]:
    return {k: json.loads(v.string_value) for k, v in value.struct_value.fields.items()}


def _marker(session: Session) -> int | None:
    """The stratad version a session object was read or written at (None: unknown)."""
    marker = session._storage_update_marker
    if marker is None:
        return None
    try:
        return int(marker)
    except ValueError:
        return None


def _check_not_stale(session: Session, marker: int | None, stored: _Stored) -> None:
    """Refuse to append to a session object older than what is stored."""
    if marker is not None:
        if marker != stored.version:
            raise adk_error(
                StaleSessionError,
                VersionConflictError(
                    f"session version {stored.version}, not {marker}",
                    reason="VERSION_CONFLICT",
                    metadata={"expected": str(marker), "actual": str(stored.version)},
                ),
                _STALE_MESSAGE,
            )
        return
    # No marker (a session object built by hand): as DatabaseSessionService,
    # stale only when storage moved past it and its last event is not the
    # stored last event.
    if stored.last_update_time > session.last_update_time:
        last = session.events[-1].id if session.events else None
        if last != stored.last_event_id():
            raise adk_error(
                StaleSessionError,
                VersionConflictError("the session's last event is not the stored one"),
                _STALE_MESSAGE,
            )
