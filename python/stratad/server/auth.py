"""Authentication, authorization and the audit log of gRPC calls.

`AuthInterceptor` is installed after `ErrorInterceptor`, so refusing a call
is raising `UnauthenticatedError` or `PermissionDeniedError`: the error
interceptor turns it into the status with its ErrorInfo reason.

With ``auth`` on, a call's identity comes from its credential: a bearer
token (``authorization: Bearer <token>`` metadata, looked up by its SHA-256
digest) or the name in its verified client certificate (a subject
alternative name, else the subject CN). The identities file maps both to a
tenant and a role. The call then acts in the identity's tenant: an
``x-stratad-tenant`` header naming another is PERMISSION_DENIED, except for
the ``admin`` role, which may act in any tenant and alone may call
AdminService. The tenant so settled reaches servicers through `tenant_of`
(servicers/base.py), which reads `authenticated_tenant`.

Health is open to everyone (probes carry no credentials). With ``auth``
off, nothing is checked and the tenant is the one the header names.

Every AdminService call (with auth on or off) and every refusal writes one
JSON line to the ``stratad.audit`` logger: event, identity, role, tenant,
RPC, result code, reason and peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import inspect
import json
import logging
import os
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2

from stratad.config import AuthMode, ConfigError
from stratad.errors import PermissionDeniedError, StratadError, UnauthenticatedError
from stratad.ids import validate_id
from stratad.server.front import peer_of
from stratad.server.interceptors import HandlerCache, settle_tenant

_log = logging.getLogger(__name__)
audit_log = logging.getLogger("stratad.audit")

TENANT_METADATA_KEY: Final = "x-stratad-tenant"
AUTHORIZATION_METADATA_KEY: Final = "authorization"
DEFAULT_TENANT: Final = "default"
ADMIN_SERVICE: Final = "stratad.api.v1.AdminService"
HEALTH_SERVICE: Final = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

Role = Literal["agent", "admin"]
ROLES: Final = ("agent", "admin")

Behavior = Callable[[Any, Any], Any]
Continuation = Callable[[Any], Awaitable[Any]]

#: The tenant authentication settled for the call being served (None: auth off).
_authenticated_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "stratad_authenticated_tenant", default=None
)


def authenticated_tenant() -> str | None:
    """The tenant of the current call's credential, or None when auth is off."""
    return _authenticated_tenant.get()


def requested_tenant(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The tenant the ``x-stratad-tenant`` metadata names (validated), or None."""
    for key, value in metadata or ():
        if key == TENANT_METADATA_KEY:
            return validate_id(str(value), "tenant")
    return None


def token_digest(token: str) -> str:
    """What the identities file stores for a token: the lowercase hex SHA-256 of its UTF-8."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# --- identities ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a credential stands for. ``name`` is what the audit log shows."""

    name: str
    tenant: str
    role: Role


ANONYMOUS: Final = Identity("anonymous", DEFAULT_TENANT, "admin")


@dataclass(frozen=True, slots=True)
class Identities:
    """The identities file: token digests and certificate names to identities."""

    tokens: Mapping[str, Identity]
    clients: Mapping[str, Identity]


_SECTIONS: Final = ("tokens", "clients")
_ENTRY_KEYS: Final = ("tenant", "role", "name")


def parse_identities(document: Mapping[str, Any], source: str) -> Identities:
    """Check and convert a parsed identities file; raises ConfigError naming the entry."""
    unknown = sorted(set(document) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"{source}: unknown section {unknown[0]!r} (expected tokens, clients)")
    tokens = {
        _digest_key(key, source): _identity(entry, f"token:{key[:8].lower()}", source)
        for key, entry in _section(document, "tokens", source).items()
    }
    clients = {
        key: _identity(entry, f"cert:{key}", source)
        for key, entry in _section(document, "clients", source).items()
    }
    return Identities(tokens, clients)


def _section(document: Mapping[str, Any], name: str, source: str) -> Mapping[str, Any]:
    section = document.get(name, {})
    if not isinstance(section, Mapping):
        raise ConfigError(f"{source}: {name} must be a table")
    return section


def _digest_key(key: str, source: str) -> str:
    digest = key.strip().lower()
    if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
        raise ConfigError(
            f"{source}: tokens key {key[:16]!r}... is not a SHA-256 hex digest; store "
            "`stratad ctl token hash` of a token, never the token itself"
        )
    return digest


def _identity(entry: Any, default_name: str, source: str) -> Identity:
    where = f"{source}: {default_name}"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a table with tenant and role")
    unknown = sorted(set(entry) - set(_ENTRY_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (expected tenant, role, name)")
    role = entry.get("role")
    if role not in ROLES:
        raise ConfigError(f"{where}: role must be agent or admin, got {role!r}")
    tenant = entry.get("tenant", DEFAULT_TENANT)
    try:
        tenant = validate_id(tenant, "tenant") if isinstance(tenant, str) else None
    except StratadError as exc:
        raise ConfigError(f"{where}: {exc.message}") from None
    if tenant is None:
        raise ConfigError(f"{where}: tenant must be a string")
    name = entry.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: name must be a non-empty string")
    return Identity(name, tenant, role)


def load_identities(path: Path) -> Identities:
    """Read an identities file: JSON if its name ends in .json, else TOML."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read auth_tokens_file {path}: {exc.strerror}") from None
    try:
        if path.suffix.lower() == ".json":
            document = json.loads(raw)
        else:
            document = tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSON, TOML and UTF-8 errors
        raise ConfigError(f"auth_tokens_file {path} cannot be parsed: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"auth_tokens_file {path}: expected an object of tokens and clients")
    return parse_identities(document, f"auth_tokens_file {path}")


class IdentitiesFile:
    """The identities file, re-read when it changes.

    Checked on every call: a stat costs microseconds and makes a revoked
    token stop working at once. A new version that does not load is logged
    and the previous one kept: a typo must neither lock everyone out nor
    let anyone in.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._signature = self._stat()
        self._identities = load_identities(self.path)  # at start-up, errors stop the daemon
        self._failed_signature: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self) -> Identities:
        signature = self._stat()
        if signature != self._signature and signature != self._failed_signature:
            self._reload(signature)
        return self._identities

    def _reload(self, signature: tuple[int, int, int] | None) -> None:
        try:
            identities = load_identities(self.path)
        except ConfigError as exc:
            self._failed_signature = signature  # log once per bad version
            _log.error("keeping the previous identities: %s", exc.message)
            return
        self._identities, self._signature = identities, signature
        _log.info("reloaded identities from %s", self.path)


# --- the audit log ------------------------------------------------------------------------


def _audit(
    event: str,
    *,
    method: str,
    code: str,
    context: Any,
    identity: Identity | None = None,
    tenant: str = "",
    reason: str = "",
) -> None:
    fields = {
        "event": event,
        "identity": identity.name if identity else "",
        "role": identity.role if identity else "",
        "tenant": tenant,
        "rpc": method,
        "code": code,
        "reason": reason,
        "peer": _peer(context),
    }
    level = logging.WARNING if event == "auth_failure" else logging.INFO
    audit_log.log(level, json.dumps(fields, sort_keys=True), extra={"audit": fields})


def _peer(context: Any) -> str:
    return peer_of(context)


def _code_of(context: Any, exc: BaseException | None) -> str:
    """The status code name a call ends with (as ErrorInterceptor will make it)."""
    if exc is None:
        return "OK"
    if isinstance(exc, StratadError):
        return exc.grpc_status
    if isinstance(exc, grpc.aio.AbortError):
        code = context.code()
        return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED"
    if type(exc) is NotImplementedError:
        return "UNIMPLEMENTED"
    return "INTERNAL"


# --- the interceptor --------------------------------------------------------------------


class _Call:
    """One authorized call: undoes its tenant and writes its audit line when it ends."""

    def __init__(
        self, method: str, identity: Identity, tenant: str, audited: bool, settle: bool
    ) -> None:
        self.method, self.identity, self.tenant, self.audited = method, identity, tenant, audited
        self._token = _authenticated_tenant.set(tenant) if settle else None
        if settle:
            settle_tenant(tenant)  # for the request log and the per-tenant metrics

    def finish(self, context: Any, exc: BaseException | None) -> None:
        if self._token is not None:
            # ValueError: an async generator finalized in another context.
            with contextlib.suppress(ValueError):
                _authenticated_tenant.reset(self._token)
        if self.audited:
            code = _code_of(context, exc)
            _audit(
                "admin_call",
                method=self.method,
                code=code,
                context=context,
                identity=self.identity,
                tenant=self.tenant,
            )


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticate and authorize every call but health checks; audit admin calls."""

    #: What intercept_service returns depends on the method alone (HandlerCache).
    per_method = True

    def __init__(self, mode: AuthMode, identities: IdentitiesFile | None) -> None:
        if mode != "off" and identities is None:
            raise ValueError(f"auth = {mode!r} needs an identities file")
        self._mode = mode
        self._identities = identities
        # Every check happens when the call runs (`_enter`, with its context):
        # the guarded handler depends only on the method, so it is built once.
        self._handlers = HandlerCache(self._guarded)

    async def intercept_service(self, continuation: Continuation, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self._handlers.wrapped(handler, str(handler_call_details.method))

    def _guarded(self, handler: Any, method: str) -> Any:
        service = method.lstrip("/").rpartition("/")[0]
        admin = service == ADMIN_SERVICE
        if service == HEALTH_SERVICE or (self._mode == "off" and not admin):
            return handler  # nothing to check or record

        def enter(context: Any) -> _Call:
            return self._enter(context, method, admin)

        return _guard_handler(handler, enter)

    def _enter(self, context: Any, method: str, admin: bool) -> _Call:
        metadata = tuple(context.invocation_metadata() or ())
        if self._mode == "off":
            tenant = requested_tenant(metadata) or DEFAULT_TENANT
            return _Call(method, ANONYMOUS, tenant, audited=admin, settle=False)
        identity = self._authenticate(context, metadata, method)
        tenant = self._authorize(context, metadata, method, identity, admin)
        return _Call(method, identity, tenant, audited=admin, settle=True)

    def _authenticate(
        self, context: Any, metadata: Sequence[tuple[str, Any]], method: str
    ) -> Identity:
        try:
            return self._identify(context, metadata)
        except UnauthenticatedError as exc:
            _audit(
                "auth_failure",
                method=method,
                code=exc.grpc_status,
                context=context,
                reason=exc.reason,
                tenant=_requested_or_blank(metadata),
            )
            raise

    def _identify(self, context: Any, metadata: Sequence[tuple[str, Any]]) -> Identity:
        assert self._identities is not None
        identities = self._identities.current()
        token = _bearer_token(metadata) if self._mode in ("token", "token_or_mtls") else None
        if token is not None:
            identity = identities.tokens.get(token_digest(token))
            if identity is None:
                raise UnauthenticatedError("the bearer token is not valid", reason="INVALID_TOKEN")
            return identity
        names = _certificate_names(context) if self._mode in ("mtls", "token_or_mtls") else []
        for name in names:
            if name in identities.clients:
                return identities.clients[name]
        if names:
            raise UnauthenticatedError(
                f"client certificate {names[0]!r} is not in the identities file",
                reason="UNKNOWN_CLIENT_CERTIFICATE",
            )
        raise UnauthenticatedError(_MISSING[self._mode], reason="MISSING_CREDENTIALS")

    def _authorize(
        self,
        context: Any,
        metadata: Sequence[tuple[str, Any]],
        method: str,
        identity: Identity,
        admin: bool,
    ) -> str:
        requested = requested_tenant(metadata)
        try:
            return _tenant_for(identity, requested, admin)
        except PermissionDeniedError as exc:
            _audit(
                "auth_failure",
                method=method,
                code=exc.grpc_status,
                context=context,
                identity=identity,
                tenant=requested or identity.tenant,
                reason=exc.reason,
            )
            raise


_MISSING: Final[Mapping[str, str]] = {
    "token": "this call needs 'authorization: Bearer <token>' metadata",
    "mtls": "this call needs a client certificate (mTLS; the unix socket has none)",
    "token_or_mtls": "this call needs 'authorization: Bearer <token>' metadata "
    "or a client certificate",
}


def _tenant_for(identity: Identity, requested: str | None, admin: bool) -> str:
    """The tenant ``identity`` acts in, or PermissionDeniedError."""
    if admin and identity.role != "admin":
        raise PermissionDeniedError(
            f"{identity.name} has role {identity.role}: AdminService needs role admin",
            reason="ADMIN_ROLE_REQUIRED",
        )
    if requested is None or requested == identity.tenant:
        return identity.tenant
    if identity.role == "admin":
        return requested
    raise PermissionDeniedError(
        f"{identity.name} acts in tenant {identity.tenant!r}, not {requested!r}",
        reason="TENANT_MISMATCH",
        metadata={"tenant": identity.tenant, "requested": requested},
    )


def _requested_or_blank(metadata: Sequence[tuple[str, Any]]) -> str:
    # Audit only: a header too malformed to validate is still worth recording, cut short.
    for key, value in metadata:
        if key == TENANT_METADATA_KEY:
            return "".join(ch if ch.isprintable() else "?" for ch in str(value))[:128]
    return ""


def _bearer_token(metadata: Sequence[tuple[str, Any]]) -> str | None:
    for key, value in metadata:
        if key == AUTHORIZATION_METADATA_KEY:
            scheme, _, token = str(value).strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise UnauthenticatedError(
                    "authorization metadata must be 'Bearer <token>'", reason="INVALID_TOKEN"
                )
            return token.strip()
    return None


def _certificate_names(context: Any) -> list[str]:
    """The names of a verified client certificate: its SANs, then its subject CN."""
    auth = context.auth_context() or {}
    if b"ssl" not in auth.get("transport_security_type", ()):
        return []
    names = [*auth.get("x509_subject_alternative_name", ()), *auth.get("x509_common_name", ())]
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]


# --- wrapping handlers of every kind --------------------------------------------------------
# grpc.aio drives a handler by the kind of its function (coroutine, async
# generator, plain function or generator run in a thread), so each wrapper
# keeps the kind of what it wraps (as in interceptors.py).

Enter = Callable[[Any], _Call]


def _guard_handler(handler: Any, enter: Enter) -> Any:
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_guard(handler.stream_stream, enter), **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_guard(handler.stream_unary, enter), **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_guard(handler.unary_stream, enter), **kwargs)
    return grpc.unary_unary_rpc_method_handler(_guard(handler.unary_unary, enter), **kwargs)


def _guard(behavior: Behavior, enter: Enter) -> Behavior:
    if inspect.iscoroutinefunction(behavior):
        return _guard_coroutine(behavior, enter)
    if inspect.isasyncgenfunction(behavior):
        return _guard_async_generator(behavior, enter)
    if inspect.isgeneratorfunction(behavior):
        return _guard_generator(behavior, enter)
    return _guard_function(behavior, enter)


def _guard_coroutine(behavior: Behavior, enter: Enter) -> Behavior:
    async def guarded(request: Any, context: Any) -> Any:
        call = enter(context)
        try:
            result = await behavior(request, context)
        except BaseException as exc:
            call.finish(context, exc)
            raise
        call.finish(context, None)
        return result

    return guarded


def _guard_async_generator(behavior: Behavior, enter: Enter) -> Behavior:
    async def guarded(request: Any, context: Any) -> AsyncIterator[Any]:
        call = enter(context)
        try:
            async for response in behavior(request, context):
                yield response
        except BaseException as exc:
            call.finish(context, exc)
            raise
        call.finish(context, None)

    return guarded


def _guard_function(behavior: Behavior, enter: Enter) -> Behavior:
    def guarded(request: Any, context: Any) -> Any:
        call = enter(context)
        try:
            result = behavior(request, context)
        except BaseException as exc:
            call.finish(context, exc)
            raise
        call.finish(context, None)
        return result

    return guarded


def _guard_generator(behavior: Behavior, enter: Enter) -> Behavior:
    def guarded(request: Any, context: Any) -> Iterator[Any]:
        call = enter(context)
        try:
            yield from behavior(request, context)
        except BaseException as exc:
            call.finish(context, exc)
            raise
        call.finish(context, None)

    return guarded


def auth_interceptor(mode: AuthMode, tokens_file: str) -> AuthInterceptor:
    """The interceptor for a config's ``auth`` and ``auth_tokens_file`` (loads the file)."""
    identities = IdentitiesFile(tokens_file) if mode != "off" else None
    return AuthInterceptor(mode, identities)


__all__ = [
    "ADMIN_SERVICE",
    "ANONYMOUS",
    "AuthInterceptor",
    "Identities",
    "IdentitiesFile",
    "Identity",
    "audit_log",
    "auth_interceptor",
    "authenticated_tenant",
    "load_identities",
    "parse_identities",
    "requested_tenant",
    "token_digest",
]
