"""Hostile input to every RPC the daemon serves: never UNKNOWN, never INTERNAL.

The methods are enumerated from the service descriptors of everything
`start_server` serves (the registered stratad services, health and
reflection), so a new RPC is covered without touching this file. Requests are
sent as raw bytes (no client-side serializer), so the payloads can be
anything: undecodable wire format, invalid UTF-8 in a string field, and
google.protobuf.Struct / Value / ListValue fields -- found by walking each
request's descriptor -- holding NaN, +/-Infinity or nesting far too deep.

Every call's status is counted; the test fails on any UNKNOWN or INTERNAL, and
the daemon must still answer valid calls afterwards.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import descriptor_pool, struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from stratad.api.v1 import checkpoint_pb2
from stratad.server.reflection import v1_file_descriptor
from stratad.server.registry import SERVICES
from stratad.values import MAX_STRUCT_DEPTH

if TYPE_CHECKING:
    from conftest import Api

DEADLINE = 15.0
BAD = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})

# --- the methods ------------------------------------------------------------------


def _served_services() -> list[Any]:
    pool = descriptor_pool.Default()
    names = [registration.name for registration in SERVICES]
    services = [pool.FindServiceByName(name) for name in names]
    services.append(health_pb2.DESCRIPTOR.services_by_name["Health"])
    services.append(reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"])
    services.append(v1_file_descriptor().services_by_name["ServerReflection"])
    return services


METHODS: list[MethodDescriptor] = [m for s in _served_services() for m in s.methods]


def _path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


# --- wire format by hand ----------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _double_field(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", value)


# google.protobuf.Struct {1: map<string, Value> fields}, Value {2: number_value,
# 5: struct_value, 6: list_value}, ListValue {1: repeated Value values}.


def _struct_of(value: bytes, key: bytes = b"k") -> bytes:
    """Struct contents {key: value}, value being Value contents."""
    return _len_field(1, _len_field(1, key) + _len_field(2, value))


def _number(n: float) -> bytes:
    return _double_field(2, n)


def _deep_struct_value(levels: int) -> bytes:
    """Value contents: ``{"k": {"k": ... 1 ...}}`` with `levels` Structs."""
    value = _number(1)
    for _ in range(levels):
        value = _len_field(5, _struct_of(value))
    return value


def _deep_list_value(levels: int) -> bytes:
    """Value contents: ``[[[... 1 ...]]]`` with `levels` lists."""
    value = _number(1)
    for _ in range(levels):
        value = _len_field(6, _len_field(1, value))
    return value


def _as(kind: str, value: bytes) -> bytes:
    """`value` (Value contents) as the contents of a message of type `kind`."""
    if kind == "google.protobuf.Struct":
        return _struct_of(value)
    if kind == "google.protobuf.ListValue":
        return _len_field(1, value)
    return value


#: Poisoned Values: (name, Value contents, words the error message must contain).
POISONS: list[tuple[str, bytes, tuple[str, ...]]] = [
    ("nan", _number(math.nan), ("nan",)),
    ("inf", _number(math.inf), ("inf",)),
    ("-inf", _number(-math.inf), ("inf",)),
    # 200 levels: beyond what the protobuf parser itself accepts.
    ("deep-struct", _deep_struct_value(200), ("nested",)),
    # Lists nest two messages per level: 40 of them still parse, but are
    # deeper than the daemon's limit.
    ("deep-list", _deep_list_value(MAX_STRUCT_DEPTH + 8), ("nested deeper",)),
]

#: Undecodable as any message: (name, payload).
MALFORMED: list[tuple[str, bytes]] = [
    ("varint-overflow", b"\xff\xff\xff\xff"),
    ("truncated-varint", b"\x08"),
    ("field-number-zero", b"\x00"),
    ("wire-type-6", b"\x0e"),
    ("unmatched-end-group", b"\x0c"),
    ("unterminated-group", b"\x0b"),
    ("length-overrun", b"\x0a\x05ab"),
    ("length-overrun-huge", b"\x0a\xff\xff\xff\xff\x0f"),
]

_JSON_TYPES = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}


def _json_paths(
    desc: Descriptor, prefix: tuple[FieldDescriptor, ...] = ()
) -> Iterator[tuple[tuple[FieldDescriptor, ...], str]]:
    """Every (field path, type) reaching a Struct/Value/ListValue inside `desc`."""
    if len(prefix) > 4:  # recursive messages: a few levels are enough
        return
    for field in desc.fields:
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        path = (*prefix, field)
        name = field.message_type.full_name
        if name in _JSON_TYPES:
            yield path, name
        else:
            yield from _json_paths(field.message_type, path)


def _wrap(path: tuple[FieldDescriptor, ...], contents: bytes) -> bytes:
    """A request whose field `path` holds a message with `contents`."""
    for field in reversed(path):
        contents = _len_field(field.number, contents)
    return contents


def _first_string_field(desc: Descriptor) -> FieldDescriptor | None:
    for field in desc.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            return field
    return None


# --- calling ----------------------------------------------------------------------


class Caller:
    """Sends raw bytes to any method and counts the statuses it sees."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.seen: Counter[str] = Counter()
        self.bad: list[str] = []

    def call(self, method: MethodDescriptor, payload: bytes, label: str) -> tuple[Any, str]:
        """Send `payload` (for a streaming request: as its only message).

        Returns (status code, details) of the call; for SaveStates-style
        streams whose items fail one by one, the first item error counts.
        """
        path = _path(method)
        code: Any = grpc.StatusCode.OK
        details = ""
        try:
            if method.client_streaming and method.server_streaming:
                responses = self.channel.stream_stream(path)(iter([payload]), timeout=DEADLINE)
                for response in responses:
                    code, details = _item_status(method, response, code, details)
            elif method.client_streaming:
                self.channel.stream_unary(path)(iter([payload]), timeout=DEADLINE)
            elif method.server_streaming:
                responses = self.channel.unary_stream(path)(payload, timeout=DEADLINE)
                next(responses, None)  # a watch sends its first event, or fails
                responses.cancel()
            else:
                self.channel.unary_unary(path)(payload, timeout=DEADLINE)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        self.seen[code.name] += 1
        if code in BAD:
            self.bad.append(f"{path} [{label}]: {code.name} {details!r}")
        return code, details


def _item_status(method: MethodDescriptor, response: bytes, code: Any, details: str) -> Any:
    """The first per-item error of a SaveStates-style stream response."""
    if method.output_type.full_name != checkpoint_pb2.SaveStatesResponse.DESCRIPTOR.full_name:
        return code, details
    item = checkpoint_pb2.SaveStatesResponse.FromString(response)
    if item.HasField("error") and code == grpc.StatusCode.OK:
        return _CODES[item.error.code], item.error.message
    return code, details


_CODES = {c.value[0]: c for c in grpc.StatusCode}


@pytest.fixture
def caller(api: Api) -> Iterator[Caller]:
    with grpc.insecure_channel(api.target) as channel:
        yield Caller(channel)


def _assert_still_serving(api: Api) -> None:
    session = api.create("after-hostile")
    api.save(session.session_id, b"state")
    assert api.load(session.session_id).data == b"state"
    with grpc.insecure_channel(api.target) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        response = check(health_pb2.HealthCheckRequest(), timeout=DEADLINE)
        assert response.status == health_pb2.HealthCheckResponse.SERVING


# --- the tests --------------------------------------------------------------------


def test_every_service_is_covered() -> None:
    services = {m.containing_service.full_name for m in METHODS}
    assert {r.name for r in SERVICES} <= services
    assert len(METHODS) > 50


def test_malformed_bytes_are_invalid_argument_on_every_rpc(api: Api, caller: Caller) -> None:
    wrong: list[str] = []
    for method in METHODS:
        for label, payload in MALFORMED:
            code, details = caller.call(method, payload, label)
            name = method.input_type.full_name
            if code != grpc.StatusCode.INVALID_ARGUMENT or name not in details:
                wrong.append(f"{_path(method)} [{label}]: {code.name} {details!r}")
    print(f"malformed: {dict(caller.seen)}")
    assert not caller.bad, "\n".join(caller.bad)
    assert not wrong, "\n".join(wrong)
    _assert_still_serving(api)


def test_invalid_utf8_in_a_string_field_is_invalid_argument(api: Api, caller: Caller) -> None:
    wrong: list[str] = []
    for method in METHODS:
        field = _first_string_field(method.input_type)
        if field is None:
            continue
        payload = _len_field(field.number, b"bad \xff\xfe utf-8")
        code, details = caller.call(method, payload, f"utf8 in {field.name}")
        if code != grpc.StatusCode.INVALID_ARGUMENT:
            wrong.append(f"{_path(method)} [{field.name}]: {code.name} {details!r}")
    print(f"invalid utf-8: {dict(caller.seen)}")
    assert not caller.bad, "\n".join(caller.bad)
    assert not wrong, "\n".join(wrong)
    _assert_still_serving(api)


def test_empty_requests_never_fail_unknown_or_internal(api: Api, caller: Caller) -> None:
    for method in METHODS:
        caller.call(method, b"", "empty")
    print(f"empty: {dict(caller.seen)}")
    assert not caller.bad, "\n".join(caller.bad)
    _assert_still_serving(api)


def test_poisoned_json_fields_on_every_rpc(api: Api, caller: Caller) -> None:
    """NaN, +/-Infinity and over-deep nesting in every Struct/Value/ListValue field."""
    session_id = api.create("poison-target").session_id
    calls = 0
    wrong: list[str] = []
    for method in METHODS:
        target = b""
        for field in method.input_type.fields:  # reach past "session not found"
            if field.name == "session_id" and field.type == FieldDescriptor.TYPE_STRING:
                target = _len_field(field.number, session_id.encode())
        for path, kind in _json_paths(method.input_type):
            for label, value, words in POISONS:
                where = ".".join(f.name for f in path)
                payload = target + _wrap(path, _as(kind, value))
                code, details = caller.call(method, payload, f"{label} in {where}")
                calls += 1
                if code != grpc.StatusCode.INVALID_ARGUMENT or any(
                    word not in details.lower() for word in words
                ):
                    wrong.append(f"{_path(method)} [{label} in {where}]: {code.name} {details!r}")
    print(f"poisoned json ({calls} calls): {dict(caller.seen)}")
    assert calls > 0
    assert not caller.bad, "\n".join(caller.bad)
    assert not wrong, "\n".join(wrong)
    _assert_still_serving(api)


SAVE_STATE = checkpoint_pb2.DESCRIPTOR.services_by_name["CheckpointService"].methods_by_name[
    "SaveState"
]
SAVE_STATES = checkpoint_pb2.DESCRIPTOR.services_by_name["CheckpointService"].methods_by_name[
    "SaveStates"
]


@pytest.mark.parametrize(("label", "value", "words"), POISONS, ids=[p[0] for p in POISONS])
def test_poisoned_metadata_on_save_state_is_invalid_argument(
    api: Api, caller: Caller, label: str, value: bytes, words: tuple[str, ...]
) -> None:
    session_id = api.create("s1").session_id
    request = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=b"x")
    payload = request.SerializeToString() + _len_field(4, _struct_of(value))
    before = api.get(session_id)
    for method in (SAVE_STATE, SAVE_STATES):
        if method is SAVE_STATES:
            item = _len_field(1, payload)  # SaveStatesRequest.request
            code, details = caller.call(method, item, label)
        else:
            code, details = caller.call(method, payload, label)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{code} {details!r}"
        for word in words:
            assert word in details.lower(), f"{word!r} not in {details!r}"
    after = api.get(session_id)
    assert (after.version, after.checkpoint_count) == (before.version, before.checkpoint_count)
    _assert_still_serving(api)


def test_metadata_nested_to_the_limit_round_trips(api: Api) -> None:
    session_id = api.create("s1").session_id
    value: Any = 1.0
    for _ in range(MAX_STRUCT_DEPTH):
        value = {"k": value}
    metadata = struct_pb2.Struct()
    metadata.update(value)  # the Struct is `value`: MAX_STRUCT_DEPTH levels
    api.save(session_id, b"x", metadata=metadata)
    assert api.load(session_id).metadata == metadata

    deeper = struct_pb2.Struct()
    deeper.update({"k": value})
    request = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=b"y", metadata=deeper)
    api.fails(api.checkpoints.SaveState, request, grpc.StatusCode.INVALID_ARGUMENT, "nested")


def test_save_states_keeps_serving_after_a_malformed_item(api: Api) -> None:
    """A malformed message in the middle of a SaveStates stream ends it as INVALID_ARGUMENT."""
    session_id = api.create("s1").session_id
    good = checkpoint_pb2.SaveStatesRequest(
        request=checkpoint_pb2.SaveStateRequest(session_id=session_id, data=b"x")
    ).SerializeToString()
    with grpc.insecure_channel(api.target) as channel:
        call = channel.stream_stream(_path(SAVE_STATES))
        with pytest.raises(grpc.RpcError) as excinfo:
            list(call(iter([good, b"\x0a\x05ab", good]), timeout=DEADLINE))
    error: Any = excinfo.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "stratad.api.v1.SaveStatesRequest" in error.details()
    assert api.get(session_id).checkpoint_count == 1  # the item before it was saved
    _assert_still_serving(api)
