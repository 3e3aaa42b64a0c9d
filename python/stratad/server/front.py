"""The native front door: HTTP/2 and gRPC framing in Rust for the hot calls.

Python's grpc.aio spends about as much CPU on each call's HTTP/2 and gRPC
framing as stratad spends on the save itself, under the same GIL
(docs/benchmarks.md). With ``front = native`` the daemon's TCP port is served
by `stratad.native.NativeFront` (rust/stratad-front) instead:

- every unary and bidi-streaming method of stratad's own services is served
  natively: the Rust server reads the request messages and queues them, and
  the first event after a quiet spell writes a byte to a socket the event
  loop watches; the loop then takes every queued event at once and runs the
  *same* handler grpc.aio would run, through the same interceptors (auth,
  limits, metrics, request log, error mapping), with a `FrontContext` in
  place of grpc.aio's ServicerContext; the encoded answer and status go back
  to Rust;
- every other call (health, reflection, server streams, compressed calls) is
  forwarded unchanged to the daemon's grpc.aio server, which listens on a
  private unix socket only; the real caller's address travels with it in
  metadata that only the front door can set (`forwarded_peer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from stratad.native import NativeFront

_log = logging.getLogger(__name__)

#: Event kinds of NativeFront.take_events (rust/stratad-front/src/call.rs).
STARTED, MESSAGE, REQUESTS_ENDED, CANCELLED = 0, 1, 2, 3
#: Request messages of a stream read ahead of the handler. Each is decoded,
#: and so charged to the in-flight budget (server/limits.py), as it arrives,
#: as grpc.aio's reads are: read-ahead stays within max_inflight_bytes. With
#: 2, a SaveStates stream of 8 KB saves was fed one message per round trip to
#: the HTTP/2 thread; with 16 its batches fill up (bench/checkpoints.py (b)).
STREAM_PREFETCH = 16
#: Metadata set by the front door on forwarded calls (rust/stratad-front/src/proxy.rs).
PEER_HEADER = "x-stratad-front-peer"
KEY_HEADER = "x-stratad-front-key"
#: The key the running front door puts in KEY_HEADER (one per process start).
_front_key = secrets.token_hex(16)


def forwarded_peer(context: Any) -> str:
    """The caller's address: for a call the front door forwarded, the address
    it came from (not the private socket's); else ``context.peer()``."""
    try:
        peer = str(context.peer())
    except Exception:  # a context without a peer (tests, a call gone)
        return ""
    if not peer.startswith("unix:"):
        return peer
    metadata = dict(context.invocation_metadata() or ())
    if metadata.get(KEY_HEADER) == _front_key and PEER_HEADER in metadata:
        return str(metadata[PEER_HEADER])
    return peer


class FrontBackend:
    """The private unix socket the grpc.aio server listens on behind the front
    door, in a fresh directory only this user may enter."""

    def __init__(self) -> None:
        self._directory = tempfile.mkdtemp(prefix="stratad-front-")  # mode 0700
        self.path = f"{self._directory}/grpc.sock"
        self.address = f"unix:{self.path}"

    def remove(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)


class MethodRecorder:
    """Passed to the generated ``add_*_to_server`` functions in place of the
    grpc.aio server: hands everything on to it and notes every registered
    method's handler, so that the front door and grpc.aio serve a method with
    the very same handler object (the interceptors cache their wrappers by it)."""

    def __init__(self, server: Any) -> None:
        self._server = server
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        self._server.add_registered_method_handlers(service, handlers)
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def native_methods(
    handlers: dict[str, grpc.RpcMethodHandler],
) -> tuple[list[str], list[str]]:
    """(unary, bidi stream) methods the front door serves itself: those whose
    handler is a coroutine / async generator function, as stratad's are."""
    unary, streams = [], []
    for method, handler in handlers.items():
        if handler.unary_unary is not None and inspect.iscoroutinefunction(handler.unary_unary):
            unary.append(method)
        elif handler.stream_stream is not None and inspect.isasyncgenfunction(
            handler.stream_stream
        ):
            streams.append(method)
    return unary, streams


@dataclass(frozen=True)
class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    method: str
    invocation_metadata: tuple[tuple[str, Any], ...]


class FrontContext:
    """What a handler and the interceptors use of grpc.aio's ServicerContext,
    for a call of the native front door."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._metadata: tuple[tuple[str, Any], ...] | None = None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailers: tuple[tuple[str, Any], ...] = ()
        self._done = False
        self._cancelled = False
        #: Answered OK by `answer_early` before the handler returned.
        self.answered = False

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        if self._metadata is None:
            self._metadata = self._call.metadata
        return self._metadata

    def peer(self) -> str:
        return str(self._call.peer)

    def peer_identities(self) -> None:
        return None  # plaintext only: no certificates

    def peer_identity_key(self) -> None:
        return None

    def auth_context(self) -> dict[str, Any]:
        return {}

    def time_remaining(self) -> float | None:
        remaining = self._call.time_remaining()
        return None if remaining is None else float(remaining)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, Any]]) -> None:
        self._trailers = tuple(trailing_metadata)

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._trailers

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if code == grpc.StatusCode.OK:
            _log.error("abort() called with StatusCode.OK; returning UNKNOWN")
            code = grpc.StatusCode.UNKNOWN
        self._code, self._details = code, details
        if trailing_metadata:
            self._trailers = tuple(trailing_metadata)
        raise grpc.aio.AbortError()

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return self._cancelled

    def answer_early(self, response: bytes) -> None:
        """Answer OK with ``response`` now, before the handler returns; callable
        from any thread (the group committer calls it once a save is durable:
        store/commit.py). The handler's own answer is then not sent."""
        if self._call.finish(response, grpc.StatusCode.OK.value[0], "", []):
            self.answered = True

    def finish(self, response: bytes | None) -> None:
        """Send the answer: ``response`` (if any) and the status set on this context."""
        self._done = True
        code = self._code or grpc.StatusCode.OK
        if self.answered:
            if code != grpc.StatusCode.OK:  # nothing may fail once a write is durable
                _log.error("%s answered OK, then ended with %s", self._call.method, code.name)
            return
        self._call.finish(response, code.value[0], self._details, list(self._trailers))


class _Active:
    """A call being served: its task, and for a stream the requests arrived."""

    __slots__ = ("call", "context", "decode", "inbox", "task")

    def __init__(self, call: Any) -> None:
        self.call = call
        self.task: asyncio.Task[None] | None = None
        self.context: FrontContext | None = None
        # Only streams get requests after the start: decoded on arrival (by
        # `decode`, the handler's request deserializer, once it is known).
        self.inbox: asyncio.Queue[Any] | None = None if call.unary else asyncio.Queue()
        self.decode: Callable[[bytes], Any] | None = None

    def arrived(self, message: bytes) -> None:
        """A request message of this stream: decode it now and queue it."""
        assert self.inbox is not None, "only a stream gets messages"
        try:
            item = self.decode(message) if self.decode is not None else message
        except Exception as exc:  # raised to the handler where it reads this item
            item = _Undecoded(exc)
        self.inbox.put_nowait(item)


class _Undecoded:
    """A request whose deserializer raised: `_requests` raises it in its place."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class FrontDoor:
    """Serves the native methods of a `NativeFront` on the event loop."""

    def __init__(
        self,
        native: Any,
        handlers: dict[str, grpc.RpcMethodHandler],
        interceptors: Sequence[Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._native = native
        self._handlers = handlers
        self._interceptors = tuple(interceptors)
        # When every interceptor wraps by method alone (`per_method`), the
        # chain's result is cached per method instead of awaited per call.
        self._per_method = all(getattr(i, "per_method", False) for i in self._interceptors)
        self._chains: dict[str, Any] = {}
        self._loop = loop
        self._calls: dict[int, _Active] = {}
        self._wake_fd = native.wake_fd
        loop.add_reader(self._wake_fd, self._on_wake)

    @property
    def port(self) -> int:
        return int(self._native.port)

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; give calls in progress up to ``grace`` seconds; close."""
        # On a thread: the loop keeps serving the calls in progress meanwhile.
        await asyncio.to_thread(self._native.shutdown, 0.0 if grace is None else grace)
        self._loop.remove_reader(self._wake_fd)
        for active in list(self._calls.values()):
            if active.task is not None:
                active.task.cancel()

    # --- on the event loop -------------------------------------------------------------

    def _on_wake(self) -> None:
        """Events are queued: take them all (one wake-up serves every call
        that arrived meanwhile)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_fd, 4096)  # first, so a later byte means a later event
        events = self._native.take_events()
        for kind, call, message in events:
            if kind == STARTED:
                active = _Active(call)
                self._calls[call.id] = active
                active.task = self._loop.create_task(self._serve(active, message))
                continue
            found = self._calls.get(call.id)
            if found is None:
                continue
            if kind == MESSAGE and found.inbox is not None:
                found.arrived(message)
            elif kind == REQUESTS_ENDED and found.inbox is not None:
                found.inbox.put_nowait(None)
            elif kind == CANCELLED and found.task is not None:
                if found.context is not None:
                    found.context._cancelled = True
                found.task.cancel()

    async def _serve(self, active: _Active, message: bytes | None) -> None:
        call = active.call
        context = active.context = FrontContext(call)
        try:
            handler = await self._handler(call.method, context)
            if handler is None:
                call.finish(None, grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!")
            elif call.unary:
                await self._serve_unary(handler, message, context)
            else:
                await self._serve_stream(handler, active, context)
        except grpc.aio.AbortError:
            context.finish(None)
        except asyncio.CancelledError:
            pass  # the client left or its deadline passed: Rust answered already
        except Exception as exc:  # what grpc.aio answers for an escaped exception
            _log.exception("unexpected error in %s", call.method)
            call.finish(None, grpc.StatusCode.UNKNOWN.value[0], f"Unexpected {type(exc)}: {exc}")
        finally:
            self._calls.pop(call.id, None)

    async def _handler(self, method: str, context: FrontContext) -> Any:
        """The method's handler wrapped by the interceptors, as grpc.aio builds it."""
        if self._per_method:
            chain = self._chains.get(method)
            if chain is not None:
                return chain
        details = _CallDetails(method, context.invocation_metadata())
        chain = await self._intercept(0, details)
        # Only registered methods: a client inventing names must not grow this.
        if self._per_method and method in self._handlers:
            self._chains[method] = chain
        return chain

    async def _intercept(self, index: int, details: _CallDetails) -> Any:
        if index == len(self._interceptors):
            return self._handlers.get(details.method)
        continuation = functools.partial(self._intercept, index + 1)
        return await self._interceptors[index].intercept_service(continuation, details)

    async def _serve_unary(
        self, handler: Any, message: bytes | None, context: FrontContext
    ) -> None:
        deserialize = handler.request_deserializer
        request = deserialize(message) if deserialize is not None else message
        response = await handler.unary_unary(request, context)
        if context.answered:
            context.finish(None)
            return
        serialize = handler.response_serializer
        context.finish(serialize(response) if serialize is not None else response)

    async def _serve_stream(self, handler: Any, active: _Active, context: FrontContext) -> None:
        serialize = handler.response_serializer
        call = active.call
        async for response in handler.stream_stream(self._requests(handler, active), context):
            call.send(serialize(response) if serialize is not None else response)
        context.finish(None)

    async def _requests(self, handler: Any, active: _Active) -> AsyncIterator[Any]:
        active.decode = handler.request_deserializer
        inbox = active.inbox
        assert inbox is not None, "a stream's _Active has an inbox"
        for _ in range(STREAM_PREFETCH):
            active.call.pull()
        while True:
            item = await inbox.get()
            if item is None:
                return
            active.call.pull()
            if isinstance(item, _Undecoded):
                raise item.error
            yield item


def start_front(
    listen: str,
    backend_socket: str,
    handlers: dict[str, grpc.RpcMethodHandler],
    interceptors: Sequence[Any],
    *,
    max_message_bytes: int,
    max_concurrent_calls: int,
    worker_threads: int = 1,
) -> FrontDoor:
    """Bind ``listen`` with the native front door (raises OSError if it cannot).

    One HTTP/2 thread by default: its work per call is a fraction of the
    Python handler's, and measured on 2 cores (bench/front.py's load) one
    thread served as many calls as two with ~10% less CPU per call."""
    unary, streams = native_methods(handlers)
    native = NativeFront(
        listen,
        backend_socket,
        unary,
        streams,
        max_message_bytes=max_message_bytes,
        max_concurrent_calls=max_concurrent_calls,
        front_key=_front_key,
        worker_threads=worker_threads,
    )
    return FrontDoor(native, handlers, interceptors, asyncio.get_running_loop())


__all__ = [
    "FrontBackend",
    "FrontContext",
    "FrontDoor",
    "MethodRecorder",
    "forwarded_peer",
    "native_methods",
    "start_front",
]
