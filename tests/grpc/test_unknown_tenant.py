"""Reading as a tenant that does not exist answers NOT_FOUND or nothing, and writes nothing.

Every read RPC of every service is called with a plausible request (IDs
filled in) as tenant "ghost"; afterwards the data directory must hold no
trace of it. A caller-chosen tenant name must not be a way to make the daemon
create directories.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor

from stratad.server.registry import SERVICES

if TYPE_CHECKING:
    from conftest import Api

GHOST = "ghost"
#: Methods that only read (GC and Verify change nothing a tenant could read).
READ_PREFIXES = ("Get", "List", "Load", "Query", "Build", "Find", "Watch", "Verify", "Collect")
#: What a read of an unknown tenant may answer besides OK.
ALLOWED = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION}


def read_methods() -> list[MethodDescriptor]:
    pool = descriptor_pool.Default()
    return [
        method
        for registration in SERVICES
        for method in pool.FindServiceByName(registration.name).methods
        if method.name.startswith(READ_PREFIXES)
    ]


def plausible_request(method: MethodDescriptor) -> Any:
    request = message_factory.GetMessageClass(method.input_type)()
    for field in method.input_type.fields:
        is_string = field.type == FieldDescriptor.TYPE_STRING
        if is_string and field.name.endswith("_id") and not field.is_repeated:
            setattr(request, field.name, "x1")
        elif is_string and field.name in ("goal", "query", "goal_text") and not field.is_repeated:
            setattr(request, field.name, "find the revenue figures")
        elif field.name == "digests":
            getattr(request, field.name).append("a" * 64)
    return request


def call(api: Api, method: MethodDescriptor) -> tuple[grpc.StatusCode, list[Any]]:
    path = f"/{method.containing_service.full_name}/{method.name}"
    response_class = message_factory.GetMessageClass(method.output_type)
    kwargs: dict[str, Any] = {
        "request_serializer": lambda m: m.SerializeToString(),
        "response_deserializer": response_class.FromString,
    }
    request = plausible_request(method)
    metadata = (("x-stratad-tenant", GHOST),)
    try:
        if method.server_streaming:
            stream = api.channel.unary_stream(path, **kwargs)(request, metadata=metadata, timeout=2)
            return grpc.StatusCode.OK, list(stream)
        response = api.channel.unary_unary(path, **kwargs)(request, metadata=metadata, timeout=10)
        return grpc.StatusCode.OK, [response]
    except grpc.RpcError as exc:
        return exc.code(), []  # type: ignore[attr-defined]


def test_reads_of_an_unknown_tenant_create_nothing(api: Api) -> None:
    api.create("mine")  # the default tenant exists; "ghost" never does
    api.save("mine", b"state")
    tenants = api.server.resources.data_dir.path / "tenants"
    before = sorted(p.name for p in tenants.iterdir())
    methods = read_methods()
    assert len(methods) >= 20, [m.name for m in methods]
    outcomes = {m.name: call(api, m) for m in methods}
    for name, (code, _) in outcomes.items():
        assert code == grpc.StatusCode.OK or code in ALLOWED, (name, code)
    assert outcomes["GetSession"][0] == grpc.StatusCode.NOT_FOUND
    assert outcomes["WatchSession"][0] == grpc.StatusCode.NOT_FOUND
    _, (missing,) = outcomes["FindMissingChunks"]
    assert list(missing.missing) == ["a" * 64]
    _, (stats,) = outcomes["GetStoreStats"]
    assert (stats.sessions, stats.objects, stats.stored_bytes) == (0, 0, 0)
    assert sorted(p.name for p in tenants.iterdir()) == before == ["default"]
