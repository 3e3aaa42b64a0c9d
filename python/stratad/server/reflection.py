"""Server reflection under both names clients ask for: grpc.reflection.v1 and v1alpha.

grpcio-reflection serves only ``grpc.reflection.v1alpha.ServerReflection``
(its v1 is an open request upstream: grpc/grpc#38576), while grpcurl, Postman,
grpc-go and grpc-java clients ask for ``grpc.reflection.v1`` first. The two
protocols are the same: grpc-proto's ``grpc/reflection/v1/reflection.proto``
is the v1alpha file with its package renamed, message for message and field
number for field number. So v1 is served here by the same servicer:

- the v1 file descriptor is derived from the v1alpha one (package and type
  references renamed) and added to the default descriptor pool, so that a
  client describing ``grpc.reflection.v1.ServerReflection`` gets its file;
- the v1 method decodes v1 requests (a malformed one is INVALID_ARGUMENT
  naming the v1 type, like every RPC's), hands them to the v1alpha servicer
  re-encoded as v1alpha (the bytes are the same), and returns its answers as
  v1 messages.

Both are answered from the default descriptor pool seen through
`MethodSymbolPool`, which also finds the file of a method symbol
(``pkg.Service.Method``): protobuf's own lookup does not (see there).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1ALPHA_SERVICE_NAME: Final[str] = reflection.SERVICE_NAME
V1_PACKAGE: Final = "grpc.reflection.v1"
V1_FILE_NAME: Final = "grpc/reflection/v1/reflection.proto"
V1_SERVICE_NAME: Final = f"{V1_PACKAGE}.ServerReflection"
#: The services this module serves, for reflection's own list of services.
SERVICE_NAMES: Final = (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
_V1ALPHA_PACKAGE: Final = reflection_pb2.DESCRIPTOR.package
_METHOD: Final = "ServerReflectionInfo"


def _v1_file_proto() -> descriptor_pb2.FileDescriptorProto:
    """The v1alpha reflection file with its package (and every reference to it) renamed."""
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = V1_FILE_NAME
    proto.package = V1_PACKAGE
    # v1alpha's file options (deprecation, language packages) are not v1's.
    proto.ClearField("options")
    old, new = f".{_V1ALPHA_PACKAGE}.", f".{V1_PACKAGE}."
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    return proto


def v1_file_descriptor() -> FileDescriptor:
    """The grpc.reflection.v1 file in the default pool, added on first use."""
    pool = descriptor_pool.Default()
    try:
        # Already there: added before, or by a library that ships v1 itself.
        return pool.FindFileByName(V1_FILE_NAME)
    except KeyError:
        pool.AddSerializedFile(_v1_file_proto().SerializeToString())
        return pool.FindFileByName(V1_FILE_NAME)


def v1_message_class(name: str) -> type[Message]:
    """A grpc.reflection.v1 message class, e.g. "ServerReflectionRequest" (for clients, tests)."""
    descriptor = v1_file_descriptor().message_types_by_name[name]
    return message_factory.GetMessageClass(descriptor)


class MethodSymbolPool:
    """A descriptor pool whose FindFileContainingSymbol also resolves methods.

    grpcurl (``describe pkg.Service.Method``), ghz's ``--call`` and every
    grpc-go/grpc-java style client ask ``file_containing_symbol`` for a
    method's full name. grpcio-reflection answers it with the pool's
    FindFileContainingSymbol, and neither of protobuf's Python backends
    resolves methods there: upb's ``upb_DefPool_FindFileContainingSymbol``
    looks the name up in the symbol table (messages, enums, enum values,
    extensions, services: no methods) and then only tries ``Message.member``
    (fields, oneofs, nested types); the pure-Python pool's fallback likewise
    only looks inside messages. So every method was NOT_FOUND ("Symbol not
    found"). Here a symbol the pool does not find, whose parent is a service
    with a method of that name, resolves to its service's file, as grpc-go
    and grpc-java servers do. Everything else is the wrapped pool's. (A pool
    handed to the servicer's public ``pool`` argument, rather than a subclass
    overriding grpcio-reflection's private ``_file_containing_symbol``.)
    """

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> FileDescriptor:
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            # Not a message, enum, enum value, extension, field or service: a
            # method, or KeyError (NOT_FOUND) from FindMethodByName.
            return self._pool.FindMethodByName(symbol).containing_service.file


class ReflectionV1Servicer:
    """grpc.reflection.v1 over a v1alpha servicer: same protocol, other message classes."""

    def __init__(self, v1alpha: Any) -> None:
        self._v1alpha = v1alpha
        self.request_class = v1_message_class("ServerReflectionRequest")
        self.response_class = v1_message_class("ServerReflectionResponse")

    async def ServerReflectionInfo(
        self, requests: AsyncIterator[Message], context: Any
    ) -> AsyncIterator[Message]:
        async def as_v1alpha() -> AsyncIterator[Message]:
            async for request in requests:
                yield reflection_pb2.ServerReflectionRequest.FromString(request.SerializeToString())

        async for response in self._v1alpha.ServerReflectionInfo(as_v1alpha(), context):
            yield self.response_class.FromString(response.SerializeToString())

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {
            _METHOD: grpc.stream_stream_rpc_method_handler(
                self.ServerReflectionInfo,
                request_deserializer=self.request_class.FromString,
                response_serializer=self.response_class.SerializeToString,
            )
        }


def enable_server_reflection(service_names: Sequence[str], server: Any) -> None:
    """Serve reflection v1 and v1alpha on ``server`` (a grpc.aio.Server).

    ``service_names`` are the application services to list; both reflection
    services are added to them.
    """
    names = [*service_names, *(n for n in SERVICE_NAMES if n not in service_names)]
    pool = MethodSymbolPool(descriptor_pool.Default())
    v1alpha = reflection.aio.ReflectionServicer(names, pool=pool)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(v1alpha, server)
    # Both registrations, as generated code makes them: grpc.aio serves either,
    # the native front door the registered ones (server/front.py).
    handlers = ReflectionV1Servicer(v1alpha).method_handlers()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE_NAME, handlers),)
    )
    server.add_registered_method_handlers(V1_SERVICE_NAME, handlers)


__all__ = [
    "SERVICE_NAMES",
    "V1ALPHA_SERVICE_NAME",
    "V1_SERVICE_NAME",
    "MethodSymbolPool",
    "enable_server_reflection",
    "v1_file_descriptor",
    "v1_message_class",
]
