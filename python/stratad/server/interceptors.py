"""Server interceptors.

`ErrorInterceptor` is the one place where exceptions become gRPC statuses:
a `StratadError` becomes ``grpc.StatusCode[exc.grpc_status]`` with its
message; anything else becomes INTERNAL with a generic message, and its
traceback goes to the log under an incident id that the message repeats.

grpc.aio decides how to drive a handler by inspecting the *function*
(coroutine function, async generator function, or plain function run in a
thread pool), so every wrapper below has the same kind as what it wraps. stratad's own
servicers are async; sync handlers are mapped too, with one limit that is
grpc.aio's own: a sync *generator* that fails after it yielded races the
loop's write and may end as UNKNOWN instead of its status.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import grpc.aio

from stratad.errors import StratadError

_log = logging.getLogger(__name__)

Behavior = Callable[[Any, Any], Any]
Continuation = Callable[[Any], Awaitable[Any]]

#: Statuses that mean "a bug or a broken disk", logged with their traceback.
_LOUD_STATUSES = frozenset({"INTERNAL", "DATA_LOSS", "UNKNOWN"})


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Map exceptions raised by handlers of every kind to gRPC statuses.

    Install it first in the server's interceptor list: it then wraps every
    later interceptor too, so an auth interceptor may simply raise
    `UnauthenticatedError`.
    """

    async def intercept_service(self, continuation: Continuation, handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED itself
            return None
        return _wrap_handler(handler, handler_call_details.method)


def _wrap_handler(handler: Any, method: str) -> Any:
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            _wrap_stream_response(handler.stream_stream, method), **kwargs
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            _wrap_unary_response(handler.stream_unary, method), **kwargs
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            _wrap_stream_response(handler.unary_stream, method), **kwargs
        )
    return grpc.unary_unary_rpc_method_handler(
        _wrap_unary_response(handler.unary_unary, method), **kwargs
    )


def _wrap_unary_response(behavior: Behavior, method: str) -> Behavior:
    """Wrap a unary-unary or stream-unary behavior."""
    if _is_async(behavior):

        async def async_unary(request: Any, context: Any) -> Any:
            try:
                return await behavior(request, context)
            except Exception as exc:
                await _abort(context, exc, method)

        return async_unary

    def sync_unary(request: Any, context: Any) -> Any:
        try:
            return behavior(request, context)
        except Exception as exc:
            _abort_sync(context, exc, method)

    return sync_unary


def _wrap_stream_response(behavior: Behavior, method: str) -> Behavior:
    """Wrap a unary-stream or stream-stream behavior."""
    if inspect.iscoroutinefunction(behavior):
        # Reader/writer style: the handler calls context.write() and returns None.
        async def writer(request: Any, context: Any) -> None:
            try:
                await behavior(request, context)
            except Exception as exc:
                await _abort(context, exc, method)

        return writer

    if inspect.isasyncgenfunction(behavior):

        async def async_generator(request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for response in behavior(request, context):
                    yield response
            except Exception as exc:
                await _abort(context, exc, method)

        return async_generator

    def sync_generator(request: Any, context: Any) -> Iterator[Any]:
        try:
            yield from behavior(request, context)
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
    await context.abort(code, details)


def _abort_sync(context: Any, exc: Exception, method: str) -> None:
    """`_abort` for handlers that grpc.aio runs in its thread pool."""
    _reraise_if_grpc_own(context, exc)
    code, details = _status_for(exc, method)
    context.abort(code, details)


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


__all__ = ["ErrorInterceptor"]
