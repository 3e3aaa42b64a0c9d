"""The error interceptor, for every handler kind and implementation style.

A generic test service raises whatever exception the request names:
``b"NotFoundError"`` raises `stratad.errors.NotFoundError("boom NotFoundError")`,
``b"RuntimeError"`` a RuntimeError, ``b"NotImplementedError"`` what a generated
base class raises for a method it does not implement, ``b"abort"`` calls
``context.abort`` itself and ``b"ok"`` succeeds; ``b"undecodable"`` fails in
the request deserializer. Async streaming responses send one message before
raising, so errors after data are covered too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

import stratad.errors
from stratad.errors import ERROR_DOMAIN, StratadError
from stratad.sdk.client import error_info, to_error
from stratad.server.registry import Resources, ServiceRegistration

SERVICE = "stratad.test.v1.ErrorService"
SECRET = "secret-path-/etc/passwd"


def _all_subclasses(cls: type[StratadError]) -> list[type[StratadError]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_all_subclasses(sub)]
    return found


# Only the classes of stratad.errors: other tests may define their own subclasses.
ERROR_CLASSES = [StratadError] + [
    cls for cls in _all_subclasses(StratadError) if cls.__module__ == "stratad.errors"
]


def _raise_for(name: bytes) -> None:
    if name == b"RuntimeError":
        raise RuntimeError(SECRET)
    if name == b"NotImplementedError":  # what generated base classes raise
        raise NotImplementedError("Method not implemented!")
    if name != b"ok":
        cls = getattr(stratad.errors, name.decode())
        raise cls(f"boom {name.decode()}")


async def _first(requests: Any) -> bytes:
    async for request in requests:
        return bytes(request)
    return b"ok"


def _first_sync(requests: Iterator[bytes]) -> bytes:
    return next(iter(requests), b"ok")


async def _maybe_abort(name: bytes, context: Any) -> None:
    if name == b"abort":
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "explicit abort")


def _maybe_abort_sync(name: bytes, context: Any) -> None:
    if name == b"abort":
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "explicit abort")


# --- one behavior per (kind, style) ----------------------------------------


async def unary_unary_async(request: bytes, context: Any) -> bytes:
    await _maybe_abort(request, context)
    _raise_for(request)
    return b"ok"


def unary_unary_sync(request: bytes, context: Any) -> bytes:
    _maybe_abort_sync(request, context)
    _raise_for(request)
    return b"ok"


async def stream_unary_async(requests: Any, context: Any) -> bytes:
    return await unary_unary_async(await _first(requests), context)


def stream_unary_sync(requests: Iterator[bytes], context: Any) -> bytes:
    return unary_unary_sync(_first_sync(requests), context)


async def unary_stream_asyncgen(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield b"first"
    await _maybe_abort(request, context)
    _raise_for(request)
    yield b"ok"


async def unary_stream_writer(request: bytes, context: Any) -> None:
    await context.write(b"first")
    await _maybe_abort(request, context)
    _raise_for(request)
    await context.write(b"ok")


def unary_stream_sync(request: bytes, context: Any) -> Iterator[bytes]:
    # Fails before its first message: grpc.aio itself cannot reliably abort a
    # sync generator after it yielded (its thread races the loop's write).
    _maybe_abort_sync(request, context)
    _raise_for(request)
    yield b"first"
    yield b"ok"


async def stream_stream_asyncgen(requests: Any, context: Any) -> AsyncIterator[bytes]:
    async for response in unary_stream_asyncgen(await _first(requests), context):
        yield response


async def stream_stream_writer(requests: Any, context: Any) -> None:
    await unary_stream_writer(await _first(requests), context)


def stream_stream_sync(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
    yield from unary_stream_sync(_first_sync(requests), context)


UNARY_RESPONSE = {
    "UnaryUnaryAsync": (grpc.unary_unary_rpc_method_handler, unary_unary_async),
    "UnaryUnarySync": (grpc.unary_unary_rpc_method_handler, unary_unary_sync),
    "StreamUnaryAsync": (grpc.stream_unary_rpc_method_handler, stream_unary_async),
    "StreamUnarySync": (grpc.stream_unary_rpc_method_handler, stream_unary_sync),
}
STREAM_RESPONSE = {
    "UnaryStreamAsyncGen": (grpc.unary_stream_rpc_method_handler, unary_stream_asyncgen),
    "UnaryStreamWriter": (grpc.unary_stream_rpc_method_handler, unary_stream_writer),
    "UnaryStreamSync": (grpc.unary_stream_rpc_method_handler, unary_stream_sync),
    "StreamStreamAsyncGen": (grpc.stream_stream_rpc_method_handler, stream_stream_asyncgen),
    "StreamStreamWriter": (grpc.stream_stream_rpc_method_handler, stream_stream_writer),
    "StreamStreamSync": (grpc.stream_stream_rpc_method_handler, stream_stream_sync),
}
METHODS = {**UNARY_RESPONSE, **STREAM_RESPONSE}


class Hang:
    """A streaming method that never finishes, to observe cancellation."""

    def __init__(self) -> None:
        self.outcome: list[str] = []
        self.done = threading.Event()

    async def stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.outcome.append("cancelled")
            raise
        except BaseException as exc:
            self.outcome.append(type(exc).__name__)
            raise
        finally:
            self.done.set()


def deserialize(data: bytes) -> bytes:
    """The request deserializer: bytes unchanged, except that b"undecodable" fails."""
    if data == b"undecodable":
        raise ValueError(SECRET)
    return data


def registration(hang: Hang | None = None) -> ServiceRegistration:
    def add(servicer: object, server: Any) -> None:
        handlers = {
            name: make(fn, request_deserializer=deserialize) for name, (make, fn) in METHODS.items()
        }
        if hang is not None:
            handlers["Hang"] = grpc.unary_stream_rpc_method_handler(hang.stream)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)

    def factory(resources: Resources) -> object:
        return object()

    return ServiceRegistration(name=SERVICE, add_fn=add, servicer_factory=factory)


def call(channel: grpc.Channel, method: str, payload: bytes) -> list[bytes]:
    """Invoke ``method`` with ``payload``; return all responses (raises grpc.RpcError)."""
    path = f"/{SERVICE}/{method}"
    if method.startswith("UnaryUnary"):
        return [channel.unary_unary(path)(payload, timeout=10)]
    if method.startswith("StreamUnary"):
        return [channel.stream_unary(path)(iter([payload]), timeout=10)]
    if method.startswith("UnaryStream"):
        return list(channel.unary_stream(path)(payload, timeout=10))
    return list(channel.stream_stream(path)(iter([payload]), timeout=10))


def collect(channel: grpc.Channel, method: str, payload: bytes) -> tuple[list[bytes], Any]:
    """Like `call`, but returns (responses received before the error, the error)."""
    path = f"/{SERVICE}/{method}"
    if method in UNARY_RESPONSE:
        try:
            return call(channel, method, payload), None
        except grpc.RpcError as exc:
            return [], exc
    if method.startswith("UnaryStream"):
        stream = channel.unary_stream(path)(payload, timeout=10)
    else:
        stream = channel.stream_stream(path)(iter([payload]), timeout=10)
    received: list[bytes] = []
    try:
        received.extend(stream)
    except grpc.RpcError as exc:
        return received, exc
    return received, None


@pytest.fixture
def hang() -> Hang:
    return Hang()


@pytest.fixture
def server(inprocess_server: Callable[..., Any], hang: Hang, request: pytest.FixtureRequest) -> Any:
    # grpc.aio runs plain-function handlers on a thread pool; the native front
    # door serves async handlers only (server/front.py), so Sync ones go to grpc.aio.
    callspec = getattr(request.node, "callspec", None)
    method = str(callspec.params.get("method", "")) if callspec is not None else ""
    front = "python" if method.endswith("Sync") else "auto"
    return inprocess_server(services=[registration(hang)], front=front)


@pytest.fixture
def channel(server: Any) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.target) as channel:
        yield channel


@pytest.mark.parametrize("method", list(METHODS))
def test_success_passes_through(channel: grpc.Channel, method: str) -> None:
    expected = [b"ok"] if method in UNARY_RESPONSE else [b"first", b"ok"]
    assert call(channel, method, b"ok") == expected


@pytest.mark.parametrize("error", ERROR_CLASSES, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("method", list(METHODS))
def test_stratad_errors_map_to_their_status(
    channel: grpc.Channel, method: str, error: type[StratadError]
) -> None:
    received, exc = collect(channel, method, error.__name__.encode())
    assert exc is not None, f"{method} did not fail"
    assert exc.code() == grpc.StatusCode[error.grpc_status]
    assert exc.details() == f"boom {error.__name__}"
    if method in STREAM_RESPONSE and not method.endswith("Sync"):
        assert received == [b"first"]  # what was sent before the error still arrives
    # Every error carries its machine-readable reason as a google.rpc.ErrorInfo.
    info = error_info(exc)
    assert info is not None, "no ErrorInfo in grpc-status-details-bin"
    assert (info.domain, info.reason) == (ERROR_DOMAIN, error.default_reason)
    assert to_error(exc).reason == error.default_reason


@pytest.mark.parametrize("method", list(METHODS))
def test_unknown_errors_become_internal_and_are_logged(
    channel: grpc.Channel, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="stratad.server.interceptors")
    _, exc = collect(channel, method, b"RuntimeError")
    assert exc is not None
    assert exc.code() == grpc.StatusCode.INTERNAL
    assert SECRET not in exc.details()  # never leak the message of an unknown error
    assert exc.details().startswith("internal error (incident ")
    incident = exc.details().removeprefix("internal error (incident ").rstrip(")")
    records = [r for r in caplog.records if incident in r.getMessage()]
    assert len(records) == 1
    assert records[0].exc_info is not None and records[0].exc_info[0] is RuntimeError
    assert method in records[0].getMessage()


@pytest.mark.parametrize("method", list(METHODS))
def test_explicit_abort_is_not_swallowed(channel: grpc.Channel, method: str) -> None:
    _, exc = collect(channel, method, b"abort")
    assert exc is not None
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    assert exc.details() == "explicit abort"


def test_client_cancellation_reaches_the_handler(
    channel: grpc.Channel, hang: Hang, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="stratad.server.interceptors")
    stream = channel.unary_stream(f"/{SERVICE}/Hang")(b"", timeout=30)
    assert next(stream) == b"first"
    stream.cancel()
    assert hang.done.wait(timeout=10), "handler never finished after the client cancelled"
    assert hang.outcome == ["cancelled"]
    interceptor_logs = [r for r in caplog.records if r.name == "stratad.server.interceptors"]
    assert not interceptor_logs  # a cancellation is not an error


@pytest.mark.parametrize("front", ["auto", "python"])
def test_server_keeps_serving_after_errors(
    inprocess_server: Callable[..., Any],
    hang: Hang,
    health_check: Callable[..., int],
    front: str,
) -> None:
    server = inprocess_server(services=[registration(hang)], front=front)
    # The native front door (auto) serves async handlers only: see `server`.
    methods = [m for m in METHODS if front == "python" or not m.endswith("Sync")]
    with grpc.insecure_channel(server.target) as channel:
        for method in methods:
            for payload in (b"RuntimeError", b"NotFoundError", b"abort"):
                collect(channel, method, payload)
        assert health_check(server.target) == health_pb2.HealthCheckResponse.SERVING
        for method in methods:
            assert call(channel, method, b"ok")[-1] == b"ok"


@pytest.mark.parametrize("method", list(METHODS))
def test_undecodable_requests_are_invalid_argument(channel: grpc.Channel, method: str) -> None:
    # grpc.aio alone answers UNKNOWN ("Unexpected ValueError"), or INTERNAL when
    # the handler reads the failing message from a request stream.
    received, exc = collect(channel, method, b"undecodable")
    assert exc is not None, f"{method} did not fail"
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exc.details() == (
        f"request is not a valid request message of /{SERVICE}/{method}: ValueError"
    )
    assert SECRET not in exc.details()
    assert received == []


@pytest.mark.parametrize("method", list(METHODS))
def test_not_implemented_is_unimplemented(channel: grpc.Channel, method: str) -> None:
    _, exc = collect(channel, method, b"NotImplementedError")
    assert exc is not None
    assert exc.code() == grpc.StatusCode.UNIMPLEMENTED
    assert exc.details() == f"method /{SERVICE}/{method} is not implemented"


def test_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as excinfo:
        channel.unary_unary(f"/{SERVICE}/NoSuchMethod")(b"", timeout=10)
    assert excinfo.value.code() == grpc.StatusCode.UNIMPLEMENTED
