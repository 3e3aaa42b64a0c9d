"""What the inspector shows, read from the domain layer and never written.

Every method is blocking (locks, object reads, JSON decoding) and returns
JSON-ready dicts: the HTTP layer runs them on the daemon's worker pool.

Read-only means more than "calls no mutation":

- a tenant is looked up among the directories that exist, never through
  `Store.tenant` (which creates one);
- a session is one this daemon holds (`SessionManager.loaded`), never fetched
  through `SessionManager.live`, which with replication on may hydrate a
  session from object storage onto the local disk;
- session state is copied under the session's lock and decoded outside it,
  so the inspector holds a lock no longer than a listing call does.

What it decodes: a checkpoint StratadSaver stored (LangGraph's serializer's
bytes) becomes the JSON `stratad ctl checkpoints show --decode langgraph`
prints (`stratad.ctl.decode.to_jsonable`), with its messages listed as a
transcript; other states are JSON, text or a hex preview. LangGraph's
serializer runs in its strict mode here: the daemon reads every tenant's
bytes, so it rebuilds only LangGraph's safe types (messages, Send,
Interrupt, datetimes...), never a class or callable a payload names, and
never unpickles.

Times are shown as ISO 8601 UTC (``2026-11-27T18:31:02.517Z``): records the
page lists keep their number (``created_at``) and gain a ``created_at_iso``;
the structured state's times are converted where they stand.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from stratad.ctl import decode as state_decode
from stratad.domain.crystals import Crystal
from stratad.domain.models import Checkpoint
from stratad.domain.sessions import LiveSession
from stratad.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from stratad.ids import validate_id
from stratad.server.inspector import jsondiff

if TYPE_CHECKING:
    from stratad.domain.engine import Engine

T = TypeVar("T")

#: Sessions listed at most by one search (the page says how many matched).
MAX_SESSIONS_LISTED = 1000
#: Crystals listed at most per tenant.
MAX_CRYSTALS_LISTED = 1000
#: Tasks listed at most per session.
MAX_TASKS_LISTED = 1000
#: States up to this size are decoded and shown; larger ones get a summary.
MAX_DECODED_BYTES = 8 << 20
#: Bytes of a binary state shown in hex.
HEX_PREVIEW_BYTES = 256
#: Characters of a non-JSON text state shown.
TEXT_PREVIEW_CHARS = 64 << 10
#: The structured-state facets the session page shows.
FACETS = ("cognitive", "tasks", "agent")
#: Messages listed at most in a LangGraph checkpoint's transcript.
MAX_MESSAGES_LISTED = 1000
#: Pending writes listed at most with a LangGraph checkpoint.
MAX_WRITES_LISTED = 1000
#: LangGraph serializer types the inspector decodes (never "pickle": it could run code).
LANGGRAPH_SERDE_TYPES = ("msgpack", "json", "null")


def valid_id(value: str, what: str) -> str:
    """``value`` if it is a valid ID, else INVALID_ARGUMENT with reason INVALID_ID."""
    try:
        return validate_id(value, what)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(exc.message, reason="INVALID_ID") from None


class Reader:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._store = engine.store
        self._sessions = engine.sessions

    # -- tenants -----------------------------------------------------------------

    def tenants(self) -> dict[str, Any]:
        listed = []
        for name in self._tenant_names():
            stats = self._engine.crystals.stats(name)
            count = len(self._sessions.sessions_of(name))
            listed.append({"tenant": name, "sessions": count, "crystals": stats.total_crystals})
        return {"tenants": listed}

    def _tenant_names(self) -> list[str]:
        # Directories only a tenant ID can name (a stray ".tmp" is no tenant).
        return [name for name in self._store.existing_tenant_names() if _is_id(name)]

    def _tenant(self, tenant: str) -> str:
        valid_id(tenant, "tenant")
        if tenant not in self._tenant_names():
            raise NotFoundError(f"tenant {tenant!r} not found", reason="NOT_FOUND")
        return tenant

    # -- sessions ------------------------------------------------------------------

    def sessions(self, tenant: str, query: str = "") -> dict[str, Any]:
        """The tenant's sessions whose ID or a label (key, value or key=value) contains
        ``query`` (case-insensitive), ordered by ID."""
        tenant = self._tenant(tenant)
        needle = query.strip().lower()
        summaries = [
            summary
            for live in self._sessions.sessions_of(tenant)
            if (summary := _summary_unless_deleted(live)) is not None
        ]
        matching = sorted(
            (s for s in summaries if not needle or _matches(s, needle)),
            key=lambda s: str(s["session_id"]),
        )
        return {
            "tenant": tenant,
            "query": query,
            "total": len(summaries),
            "matched": len(matching),
            "sessions": [_with_iso(s) for s in matching[:MAX_SESSIONS_LISTED]],
            "truncated": len(matching) > MAX_SESSIONS_LISTED,
        }

    def session(self, tenant: str, session_id: str) -> dict[str, Any]:
        """The session, every checkpoint (creation order), its source and its forks."""
        live = self._live(tenant, session_id)

        def read(live: LiveSession) -> dict[str, Any]:
            state = live.state
            return {
                **_summary(live),
                "checkpoints": [_checkpoint(cp) for cp in state.checkpoints.values()],
            }

        out = _with_iso(_locked(live, read))  # times formatted outside the lock
        for checkpoint in out["checkpoints"]:
            _with_iso(checkpoint)
        out["tenant"] = tenant
        out["forked_from"] = self._fork_source(live, str(out["forked_from"]))
        out["forks"] = self._forks_of(live, {c["checkpoint_id"] for c in out["checkpoints"]})
        return out

    def _fork_source(self, live: LiveSession, checkpoint_id: str) -> dict[str, str] | None:
        if not checkpoint_id:
            return None
        for other in self._sessions.sessions_of(live.tenant.name):
            with other.lock:
                if not other.deleted and checkpoint_id in other.state.checkpoints:
                    return {"checkpoint_id": checkpoint_id, "session_id": other.state.session_id}
        return {"checkpoint_id": checkpoint_id, "session_id": ""}  # since deleted

    def _forks_of(self, live: LiveSession, checkpoint_ids: set[str]) -> list[dict[str, Any]]:
        forks = []
        for other in self._sessions.sessions_of(live.tenant.name):
            with other.lock:
                source = other.state.forked_from
                if other is not live and not other.deleted and source in checkpoint_ids:
                    forks.append(
                        {
                            "session_id": other.state.session_id,
                            "checkpoint_id": source,
                            "created_at": other.state.created_at,
                            "checkpoint_count": len(other.state.checkpoints),
                        }
                    )
        return [
            _with_iso(f) for f in sorted(forks, key=lambda f: (f["created_at"], f["session_id"]))
        ]

    def _live(self, tenant: str, session_id: str) -> LiveSession:
        tenant = self._tenant(tenant)
        valid_id(session_id, "session_id")
        live = self._sessions.loaded(tenant, session_id)
        if live is None:
            raise NotFoundError(f"session {session_id!r} not found", reason="SESSION_NOT_FOUND")
        return live

    # -- checkpoints ---------------------------------------------------------------------

    def checkpoint(self, tenant: str, session_id: str, checkpoint_id: str) -> dict[str, Any]:
        """One checkpoint and its state: a LangGraph checkpoint decoded, JSON when it is
        JSON, else text or a hex summary (with why it was not decoded)."""
        live = self._live(tenant, session_id)
        cp = self._find_checkpoint(live, checkpoint_id)
        with live.lock:
            writes = list(cp.writes)
        state = describe_checkpoint_state(self._read_state(live, cp), cp.size, cp.content_type)
        if state["encoding"] == "langgraph" and writes:
            state["pending_writes"], state["pending_writes_truncated"] = _langgraph_writes(
                writes, cp.content_type
            )
        return {
            "tenant": tenant,
            "session_id": session_id,
            "checkpoint": _with_iso(_checkpoint(cp)),
            "state": state,
        }

    def diff(self, tenant: str, session_id: str, a: str, b: str) -> dict[str, Any]:
        """What changed from checkpoint ``a`` to checkpoint ``b`` (both of the session).

        LangGraph checkpoints are compared decoded (the JSON the state view shows);
        two states are not comparable when either is not JSON once decoded."""
        live = self._live(tenant, session_id)
        cp_a = self._find_checkpoint(live, a)
        cp_b = self._find_checkpoint(live, b)
        sides = [
            comparable_value(self._read_state(live, cp), cp.content_type) for cp in (cp_a, cp_b)
        ]
        values = [value for value, _ in sides]
        out: dict[str, Any] = {
            "tenant": tenant,
            "session_id": session_id,
            "a": _with_iso(_checkpoint(cp_a)),
            "b": _with_iso(_checkpoint(cp_b)),
            "identical": cp_a.digest == cp_b.digest,
            "states": {"a": sides[0][1], "b": sides[1][1]},
        }
        if values[0] is _NOT_JSON or values[1] is _NOT_JSON:
            out["comparable"] = False
            return out
        changes, truncated = jsondiff.diff(values[0], values[1])
        out.update(
            comparable=True,
            changes=[c.to_json() for c in changes],
            truncated=truncated,
        )
        return out

    def _find_checkpoint(self, live: LiveSession, checkpoint_id: str) -> Checkpoint:
        valid_id(checkpoint_id, "checkpoint_id")
        with live.lock:
            cp = live.state.checkpoints.get(checkpoint_id)
        if cp is None:
            raise NotFoundError(
                f"checkpoint {checkpoint_id!r} not found in session {live.state.session_id!r}",
                reason="CHECKPOINT_NOT_FOUND",
            )
        return cp

    def _read_state(self, live: LiveSession, cp: Checkpoint) -> bytes | None:
        """The checkpoint's verified bytes; None when too large to show."""
        if cp.size > MAX_DECODED_BYTES:
            return None
        try:
            return live.tenant.read(cp.root, cp.root_kind, cp.size, cp.digest)
        except DataLossError:
            with live.lock:  # deleted (and collected) while we read it: "not found"
                gone = live.deleted or cp.checkpoint_id not in live.state.checkpoints
            if gone:
                raise NotFoundError(
                    f"checkpoint {cp.checkpoint_id!r} not found", reason="CHECKPOINT_NOT_FOUND"
                ) from None
            raise

    # -- structured state ------------------------------------------------------------------

    def structured(self, tenant: str, session_id: str) -> dict[str, Any]:
        """The session's cognitive state, tasks and agent state (None where absent)."""
        live = self._live(tenant, session_id)
        # Serialized under the lock: facets may share lists with the live state.
        encoded = _locked(live, lambda live: json.dumps(_facets(live)))
        facets: dict[str, Any] = json.loads(encoded)
        _show_times(facets)
        out: dict[str, Any] = {"tenant": tenant, "session_id": session_id, **facets}
        tasks = facets.get("tasks")
        if isinstance(tasks, dict) and isinstance(tasks.get("tasks"), dict):
            listed = list(tasks["tasks"].items())
            tasks["tasks"] = dict(listed[:MAX_TASKS_LISTED])
            tasks["task_count"] = len(listed)
            tasks["truncated"] = len(listed) > MAX_TASKS_LISTED
        return out

    # -- crystals ----------------------------------------------------------------------------

    def crystals(self, tenant: str) -> dict[str, Any]:
        """The tenant's crystals, most effective first, and the library's statistics."""
        tenant = self._tenant(tenant)
        library = self._engine.crystals
        crystals: list[Crystal] = []
        token = ""
        while len(crystals) < MAX_CRYSTALS_LISTED:
            page, token = library.list(tenant, page_size=1000, page_token=token)
            crystals.extend(page)
            if not token:
                break
        crystals.sort(key=lambda c: (-c.effectiveness, -c.reuse_count, c.created_at))
        return {
            "tenant": tenant,
            "stats": dataclasses.asdict(library.stats(tenant)),
            "crystals": [_with_iso(dataclasses.asdict(c)) for c in crystals[:MAX_CRYSTALS_LISTED]],
            "truncated": bool(token) or len(crystals) > MAX_CRYSTALS_LISTED,
        }


# -- helpers ---------------------------------------------------------------------------------


def _is_id(value: str) -> bool:
    try:
        validate_id(value, "tenant")
    except InvalidArgumentError:
        return False
    return True


def _locked(live: LiveSession, read: Callable[[LiveSession], T]) -> T:
    with live.lock:
        if live.deleted:
            raise NotFoundError(
                f"session {live.state.session_id!r} not found", reason="SESSION_NOT_FOUND"
            )
        return read(live)


def _summary_unless_deleted(live: LiveSession) -> dict[str, Any] | None:
    """The summary, or None for a session deleted since it was listed (not an error)."""
    with live.lock:
        return None if live.deleted else _summary(live)


def _summary(live: LiveSession) -> dict[str, Any]:
    """A session's summary (session lock held)."""
    state = live.state
    return {
        "session_id": state.session_id,
        "status": state.status.value,
        "version": state.version,
        "labels": dict(state.labels),
        "created_at": state.created_at,
        "updated_at": state.updated_at,
        "checkpoint_count": len(state.checkpoints),
        "head": state.head,
        "forked_from": state.forked_from,
        "keep_last": state.keep_last,
        "facets": [f for f in FACETS if state.structured.get(f)],
        "damaged": live.damaged,
    }


def _facets(live: LiveSession) -> dict[str, Any]:
    structured = live.state.structured
    return {facet: structured.get(facet) or None for facet in FACETS}


def _matches(summary: dict[str, Any], needle: str) -> bool:
    if needle in str(summary["session_id"]).lower():
        return True
    labels: dict[str, str] = summary["labels"]
    return any(needle in f"{k}={v}".lower() for k, v in labels.items())


def _checkpoint(cp: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": cp.checkpoint_id,
        "parent_id": cp.parent_id,
        "version": cp.version,
        "namespace": cp.namespace,
        "name": cp.name,
        "content_type": cp.content_type,
        "metadata": cp.metadata,
        "created_at": cp.created_at,
        "size": cp.size,
        "stored_bytes": cp.stored_bytes,
        "digest": cp.digest,
        "has_structured": bool(cp.structured),
        "pending_writes": len(cp.writes),
    }


class _NotJson:
    """Marks a state that is not a JSON document."""


_NOT_JSON: Any = _NotJson()


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(data: bytes | None) -> Any:
    """The JSON value of ``data``, or _NOT_JSON (also for NaN/Infinity, which Python's
    json module accepts and browsers' JSON.parse does not, and for nesting too deep)."""
    if data is None:
        return _NOT_JSON
    try:
        return json.loads(data, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _NOT_JSON


def describe_state(data: bytes | None, size: int) -> dict[str, Any]:
    """How the page shows a state: ``encoding`` json (``value``), text (``text``),
    binary (``hex``, its first bytes) or too_large (nothing read)."""
    if data is None:
        return {"encoding": "too_large", "size": size, "limit": MAX_DECODED_BYTES}
    value = decode_json(data)
    if value is not _NOT_JSON:
        return {"encoding": "json", "size": size, "value": value}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return {"encoding": "binary", "size": size, "hex": data[:HEX_PREVIEW_BYTES].hex()}
    return {
        "encoding": "text",
        "size": size,
        "text": text[:TEXT_PREVIEW_CHARS],
        "truncated": len(text) > TEXT_PREVIEW_CHARS,
    }


def describe_checkpoint_state(data: bytes | None, size: int, content_type: str) -> dict[str, Any]:
    """How the page shows a checkpoint's state: a LangGraph checkpoint decoded
    (``encoding`` langgraph: ``value``, ``messages``), else as `describe_state`;
    a LangGraph checkpoint that cannot be decoded says why (``undecoded``)."""
    if data is None or not state_decode.is_langgraph(content_type):
        return describe_state(data, size)
    try:
        value = decode_langgraph(data, content_type)
    except Undecodable as exc:
        return {**describe_state(data, size), "undecoded": str(exc)}
    messages, truncated = messages_in(value)
    return {
        "encoding": "langgraph",
        "size": size,
        "serde": _serde_type(content_type),
        "value": value,
        "messages": messages,
        "messages_truncated": truncated,
    }


def comparable_value(data: bytes | None, content_type: str) -> tuple[Any, dict[str, str]]:
    """The JSON a diff compares (_NOT_JSON if none) and ``{encoding, why?}``: why a
    state is not compared."""
    if data is None:
        why = f"larger than the {MAX_DECODED_BYTES >> 20} MiB the inspector decodes"
        return _NOT_JSON, {"encoding": "too_large", "why": why}
    undecoded = ""
    if state_decode.is_langgraph(content_type):
        try:
            return decode_langgraph(data, content_type), {"encoding": "langgraph"}
        except Undecodable as exc:
            undecoded = str(exc)
    value = decode_json(data)
    if value is not _NOT_JSON:
        return value, {"encoding": "json"}
    return _NOT_JSON, {"encoding": "not_json", "why": undecoded or _OPAQUE}


_OPAQUE = "neither JSON nor a LangGraph checkpoint StratadSaver stored"


class Undecodable(Exception):
    """A LangGraph checkpoint the inspector cannot decode; the message says why."""


def _langgraph_serde() -> Any:
    """LangGraph's own serializer, strict (`stratad.ctl.decode.strict_langgraph_serde`):
    the default imports and calls whatever callable a payload names, which is code
    execution for anyone who can save a state."""
    try:
        return state_decode.strict_langgraph_serde()
    except FailedPreconditionError:
        raise Undecodable(
            "decoding it needs LangGraph where the daemon runs (pip install 'stratad[langgraph]')"
        ) from None


def _serde_type(content_type: str) -> str:
    return content_type[len(state_decode.LANGGRAPH_CONTENT_TYPE_PREFIX) :]


def decode_langgraph(data: bytes, content_type: str) -> Any:
    """A StratadSaver checkpoint as JSON, ``{checkpoint, metadata, parent_checkpoint_id}``:
    what `stratad ctl checkpoints show --decode langgraph` prints (its `to_jsonable`),
    read with the strict serializer. Raises Undecodable."""
    return _loads_langgraph(_serde_type(content_type), data, "checkpoint", state=True)


def _loads_langgraph(serde_type: str, data: bytes, what: str, *, state: bool = False) -> Any:
    if serde_type not in LANGGRAPH_SERDE_TYPES:
        if serde_type == "pickle":
            raise Undecodable(
                f"this {what} is pickled, and the inspector never unpickles what agents "
                "stored (unpickling can run code)"
            )
        raise Undecodable(
            f"this {what} was serialized as {serde_type[:100]!r}, which the inspector does not "
            f"decode (it reads {', '.join(LANGGRAPH_SERDE_TYPES)}: an encrypted or custom "
            "serializer's bytes stay opaque)"
        )
    serde = _langgraph_serde()
    try:
        loaded = (
            state_decode.loads_langgraph_state(serde, serde_type, data)
            if state
            else serde.loads_typed((serde_type, data))
        )
        value = state_decode.to_jsonable(loaded)
    except RecursionError:
        raise Undecodable(f"this {what} is nested too deeply to show") from None
    except Exception as exc:
        raise Undecodable(
            f"LangGraph's serializer cannot read this {serde_type} {what}: {str(exc)[:300]}"
        ) from None
    return _finite(value)


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as strings: a browser's JSON.parse rejects them."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return _replace_non_finite(value)
    return value


def _replace_non_finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    if isinstance(value, dict):
        return {k: _replace_non_finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_non_finite(v) for v in value]
    return value


def messages_in(value: Any) -> tuple[list[dict[str, Any]], bool]:
    """The LangChain messages in a decoded checkpoint's channel values, in document
    order, each as ``{pointer, type, class, content}`` (and ``name``, ``role``,
    ``tool_calls``, ``tool_call_id`` when set); True if cut at MAX_MESSAGES_LISTED."""
    checkpoint = value.get("checkpoint") if isinstance(value, dict) else None
    channels = checkpoint.get("channel_values") if isinstance(checkpoint, dict) else None
    if not isinstance(channels, dict):
        return [], False
    found: list[dict[str, Any]] = []
    for pointer, node in _walk(channels, "/checkpoint/channel_values"):
        if len(found) == MAX_MESSAGES_LISTED:
            return found, True
        found.append(_message(pointer, node))
    return found, False


def _walk(root: Any, pointer: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Message-like objects under ``root`` (not inside one another), in document order."""
    stack: list[tuple[str, Any]] = [(pointer, root)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            if _is_message(node):
                yield path, node
                continue
            children = [(path + jsondiff.pointer((k,)), v) for k, v in node.items()]
        elif isinstance(node, list):
            children = [(f"{path}/{i}", v) for i, v in enumerate(node)]
        else:
            continue
        stack.extend(reversed(children))


def _is_message(node: dict[str, Any]) -> bool:
    kind = node.get("$type")
    return (
        isinstance(kind, str) and kind.endswith(("Message", "MessageChunk")) and "content" in node
    )


def _message(pointer: str, node: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    shown: dict[str, Any] = {
        "pointer": pointer,
        "type": kind if isinstance(kind, str) and kind else node["$type"],
        "class": node["$type"],
        "content": node["content"],
    }
    for extra in ("name", "role", "tool_calls", "tool_call_id"):
        if node.get(extra):
            shown[extra] = node[extra]
    return shown


def _langgraph_writes(
    writes: list[dict[str, Any]], content_type: str
) -> tuple[list[dict[str, Any]], bool]:
    """A LangGraph checkpoint's pending writes (an interrupt, a task's output not yet
    applied), each value decoded like the checkpoint; True if cut at MAX_WRITES_LISTED."""
    shown = []
    budget = MAX_DECODED_BYTES
    ordered = sorted(writes, key=lambda w: (w["task_path"], w["task_id"], w["idx"]))
    for w in ordered[:MAX_WRITES_LISTED]:
        entry = {k: w[k] for k in ("task_id", "task_path", "idx", "channel", "type", "size")}
        if w["size"] > budget:
            entry["undecoded"] = "past what the inspector decodes for one checkpoint"
        else:
            budget -= w["size"]
            try:
                data = base64.b64decode(w["value"], validate=True)
                entry["value"] = _loads_langgraph(w["type"], data, "write")
            except ValueError:  # never stored so: the journal's checksum passed
                entry["undecoded"] = "its stored value is not valid base64"
            except Undecodable as exc:
                entry["undecoded"] = str(exc)
        shown.append(entry)
    return shown, len(writes) > MAX_WRITES_LISTED


# -- times -----------------------------------------------------------------------------------


def _with_iso(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with ``created_at_iso`` and ``updated_at_iso`` next to the numbers."""
    for key in ("created_at", "updated_at"):
        if key in record:
            record[f"{key}_iso"] = iso_time(record[key])
    return record


def iso_time(seconds: Any) -> str | None:
    """Epoch seconds as ISO 8601 UTC, ``2026-11-27T18:31:02.517Z``; None for no time."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds:
        return None
    try:
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return _iso(moment)


def _iso(moment: datetime.datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _local_iso_as_utc(text: Any) -> str | None:
    """An ISO time without a zone, written in the daemon's local time (the agent
    state's thought timestamps, as Cogency writes them), in UTC; None if not one."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return _iso(moment.astimezone(datetime.UTC))  # a naive time is taken as local


def _show_times(facets: dict[str, Any]) -> None:
    """The structured state's own times (never the agent's values) as ISO 8601 UTC,
    in place (``facets`` is a copy): cognitive ``created_at``, ``last_updated`` and
    decision ``timestamp``; tasks' ``created_at`` and ``updated_at``; thoughts'
    ``timestamp``."""
    cognitive = _dict(facets.get("cognitive"))
    _convert(_dict(cognitive.get("crystallized")), "created_at", iso_time)
    _convert(_dict(cognitive.get("fluid")), "last_updated", iso_time)
    for entry in _list(_dict(cognitive.get("insights")).get("decision_log")):
        _convert(_dict(entry), "timestamp", iso_time)
    for task in _dict(_dict(facets.get("tasks")).get("tasks")).values():
        _convert(_dict(task), "created_at", iso_time)
        _convert(_dict(task), "updated_at", iso_time)
    for thought in _list(_dict(_dict(facets.get("agent")).get("reasoning")).get("thoughts")):
        _convert(_dict(thought), "timestamp", _local_iso_as_utc)


def _convert(record: dict[str, Any], key: str, how: Callable[[Any], str | None]) -> None:
    shown = how(record.get(key))
    if shown is not None:
        record[key] = shown


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


__all__ = [
    "Reader",
    "comparable_value",
    "decode_json",
    "decode_langgraph",
    "describe_checkpoint_state",
    "describe_state",
    "iso_time",
    "messages_in",
    "valid_id",
]
