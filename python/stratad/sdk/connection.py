"""Where a client connects and with which credentials, from arguments or the environment.

Every client of stratad (the SDK, ``stratad ctl``, the LangGraph saver, the
compat facades) resolves its connection here, so they all read the same
variables when an argument is not given (None or empty; the names are spelled
once, in `stratad.sdk.constants`, and re-exported here):

=========================== ===============================================
``STRATAD_ADDRESS``         ``HOST:PORT`` or ``unix:/path`` (default 127.0.0.1:50051)
``STRATAD_TENANT``          the tenant to act in (auth off, or an admin)
``STRATAD_TOKEN``           bearer token, sent as ``authorization: Bearer ...``
``STRATAD_TOKEN_FILE``      a file holding the token (a mounted secret)
``STRATAD_TLS``             ``true``: TLS with the system's CA certificates
``STRATAD_TLS_CA``          PEM CA file to verify the daemon with (implies TLS)
``STRATAD_TLS_CERT``/``_KEY``  client certificate and key for mTLS (imply TLS)
``STRATAD_TLS_SERVER_NAME`` the name the daemon's certificate must carry, when
                            it is not the host dialed (e.g. dialing an IP)
=========================== ===============================================

TLS mismatches: a unary call on these channels that fails UNAVAILABLE
without reaching the daemon (after the channel's retries) is explained when
the TLS settings are the cause: a plaintext client on a TLS port, a client
without a certificate on an mTLS port, a TLS client on a plaintext port. Its
message then names the setting to change, its reason is TLS_REQUIRED,
CLIENT_CERT_REQUIRED or TLS_NOT_SUPPORTED (stratad.sdk.diagnose).

Tracing: when the application has set an OpenTelemetry tracer provider and
the otel extra is installed, every channel made here starts a CLIENT span per
call and sends its W3C ``traceparent``, so the daemon's spans join the
application's trace (stratad.tracing). Otherwise channels
carry no interceptor.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from stratad import tracing
from stratad.sdk import diagnose
from stratad.sdk.constants import (
    ADDRESS_ENV,
    AUTHORIZATION_HEADER,
    BEARER_SCHEME,
    DEFAULT_ADDRESS,
    TENANT_ENV,
    TENANT_HEADER,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
)
from stratad.sdk.tls import TLSConfig


@dataclass(frozen=True, slots=True)
class Connection:
    """A resolved address, tenant, token and TLS: what a client dials with."""

    address: str
    tenant: str = ""
    token: str = ""
    tls: TLSConfig | None = None

    @classmethod
    def resolve(
        cls,
        address: str | None = None,
        *,
        tenant: str | None = None,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Connection:
        """Arguments first; what is None or empty comes from ``environ`` (os.environ).

        ``tls``: a TLSConfig; True (TLS, settings from the environment or
        the system's CAs); False (plaintext whatever the environment says);
        None (TLS if a STRATAD_TLS* variable asks for it).
        """
        env = os.environ if environ is None else environ
        return cls(
            address=address or env.get(ADDRESS_ENV) or DEFAULT_ADDRESS,
            tenant=tenant or env.get(TENANT_ENV, ""),
            token=token or _token_from(env),
            tls=_tls_from(tls, env),
        )

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries: tenant header and bearer token, when set."""
        pairs = []
        if self.tenant:
            pairs.append((TENANT_HEADER, self.tenant))
        if self.token:
            pairs.append((AUTHORIZATION_HEADER, f"{BEARER_SCHEME} {self.token}"))
        return tuple(pairs)

    def channel(self, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
        options = [*(options or []), *(self.tls.channel_options() if self.tls else [])]
        if self.tls is None:
            channel = grpc.insecure_channel(self.address, options=options)
        else:
            credentials = self.tls.channel_credentials()
            channel = grpc.secure_channel(self.address, credentials, options=options)
        channel = tracing.traced_channel(channel)
        if diagnose.tcp_endpoint(self.address) is None:
            return channel  # a unix socket: no TLS to get wrong
        return grpc.intercept_channel(  # type: ignore[no-any-return]
            channel, diagnose.ExplainingInterceptor(self.address, self.tls)
        )

    def explain(self, exc: grpc.RpcError) -> grpc.RpcError:
        """``exc``, or (a call that failed UNAVAILABLE because of a TLS mismatch)
        an error with the same code whose message names the setting to change.
        Probes the daemon's port once (at most diagnose.PROBE_TIMEOUT): call it
        only for a failed call."""
        return diagnose.explained(exc, self.address, self.tls)

    async def aio_explain(self, exc: grpc.RpcError) -> grpc.RpcError:
        """`explain` for asyncio clients (the probe runs in a thread), as an AioRpcError."""
        if not diagnose.may_explain(exc, self.address):
            return exc
        return await asyncio.to_thread(diagnose.aio_explained, exc, self.address, self.tls)

    def aio_channel(self, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
        options = [*(options or []), *(self.tls.channel_options() if self.tls else [])]
        interceptors = tracing.aio_client_interceptors() or None
        if self.tls is None:
            return grpc.aio.insecure_channel(
                self.address, options=options, interceptors=interceptors
            )
        credentials = self.tls.channel_credentials()
        return grpc.aio.secure_channel(
            self.address, credentials, options=options, interceptors=interceptors
        )


def _token_from(env: Mapping[str, str]) -> str:
    token = env.get(TOKEN_ENV, "")
    if not token and env.get(TOKEN_FILE_ENV):
        # A mounted secret usually ends with a newline that is not part of the token.
        token = Path(env[TOKEN_FILE_ENV]).expanduser().read_text().strip()
    return token


def _tls_from(tls: TLSConfig | bool | None, env: Mapping[str, str]) -> TLSConfig | None:
    if isinstance(tls, TLSConfig):
        return tls
    if tls is False:
        return None
    from_env = TLSConfig.from_env(env)
    if tls is True:
        return from_env or TLSConfig()
    return from_env


__all__ = [
    "ADDRESS_ENV",
    "AUTHORIZATION_HEADER",
    "DEFAULT_ADDRESS",
    "TENANT_ENV",
    "TENANT_HEADER",
    "TLS_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_ENV",
    "TLS_KEY_ENV",
    "TLS_SERVER_NAME_ENV",
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "Connection",
    "TLSConfig",
]
