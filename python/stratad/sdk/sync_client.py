"""`Client`: the blocking twin of the SDK (its asyncio twin is sdk/async_client.py).

Owns the blocking calls and their transport: a grpcio channel, and on a
plaintext connection the native HTTP/2 channel its unary calls go over
(sdk/native.py), and `save_states` (`AsyncClient`'s also takes an async
iterable). Its RPC methods are `SyncMethods`' (sdk/_sync_methods.py),
generated from `AsyncClient`'s (sdk/_async_methods.py) by ``make sdk-gen``:
edit those there, not here. The requests come from sdk/messages.py and
failures are mapped by sdk/rpc.py, as for `AsyncClient`; see sdk/client.py
for the whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

import grpc

from stratad import tracing
from stratad.api.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from stratad.sdk._sync_methods import SyncMethods
from stratad.sdk.connection import Connection, TLSConfig
from stratad.sdk.messages import save_states_request
from stratad.sdk.native import NativeUnaryChannel
from stratad.sdk.rpc import channel_options, not_ready_error, to_error
from stratad.sdk.upload import Uploader

__all__ = ["Client"]

S = TypeVar("S")


def _native_channel(connection: Connection, max_message_bytes: int) -> NativeUnaryChannel | None:
    """The native channel for unary calls, on a plaintext host:port or unix:
    address; None otherwise: TLS, an address form only grpcio resolves, or an
    application that traces (its CLIENT spans come from the instrumented
    grpcio channel, see stratad.tracing)."""
    if connection.tls is not None or tracing.client_tracer_provider() is not None:
        return None
    try:
        return NativeUnaryChannel(
            connection.address, max_message_bytes=max_message_bytes, explain=connection.explain
        )
    except ValueError:
        return None


class Client(SyncMethods):
    """A blocking client. Use as a context manager, or call close().

    ``address`` (``HOST:PORT`` or ``unix:/path``), ``tenant``, ``token`` (a
    bearer token) and ``tls`` (a `TLSConfig`, True or False) default to the
    STRATAD_* variables when None or empty; see `stratad.sdk.connection`.
    Safe to share between threads. On a plaintext connection its unary calls
    go over the native HTTP/2 client (`native_calls`; sdk/native.py), streams
    and TLS connections over grpcio.
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
        native_calls: bool = True,
    ) -> None:
        self.connection = Connection.resolve(address, tenant=tenant, token=token, tls=tls)
        self.address = self.connection.address
        self.tenant = self.connection.tenant
        self.timeout = timeout
        self._metadata = self.connection.metadata
        self._channel = self.connection.channel(channel_options(max_message_bytes))
        self._native = _native_channel(self.connection, max_message_bytes) if native_calls else None
        self.sessions = self._stub(session_pb2, session_pb2_grpc.SessionServiceStub)
        self.checkpoints = self._stub(checkpoint_pb2, checkpoint_pb2_grpc.CheckpointServiceStub)
        self.admin = self._stub(admin_pb2, admin_pb2_grpc.AdminServiceStub)
        self._uploader = Uploader() if chunked_uploads else None

    def _stub(self, module: Any, stub_class: Callable[[grpc.Channel], S]) -> S:
        """The service's stub: unary methods over the native channel when there is one."""
        stub = stub_class(self._channel)
        if self._native is None:
            return stub
        name = stub_class.__name__.removesuffix("Stub")
        return cast(S, self._native.stub(module.DESCRIPTOR.services_by_name[name], stub))

    @classmethod
    def from_connection(cls, connection: Connection, **options: Any) -> Client:
        """A client for a resolved `Connection` (the environment is not read again)."""
        return cls(
            connection.address,
            tenant=connection.tenant,
            token=connection.token,
            tls=connection.tls or False,
            **options,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()
        if self._native is not None:
            self._native.close()

    @property
    def channel(self) -> grpc.Channel:
        return self._channel

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call carries: the tenant header and the bearer token, when set."""
        return self._metadata

    def call(
        self,
        method: Any,
        request: Any,
        timeout: float | None = None,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> Any:
        """Invoke a unary stub method with deadline, tenant and token; map errors.

        ``metadata`` is sent as well as the client's own headers (e.g.
        ``[("x-request-id", "req-42")]``); passing ``metadata=`` to a stub method
        directly would replace them, tenant and token included."""
        headers = (*self._metadata, *metadata)
        try:
            return method(request, timeout=timeout or self.timeout, metadata=headers)
        except grpc.RpcError as exc:
            raise to_error(exc) from None

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the daemon accepts connections; after ``timeout`` seconds
        raise UnavailableError naming the setting to change when a TLS mismatch
        is the cause, else StratadError."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise not_ready_error(self.address, self.connection.tls) from None

    # -- the one RPC method of its own: ``requests`` may be async on AsyncClient ----

    def save_states(
        self, requests: Iterable[checkpoint_pb2.SaveStateRequest], timeout: float | None = None
    ) -> Iterator[checkpoint_pb2.SaveStatesResponse]:
        """Stream many saves; one response per request, in order (whole states)."""
        stream = self.checkpoints.SaveStates(
            (save_states_request(r) for r in requests),
            timeout=timeout,
            metadata=self._metadata,
        )
        try:
            yield from stream
        except grpc.RpcError as exc:
            raise to_error(self.connection.explain(exc)) from None
