"""stratad: a durable state sidecar for AI agents.

`stratad.Client` / `stratad.AsyncClient` talk to a daemon (`stratad serve`);
errors are the classes of `stratad.errors`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("stratad")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

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
