"""The SERVER span of every gRPC call (imported only when tracing is on).

Why stratad's own interceptor rather than opentelemetry-instrumentation-grpc's
aio server interceptor: that one keeps the span current by attaching a
context token at the start of a call and detaching it at the end, and for a
response stream the end can run in another context (grpc.aio closes the
async generator of a stream the client cancelled from a finalizer task), so
every cancelled WatchSession logged "Failed to detach context" at ERROR and
its span said OK; it also learns the status only from ``abort()`` calls,
and records grpc's own AbortError as an exception event on every failed call.

This interceptor holds the span itself and reads the call's final status
from its servicer context when the call ends, however it ends; the span is
current while the call's code runs, so everything it does (the spans of
stratad.tracing, log lines, the ErrorInfo reason `ErrorInterceptor` adds) is
inside it. Install it first: it then covers every other interceptor.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from stratad import tracing
from stratad.server.front import peer_of
from stratad.server.interceptors import _final_code as final_code

Behavior = Callable[[Any, Any], Any]
Continuation = Callable[[Any], Awaitable[Any]]

#: Codes that mean the server failed (span status ERROR), as OpenTelemetry's
#: gRPC conventions list them; the others are answers, not faults.
SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)
_CODE_NUMBERS: Mapping[str, int] = {c.name: c.value[0] for c in grpc.StatusCode}
#: How a call that did not complete ended: not exceptions of the server's.
_NOT_FAULTS = (grpc.aio.AbortError, asyncio.CancelledError, GeneratorExit)


def install(provider: Any) -> TracingInterceptor:
    """Trace with ``provider`` (an OpenTelemetry SDK TracerProvider) from now
    on; return the gRPC server interceptor to install. Undo with
    `stratad.tracing.uninstall`."""
    tracer = tracing.activate(provider)
    # Probes call Health every few seconds: a trace each would drown the real ones.
    return TracingInterceptor(tracer, tracing.UNTRACED_SERVICES)


class TracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Start a SERVER span per call, continuing the caller's ``traceparent``."""

    def __init__(self, tracer: trace.Tracer, untraced_services: Iterable[str] = ()) -> None:
        self._tracer = tracer
        self._untraced = frozenset(untraced_services)

    async def intercept_service(self, continuation: Continuation, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        service = method.lstrip("/").rpartition("/")[0]
        if handler is None or service in self._untraced:
            return handler
        call = _Call(self._tracer, method, handler_call_details.invocation_metadata)
        return _traced_handler(handler, call)


class _Call:
    """What a call's span is made of, known before the call runs."""

    def __init__(self, tracer: trace.Tracer, method: str, metadata: Any) -> None:
        self.tracer = tracer
        self.method = method
        self.metadata = tuple(metadata or ())

    def start(self, context: Any) -> tuple[trace.Span, otel_context.Context]:
        """The call's span (child of the caller's, if it sent one) and a context holding it."""
        carrier = {str(k): v for k, v in self.metadata if isinstance(v, str)}
        parent = propagate.extract(carrier)
        span = self.tracer.start_span(
            self.method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=self._attributes(context, carrier),
        )
        return span, trace.set_span_in_context(span, parent)

    def _attributes(self, context: Any, carrier: Mapping[str, str]) -> dict[str, str | int]:
        service, _, name = self.method.lstrip("/").rpartition("/")
        attributes: dict[str, str | int] = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": name,
        }
        if "user-agent" in carrier:
            attributes["user_agent.original"] = carrier["user-agent"]
        # ipv4:127.0.0.1:5000, ipv6:[::1]:5000, unix:...
        peer = peer_of(context)
        kind, _, address = peer.partition(":")
        if kind in ("ipv4", "ipv6"):
            host, _, port = address.rpartition(":")
            attributes["network.peer.address"] = host.strip("[]")
            if port.isdigit():
                attributes["network.peer.port"] = int(port)
        return attributes


def finish(span: trace.Span, context: Any, exc: BaseException | None) -> None:
    """Record how the call ended (status code, error status, a real exception) and end it."""
    code = final_code(context, exc)
    span.set_attribute("rpc.grpc.status_code", _CODE_NUMBERS.get(code, 2))
    if code in SERVER_ERRORS:
        details = _details(context)
        span.set_status(Status(StatusCode.ERROR, f"{code}: {details}" if details else code))
    if exc is not None and not isinstance(exc, _NOT_FAULTS):
        span.record_exception(exc)
    span.end()


def _details(context: Any) -> str:
    details_fn = getattr(context, "details", None)
    try:
        details = details_fn() if details_fn is not None else ""
    except Exception:
        return ""
    return details.decode(errors="replace") if isinstance(details, bytes) else str(details or "")


def _restore(previous: otel_context.Context) -> None:
    """Make ``previous`` current again: what detaching the call's token does, except that
    it cannot fail. grpc.aio may close a stream's generator from another task, in a copy
    of the context where the token was made; resetting the token there raises (and
    OpenTelemetry logs it at ERROR). Setting the value works in any context."""
    otel_context.attach(previous)


def _traced_handler(handler: Any, call: _Call) -> Any:
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_traced(handler.stream_stream, call), **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_traced(handler.stream_unary, call), **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_traced(handler.unary_stream, call), **kwargs)
    return grpc.unary_unary_rpc_method_handler(_traced(handler.unary_unary, call), **kwargs)


def _traced(behavior: Behavior, call: _Call) -> Behavior:
    """The behavior inside the call's span, of the same kind (grpc.aio inspects it)."""
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            span, attached = call.start(context)
            previous = otel_context.get_current()
            otel_context.attach(attached)
            failure: BaseException | None = None
            try:
                async for response in behavior(request, context):
                    yield response
            except BaseException as exc:
                failure = exc
                raise
            finally:
                finish(span, context, failure)
                _restore(previous)

        return stream

    if inspect.iscoroutinefunction(behavior):  # unary response, or a writer-style stream

        async def unary(request: Any, context: Any) -> Any:
            span, attached = call.start(context)
            previous = otel_context.get_current()
            otel_context.attach(attached)
            failure: BaseException | None = None
            try:
                return await behavior(request, context)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                finish(span, context, failure)
                _restore(previous)

        return unary

    # A sync handler runs in grpc's thread pool: none of stratad's is. Untraced.
    return behavior


__all__ = ["SERVER_ERRORS", "TracingInterceptor", "finish"]
