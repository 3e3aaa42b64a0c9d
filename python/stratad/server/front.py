"""The native front door: HTTP/2 and gRPC framing in Rust for every call.

Python's grpc.aio spends about as much CPU on each call's HTTP/2 and gRPC
framing as stratad spends on the save itself, under the same GIL
(docs/benchmarks.md). With ``front = native`` (the default without TLS) the
daemon's listeners, TCP and unix socket, are served by
`stratad.native.NativeFront` (rust/stratad-front) and there is no grpc.aio
server at all:

- every method of every shape (unary, client, server and bidi streaming;
  stratad's services, health, reflection) is served natively: the Rust
  server reads the request messages (decompressing gzip and deflate) and
  queues them, and the first event after a quiet spell writes a byte to a
  socket the event loop watches; the loop then takes every queued event at
  once and runs the *same* handler grpc.aio would run, through the same
  interceptors (auth, limits, metrics, request log, error mapping), with a
  `FrontContext` in place of grpc.aio's ServicerContext; the encoded answers
  and status go back to Rust;
- no call is forwarded anywhere, so no client's call shares a connection
  with another client's (a client that stops reading holds up only its own
  calls), and the Rust side ends every call at its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from cryptography import x509
from cryptography.x509.oid import NameOID

from stratad.errors import ResourceExhaustedError
from stratad.native import NativeFront
from stratad.server.tls import CertificateFiles

_log = logging.getLogger(__name__)

#: Event kinds of NativeFront.take_events (rust/stratad-front/src/call.rs).
STARTED, MESSAGE, REQUESTS_ENDED, CANCELLED = 0, 1, 2, 3
#: Request messages of a stream read ahead of the handler. Each is decoded,
#: and so charged to the in-flight budget (server/limits.py), as it arrives,
#: as grpc.aio's reads are: read-ahead stays within max_inflight_bytes. With
#: 2, a SaveStates stream of 8 KB saves was fed one message per round trip to
#: the HTTP/2 thread; with 16 its batches fill up (bench/checkpoints.py (b)).
STREAM_PREFETCH = 16


def peer_of(context: Any) -> str:
    """The caller's address as grpc writes it (``ipv4:127.0.0.1:5000``,
    ``unix:/path``); "" for a context without one (tests, a call gone)."""
    try:
        return str(context.peer())
    except Exception:
        return ""


def certificate_auth_context(der: bytes) -> dict[str, list[bytes]]:
    """grpc.aio's auth_context keys for a verified client certificate (DER):
    its subject alternative names (DNS, URI, email, IP) and common name."""
    certificate = x509.load_der_x509_certificate(der)
    sans: list[bytes] = []
    with contextlib.suppress(x509.ExtensionNotFound):
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        for kind in (x509.DNSName, x509.UniformResourceIdentifier, x509.RFC822Name):
            sans += [str(n).encode() for n in names.get_values_for_type(kind)]
        sans += [str(ip).encode() for ip in names.get_values_for_type(x509.IPAddress)]
    common = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return {
        "transport_security_type": [b"ssl"],
        "x509_subject_alternative_name": sans,
        "x509_common_name": [str(a.value).encode() for a in common],
    }


class MethodRecorder:
    """Passed to the generated ``add_*_to_server`` functions in place of a
    grpc.aio server: notes every registered method's handler for the front
    door, and hands everything on to ``server`` if there is one (grpc.aio,
    with ``front = python``), so that both serve a method with the very same
    handler object (the interceptors cache their wrappers by it).

    Generated code registers each service twice, as a generic handler and as
    registered method handlers; the front door serves the latter, so a
    service must be added with ``add_registered_method_handlers``."""

    def __init__(self, server: Any = None) -> None:
        self._server = server
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: set[str] = set()

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        for handler in handlers:
            service_name = getattr(handler, "service_name", None)
            if callable(service_name):
                self._generic.add(str(service_name()))
        if self._server is not None:
            self._server.add_generic_rpc_handlers(handlers)

    def generic_only(self) -> list[str]:
        """Services added as generic handlers alone: the front door cannot serve them."""
        registered = {method.split("/")[1] for method in self.handlers}
        return sorted(self._generic - registered)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        if self._server is not None:
            self._server.add_registered_method_handlers(service, handlers)
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler


def native_methods(handlers: dict[str, grpc.RpcMethodHandler]) -> list[tuple[str, bool]]:
    """The methods served, each with whether its requests are a stream.

    Those whose handler is a coroutine or async generator function, as every
    stratad handler is: the front door runs handlers on the event loop only.
    A plain function is a servicer's "not implemented" default (grpc.aio
    health's List, from the generated base class): left out, so it is
    UNIMPLEMENTED, as its body would say."""
    methods = []
    for method, handler in handlers.items():
        behavior = _behavior(handler)
        if inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior):
            methods.append((method, bool(handler.request_streaming)))
        else:
            _log.debug("%s has no async handler: not served", method)
    return methods


def _behavior(handler: grpc.RpcMethodHandler) -> Any:
    """The function that serves ``handler``'s calls, whatever their shape."""
    if handler.request_streaming:
        return handler.stream_stream if handler.response_streaming else handler.stream_unary
    return handler.unary_stream if handler.response_streaming else handler.unary_unary


@dataclass(frozen=True)
class _CallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    method: str
    invocation_metadata: tuple[tuple[str, Any], ...]


class FrontContext:
    """What a handler and the interceptors use of grpc.aio's ServicerContext,
    for a call of the native front door."""

    def __init__(self, active: _Active) -> None:
        self._active = active
        self._call = active.call
        self._metadata: tuple[tuple[str, Any], ...] | None = None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailers: tuple[tuple[str, Any], ...] = ()
        self._done = False
        self._cancelled = False
        self._compress_next = True
        self._auth: dict[str, list[bytes]] | None = None
        #: The response serializer, once the handler is known.
        self.serialize: Callable[[Any], bytes] | None = None
        #: Answered OK by `answer_early` before the handler returned.
        self.answered = False

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        if self._metadata is None:
            self._metadata = self._call.metadata
        return self._metadata

    def peer(self) -> str:
        return str(self._call.peer)

    def peer_identities(self) -> list[bytes] | None:
        """The verified client certificate's names (SANs, else its CN), as grpc.aio gives them."""
        auth = self.auth_context()
        names = auth.get("x509_subject_alternative_name") or auth.get("x509_common_name")
        return list(names) if names else None

    def peer_identity_key(self) -> str | None:
        if not self.auth_context():
            return None
        sans = self.auth_context().get("x509_subject_alternative_name")
        return "x509_subject_alternative_name" if sans else "x509_common_name"

    def auth_context(self) -> dict[str, list[bytes]]:
        """What grpc.aio's auth_context holds of a TLS client: with mTLS, the
        names of the certificate the handshake verified; {} without one."""
        if self._auth is None:
            certificate = self._call.peer_certificate
            self._auth = {} if certificate is None else certificate_auth_context(certificate)
        return self._auth

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

    async def send_initial_metadata(self, initial_metadata: Sequence[tuple[str, Any]]) -> None:
        self._call.send_headers(list(initial_metadata))

    def set_compression(self, compression: grpc.Compression) -> None:
        """Compress the answers (gzip or deflate, whichever the client accepts)."""
        self._call.set_compression(compression != grpc.Compression.NoCompression)

    def disable_next_message_compression(self) -> None:
        self._compress_next = False

    def reserve_answer(self, size: int) -> None:
        """Hold ``size`` bytes of the answer budget for an answer about to be built
        (rust/stratad-front/src/answers.rs), until it is handed over; raises
        ResourceExhaustedError when this connection's unread answers and
        answers being built already hold its share. Safe from any thread."""
        refused = self._call.reserve_answer(size)
        if refused is not None:
            raise ResourceExhaustedError(refused)

    def request_compressed(self) -> bool:
        """Whether the request message last read arrived compressed (not in grpc.aio)."""
        return self._active.last_compressed

    async def write(self, message: Any) -> None:
        """Send one response message (a handler that writes instead of yielding)."""
        serialize = self.serialize
        data = serialize(message) if serialize is not None else message
        compress, self._compress_next = self._compress_next, True
        if not self._call.send(data, compress):
            raise asyncio.CancelledError  # the call is over: stop the handler

    async def read(self) -> Any:
        """The next request message of a stream, or grpc.aio.EOF after the last."""
        return await self._active.next_request()

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
    """A call being served: its task, and for a request stream the requests
    arrived (decoded on arrival by `decode`, the handler's request
    deserializer, once it is known)."""

    __slots__ = ("call", "context", "decode", "inbox", "last_compressed", "pulled", "task")

    def __init__(self, call: Any, compressed: bool) -> None:
        self.call = call
        self.task: asyncio.Task[None] | None = None
        self.context: FrontContext | None = None
        self.inbox: asyncio.Queue[Any] | None = asyncio.Queue() if call.request_streaming else None
        self.decode: Callable[[bytes], Any] | None = None
        self.last_compressed = compressed
        self.pulled = False

    def arrived(self, message: bytes, compressed: bool) -> None:
        """A request message of this stream: decode it now and queue it."""
        assert self.inbox is not None, "only a request stream gets messages"
        try:
            item = self.decode(message) if self.decode is not None else message
        except Exception as exc:  # raised to the handler where it reads this item
            item = _Undecoded(exc)
        self.inbox.put_nowait((item, compressed))

    async def next_request(self) -> Any:
        """The next request of the stream (grpc.aio.EOF after the last); the
        first call asks for STREAM_PREFETCH of them, each later one for one more."""
        assert self.inbox is not None, "only a request stream has requests to read"
        if not self.pulled:
            self.pulled = True
            for _ in range(STREAM_PREFETCH):
                self.call.pull()
        entry = await self.inbox.get()
        if entry is None:
            self.inbox.put_nowait(None)  # every later read is EOF too
            return grpc.aio.EOF
        self.call.pull()
        item, self.last_compressed = entry
        if isinstance(item, _Undecoded):
            raise item.error
        return item

    async def requests(self) -> AsyncIterator[Any]:
        while (item := await self.next_request()) is not grpc.aio.EOF:
            yield item


class _Undecoded:
    """A request whose deserializer raised: `next_request` raises it in its place."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class FrontDoor:
    """Serves the calls of a `NativeFront` on the event loop."""

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
    def ports(self) -> list[int]:
        """The port of each listener, in the order given (0 for a unix socket)."""
        return list(self._native.ports)

    @property
    def answer_bytes(self) -> int:
        """Answer bytes not yet written to their clients' sockets."""
        return int(self._native.answer_bytes)

    @property
    def tls_reloads(self) -> int:
        """How many times changed TLS files were loaded (0 without TLS)."""
        return int(self._native.tls_reloads)

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
        for kind, call, message, compressed in self._native.take_events():
            if kind == STARTED:
                active = _Active(call, compressed)
                self._calls[call.id] = active
                active.task = self._loop.create_task(self._serve(active, message))
                continue
            found = self._calls.get(call.id)
            if found is None:
                continue
            if kind == MESSAGE and found.inbox is not None:
                found.arrived(message, compressed)
            elif kind == REQUESTS_ENDED and found.inbox is not None:
                found.inbox.put_nowait(None)
            elif kind == CANCELLED and found.task is not None:
                if found.context is not None:
                    found.context._cancelled = True
                found.task.cancel()

    async def _serve(self, active: _Active, message: bytes | None) -> None:
        call = active.call
        context = active.context = FrontContext(active)
        try:
            handler = await self._handler(call.method, context)
            if handler is None:
                call.finish(None, grpc.StatusCode.UNIMPLEMENTED.value[0], "Method not found!")
            else:
                await self._run(handler, active, message, context)
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

    async def _run(
        self, handler: Any, active: _Active, message: bytes | None, context: FrontContext
    ) -> None:
        """Run ``handler`` as grpc.aio would for its shape, and answer."""
        serialize = context.serialize = handler.response_serializer
        if handler.request_streaming:
            active.decode = handler.request_deserializer
            request: Any = active.requests()
        else:
            deserialize = handler.request_deserializer
            request = deserialize(message) if deserialize is not None else message
        behavior = _behavior(handler)
        if not handler.response_streaming:
            response = await behavior(request, context)
            if context.answered:
                context.finish(None)
                return
            context.finish(serialize(response) if serialize is not None else response)
            return
        if inspect.isasyncgenfunction(behavior):
            async for response in behavior(request, context):
                await context.write(response)
        else:  # a coroutine that answers with context.write (health's Watch)
            await behavior(request, context)
        context.finish(None)


@dataclass(frozen=True)
class EdgeLimits:
    """What one client may hold of the front door (docs/security.md)."""

    max_connections: int
    max_streams_per_connection: int
    idle_timeout: float
    max_header_bytes: int
    #: Answers not yet read by their clients (0: no limit).
    max_answer_bytes: int


def start_front(
    listen: Sequence[str],
    handlers: dict[str, grpc.RpcMethodHandler],
    interceptors: Sequence[Any],
    *,
    max_message_bytes: int,
    max_concurrent_calls: int,
    limits: EdgeLimits,
    tls: CertificateFiles | None = None,
    worker_threads: int = 1,
) -> FrontDoor:
    """Bind every ``listen`` address (``host:port``) with the native front
    door, with TLS from ``tls``'s files (which it reads again when they
    change); raises OSError if it cannot.

    One HTTP/2 thread by default: its work per call is a fraction of the
    Python handler's, and measured on 2 cores (bench/front.py's load) one
    thread served as many calls as two with ~10% less CPU per call."""
    native = NativeFront(
        list(listen),
        native_methods(handlers),
        max_message_bytes=max_message_bytes,
        max_concurrent_calls=max_concurrent_calls,
        worker_threads=worker_threads,
        max_connections=limits.max_connections,
        max_streams_per_connection=limits.max_streams_per_connection,
        idle_timeout=limits.idle_timeout,
        max_header_bytes=limits.max_header_bytes,
        max_answer_bytes=limits.max_answer_bytes,
        tls_cert_file=tls.cert_file if tls is not None else None,
        tls_key_file=tls.key_file if tls is not None else None,
        tls_client_ca_file=(tls.client_ca_file or None) if tls is not None else None,
    )
    return FrontDoor(native, handlers, interceptors, asyncio.get_running_loop())


__all__ = [
    "EdgeLimits",
    "FrontContext",
    "FrontDoor",
    "MethodRecorder",
    "native_methods",
    "peer_of",
    "start_front",
]
