"""Unary calls of the blocking `Client` over the native HTTP/2 client.

grpcio's blocking client spends ~175-250 µs of CPU per call on this kind of
machine; an agent that saves a checkpoint per step and waits for it pays that
on every step. On a plaintext connection, `Client` sends its unary calls
through `stratad._core.NativeChannel` instead (HTTP/2 in Rust, the wait
without the GIL) and keeps grpcio for streams and TLS. What callers see does
not change: the same messages, a failure raised as a `grpc.RpcError` with
code, details and trailing metadata (so `to_error` maps it), and the retry
policy of the grpcio channel (`UNAVAILABLE` before the daemon started
answering: up to 5 attempts, exponential backoff with jitter). A call waits
without the GIL but checks for signals every 50 ms (Ctrl-C interrupts it); a
forked child opens its own connection on its first call. A call that fails
UNAVAILABLE before reaching the daemon, all attempts spent, is handed to
``explain`` (the client's `Connection.explain`: a plaintext client on a TLS port
gets a message that names the fix).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor

from stratad import native

#: The retry policy of `channel_options` (sdk/rpc.py), for the native path.
MAX_ATTEMPTS = 5
INITIAL_BACKOFF = 0.05
MAX_BACKOFF = 2.0
BACKOFF_MULTIPLIER = 2.0
#: What a call without a timeout waits for (grpc's "no deadline").
NO_DEADLINE = 365 * 86400.0

_STATUS = {code.value[0]: code for code in grpc.StatusCode}
#: Channels a forked child inherited from its parent: kept, never dropped.
_LEFT_BY_FORK: list[native.NativeChannel] = []


class NativeRpcError(grpc.RpcError):  # type: ignore[misc]
    """A failed native call, shaped like grpcio's (code, details, trailers)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        trailers: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._trailers = code, details, tuple(trailers)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._trailers

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()


class NativeUnaryChannel:
    """One HTTP/2 connection to a daemon for unary calls (safe to share
    between threads; they share the connection)."""

    def __init__(
        self,
        address: str,
        *,
        max_message_bytes: int,
        explain: Callable[[grpc.RpcError], grpc.RpcError] | None = None,
    ) -> None:
        # As channel_options: the daemon's limit plus room for the envelope.
        self._limit = max_message_bytes + (1 << 20)
        self._address = address
        self._explain = explain
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._channel: native.NativeChannel | None = self._connect()

    def _connect(self) -> native.NativeChannel:
        return native.NativeChannel(self._address, max_receive_bytes=self._limit)

    def close(self) -> None:
        """Close the connection; later calls raise ValueError, as grpcio's do."""
        with self._lock:
            self._channel = None

    def _current(self) -> native.NativeChannel:
        """The channel of this process: a forked child gets its own connection."""
        channel = self._channel
        if channel is None:
            raise ValueError("Cannot invoke RPC on closed channel!")
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid() and self._channel is not None:
                    # The parent's connection is shared with the parent: never
                    # used or closed here (closing would unregister its socket
                    # from the parent's poller too).
                    _LEFT_BY_FORK.append(self._channel)
                    self._channel, self._pid = self._connect(), os.getpid()
                channel = self._channel
            if channel is None:
                raise ValueError("Cannot invoke RPC on closed channel!")
        return channel

    def stub(self, service: ServiceDescriptor, grpc_stub: Any) -> NativeStub:
        return NativeStub(self, service, grpc_stub)

    def call(
        self,
        path: str,
        request: Any,
        decode: Callable[[bytes], Any],
        timeout: float | None,
        metadata: Sequence[tuple[str, str | bytes]] | None,
    ) -> Any:
        channel = self._current()
        payload = request.SerializeToString()
        if len(payload) > self._limit:
            raise NativeRpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(payload)} vs. {self._limit})",
            )
        deadline = time.monotonic() + (NO_DEADLINE if timeout is None else timeout)
        items = list(metadata or ())
        backoff = INITIAL_BACKOFF
        for attempt in range(1, MAX_ATTEMPTS + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            response, code, details, trailers, committed = channel.unary(
                path, payload, items, remaining
            )
            if code == 0:
                return _decoded(response, decode)
            status = _STATUS.get(code, grpc.StatusCode.UNKNOWN)
            if status != grpc.StatusCode.UNAVAILABLE or committed:
                raise NativeRpcError(status, details, trailers)
            if attempt == MAX_ATTEMPTS:
                # Never reached the daemon: a TLS port, say, which the error can name.
                error = NativeRpcError(status, details, trailers)
                raise error if self._explain is None else self._explain(error)
            # Did not reach the daemon: wait (with jitter, as grpc does) and retry.
            time.sleep(min(random.uniform(0, backoff), max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * BACKOFF_MULTIPLIER, MAX_BACKOFF)
        raise NativeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def _decoded(response: bytes | None, decode: Callable[[bytes], Any]) -> Any:
    """The response message of an OK call; a broken one fails as grpcio's would."""
    if response is None:
        raise NativeRpcError(grpc.StatusCode.INTERNAL, "OK without a response message")
    try:
        return decode(response)
    except Exception as exc:
        raise NativeRpcError(
            grpc.StatusCode.INTERNAL, f"Exception deserializing response: {exc}"
        ) from exc


class UnaryMethod:
    """One unary method, called as a grpcio stub's method is:
    ``method(request, timeout=..., metadata=...)``. Its ``future`` and
    ``with_call`` are the grpcio method's (asynchronous calls, initial
    metadata), so code written against grpcio stubs keeps working."""

    __slots__ = ("_channel", "_decode", "_path", "future", "with_call")

    def __init__(
        self,
        channel: NativeUnaryChannel,
        path: str,
        decode: Callable[[bytes], Any],
        grpc_method: Any,
    ) -> None:
        self._channel, self._path, self._decode = channel, path, decode
        self.future = grpc_method.future
        self.with_call = grpc_method.with_call

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
    ) -> Any:
        return self._channel.call(self._path, request, self._decode, timeout, metadata)


class NativeStub:
    """A service's stub whose unary methods go over the native channel; its
    streaming methods are the grpcio stub's own."""

    def __init__(self, channel: NativeUnaryChannel, service: ServiceDescriptor, grpc_stub: Any):
        for method in service.methods:
            if method.client_streaming or method.server_streaming:
                setattr(self, method.name, getattr(grpc_stub, method.name))
                continue
            response = message_factory.GetMessageClass(method.output_type)
            path = f"/{service.full_name}/{method.name}"
            grpc_method = getattr(grpc_stub, method.name)
            setattr(self, method.name, UnaryMethod(channel, path, response.FromString, grpc_method))

    def __getattr__(self, name: str) -> Any:  # for type checkers: methods are set above
        raise AttributeError(name)
