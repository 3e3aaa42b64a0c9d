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
- the v1 method runs the v1alpha servicer; requests and responses are
  byte-identical on the wire, so v1alpha's (de)serializers serve both.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def enable_server_reflection(service_names: Sequence[str], server: Any) -> None:
    """Serve reflection v1 and v1alpha on ``server`` (a grpc.aio.Server).

    ``service_names`` are the application services to list; both reflection
    services are added to them.
    """
    v1_file_descriptor()
    names = [*service_names, *(n for n in SERVICE_NAMES if n not in service_names)]
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1_handler = grpc.method_handlers_generic_handler(
        V1_SERVICE_NAME,
        {
            _METHOD: grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1_handler,))


__all__ = [
    "SERVICE_NAMES",
    "V1ALPHA_SERVICE_NAME",
    "V1_SERVICE_NAME",
    "enable_server_reflection",
    "v1_file_descriptor",
    "v1_message_class",
]
