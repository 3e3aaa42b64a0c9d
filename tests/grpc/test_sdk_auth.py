"""The SDK, the LangGraph saver and the compat facades with TLS and tokens.

Against an in-process daemon serving TLS (certificates from `tests/pki.py`)
with ``auth = "token"`` or mTLS; settings given as arguments or through the
STRATAD_* variables.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from pki import Pki

import stratad
from stratad.errors import PermissionDeniedError, UnauthenticatedError, UnavailableError
from stratad.sdk.connection import Connection, TLSConfig
from stratad.server.auth import token_digest
from stratad.server.registry import SERVICES

AGENT_TOKEN = "sdk-agent-token-1"
ADMIN_TOKEN = "sdk-admin-token-1"
STRATAD_VARIABLES = (
    "STRATAD_ADDRESS",
    "STRATAD_TENANT",
    "STRATAD_TOKEN",
    "STRATAD_TOKEN_FILE",
    "STRATAD_TLS",
    "STRATAD_TLS_CA",
    "STRATAD_TLS_CERT",
    "STRATAD_TLS_KEY",
    "STRATAD_TLS_SERVER_NAME",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in STRATAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def daemon(inprocess_server: Callable[..., Any], pki: Pki, tmp_path: Path) -> Any:
    """TLS with client certificates optional for the SDK: auth by token."""
    tokens = tmp_path / "identities.toml"
    tokens.write_text(
        f'[tokens]\n"{token_digest(AGENT_TOKEN)}" = {{ tenant = "acme", role = "agent" }}\n'
        f'"{token_digest(ADMIN_TOKEN)}" = {{ role = "admin" }}\n'
        '[clients]\n"sdk-client" = { tenant = "acme", role = "agent" }\n'
    )
    issued = pki.server()
    return inprocess_server(
        services=SERVICES,
        tls_cert_file=str(issued.cert),
        tls_key_file=str(issued.key),
        auth="token",
        auth_tokens_file=str(tokens),
    )


def test_client_over_tls_with_a_token(daemon: Any, pki: Pki) -> None:
    tls = stratad.TLSConfig(ca_file=str(pki.ca_file))
    with stratad.Client(daemon.target, token=AGENT_TOKEN, tls=tls) as client:
        client.create_session("s1")
        client.save_state("s1", b'{"step": 1}')
        assert client.load_state("s1").data == b'{"step": 1}'
    with stratad.Client(daemon.target, token=ADMIN_TOKEN, tenant="acme", tls=tls) as admin:
        assert admin.get_session("s1").checkpoint_count == 1
        assert admin.store_stats().sessions == 1


def test_client_refusals_are_the_sdk_exceptions(daemon: Any, pki: Pki) -> None:
    tls = stratad.TLSConfig(ca_file=str(pki.ca_file))
    with (
        stratad.Client(daemon.target, tls=tls) as anonymous,
        pytest.raises(UnauthenticatedError) as missing,
    ):
        anonymous.create_session("s1")
    assert missing.value.reason == "MISSING_CREDENTIALS"
    with (
        stratad.Client(daemon.target, token=AGENT_TOKEN, tenant="globex", tls=tls) as client,
        pytest.raises(PermissionDeniedError) as denied,
    ):
        client.create_session("s1")
    assert denied.value.reason == "TENANT_MISMATCH"
    with (
        stratad.Client(daemon.target, token=AGENT_TOKEN, tls=tls) as client,
        pytest.raises(PermissionDeniedError) as admin_only,
    ):
        client.verify()
    assert admin_only.value.reason == "ADMIN_ROLE_REQUIRED"


def test_plaintext_client_to_a_tls_daemon_is_unavailable(daemon: Any) -> None:
    with (
        stratad.Client(daemon.target, token=AGENT_TOKEN, timeout=3) as client,
        pytest.raises(UnavailableError),
    ):
        client.create_session("s1")


def test_client_settings_from_the_environment(
    daemon: Any, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(AGENT_TOKEN + "\n")  # as a mounted secret may end
    monkeypatch.setenv("STRATAD_ADDRESS", daemon.target)
    monkeypatch.setenv("STRATAD_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("STRATAD_TLS_CA", str(pki.ca_file))
    with stratad.Client() as client:
        client.create_session("from-env")
    monkeypatch.setenv("STRATAD_TOKEN", ADMIN_TOKEN)  # beats the file
    monkeypatch.setenv("STRATAD_TENANT", "acme")
    with stratad.Client() as admin:
        assert admin.get_session("from-env").session_id == "from-env"
        assert admin.store_stats().sessions == 1


def test_async_client_over_tls_with_a_token(daemon: Any, pki: Pki) -> None:
    async def scenario() -> bytes:
        tls = stratad.TLSConfig(ca_file=str(pki.ca_file))
        async with stratad.AsyncClient(daemon.target, token=AGENT_TOKEN, tls=tls) as client:
            await client.create_session("s1")
            await client.save_state("s1", b"async")
            return bytes((await client.load_state("s1")).data)

    assert asyncio.run(scenario()) == b"async"


def test_client_certificate_for_mtls(
    inprocess_server: Callable[..., Any], pki: Pki, tmp_path: Path
) -> None:
    tokens = tmp_path / "identities.toml"
    tokens.write_text('[clients]\n"sdk-client" = { tenant = "acme", role = "agent" }\n')
    issued = pki.server()
    server = inprocess_server(
        services=SERVICES,
        tls_cert_file=str(issued.cert),
        tls_key_file=str(issued.key),
        tls_client_ca_file=str(pki.ca_file),
        auth="mtls",
        auth_tokens_file=str(tokens),
    )
    client_cert = pki.client("sdk-client")
    tls = stratad.TLSConfig(str(pki.ca_file), str(client_cert.cert), str(client_cert.key))
    with stratad.Client(server.target, tls=tls) as client:
        assert client.create_session("s1").session_id == "s1"


def test_server_name_override(daemon: Any, pki: Pki) -> None:
    # The certificate names localhost and 127.0.0.1; dial 127.0.0.1 and check for localhost.
    tls = stratad.TLSConfig(ca_file=str(pki.ca_file), server_name="localhost")
    with stratad.Client(daemon.target, token=AGENT_TOKEN, tls=tls) as client:
        client.create_session("s1")
    wrong = stratad.TLSConfig(ca_file=str(pki.ca_file), server_name="elsewhere.example")
    with (
        stratad.Client(daemon.target, token=AGENT_TOKEN, tls=wrong, timeout=3) as client,
        pytest.raises(UnavailableError),
    ):
        client.create_session("s2")


# --- resolving a connection ---------------------------------------------------------------


def test_arguments_beat_the_environment() -> None:
    env = {
        "STRATAD_ADDRESS": "env:1",
        "STRATAD_TENANT": "env-tenant",
        "STRATAD_TOKEN": "env-token",
        "STRATAD_TLS_CA": "/env/ca.pem",
    }
    resolved = Connection.resolve("arg:2", tenant="t", token="tok", tls=False, environ=env)
    assert resolved == Connection("arg:2", "t", "tok", None)
    from_env = Connection.resolve(environ=env)
    assert from_env == Connection("env:1", "env-tenant", "env-token", TLSConfig("/env/ca.pem"))
    assert from_env.metadata == (
        ("x-stratad-tenant", "env-tenant"),
        ("authorization", "Bearer env-token"),
    )


def test_tls_defaults() -> None:
    assert Connection.resolve(environ={}) == Connection("127.0.0.1:50051")
    assert Connection.resolve(environ={"STRATAD_TLS": "true"}).tls == TLSConfig()
    assert Connection.resolve(tls=True, environ={}).tls == TLSConfig()
    with pytest.raises(ValueError, match="key"):
        TLSConfig(cert_file="/c.pem")


def test_saver_and_facades_carry_token_and_tls(daemon: Any, pki: Pki) -> None:
    from stratad.compat import aiwhisperer, cogency, cortex, cortex_state, marsys
    from stratad.integrations.langgraph import StratadSaver

    tls = stratad.TLSConfig(ca_file=str(pki.ca_file))
    bearer = ("authorization", f"Bearer {AGENT_TOKEN}")
    common: dict[str, Any] = {"token": AGENT_TOKEN, "tls": tls}

    with StratadSaver(daemon.target, **common) as saver:
        assert bearer in saver.client.metadata
        saver.client.create_session("langgraph-1")  # over TLS, authenticated

    crystallizer = cortex.MemoryCrystallizer(address=daemon.target, **common)
    assert bearer in crystallizer._client.metadata
    state = cortex_state.StateFileManager(tenant_id="acme", address=daemon.target, **common)
    assert bearer in state._client.metadata
    profile = cogency.UserProfile("u1", address=daemon.target, **common)
    assert bearer in profile._client.metadata

    backend = marsys.SidecarStorageBackend(daemon.target, **common)

    async def marsys_roundtrip() -> dict[str, Any] | None:
        await backend.save("k1", {"v": 1})
        loaded = await backend.load("k1")
        await backend.close()
        return loaded

    assert asyncio.run(marsys_roundtrip()) == {"v": 1}

    aiwhisperer.configure(daemon.target, **common)
    try:
        client, _ = aiwhisperer._current()
        assert bearer in client.metadata
    finally:
        aiwhisperer.close()
        aiwhisperer.configure()


def test_raw_grpc_sees_the_tenant_of_the_token(daemon: Any, pki: Pki) -> None:
    """What another language does: TLS channel, metadata by hand."""
    from stratad.api.v1 import session_pb2, session_pb2_grpc

    credentials = grpc.ssl_channel_credentials(pki.ca_pem)
    with grpc.secure_channel(daemon.target, credentials) as channel:
        stub = session_pb2_grpc.SessionServiceStub(channel)
        metadata = (("authorization", f"Bearer {AGENT_TOKEN}"),)
        stub.CreateSession(
            session_pb2.CreateSessionRequest(session_id="raw"), timeout=10, metadata=metadata
        )
    with stratad.Client(
        daemon.target, token=ADMIN_TOKEN, tenant="acme", tls=TLSConfig(str(pki.ca_file))
    ) as admin:
        assert admin.get_session("raw").session_id == "raw"
