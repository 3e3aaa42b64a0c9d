"""Admission control: a memory budget for the requests being processed.

A request costs the daemon several times its size while it is served: gRPC
keeps the raw bytes until the call ends, the decoded message holds a second
copy, the state taken out of it a third, then come its chunks (kept until
they are appended to a pack) and the journal record that carries them.
A 60 MiB save of incompressible data peaks at about 5 times its size over the
idle daemon (bench/memory.py, docs/limits.md), hence `MEMORY_FACTOR` with
some margin.
`InflightBudget` bounds the sum of those charges (``max_inflight_bytes``).

Where bytes are counted: in the request deserializer, the first point where
Python learns a request's size, before the message is decoded. A request
that does not fit is never decoded: the deserializer returns an
`UndecodableRequest` carrying RESOURCE_EXHAUSTED (reason OVERLOADED), which
`ErrorInterceptor` turns into the call's status (in a request stream, the
status that ends the stream once the items before it have their answers).
A chunked upload (compressed frames) declares the size of the state they
make up: the daemon decodes every chunk and joins them once to check the
state's digest, so once decoded it is charged `DECODED_FACTOR` times that
size on top (measured: a 60 MiB state sent as 12 MiB of frames peaks at
4 x 12 + 2 x 60 MiB).

How long a charge lasts: a unary request holds it until its call ends. An
item of a `SaveStates` stream (one answer per item, in order) holds it from
its arrival until its answer is produced, so a stream may go on for ever
within the budget; the items of other request streams hold theirs until the
call ends. A charge is also released if its request is dropped without being
handled (a call cancelled in between), so the budget cannot leak.

A request arriving when nothing else is in flight is always admitted, even
if its charge alone is over the budget: the largest message allowed must
always be servable. Memory then reaches one request's charge.

What the budget does not cover: the bytes gRPC's transport holds for
messages still arriving (at most ``max_concurrent_rpcs`` calls, each up to
its message size), and responses (a LoadState of a large state).

Install `LimitsInterceptor` first, before `ErrorInterceptor` (which then
sees plain messages) and `RequestInterceptor` (which then observes refusals
like any other status).
"""

from __future__ import annotations

import collections
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any

import grpc
import grpc.aio

from stratad.api.v1 import checkpoint_pb2
from stratad.errors import ResourceExhaustedError
from stratad.server.interceptors import HandlerCache, UndecodableRequest

Behavior = Callable[[Any, Any], Any]
Continuation = Callable[[Any], Awaitable[Any]]

#: A request is charged this many times its size (measured: 4.7 to 5.1 for a 60 MiB
#: save of incompressible data, the worst case; see docs/limits.md).
MEMORY_FACTOR = 6
#: A chunked upload is charged this many times the state size it declares, on top.
DECODED_FACTOR = 2
#: Request-streaming methods that answer each item, in order: an item's
#: charge ends with its answer. (Other request streams hold theirs to the end.)
ONE_ANSWER_PER_ITEM = frozenset({"/stratad.api.v1.CheckpointService/SaveStates"})
#: Never charged: an overloaded daemon is alive, and probes that said
#: otherwise would get it restarted, losing the work in flight.
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)


class InflightBudget:
    """Bytes admitted and not yet released, against a limit. Thread-safe."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError("an in-flight budget needs a positive limit")
        self.limit = limit
        self._in_use = 0
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        return self._in_use

    def try_acquire(self, charge: int, *, holding: int = 0) -> bool:
        """Take `charge` bytes if they fit, or if nothing else is in flight.

        `holding`: what the caller holds already (a request charged again once
        decoded), which does not count as something else.
        """
        with self._lock:
            if self._in_use > holding and self._in_use + charge > self.limit:
                return False
            self._in_use += charge
            return True

    def release(self, charge: int) -> None:
        with self._lock:
            self._in_use -= charge

    def overloaded(self, charge: int) -> ResourceExhaustedError:
        """The error of a request of `charge` bytes that did not fit."""
        in_use = self._in_use
        return ResourceExhaustedError(
            f"stratad is overloaded: this request needs {charge} bytes of the in-flight budget "
            f"(max_inflight_bytes = {self.limit}) and {in_use} are in use; retry with backoff",
            reason="OVERLOADED",
            metadata={
                "limit": "max_inflight_bytes",
                "limit_bytes": str(self.limit),
                "in_flight_bytes": str(in_use),
                "request_bytes": str(charge),
            },
        )


class _Held:
    """A decoded request and its charge: released once, explicitly or when dropped."""

    __slots__ = ("_budget", "_charge", "message")

    def __init__(self, message: Any, budget: InflightBudget, charge: int) -> None:
        self.message = message
        self._budget = budget
        # list.pop is atomic: the charge is released at most once, whoever
        # calls first. (Not weakref.finalize: it cost more than the rest of
        # the admission together, on every request.)
        self._charge = [charge]

    def release(self) -> None:
        try:
            charge = self._charge.pop()
        except IndexError:
            return  # released already
        self._budget.release(charge)

    def __del__(self) -> None:
        # Garbage before its release (a call cancelled between decoding and
        # its handler): the budget must not leak.
        self.release()


def declared_bytes(message: Any) -> int:
    """The size of the state a chunked upload declares (0 for other messages)."""
    request = message.request if isinstance(message, checkpoint_pb2.SaveStatesRequest) else message
    if isinstance(request, checkpoint_pb2.SaveStateRequest) and request.HasField("chunked"):
        return int(request.chunked.size)
    return 0


class LimitsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Charge every request to an `InflightBudget`; refuse those that do not fit."""

    #: What intercept_service returns depends on the method alone (HandlerCache).
    per_method = True

    def __init__(self, budget: InflightBudget) -> None:
        self.budget = budget
        self._handlers = HandlerCache(self._charged)

    async def intercept_service(self, continuation: Continuation, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(EXEMPT_PREFIXES):
            return handler
        return self._handlers.wrapped(handler, method)

    def _charged(self, handler: Any, method: str) -> Any:
        return _charged_handler(handler, self.budget, method)


def _charging_deserializer(deserializer: Any, budget: InflightBudget) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        charge = MEMORY_FACTOR * len(data)
        if not budget.try_acquire(charge):
            return UndecodableRequest(budget.overloaded(charge))
        try:
            message = deserializer(data) if deserializer is not None else data
            extra = DECODED_FACTOR * declared_bytes(message)
        except BaseException:
            budget.release(charge)
            raise
        if isinstance(message, UndecodableRequest):
            budget.release(charge)
            return message
        if extra and not budget.try_acquire(extra, holding=charge):
            budget.release(charge)
            return UndecodableRequest(budget.overloaded(charge + extra))
        return _Held(message, budget, charge + extra)

    return deserialize


class _Charges:
    """The charges one call holds, in arrival order, and the messages they wrap."""

    def __init__(self, per_answer: bool) -> None:
        self._held: collections.deque[_Held] = collections.deque()
        self._per_answer = per_answer

    def take(self, request: Any) -> Any:
        """The message to hand on (refusals pass as they are, for ErrorInterceptor)."""
        if isinstance(request, _Held):
            self._held.append(request)
            return request.message
        return request

    def requests(self, request: Any, streaming: bool) -> Any:
        return self._stream(request) if streaming else self.take(request)

    def requests_sync(self, request: Any, streaming: bool) -> Any:
        return self._stream_sync(request) if streaming else self.take(request)

    async def _stream(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            yield self.take(request)

    def _stream_sync(self, requests: Iterable[Any]) -> Iterator[Any]:
        for request in requests:
            yield self.take(request)

    def answered(self) -> None:
        """One answer went out: its item (the oldest held) is done with."""
        if self._per_answer and self._held:
            self._held.popleft().release()

    def release_all(self) -> None:
        while self._held:
            self._held.popleft().release()


def _charged_handler(handler: Any, budget: InflightBudget, method: str) -> Any:
    kwargs = {
        "request_deserializer": _charging_deserializer(handler.request_deserializer, budget),
        "response_serializer": handler.response_serializer,
    }
    streaming = bool(handler.request_streaming)
    per_answer = method in ONE_ANSWER_PER_ITEM
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            _stream_response(handler.stream_stream, streaming, per_answer), **kwargs
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            _unary_response(handler.stream_unary, streaming), **kwargs
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            _stream_response(handler.unary_stream, streaming, False), **kwargs
        )
    return grpc.unary_unary_rpc_method_handler(
        _unary_response(handler.unary_unary, streaming), **kwargs
    )


# grpc.aio drives a handler by the kind of its function (coroutine function,
# async generator function, or plain function run in a thread pool), so each
# wrapper has the kind of what it wraps, as in interceptors.py.


def _unary_response(behavior: Behavior, streaming: bool) -> Behavior:
    if inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior):

        async def async_unary(request: Any, context: Any) -> Any:
            charges = _Charges(per_answer=False)
            try:
                return await behavior(charges.requests(request, streaming), context)
            finally:
                charges.release_all()

        return async_unary

    def sync_unary(request: Any, context: Any) -> Any:
        charges = _Charges(per_answer=False)
        try:
            return behavior(charges.requests_sync(request, streaming), context)
        finally:
            charges.release_all()

    return sync_unary


def _stream_response(behavior: Behavior, streaming: bool, per_answer: bool) -> Behavior:
    if inspect.iscoroutinefunction(behavior):
        # Reader/writer style (context.write): answers are not seen here.
        async def writer(request: Any, context: Any) -> None:
            charges = _Charges(per_answer=False)
            try:
                await behavior(charges.requests(request, streaming), context)
            finally:
                charges.release_all()

        return writer

    if inspect.isasyncgenfunction(behavior):

        async def async_generator(request: Any, context: Any) -> AsyncIterator[Any]:
            charges = _Charges(per_answer)
            try:
                async for response in behavior(charges.requests(request, streaming), context):
                    charges.answered()
                    yield response
            finally:
                charges.release_all()

        return async_generator

    def sync_generator(request: Any, context: Any) -> Iterator[Any]:
        charges = _Charges(per_answer)
        try:
            for response in behavior(charges.requests_sync(request, streaming), context):
                charges.answered()
                yield response
        finally:
            charges.release_all()

    return sync_generator


__all__ = [
    "DECODED_FACTOR",
    "MEMORY_FACTOR",
    "ONE_ANSWER_PER_ITEM",
    "InflightBudget",
    "LimitsInterceptor",
    "declared_bytes",
]
