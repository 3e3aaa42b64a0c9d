"""The Python SDK for a stratad daemon.

`Client`, `AsyncClient` and `TLSConfig` are imported on first use (as from the
top-level `stratad`): they pull in grpc and the native core, while light
modules such as `stratad.sdk.constants` (the names every client shares, read
by the ``stratad ctl`` and ``stratad mcp`` parsers) must not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratad.sdk.client import AsyncClient, Client
    from stratad.sdk.connection import TLSConfig


def __getattr__(name: str) -> Any:
    if name in ("Client", "AsyncClient"):
        from stratad.sdk import client

        return getattr(client, name)
    if name == "TLSConfig":
        from stratad.sdk import connection

        return connection.TLSConfig
    raise AttributeError(f"module 'stratad.sdk' has no attribute {name!r}")


__all__ = ["AsyncClient", "Client", "TLSConfig"]
