"""Hostile bytes to every RPC: INVALID_ARGUMENT, never UNKNOWN or INTERNAL (issue #10 item 7).

Every method of every stratad service (found from the descriptors, so a new
RPC is covered without touching this file) gets malformed protobuf bytes with
raw serializers, the way a buggy or hostile client in any language could send
them. Then Struct fields with NaN, infinities and deep nesting. Every answer
must be INVALID_ARGUMENT naming the problem, and the daemon must keep serving.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import descriptor_pool, struct_pb2
from google.protobuf.descriptor import MethodDescriptor

from stratad.api.v1 import checkpoint_pb2
from stratad.server.registry import SERVICES

if TYPE_CHECKING:
    from conftest import Api

DEADLINE = 10.0
#: Wire-format garbage: each is not a valid message of any request type.
MALFORMED = {
    "invalid tag": b"\xff\xff\xff\xff",
    "truncated varint": b"\x08",
    "length past the end": b"\x0a\x7f",
    "wire type 7": b"\x0f\x01",
    "unterminated group": b"\x0b",
    "valid field, then garbage": b"\x0d\x01\x02\x03\x04\x12",
}


def methods() -> Iterator[tuple[str, MethodDescriptor]]:
    pool = descriptor_pool.Default()
    for registration in SERVICES:
        descriptor = pool.FindServiceByName(registration.name)
        for method in descriptor.methods:
            yield f"/{descriptor.full_name}/{method.name}", method


def call_raw(channel: grpc.Channel, path: str, method: MethodDescriptor, payload: bytes) -> None:
    """One call with `payload` as the (only) request message; raises grpc.RpcError."""
    if method.client_streaming:
        if method.server_streaming:
            stream = channel.stream_stream(path)
            list(stream(iter([payload]), timeout=DEADLINE))
        else:
            channel.stream_unary(path)(iter([payload]), timeout=DEADLINE)
    elif method.server_streaming:
        list(channel.unary_stream(path)(payload, timeout=DEADLINE))
    else:
        channel.unary_unary(path)(payload, timeout=DEADLINE)


def deep_struct(levels: int) -> struct_pb2.Struct:
    root = struct_pb2.Struct()
    node = root
    for _ in range(levels - 1):
        node = node.fields["d"].struct_value
    node.fields["leaf"].number_value = 1
    return root


def test_every_rpc_answers_malformed_bytes_with_invalid_argument(api: Api) -> None:
    seen: collections.Counter[str] = collections.Counter()
    wrong: list[str] = []
    for path, method in methods():
        for what, payload in MALFORMED.items():
            with pytest.raises(grpc.RpcError) as raised:
                call_raw(api.channel, path, method, payload)
            error: Any = raised.value
            seen[error.code().name] += 1
            details = error.details() or ""
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT or "not a valid" not in details:
                wrong.append(f"{path} [{what}]: {error.code().name} {details!r}")
    assert not wrong, "\n".join(wrong)
    assert seen["UNKNOWN"] == 0 and seen["INTERNAL"] == 0, seen
    assert sum(seen.values()) >= len(MALFORMED) * 40  # every RPC was tried
    api.create("still-serving")
    assert api.save("still-serving", b"ok").digest


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param(lambda s: s.fields["x"].__setattr__("number_value", float("nan")), id="nan"),
        pytest.param(lambda s: s.fields["x"].__setattr__("number_value", float("inf")), id="inf"),
        pytest.param(
            lambda s: (
                s.fields["l"].list_value.values.add().__setattr__("number_value", float("-inf"))
            ),
            id="-inf-in-a-list",
        ),
        pytest.param(lambda s: s.CopyFrom(deep_struct(25)), id="25-levels"),
    ],
)
def test_struct_fields_that_json_cannot_hold_are_invalid_argument(
    api: Api, metadata: Callable[[struct_pb2.Struct], None]
) -> None:
    api.create("agent")
    api.save("agent", b"before")
    request = checkpoint_pb2.SaveStateRequest(session_id="agent", data=b"after")
    metadata(request.metadata)
    api.fails(api.checkpoints.SaveState, request, grpc.StatusCode.INVALID_ARGUMENT, "Struct",
              keeps="agent")  # fmt: skip
    listing = checkpoint_pb2.ListCheckpointsRequest(session_id="agent")
    metadata(listing.metadata_filter)
    api.fails(api.checkpoints.ListCheckpoints, listing, grpc.StatusCode.INVALID_ARGUMENT, "Struct")


def test_a_struct_nested_past_protobufs_own_limit_is_invalid_argument(api: Api) -> None:
    """Hand-built wire bytes: the Python protobuf library refuses to build this."""
    api.create("agent")
    value = b"\x08\x00"  # Value{null_value: NULL_VALUE}
    struct = b""
    for _ in range(150):
        entry = b"\x0a\x01k\x12" + _varint(len(value)) + value  # {"k": value}
        struct = b"\x0a" + _varint(len(entry)) + entry  # Struct{fields: entry}
        value = b"\x2a" + _varint(len(struct)) + struct  # Value{struct_value: struct}
    payload = checkpoint_pb2.SaveStateRequest(session_id="agent", data=b"x").SerializeToString()
    payload += b"\x22" + _varint(len(struct)) + struct  # field 4: metadata
    with pytest.raises(grpc.RpcError) as raised:
        api.channel.unary_unary("/stratad.api.v1.CheckpointService/SaveState")(
            payload, timeout=DEADLINE
        )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert api.get("agent").version == 1


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if not n:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)
