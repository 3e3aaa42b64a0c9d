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

Each facet declares its shape as TypedDicts (the JSON the journal and the
checkpoints keep, unchanged: a TypedDict is a plain dict at run time) and has
one ``parse(raw) -> <Facet>`` that checks a value from outside against it:
types, required and unknown keys, ranges and bounds, refusing with
INVALID_ARGUMENT naming the field path (``cognitive.fluid.progress: expected a
number between 0 and 1, got 'x'``). The ``want_*`` functions below are its
pieces. A facet's own reducers only store what its RPCs validated, so what is
in ``SessionState.structured`` parses; ReplaceStructuredState, the one way a
facet arrives whole from outside, is refused unless it parses. Readers
therefore take the facet typed (``facet_of``) without parsing it again on
every call (a cognitive log may hold 100,000 decisions).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar, cast

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
from stratad.ids import validate_id
from stratad.store.journal import Record
from stratad.values import MAX_STRUCT_DEPTH

T = TypeVar("T")

#: A JSON value as a facet stores it (a task result, a global value, a fact, a
#: tool call's arguments): what `want_json` accepts.
Json: TypeAlias = dict[str, "Json"] | list["Json"] | str | int | float | bool | None
JsonObject: TypeAlias = dict[str, Json]

#: Longest text field (characters): a goal, a decision, an error, a thinking.
MAX_TEXT = 64 << 10
#: Most items of one list field in one request.
MAX_ITEMS = 1000
#: Largest JSON value (a task result, a global state value, a tool call list).
MAX_JSON_BYTES = 1 << 20
#: Longest key of a map field (entity names, identity keys, global state keys).
MAX_KEY = 256
#: Deepest nesting of a JSON value a facet holds: a request's values nest at
#: most MAX_STRUCT_DEPTH levels, and an APPEND puts one in a list.
MAX_JSON_DEPTH = MAX_STRUCT_DEPTH + 1
#: The latest time (seconds since 1970) a google.protobuf.Timestamp holds: 9999-12-31.
MAX_TIME = 253_402_300_799
#: The largest value of an int64 field (a step, a count).
MAX_INT64 = (1 << 63) - 1


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
Plan = Callable[[LiveSession, float], tuple[Mapping[str, object], T]]


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
        live.log.ticket().wait()  # at once when nothing is pending (the usual case)
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


# -- parsing a facet from outside (see the module doc) ------------------------------------


def shown(value: object) -> str:
    """`value` in a message: JSON's names for objects, lists and literals, else a short repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:36]}..."


def refuse(path: str, problem: str) -> InvalidArgumentError:
    """The error of a facet that does not parse: `problem` with the field at `path`."""
    return InvalidArgumentError(f"{path}: {problem}", metadata={"field": path})


def expected(path: str, what: str, got: object) -> InvalidArgumentError:
    return refuse(path, f"expected {what}, got {shown(got)}")


def _is_text(value: str) -> bool:
    """Encodable as UTF-8, as protobuf requires (a lone surrogate, JSON's "\\ud800", is not)."""
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def want_object(
    raw: object, path: str, required: Collection[str], optional: Collection[str] = ()
) -> Mapping[str, object]:
    """An object with every `required` key, and no key but those and `optional` ones."""
    if not isinstance(raw, dict):
        raise expected(path, "an object", raw)
    for name in required:
        if name not in raw:
            raise refuse(f"{path}.{name}", "required but missing")
    if len(raw) > len(required):
        for name in raw:
            if name not in required and name not in optional:
                known = ", ".join([*required, *optional])
                raise refuse(path, f"unknown key {shown(name)} (keys: {known})")
    return raw


def want_text(raw: object, path: str, *, limit: int = MAX_TEXT) -> str:
    if not isinstance(raw, str) or not _is_text(raw):
        raise expected(path, "a string", raw)
    if len(raw) > limit:
        raise refuse(path, f"longer than {limit} characters")
    return raw


def want_int(raw: object, path: str, low: int = 0, high: int = MAX_INT64) -> int:
    """An integer (not a boolean, nor a number with a fraction) from `low` to `high`."""
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        bound = f"of at least {low}" if high == MAX_INT64 else f"from {low} to {high}"
        raise expected(path, f"an integer {bound}", raw)
    return raw


def want_number(raw: object, path: str, low: float, high: float, *, what: str = "") -> float:
    """A finite number (an integer or not, never a boolean) from `low` to `high`."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not low <= raw <= high:
        raise expected(path, what or f"a number between {low:g} and {high:g}", raw)
    return raw


def want_time(raw: object, path: str) -> float:
    """Seconds since 1970, within what a google.protobuf.Timestamp holds."""
    return want_number(raw, path, 0, MAX_TIME, what=f"a time (seconds since 1970, 0-{MAX_TIME})")


def want_one_of(raw: object, path: str, choices: Collection[str]) -> str:
    if not isinstance(raw, str) or raw not in choices:
        raise expected(path, "one of " + ", ".join(repr(c) for c in choices), raw)
    return raw


def want_id(raw: object, path: str) -> str:
    """An ID (stratad.ids: a task ID, a user ID)."""
    if not isinstance(raw, str):
        raise expected(path, "an ID", raw)
    try:
        return validate_id(raw, "ID")
    except InvalidArgumentError as exc:
        raise refuse(path, exc.message) from None


def want_list(raw: object, path: str, *, max_items: int | None = None) -> list[object]:
    if not isinstance(raw, list):
        raise expected(path, "a list", raw)
    if max_items is not None and len(raw) > max_items:
        raise refuse(path, f"more than {max_items} items")
    return raw


def want_texts(
    raw: object, path: str, *, limit: int = MAX_TEXT, max_items: int | None = MAX_ITEMS
) -> list[str]:
    items = want_list(raw, path, max_items=max_items)
    for index, item in enumerate(items):
        want_text(item, f"{path}[{index}]", limit=limit)
    return cast(list[str], items)


def want_map(
    raw: object, path: str, *, max_items: int | None = None, ids: bool = False
) -> dict[str, object]:
    """An object used as a map: keys as `key` requires them (IDs with `ids`)."""
    if not isinstance(raw, dict):
        raise expected(path, "an object", raw)
    if max_items is not None and len(raw) > max_items:
        raise refuse(path, f"more than {max_items} entries")
    for name in raw:
        if ids:
            want_id(name, f"{path}[{shown(name)}]")
        elif (
            not isinstance(name, str)
            or not 0 < len(name) <= MAX_KEY
            or any(ord(ch) < 32 for ch in name)
            or not _is_text(name)
        ):
            raise refuse(path, f"key {shown(name)} is not 1-{MAX_KEY} printable characters")
    return raw


def want_string_map(raw: object, path: str, *, max_items: int | None = MAX_ITEMS) -> dict[str, str]:
    entries = want_map(raw, path, max_items=max_items)
    for name, value in entries.items():
        want_text(value, f"{path}[{name!r}]")
    return cast(dict[str, str], entries)


def want_json(raw: object, path: str, *, limit: int = MAX_JSON_BYTES) -> Json:
    """A JSON value a reader can serve: objects with string keys, lists, strings,
    numbers a double holds (finite), booleans, null; nested at most
    MAX_JSON_DEPTH levels, at most `limit` bytes of JSON. Walked without
    recursion, so no value can exhaust the stack."""
    stack: list[tuple[object, str, int]] = [(raw, path, 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, dict | list):
            depth += 1
            if depth > MAX_JSON_DEPTH:  # named by the value's path: the item's would be long
                raise refuse(
                    path, f"nested deeper than {MAX_JSON_DEPTH} levels of objects and lists"
                )
            if isinstance(node, list):
                stack.extend((item, f"{where}[{i}]", depth) for i, item in enumerate(node))
                continue
            for name, item in node.items():
                if not isinstance(name, str) or not _is_text(name):
                    raise refuse(where, f"key {shown(name)} is not a string")
                stack.append((item, f"{where}[{name!r}]", depth))
        elif isinstance(node, str):
            if not _is_text(node):
                raise expected(where, "a string", node)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise expected(where, "a finite number", node)
        elif isinstance(node, int) and not isinstance(node, bool):
            try:
                float(node)
            except OverflowError:
                raise expected(where, "a number a double holds", node) from None
        elif node is not None and not isinstance(node, bool):
            raise expected(where, "a JSON value", node)
    size = len(json.dumps(raw, separators=(",", ":")))
    if size > limit:
        raise refuse(path, f"{size} bytes of JSON; the limit is {limit}")
    return cast(Json, raw)


def want_json_object(raw: object, path: str, *, limit: int = MAX_JSON_BYTES) -> JsonObject:
    if not isinstance(raw, dict):
        raise expected(path, "an object", raw)
    return cast(JsonObject, want_json(raw, path, limit=limit))
