"""Server reflection resolves every symbol a client may ask for, under v1 and v1alpha.

grpcurl (``describe pkg.Service.Method``), ghz's ``--call`` and grpc-go or
grpc-java clients send ``file_containing_symbol`` for services, methods,
messages (nested ones too), enums, enum values and fields, and expect the
file that defines the symbol first, then its dependencies. The daemon is the
real in-process server (tests/grpc/conftest.py), behind either front door;
requests are raw reflection messages of each protocol, several per stream as
grpcurl sends them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from stratad.server.app import (
    HEALTH_SERVICE_NAME,
    REFLECTION_SERVICE_NAME,
    REFLECTION_V1_SERVICE_NAME,
)
from stratad.server.reflection import v1_message_class
from stratad.server.registry import SERVICES

NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
PROTOCOLS = {
    "v1": (
        REFLECTION_V1_SERVICE_NAME,
        v1_message_class("ServerReflectionRequest"),
        v1_message_class("ServerReflectionResponse"),
    ),
    "v1alpha": (
        REFLECTION_SERVICE_NAME,
        reflection_pb2.ServerReflectionRequest,
        reflection_pb2.ServerReflectionResponse,
    ),
}

# (symbol, the file that defines it)
SYMBOLS = [
    ("stratad.api.v1.CheckpointService", "stratad/api/v1/checkpoint.proto"),
    # unary, server streaming and bidi streaming methods
    ("stratad.api.v1.CheckpointService.SaveState", "stratad/api/v1/checkpoint.proto"),
    ("stratad.api.v1.SessionService.WatchSession", "stratad/api/v1/session.proto"),
    ("stratad.api.v1.CheckpointService.SaveStates", "stratad/api/v1/checkpoint.proto"),
    ("stratad.api.v1.AdminService.Verify", "stratad/api/v1/admin.proto"),
    ("stratad.api.v1.SaveStateRequest", "stratad/api/v1/checkpoint.proto"),
    ("stratad.api.v1.SaveStateRequest.data", "stratad/api/v1/checkpoint.proto"),
    ("stratad.api.v1.ForkSessionRequest.LabelsEntry", "stratad/api/v1/checkpoint.proto"),
    ("stratad.api.v1.PruneStrategy", "stratad/api/v1/checkpoint.proto"),
    ("stratad.api.v1.PRUNE_STRATEGY_KEEP_LATEST", "stratad/api/v1/checkpoint.proto"),
    ("stratad.api.v1.SessionStatus", "stratad/api/v1/common.proto"),
    (HEALTH_SERVICE_NAME, "grpc_health/v1/health.proto"),
    (f"{HEALTH_SERVICE_NAME}.Check", "grpc_health/v1/health.proto"),
    (f"{HEALTH_SERVICE_NAME}.Watch", "grpc_health/v1/health.proto"),
    ("grpc.health.v1.HealthCheckResponse.ServingStatus", "grpc_health/v1/health.proto"),
    ("grpc.health.v1.HealthCheckResponse.SERVING", "grpc_health/v1/health.proto"),
    (REFLECTION_V1_SERVICE_NAME, "grpc/reflection/v1/reflection.proto"),
    (f"{REFLECTION_V1_SERVICE_NAME}.ServerReflectionInfo", "grpc/reflection/v1/reflection.proto"),
    (
        f"{REFLECTION_SERVICE_NAME}.ServerReflectionInfo",
        "grpc_reflection/v1alpha/reflection.proto",
    ),
]

UNKNOWN_SYMBOLS = [
    "no.such.Service",
    "stratad.api.v1.CheckpointService.NoSuchMethod",
    "stratad.api.v1.CheckpointService.SaveState.extra",
    "stratad.api.v1.SaveStateRequest.no_such_field",
    "stratad",
    "",
]


@pytest.fixture(params=["native", "python"])
def target(request: pytest.FixtureRequest, start_api: Callable[..., Any]) -> str:
    """The daemon with every service, behind the native or the grpc.aio front door."""
    api = start_api(front=request.param)
    assert api.server.config.native_front == (request.param == "native")
    return str(api.target)


@pytest.fixture(params=sorted(PROTOCOLS))
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def reflect(target: str, protocol: str, requests: Iterable[dict[str, Any]]) -> list[Any]:
    """Send ``requests`` on one reflection stream of ``protocol``; its responses, in order."""
    service, request_class, response_class = PROTOCOLS[protocol]
    messages = [request_class(**fields) for fields in requests]
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(
            f"/{service}/ServerReflectionInfo",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        responses = list(call(iter(messages), timeout=15))
    assert len(responses) == len(messages)
    for message, response in zip(messages, responses, strict=True):
        assert response.original_request == message
    return responses


def files_of(response: Any) -> list[descriptor_pb2.FileDescriptorProto]:
    assert response.WhichOneof("message_response") == "file_descriptor_response", response
    return [
        descriptor_pb2.FileDescriptorProto.FromString(data)
        for data in response.file_descriptor_response.file_descriptor_proto
    ]


def symbols_of(file: descriptor_pb2.FileDescriptorProto) -> set[str]:
    """Every full name ``file`` defines (enum values in their enum's scope, as protoc has it)."""
    names: set[str] = set()

    def enums(scope: str, enum_types: Iterable[descriptor_pb2.EnumDescriptorProto]) -> None:
        for enum in enum_types:
            names.add(f"{scope}.{enum.name}")
            names.update(f"{scope}.{value.name}" for value in enum.value)

    def messages(scope: str, types: Iterable[descriptor_pb2.DescriptorProto]) -> None:
        for message in types:
            name = f"{scope}.{message.name}"
            names.add(name)
            names.update(f"{name}.{field.name}" for field in message.field)
            messages(name, message.nested_type)
            enums(name, message.enum_type)

    messages(file.package, file.message_type)
    enums(file.package, file.enum_type)
    for service in file.service:
        name = f"{file.package}.{service.name}"
        names.add(name)
        names.update(f"{name}.{method.name}" for method in service.method)
    return names


def assert_complete(files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    """The answer carries every file its first file needs, transitively (a client builds them)."""
    names = {file.name for file in files}
    assert len(names) == len(files)
    for file in files:
        assert set(file.dependency) <= names, (file.name, file.dependency)


def test_every_symbol_resolves_to_its_file(target: str, protocol: str) -> None:
    responses = reflect(target, protocol, [{"file_containing_symbol": s} for s, _ in SYMBOLS])
    for (symbol, file_name), response in zip(SYMBOLS, responses, strict=True):
        files = files_of(response)
        assert files[0].name == file_name, symbol
        assert symbol in symbols_of(files[0])
        assert_complete(files)


def test_every_served_service_and_method_resolves(target: str, protocol: str) -> None:
    (listed,) = reflect(target, protocol, [{"list_services": ""}])
    services = sorted(s.name for s in listed.list_services_response.service)
    for name in (REFLECTION_V1_SERVICE_NAME, REFLECTION_SERVICE_NAME, HEALTH_SERVICE_NAME):
        assert name in services
    assert {registration.name for registration in SERVICES} <= set(services)
    described = reflect(target, protocol, [{"file_containing_symbol": s} for s in services])
    methods: list[str] = []
    for service, response in zip(services, described, strict=True):
        file = files_of(response)[0]
        (proto,) = (s for s in file.service if f"{file.package}.{s.name}" == service)
        assert proto.method, service
        methods.extend(f"{service}.{method.name}" for method in proto.method)
    resolved = reflect(target, protocol, [{"file_containing_symbol": m} for m in methods])
    for method, response in zip(methods, resolved, strict=True):
        files = files_of(response)
        assert method in symbols_of(files[0])
        assert_complete(files)


def test_unknown_symbol_is_not_found_and_the_stream_goes_on(target: str, protocol: str) -> None:
    requests = []
    for symbol in UNKNOWN_SYMBOLS:
        requests.append({"file_containing_symbol": symbol})
        requests.append({"file_containing_symbol": "stratad.api.v1.CheckpointService.SaveState"})
    responses = reflect(target, protocol, requests)
    for unknown, known in zip(responses[::2], responses[1::2], strict=True):
        assert unknown.WhichOneof("message_response") == "error_response", unknown
        assert unknown.error_response.error_code == NOT_FOUND
        assert files_of(known)[0].name == "stratad/api/v1/checkpoint.proto"


def test_file_by_filename(target: str, protocol: str) -> None:
    found, missing = reflect(
        target,
        protocol,
        [{"file_by_filename": "stratad/api/v1/session.proto"}, {"file_by_filename": "no.proto"}],
    )
    files = files_of(found)
    assert files[0].name == "stratad/api/v1/session.proto"
    assert "stratad.api.v1.SessionService.WatchSession" in symbols_of(files[0])
    assert_complete(files)
    assert missing.error_response.error_code == NOT_FOUND


def test_extensions_of_types_without_any(target: str, protocol: str) -> None:
    request = "stratad.api.v1.SaveStateRequest"
    numbers, unknown_type, extension, unknown_extendee = reflect(
        target,
        protocol,
        [
            {"all_extension_numbers_of_type": request},
            {"all_extension_numbers_of_type": "no.such.Message"},
            {"file_containing_extension": {"containing_type": request, "extension_number": 100}},
            {"file_containing_extension": {"containing_type": "no.such.Message"}},
        ],
    )
    assert numbers.all_extension_numbers_response.base_type_name == request
    assert list(numbers.all_extension_numbers_response.extension_number) == []
    for response in (unknown_type, extension, unknown_extendee):
        assert response.WhichOneof("message_response") == "error_response", response
        assert response.error_response.error_code == NOT_FOUND


def test_a_reflection_client_calls_a_method_it_only_knows_by_name(target: str) -> None:
    # As grpcurl does: resolve the method by reflection, build its messages, call it.
    with grpc.insecure_channel(target) as channel:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        save = pool.FindMethodByName("stratad.api.v1.CheckpointService.SaveState")
        assert save.input_type.full_name == "stratad.api.v1.SaveStateRequest"
        assert save.output_type.full_name == "stratad.api.v1.SaveStateResponse"
        create = pool.FindMethodByName("stratad.api.v1.SessionService.CreateSession")
        watch = pool.FindMethodByName("stratad.api.v1.SessionService.WatchSession")
        assert watch.server_streaming and not watch.client_streaming
        saves = pool.FindMethodByName("stratad.api.v1.CheckpointService.SaveStates")
        assert saves.server_streaming and saves.client_streaming

        def call(method: Any, **fields: Any) -> Any:
            request_class = message_factory.GetMessageClass(method.input_type)
            response_class = message_factory.GetMessageClass(method.output_type)
            stub = channel.unary_unary(
                f"/{method.containing_service.full_name}/{method.name}",
                request_serializer=request_class.SerializeToString,
                response_deserializer=response_class.FromString,
            )
            return stub(request_class(**fields), timeout=15)

        created = call(create, session_id="by-reflection")
        assert created.session.session_id == "by-reflection"
        saved = call(save, session_id="by-reflection", data=b'{"step": 1}')
        assert saved.checkpoint_id
