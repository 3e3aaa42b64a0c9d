"""Certificates made in the test: a CA, server and client certificates as PEM files.

``Pki(directory)`` creates a CA; ``server()`` issues a certificate for
localhost / 127.0.0.1, ``client(name)`` one for a client (CN = name, and the
SANs given). ``expired=True`` makes one whose validity ended yesterday.
Everything uses P-256 keys: quick to generate.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_serial = itertools.count(1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as files."""

    cert: Path
    key: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    @property
    def key_pem(self) -> bytes:
        return self.key.read_bytes()

    @property
    def serial(self) -> int:
        return x509.load_pem_x509_certificate(self.cert_pem).serial_number


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Pki:
    def __init__(self, directory: Path, name: str = "stratad test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / f"{name.replace(' ', '-')}.pem"
        self.ca_file.write_bytes(self.ca_pem)

    @property
    def ca_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def server(self, stem: str = "server", *, expired: bool = False) -> Issued:
        sans: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        return self._issue(stem, "localhost", sans, ExtendedKeyUsageOID.SERVER_AUTH, expired)

    def client(
        self, common_name: str, *, dns: tuple[str, ...] = (), expired: bool = False
    ) -> Issued:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        stem = f"client-{common_name}-{next(_serial)}"
        return self._issue(stem, common_name, sans, ExtendedKeyUsageOID.CLIENT_AUTH, expired)

    def _issue(
        self,
        stem: str,
        common_name: str,
        sans: list[x509.GeneralName],
        usage: x509.ObjectIdentifier,
        expired: bool,
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        start, end = (
            (now - datetime.timedelta(days=3), now - datetime.timedelta(days=1))
            if expired
            else (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1))
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return issued
