"""The names every client of stratad shares: headers, environment variables, the default address.

One spelling for what the SDK, ``stratad ctl``, ``stratad mcp``, the framework
integrations and the compat facades all send or read, so that they cannot
disagree (the Go and TypeScript clients spell the same names; docs/clients.md
lists the variables). Imports nothing, so any module can use it.
"""

from __future__ import annotations

from typing import Final

#: Where a client connects when neither an argument nor STRATAD_ADDRESS says.
DEFAULT_ADDRESS: Final = "127.0.0.1:50051"

#: The gRPC metadata key naming the tenant a call acts in.
TENANT_HEADER: Final = "x-stratad-tenant"
#: The metadata key (and HTTP header) carrying ``Bearer <token>``.
AUTHORIZATION_HEADER: Final = "authorization"
#: The scheme of the authorization header: ``f"{BEARER_SCHEME} {token}"``.
BEARER_SCHEME: Final = "Bearer"

#: ``HOST:PORT`` or ``unix:/path`` of the daemon.
ADDRESS_ENV: Final = "STRATAD_ADDRESS"
#: The tenant to act in (auth off, or an admin acting in a tenant).
TENANT_ENV: Final = "STRATAD_TENANT"
#: The bearer token itself.
TOKEN_ENV: Final = "STRATAD_TOKEN"
#: A file holding the bearer token (a mounted secret), read when TOKEN_ENV is empty.
TOKEN_FILE_ENV: Final = "STRATAD_TOKEN_FILE"
#: ``1``/``true``/``yes``/``on``: TLS with the system's CA certificates.
TLS_ENV: Final = "STRATAD_TLS"
#: PEM CA file to verify the daemon with (implies TLS).
TLS_CA_ENV: Final = "STRATAD_TLS_CA"
#: Client certificate and key for mTLS (imply TLS; one needs the other).
TLS_CERT_ENV: Final = "STRATAD_TLS_CERT"
TLS_KEY_ENV: Final = "STRATAD_TLS_KEY"
#: The name the daemon's certificate must carry when it is not the host dialed.
TLS_SERVER_NAME_ENV: Final = "STRATAD_TLS_SERVER_NAME"

__all__ = [
    "ADDRESS_ENV",
    "AUTHORIZATION_HEADER",
    "BEARER_SCHEME",
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
]
