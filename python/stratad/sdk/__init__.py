"""The Python SDK for a stratad daemon."""

from stratad.sdk.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]
