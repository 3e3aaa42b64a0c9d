"""Pending writes, session copies, pruning and deletion by metadata.

Four general checkpoint features, each one journal record with its reducer:

- `put_writes`: pending writes attached to a checkpoint -- what the tasks of
  the next step produced before the next checkpoint was saved, so a resumed
  run does not redo them (LangGraph's `put_writes`). Writes are keyed by
  (task_id, idx): a write with idx >= 0 that is already stored is kept (a
  retried call changes nothing), one with idx < 0 (a special channel such as
  an error or an interrupt) replaces the stored one. They are stored inline
  in the checkpoint's record (base64), so each value is size-limited; they are
  returned ordered by (task_path, task_id, idx).
- `copy`: a new session holding a copy of every checkpoint of another, in the
  same order, sharing the source's objects (no state data is copied).
- `drop_checkpoints`: checkpoints removed by `PruneCheckpoints` (keep the
  latest of each namespace, or delete all) or `DeleteCheckpoints` (metadata
  filters, in one session or in all of a tenant's).

The records name removed checkpoints under `dropped`, which the session
manager's checkpoint index already follows; copies claim their IDs while the
record is built, like any client-given checkpoint ID.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratad.domain.checkpoints import (
    latest,
    metadata_matches,
    touch_for_gc,
    validate_metadata,
    validate_namespace,
)
from stratad.domain.events import SessionEvent
from stratad.domain.models import Checkpoint, SessionState, SessionStatus, reducer
from stratad.domain.sessions import (
    Commit,
    LiveSession,
    Mutation,
    SessionInfo,
    SessionManager,
    check_usable,
    require_status,
)
from stratad.errors import (
    AlreadyExistsError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    checkpoint_not_found,
)
from stratad.ids import new_id, validate_id
from stratad.store.journal import Record

#: One write's value; larger values belong in the state itself.
MAX_WRITE_VALUE_BYTES = 1 << 20
#: All pending writes of one checkpoint together.
MAX_CHECKPOINT_WRITES_BYTES = 16 << 20
#: Writes in one PutWrites call.
MAX_WRITES_PER_CALL = 10_000
MAX_TEXT = 256  # task_id, channel, type
MAX_TASK_PATH = 1024
#: Sessions in one PruneCheckpoints call; filters in one DeleteCheckpoints call.
MAX_SESSIONS_PER_PRUNE = 1000
MAX_FILTERS = 1000


class PruneStrategy(enum.StrEnum):
    KEEP_LATEST = "keep_latest"
    DELETE = "delete"


@dataclass(frozen=True)
class WriteInput:
    idx: int
    channel: str
    type: str
    value: bytes


@dataclass(frozen=True)
class PendingWrite:
    task_id: str
    task_path: str
    idx: int
    channel: str
    type: str
    value: bytes


@dataclass(frozen=True)
class PutWritesResult:
    version: int
    stored: int


@dataclass(frozen=True)
class CopyResult:
    session: SessionInfo
    checkpoint_ids: dict[str, str]  # source ID -> copy ID


@dataclass(frozen=True)
class DeleteResult:
    deleted: int
    session_ids: list[str]
    missing: list[str] = dataclasses.field(default_factory=list)


def pending_writes(cp: Checkpoint) -> list[PendingWrite]:
    """A checkpoint's pending writes, ordered by (task_path, task_id, idx)."""
    out = [
        PendingWrite(
            w["task_id"], w["task_path"], w["idx"], w["channel"], w["type"], _decode(w["value"])
        )
        for w in cp.writes
    ]
    out.sort(key=lambda w: (w.task_path, w.task_id, w.idx))
    return out


def _decode(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:  # never written so: the journal's checksum passed
        raise DataLossError(f"a stored pending write is damaged: {exc}") from exc


def _writes_size(writes: list[dict[str, Any]]) -> int:
    return sum(w["size"] for w in writes)


def _check_text(value: str, what: str, limit: int = MAX_TEXT, *, required: bool = True) -> None:
    if required and not value:
        raise InvalidArgumentError(f"{what} must not be empty")
    if len(value) > limit or any(ord(ch) < 32 for ch in value):
        raise InvalidArgumentError(f"{what} must be at most {limit} printable characters")


class CheckpointExtras:
    """PutWrites, CopySession, PruneCheckpoints and DeleteCheckpoints."""

    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions

    # -- pending writes ------------------------------------------------------------

    def put_writes(
        self,
        tenant: str,
        session_id: str,
        checkpoint_id: str,
        task_id: str,
        writes: list[WriteInput],
        *,
        task_path: str = "",
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> PutWritesResult:
        validate_id(checkpoint_id, "checkpoint_id")
        _check_text(task_id, "task_id")
        _check_text(task_path, "task_path", MAX_TASK_PATH, required=False)
        if not writes:
            raise InvalidArgumentError("writes must not be empty")
        if len(writes) > MAX_WRITES_PER_CALL:
            raise InvalidArgumentError(f"at most {MAX_WRITES_PER_CALL} writes per call")
        seen: set[int] = set()
        for w in writes:
            _check_text(w.channel, "channel")
            _check_text(w.type, "type", required=False)
            if w.idx in seen:
                raise InvalidArgumentError(f"idx {w.idx} appears twice in one call")
            seen.add(w.idx)
            if len(w.value) > MAX_WRITE_VALUE_BYTES:
                raise ResourceExhaustedError(
                    f"a write of {len(w.value)} bytes exceeds the limit of "
                    f"{MAX_WRITE_VALUE_BYTES} bytes per pending write; save large values "
                    "in the state"
                )
        live = self.sessions.live(tenant, session_id)
        with live.lock:  # a repeated call changes nothing: no record at all
            check_usable(live)
            cp = self._checkpoint(live, checkpoint_id)
            if not self._new_writes(cp, task_id, writes):
                return PutWritesResult(live.state.version, 0)

        def build(live: LiveSession, version: int, at: float) -> Mutation:
            require_status(live, SessionStatus.ACTIVE, SessionStatus.PAUSED)
            cp = self._checkpoint(live, checkpoint_id)
            new = self._new_writes(cp, task_id, writes)
            entries = [
                {
                    "task_id": task_id, "task_path": task_path, "idx": w.idx,
                    "channel": w.channel, "type": w.type, "size": len(w.value),
                    "value": base64.b64encode(w.value).decode("ascii"),
                }
                for w in new
            ]  # fmt: skip
            replaced = {(task_id, e["idx"]) for e in entries}
            kept = [w for w in cp.writes if (w["task_id"], w["idx"]) not in replaced]
            total = _writes_size(kept) + _writes_size(entries)
            if total > MAX_CHECKPOINT_WRITES_BYTES:
                raise ResourceExhaustedError(
                    f"checkpoint {checkpoint_id!r} would hold {total} bytes of pending writes, "
                    f"over the limit of {MAX_CHECKPOINT_WRITES_BYTES}"
                )
            body = {"v": version, "at": at, "checkpoint_id": checkpoint_id, "writes": entries}
            event = SessionEvent(version, "put_writes", at, checkpoint_id=checkpoint_id)
            return Mutation(
                Record("put_writes", body), event, PutWritesResult(version, len(entries))
            )

        return self.sessions.mutate_live(  # type: ignore[no-any-return]
            live, expected_version, build, commit=commit
        )

    @staticmethod
    def _checkpoint(live: LiveSession, checkpoint_id: str) -> Checkpoint:
        cp = live.state.checkpoints.get(checkpoint_id)
        if cp is None:
            raise checkpoint_not_found(checkpoint_id)
        return cp

    @staticmethod
    def _new_writes(cp: Checkpoint, task_id: str, writes: list[WriteInput]) -> list[WriteInput]:
        """The writes the call adds or replaces (regular writes already stored are kept)."""
        stored = {(w["task_id"], w["idx"]): w for w in cp.writes}
        new = []
        for w in writes:
            old = stored.get((task_id, w.idx))
            changed = old is not None and (
                old["channel"] != w.channel
                or old["type"] != w.type
                or _decode(old["value"]) != w.value
            )
            if old is None or (w.idx < 0 and changed):
                new.append(w)
        return new

    # -- copy ------------------------------------------------------------------------

    def copy_session(
        self,
        tenant: str,
        source_session_id: str,
        *,
        target_session_id: str = "",
        labels: dict[str, str] | None = None,
        checkpoint_ids: dict[str, str] | None = None,
    ) -> CopyResult:
        """A new session with a copy of every checkpoint of the source (objects shared)."""
        wanted = dict(checkpoint_ids or {})
        for src_id, new_cp_id in wanted.items():
            validate_id(src_id, "checkpoint_ids key")
            validate_id(new_cp_id, "checkpoint_ids value")
        if len(set(wanted.values())) != len(wanted):
            raise InvalidArgumentError("checkpoint_ids names the same new ID twice")
        if target_session_id:
            validate_id(target_session_id, "target_session_id")
        source = self.sessions.live(tenant, source_session_id)
        with source.lock:
            check_usable(source)
            src_state = source.state
            checkpoints = list(src_state.checkpoints.values())
            head = src_state.head
            structured = copy.deepcopy(src_state.structured)
            keep_last, max_age = src_state.keep_last, src_state.max_age_seconds
            source_labels = dict(src_state.labels)
        unknown = sorted(set(wanted) - {c.checkpoint_id for c in checkpoints})
        if unknown:
            raise NotFoundError(
                f"checkpoint {unknown[0]!r} of checkpoint_ids is not in session "
                f"{source_session_id!r}",
                reason="CHECKPOINT_NOT_FOUND",
            )
        taken = [i for i in wanted.values() if self.sessions.checkpoint_exists(tenant, i)]
        if taken:
            raise AlreadyExistsError(f"checkpoint {taken[0]!r} already exists")
        mapping: dict[str, str] = {}
        created: list[bool] = []  # set once the target session exists

        def initial(live: LiveSession, version: int, at: float) -> Mutation:
            created.append(True)
            self.sessions.quotas.check_checkpoints(live.state.session_id, 0, len(checkpoints))
            mapping.clear()
            for cp in checkpoints:
                new_cp_id = wanted.get(cp.checkpoint_id) or new_id("ckpt")
                self.sessions.claim_checkpoint_id(live, new_cp_id)
                mapping[cp.checkpoint_id] = new_cp_id
            copies = []
            # Each copy gets its own version, in the source's order, so that
            # ListCheckpoints' ordering and page tokens work on the copy too.
            for n, cp in enumerate(checkpoints):
                c = dataclasses.replace(
                    cp,
                    checkpoint_id=mapping[cp.checkpoint_id],
                    session_id=live.state.session_id,
                    version=version + n,
                    parent_id=mapping.get(cp.parent_id, ""),
                    stored_bytes=0,
                    metadata=copy.deepcopy(cp.metadata),
                    structured=copy.deepcopy(cp.structured),
                    writes=[dict(w) for w in cp.writes],
                )
                touch_for_gc(live, c)
                copies.append(c.to_record(live.state.session_id))
            last = version + max(len(checkpoints) - 1, 0)
            body = {
                "v": last,
                "at": at,
                "checkpoints": copies,
                "head": mapping.get(head, ""),
                "structured": structured,
                "detail": {"copied_from": source_session_id},
            }
            event = SessionEvent(last, "copy", at, checkpoint_id=mapping.get(head, ""),
                                 detail={"copied_from": source_session_id})  # fmt: skip
            return Mutation(Record("copy", body), event)

        target = target_session_id or new_id("sess")
        try:
            info = self.sessions.create(
                tenant, target, labels=labels or source_labels,
                keep_last=keep_last, max_age_seconds=max_age, initial=initial,
            )  # fmt: skip
        except BaseException:
            if created:  # not when the target existed before: it is not ours
                self._discard(tenant, target)
            raise
        return CopyResult(info, dict(mapping))

    def _discard(self, tenant: str, session_id: str) -> None:
        """Remove a copy whose checkpoints could not be journaled."""
        with contextlib.suppress(NotFoundError):
            self.sessions.delete(tenant, session_id)

    # -- prune / delete by metadata ------------------------------------------------------

    def prune(
        self,
        tenant: str,
        session_ids: list[str],
        strategy: PruneStrategy,
        *,
        commit: Commit | None = None,
    ) -> DeleteResult:
        if len(session_ids) > MAX_SESSIONS_PER_PRUNE:
            raise InvalidArgumentError(f"at most {MAX_SESSIONS_PER_PRUNE} sessions per call")
        for session_id in session_ids:
            validate_id(session_id, "session_id")
        deleted = 0
        touched: list[str] = []
        missing: list[str] = []
        for session_id in dict.fromkeys(session_ids):
            try:
                live = self.sessions.live(tenant, session_id)
            except NotFoundError:
                missing.append(session_id)
                continue

            def select(state: SessionState, live: LiveSession = live) -> list[str]:
                if strategy is PruneStrategy.DELETE:
                    return list(state.checkpoints)
                keep = {
                    cp.checkpoint_id
                    for ns in {c.namespace for c in state.checkpoints.values()}
                    if (cp := latest(live, ns)) is not None
                }
                return [
                    c.checkpoint_id
                    for c in state.checkpoints.values()
                    if c.checkpoint_id not in keep and not c.pinned
                ]

            n = self._drop(live, select, f"prune:{strategy.value}", commit)
            if n:
                deleted += n
                touched.append(session_id)
        return DeleteResult(deleted, touched, missing)

    def delete_matching(
        self,
        tenant: str,
        filters: list[dict[str, Any]],
        *,
        session_id: str = "",
        namespace: str | None = None,
        commit: Commit | None = None,
    ) -> DeleteResult:
        """Delete the checkpoints whose metadata matches any filter."""
        if len(filters) > MAX_FILTERS:
            raise InvalidArgumentError(f"at most {MAX_FILTERS} metadata filters per call")
        filters = [f for f in filters if f]
        if not filters:
            raise InvalidArgumentError(
                "give at least one non-empty metadata filter (PruneCheckpoints deletes all)"
            )
        for f in filters:
            validate_metadata(f)
        if namespace is not None:
            validate_namespace(namespace)
        if session_id:
            sessions = [self.sessions.live(tenant, session_id)]
        else:
            sessions = self.sessions.sessions_of(tenant)
        deleted = 0
        touched: list[str] = []

        def select(state: SessionState) -> list[str]:
            return [
                c.checkpoint_id
                for c in state.checkpoints.values()
                if (namespace is None or c.namespace == namespace)
                and any(metadata_matches(c.metadata, f) for f in filters)
            ]

        for live in sessions:
            if live.damaged and not session_id:
                continue  # one damaged session must not stop a tenant-wide delete
            try:
                n = self._drop(live, select, "delete_checkpoints", commit)
            except NotFoundError:
                if session_id:
                    raise
                continue  # deleted meanwhile
            if n:
                deleted += n
                touched.append(live.state.session_id)
        return DeleteResult(deleted, sorted(touched))

    def _drop(
        self,
        live: LiveSession,
        select: Callable[[SessionState], list[str]],
        reason: str,
        commit: Commit | None,
    ) -> int:
        """One `drop_checkpoints` record removing what `select(state)` names (none: no record)."""
        with live.lock:
            check_usable(live)
            if not select(live.state):
                return 0

        def build(live: LiveSession, version: int, at: float) -> Mutation:
            dropped = select(live.state)
            if not dropped:
                raise _NothingToDrop
            gone = set(dropped)
            body: dict[str, Any] = {"v": version, "at": at, "dropped": dropped, "reason": reason}
            if live.state.head in gone:
                rest = [c for c in live.state.checkpoints if c not in gone]
                body["new_head"] = rest[-1] if rest else ""
            event = SessionEvent(version, "drop_checkpoints", at, detail={"reason": reason})
            return Mutation(Record("drop_checkpoints", body), event, len(dropped))

        try:
            return self.sessions.mutate_live(  # type: ignore[no-any-return]
                live, 0, build, commit=commit, check_quota=False
            )
        except _NothingToDrop:
            return 0


class _NothingToDrop(FailedPreconditionError):
    """Raised inside a builder when a concurrent change left nothing to drop."""


# -- reducers (live and at replay) ---------------------------------------------------


@reducer("put_writes")
def _apply_put_writes(state: SessionState, body: dict[str, Any]) -> None:
    cp = state.checkpoints.get(body["checkpoint_id"])
    if cp is None:
        return
    entries = body["writes"]
    replaced = {(w["task_id"], w["idx"]) for w in entries}
    # A new list: records and snapshots share the old one (never mutated).
    cp.writes = [w for w in cp.writes if (w["task_id"], w["idx"]) not in replaced] + list(entries)


@reducer("copy")
def _apply_copy(state: SessionState, body: dict[str, Any]) -> None:
    for raw in body["checkpoints"]:
        cp = Checkpoint.from_json(raw, session_id=state.session_id)
        state.checkpoints[cp.checkpoint_id] = cp
    state.head = body.get("head", "")
    state.structured = copy.deepcopy(body.get("structured", {}))


@reducer("drop_checkpoints")
def _apply_drop_checkpoints(state: SessionState, body: dict[str, Any]) -> None:
    for checkpoint_id in body["dropped"]:
        state.checkpoints.pop(checkpoint_id, None)
    if "new_head" in body:
        state.head = body["new_head"]
