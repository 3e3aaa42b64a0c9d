"""TLS for the gRPC listener: server credentials that follow their files.

`CertificateFiles` reads the PEM files named by ``tls_cert_file``,
``tls_key_file`` and (mTLS) ``tls_client_ca_file``. gRPC asks it for the
certificate configuration before every TLS handshake (the fetch callback of
`grpc.dynamic_ssl_server_credentials`); it answers None while the files are
unchanged, so a rotated certificate (cert-manager, a Kubernetes secret
update) reaches every new connection without a restart, and connections
already open keep the certificate they were made with.

A change is noticed by each file's (mtime, size, inode): Kubernetes swaps a
secret's files by replacing a symlink, which changes the inode. A half-done
change (the certificate replaced, its key not yet) is not served: the new
pair is checked with the standard ssl module first, and until it loads the
previous configuration stays in use.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from typing import Any

import grpc

from stratad.config import Config
from stratad.errors import UnavailableError

_log = logging.getLogger(__name__)

Signature = tuple[tuple[int, int, int], ...]


class TLSError(UnavailableError):
    """The TLS files cannot be read or do not form a usable certificate and key."""


@dataclass(frozen=True, slots=True)
class _Loaded:
    signature: Signature
    config: Any  # grpc.ServerCertificateConfiguration


class CertificateFiles:
    """The certificate, key and client CA files, re-read when they change."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str = "") -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        # gRPC calls fetch() from its own threads, one handshake at a time or not.
        self._lock = threading.Lock()
        self._loaded = self._load()  # raises TLSError: start-up must fail loudly
        #: How many times new files were picked up (for tests and logs).
        self.reloads = 0

    @property
    def require_client_certificate(self) -> bool:
        return bool(self.client_ca_file)

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that call `fetch` before each handshake."""
        return grpc.dynamic_ssl_server_credentials(
            self._loaded.config,
            self.fetch,
            require_client_authentication=self.require_client_certificate,
        )

    def fetch(self) -> Any:
        """A new grpc.ServerCertificateConfiguration if the files changed, else None.

        Never raises: an exception here would fail the handshake of a client
        that did nothing wrong. A bad new file is logged and the old
        configuration kept.
        """
        try:
            with self._lock:
                return self._reload_if_changed()
        except Exception as exc:
            _log.warning("TLS files changed but cannot be used yet; keeping the old ones: %s", exc)
            return None

    def _reload_if_changed(self) -> Any:
        if self._signature() == self._loaded.signature:
            return None
        self._loaded = self._load()
        self.reloads += 1
        _log.info("TLS certificate files changed: reloaded %s", self.cert_file)
        return self._loaded.config

    def _paths(self) -> list[str]:
        return [p for p in (self.cert_file, self.key_file, self.client_ca_file) if p]

    def _signature(self) -> Signature:
        stats = [os.stat(path) for path in self._paths()]
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)

    def _load(self) -> _Loaded:
        # The signature is taken first: a change racing the read is seen next time.
        try:
            signature = self._signature()
            cert, key = _read(self.cert_file), _read(self.key_file)
            client_ca = _read(self.client_ca_file) if self.client_ca_file else None
        except OSError as exc:
            raise TLSError(f"cannot read TLS file {exc.filename}: {exc.strerror}") from None
        _check_pair(self.cert_file, self.key_file, client_ca)
        config = grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=client_ca
        )
        return _Loaded(signature, config)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _check_pair(cert_file: str, key_file: str, client_ca: bytes | None) -> None:
    """Refuse files gRPC would only fail on at the first handshake, with a vaguer error."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, ValueError) as exc:
        raise TLSError(
            f"{cert_file} and {key_file} are not a PEM certificate and its private key: {exc}"
        ) from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cadata=client_ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as exc:
            raise TLSError(f"tls_client_ca_file holds no PEM certificate: {exc}") from None


def certificate_files(config: Config) -> CertificateFiles | None:
    """The TLS files of ``config`` (None: plaintext); raises TLSError if unusable."""
    if not config.tls:
        return None
    return CertificateFiles(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)


__all__ = ["CertificateFiles", "TLSError", "certificate_files"]
