"""The Python SDK for a stratad daemon."""

from stratad.sdk.client import AsyncClient, Client
from stratad.sdk.connection import TLSConfig

__all__ = ["AsyncClient", "Client", "TLSConfig"]
