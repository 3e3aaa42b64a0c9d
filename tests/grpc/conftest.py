"""Fixtures for the API tests: a real daemon in this process, spoken to with raw stubs.

- ``start_api``: ``start_api(**config_fields)`` starts the real server with every
  stratad service (``inprocess_server`` from tests/conftest.py, so on
  ``127.0.0.1:0`` with a fresh data directory) and returns an `Api` on it.
- ``api``: ``start_api()`` with the default configuration.

`Api` holds the generated stubs (``.sessions``, ``.checkpoints``, ``.admin``)
and sends every call with a deadline and its tenant's ``x-stratad-tenant``
metadata. ``api.as_tenant("t2")`` is the same daemon seen by another tenant.
``api.fails(method, request, code, *words, keeps=session_id)`` asserts the exact
status code, that the message names each of ``words`` and that the session's
`Snapshot` (version, head, checkpoint count, status, latest digest) is unchanged.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from stratad.api.v1 import (
    admin_pb2_grpc,
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from stratad.server.registry import SERVICES

TENANT_KEY = "x-stratad-tenant"
DEADLINE = 15.0


def struct(value: dict[str, Any] | None = None) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value or {})
    return out


@dataclass(frozen=True)
class Snapshot:
    """What a session looks like from outside: a failed call must not change it."""

    version: int
    head: str
    checkpoint_count: int
    status: int
    digest: str


@dataclass
class Api:
    target: str
    channel: grpc.Channel
    tenant: str = ""
    server: Any = None

    def __post_init__(self) -> None:
        self.sessions = session_pb2_grpc.SessionServiceStub(self.channel)
        self.checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((TENANT_KEY, self.tenant),) if self.tenant else ()

    def as_tenant(self, tenant: str) -> Api:
        return dataclasses.replace(self, tenant=tenant)

    def call(self, method: Callable[..., Any], request: Any) -> Any:
        return method(request, timeout=DEADLINE, metadata=self.metadata)

    def fails(
        self,
        method: Callable[..., Any],
        request: Any,
        code: grpc.StatusCode,
        *words: str,
        keeps: str = "",
    ) -> str:
        """Call, expect `code`; the message must name every one of `words`.

        With `keeps`, that session (of this tenant) must look the same after
        the failed call, and the daemon must still answer.
        """
        before = self.snapshot(keeps) if keeps else None
        with pytest.raises(grpc.RpcError) as excinfo:
            self.call(method, request)
        error: Any = excinfo.value
        details = error.details() or ""
        assert error.code() == code, f"{error.code()} {details!r}"
        for word in words:
            assert word in details, f"{word!r} not in {details!r}"
        if before is not None:
            assert self.snapshot(keeps) == before
        return str(details)

    # -- shortcuts for the arrange step of a test ----------------------------

    def create(self, session_id: str = "", **fields: Any) -> session_pb2.Session:
        request = session_pb2.CreateSessionRequest(session_id=session_id, **fields)
        return self.call(self.sessions.CreateSession, request).session  # type: ignore[no-any-return]

    def get(self, session_id: str) -> session_pb2.Session:
        request = session_pb2.GetSessionRequest(session_id=session_id)
        return self.call(self.sessions.GetSession, request).session  # type: ignore[no-any-return]

    def save(self, session_id: str, data: bytes, **fields: Any) -> checkpoint_pb2.SaveStateResponse:
        request = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=data, **fields)
        return self.call(self.checkpoints.SaveState, request)  # type: ignore[no-any-return]

    def load(self, session_id: str, **fields: Any) -> checkpoint_pb2.LoadStateResponse:
        request = checkpoint_pb2.LoadStateRequest(session_id=session_id, **fields)
        return self.call(self.checkpoints.LoadState, request)  # type: ignore[no-any-return]

    def checkpoint_ids(self, session_id: str, **fields: Any) -> list[str]:
        request = checkpoint_pb2.ListCheckpointsRequest(session_id=session_id, **fields)
        response = self.call(self.checkpoints.ListCheckpoints, request)
        return [c.checkpoint_id for c in response.checkpoints]

    def snapshot(self, session_id: str) -> Snapshot:
        session = self.get(session_id)
        digest = self.load(session_id).digest if session.head_checkpoint_id else ""
        return Snapshot(
            session.version,
            session.head_checkpoint_id,
            session.checkpoint_count,
            session.status,
            digest,
        )


@pytest.fixture
def start_api(inprocess_server: Callable[..., Any]) -> Iterator[Callable[..., Api]]:
    channels: list[grpc.Channel] = []

    def start(**config: Any) -> Api:
        server = inprocess_server(services=SERVICES, **config)
        channel = grpc.insecure_channel(server.target)
        channels.append(channel)
        return Api(server.target, channel, server=server)

    yield start
    for channel in channels:
        channel.close()


@pytest.fixture
def api(start_api: Callable[..., Api]) -> Api:
    return start_api()


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An address that accepts TCP connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"127.0.0.1:{sock.getsockname()[1]}"
