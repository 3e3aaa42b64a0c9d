"""`TLSConfig`: how a client verifies the daemon and which certificate it shows.

Its own module, below `connection` (which dials with it) and `diagnose` (which
probes with it when a connection fails), so neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from stratad.sdk.constants import (
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_ENV,
    TLS_KEY_ENV,
    TLS_SERVER_NAME_ENV,
)

_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """How to verify the daemon, and (mTLS) the certificate to show it. Paths to PEM files."""

    #: CA certificates the daemon's certificate must chain to; "" = the system's.
    ca_file: str = ""
    #: Client certificate and its key, for a daemon that requires mTLS.
    cert_file: str = ""
    key_file: str = ""
    #: The name to check the daemon's certificate for, instead of the host dialed.
    server_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a client certificate needs its key: give cert_file and key_file")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TLSConfig | None:
        """The TLS the STRATAD_TLS* variables ask for; None when none is set."""
        ca, cert, key = (environ.get(v, "") for v in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV))
        name = environ.get(TLS_SERVER_NAME_ENV, "")
        if not (ca or cert or key or environ.get(TLS_ENV, "").lower() in _TRUE):
            return None
        return cls(ca, cert, key, name)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            _read(self.ca_file), _read(self.key_file), _read(self.cert_file)
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        if not self.server_name:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def _read(path: str) -> bytes | None:
    return Path(path).expanduser().read_bytes() if path else None


__all__ = ["TLSConfig"]
