"""The MCP resources: a session's persistent context, cognitive state, open errors,
checkpoint list and a checkpoint's state, under ``stratad://sessions/...`` URIs,
and their change notifications (WatchSession behind them).

Change notifications come in the protocol's two forms:

- handshake-era connections (protocol 2025-11-25 and before) send
  ``resources/subscribe`` for a URI and receive ``notifications/resources/updated``
  on the connection; the watches live as long as the connection (or until
  ``resources/unsubscribe``);
- 2026-07-28 connections open a ``subscriptions/listen`` stream naming the URIs;
  the watches live as long as that stream.

Either way one WatchSession per session (and caller) runs while someone listens,
with the caller's own credentials, and every event of the session marks each
of its subscribed resources as updated: the client reads them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    BlobResourceContents,
    ReadResourceResult,
    Resource,
    ResourceTemplate,
    TextResourceContents,
)

from stratad.api.v1 import checkpoint_pb2, cognitive_pb2, session_pb2
from stratad.errors import InvalidArgumentError, ResourceExhaustedError, StratadError
from stratad.ids import validate_id
from stratad.mcp.daemon import DaemonLink, Identity, log
from stratad.mcp.tools.base import Limits
from stratad.mcp.tools.checkpoints import list_checkpoints
from stratad.mcp.tools.convert import check_state_size, cognitive_state, decode_state, error_entry

PREFIX = "stratad://sessions/"
#: How many checkpoints the checkpoint-list resource shows (newest first).
CHECKPOINT_LIST_LIMIT = 100
#: Sessions per resources/list page (each gives four resources).
SESSIONS_PER_PAGE = 25
#: Resources one connection (handshake era) or one listen stream may subscribe to.
MAX_SUBSCRIPTIONS = 256


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    template: str
    title: str
    description: str
    mime_type: str | None


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "context",
            PREFIX + "{session_id}/context{?max_tokens}",
            "Persistent context",
            "The task's persistent context as markdown: goal, constraints, success criteria, "
            "progress, current focus, key decisions, unresolved errors and what was learned, "
            "cut to max_tokens (default 2000, estimated as characters / 4).",
            "text/markdown",
        ),
        Kind(
            "cognitive-state",
            PREFIX + "{session_id}/cognitive-state",
            "Cognitive state",
            "The session's three cognitive layers as JSON: crystallized (goal, constraints, "
            "success criteria), fluid (progress, focus, sub-goals, entities, questions) and "
            "insights (decisions, error journal, learned constraints, relationships, patterns).",
            "application/json",
        ),
        Kind(
            "open-errors",
            PREFIX + "{session_id}/open-errors",
            "Open errors",
            "The errors recorded in the session and not resolved yet, as JSON.",
            "application/json",
        ),
        Kind(
            "checkpoints",
            PREFIX + "{session_id}/checkpoints",
            "Checkpoints",
            f"The session's checkpoints, newest first (at most {CHECKPOINT_LIST_LIMIT}), as JSON.",
            "application/json",
        ),
        Kind(
            "checkpoint",
            PREFIX + "{session_id}/checkpoints/{checkpoint_id}",
            "Checkpoint state",
            "The state saved in a checkpoint: JSON states as JSON text, text states as text, "
            "anything else as base64 bytes with the state's content type.",
            None,
        ),
    )
}

_URI = re.compile(
    r"stratad://sessions/(?P<session>[^/?#]+)/"
    r"(?P<kind>context|cognitive-state|open-errors|checkpoints)(?:/(?P<checkpoint>[^/?#]+))?"
    r"(?:\?(?P<query>[^#]*))?"
)


@dataclass(frozen=True, slots=True)
class Target:
    """What a resource URI names."""

    kind: str
    session_id: str
    checkpoint_id: str = ""
    max_tokens: int = 2000


def parse_uri(uri: str) -> Target:
    """The resource a URI names; INVALID_ARGUMENT (reason INVALID_URI or INVALID_ID) if none."""
    match = _URI.fullmatch(uri)
    if match is None:
        raise InvalidArgumentError(
            f"unknown resource URI {uri[:200]!r}: expected {PREFIX}SESSION_ID/ followed by "
            "context, cognitive-state, open-errors, checkpoints or checkpoints/CHECKPOINT_ID",
            reason="INVALID_URI",
        )
    session_id = validate_id(unquote(match["session"]), "session_id")
    kind = match["kind"]
    checkpoint_id = ""
    if match["checkpoint"] is not None:
        if kind != "checkpoints":
            raise InvalidArgumentError(f"unknown resource URI {uri[:200]!r}", reason="INVALID_URI")
        kind = "checkpoint"
        checkpoint_id = validate_id(unquote(match["checkpoint"]), "checkpoint_id")
    max_tokens = 2000
    query = parse_qs(match["query"] or "", keep_blank_values=True)
    if query:
        if kind != "context" or set(query) != {"max_tokens"} or len(query["max_tokens"]) != 1:
            raise InvalidArgumentError(
                f"unknown query in resource URI {uri[:200]!r} (only the context takes "
                "?max_tokens=N)",
                reason="INVALID_URI",
            )
        text = query["max_tokens"][0]
        if not text.isdigit() or not 1 <= int(text) <= 1_048_576:
            raise InvalidArgumentError(
                "max_tokens must be a whole number from 1 to 1048576", reason="INVALID_URI"
            )
        max_tokens = int(text)
    return Target(kind, session_id, checkpoint_id, max_tokens)


def uri_of(kind: str, session_id: str, checkpoint_id: str = "") -> str:
    if kind == "checkpoint":
        return f"{PREFIX}{session_id}/checkpoints/{checkpoint_id}"
    return f"{PREFIX}{session_id}/{kind}"


def templates() -> list[ResourceTemplate]:
    return [
        ResourceTemplate(
            name=k.name,
            title=k.title,
            uri_template=k.template,
            description=k.description,
            mime_type=k.mime_type,
        )
        for k in KINDS.values()
    ]


def mcp_error(exc: StratadError, uri: str = "") -> MCPError:
    """A stratad error as a JSON-RPC error (resources and prompts have no error results)."""
    bad_request = exc.grpc_status in (
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "FAILED_PRECONDITION",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "RESOURCE_EXHAUSTED",
    )
    data: dict[str, Any] = {
        "code": exc.grpc_status,
        "reason": exc.reason,
        "metadata": exc.metadata,
    }
    if uri:
        data["uri"] = uri
    head = f"{exc.grpc_status} {exc.reason}" if exc.reason != exc.grpc_status else exc.grpc_status
    return MCPError(
        INVALID_PARAMS if bad_request else INTERNAL_ERROR, f"{head}: {exc.message}", data
    )


async def list_resources(
    link: DaemonLink, who: Identity, cursor: str | None
) -> tuple[list[Resource], str | None]:
    """The four resources of each session of the caller's tenant, a page of sessions at a time."""
    request = session_pb2.ListSessionsRequest(page_size=SESSIONS_PER_PAGE, page_token=cursor or "")
    page = await link.call(link.sessions.ListSessions, request, who)
    resources = []
    for session in page.sessions:
        sid = session.session_id
        for kind in ("context", "cognitive-state", "open-errors", "checkpoints"):
            k = KINDS[kind]
            resources.append(
                Resource(
                    uri=uri_of(kind, sid),
                    name=f"{sid} {kind}",
                    title=f"{k.title} of {sid}",
                    description=k.description,
                    mime_type=k.mime_type,
                )
            )
    return resources, page.next_page_token or None


async def read_resource(
    link: DaemonLink, who: Identity, limits: Limits, uri: str
) -> ReadResourceResult:
    target = parse_uri(uri)
    sid = target.session_id
    if target.kind == "context":
        request = cognitive_pb2.BuildContextRequest(session_id=sid, max_tokens=target.max_tokens)
        built = await link.call(link.cognitive.BuildContext, request, who)
        return _text(uri, built.context, "text/markdown")
    if target.kind in ("cognitive-state", "open-errors"):
        get = cognitive_pb2.GetCognitiveStateRequest(session_id=sid)
        response = await link.call(link.cognitive.GetCognitiveState, get, who)
        if target.kind == "cognitive-state":
            document = {"session_id": sid, **cognitive_state(response.state, response.version)}
        else:
            open_errors = [
                error_entry(e)
                for e in response.state.insights.error_journal
                if e.status == cognitive_pb2.ERROR_STATUS_OPEN
            ]
            document = {"session_id": sid, "open_errors": open_errors, "version": response.version}
        return _json(uri, document)
    if target.kind == "checkpoints":
        found, more = await list_checkpoints(link, who, sid, CHECKPOINT_LIST_LIMIT)
        return _json(uri, {"session_id": sid, "checkpoints": found, "more": more})
    load = checkpoint_pb2.LoadStateRequest(session_id=sid, checkpoint_id=target.checkpoint_id)
    state = await link.call(link.checkpoints.LoadState, load, who)
    check_state_size(len(state.data), limits)
    key, value = decode_state(state.data, state.content_type)
    if key == "state":
        return _text(uri, json.dumps(value, ensure_ascii=False), "application/json")
    if key == "state_text":
        return _text(uri, value, state.content_type)
    blob = BlobResourceContents(
        uri=uri, blob=value, mime_type=state.content_type or "application/octet-stream"
    )
    return ReadResourceResult(contents=[blob])


def _text(uri: str, text: str, mime_type: str) -> ReadResourceResult:
    return ReadResourceResult(
        contents=[TextResourceContents(uri=uri, text=text, mime_type=mime_type)]
    )


def _json(uri: str, document: dict[str, Any]) -> ReadResourceResult:
    return _text(uri, json.dumps(document, ensure_ascii=False, indent=2), "application/json")


# --- change notifications -----------------------------------------------------------------------

Notify = Callable[[str], Awaitable[None]]


class Watches:
    """WatchSessions that turn a session's events into resource-updated notifications.

    One watch per (caller, session) while at least one of the session's URIs is
    subscribed; `close` ends them all.
    """

    def __init__(self, link: DaemonLink, notify: Notify) -> None:
        self._link = link
        self._notify = notify
        self._uris: dict[tuple[tuple[str, str], str], set[str]] = {}
        self._tasks: dict[tuple[tuple[str, str], str], asyncio.Task[None]] = {}

    @property
    def uris(self) -> set[str]:
        return {uri for uris in self._uris.values() for uri in uris}

    def add(self, uri: str, session_id: str, who: Identity, after: int) -> None:
        """Notify ``uri`` of every event of the session after version ``after``."""
        if uri not in self.uris and len(self.uris) >= MAX_SUBSCRIPTIONS:
            raise ResourceExhaustedError(
                f"at most {MAX_SUBSCRIPTIONS} resources can be subscribed to at once",
                reason="TOO_MANY_SUBSCRIPTIONS",
            )
        key = (who.key, session_id)
        self._uris.setdefault(key, set()).add(uri)
        if key not in self._tasks:
            self._tasks[key] = asyncio.create_task(self._run(key, session_id, who, after))

    def remove(self, uri: str) -> None:
        for key, uris in list(self._uris.items()):
            uris.discard(uri)
            if not uris:
                del self._uris[key]
                task = self._tasks.pop(key, None)
                if task is not None:
                    task.cancel()

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._uris.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(
        self, key: tuple[tuple[str, str], str], session_id: str, who: Identity, after: int
    ) -> None:
        try:
            async for _event in self._link.watch(session_id, who, after):
                for uri in sorted(self._uris.get(key, ())):
                    await self._notify(uri)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the watch of session %r for resource updates failed", session_id)
        finally:
            if self._tasks.get(key) is asyncio.current_task():
                del self._tasks[key]


async def check_subscribable(link: DaemonLink, who: Identity, uri: str) -> tuple[str, int]:
    """The session a subscription's URI names and its version now, after checking that
    the caller can see it: the watch starts from that version, so every change made
    after the subscription was answered is notified."""
    target = parse_uri(uri)
    request = session_pb2.GetSessionRequest(session_id=target.session_id)
    session = (await link.call(link.sessions.GetSession, request, who)).session
    return target.session_id, session.version


async def serve_listen(
    link: DaemonLink,
    who: Identity,
    uris: Iterable[str],
    serve: Callable[[ListenHandler], Awaitable[Any]],
) -> Any:
    """A ``subscriptions/listen`` stream (2026-07-28): its own bus, fed by watches of the
    sessions its URIs name, for as long as the stream lasts. URIs that name no
    session (or one the caller cannot see) are honored and never fire, as the
    protocol says of unknown URIs."""
    bus = InMemorySubscriptionBus()

    async def notify(uri: str) -> None:
        await bus.publish(ResourceUpdated(uri=uri))

    uris = list(uris)
    if len(uris) > MAX_SUBSCRIPTIONS:
        raise ResourceExhaustedError(
            f"at most {MAX_SUBSCRIPTIONS} resources can be subscribed to at once",
            reason="TOO_MANY_SUBSCRIPTIONS",
        )
    watches = Watches(link, notify)
    try:
        for uri in uris:
            try:
                session_id, version = await check_subscribable(link, who, uri)
            except StratadError:
                continue
            watches.add(uri, session_id, who, version)
        # The handler subscribes to the bus before its first await (the ack), so
        # before any watch can publish: nothing after these versions is missed.
        return await serve(ListenHandler(bus))
    finally:
        await watches.close()


__all__ = [
    "KINDS",
    "PREFIX",
    "Target",
    "Watches",
    "check_subscribable",
    "list_resources",
    "mcp_error",
    "parse_uri",
    "read_resource",
    "serve_listen",
    "templates",
    "uri_of",
]
