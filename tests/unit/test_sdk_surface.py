"""The SDK's surface against the API it speaks, read from the proto descriptors.

`stratad.Client` and `stratad.AsyncClient` are written by hand, so they drift:
a field added to a request with no parameter to set it (``no_parent`` could be
sent by the TypeScript client and the LangGraph saver, not by
``Client.save_state``), a method or property one twin has and the other lacks.
This fails CI instead:

- every service of ``stratad.api.v1`` (every ``*_pb2`` module's descriptor) is
  either wrapped by the SDK or listed in `SERVICES_NOT_IN_SDK` with the reason;
- every RPC of a wrapped service has a method on both twins (the snake_case of
  its name, or `METHOD_OF_RPC`), unless it is in `RPCS_NOT_IN_SDK`;
- every field of its request, nested messages walked field by field, can be
  set through that method: a parameter of the field's name (explicit, or a key
  of the `Unpack`-ed TypedDict of its ``**options``), a parameter of another
  name listed in `PARAMETER_OF_FIELD`, or a field the method fills itself,
  listed in `SET_BY_THE_SDK`; a failure names the RPC, the method and the field;
- both twins have the same public methods and properties, with the same
  parameters (names, kinds, defaults), sync or async as they should be; the
  differences are the ones `ONLY_ONE_TWIN` lists;
- docs/sdk.md names every public method.

The tables below are checked too: an entry naming a field, parameter, RPC or
service that no longer exists fails, so they stay as short as the truth.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, struct_pb2, timestamp_pb2
from google.protobuf.descriptor import Descriptor, MethodDescriptor, ServiceDescriptor

import stratad.api.v1
from stratad.api.v1 import checkpoint_pb2, common_pb2, session_pb2
from stratad.sdk import messages
from stratad.sdk.async_client import AsyncClient
from stratad.sdk.sync_client import Client

ROOT = Path(__file__).resolve().parents[2]
TWINS = (Client, AsyncClient)

#: Services the SDK does not wrap method by method, and why.
SERVICES_NOT_IN_SDK: dict[str, str] = {
    # The structured-state services (docs/state.md): their Python API is the
    # compat facade of the system each was made for (docs/design.md), built on
    # a Client (its `channel` and `call`); agents reach them through
    # `stratad mcp` tools.
    "TaskService": "Python API: stratad.compat.aiwhisperer (and the ADK session service)",
    "CognitiveStateService": "Python API: stratad.compat.cortex_state (StateFileManager)",
    "AgentStateService": "Python API: stratad.compat.cogency (agent loop state)",
    "ProfileService": "Python API: stratad.compat.cogency (user profiles)",
    "CrystalService": "Python API: stratad.compat.cortex (MemoryCrystallizer)",
}

#: RPCs of wrapped services without a method of their own, and why.
RPCS_NOT_IN_SDK: dict[str, str] = {}

#: SDK methods whose name is not the snake_case of their RPC's.
METHOD_OF_RPC: dict[str, str] = {
    "AdminService.GetStoreStats": "store_stats",
    "AdminService.GetReplicationStatus": "replication_status",
}

#: Fields set through a parameter of another name: (RPC, field path) -> parameter.
PARAMETER_OF_FIELD: dict[tuple[str, str], str] = {
    # The client chunks `data` itself (sdk/upload.py; chunked_uploads=False: sent whole).
    ("CheckpointService.SaveState", "chunked"): "data",
    # pause_execution saves `data` with save_state's options, then pauses.
    ("CheckpointService.PauseExecution", "state.chunked"): "data",
    # Each element of `requests` is a whole SaveStateRequest.
    ("CheckpointService.SaveStates", "request"): "requests",
    # `writes` is a list of (idx, channel, type, value) tuples.
    ("CheckpointService.PutWrites", "writes.idx"): "writes",
    ("CheckpointService.PutWrites", "writes.channel"): "writes",
    ("CheckpointService.PutWrites", "writes.type"): "writes",
    ("CheckpointService.PutWrites", "writes.value"): "writes",
}

#: Fields the method fills itself, with why no parameter sets them.
SET_BY_THE_SDK: dict[tuple[str, str], str] = {
    ("SessionService.ListSessions", "page_token"): "the iterator follows every page",
    ("CheckpointService.ListCheckpoints", "page_token"): "the iterator follows every page",
}

#: Messages a parameter takes as one Python value (a dict, a datetime, ...):
#: not walked field by field.
WHOLE_MESSAGES = {
    "google.protobuf.Struct",
    "google.protobuf.Value",
    "google.protobuf.ListValue",
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
    "google.protobuf.FieldMask",
}

#: Parameters only one twin has: (method, parameter) -> why.
ONLY_ONE_TWIN: dict[tuple[str, str], str] = {
    ("__init__", "native_calls"): (
        "Client only: its unary calls may go over the native HTTP/2 client, which "
        "blocks; AsyncClient calls over grpc.aio"
    ),
}


# -- the API, from the descriptors --------------------------------------------------------


def services() -> dict[str, ServiceDescriptor]:
    """Every service of the stratad.api.v1 package, by name."""
    found: dict[str, ServiceDescriptor] = {}
    for module_info in pkgutil.iter_modules(stratad.api.v1.__path__):
        if not module_info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"stratad.api.v1.{module_info.name}")
        found.update(module.DESCRIPTOR.services_by_name)
    return found


def wrapped_rpcs() -> dict[str, MethodDescriptor]:
    """``Service.Rpc`` -> its descriptor, for every RPC the SDK should wrap."""
    return {
        f"{name}.{method.name}": method
        for name, service in sorted(services().items())
        if name not in SERVICES_NOT_IN_SDK
        for method in service.methods
    }


def method_name(rpc: str) -> str:
    return METHOD_OF_RPC.get(rpc) or re.sub(r"(?<!^)(?=[A-Z])", "_", rpc.split(".")[1]).lower()


def is_whole(message: Descriptor | None) -> bool:
    return message is None or message.GetOptions().map_entry or message.full_name in WHOLE_MESSAGES


def field_paths(
    message: Descriptor, prefix: str = "", above: frozenset[str] = frozenset()
) -> Iterator[str]:
    """Every field path of ``message``: nested messages field by field, and the
    message fields themselves (which a table may map as a whole)."""
    for field in message.fields:
        path = prefix + field.name
        yield path
        sub = field.message_type
        if not is_whole(sub) and sub.full_name not in above:
            yield from field_paths(sub, path + ".", above | {message.full_name})


# -- the SDK, from its signatures -----------------------------------------------------------


def options_keys(function: Callable[..., Any], name: str) -> set[str] | None:
    """The keys of ``**name: Unpack[SomeTypedDict]``; None for an untyped ``**name``."""
    hint = typing.get_type_hints(function, include_extras=True).get(name)
    if typing.get_origin(hint) is not typing.Unpack:
        return None
    (typed_dict,) = typing.get_args(hint)
    return set(typed_dict.__required_keys__ | typed_dict.__optional_keys__)


def signature(function: Callable[..., Any]) -> dict[str, tuple[str, Any]]:
    """Parameter name -> (kind, default), the keys of a typed ``**options``
    included (an untyped one appears as ``**options``)."""
    params: dict[str, tuple[str, Any]] = {}
    for p in inspect.signature(function).parameters.values():
        if p.name == "self":
            continue
        keys = options_keys(function, p.name) if p.kind is p.VAR_KEYWORD else None
        if keys is not None:
            for key in sorted(keys):
                params[key] = ("KEYWORD_ONLY (options)", inspect.Parameter.empty)
        elif p.kind is p.VAR_KEYWORD:
            params[f"**{p.name}"] = (p.kind.name, p.default)
        else:
            params[p.name] = (p.kind.name, p.default)
    return params


def unsettable(rpc: str, message: Descriptor, params: set[str], prefix: str = "") -> list[str]:
    """Field paths of ``message`` no parameter sets and no table explains."""
    missing = []
    for field in message.fields:
        path = prefix + field.name
        if (rpc, path) in PARAMETER_OF_FIELD or (rpc, path) in SET_BY_THE_SDK:
            continue
        if not is_whole(field.message_type):
            missing += unsettable(rpc, field.message_type, params, path + ".")
        elif field.name not in params:
            missing.append(path)
    return missing


# -- every field of every wrapped RPC can be set ----------------------------------------------


def test_every_service_is_wrapped_or_listed_with_its_reason() -> None:
    names = set(services())
    assert {"SessionService", "CheckpointService", "AdminService"} <= names - set(
        SERVICES_NOT_IN_SDK
    )
    assert set(SERVICES_NOT_IN_SDK) <= names, "SERVICES_NOT_IN_SDK names a service the API lacks"


@pytest.mark.parametrize("twin", TWINS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("rpc", sorted(wrapped_rpcs()))
def test_every_field_of_every_request_can_be_set(twin: type, rpc: str) -> None:
    if rpc in RPCS_NOT_IN_SDK:
        pytest.skip(f"{rpc} is not in the SDK: {RPCS_NOT_IN_SDK[rpc]}")
    name = method_name(rpc)
    method = getattr(twin, name, None)
    assert method is not None, f"{rpc}: {twin.__name__} has no method {name}"
    params = set(signature(method))
    hidden = [p for p in params if p.startswith("**")]
    assert not hidden, f"{twin.__name__}.{name} hides parameters in {hidden}: type them (Unpack)"
    missing = unsettable(rpc, wrapped_rpcs()[rpc].input_type, params)
    assert not missing, (
        f"{rpc}: {twin.__name__}.{name} cannot set {', '.join(missing)} (give it a parameter "
        "of that name, or map the field in PARAMETER_OF_FIELD or SET_BY_THE_SDK)"
    )


def test_a_field_new_in_the_proto_is_found() -> None:
    """What CI does when a request (or a message inside one) gains a field: the
    checkpoint.proto descriptors again, in a pool of their own, with one more
    field in SaveStateRequest and in WriteValue (a PutWrites write)."""
    pool = descriptor_pool.DescriptorPool()
    for module in (struct_pb2, timestamp_pb2, common_pb2, session_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        pool.Add(proto)
    proto = descriptor_pb2.FileDescriptorProto()
    checkpoint_pb2.DESCRIPTOR.CopyToProto(proto)
    for message in proto.message_type:
        if message.name in ("SaveStateRequest", "WriteValue"):
            message.field.add(
                name="brand_new",
                number=99,
                type=descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
            )
    pool.Add(proto)
    service = pool.FindServiceByName("stratad.api.v1.CheckpointService")
    for rpc, method, missing in (
        ("SaveState", Client.save_state, ["brand_new"]),
        ("PauseExecution", AsyncClient.pause_execution, ["state.brand_new"]),
        ("PutWrites", Client.put_writes, ["writes.brand_new"]),
    ):
        request = service.FindMethodByName(rpc).input_type
        params = set(signature(method))
        assert unsettable(f"CheckpointService.{rpc}", request, params) == missing


def test_the_tables_name_rpcs_fields_and_parameters_that_exist() -> None:
    rpcs = wrapped_rpcs()
    for rpc in [*RPCS_NOT_IN_SDK, *METHOD_OF_RPC]:
        assert rpc in rpcs, f"{rpc} is not an RPC of a wrapped service"
    for rpc, path in [*PARAMETER_OF_FIELD, *SET_BY_THE_SDK]:
        assert rpc in rpcs, f"{rpc} is not an RPC of a wrapped service"
        assert path in set(field_paths(rpcs[rpc].input_type)), f"{rpc} has no field {path}"
    for (rpc, path), param in PARAMETER_OF_FIELD.items():
        for twin in TWINS:
            method = getattr(twin, method_name(rpc))
            assert param in signature(method), f"{rpc} {path}: {method.__qualname__} has no {param}"


def test_no_rpc_is_listed_twice() -> None:
    assert not set(RPCS_NOT_IN_SDK) & set(METHOD_OF_RPC)
    assert not set(PARAMETER_OF_FIELD) & set(SET_BY_THE_SDK)


# -- the twins are alike ----------------------------------------------------------------------


def public_members(cls: type) -> dict[str, Any]:
    """Public methods, classmethods and properties (``__init__`` too), undecorated,
    inherited ones included: the RPC methods are the method layer's, a base class
    (sdk/_async_methods.py, and sdk/_sync_methods.py generated from it)."""
    members = {"__init__": cls.__init__}
    for klass in reversed(cls.__mro__[:-1]):  # the most derived last; object's left out
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                members[name] = value
    return members


def kind(member: Any) -> str:
    if isinstance(member, property):
        return "property"
    if isinstance(member, classmethod):
        return "classmethod"
    if inspect.isasyncgenfunction(member) or inspect.isgeneratorfunction(member):
        return "iterator"
    return "call"


def test_the_twins_have_the_same_methods_and_properties() -> None:
    sync, aio = public_members(Client), public_members(AsyncClient)
    assert sorted(sync) == sorted(aio)
    assert {n: kind(m) for n, m in sync.items()} == {n: kind(m) for n, m in aio.items()}


@pytest.mark.parametrize("name", sorted(public_members(Client)))
def test_the_twins_take_the_same_parameters(name: str) -> None:
    sync, aio = public_members(Client)[name], public_members(AsyncClient)[name]
    if isinstance(sync, property):
        return
    if isinstance(sync, classmethod):
        sync, aio = sync.__func__, aio.__func__
    only = {param for (method, param) in ONLY_ONE_TWIN if method == name}
    sync_params = {k: v for k, v in signature(sync).items() if k not in only}
    aio_params = {k: v for k, v in signature(aio).items() if k not in only}
    assert list(sync_params.items()) == list(aio_params.items())
    for param in only:  # still true: one twin has it, the other does not
        assert (param in signature(sync)) != (param in signature(aio)), (name, param)


def test_async_methods_are_awaitable_and_sync_ones_are_not() -> None:
    for name, member in public_members(AsyncClient).items():
        if kind(member) != "call" or name == "__init__":
            continue
        assert inspect.iscoroutinefunction(member), f"AsyncClient.{name} is not async"
        assert not inspect.iscoroutinefunction(getattr(Client, name)), f"Client.{name} is async"
    for name, member in public_members(AsyncClient).items():
        if kind(member) == "iterator":
            assert inspect.isasyncgenfunction(member), f"AsyncClient.{name} is not async"
            assert inspect.isgeneratorfunction(getattr(Client, name)), name
    assert hasattr(Client, "__enter__") and hasattr(Client, "__exit__")
    assert hasattr(AsyncClient, "__aenter__") and hasattr(AsyncClient, "__aexit__")


def test_the_twins_have_the_same_public_attributes() -> None:
    """What __init__ sets (stubs, connection, timeout...): a stub one twin lacks fails."""
    with Client("127.0.0.1:1", native_calls=False) as client:
        sync = {name for name in vars(client) if not name.startswith("_")}

    async def attributes() -> set[str]:
        async with AsyncClient("127.0.0.1:1") as client:
            return {name for name in vars(client) if not name.startswith("_")}

    assert sync == asyncio.run(attributes())


# -- what the tables and the docs promise -----------------------------------------------------


def test_save_request_sets_every_save_option() -> None:
    """SaveOptions (the keywords of save_state and pause_execution) reach the request."""
    values: dict[str, Any] = {
        "content_type": "text/plain",
        "metadata": {"step": 1},
        "checkpoint_id": "c1",
        "parent_checkpoint_id": "c0",
        "namespace": "ns",
        "no_parent": True,
    }
    keys = messages.SaveOptions.__required_keys__ | messages.SaveOptions.__optional_keys__
    assert set(values) == set(keys)
    request = messages.save_request("s", b"x", expected_version=3, **values)
    for key, value in values.items():
        sent = getattr(request, key)
        assert (dict(sent) if key == "metadata" else sent) == value, key
    assert request.expected_version == 3


def test_docs_sdk_md_names_every_public_method() -> None:
    page = (ROOT / "docs" / "sdk.md").read_text()
    named = set(re.findall(r"`(\w+)\(", page)) | set(re.findall(r"`(\w+)`", page))
    missing = sorted(set(public_members(Client)) - {"__init__"} - named)
    assert not missing, f"docs/sdk.md does not name {missing}"
