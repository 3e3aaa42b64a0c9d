"""The MCP server's link to the daemon: one gRPC channel, the caller's identity per call.

The MCP server keeps no state of its own: every tool call, resource read and
subscription is a call to the daemon. The channel is made by the SDK's
`stratad.sdk.connection.Connection` (address, TLS, the SDK's retry policy and
tracing), and a failed call becomes the `stratad.errors` class of its status
code with the daemon's reason, exactly as `stratad.AsyncClient` raises it
(`stratad.sdk.client.to_error`).

Unlike an `AsyncClient`, whose tenant and token are fixed when it is made, the
link takes the identity (tenant header and bearer token) with every call:
over streamable HTTP with ``--http-auth bearer`` each request brings its own
token, and one channel serves them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio

from stratad.api.v1 import (
    checkpoint_pb2_grpc,
    cognitive_pb2_grpc,
    crystal_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    task_pb2_grpc,
)
from stratad.errors import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    StratadError,
    UnauthenticatedError,
)
from stratad.sdk.client import channel_options, to_error
from stratad.sdk.connection import Connection

log = logging.getLogger("stratad.mcp")

R = TypeVar("R")


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """Who a call acts as: the ``x-stratad-tenant`` header and the bearer token.

    Empty values are not sent: the daemon then uses its default tenant (auth
    off) or the credential's own tenant (auth on).
    """

    tenant: str = ""
    token: str = ""

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return Connection("", tenant=self.tenant, token=self.token).metadata

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.token)


class DaemonLink:
    """The stubs of the services the MCP server uses, over one channel.

    Use as an async context manager inside the event loop that serves MCP
    (a grpc.aio channel belongs to the loop it was made in).
    """

    def __init__(self, connection: Connection, *, timeout: float = 30.0) -> None:
        self.connection = connection
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> DaemonLink:
        channel = self.connection.aio_channel(channel_options())
        self._channel = channel
        self.sessions = session_pb2_grpc.SessionServiceStub(channel)
        self.checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        self.tasks = task_pb2_grpc.TaskServiceStub(channel)
        self.cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
        self.crystals = crystal_pb2_grpc.CrystalServiceStub(channel)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def call(self, method: Callable[..., Awaitable[R]], request: Any, who: Identity) -> R:
        """One unary call as ``who``; a failure raises its `stratad.errors` class."""
        try:
            return await method(request, timeout=self.timeout, metadata=who.metadata)
        except grpc.RpcError as exc:
            # UNAVAILABLE because of a TLS mismatch: a message that names the fix.
            raise to_error(await self.connection.aio_explain(exc)) from None

    async def ensure_session(self, session_id: str, who: Identity) -> None:
        """Create the session unless it exists (the tools that start work do this)."""
        request = session_pb2.CreateSessionRequest(session_id=session_id)
        with contextlib.suppress(AlreadyExistsError):
            await self.call(self.sessions.CreateSession, request, who)

    async def watch(
        self, session_id: str, who: Identity, after: int | None = None
    ) -> AsyncIterator[session_pb2.SessionEvent]:
        """The session's events after version ``after`` (None: from now), for as long as
        the caller iterates.

        A daemon that goes away (or stops), or a watcher that fell behind, is
        watched again from the last version seen, with backoff up to 5 s, so
        no event is lost; the iteration ends when the session is deleted, does
        not exist, or may not be seen with these credentials.
        """
        backoff = 0.2
        while True:
            try:
                if after is None:  # "only new events", made a version to resume from
                    request = session_pb2.GetSessionRequest(session_id=session_id)
                    after = (
                        await self.call(self.sessions.GetSession, request, who)
                    ).session.version
                async for event in self._watch_once(session_id, who, after):
                    backoff = 0.2
                    after = max(after, event.version)
                    yield event
                # The stream ended: the session was deleted, or the daemon is stopping.
                request = session_pb2.GetSessionRequest(session_id=session_id)
                await self.call(self.sessions.GetSession, request, who)
            except (NotFoundError, UnauthenticatedError, PermissionDeniedError):
                return
            except ResourceExhaustedError as exc:
                if exc.reason != "WATCHER_TOO_SLOW":
                    raise
                resume = exc.metadata.get("resume_from_version", "")
                after = int(resume) if resume.isdigit() else after
                continue
            except StratadError as exc:
                if not _transient(exc):
                    log.warning("the watch of session %r ended: %s", session_id, exc)
                    return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _watch_once(
        self, session_id: str, who: Identity, after: int
    ) -> AsyncIterator[session_pb2.SessionEvent]:
        request = session_pb2.WatchSessionRequest(session_id=session_id, from_version=after)
        stream = self.sessions.WatchSession(request, metadata=who.metadata)
        try:
            async for response in stream:
                yield response.event
        except grpc.RpcError as exc:
            raise to_error(exc) from None
        finally:
            stream.cancel()


def _transient(error: StratadError) -> bool:
    return error.grpc_status in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN")


__all__ = ["DaemonLink", "Identity"]
