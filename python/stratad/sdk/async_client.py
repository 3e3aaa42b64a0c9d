"""`AsyncClient`: the asyncio twin of the SDK (its blocking twin is sdk/sync_client.py).

Owns the transport: the awaitable calls over a grpc.aio channel (`call`, the
channel, closing it) and `save_states`, whose ``requests`` may be an async
iterable. Its RPC methods are `AsyncMethods`' (sdk/_async_methods.py, the
one hand-written method layer, from which `Client`'s is generated). The
requests come from sdk/messages.py and failures are mapped by sdk/rpc.py, as
for `Client`, so the two twins differ only in how they call; see
sdk/client.py for the whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any

import grpc
import grpc.aio

from stratad.api.v1 import admin_pb2_grpc, checkpoint_pb2, checkpoint_pb2_grpc, session_pb2_grpc
from stratad.sdk._async_methods import AsyncMethods
from stratad.sdk.connection import Connection, TLSConfig
from stratad.sdk.messages import save_states_request
from stratad.sdk.rpc import channel_options, not_ready_error, to_error
from stratad.sdk.upload import Uploader

__all__ = ["AsyncClient"]


class AsyncClient(AsyncMethods):
    """The asyncio client: the same methods as `Client`, awaitable.

    Like any grpc.aio channel, it belongs to the event loop it was created in:
    create one per loop (per `asyncio.run`).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        tenant: str | None = None,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float = 30.0,
        chunked_uploads: bool = True,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self.connection = Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        self.address = self.connection.address
        self.tenant = self.connection.tenant
        self.timeout = timeout
        self._metadata = self.connection.metadata
        self._channel = self.connection.aio_channel(channel_options(max_message_bytes))
        self.sessions = session_pb2_grpc.SessionServiceStub(self._channel)
        self.checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(self._channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._uploader = Uploader() if chunked_uploads else None

    @classmethod
    def from_connection(cls, connection: Connection, **options: Any) -> AsyncClient:
        """A client for a resolved `Connection` (the environment is not read again)."""
        return cls(
            connection.address,
            tenant=connection.tenant,
            token=connection.token,
            tls=connection.tls or False,
            **options,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    @property
    def channel(self) -> grpc.aio.Channel:
        return self._channel

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call carries: the tenant header and the bearer token, when set."""
        return self._metadata

    async def call(
        self,
        method: Any,
        request: Any,
        timeout: float | None = None,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> Any:
        """As `Client.call`: ``metadata`` is sent as well as the client's own headers."""
        headers = (*self._metadata, *metadata)
        try:
            return await method(request, timeout=timeout or self.timeout, metadata=headers)
        except grpc.RpcError as exc:
            # UNAVAILABLE because of a TLS mismatch: a message that names the fix.
            raise to_error(await self.connection.aio_explain(exc)) from None

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """As `Client.wait_ready`: wait until the daemon accepts connections."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            tls = self.connection.tls
            raise await asyncio.to_thread(not_ready_error, self.address, tls) from None

    # -- the one RPC method of its own: ``requests`` may be async -------------------

    async def save_states(
        self,
        requests: Iterable[checkpoint_pb2.SaveStateRequest]
        | AsyncIterable[checkpoint_pb2.SaveStateRequest],
        timeout: float | None = None,
    ) -> AsyncIterator[checkpoint_pb2.SaveStatesResponse]:
        """As `Client.save_states`; ``requests`` may also be an async iterable."""
        stream = self.checkpoints.SaveStates(
            _stream_of(requests), timeout=timeout, metadata=self._metadata
        )
        try:
            async for response in stream:
                yield response
        except grpc.RpcError as exc:
            raise to_error(await self.connection.aio_explain(exc)) from None
        finally:
            stream.cancel()


def _stream_of(
    requests: Iterable[checkpoint_pb2.SaveStateRequest]
    | AsyncIterable[checkpoint_pb2.SaveStateRequest],
) -> Iterator[checkpoint_pb2.SaveStatesRequest] | AsyncIterator[checkpoint_pb2.SaveStatesRequest]:
    """The SaveStates stream of ``requests`` (grpc.aio takes either kind of iterator)."""
    if isinstance(requests, AsyncIterable):

        async def each() -> AsyncIterator[checkpoint_pb2.SaveStatesRequest]:
            async for request in requests:
                yield save_states_request(request)

        return each()
    return (save_states_request(request) for request in requests)
