"""An OpenAI Agents SDK session that keeps the conversation in a stratad daemon.

    from stratad.integrations.openai_agents import StratadSession

    result = await Runner.run(agent, "hi", session=StratadSession("chat-42"))

`StratadSession` implements the SDK's `Session` protocol (`get_items` with a
limit, `add_items`, `pop_item`, `clear_session`, `session_settings`). How it
maps onto stratad (see docs/openai-agents.md):

- one agent session is one stratad session: its ID when it is a valid stratad
  ID (`[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}`), else `oa-<hash>`; the labels keep
  the agent session's ID and `stratad.integration=openai-agents`;
- the conversation is one state, JSON Lines (one item a line, in order), and
  every change of it is a checkpoint of the whole list. A list that grows at
  its end keeps every byte of the previous checkpoint as its prefix, so
  stratad's content-defined chunking and delta frames store (and the SDK
  uploads) only the new tail: a step costs about what it adds, not the whole
  history;
- every change is conditional (`expected_version`, and the head it was based
  on as its parent): a writer that lost a race reloads the list and applies
  its change again, so concurrent writers (threads, processes, hosts) never
  lose or duplicate an item;
- `clear_session` deletes the stratad session (its checkpoints become
  garbage); retention (`keep_last`, `max_age_seconds`) is set on the session
  this class creates, and the daemon's `session_idle_ttl` expires idle
  conversations (label `stratad.dev/keep=true` with ``keep=True`` exempts one).

The instance caches the list it last read or wrote with the session version it
belongs to: `get_items` costs one small GetSession call while nothing else
wrote, and `add_items` sends only the new chunks. Daemon errors reach the
caller as `StratadSessionError`, an `agents.AgentsException` that is also the
`stratad.errors` class of the failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from agents.exceptions import AgentsException
from agents.items import TResponseInputItem
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from stratad import errors
from stratad.errors import (
    FailedPreconditionError,
    NotFoundError,
    StratadError,
    VersionConflictError,
)
from stratad.sdk.client import Client, save_request
from stratad.sdk.connection import Connection, TLSConfig

__all__ = ["CONTENT_TYPE", "StratadSession", "StratadSessionError", "session_id_of"]

#: The content type of the states this class saves (JSON Lines of input items).
CONTENT_TYPE = "application/vnd.openai-agents.session+jsonl"
#: Session labels of the sessions this class creates.
INTEGRATION_LABEL = "stratad.integration"
SESSION_LABEL = "openai_agents.session_id"
KEEP_LABEL = "stratad.dev/keep"
#: Attempts of one change when other writers keep winning the race.
MAX_ATTEMPTS = 64

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
_MAX_LABEL_VALUE = 256
T = TypeVar("T")


def session_id_of(session_id: str, prefix: str = "") -> str:
    """The stratad session of an agent session."""
    candidate = f"{prefix}{session_id}"
    if _ID.fullmatch(candidate):
        return candidate
    return f"{prefix}oa-{hashlib.blake2b(session_id.encode(), digest_size=16).hexdigest()}"


# -- errors --------------------------------------------------------------------------------


class StratadSessionError(AgentsException, StratadError):
    """A stratad call of a `StratadSession` failed.

    An `agents.AgentsException` (what the SDK's own code raises; `run_data`
    is None), and an instance of the `stratad.errors` class of the failure too:
    ``except stratad.errors.UnavailableError`` still catches a daemon that is
    down. ``error`` is the original exception; ``reason`` and ``metadata``
    are its `google.rpc.ErrorInfo` reason and details.
    """

    error: StratadError

    def __init__(
        self,
        message: str = "",
        *,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        StratadError.__init__(self, message, reason=reason, metadata=metadata)
        self.run_data = None


def _error_class(base: type[StratadError]) -> type[StratadSessionError]:
    cls = cast(
        type[StratadSessionError],
        type(f"StratadSession{base.__name__}", (StratadSessionError, base), {}),
    )
    cls.__module__ = __name__
    return cls


#: One class per stratad error class, made now and named in this module (so
#: that they pickle, e.g. across a process pool): StratadSessionUnavailableError, ...
_ERROR_CLASSES: dict[type[StratadError], type[StratadSessionError]] = {
    base: _error_class(base)
    for base in vars(errors).values()
    if isinstance(base, type) and issubclass(base, StratadError)
}
globals().update({cls.__name__: cls for cls in _ERROR_CLASSES.values()})
_ERROR_CLASSES_LOCK = threading.Lock()


def session_error(exc: StratadError, what: str) -> StratadSessionError:
    """`exc` as a `StratadSessionError` that is also of `exc`'s own class."""
    if isinstance(exc, StratadSessionError):
        return exc
    base = type(exc)
    with _ERROR_CLASSES_LOCK:
        cls = _ERROR_CLASSES.get(base)
        if cls is None:  # a subclass defined elsewhere
            cls = _ERROR_CLASSES[base] = _error_class(base)
    error = cls(f"{what}: {exc.message}", reason=exc.reason, metadata=exc.metadata)
    error.error = exc
    return error


# -- the stored list -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    """The conversation as stored at one session version.

    ``data`` is JSON Lines (every line ends with a newline; JSON escapes the
    newlines inside strings), ``ends`` the end offset of each line.
    ``exists`` is False when the stratad session does not exist (yet).
    """

    data: bytes
    ends: tuple[int, ...]
    version: int
    head: str
    exists: bool = True

    @property
    def count(self) -> int:
        return len(self.ends)

    def line(self, index: int) -> bytes:
        start = self.ends[index - 1] if index > 0 else 0
        return self.data[start : self.ends[index] - 1]

    def start_of(self, index: int) -> int:
        return self.ends[index - 1] if index > 0 else 0


_ABSENT = _Snapshot(b"", (), 0, "", exists=False)


def _line_ends(data: bytes) -> tuple[int, ...]:
    ends: list[int] = []
    position = data.find(b"\n")
    while position >= 0:
        ends.append(position + 1)
        position = data.find(b"\n", position + 1)
    if data and (not ends or ends[-1] != len(data)):
        ends.append(len(data) + 1)  # a last line without its newline (not ours)
    return tuple(ends)


def _encode(items: Sequence[TResponseInputItem]) -> bytes:
    """Items as JSON Lines (TypeError / ValueError for what JSON cannot hold)."""
    return b"".join(
        json.dumps(item, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        + b"\n"
        for item in items
    )


def _decode(lines: list[bytes]) -> list[TResponseInputItem]:
    """The items of `lines`, skipping any that is not a JSON object (as
    SQLiteSession skips rows that do not parse)."""
    if not lines:
        return []
    try:
        whole = json.loads(b"[" + b",".join(lines) + b"]")
        if len(whole) == len(lines) and all(isinstance(item, dict) for item in whole):
            return cast(list[TResponseInputItem], whole)
    except ValueError:
        pass
    items: list[TResponseInputItem] = []
    for line in lines:
        item = _parse(line)
        if item is not None:
            items.append(item)
    return items


def _parse(line: bytes) -> TResponseInputItem | None:
    try:
        item = json.loads(line)
    except ValueError:
        return None
    return cast(TResponseInputItem, item) if isinstance(item, dict) else None


async def _await_outcome(work: Awaitable[T]) -> T:
    """Wait for a change to finish even when the caller is cancelled meanwhile,
    then raise the cancellation: the caller never sees a change whose outcome
    it does not know (the SDK's own sessions do the same)."""
    task = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" warning
        raise cancelled
    return task.result()


class StratadSession:
    """An OpenAI Agents SDK session over a stratad daemon (see the module docstring).

    Args:
        session_id: the agent session's ID (any string).
        address: the daemon's gRPC address (ignored when ``client`` is given);
            None: ``$STRATAD_ADDRESS`` or 127.0.0.1:50051.
        tenant: the tenant to act in; "": ``$STRATAD_TENANT``, else the
            daemon's default (with auth on: the token's own tenant).
        token: bearer token; None: ``$STRATAD_TOKEN`` / ``$STRATAD_TOKEN_FILE``.
        tls: a `stratad.TLSConfig`, True or False; None: the STRATAD_TLS* variables.
        client: an existing `stratad.Client` to use (not closed by `close`).
        session_settings: the SDK's `SessionSettings` (or its dict form):
            ``limit`` is the default of `get_items`.
        session_prefix: prepended to the ID to form the stratad session ID.
        keep_last / max_age_seconds: retention of the checkpoints (earlier
            versions of the list) of the stratad session this creates; the
            current list is never dropped. 0 = no limit.
        keep: label the session ``stratad.dev/keep=true``, so the daemon's
            ``session_idle_ttl`` never expires it.
        labels: more labels for the session this creates.
        timeout: deadline of each call, in seconds.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        address: str | None = None,
        *,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        client: Client | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        session_prefix: str = "",
        keep_last: int = 0,
        max_age_seconds: float = 0.0,
        keep: bool = False,
        labels: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        if client is not None:
            self.connection = client.connection
        else:
            self.connection = Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        self.address = self.connection.address
        self.tenant = self.connection.tenant
        self.timeout = timeout
        #: The stratad session that holds this conversation.
        self.stratad_session_id = session_id_of(session_id, session_prefix)
        self.keep_last = keep_last
        self.max_age_seconds = max_age_seconds
        self.labels = {
            **(labels or {}),
            INTEGRATION_LABEL: "openai-agents",
            **({SESSION_LABEL: session_id} if len(session_id) <= _MAX_LABEL_VALUE else {}),
            **({KEEP_LABEL: "true"} if keep else {}),
        }
        self._client = client
        self._own_client = client is None
        self._lock = threading.RLock()  # one change of this instance at a time
        self._snapshot: _Snapshot | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        with self._lock:
            self._check_open()
            if self._client is None:
                self._client = Client.from_connection(self.connection, timeout=self.timeout)
            return self._client

    def close(self) -> None:
        """Close the client this session created (not one it was given). Later
        calls raise RuntimeError; the conversation stays in the daemon."""
        with self._lock:
            self._closed = True
            self._snapshot = None
            if self._own_client and self._client is not None:
                self._client.close()
            self._client = None

    def __enter__(self) -> StratadSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> StratadSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("StratadSession is closed")

    def __repr__(self) -> str:
        return (
            f"StratadSession({self.session_id!r}, address={self.address!r}, "
            f"stratad_session_id={self.stratad_session_id!r})"
        )

    # -- the Session protocol --------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation, oldest first; with a limit (or `session_settings.limit`)
        the latest ``limit`` items. 0 gives none, a negative limit all (as
        SQLiteSession's SQL LIMIT does)."""
        self._check_open()
        effective = resolve_session_limit(limit, self.session_settings)
        return await asyncio.to_thread(self._run, "get_items", self._get_items, effective)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append `items` to the conversation (one checkpoint)."""
        self._check_open()
        if not items:
            return
        lines = _encode(items)  # before any call: an item JSON cannot hold changes nothing
        await _await_outcome(
            asyncio.to_thread(self._run, "add_items", self._add_items, lines, len(items))
        )

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the latest item (None when the conversation is empty)."""
        self._check_open()
        return await _await_outcome(asyncio.to_thread(self._run, "pop_item", self._pop_item))

    async def clear_session(self) -> None:
        """Forget the conversation: the stratad session is deleted with its
        checkpoints (their objects are garbage for the next collection)."""
        self._check_open()
        await _await_outcome(asyncio.to_thread(self._run, "clear_session", self._clear))

    # -- the work (worker threads) ---------------------------------------------------------

    def _run(self, what: str, work: Callable[..., T], *args: Any) -> T:
        with self._lock:
            self._check_open()
            try:
                return work(*args)
            except StratadError as exc:
                self._snapshot = None  # read again next time
                raise session_error(
                    exc, f"StratadSession {self.session_id!r}: {what} failed"
                ) from exc

    def _get_items(self, limit: int | None) -> list[TResponseInputItem]:
        snap = self._current()
        if limit is None or limit < 0:
            return _decode([snap.line(i) for i in range(snap.count)])
        if limit == 0:
            return []
        # Count valid items: look further back past lines that do not parse.
        window = limit
        while True:
            first = max(0, snap.count - window)
            items = _decode([snap.line(i) for i in range(first, snap.count)])
            if len(items) >= limit or first == 0:
                return items[-limit:] if len(items) > limit else items
            window *= 2

    def _add_items(self, lines: bytes, count: int) -> None:
        def change(snap: _Snapshot) -> tuple[bytes, tuple[int, ...]] | None:
            prefix = snap.data
            if prefix and not prefix.endswith(b"\n"):  # a last line without its newline
                prefix += b"\n"
            base = len(prefix)
            added = tuple(base + end for end in _line_ends(lines))
            return prefix + lines, snap.ends + added

        self._change(change, {"op": "add_items", "added": count})

    def _pop_item(self) -> TResponseInputItem | None:
        popped: list[TResponseInputItem | None] = [None]

        def change(snap: _Snapshot) -> tuple[bytes, tuple[int, ...]] | None:
            popped[0] = None
            index = snap.count - 1
            while index >= 0:
                item = _parse(snap.line(index))
                if item is not None:
                    popped[0] = item
                    break
                index -= 1  # not an item (not saved by us): dropped on the way
            if index == snap.count - 1 and popped[0] is None:
                return None  # empty: nothing to change
            keep = max(index, 0)
            return snap.data[: snap.start_of(keep)], snap.ends[:keep]

        self._change(change, {"op": "pop_item"}, fresh=True)
        return popped[0]

    def _clear(self) -> None:
        self._snapshot = None
        with contextlib.suppress(NotFoundError):  # nothing to clear
            self.client.delete_session(self.stratad_session_id)

    # -- reading and changing the list -----------------------------------------------------

    def _current(self) -> _Snapshot:
        """The list as stored now: the cached one when the session is still at
        its version (one GetSession call), else read again."""
        snap = self._snapshot
        if snap is not None and snap.exists:
            try:
                session = self.client.get_session(self.stratad_session_id)
            except NotFoundError:
                self._snapshot = None
                return _ABSENT
            if session.version == snap.version and session.head_checkpoint_id == snap.head:
                return snap
        return self._load()

    def _load(self) -> _Snapshot:
        client = self.client
        sid = self.stratad_session_id
        for _ in range(MAX_ATTEMPTS):
            try:
                loaded = client.load_state(sid)
            except NotFoundError:
                # No session, or a session without a saved list: its version
                # from GetSession, which a later change must still match.
                try:
                    session = client.get_session(sid)
                except NotFoundError:
                    self._snapshot = None
                    return _ABSENT
                if session.head_checkpoint_id:
                    continue  # saved meanwhile: read that
                snap = _Snapshot(b"", (), session.version, "")
                self._snapshot = snap
                return snap
            content_type = loaded.checkpoint.content_type or loaded.content_type
            if loaded.data and content_type != CONTENT_TYPE:
                raise FailedPreconditionError(
                    f"session {sid!r} holds a state that StratadSession did not save "
                    f"(content type {content_type!r})",
                    reason="FOREIGN_STATE",
                    metadata={"session_id": sid, "content_type": content_type},
                )
            data = bytes(loaded.data)
            snap = _Snapshot(data, _line_ends(data), loaded.version, loaded.checkpoint_id)
            self._snapshot = snap
            return snap
        raise VersionConflictError(f"session {sid!r} kept changing while it was read")

    def _create(self) -> _Snapshot:
        """Create the session (with this instance's labels and retention) unless
        another writer did; the list it holds then."""
        try:
            session = self.client.create_session(
                self.stratad_session_id,
                labels=dict(self.labels),
                keep_last=self.keep_last,
                max_age_seconds=self.max_age_seconds,
                exist_ok=True,
            )
        except NotFoundError:  # it existed, and was deleted again right away
            return _ABSENT
        if session.head_checkpoint_id:
            return self._load()
        snap = _Snapshot(b"", (), session.version, "")
        self._snapshot = snap
        return snap

    def _change(
        self,
        change: Callable[[_Snapshot], tuple[bytes, tuple[int, ...]] | None],
        metadata: dict[str, Any],
        *,
        fresh: bool = False,
    ) -> None:
        """Apply `change` to the stored list, conditionally on the version it
        was computed from; when another writer changed the list first, read it
        again and apply the change to that (optimistic concurrency)."""
        client = self.client
        sid = self.stratad_session_id
        snap = self._current() if fresh or self._snapshot is None else self._snapshot
        delay = 0.002
        for attempt in range(MAX_ATTEMPTS):
            if not snap.exists:
                if change(snap) is None:
                    return  # nothing to change: no session to create either
                snap = self._create()
                if not snap.exists:
                    continue
            new = change(snap)
            if new is None:
                return
            data, ends = new
            request = save_request(
                sid,
                b"",
                content_type=CONTENT_TYPE,
                metadata={**metadata, "items": len(ends)},
                expected_version=snap.version,
                parent_checkpoint_id=snap.head,
            )
            try:
                saved = client.save(request, data)
            except (VersionConflictError, NotFoundError) as exc:
                # Another writer won (or the session was cleared, or cleared and
                # created again: the head we built on is gone). Read, re-apply.
                if attempt == MAX_ATTEMPTS - 1:
                    raise exc from None
                self._snapshot = None
                time.sleep(random.uniform(0, delay))
                delay = min(delay * 2, 0.1)
                snap = self._load()
                continue
            self._snapshot = _Snapshot(data, ends, saved.version, saved.checkpoint_id)
            return
        raise VersionConflictError(
            f"session {sid!r} kept changing: {MAX_ATTEMPTS} attempts lost the race",
            metadata={"attempts": str(MAX_ATTEMPTS)},
        )
