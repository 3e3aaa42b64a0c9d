"""``grpc.testing.TestService``: the server side of gRPC's interop tests, written
the way stratad's servicers are, for the daemon to serve in tests only.

The interop clients (tests/interop/test_interop.py) call it through the
daemon's front door, so it exercises what a real client meets there: unary
and streaming calls in every shape, metadata both ways, status codes and
messages, deadlines, cancellation and compression.

Its message classes are built at run time from a serialized
``google.protobuf.FileDescriptorSet`` of ``grpc/testing/test.proto`` and its
imports, which ``scripts/interop-tools.sh`` writes from the descriptors that
grpc-go registers: no copy of grpc's .proto files, no protoc output here.

Handlers are ``async def`` coroutines or async generators taking the request
(or request iterator) and the context, and use only what grpc.aio's
ServicerContext offers (and the native front door's `FrontContext` mirrors).
What the interop spec (doc/interop-test-descriptions.md in grpc/grpc) asks of
the server, by feature:

- EmptyCall, UnaryCall (``response_size``, ``response_type``: only
  COMPRESSABLE, else INVALID_ARGUMENT), StreamingOutputCall,
  StreamingInputCall (``aggregated_payload_size``), FullDuplexCall,
  HalfDuplexCall; ``UnimplementedCall`` (and CacheableUnaryCall) are not
  registered, so the server answers UNIMPLEMENTED itself;
- Echo Status: a request's ``response_status`` with a non-zero code ends the
  call with that code and message;
- Echo Metadata: ``x-grpc-test-echo-initial`` comes back in the initial
  metadata, ``x-grpc-test-echo-trailing-bin`` in the trailers;
- ``interval_us``: a sleep before each response;
- CompressedResponse: ``response_compressed`` (unary) or a response
  parameter's ``compressed`` (StreamingOutputCall) sends that response
  message compressed (gzip), and the others of the call uncompressed
  (FullDuplexCall and HalfDuplexCall ignore ``compressed``: no case asks);
- CompressedRequest: ``expect_compressed`` fails the call with
  INVALID_ARGUMENT if that request message did not arrive compressed. grpc.aio
  cannot tell: it decompresses before the handler sees a message and hides the
  ``grpc-encoding`` header from ``invocation_metadata()``. The native front
  door's context offers ``request_compressed()`` (whether the last request
  message read arrived compressed); without it, a request counts as compressed
  when ``grpc-encoding`` (other than identity) is in the invocation metadata,
  which under grpc.aio is never, so every ``expect_compressed`` request fails
  there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from stratad.server.registry import Resources, ServiceRegistration

SERVICE = "grpc.testing.TestService"
ECHO_INITIAL = "x-grpc-test-echo-initial"
ECHO_TRAILING = "x-grpc-test-echo-trailing-bin"
#: Status codes by number, for Echo Status.
_CODES = {code.value[0]: code for code in grpc.StatusCode}


class Messages:
    """The message classes of grpc/testing/test.proto (and the files it imports),
    built from a serialized FileDescriptorSet holding them."""

    def __init__(self, descriptor_set: bytes) -> None:
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
        self.pool = descriptor_pool.DescriptorPool()
        for file in files.file:  # dependencies first, as interop-tools.sh writes them
            self.pool.Add(file)
        self.service = self.pool.FindServiceByName(SERVICE)
        self.Empty = self._message("Empty")
        self.Payload = self._message("Payload")
        self.SimpleRequest = self._message("SimpleRequest")
        self.SimpleResponse = self._message("SimpleResponse")
        self.StreamingInputCallRequest = self._message("StreamingInputCallRequest")
        self.StreamingInputCallResponse = self._message("StreamingInputCallResponse")
        self.StreamingOutputCallRequest = self._message("StreamingOutputCallRequest")
        self.StreamingOutputCallResponse = self._message("StreamingOutputCallResponse")
        payload_types = self.pool.FindEnumTypeByName("grpc.testing.PayloadType")
        self.COMPRESSABLE = payload_types.values_by_name["COMPRESSABLE"].number

    @classmethod
    def from_file(cls, path: Path) -> Messages:
        return cls(path.read_bytes())

    def _message(self, name: str) -> Any:
        return message_factory.GetMessageClass(
            self.pool.FindMessageTypeByName(f"grpc.testing.{name}")
        )


class InvalidRequest(Exception):
    """A request the service refuses with INVALID_ARGUMENT."""


def request_compressed(context: Any) -> bool:
    """Whether the request message last read arrived compressed (see the module doc)."""
    probe = getattr(context, "request_compressed", None)
    if probe is not None:
        return bool(probe())
    encoding = dict(context.invocation_metadata() or ()).get("grpc-encoding")
    return encoding not in (None, "", "identity")


async def start_response(context: Any, *, compress: bool = False) -> None:
    """Echo Metadata, and gzip for the call's responses if ``compress``: call
    before the first response.

    The initial metadata goes out here (with the echo, if any) whenever there
    is compression: grpc.aio (1.85) compresses only after an explicit
    ``send_initial_metadata``; with the implicit one of a unary answer,
    ``set_compression`` is silently ignored (no grpc-encoding, flag unset)."""
    metadata = dict(context.invocation_metadata() or ())
    initial = ((ECHO_INITIAL, metadata[ECHO_INITIAL]),) if ECHO_INITIAL in metadata else ()
    if compress:
        context.set_compression(grpc.Compression.Gzip)
    if compress or initial:
        await context.send_initial_metadata(initial)
    if ECHO_TRAILING in metadata:
        context.set_trailing_metadata(((ECHO_TRAILING, metadata[ECHO_TRAILING]),))


async def echo_status(request: Any, context: Any) -> None:
    """Echo Status: end the call with the request's ``response_status``, if any."""
    if request.HasField("response_status") and request.response_status.code != 0:
        status = request.response_status
        await context.abort(_CODES.get(status.code, grpc.StatusCode.UNKNOWN), status.message)


async def check_compressed(request: Any, context: Any) -> None:
    """CompressedRequest: INVALID_ARGUMENT unless an ``expect_compressed``
    request arrived compressed."""
    if request.expect_compressed.value and not request_compressed(context):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, "expected a compressed request message"
        )


class InteropTestService:
    """grpc.testing.TestService over `Messages` (registered by `add_to_server`)."""

    def __init__(self, messages: Messages) -> None:
        self.messages = messages

    def _payload(self, payload_type: int, size: int) -> Any:
        if payload_type != self.messages.COMPRESSABLE:
            raise InvalidRequest(f"unsupported response_type {payload_type}")
        if size < 0:
            raise InvalidRequest(f"response size {size} is negative")
        return self.messages.Payload(type=payload_type, body=bytes(size))

    async def _response(self, payload_type: int, size: int, context: Any) -> Any:
        try:
            payload = self._payload(payload_type, size)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return self.messages.StreamingOutputCallResponse(payload=payload)

    async def EmptyCall(self, request: Any, context: Any) -> Any:
        await start_response(context)
        return self.messages.Empty()

    async def UnaryCall(self, request: Any, context: Any) -> Any:
        await start_response(context, compress=request.response_compressed.value)
        await check_compressed(request, context)
        await echo_status(request, context)
        try:
            payload = self._payload(request.response_type, request.response_size)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return self.messages.SimpleResponse(payload=payload)

    async def StreamingOutputCall(self, request: Any, context: Any) -> AsyncIterator[Any]:
        parameters = list(request.response_parameters)
        # Compression is chosen for the call; the messages not to compress opt out.
        compressed = any(p.compressed.value for p in parameters)
        await start_response(context, compress=compressed)
        await echo_status(request, context)
        for parameter in parameters:
            if parameter.interval_us > 0:
                await asyncio.sleep(parameter.interval_us / 1e6)
            response = await self._response(request.response_type, parameter.size, context)
            if compressed and not parameter.compressed.value:
                context.disable_next_message_compression()
            yield response

    async def StreamingInputCall(self, request_iterator: Any, context: Any) -> Any:
        await start_response(context)
        size = 0
        async for request in request_iterator:
            await check_compressed(request, context)
            size += len(request.payload.body)
        return self.messages.StreamingInputCallResponse(aggregated_payload_size=size)

    async def FullDuplexCall(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        await start_response(context)
        async for request in request_iterator:
            await echo_status(request, context)
            for parameter in request.response_parameters:
                if parameter.interval_us > 0:
                    await asyncio.sleep(parameter.interval_us / 1e6)
                yield await self._response(request.response_type, parameter.size, context)

    async def HalfDuplexCall(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        await start_response(context)
        requests = [request async for request in request_iterator]
        for request in requests:
            await echo_status(request, context)
            for parameter in request.response_parameters:
                if parameter.interval_us > 0:
                    await asyncio.sleep(parameter.interval_us / 1e6)
                yield await self._response(request.response_type, parameter.size, context)


def add_to_server(service: InteropTestService, server: Any) -> None:
    """What a generated ``add_TestServiceServicer_to_server`` does, for
    ``service``'s message classes: the native front door learns the handlers
    through `MethodRecorder.add_registered_method_handlers` too."""
    m = service.messages
    kinds: dict[str, tuple[Callable[..., grpc.RpcMethodHandler], Any, Any, Any]] = {
        "EmptyCall": (grpc.unary_unary_rpc_method_handler, service.EmptyCall, m.Empty, m.Empty),
        "UnaryCall": (
            grpc.unary_unary_rpc_method_handler,
            service.UnaryCall,
            m.SimpleRequest,
            m.SimpleResponse,
        ),
        "StreamingOutputCall": (
            grpc.unary_stream_rpc_method_handler,
            service.StreamingOutputCall,
            m.StreamingOutputCallRequest,
            m.StreamingOutputCallResponse,
        ),
        "StreamingInputCall": (
            grpc.stream_unary_rpc_method_handler,
            service.StreamingInputCall,
            m.StreamingInputCallRequest,
            m.StreamingInputCallResponse,
        ),
        "FullDuplexCall": (
            grpc.stream_stream_rpc_method_handler,
            service.FullDuplexCall,
            m.StreamingOutputCallRequest,
            m.StreamingOutputCallResponse,
        ),
        "HalfDuplexCall": (
            grpc.stream_stream_rpc_method_handler,
            service.HalfDuplexCall,
            m.StreamingOutputCallRequest,
            m.StreamingOutputCallResponse,
        ),
    }
    handlers = {}
    for name, (make, behavior, request, response) in kinds.items():
        method = m.service.methods_by_name[name]  # a typo or a changed .proto fails here
        assert method.input_type.full_name == request.DESCRIPTOR.full_name, name
        assert method.output_type.full_name == response.DESCRIPTOR.full_name, name
        handlers[name] = make(
            behavior,
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
    server.add_registered_method_handlers(SERVICE, handlers)


def registration(descriptor_set: Path) -> ServiceRegistration:
    """The TestService as a `ServiceRegistration`, for ``start_server(services=...)``."""
    messages = Messages.from_file(descriptor_set)

    def build(resources: Resources) -> InteropTestService:
        return InteropTestService(messages)

    return ServiceRegistration(name=SERVICE, add_fn=add_to_server, servicer_factory=build)
