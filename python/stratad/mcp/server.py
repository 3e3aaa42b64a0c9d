"""The MCP server over a running daemon (low-level `mcp.server.Server` of the official SDK).

Tools (stratad.mcp.tools), resources and their change notifications
(stratad.mcp.resources) and the crystal prompt (stratad.mcp.prompts), served
over stdio (`serve_stdio`) or streamable HTTP (`serve_http`).

Who a call acts as never comes from a tool argument:

- stdio, and HTTP without ``--http-auth``: the tenant and token of the server's
  own configuration (flags or STRATAD_TENANT / STRATAD_TOKEN(_FILE));
- HTTP with ``--http-auth bearer``: the request's ``Authorization: Bearer``
  token, passed through to the daemon (whose tenants and roles then apply), and
  the optional ``X-Stratad-Tenant`` header (an admin acting in a tenant). The
  token is checked against the daemon before a request is served (HTTP 401
  otherwise, cached for a minute), and an MCP session can only be used with the
  token that opened it (the SDK binds it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from mcp.server import Server
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    EmptyResult,
    GetPromptRequestParams,
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    PaginatedRequestParams,
    ReadResourceRequestParams,
    ReadResourceResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    UnsubscribeRequestParams,
)
from pydantic import AnyHttpUrl

from stratad import __version__
from stratad.api.v1 import session_pb2
from stratad.errors import StratadError, UnauthenticatedError
from stratad.ids import validate_id
from stratad.mcp import prompts as prompt_module
from stratad.mcp import resources as resource_module
from stratad.mcp.daemon import DaemonLink, Identity
from stratad.mcp.tools import TOOLS, Call, Limits, call_tool, error_result
from stratad.sdk.connection import Connection
from stratad.sdk.constants import AUTHORIZATION_HEADER, BEARER_SCHEME, TENANT_HEADER

log = logging.getLogger("stratad.mcp")

INSTRUCTIONS = """\
stratad keeps this task's state outside your context window, durable across restarts and \
context compaction. At the start of a task, call cognitive_initialize with a session_id you \
will reuse, the goal, constraints and success criteria (and crystal_query to find approaches \
that worked on similar goals). While working, record key decisions \
(cognitive_record_decision), errors and their fixes (cognitive_record_error, \
cognitive_resolve_error), what you learn (cognitive_add_learned_constraint, \
cognitive_add_entity_relationship, cognitive_add_pattern) and progress \
(cognitive_update_progress); save working state with checkpoint_save. After a restart or \
when your context was compacted, call cognitive_build_context with the same session_id and \
continue from what it says. When the task succeeded, call crystal_crystallize."""

#: A token as an HTTP header and gRPC metadata can carry it (RFC 6750 b64token, roughly).
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/=:]{1,4096}")
#: connection.state key of a handshake-era connection's resource watches.
_WATCHES = "stratad.mcp.watches"


@dataclass(frozen=True, slots=True)
class Settings:
    """What `stratad mcp` serves with (built from flags by stratad.mcp.cli)."""

    #: The daemon, and (stdio / HTTP without auth) the tenant and token every call uses.
    connection: Connection
    timeout: float = 30.0
    limits: Limits = field(default_factory=Limits)
    #: HTTP only: "bearer" takes the daemon token from each request's Authorization header.
    http_auth: Literal["none", "bearer"] = "none"


class StratadMcp:
    """The handlers of one MCP server, over one `DaemonLink`."""

    def __init__(self, settings: Settings, link: DaemonLink) -> None:
        self.settings = settings
        self.link = link
        self.base = Identity(settings.connection.tenant, settings.connection.token)
        self.server: Server[Any] = Server(
            "stratad",
            version=__version__,
            title="stratad",
            description="Durable task state for agents: cognitive state, crystals, checkpoints",
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_resource_templates,
            on_read_resource=self.read_resource,
            on_subscribe_resource=self.subscribe,
            on_unsubscribe_resource=self.unsubscribe,
            on_subscriptions_listen=self.listen,
            on_list_prompts=self.list_prompts,
            on_get_prompt=self.get_prompt,
        )
        self._tools = [spec.tool() for spec in TOOLS.values()]

    # -- identity --------------------------------------------------------------------------

    def identity(self, ctx: ServerRequestContext[Any, Any]) -> Identity:
        """Who this request acts as (see the module docstring)."""
        if self.settings.http_auth != "bearer":
            return self.base
        headers = getattr(ctx.request, "headers", None)
        if headers is None:  # not an HTTP request: cannot happen with --http-auth bearer
            raise UnauthenticatedError("no HTTP request credentials", reason="MISSING_CREDENTIALS")
        token = bearer_token(headers.get(AUTHORIZATION_HEADER, ""))
        if token is None:
            raise UnauthenticatedError(
                "the request carries no Authorization: Bearer token", reason="MISSING_CREDENTIALS"
            )
        tenant = headers.get(TENANT_HEADER, "")
        if tenant:
            validate_id(tenant, "tenant")
        return Identity(tenant, token)

    # -- tools -----------------------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=self._tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CallToolResult:
        spec = TOOLS.get(params.name)
        if spec is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {params.name[:100]}")
        try:
            who = self.identity(ctx)
        except StratadError as exc:
            return error_result(exc)
        call = Call(self.link, who, self.settings.limits)
        return await call_tool(spec, params.arguments or {}, call)

    # -- resources -------------------------------------------------------------------------

    async def list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListResourcesResult:
        cursor = params.cursor if params is not None else None
        try:
            found, next_cursor = await resource_module.list_resources(
                self.link, self.identity(ctx), cursor
            )
        except StratadError as exc:
            raise resource_module.mcp_error(exc) from None
        return ListResourcesResult(resources=found, next_cursor=next_cursor)

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListResourceTemplatesResult:
        return ListResourceTemplatesResult(resource_templates=resource_module.templates())

    async def read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: ReadResourceRequestParams
    ) -> ReadResourceResult:
        uri = str(params.uri)
        try:
            who = self.identity(ctx)
            return await resource_module.read_resource(self.link, who, self.settings.limits, uri)
        except StratadError as exc:
            raise resource_module.mcp_error(exc, uri) from None

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        """``resources/subscribe`` (handshake era): watch the URI's session for this connection."""
        uri = str(params.uri)
        try:
            who = self.identity(ctx)
            session_id, version = await resource_module.check_subscribable(self.link, who, uri)
            self._watches(ctx).add(uri, session_id, who, version)
        except StratadError as exc:
            raise resource_module.mcp_error(exc, uri) from None
        return EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        self._watches(ctx).remove(str(params.uri))
        return EmptyResult()

    def _watches(self, ctx: ServerRequestContext[Any, Any]) -> resource_module.Watches:
        """The watches of this request's connection, closed when the connection closes."""
        # The SDK gives handlers the per-request ServerSession, which holds the
        # connection (its `state` and `exit_stack` are the public per-connection hooks).
        connection = getattr(ctx.session, "_connection", None)
        if connection is None:
            raise MCPError(INTERNAL_ERROR, "resource subscriptions are not available here")
        watches = connection.state.get(_WATCHES)
        if watches is None:
            watches = resource_module.Watches(self.link, connection.send_resource_updated)
            connection.state[_WATCHES] = watches
            connection.exit_stack.push_async_callback(watches.close)
        assert isinstance(watches, resource_module.Watches)
        return watches

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        """``subscriptions/listen`` (2026-07-28): resource updates while the stream lasts."""
        try:
            who = self.identity(ctx)
        except StratadError as exc:
            raise resource_module.mcp_error(exc) from None
        uris = params.notifications.resource_subscriptions or []
        try:
            result = await resource_module.serve_listen(
                self.link, who, uris, lambda handler: handler(ctx, params)
            )
        except StratadError as exc:
            raise resource_module.mcp_error(exc) from None
        assert isinstance(result, SubscriptionsListenResult)
        return result

    # -- prompts ---------------------------------------------------------------------------

    async def list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None
    ) -> ListPromptsResult:
        return ListPromptsResult(prompts=prompt_module.prompts())

    async def get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: GetPromptRequestParams
    ) -> GetPromptResult:
        try:
            who = self.identity(ctx)
            return await prompt_module.get_prompt(self.link, who, params.name, params.arguments)
        except StratadError as exc:
            raise resource_module.mcp_error(exc) from None


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if it is one."""
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != BEARER_SCHEME.lower() or not _TOKEN.fullmatch(token):
        return None
    return token


# --- HTTP authentication: tokens checked against the daemon -----------------------------------


class DaemonTokenVerifier:
    """An `mcp.server.auth.provider.TokenVerifier` that asks the daemon.

    A token is good when the daemon accepts it (one ListSessions of a single
    item); UNAUTHENTICATED is a bad token. Any other failure (the daemon is
    unreachable, the token may not list sessions) lets the request through, so
    that its calls report the daemon's own error. Verdicts are cached for
    `ttl` seconds per token digest (at most `max_entries`).
    """

    def __init__(self, link: DaemonLink, ttl: float = 60.0, max_entries: int = 1024) -> None:
        self._link = link
        self._ttl = ttl
        self._max_entries = max_entries
        self._cache: dict[str, tuple[float, bool]] = {}

    async def verify_token(self, token: str) -> AccessToken | None:
        if not _TOKEN.fullmatch(token):
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            good = cached[1]
        else:
            good = await self._ask_daemon(token)
            if len(self._cache) >= self._max_entries:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) >= self._max_entries:
                    self._cache.clear()
            self._cache[digest] = (now + self._ttl, good)
        if not good:
            return None
        # The client ID names the token (never the token itself): the SDK binds an
        # MCP session to the credential that opened it.
        return AccessToken(token=token, client_id=f"token:{digest[:16]}", scopes=[])

    async def _ask_daemon(self, token: str) -> bool:
        try:
            request = session_pb2.ListSessionsRequest(page_size=1)
            await self._link.call(self._link.sessions.ListSessions, request, Identity(token=token))
        except UnauthenticatedError:
            return False
        except StratadError:
            return True
        return True


async def daemon_checks_tokens(link: DaemonLink) -> bool | None:
    """Whether the daemon refuses a made-up token (True), accepts it (False: its auth is
    off), or could not be asked (None)."""
    request = session_pb2.ListSessionsRequest(page_size=1)
    made_up = Identity(token=secrets.token_urlsafe(32))
    try:
        await link.call(link.sessions.ListSessions, request, made_up)
    except UnauthenticatedError:
        return True
    except StratadError as exc:
        log.warning("could not ask the daemon whether it checks tokens: %s", exc)
        return None
    return False


# --- transports ---------------------------------------------------------------------------------


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[StratadMcp]:
    async with DaemonLink(settings.connection, timeout=settings.timeout) as link:
        yield StratadMcp(settings, link)


async def serve_stdio(settings: Settings) -> None:
    """Serve one MCP client on stdin/stdout until it closes them."""
    async with running(settings) as app, stdio_server() as (read_stream, write_stream):
        await app.server.run(read_stream, write_stream, app.server.create_initialization_options())


@dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str
    port: int
    path: str = "/mcp"
    tls_cert: str = ""
    tls_key: str = ""
    log_level: str = "warning"


class StartError(Exception):
    """The HTTP server cannot start as configured (exit code 2)."""


async def serve_http(settings: Settings, http: HttpSettings) -> None:
    """Serve MCP over streamable HTTP until SIGINT or SIGTERM."""
    import uvicorn

    async with running(settings) as app:
        verifier = None
        auth = None
        scheme = "https" if http.tls_cert else "http"
        if settings.http_auth == "bearer":
            checks = await daemon_checks_tokens(app.link)
            if checks is False:
                raise StartError(
                    f"--http-auth bearer passes each request's token to the daemon at "
                    f"{settings.connection.address}, but that daemon accepts any token (its auth "
                    'is off): anyone could call. Start the daemon with auth = "token" (see '
                    "docs/security.md), or serve MCP without --http-auth on loopback"
                )
            verifier = DaemonTokenVerifier(app.link)
            host = f"[{http.host}]" if ":" in http.host else http.host
            # Only bearer checking is used (no OAuth server, no metadata routes); the
            # settings require an issuer, which is this server.
            auth = AuthSettings(
                issuer_url=AnyHttpUrl(f"{scheme}://{host}:{http.port}"), resource_server_url=None
            )
        body_limit = max(4 << 20, settings.limits.max_state_bytes * 4 // 3 + (1 << 20))
        starlette = app.server.streamable_http_app(
            streamable_http_path=http.path,
            max_request_body_size=body_limit,
            host=http.host,
            auth=auth,
            token_verifier=verifier,
        )
        config = uvicorn.Config(
            starlette,
            host=http.host,
            port=http.port,
            log_level=http.log_level,
            ssl_certfile=http.tls_cert or None,
            ssl_keyfile=http.tls_key or None,
            lifespan="on",
            # Open event streams (GET, listen) would hold a SIGTERM up for ever.
            timeout_graceful_shutdown=5,
        )
        server = uvicorn.Server(config)
        announce = asyncio.create_task(_announce(server, scheme, http.path))
        try:
            await server.serve()
        finally:
            announce.cancel()


async def _announce(server: Any, scheme: str, path: str) -> None:
    """One line on stderr with the URL, once the port is bound (port 0 picks one)."""
    while not server.started:
        await asyncio.sleep(0.05)
    for listener in server.servers:
        for sock in listener.sockets:
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            print(f"stratad mcp: serving MCP at {scheme}://{shown}:{port}{path}", file=sys.stderr)
            sys.stderr.flush()
            return


def run_stdio(settings: Settings) -> None:
    anyio.run(serve_stdio, settings)


def run_http(settings: Settings, http: HttpSettings) -> None:
    anyio.run(serve_http, settings, http)


__all__ = [
    "INSTRUCTIONS",
    "DaemonTokenVerifier",
    "HttpSettings",
    "Settings",
    "StartError",
    "StratadMcp",
    "bearer_token",
    "run_http",
    "run_stdio",
    "serve_http",
    "serve_stdio",
]
