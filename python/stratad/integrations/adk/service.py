"""`StratadSessionService`, the ADK session service: `BaseSessionService`'s methods.

Owns what ADK calls (create, get, list and delete a session, `append_event`,
the user and app state) and their blocking implementations over the storage
(store.py), each run in a worker thread so that one service serves every
event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
from collections.abc import Callable
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
from pydantic import TypeAdapter

from stratad.api.v1 import checkpoint_pb2, session_pb2
from stratad.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    VersionConflictError,
    session_not_found,
)
from stratad.integrations.adk.document import _Stored, encode_document
from stratad.integrations.adk.errors import (
    _STALE_MESSAGE,
    _check_not_stale,
    _marker,
    adk_error,
)
from stratad.integrations.adk.names import (
    _SEP,
    _sessions_prefix,
    app_state_id,
    decode_part,
    session_id_of,
    user_state_id,
)
from stratad.integrations.adk.state import _dumps, _json_safe, _merged, _Scopes
from stratad.integrations.adk.store import (
    INTEGRATION_LABEL,
    SESSION_LABEL,
    USER_LABEL,
    SessionStore,
)

#: Attempts of one append when another writer's save keeps landing first
#: (only for session objects without a storage marker; with one, a lost race
#: is a stale session).
MAX_ATTEMPTS = 16

#: Parses a JSON array of events in one call (several times faster than one at a time).
_EVENTS = TypeAdapter(list[Event])

P = ParamSpec("P")
R = TypeVar("R")


class StratadSessionService(SessionStore, BaseSessionService):
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


async def _run(function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run a blocking method in a worker thread; invalid arguments become ValueError
    (what ADK's own services raise for them)."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except InvalidArgumentError as exc:
        raise adk_error(ValueError, exc) from None
