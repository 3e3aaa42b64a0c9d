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
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from stratad.domain.crystals import Crystal
from stratad.domain.ids import validate_id
from stratad.domain.models import Checkpoint
from stratad.domain.sessions import LiveSession
from stratad.errors import DataLossError, InvalidArgumentError, NotFoundError
from stratad.inspector import jsondiff

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
            "sessions": matching[:MAX_SESSIONS_LISTED],
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

        out = _locked(live, read)
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
        return sorted(forks, key=lambda f: (f["created_at"], f["session_id"]))

    def _live(self, tenant: str, session_id: str) -> LiveSession:
        tenant = self._tenant(tenant)
        valid_id(session_id, "session_id")
        live = self._sessions.loaded(tenant, session_id)
        if live is None:
            raise NotFoundError(f"session {session_id!r} not found", reason="SESSION_NOT_FOUND")
        return live

    # -- checkpoints ---------------------------------------------------------------------

    def checkpoint(self, tenant: str, session_id: str, checkpoint_id: str) -> dict[str, Any]:
        """One checkpoint and its state: JSON when it is JSON, else text or a hex summary."""
        live = self._live(tenant, session_id)
        cp = self._find_checkpoint(live, checkpoint_id)
        return {
            "tenant": tenant,
            "session_id": session_id,
            "checkpoint": _checkpoint(cp),
            "state": describe_state(self._read_state(live, cp), cp.size),
        }

    def diff(self, tenant: str, session_id: str, a: str, b: str) -> dict[str, Any]:
        """What changed from checkpoint ``a`` to checkpoint ``b`` (both of the session)."""
        live = self._live(tenant, session_id)
        cp_a = self._find_checkpoint(live, a)
        cp_b = self._find_checkpoint(live, b)
        values = [decode_json(self._read_state(live, cp)) for cp in (cp_a, cp_b)]
        out: dict[str, Any] = {
            "tenant": tenant,
            "session_id": session_id,
            "a": _checkpoint(cp_a),
            "b": _checkpoint(cp_b),
            "identical": cp_a.digest == cp_b.digest,
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
            "crystals": [dataclasses.asdict(c) for c in crystals[:MAX_CRYSTALS_LISTED]],
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


__all__ = ["Reader", "decode_json", "describe_state", "valid_id"]
