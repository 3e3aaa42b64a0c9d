"""Server interceptors.

`RequestInterceptor` observes every call: it times it, learns its final
status, logs one debug line per request (method, tenant, session, status,
duration and the ``x-request-id`` of the caller, when it sent one) and hands
the same facts to observers such as the Prometheus metrics. Install it first,
so that it sees the status `ErrorInterceptor` turned an exception into.

`ErrorInterceptor` is the one place where exceptions become gRPC statuses:
a `StratadError` becomes ``grpc.StatusCode[exc.grpc_status]`` with its
message; anything else becomes INTERNAL with a generic message, and its
traceback goes to the log under an incident id that the message repeats.
A handler that is not implemented (the generated base class raises
NotImplementedError) is UNIMPLEMENTED.

It also owns request decoding. grpc.aio calls the request deserializer
outside any handler, so bytes that do not parse as the request message
(truncated, a bad wire type, invalid UTF-8, nested past the protobuf
parser's limit) would end as UNKNOWN ("Unexpected DecodeError") or, read from
a request stream inside the handler, as INTERNAL. `ErrorInterceptor` installs
a deserializer that returns an `UndecodableRequest` instead of raising, and
the wrapped handler turns it into INVALID_ARGUMENT (reason
MALFORMED_REQUEST): at once for a unary request, when the handler reaches it
for a request stream (the iterator handed to the handler raises; a handler
that calls ``context.read()`` itself gets the `UndecodableRequest`). Later
interceptors see an `UndecodableRequest` where a message would be.

grpc.aio decides how to drive a handler by inspecting the *function*
(coroutine function, async generator function, or plain function run in a
thread pool), so every wrapper below has the same kind as what it wraps. stratad's own
servicers are async; sync handlers are mapped too, with one limit that is
grpc.aio's own: a sync *generator* that fails after it yielded races the
loop's write and may end as UNKNOWN instead of its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import grpc.aio
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from stratad import tracing
from stratad.errors import ERROR_DOMAIN, InvalidArgumentError, StratadError
from stratad.server.logging_setup import current_request_id

_log = logging.getLogger(__name__)

Behavior = Callable[[Any, Any], Any]
Continuation = Callable[[Any], Awaitable[Any]]

#: Statuses that mean "a bug or a broken disk", logged with their traceback.
_LOUD_STATUSES = frozenset({"INTERNAL", "DATA_LOSS", "UNKNOWN"})


#: Methods whose wrapped handlers a `HandlerCache` keeps: a bound in case a
#: generic handler answers any method name a client makes up.
HANDLER_CACHE_SIZE = 1024


class HandlerCache:
    """Wrapped handlers by method, for interceptors whose wrapping depends only
    on the method and its handler, never on the call.

    grpc.aio calls `intercept_service` on every call. Building the wrappers
    each time (closures, a new RpcMethodHandler, inspect's tests of the
    behavior's kind) cost the event loop about as much as the interceptors'
    work during the call. A method resolves to the same handler object call
    after call (the registered one, or the next interceptor's cached wrapper),
    so one entry per method is kept, and rebuilt if its handler changes.
    """

    def __init__(self, wrap: Callable[[Any, str], Any]) -> None:
        self._wrap = wrap
        self._entries: dict[str, tuple[Any, Any]] = {}

    def wrapped(self, handler: Any, method: str) -> Any:
        """`wrap(handler, method)`, built once per method and handler."""
        entry = self._entries.get(method)
        if entry is not None and entry[0] is handler:
            return entry[1]
        if len(self._entries) >= HANDLER_CACHE_SIZE:
            self._entries.clear()
        wrapped = self._wrap(handler, method)
        # The handler itself is kept, not its id(): an id can be reused.
        self._entries[method] = (handler, wrapped)
        return wrapped


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Map exceptions raised by handlers of every kind to gRPC statuses.

    Install it first in the server's interceptor list: it then wraps every
    later interceptor too, so an auth interceptor may simply raise
    `UnauthenticatedError`.
    """

    #: What intercept_service returns depends on the method alone (HandlerCache).
    per_method = True

    def __init__(self) -> None:
        self._handlers = HandlerCache(_wrap_handler)

    async def intercept_service(self, continuation: Continuation, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED itself
            return None
        return self._handlers.wrapped(handler, handler_call_details.method)


class UndecodableRequest:
    """What a request deserializer returns instead of a message it did not decode.

    Bytes that are not a valid message (INVALID_ARGUMENT), or a request that
    the in-flight budget refused before decoding it (server/limits.py).
    """

    __slots__ = ("error",)

    def __init__(self, error: StratadError) -> None:
        self.error = error


def _safe_deserializer(deserializer: Any, method: str) -> Any:
    if deserializer is None:  # raw bytes in: nothing to decode
        return None
    message_type = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    name = str(getattr(message_type, "full_name", "") or f"request message of {method}")

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, or whatever a custom deserializer raises
            return UndecodableRequest(_malformed(name, exc))

    return deserialize


def _malformed(name: str, exc: Exception) -> InvalidArgumentError:
    # upb says "Error parsing message with type 'X': Wire format was corrupt".
    # Another deserializer's message may quote the input: name only its type.
    detail = str(exc).rpartition("': ")[2] if isinstance(exc, DecodeError) else ""
    if "MaxDepth" in detail:
        detail = "messages nested too deeply"
    detail = detail or type(exc).__name__
    return InvalidArgumentError(
        f"request is not a valid {name}: {detail}",
        reason="MALFORMED_REQUEST",
        metadata={"message": name},
    )


def _decoded(request: Any) -> Any:
    """A unary request, or the INVALID_ARGUMENT error of one that did not decode."""
    if isinstance(request, UndecodableRequest):
        raise request.error
    return request


async def _decoded_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _decoded(request)


def _decoded_stream_sync(requests: Iterable[Any]) -> Iterator[Any]:
    for request in requests:
        yield _decoded(request)


def _wrap_handler(handler: Any, method: str) -> Any:
    kwargs = {
        "request_deserializer": _safe_deserializer(handler.request_deserializer, method),
        "response_serializer": handler.response_serializer,
    }
    streaming = bool(handler.request_streaming)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            _wrap_stream_response(handler.stream_stream, method, streaming), **kwargs
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            _wrap_unary_response(handler.stream_unary, method, streaming), **kwargs
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            _wrap_stream_response(handler.unary_stream, method, streaming), **kwargs
        )
    return grpc.unary_unary_rpc_method_handler(
        _wrap_unary_response(handler.unary_unary, method, streaming), **kwargs
    )


def _request_in(request: Any, streaming: bool) -> Any:
    """What an async behavior is handed: a checked request or request stream."""
    return _decoded_stream(request) if streaming else _decoded(request)


def _request_in_sync(request: Any, streaming: bool) -> Any:
    return _decoded_stream_sync(request) if streaming else _decoded(request)


def _wrap_unary_response(behavior: Behavior, method: str, streaming: bool) -> Behavior:
    """Wrap a unary-unary or stream-unary behavior."""
    if _is_async(behavior):

        async def async_unary(request: Any, context: Any) -> Any:
            try:
                return await behavior(_request_in(request, streaming), context)
            except Exception as exc:
                await _abort(context, exc, method)

        return async_unary

    def sync_unary(request: Any, context: Any) -> Any:
        try:
            return behavior(_request_in_sync(request, streaming), context)
        except Exception as exc:
            _abort_sync(context, exc, method)

    return sync_unary


def _wrap_stream_response(behavior: Behavior, method: str, streaming: bool) -> Behavior:
    """Wrap a unary-stream or stream-stream behavior."""
    if inspect.iscoroutinefunction(behavior):
        # Reader/writer style: the handler calls context.write() and returns None.
        async def writer(request: Any, context: Any) -> None:
            try:
                await behavior(_request_in(request, streaming), context)
            except Exception as exc:
                await _abort(context, exc, method)

        return writer

    if inspect.isasyncgenfunction(behavior):

        async def async_generator(request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for response in behavior(_request_in(request, streaming), context):
                    yield response
            except Exception as exc:
                await _abort(context, exc, method)

        return async_generator

    def sync_generator(request: Any, context: Any) -> Iterator[Any]:
        try:
            yield from behavior(_request_in_sync(request, streaming), context)
        except Exception as exc:
            _abort_sync(context, exc, method)

    return sync_generator


def _is_async(behavior: Behavior) -> bool:
    # The same test grpc.aio applies to unary-response handlers.
    return inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)


async def _abort(context: Any, exc: Exception, method: str) -> None:
    """Turn ``exc`` into the call's status (raises grpc's AbortError)."""
    _reraise_if_grpc_own(context, exc)
    code, details = _status_for(exc, method)
    await context.abort(code, details, trailing_metadata=_error_details(code, details, exc))


def _abort_sync(context: Any, exc: Exception, method: str) -> None:
    """`_abort` for handlers that grpc.aio runs in its thread pool."""
    _reraise_if_grpc_own(context, exc)
    code, details = _status_for(exc, method)
    context.abort(code, details, trailing_metadata=_error_details(code, details, exc))


def _error_details(code: grpc.StatusCode, message: str, exc: Exception) -> tuple[Any, ...]:
    """The `grpc-status-details-bin` trailer: a google.rpc.Status with an ErrorInfo.

    Clients in any language read the machine-readable reason (domain
    ERROR_DOMAIN) from it instead of matching the English message.
    """
    if isinstance(exc, StratadError):
        reason, metadata = exc.reason, exc.metadata
    else:
        reason, metadata = code.name, {}
    tracing.annotate({tracing.REASON_ATTRIBUTE: reason})  # the status code is traced already
    info = error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return tuple(rpc_status.to_status(status).trailing_metadata)


def _reraise_if_grpc_own(context: Any, exc: Exception) -> None:
    # grpc.aio's own exceptions (AbortError from context.abort(), UsageError,
    # server-stopped errors) are control flow that grpc must see unchanged:
    # it checks that the AbortError it raised is the one that comes back.
    # And once a status went out, there is nothing left to report it on.
    # (The context of a sync handler has no done(); its abort() then raises.)
    done = getattr(context, "done", None)
    if isinstance(exc, grpc.aio.BaseError) or (done is not None and done()):
        raise exc


def _status_for(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, StratadError):
        return _stratad_status(exc, method)
    if type(exc) is NotImplementedError:  # a generated base class's unimplemented method
        _log.debug("%s is not implemented", method)
        return grpc.StatusCode.UNIMPLEMENTED, f"method {method} is not implemented"
    # Unknown errors may carry paths, keys or user data: log them, don't send them.
    incident = uuid.uuid4().hex[:12]
    _log.error("unhandled error in %s (incident %s)", method, incident, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error (incident {incident})"


def _stratad_status(exc: StratadError, method: str) -> tuple[grpc.StatusCode, str]:
    code = grpc.StatusCode.__members__.get(exc.grpc_status, grpc.StatusCode.INTERNAL)
    details = exc.message or type(exc).__name__
    if exc.grpc_status in _LOUD_STATUSES:
        _log.error("%s failed: %s: %s", method, type(exc).__name__, details, exc_info=exc)
    else:
        _log.debug("%s failed: %s: %s", method, type(exc).__name__, details)
    return code, details


# --- request observation ----------------------------------------------------------

REQUEST_ID_METADATA_KEY = "x-request-id"
TENANT_METADATA_KEY = "x-stratad-tenant"
_request_log = logging.getLogger("stratad.requests")
#: A request ID longer than this is cut (it is caller-controlled and logged).
_MAX_REQUEST_ID = 128


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What is known about a call when it starts."""

    method: str  # full method: /package.Service/Method
    service: str  # package.Service
    name: str  # Method
    kind: str  # unary, client_stream, server_stream or bidi_stream
    tenant: str
    request_id: str


@dataclass(frozen=True, slots=True)
class CallResult:
    """A finished call: its status code name (OK, NOT_FOUND, ...) and duration."""

    call: CallInfo
    session: str
    code: str
    seconds: float
    #: The response message of a successful unary-response call, else None.
    response: Any = None


class CallObserver(Protocol):
    def call_started(self, call: CallInfo) -> None: ...

    def call_finished(self, result: CallResult) -> None: ...


class RequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Time every call, learn its final status, log it at debug and tell the observers."""

    #: What intercept_service returns depends on the method alone (HandlerCache).
    per_method = True

    def __init__(self, observers: Iterable[CallObserver] = ()) -> None:
        self._observers: Sequence[CallObserver] = tuple(observers)
        self._handlers = HandlerCache(self._observed)

    async def intercept_service(self, continuation: Continuation, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self._handlers.wrapped(handler, str(handler_call_details.method))

    def _observed(self, handler: Any, method: str) -> Any:
        return _observe_handler(handler, _method_info(handler, method), self._observers)


def _method_info(handler: Any, method: str) -> CallInfo:
    """What every call of `method` shares: its CallInfo but the tenant and request ID,
    which come from each call's metadata (`_call_info`)."""
    service, _, name = method.lstrip("/").rpartition("/")
    if handler.request_streaming and handler.response_streaming:
        kind = "bidi_stream"
    elif handler.request_streaming:
        kind = "client_stream"
    elif handler.response_streaming:
        kind = "server_stream"
    else:
        kind = "unary"
    return CallInfo(method, service, name, kind, "", "")


def _call_info(method: CallInfo, context: Any) -> CallInfo:
    """The CallInfo of one call of `method`: its tenant and request ID from its metadata."""
    tenant = request_id = ""
    for key, value in context.invocation_metadata() or ():
        if key == TENANT_METADATA_KEY:
            tenant = str(value)
        elif key == REQUEST_ID_METADATA_KEY:
            request_id = _printable(str(value))[:_MAX_REQUEST_ID]
    return CallInfo(
        method.method, method.service, method.name, method.kind, tenant or "default", request_id
    )


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in text)


class _Watch:
    """One call being observed: started now, finished once."""

    def __init__(self, method: CallInfo, context: Any, observers: Sequence[CallObserver]) -> None:
        call = self.call = _call_info(method, context)
        self.observers = observers
        self.session = ""
        self.started = time.perf_counter()
        self.token = current_request_id.set(call.request_id)
        if call.request_id:
            tracing.annotate({tracing.REQUEST_ID_ATTRIBUTE: call.request_id})
        self.watch_token = _current_watch.set(self)
        for observer in observers:
            observer.call_started(call)

    def request(self, request: Any) -> None:
        session = getattr(request, "session_id", "")
        if isinstance(session, str):
            self.session = session
            if session:
                tracing.annotate({tracing.SESSION_ATTRIBUTE: session})

    def finish(self, context: Any, exc: BaseException | None, response: Any = None) -> None:
        seconds = time.perf_counter() - self.started
        code = _final_code(context, exc)
        result = CallResult(self.call, self.session, code, seconds, response)
        with contextlib.suppress(ValueError):  # finished in another context
            _current_watch.reset(self.watch_token)
        for observer in self.observers:
            try:
                observer.call_finished(result)
            except Exception:  # an observer's bug must not fail the call
                _log.exception("call observer %r failed", observer)
        if _request_log.isEnabledFor(logging.DEBUG):
            _log_request(result)
        with contextlib.suppress(ValueError):  # finished in another context
            current_request_id.reset(self.token)


#: The call being observed, for `settle_tenant`.
_current_watch: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar(
    "stratad_current_watch", default=None
)


def settle_tenant(tenant: str) -> None:
    """Record the tenant authentication gave the current call.

    CallInfo.tenant starts as the ``x-stratad-tenant`` header; with auth on
    the credential decides, and the request log and the per-tenant metrics
    of the finished call must show that tenant, not what the header said.
    """
    watch = _current_watch.get()
    if watch is not None:
        watch.call = dataclasses.replace(watch.call, tenant=tenant)
    tracing.annotate({tracing.TENANT_ATTRIBUTE: tenant})


def _final_code(context: Any, exc: BaseException | None) -> str:
    code = None
    code_fn = getattr(context, "code", None)
    if code_fn is not None:
        try:
            code = code_fn()
        except Exception:
            code = None
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if isinstance(code, int):
        return _CODE_NAMES.get(code, "UNKNOWN")
    if exc is None:
        return "OK"
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED"
    return "UNKNOWN"


_CODE_NAMES: dict[int, str] = {c.value[0]: c.name for c in grpc.StatusCode}


def _log_request(result: CallResult) -> None:
    call = result.call
    duration_ms = round(result.seconds * 1000, 3)
    _request_log.debug(
        "%s tenant=%s session=%s status=%s duration_ms=%.3f request_id=%s",
        call.method,
        call.tenant,
        result.session or "-",
        result.code,
        duration_ms,
        call.request_id or "-",
        extra={
            "method": call.method,
            "tenant": call.tenant,
            "session": result.session,
            "status": result.code,
            "duration_ms": duration_ms,
            "request_id": call.request_id,
        },
    )


def _observe_handler(handler: Any, method: CallInfo, observers: Sequence[CallObserver]) -> Any:
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            _observe_stream_response(handler.stream_stream, method, observers, False), **kwargs
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            _observe_unary_response(handler.stream_unary, method, observers, False), **kwargs
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            _observe_stream_response(handler.unary_stream, method, observers, True), **kwargs
        )
    return grpc.unary_unary_rpc_method_handler(
        _observe_unary_response(handler.unary_unary, method, observers, True), **kwargs
    )


def _observe_unary_response(
    behavior: Behavior, method: CallInfo, observers: Sequence[CallObserver], unary_request: bool
) -> Behavior:
    if _is_async(behavior):

        async def async_unary(request: Any, context: Any) -> Any:
            watch = _Watch(method, context, observers)
            if unary_request:
                watch.request(request)
            try:
                response = await behavior(request, context)
            except BaseException as exc:
                watch.finish(context, exc)
                raise
            watch.finish(context, None, response)
            return response

        return async_unary

    def sync_unary(request: Any, context: Any) -> Any:
        watch = _Watch(method, context, observers)
        if unary_request:
            watch.request(request)
        try:
            response = behavior(request, context)
        except BaseException as exc:
            watch.finish(context, exc)
            raise
        watch.finish(context, None, response)
        return response

    return sync_unary


def _observe_stream_response(
    behavior: Behavior, method: CallInfo, observers: Sequence[CallObserver], unary_request: bool
) -> Behavior:
    if inspect.iscoroutinefunction(behavior):

        async def writer(request: Any, context: Any) -> None:
            watch = _Watch(method, context, observers)
            if unary_request:
                watch.request(request)
            try:
                await behavior(request, context)
            except BaseException as exc:
                watch.finish(context, exc)
                raise
            watch.finish(context, None)

        return writer

    if inspect.isasyncgenfunction(behavior):

        async def async_generator(request: Any, context: Any) -> AsyncIterator[Any]:
            watch = _Watch(method, context, observers)
            if unary_request:
                watch.request(request)
            try:
                async for response in behavior(request, context):
                    yield response
            except BaseException as exc:
                watch.finish(context, exc)
                raise
            watch.finish(context, None)

        return async_generator

    def sync_generator(request: Any, context: Any) -> Iterator[Any]:
        watch = _Watch(method, context, observers)
        if unary_request:
            watch.request(request)
        try:
            yield from behavior(request, context)
        except BaseException as exc:
            watch.finish(context, exc)
            raise
        watch.finish(context, None)

    return sync_generator


__all__ = [
    "REQUEST_ID_METADATA_KEY",
    "CallInfo",
    "CallObserver",
    "CallResult",
    "ErrorInterceptor",
    "RequestInterceptor",
    "UndecodableRequest",
    "current_request_id",
    "settle_tenant",
]
