"""The inspector's HTTP face: routes, the admin-token check, security headers, static files.

Routes (all GET; every ``{id}`` is checked against the ID rules, so ``..`` or
an encoded ``/`` is a 400 and never reaches the store):

    /                                                the page (static/index.html)
    /static/app.js, /static/style.css                its script and style
    /api/tenants                                     tenants, session and crystal counts
    /api/tenants/{t}/sessions?q=TEXT                 sessions, searched by ID or label
    /api/tenants/{t}/sessions/{s}                    a session, its checkpoints and forks
    /api/tenants/{t}/sessions/{s}/checkpoints/{c}    a checkpoint and its decoded state
    /api/tenants/{t}/sessions/{s}/diff?a=C1&b=C2     JSON diff of two checkpoints' states
    /api/tenants/{t}/sessions/{s}/structured         cognitive state, tasks, agent state
    /api/tenants/{t}/crystals                        crystals (scores) and library stats

Errors are JSON: ``{"error": {"status", "reason", "message"}}`` with the
reasons gRPC calls use (docs/errors.md).

With ``auth`` on, every /api request needs ``Authorization: Bearer <token>``
of an identity with role ``admin`` in ``auth_tokens_file``: the inspector
shows every tenant's data. The page and its script carry no data and are
served to anyone; the page asks for the token and keeps it in the tab's
sessionStorage. Every /api request is written to the audit log.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from http import HTTPStatus
from importlib import resources as package_files
from typing import TYPE_CHECKING, Any, Final

from stratad.errors import (
    InternalError,
    NotFoundError,
    PermissionDeniedError,
    StratadError,
    UnauthenticatedError,
)
from stratad.server.auth import IdentitiesFile, Identity, audit_log, token_digest
from stratad.server.inspector.http import HttpServer, Request, Response
from stratad.server.inspector.reader import Reader

if TYPE_CHECKING:
    from stratad.server.resources import Resources

_log = logging.getLogger(__name__)

#: Every response: no script, style or connection but our own; no framing, no
#: sniffing, no referrer (URLs hold tenant and session IDs), nothing cached.
SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}

#: URL path -> (file in stratad/server/inspector/static, content type). Nothing else is served.
STATIC_FILES: Final[Mapping[str, tuple[str, str]]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}

_HTTP_STATUS: Final[Mapping[str, int]] = {
    "INVALID_ARGUMENT": HTTPStatus.BAD_REQUEST,
    "NOT_FOUND": HTTPStatus.NOT_FOUND,
    "UNAUTHENTICATED": HTTPStatus.UNAUTHORIZED,
    "PERMISSION_DENIED": HTTPStatus.FORBIDDEN,
    "FAILED_PRECONDITION": HTTPStatus.CONFLICT,
    "RESOURCE_EXHAUSTED": HTTPStatus.TOO_MANY_REQUESTS,
    "UNAVAILABLE": HTTPStatus.SERVICE_UNAVAILABLE,
    "DEADLINE_EXCEEDED": HTTPStatus.GATEWAY_TIMEOUT,
}


def load_static() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the installed package."""
    folder = package_files.files("stratad.server.inspector") / "static"
    return {
        path: ((folder / name).read_bytes(), content_type)
        for path, (name, content_type) in STATIC_FILES.items()
    }


class AdminTokens:
    """Who may use the inspector when auth is on: bearer tokens of role admin."""

    def __init__(self, identities: IdentitiesFile) -> None:
        self._identities = identities

    def identify(self, authorization: str | None) -> Identity:
        if not authorization:
            raise UnauthenticatedError(
                "the inspector needs 'Authorization: Bearer <token>' of an admin identity",
                reason="MISSING_CREDENTIALS",
            )
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthenticatedError(
                "authorization must be 'Bearer <token>'", reason="INVALID_TOKEN"
            )
        identity = self._identities.current().tokens.get(token_digest(token.strip()))
        if identity is None:
            raise UnauthenticatedError("the bearer token is not valid", reason="INVALID_TOKEN")
        if identity.role != "admin":
            raise PermissionDeniedError(
                f"{identity.name} has role {identity.role}: the inspector shows every "
                "tenant's data and needs role admin",
                reason="ADMIN_ROLE_REQUIRED",
            )
        return identity


Route = Callable[[Request, tuple[str, ...]], dict[str, Any]]


class Inspector:
    """The read-only web inspector over a daemon's resources."""

    def __init__(self, resources: Resources) -> None:
        config = resources.config
        self._resources = resources
        self._reader = Reader(resources.engine)
        self._static = load_static()
        self._tokens = (
            AdminTokens(IdentitiesFile(config.auth_tokens_file)) if config.auth != "off" else None
        )
        self._listen_host = config.inspector_listen.rpartition(":")[0]
        self._http = HttpServer(self.handle, SECURITY_HEADERS)

    @property
    def address(self) -> str:
        return self._http.address

    async def start(self, listen: str) -> str:
        return await self._http.start(listen)

    async def stop(self) -> None:
        await self._http.stop()

    async def handle(self, request: Request) -> Response:
        try:
            self._check_host(request)
            static = self._static.get(request.path)
            if static is not None:
                body, content_type = static
                return Response(HTTPStatus.OK, body, content_type)
            if request.segments[:1] != ("api",):
                raise NotFoundError(f"no page at {request.path[:200]}")
            return await self._api(request)
        except StratadError as exc:
            return error_response(exc)
        except Exception:
            # A bug: the traceback goes to the log under an id the answer repeats.
            incident = uuid.uuid4().hex[:12]
            _log.exception(
                "inspector: unhandled error in GET %s (incident %s)", request.path[:300], incident
            )
            return error_response(InternalError(f"internal error (incident {incident})"))

    def _check_host(self, request: Request) -> None:
        """Refuse a Host that is not an IP address, localhost or the configured host.

        A web page the user opens elsewhere could otherwise point a DNS name it
        controls at 127.0.0.1 (DNS rebinding) and read the inspector as its own
        origin.
        """
        host = request.headers.get("host", "")
        name = host.rpartition(":")[0] if host.rpartition(":")[2].isdigit() else host
        name = name.strip().lower()
        if name in ("localhost", self._listen_host.lower()) or _is_ip(name):
            return
        raise PermissionDeniedError(
            f"Host {host[:100]!r} is not this inspector's address: open it by IP address "
            "or as localhost",
            reason="PERMISSION_DENIED",
        )

    async def _api(self, request: Request) -> Response:
        identity = self._authenticate(request)
        route, args = self._route(request.segments[1:])
        try:
            result = await self._run(route, request, args)
        except StratadError as exc:
            self._audit(request, identity, exc.grpc_status, exc.reason)
            raise
        self._audit(request, identity, "OK", "")
        # ASCII: a JSON state may hold a lone surrogate (an escaped \ud800), which UTF-8
        # cannot encode; escaped, it reaches the browser's JSON.parse intact.
        body = json.dumps(result, separators=(",", ":")).encode("ascii")
        return Response(HTTPStatus.OK, body, "application/json")

    def _authenticate(self, request: Request) -> Identity | None:
        if self._tokens is None:
            return None
        try:
            return self._tokens.identify(request.headers.get("authorization"))
        except StratadError as exc:
            self._audit(request, None, exc.grpc_status, exc.reason, event="auth_failure")
            raise

    def _route(self, parts: tuple[str, ...]) -> tuple[Route, tuple[str, ...]]:
        """The reader call for an /api path (after "api") and its path arguments."""
        reader = self._reader
        match parts:
            case ("tenants",):
                return (lambda r, a: reader.tenants()), ()
            case ("tenants", t, "sessions"):
                return (lambda r, a: reader.sessions(a[0], r.query.get("q", ""))), (t,)
            case ("tenants", t, "sessions", s):
                return (lambda r, a: reader.session(*a)), (t, s)
            case ("tenants", t, "sessions", s, "checkpoints", c):
                return (lambda r, a: reader.checkpoint(*a)), (t, s, c)
            case ("tenants", t, "sessions", s, "diff"):
                return (
                    lambda r, a: reader.diff(a[0], a[1], r.query.get("a", ""), r.query.get("b", ""))
                ), (t, s)
            case ("tenants", t, "sessions", s, "structured"):
                return (lambda r, a: reader.structured(*a)), (t, s)
            case ("tenants", t, "crystals"):
                return (lambda r, a: reader.crystals(*a)), (t,)
        raise NotFoundError("no such inspector API path")

    async def _run(self, route: Route, request: Request, args: tuple[str, ...]) -> dict[str, Any]:
        """Run a read on the worker pool, as servicers run blocking domain work."""
        fail_stop = self._resources.engine.store.fail_stop
        fail_stop.check()
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(
            self._resources.executor, functools.partial(route, request, args)
        )
        fail_stop.check()  # a read that raced a failed fsync may hold what the disk lost
        return result

    def _audit(
        self,
        request: Request,
        identity: Identity | None,
        code: str,
        reason: str,
        *,
        event: str = "inspector_call",
    ) -> None:
        fields = {
            "event": event,
            "identity": identity.name if identity else "",
            "role": identity.role if identity else "",
            "tenant": _tenant_in(request),
            "rpc": f"inspector GET {request.path[:300]}",
            "code": code,
            "reason": reason,
            "peer": request.peer,
        }
        level = logging.WARNING if event == "auth_failure" else logging.INFO
        audit_log.log(level, json.dumps(fields, sort_keys=True), extra={"audit": fields})


def _tenant_in(request: Request) -> str:
    """The tenant an /api/tenants/{t}/... path names (as given, cut short), or ""."""
    parts = request.segments
    return parts[2][:128] if parts[1:2] == ("tenants",) and len(parts) > 2 else ""


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def error_response(exc: StratadError) -> Response:
    status = _HTTP_STATUS.get(exc.grpc_status, HTTPStatus.INTERNAL_SERVER_ERROR)
    payload = {"error": {"status": exc.grpc_status, "reason": exc.reason, "message": exc.message}}
    response = Response(status, json.dumps(payload).encode(), "application/json")
    if status == HTTPStatus.UNAUTHORIZED:
        response.headers["WWW-Authenticate"] = 'Bearer realm="stratad inspector"'
    return response


async def start_inspector(resources: Resources) -> Inspector:
    """Start the inspector on ``inspector_listen``; raises HttpStartError if it cannot."""
    config = resources.config
    inspector = Inspector(resources)
    await inspector.start(config.inspector_listen)
    _log.info("web inspector on http://%s/", inspector.address)
    if config.inspector_exposed:  # config refuses this unless allow_insecure is set
        _log.warning(
            "serving the web inspector over plain HTTP on %s (allow_insecure = true): every "
            "tenant's data%s crosses the network unencrypted; see docs/inspector.md",
            inspector.address,
            " and the admin token"
            if config.auth != "off"
            else ", readable by anyone who reaches it,",
        )
    return inspector


__all__ = ["SECURITY_HEADERS", "AdminTokens", "Inspector", "error_response", "start_inspector"]
