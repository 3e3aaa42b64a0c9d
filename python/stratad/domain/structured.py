"""What the structured-state facets (cognitive, tasks, agent) share.

A facet is a plain JSON-able dict in ``SessionState.structured[<facet>]``,
changed only by journal records of its own kinds. A mutation is planned under
the session lock (validation against the current state, every computed value
such as a timestamp put in the record body) and applied by the facet's
reducer, live and at replay alike, so concurrent updates never lose each
other and a restarted daemon rebuilds exactly what it acknowledged.

Reducers never change a stored list or dict in place when a reader may hold
it: they put a new one in its place (copy on write). Readers therefore take
references under the session lock and convert them to protobuf outside it.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from stratad.domain.events import SessionEvent
from stratad.domain.models import SessionState, SessionStatus, reducer
from stratad.domain.sessions import (
    Commit,
    LiveSession,
    Mutation,
    SessionManager,
    check_usable,
    require_status,
)
from stratad.errors import InvalidArgumentError
from stratad.store.journal import Record

T = TypeVar("T")

#: Longest text field (characters): a goal, a decision, an error, a thinking.
MAX_TEXT = 64 << 10
#: Most items of one list field in one request.
MAX_ITEMS = 1000
#: Largest JSON value (a task result, a global state value, a tool call list).
MAX_JSON_BYTES = 1 << 20
#: Longest key of a map field (entity names, identity keys, global state keys).
MAX_KEY = 256


class Unchanged(Exception):
    """Raised by a plan when the request changes nothing (e.g. a duplicate).

    Nothing is journaled; the caller gets `result` and the current version.
    """

    def __init__(self, result: Any) -> None:
        super().__init__("unchanged")
        self.result = result
        self.version = 0


@dataclass(frozen=True)
class Applied(Generic[T]):
    """A mutation's result and the session version after it."""

    result: T
    version: int


#: plan(live, at) -> (record body without v/at, result); raises to refuse.
Plan = Callable[[LiveSession, float], tuple[dict[str, Any], T]]


def mutate(
    sessions: SessionManager,
    tenant: str,
    session_id: str,
    expected_version: int,
    kind: str,
    plan: Plan[T],
    *,
    commit: Commit | None = None,
) -> Applied[T]:
    """Plan, journal and apply one structured-state record.

    With `commit`, durability and the event are left to the caller (see
    SessionManager.mutate_live). A plan that raises `Unchanged` journals
    nothing; its answer is still only given once everything it depends on is
    durable, so a duplicate is never acknowledged ahead of the original.
    """
    live = sessions.live(tenant, session_id)

    def build(live: LiveSession, version: int, at: float) -> Mutation:
        require_status(live, SessionStatus.ACTIVE, SessionStatus.PAUSED)
        try:
            body, result = plan(live, at)
        except Unchanged as exc:
            exc.version = live.state.version
            raise
        record = Record(kind, {"v": version, "at": at, **body})
        return Mutation(record, SessionEvent(version, kind, at), Applied(result, version))

    try:
        applied: Applied[T] = sessions.mutate_live(live, expected_version, build, commit=commit)
    except Unchanged as exc:
        live.journal.sync()  # at once when nothing is pending (the usual case)
        if sessions.replicator is not None:  # `sync` mode: the original is shipped too
            sessions.replicator.replicate([live.key])
        return Applied(exc.result, exc.version)
    return applied


def read(
    sessions: SessionManager, tenant: str, session_id: str, fn: Callable[[SessionState], T]
) -> Applied[T]:
    """`fn(state)` under the session lock, with the version it saw."""
    live = sessions.live(tenant, session_id)
    with live.lock:
        check_usable(live)
        live.accessed_at = time.time()  # a read keeps the session from expiring
        return Applied(fn(live.state), live.state.version)


# -- the structured state as a whole (stratad ctl export / import) ----------------------

#: The facets a session's structured state may hold (SessionState.structured keys).
FACETS = ("cognitive", "tasks", "agent")
#: The record kind of ReplaceStructuredState.
REPLACE = "structured.replace"


@reducer(REPLACE)
def _apply_replace(state: SessionState, body: dict[str, Any]) -> None:
    state.structured = copy.deepcopy(body["structured"])


def canonical_json(structured: dict[str, Any]) -> bytes:
    """The structured state as checkpoints capture it: sorted keys, no spaces."""
    return json.dumps(structured, sort_keys=True, separators=(",", ":")).encode()


def current_json(sessions: SessionManager, tenant: str, session_id: str) -> Applied[bytes]:
    """The session's structured state now, as canonical JSON."""
    return read(sessions, tenant, session_id, lambda s: canonical_json(s.structured))


def parse_whole(structured_json: bytes) -> dict[str, Any]:
    """A whole structured state sent by a client: a JSON object of known facets."""
    try:
        value = json.loads(structured_json or b"{}")
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidArgumentError(f"structured_json is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError("structured_json must be a JSON object keyed by facet")
    for facet, facet_state in value.items():
        if facet not in FACETS:
            raise InvalidArgumentError(
                f"structured_json: unknown facet {facet!r} (known: {', '.join(FACETS)})"
            )
        if not isinstance(facet_state, dict):
            raise InvalidArgumentError(f"structured_json: facet {facet!r} must be an object")
    json_value(value, "structured_json", limit=1 << 62)  # finite numbers only
    return value


def replace_whole(
    sessions: SessionManager,
    tenant: str,
    session_id: str,
    structured: dict[str, Any],
    expected_version: int = 0,
) -> Applied[None]:
    """Replace every facet at once (journaled like any facet change); unchanged: no record."""

    def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], None]:
        if live.state.structured == structured:
            raise Unchanged(None)
        return {"structured": structured}, None

    return mutate(sessions, tenant, session_id, expected_version, REPLACE, plan)


# -- validation -------------------------------------------------------------------------


def text(value: str, what: str, *, required: bool = False, limit: int = MAX_TEXT) -> str:
    if required and not value.strip():
        raise InvalidArgumentError(f"{what} is required")
    if len(value) > limit:
        raise InvalidArgumentError(f"{what} is longer than {limit} characters")
    return value


def key(value: str, what: str) -> str:
    """A map key: 1-256 characters, no control characters."""
    if not value or len(value) > MAX_KEY or any(ord(ch) < 32 for ch in value):
        raise InvalidArgumentError(f"{what} must be 1-{MAX_KEY} printable characters")
    return value


def texts(values: list[str], what: str, *, limit: int = MAX_TEXT) -> list[str]:
    if len(values) > MAX_ITEMS:
        raise InvalidArgumentError(f"{what} has more than {MAX_ITEMS} items")
    for value in values:
        text(value, f"an item of {what}", limit=limit)
    return list(values)


def string_map(values: dict[str, str], what: str) -> dict[str, str]:
    if len(values) > MAX_ITEMS:
        raise InvalidArgumentError(f"{what} has more than {MAX_ITEMS} entries")
    for k, v in values.items():
        key(k, f"a key of {what}")
        text(v, f"the value of {what}[{k!r}]")
    return dict(values)


def step(value: int) -> int:
    if value < 0:
        raise InvalidArgumentError("step must not be negative")
    return value


def json_value(value: Any, what: str, *, limit: int = MAX_JSON_BYTES) -> int:
    """Check that `value` is JSON (finite numbers) of at most `limit` bytes; return its size."""
    try:
        size = len(json.dumps(value, separators=(",", ":"), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what} is not a JSON value: {exc}") from None
    if size > limit:
        raise InvalidArgumentError(f"{what} is {size} bytes of JSON; the limit is {limit}")
    return size


def finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{what} must be a finite number")
    return value
