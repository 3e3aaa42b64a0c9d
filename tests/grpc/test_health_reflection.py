"""Health, reflection and server options of an in-process server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from stratad.server.app import (
    HEALTH_SERVICE_NAME,
    MESSAGE_HEADROOM_BYTES,
    REFLECTION_SERVICE_NAME,
    REFLECTION_V1_SERVICE_NAME,
)
from stratad.server.reflection import v1_message_class
from stratad.server.registry import SERVICES, Resources, ServiceRegistration

ECHO_SERVICE = "stratad.test.v1.EchoService"
SERVING = health_pb2.HealthCheckResponse.SERVING


async def _echo(request: bytes, context: Any) -> bytes:
    return request


def echo_registration() -> ServiceRegistration:
    """A bytes-in, bytes-out service, registered the way real services are."""

    def add(servicer: object, server: Any) -> None:
        handlers = {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(ECHO_SERVICE, handlers),)
        )
        server.add_registered_method_handlers(ECHO_SERVICE, handlers)

    def factory(resources: Resources) -> object:
        return object()

    return ServiceRegistration(name=ECHO_SERVICE, add_fn=add, servicer_factory=factory)


def list_services(target: str) -> list[str]:
    with grpc.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    return [s.name for s in responses[0].list_services_response.service]


def reflect_v1(target: str, **request: Any) -> Any:
    """One grpc.reflection.v1 request and its response, with v1 messages (as grpcurl sends)."""
    request_class = v1_message_class("ServerReflectionRequest")
    response_class = v1_message_class("ServerReflectionResponse")
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(
            f"/{REFLECTION_V1_SERVICE_NAME}/ServerReflectionInfo",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        (response,) = call(iter([request_class(**request)]), timeout=10)
        return response


def check(target: str, service: str = "") -> int:
    with grpc.insecure_channel(target) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return int(health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status)


def test_health_serving(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server()
    assert server.target.startswith("127.0.0.1:")
    assert not server.target.endswith(":0")
    assert check(server.target) == SERVING


def test_reflection_lists_health_and_reflection(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server()
    names = list_services(server.target)
    assert HEALTH_SERVICE_NAME == "grpc.health.v1.Health"
    assert HEALTH_SERVICE_NAME in names
    assert REFLECTION_SERVICE_NAME in names


def test_reflection_v1_lists_and_describes_services(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server(services=[echo_registration()])
    listed = reflect_v1(server.target, list_services="")
    names = [s.name for s in listed.list_services_response.service]
    assert REFLECTION_V1_SERVICE_NAME == "grpc.reflection.v1.ServerReflection"
    for name in (ECHO_SERVICE, HEALTH_SERVICE_NAME, REFLECTION_V1_SERVICE_NAME):
        assert name in names
    assert REFLECTION_SERVICE_NAME in names  # v1alpha stays, for older clients
    # A client describing the v1 service gets a v1 file, whose messages it can decode.
    described = reflect_v1(server.target, file_containing_symbol=REFLECTION_V1_SERVICE_NAME)
    files = described.file_descriptor_response.file_descriptor_proto
    assert files, described
    proto = descriptor_pb2.FileDescriptorProto.FromString(files[0])
    assert proto.package == "grpc.reflection.v1"
    assert proto.service[0].method[0].input_type == ".grpc.reflection.v1.ServerReflectionRequest"


def test_reflection_v1_describes_an_application_service(
    inprocess_server: Callable[..., Any],
) -> None:
    server = inprocess_server(services=SERVICES)
    described = reflect_v1(server.target, file_containing_symbol="stratad.api.v1.SessionService")
    names = [
        descriptor_pb2.FileDescriptorProto.FromString(f).name
        for f in described.file_descriptor_response.file_descriptor_proto
    ]
    assert "stratad/api/v1/session.proto" in names
    unknown = reflect_v1(server.target, file_containing_symbol="no.such.Service")
    assert unknown.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_registered_service_is_served_listed_and_healthy(
    inprocess_server: Callable[..., Any],
) -> None:
    server = inprocess_server(services=[echo_registration()])
    assert ECHO_SERVICE in list_services(server.target)
    assert check(server.target, ECHO_SERVICE) == SERVING
    with grpc.insecure_channel(server.target) as channel:
        echo = channel.unary_unary(f"/{ECHO_SERVICE}/Echo")
        assert echo(b"hello", timeout=10) == b"hello"


def test_unknown_service_health_is_not_found(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server()
    with pytest.raises(grpc.RpcError) as excinfo:
        check(server.target, "no.such.Service")
    assert excinfo.value.code() == grpc.StatusCode.NOT_FOUND


def test_transport_refuses_messages_beyond_the_limit_and_its_headroom(
    inprocess_server: Callable[..., Any],
) -> None:
    # The transport admits max_message_bytes plus envelope headroom; the state
    # limit itself is the domain's (tests/grpc/test_checkpoints.py).
    limit = 4096 + MESSAGE_HEADROOM_BYTES
    server = inprocess_server(services=[echo_registration()], max_message_bytes=4096)
    with grpc.insecure_channel(
        server.target, options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        echo = channel.unary_unary(f"/{ECHO_SERVICE}/Echo")
        assert echo(b"x" * 5000, timeout=10) == b"x" * 5000
        with pytest.raises(grpc.RpcError) as excinfo:
            echo(b"x" * (limit + 1), timeout=10)
    assert excinfo.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_second_server_cannot_take_the_same_port(
    inprocess_server: Callable[..., Any],
) -> None:
    from stratad.server.app import ServerStartError

    first = inprocess_server()
    with pytest.raises(ServerStartError, match="cannot listen"):
        inprocess_server(listen=first.target)
