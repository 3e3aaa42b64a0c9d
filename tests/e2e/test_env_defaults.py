"""``Client()``, ``AsyncClient()`` and ``StratadSaver()`` with no arguments take the
daemon and tenant from STRATAD_ADDRESS and STRATAD_TENANT (a real daemon; the
same variables with auth and TLS: tests/grpc/test_sdk_auth.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

import stratad
from stratad.integrations.langgraph import StratadSaver, session_id_of

Daemon = Any


@pytest.fixture
def env_daemon(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    for name in ("STRATAD_TOKEN", "STRATAD_TOKEN_FILE", "STRATAD_TLS", "STRATAD_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STRATAD_ADDRESS", daemon.target)
    monkeypatch.setenv("STRATAD_TENANT", "from-env")
    return daemon


def sessions_of(daemon: Daemon, tenant: str) -> list[str]:
    with stratad.Client(daemon.target, tenant=tenant) as client:
        return [s.session_id for s in client.list_sessions()]


def test_client_reads_address_and_tenant_from_the_environment(env_daemon: Daemon) -> None:
    with stratad.Client() as client:
        assert (client.address, client.tenant) == (env_daemon.target, "from-env")
        client.create_session("made-by-env-client")
    assert sessions_of(env_daemon, "from-env") == ["made-by-env-client"]
    assert sessions_of(env_daemon, "default") == []
    with stratad.Client(tenant="other") as client:  # an argument beats the variable
        client.create_session("made-in-other")
    assert sessions_of(env_daemon, "other") == ["made-in-other"]


def test_async_client_reads_them_too(env_daemon: Daemon) -> None:
    async def scenario() -> None:
        async with stratad.AsyncClient() as client:
            await client.create_session("made-by-async-client")

    asyncio.run(scenario())
    assert sessions_of(env_daemon, "from-env") == ["made-by-async-client"]


def test_stratad_saver_reads_address_and_tenant_from_the_environment(env_daemon: Daemon) -> None:
    checkpoint = empty_checkpoint()
    config = {"configurable": {"thread_id": "thread-env", "checkpoint_ns": ""}}
    with StratadSaver() as saver:
        assert (saver.address, saver.tenant) == (env_daemon.target, "from-env")
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {})  # type: ignore[arg-type]
        loaded = saver.get_tuple(config)  # type: ignore[arg-type]
    assert loaded is not None and loaded.checkpoint["id"] == checkpoint["id"]
    assert sessions_of(env_daemon, "from-env") == [session_id_of("thread-env")]
    assert sessions_of(env_daemon, "default") == []
