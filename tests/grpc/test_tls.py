"""TLS and mTLS on the gRPC listener, over real TLS with certificates made in the test.

Every check dials a fresh channel with its own subchannel pool: gRPC would
otherwise share one connection between channels to the same target, and a
connection keeps the certificate it was made with.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pki import Issued, Pki

from stratad.config import ConfigError
from stratad.server.tls import CertificateFiles, TLSError

SERVING = health_pb2.HealthCheckResponse.SERVING


def tls_channel(target: str, ca: Pki, client: Issued | None = None) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials(
        ca.ca_pem,
        client.key_pem if client else None,
        client.cert_pem if client else None,
    )
    return grpc.secure_channel(target, credentials, options=[("grpc.use_local_subchannel_pool", 1)])


def check(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status)


def fails_unavailable(channel: grpc.Channel) -> str:
    with pytest.raises(grpc.RpcError) as excinfo, channel:
        check(channel)
    error: Any = excinfo.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    return str(error.details())


def served_serial(target: str) -> int:
    """The serial number of the certificate a new TLS connection to ``target`` gets."""
    host, _, port = target.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as sock,
        context.wrap_socket(sock) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def replace(target: Path, source: Path) -> None:
    """Swap a file's content atomically, as a secret update does."""
    tmp = target.with_suffix(".new")
    tmp.write_bytes(source.read_bytes())
    os.replace(tmp, target)


@pytest.fixture
def tls_server(inprocess_server: Callable[..., Any], pki: Pki) -> Callable[..., Any]:
    def start(client_ca: Pki | None = None, **config: Any) -> Any:
        issued = pki.server()
        return inprocess_server(
            tls_cert_file=str(issued.cert),
            tls_key_file=str(issued.key),
            tls_client_ca_file=str(client_ca.ca_file) if client_ca else "",
            **config,
        )

    return start


def test_tls_serves_and_plaintext_to_the_tls_port_fails(tls_server: Any, pki: Pki) -> None:
    server = tls_server()
    with tls_channel(server.target, pki) as channel:
        assert check(channel) == SERVING
    fails_unavailable(grpc.insecure_channel(server.target))


def test_a_client_that_does_not_trust_the_ca_fails(
    tls_server: Any, new_pki: Callable[[str], Pki]
) -> None:
    server = tls_server()
    fails_unavailable(tls_channel(server.target, new_pki("another CA")))


def test_unix_socket_stays_plaintext_beside_tls(
    tls_server: Any, pki: Pki, tmp_path: Path, health_check: Callable[..., int]
) -> None:
    unix = f"unix:{tmp_path}/s.sock"
    server = tls_server(listen_unix=unix)
    assert server.server.addresses[1] == unix
    assert health_check(unix) == SERVING


def test_mtls_accepts_a_client_certificate_of_the_ca(tls_server: Any, pki: Pki) -> None:
    server = tls_server(client_ca=pki)
    with tls_channel(server.target, pki, pki.client("agent-1")) as channel:
        assert check(channel) == SERVING


def test_mtls_refuses_a_client_without_a_certificate(tls_server: Any, pki: Pki) -> None:
    server = tls_server(client_ca=pki)
    fails_unavailable(tls_channel(server.target, pki))


def test_mtls_refuses_an_expired_client_certificate(tls_server: Any, pki: Pki) -> None:
    server = tls_server(client_ca=pki)
    fails_unavailable(tls_channel(server.target, pki, pki.client("agent-1", expired=True)))


def test_mtls_refuses_a_client_certificate_of_an_unknown_ca(
    tls_server: Any, pki: Pki, new_pki: Callable[[str], Pki]
) -> None:
    server = tls_server(client_ca=pki)
    stranger = new_pki("stranger CA").client("agent-1")
    fails_unavailable(tls_channel(server.target, pki, stranger))


def test_certificate_reload_reaches_new_connections(
    inprocess_server: Callable[..., Any], pki: Pki, new_pki: Callable[[str], Pki]
) -> None:
    first = pki.server("first")
    cert, key = first.cert.with_name("tls.crt"), first.key.with_name("tls.key")
    replace(cert, first.cert)
    replace(key, first.key)
    server = inprocess_server(tls_cert_file=str(cert), tls_key_file=str(key))
    old_channel = tls_channel(server.target, pki)
    assert check(old_channel) == SERVING
    assert served_serial(server.target) == first.serial

    rotated_ca = new_pki("rotated CA")
    second = rotated_ca.server("second")
    replace(cert, second.cert)
    replace(key, second.key)

    assert served_serial(server.target) == second.serial
    with tls_channel(server.target, rotated_ca) as channel:
        assert check(channel) == SERVING
    fails_unavailable(tls_channel(server.target, pki))  # new connections: the new cert
    assert check(old_channel) == SERVING  # an open connection keeps its own
    old_channel.close()
    assert server.server.tls_reloads == 1


def test_a_half_rotated_pair_keeps_the_old_certificate(
    inprocess_server: Callable[..., Any], pki: Pki
) -> None:
    first, second = pki.server("first"), pki.server("second")
    cert, key = first.cert.with_name("tls.crt"), first.key.with_name("tls.key")
    replace(cert, first.cert)
    replace(key, first.key)
    server = inprocess_server(tls_cert_file=str(cert), tls_key_file=str(key))
    replace(cert, second.cert)  # its key not yet
    assert served_serial(server.target) == first.serial
    replace(key, second.key)
    assert served_serial(server.target) == second.serial


def test_unusable_tls_files_stop_start_up(
    inprocess_server: Callable[..., Any], pki: Pki, tmp_path: Path
) -> None:
    a, b = pki.server("a"), pki.server("b")
    with pytest.raises(TLSError, match="private key"):
        CertificateFiles(str(a.cert), str(b.key))
    with pytest.raises(TLSError, match="cannot read TLS file"):
        CertificateFiles(str(tmp_path / "absent.crt"), str(a.key))
    with pytest.raises(TLSError, match="tls_client_ca_file"):
        CertificateFiles(str(a.cert), str(a.key), str(a.key))


def test_plaintext_on_a_non_loopback_address_needs_allow_insecure(
    inprocess_server: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError, match="allow_insecure"):
        inprocess_server(listen="0.0.0.0:0")
    with caplog.at_level("WARNING", logger="stratad.server.app"):
        server = inprocess_server(listen="0.0.0.0:0", allow_insecure=True)
    assert server.target.startswith("0.0.0.0:")
    assert any("plaintext gRPC on 0.0.0.0:0" in r.getMessage() for r in caplog.records)
