"""Session and checkpoint state, and how journal records change it.

Every mutation of a session is one journal record. The same `apply` function
updates the in-memory state when the mutation happens and when the journal is
replayed at start-up, so a restarted daemon rebuilds exactly the state it
acknowledged. Later features register their own record kinds with
`reducer(kind)`.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stratad.errors import DataLossError
from stratad.store.tenant import ROOT_EMPTY


class SessionStatus(enum.StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(slots=True)
class Checkpoint:
    """One checkpoint's record. Sessions keep every one in memory, so it is lean:
    slots instead of a __dict__, and `from_json` shares repeated strings and
    empty containers (see there)."""

    checkpoint_id: str
    session_id: str
    version: int
    parent_id: str
    namespace: str
    name: str  # "" for unnamed checkpoints; named ones are pinned
    content_type: str
    metadata: dict[str, Any]
    created_at: float
    size: int
    digest: str
    root: str
    root_kind: str
    stored_bytes: int = 0
    #: Where the session's structured state (cognitive, tasks, agent) at this
    #: checkpoint is stored: {"root", "root_kind", "size", "digest"} of its
    #: canonical JSON, chunked and deduplicated like a state; {} when empty.
    #: Not the state itself: it can be megabytes, and checkpoints are many.
    structured: dict[str, Any] = field(default_factory=dict)
    #: Pending writes attached to this checkpoint (domain/writes.py), JSON-ready.
    writes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pinned(self) -> bool:
        return bool(self.name)

    def to_json(self) -> dict[str, Any]:
        """Every field (what `from_json` reads without any context)."""
        # Not dataclasses.asdict: it deep-copies every value, and this runs on
        # every save. Values are JSON-ready and never mutated after creation.
        return {name: getattr(self, name) for name in _CHECKPOINT_FIELDS}

    def to_record(
        self, session_id: str, version: int | None = None, at: float | None = None
    ) -> dict[str, Any]:
        """The lean form journal records store: only what the reader cannot rebuild.

        Left out: fields holding their default ("" names and types, empty
        metadata, structured reference and writes, no parent, 0 stored bytes),
        the session ID when it is `session_id` (the journal's session), the
        version and creation time when they are the record's own `v` and `at`,
        and `root` when it is the state's digest (a single-chunk state).
        `from_json` with the same context rebuilds an equal checkpoint; it
        reads the full form (`to_json`, and journals of older versions) too.
        """
        raw: dict[str, Any] = {"checkpoint_id": self.checkpoint_id}
        if self.session_id != session_id:
            raw["session_id"] = self.session_id
        if self.version != version:
            raw["version"] = self.version
        if self.created_at != at:
            raw["created_at"] = self.created_at
        raw["size"] = self.size
        raw["digest"] = self.digest
        if self.root != self.digest:
            raw["root"] = self.root
        raw["root_kind"] = self.root_kind
        for name, default in _RECORD_DEFAULTS.items():
            value = getattr(self, name)
            if value != default:
                raw[name] = value
        return raw

    @classmethod
    def from_json(
        cls,
        raw: dict[str, Any],
        *,
        session_id: str | None = None,
        version: int | None = None,
        created_at: float | None = None,
    ) -> Checkpoint:
        """Build from a journal record, sharing what many checkpoints repeat.

        `raw` is the full form or the lean one (`to_record`); for the lean
        one, the keywords are the context it was written with (the journal's
        session, the record's `v` and `at`). A field missing without context
        is a DataLossError: the record is not one stratad wrote.

        The session ID, namespace, names and types are interned (a session's
        checkpoints all repeat them), and empty
        metadata, structured references and write lists are one shared object
        each: containers of a checkpoint are never mutated in place (a change
        replaces them), so sharing is safe. Together this takes ~40% off the
        memory each stored checkpoint costs the daemon.
        """
        if len(raw) < len(_CHECKPOINT_FIELDS):  # lean, or from before a field existed
            raw = _complete(raw, session_id, version, created_at)
        cp = cls(**raw)
        for name in _INTERNED_FIELDS:
            setattr(cp, name, sys.intern(getattr(cp, name)))
        if not cp.metadata:
            cp.metadata = _NO_METADATA
        if not cp.structured:
            cp.structured = _NO_STRUCTURED
        if not cp.writes:
            cp.writes = _NO_WRITES
        return cp


_CHECKPOINT_FIELDS = tuple(f.name for f in dataclasses.fields(Checkpoint))
# Shared empty containers of `Checkpoint.from_json`: never mutate them.
_NO_METADATA: dict[str, Any] = {}
_NO_STRUCTURED: dict[str, Any] = {}
_NO_WRITES: list[dict[str, Any]] = []
#: Fields a lean checkpoint (`Checkpoint.to_record`) leaves out when they hold these.
_RECORD_DEFAULTS: dict[str, Any] = {
    "parent_id": "",
    "namespace": "",
    "name": "",
    "content_type": "",
    "metadata": _NO_METADATA,
    "stored_bytes": 0,
    "structured": _NO_STRUCTURED,
    "writes": _NO_WRITES,
}


def _complete(
    raw: dict[str, Any], session_id: str | None, version: int | None, created_at: float | None
) -> dict[str, Any]:
    """A lean checkpoint's fields with what it left out filled in (see `to_record`)."""
    full = {**_RECORD_DEFAULTS, **raw}
    for name, value in (
        ("session_id", session_id),
        ("version", version),
        ("created_at", created_at),
        ("root", raw.get("digest")),
    ):
        if name not in full:
            if value is None:
                raise DataLossError(f"a journal's checkpoint record lacks its {name}")
            full[name] = value
    return full


# Not the checkpoint IDs: interning costs about what it saves (the intern
# table's entry); _apply_save shares a parent's ID with its children instead.
_INTERNED_FIELDS = ("session_id", "namespace", "name", "content_type", "root_kind")


@dataclass
class SessionState:
    session_id: str
    status: SessionStatus
    version: int
    labels: dict[str, str]
    created_at: float
    updated_at: float
    keep_last: int = 0  # 0 = keep every unnamed checkpoint
    max_age_seconds: float = 0.0  # 0 = no age limit
    head: str = ""
    forked_from: str = ""
    #: checkpoint_id -> Checkpoint, in creation order.
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    #: Structured state of later features (cognitive, tasks, agent), by facet.
    structured: dict[str, Any] = field(default_factory=dict)

    @property
    def head_checkpoint(self) -> Checkpoint | None:
        return self.checkpoints.get(self.head)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready view, to encode while the session's lock is held.

        It shares the (possibly large) structured state rather than copying it:
        encoding it directly halves the time a compaction holds the lock.
        """
        raw = self._fields()
        raw["checkpoints"] = [c.to_json() for c in self.checkpoints.values()]
        return raw

    def to_record(self) -> dict[str, Any]:
        """`to_json` with lean checkpoints: what `create` and `snapshot` records store.

        Each checkpoint is `Checkpoint.to_record`, except for its parent: one
        whose parent is the checkpoint before it in the list (a line of saves)
        leaves `parent_id` out, and one without a parent says `"parent_id": ""`
        unless it is the first. `from_json` reads this and the full form.
        """
        raw = self._fields()
        session_id = self.session_id
        checkpoints = []
        previous = ""
        for cp in self.checkpoints.values():
            lean = cp.to_record(session_id)
            if cp.parent_id != previous:
                lean["parent_id"] = cp.parent_id
            else:
                lean.pop("parent_id", None)
            checkpoints.append(lean)
            previous = cp.checkpoint_id
        raw["checkpoints"] = checkpoints
        return raw

    def _fields(self) -> dict[str, Any]:
        raw = dict(self.__dict__)
        raw["status"] = self.status.value
        raw["labels"] = dict(self.labels)
        return raw

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SessionState:
        raw = dict(raw)
        session_id = raw["session_id"]
        checkpoints = []
        previous = ""  # see to_record: a missing parent_id is the previous checkpoint's ID
        for c in raw.pop("checkpoints"):
            if "parent_id" not in c:
                c = {**c, "parent_id": previous}  # one string shared, not a copy
            cp = Checkpoint.from_json(c, session_id=session_id)
            checkpoints.append(cp)
            previous = cp.checkpoint_id
        state = cls(**raw)
        state.status = SessionStatus(raw["status"])
        state.checkpoints = {c.checkpoint_id: c for c in checkpoints}
        return state


Reducer = Callable[[SessionState, dict[str, Any]], None]
_REDUCERS: dict[str, Reducer] = {}


def reducer(kind: str) -> Callable[[Reducer], Reducer]:
    """Register how records of `kind` change a session."""

    def register(fn: Reducer) -> Reducer:
        _REDUCERS[kind] = fn
        return fn

    return register


def apply(state: SessionState, kind: str, body: dict[str, Any]) -> None:
    """Apply one record (other than `create`/`snapshot`) to a session."""
    fn = _REDUCERS.get(kind)
    if fn is None:
        raise DataLossError(f"journal record of unknown kind {kind!r}")
    fn(state, body)
    state.version = body["v"]
    state.updated_at = body["at"]


@reducer("save")
def _apply_save(state: SessionState, body: dict[str, Any]) -> None:
    checkpoint = Checkpoint.from_json(
        body["checkpoint"], session_id=state.session_id, version=body["v"], created_at=body["at"]
    )
    parent = state.checkpoints.get(checkpoint.parent_id)
    if parent is not None:  # one string for the parent's ID, not a copy per child
        checkpoint.parent_id = parent.checkpoint_id
    state.checkpoints[checkpoint.checkpoint_id] = checkpoint
    if body.get("make_head", True):
        state.head = checkpoint.checkpoint_id
    forked_from = body.get("detail", {}).get("forked_from")
    if forked_from:
        state.forked_from = forked_from
    if "structured" in body:  # the builder read it from the checkpoint's objects
        state.structured = copy.deepcopy(body["structured"])
    for dropped in body.get("dropped", ()):
        state.checkpoints.pop(dropped, None)


@reducer("status")
def _apply_status(state: SessionState, body: dict[str, Any]) -> None:
    state.status = SessionStatus(body["status"])


@reducer("head")
def _apply_head(state: SessionState, body: dict[str, Any]) -> None:
    """RestoreCheckpoint(make_current): the checkpoint's state becomes current again."""
    state.head = body["checkpoint_id"]
    if "structured" in body:  # the builder read it from the checkpoint's objects
        state.structured = copy.deepcopy(body["structured"])


@reducer("delete_checkpoint")
def _apply_delete_checkpoint(state: SessionState, body: dict[str, Any]) -> None:
    state.checkpoints.pop(body["checkpoint_id"], None)
    if state.head == body["checkpoint_id"]:
        state.head = body.get("new_head", "")


def roots(cp: Checkpoint) -> list[tuple[str, str]]:
    """The root objects a checkpoint holds: its state's and its structured state's."""
    found = [(cp.root, cp.root_kind)] if cp.root_kind != ROOT_EMPTY and cp.root else []
    ref = cp.structured
    if ref and ref.get("root"):
        found.append((ref["root"], ref["root_kind"]))
    return found
