"""The storage under StratadSessionService: its client, documents and scopes.

Owns the service's construction and its `stratad.Client`, reading and saving
a session's document (document.py) conditionally on its version, through the
cache, and the ``app:`` and ``user:`` state in the global state (TaskService)
of their own stratad sessions, one atomic MERGE per scope. Blocking: the
service (service.py) runs it in worker threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Self

from google.protobuf import struct_pb2

from stratad.api.v1 import checkpoint_pb2, task_pb2, task_pb2_grpc
from stratad.errors import NotFoundError
from stratad.integrations.adk.document import CONTENT_TYPE, _Cache, _Stored, encode_document
from stratad.integrations.adk.names import app_state_id, user_state_id
from stratad.integrations.adk.state import _dumps, _json_safe, _scope_values, _Scopes
from stratad.sdk.client import Client, save_request
from stratad.sdk.connection import Connection, TLSConfig

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
_MAX_LABEL_VALUE = 256


class SessionStore:
    """StratadSessionService's storage (its arguments: see `StratadSessionService`)."""

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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> Self:
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
