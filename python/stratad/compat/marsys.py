"""MARSYS's state management API (``marsys.coordination.state``) on stratad.

MARSYS's own examples run unchanged apart from the import and the daemon's
address::

    from stratad.compat.marsys import StateManager, StateSnapshot

    state_manager = StateManager(address="127.0.0.1:50051")
    await state_manager.save_state("session_123", snapshot)

How MARSYS's concepts map onto stratad:

- A MARSYS session is a stratad session with the same ID, so session IDs must be
  stratad IDs (letters, digits, ``_ . : -``, starting with a letter or digit,
  at most 128 characters); any other ID is `stratad.errors.InvalidArgumentError`.
  The session is created on its first save, with
  ``keep_last = max_checkpoints_per_session`` and the label
  ``stratad.compat=marsys``.
- ``save_state`` stores the snapshot as a new checkpoint: the JSON of
  `StateSnapshot.to_dict` with content type ``application/vnd.marsys.snapshot+json``.
  Retention keeps the newest ``max_checkpoints_per_session`` of these unnamed
  checkpoints; named checkpoints (``create_checkpoint``) are pinned, are not
  counted, and are kept until the session is deleted, as everywhere in stratad.
- ``pause_execution`` stores the state dict exactly as given (content type
  ``application/vnd.marsys.state+json``) and marks the session PAUSED;
  ``resume_execution`` marks it ACTIVE again and returns that dict. Storing the
  dict itself, not a snapshot made from it, is what makes the round trip exact.
- Lookups of something that does not exist return what MARSYS returns
  (None, an empty list) and never raise "not found". Real failures propagate as
  `stratad.errors` classes: `~stratad.errors.DataLossError` when stored bytes or a
  snapshot checksum fail, `~stratad.errors.UnavailableError` when no daemon
  answers, and so on.
- ``enable_compression`` is accepted for compatibility and has no effect:
  stratad always stores states as zstd-compressed, deduplicated chunks.
- MARSYS's ``FileStorageBackend`` (one JSON file per session) is replaced by
  `SidecarStorageBackend`; there is deliberately no file backend here.

A `StateManager` may be created outside any event loop and used from several
``asyncio.run`` calls: it keeps one gRPC channel per event loop (grpc.aio
channels are bound to the loop that created them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from stratad import native
from stratad.api.v1 import checkpoint_pb2, common_pb2, session_pb2
from stratad.errors import AlreadyExistsError, DataLossError, NotFoundError
from stratad.sdk.client import AsyncClient
from stratad.sdk.connection import Connection, TLSConfig

__all__ = [
    "BACKEND_CONTENT_TYPE",
    "SNAPSHOT_CONTENT_TYPE",
    "STATE_CONTENT_TYPE",
    "SidecarStorageBackend",
    "StateManager",
    "StateSnapshot",
    "StorageBackend",
]

SNAPSHOT_CONTENT_TYPE = "application/vnd.marsys.snapshot+json"
STATE_CONTENT_TYPE = "application/vnd.marsys.state+json"
BACKEND_CONTENT_TYPE = "application/json"
COMPAT_LABELS = {"stratad.compat": "marsys"}

_log = logging.getLogger(__name__)


# -- canonical JSON --------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A JSON-ready copy of `value`: sets become sorted lists, tuples lists.

    Sets have no order, so the canonical form sorts them; without that the
    same snapshot could serialize (and checksum) differently in two processes.
    """
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        return [_plain(item) for item in _sorted(value)]
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _sorted(items: Iterable[Any]) -> list[Any]:
    try:
        return sorted(items)
    except TypeError:  # mixed types: order by their canonical JSON instead
        return sorted(items, key=_canonical_json)


def _canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, ASCII only: one text per value, in any process."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"))


def _encode(value: Any) -> bytes:
    """Stored form: compact JSON in the caller's key order (only checksums need sorting)."""
    return json.dumps(_plain(value), separators=(",", ":")).encode("ascii")


def _decode_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"{what} does not hold JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} holds JSON {type(value).__name__}, not an object")
    return value


# -- StateSnapshot ---------------------------------------------------------------


_SET_FIELDS = ("active_branches", "completed_branches")


@dataclass
class StateSnapshot:
    """Execution state of a MARSYS session at one point in time (MARSYS's fields).

    The checksum is the lowercase hex BLAKE3 (`stratad.native.digest_hex`, the
    digest stratad uses everywhere) of the canonical JSON of every field but
    ``checksum``: keys sorted, sets as sorted lists, no whitespace, ASCII.
    """

    session_id: str
    timestamp: float
    branches: dict[str, dict[str, Any]] = field(default_factory=dict)
    active_branches: set[str] = field(default_factory=set)
    completed_branches: set[str] = field(default_factory=set)
    waiting_branches: dict[str, set[str]] = field(default_factory=dict)
    branch_results: dict[str, dict[str, Any]] = field(default_factory=dict)
    parent_child_map: dict[str, list[str]] = field(default_factory=dict)
    child_parent_map: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    checksum: str = ""

    def calculate_checksum(self) -> str:
        """The checksum of the current content (does not set ``checksum``)."""
        content = self.to_dict()
        del content["checksum"]
        return native.digest_hex(_canonical_json(content).encode("ascii"))

    def validate_checksum(self) -> bool:
        """True if ``checksum`` is set and matches the content; False if unset."""
        return bool(self.checksum) and self.checksum == self.calculate_checksum()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready deep copy: sets become sorted lists."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StateSnapshot:
        """The inverse of `to_dict` (lists become sets again).

        ``session_id`` and ``timestamp`` are required; other fields default to
        empty; unknown keys are ignored so newer writers stay readable.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for name in _SET_FIELDS:
            if name in values:
                values[name] = set(values[name])
        if "waiting_branches" in values:
            values["waiting_branches"] = {
                parent: set(children) for parent, children in values["waiting_branches"].items()
            }
        return cls(**values)

    @classmethod
    def from_state(
        cls, session_id: str, state: Mapping[str, Any], timestamp: float
    ) -> StateSnapshot:
        """A snapshot view of a paused state dict: same-named keys fill the fields.

        Used when ``load_state`` finds a dict stored by ``pause_execution``; keys
        that are not snapshot fields are left out of the view (``resume_execution``
        still returns them). ``checksum`` is never taken from the dict.
        """
        view = {key: value for key, value in state.items() if key != "checksum"}
        view["session_id"] = session_id
        view.setdefault("timestamp", timestamp)
        return cls.from_dict(view)


# -- connection --------------------------------------------------------------------


class _Connection:
    """An `AsyncClient` per event loop, created on first use.

    grpc.aio channels belong to the loop that created them, while MARSYS code
    creates its StateManager once and may call it from several ``asyncio.run``.
    A client handed in by the caller is always used as is.
    """

    def __init__(self, connection: Connection, client: AsyncClient | None = None) -> None:
        self.connection = connection
        self.address = connection.address
        self.tenant = connection.tenant
        self._fixed = client
        self._client: AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> AsyncClient:
        if self._fixed is not None:
            return self._fixed
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # The previous loop has ended (or belongs to another thread); its
            # channel cannot be closed from here and is left to the collector.
            self._client = AsyncClient.from_connection(self.connection)
            self._loop = loop
        return self._client

    async def close(self) -> None:
        """Close the channel this facade opened (never a client handed in)."""
        client, self._client, self._loop = self._client, None, None
        if client is not None:
            await client.close()


async def _load_or_none(
    client: AsyncClient, session_id: str, checkpoint_id: str = ""
) -> checkpoint_pb2.LoadStateResponse | None:
    """The latest (or given) state; None if the session or its state is missing."""
    try:
        return await client.load_state(session_id, checkpoint_id)
    except NotFoundError:
        return None


async def _save_creating(
    client: AsyncClient,
    session_id: str,
    data: bytes,
    *,
    content_type: str,
    keep_last: int,
    labels: dict[str, str],
) -> checkpoint_pb2.SaveStateResponse:
    """Save a new checkpoint, creating the session first if it does not exist.

    Saving first costs one call in the common case (the session exists); a
    concurrent creator of the same session is not an error.
    """
    try:
        return await client.save_state(session_id, data, content_type=content_type)
    except NotFoundError:
        pass
    with contextlib.suppress(AlreadyExistsError):
        await client.create_session(session_id, labels=labels, keep_last=keep_last)
    return await client.save_state(session_id, data, content_type=content_type)


def _seconds(message: timestamp_pb2.Timestamp) -> float:
    """A protobuf Timestamp as POSIX seconds (what MARSYS's time.time() gives)."""
    return message.ToNanoseconds() / 1e9


def _checkpoint_info(cp: checkpoint_pb2.Checkpoint) -> dict[str, Any]:
    """A checkpoint as MARSYS's list_checkpoints entry.

    Metadata travels as a protobuf Struct, so its numbers come back as floats.
    """
    return {
        "id": cp.checkpoint_id,
        "name": cp.name or None,
        "created_at": _seconds(cp.created_at),
        "metadata": json_format.MessageToDict(cp.metadata),
        "size": cp.size,
    }


# -- StateManager ------------------------------------------------------------------


class StateManager:
    """MARSYS's StateManager, keeping sessions and checkpoints in a stratad daemon.

    ``storage_backend`` is accepted for signature compatibility: a
    `SidecarStorageBackend` lends its connection (its address, tenant and
    credentials win over these); None connects to ``address`` as ``tenant``
    with ``token`` and ``tls`` (each None or empty: its STRATAD_* variable, see
    `stratad.sdk.connection`). Anything else is a TypeError, since
    the state would not be where the caller thinks.

    ``max_checkpoints_per_session`` becomes the session's ``keep_last`` when the
    session is created (0 keeps every checkpoint); it counts unnamed
    checkpoints only: named ones are pinned, as in stratad. A session that
    already exists keeps the retention it was created with.
    """

    def __init__(
        self,
        storage_backend: StorageBackend | None = None,
        enable_compression: bool = True,
        enable_checksum: bool = True,
        max_checkpoints_per_session: int = 10,
        *,
        address: str | None = None,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
    ) -> None:
        if max_checkpoints_per_session < 0:
            raise ValueError("max_checkpoints_per_session must not be negative")
        self.enable_compression = enable_compression  # stratad always compresses
        self.enable_checksum = enable_checksum
        self.max_checkpoints_per_session = max_checkpoints_per_session
        self._conn = _connection_for(
            storage_backend, Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        )

    async def close(self) -> None:
        """Close the gRPC channel (shared with a `SidecarStorageBackend` passed in)."""
        await self._conn.close()

    async def __aenter__(self) -> StateManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- snapshots -------------------------------------------------------------------

    async def save_state(self, session_id: str, snapshot: StateSnapshot) -> None:
        """Save `snapshot` as the session's newest checkpoint.

        With ``enable_checksum`` the snapshot's ``checksum`` is set first (on
        the caller's object, as MARSYS does), so loads can verify it.
        """
        if self.enable_checksum:
            snapshot.checksum = snapshot.calculate_checksum()
        await self._save(session_id, _encode(snapshot.to_dict()), SNAPSHOT_CONTENT_TYPE)

    async def load_state(self, session_id: str) -> StateSnapshot | None:
        """The session's newest state as a snapshot; None if there is none."""
        loaded = await _load_or_none(self._conn.client(), session_id)
        return None if loaded is None else self._snapshot(loaded)

    async def pause_execution(self, session_id: str, state: dict[str, Any]) -> None:
        """Save `state` (a JSON-compatible dict; sets are stored as sorted lists)
        and mark the session PAUSED."""
        await self._save(session_id, _encode(state), STATE_CONTENT_TYPE)
        await self._conn.client().pause_execution(session_id)

    async def resume_execution(self, session_id: str) -> dict[str, Any] | None:
        """Mark the session ACTIVE and return its newest state; None if it has none.

        The dict given to ``pause_execution`` comes back as it was stored; a
        snapshot saved with ``save_state`` comes back as `StateSnapshot.to_dict`.
        Resuming a session that is not paused returns its state too (with a
        warning), as MARSYS does.
        """
        client = self._conn.client()
        try:
            session = await client.get_session(session_id)
        except NotFoundError:
            return None
        loaded = await self._resume(client, session)
        return None if loaded is None else self._state(loaded)

    async def _resume(
        self, client: AsyncClient, session: session_pb2.Session
    ) -> checkpoint_pb2.LoadStateResponse | None:
        if session.status != common_pb2.SESSION_STATUS_PAUSED:
            _log.warning("resuming session %s, which was not paused", session.session_id)
            return await _load_or_none(client, session.session_id)
        resumed = await client.resume_execution(session.session_id)
        return resumed.state if resumed.HasField("state") else None

    # -- checkpoints -----------------------------------------------------------------

    async def create_checkpoint(
        self,
        session_id: str,
        checkpoint_name: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Pin the session's current state under a name; returns the checkpoint ID.

        No data is copied. The name defaults to stratad's ``checkpoint-<version>``.
        A session without state has nothing to pin: `~stratad.errors.NotFoundError`
        (no session) or `~stratad.errors.FailedPreconditionError` (nothing saved),
        since MARSYS's ``-> str`` has no "nothing" to return.
        """
        checkpoint = await self._conn.client().create_checkpoint(
            session_id, checkpoint_name or "", metadata=metadata
        )
        return str(checkpoint.checkpoint_id)

    async def restore_checkpoint(self, checkpoint_id: str) -> StateSnapshot | None:
        """The snapshot stored in a checkpoint, as it was; None if there is no such one.

        The session's head does not move: save the returned snapshot to continue
        from it.
        """
        try:
            loaded = await self._conn.client().restore_checkpoint(checkpoint_id)
        except NotFoundError:
            return None
        return self._snapshot(loaded)

    async def list_checkpoints(self, session_id: str) -> list[dict[str, Any]]:
        """The session's checkpoints, newest first: dicts with ``id``, ``name``
        (None for unnamed ones), ``created_at`` (POSIX seconds), ``metadata``
        and ``size`` (bytes). An unknown session has none."""
        try:
            return [
                _checkpoint_info(cp)
                async for cp in self._conn.client().list_checkpoints(session_id)
            ]
        except NotFoundError:
            return []

    # -- sessions --------------------------------------------------------------------

    async def list_sessions(self) -> list[str]:
        """The IDs of the tenant's sessions, sorted.

        That is every session of the tenant, whoever made it: give each
        application its own tenant to keep their sessions apart.
        """
        return [s.session_id async for s in self._conn.client().list_sessions()]

    async def delete_session(self, session_id: str) -> None:
        """Delete the session and all its checkpoints; a missing one is no error."""
        with contextlib.suppress(NotFoundError):
            await self._conn.client().delete_session(session_id)

    # -- helpers -----------------------------------------------------------------------

    async def _save(self, session_id: str, data: bytes, content_type: str) -> None:
        await _save_creating(
            self._conn.client(),
            session_id,
            data,
            content_type=content_type,
            keep_last=self.max_checkpoints_per_session,
            labels=COMPAT_LABELS,
        )

    def _snapshot(self, loaded: checkpoint_pb2.LoadStateResponse) -> StateSnapshot:
        """Decode a stored state as a snapshot and verify its checksum."""
        cp = loaded.checkpoint
        payload = _decode_object(loaded.data, f"checkpoint {cp.checkpoint_id}")
        if loaded.content_type != SNAPSHOT_CONTENT_TYPE:
            # A paused state dict (or JSON from another client): stratad has
            # verified its bytes; the checksum describes the view made of it.
            snapshot = StateSnapshot.from_state(cp.session_id, payload, _seconds(cp.created_at))
            if self.enable_checksum:
                snapshot.checksum = snapshot.calculate_checksum()
            return snapshot
        snapshot = StateSnapshot.from_dict(payload)
        if self.enable_checksum and snapshot.checksum and not snapshot.validate_checksum():
            raise DataLossError(
                f"snapshot in checkpoint {cp.checkpoint_id} of session {cp.session_id} "
                "fails its checksum"
            )
        return snapshot

    def _state(self, loaded: checkpoint_pb2.LoadStateResponse) -> dict[str, Any]:
        if loaded.content_type == SNAPSHOT_CONTENT_TYPE:
            return self._snapshot(loaded).to_dict()
        return _decode_object(loaded.data, f"checkpoint {loaded.checkpoint.checkpoint_id}")


def _connection_for(backend: StorageBackend | None, connection: Connection) -> _Connection:
    if backend is None:
        return _Connection(connection)
    if isinstance(backend, SidecarStorageBackend):
        return backend._conn
    raise TypeError(
        "StateManager keeps its state in a stratad daemon: pass storage_backend=None "
        "(and address=...) or a SidecarStorageBackend, not "
        f"{type(backend).__name__}; FileStorageBackend is replaced by SidecarStorageBackend"
    )


# -- storage backends ----------------------------------------------------------------


class StorageBackend(ABC):
    """MARSYS's abstract key-value storage for JSON-compatible dicts."""

    @abstractmethod
    async def save(self, key: str, data: dict[str, Any]) -> None: ...

    @abstractmethod
    async def load(self, key: str) -> dict[str, Any] | None: ...

    @abstractmethod
    async def delete(self, key: str) -> None: ...

    @abstractmethod
    async def list_keys(self, prefix: str = "") -> list[str]: ...

    @abstractmethod
    async def exists(self, key: str) -> bool: ...


class SidecarStorageBackend(StorageBackend):
    """A StorageBackend whose keys are stratad sessions (replaces FileStorageBackend).

    Each key is a session, so keys must be stratad IDs (letters, digits,
    ``_ . : -``, starting with a letter or digit, at most 128 characters).
    ``save`` stores the dict as JSON in a new checkpoint, creating the session
    with ``keep_last`` (0 keeps all) if needed: earlier values stay readable
    through the SDK until retention drops them. ``client`` overrides
    ``address``/``tenant`` with a client the caller manages.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        tenant: str = "",
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        keep_last: int = 10,
        client: AsyncClient | None = None,
    ) -> None:
        if keep_last < 0:
            raise ValueError("keep_last must not be negative")
        self.keep_last = keep_last
        connection = Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        self._conn = _Connection(connection, client)

    async def close(self) -> None:
        await self._conn.close()

    async def save(self, key: str, data: dict[str, Any]) -> None:
        await _save_creating(
            self._conn.client(),
            key,
            _encode(data),
            content_type=BACKEND_CONTENT_TYPE,
            keep_last=self.keep_last,
            labels=COMPAT_LABELS,
        )

    async def load(self, key: str) -> dict[str, Any] | None:
        """The newest dict saved under `key`; None if there is none."""
        loaded = await _load_or_none(self._conn.client(), key)
        return None if loaded is None else _decode_object(loaded.data, f"key {key!r}")

    async def delete(self, key: str) -> None:
        """Delete the key with its history; a missing key is no error."""
        with contextlib.suppress(NotFoundError):
            await self._conn.client().delete_session(key)

    async def list_keys(self, prefix: str = "") -> list[str]:
        """Keys starting with `prefix`, sorted."""
        return [s.session_id async for s in self._conn.client().list_sessions(prefix=prefix)]

    async def exists(self, key: str) -> bool:
        """True if `load` would return a dict (the session exists and holds a state)."""
        try:
            session = await self._conn.client().get_session(key)
        except NotFoundError:
            return False
        return bool(session.head_checkpoint_id)
