"""stratad: a durable state sidecar for AI agents.

`stratad.Client` / `stratad.AsyncClient` talk to a daemon (`stratad serve`);
errors are the classes of `stratad.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stratad.version import __version__

if TYPE_CHECKING:
    from stratad.sdk.client import AsyncClient, Client
    from stratad.sdk.connection import TLSConfig


def __getattr__(name: str) -> Any:
    # The SDK pulls in grpc stubs and the native core; import it on first use
    # so `import stratad` (e.g. for the CLI's --version) stays light.
    if name in ("Client", "AsyncClient", "TLSConfig"):
        from stratad import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'stratad' has no attribute {name!r}")


__all__ = ["AsyncClient", "Client", "TLSConfig", "__version__"]
