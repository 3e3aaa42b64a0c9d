"""Metadata nested too deep is one stratad error at every depth.

The daemon refuses JSON values nested deeper than 32 levels (INVALID_ARGUMENT,
reason INVALID_VALUE). Deeper than about 33 levels protobuf itself cannot
copy the Struct into a request (a raw ``google.protobuf.message.DecodeError``),
so the SDK refuses any depth past the limit itself, before sending, with the
daemon's own error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import struct_pb2

import stratad
from stratad.api.v1 import checkpoint_pb2
from stratad.errors import InvalidArgumentError
from stratad.sdk import client as sdk_client
from stratad.values import MAX_STRUCT_DEPTH

Daemon = Any
DEPTHS = (33, 34, 100, 5000)


def nested(depth: int, inner: Any = 1) -> dict[str, Any]:
    """A dict ``depth`` levels deep (``{"k": 1}`` is one level, as the daemon counts)."""
    value: Any = {"leaf": inner}
    for _ in range(depth - 1):
        value = {"k": value}
    return dict(value)


def test_the_sdk_limit_is_the_daemons() -> None:
    assert sdk_client.MAX_METADATA_DEPTH == MAX_STRUCT_DEPTH == 32


def assert_depth_error(exc: InvalidArgumentError) -> None:
    assert exc.reason == "INVALID_VALUE"
    assert exc.grpc_status == "INVALID_ARGUMENT"
    assert "nested deeper than 32 levels" in exc.message
    assert exc.metadata["max_depth"] == "32"


@pytest.mark.parametrize("depth", DEPTHS)
def test_too_deep_metadata_is_invalid_argument_from_the_sync_client(
    daemon: Daemon, depth: int
) -> None:
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        calls: dict[str, Callable[[], object]] = {
            "save_state": lambda: client.save_state("s", b"x", metadata=nested(depth)),
            "create_checkpoint": lambda: client.create_checkpoint("s", metadata=nested(depth)),
            "list_checkpoints": lambda: list(
                client.list_checkpoints("s", metadata_filter=nested(depth))
            ),
            # Depth through lists counts too: [[[...]]] is a level per list.
            "lists": lambda: client.save_state("s", b"x", metadata={"a": nested_list(depth)}),
        }
        for call in calls.values():
            with pytest.raises(InvalidArgumentError) as caught:
                call()
            assert_depth_error(caught.value)
        # Nothing was saved, and the daemon keeps serving.
        assert client.get_session("s").checkpoint_count == 0
        saved = client.save_state("s", b"ok", metadata=nested(MAX_STRUCT_DEPTH))
        assert client.load_state("s").checkpoint_id == saved.checkpoint_id
    assert daemon.proc.poll() is None


def nested_list(depth: int) -> Any:
    """Lists inside a one-level object: ``depth`` levels in all."""
    value: Any = [1]
    for _ in range(depth - 2):
        value = [value]
    return value


def test_the_sdk_refuses_what_the_daemon_refuses_with_the_same_error(daemon: Daemon) -> None:
    """At depth 33 protobuf can still carry the value: the daemon's own refusal,
    reached by a request built without the SDK's check, is the same error."""
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        metadata = struct_pb2.Struct()
        metadata.update(nested(33))
        request = checkpoint_pb2.CreateCheckpointRequest(session_id="s", metadata=metadata)
        with pytest.raises(InvalidArgumentError) as from_daemon:
            client.call(client.checkpoints.CreateCheckpoint, request)
        with pytest.raises(InvalidArgumentError) as from_sdk:
            client.create_checkpoint("s", metadata=nested(33))
    assert_depth_error(from_daemon.value)
    assert from_daemon.value.metadata == {"field": "metadata", "max_depth": "32"}
    assert from_sdk.value.message == from_daemon.value.message
    assert from_sdk.value.reason == from_daemon.value.reason
    assert from_sdk.value.metadata == from_daemon.value.metadata


def test_the_async_client_refuses_too(daemon: Daemon) -> None:
    async def main() -> None:
        async with stratad.AsyncClient(daemon.target) as client:
            await client.create_session("s")
            for depth in DEPTHS:
                with pytest.raises(InvalidArgumentError) as caught:
                    await client.save_state("s", b"x", metadata=nested(depth))
                assert_depth_error(caught.value)
            await client.save_state("s", b"ok", metadata=nested(MAX_STRUCT_DEPTH))

    asyncio.run(main())


def test_a_metadata_cycle_is_refused_not_looped_over() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(InvalidArgumentError) as caught:
        sdk_client.struct(cyclic)
    assert_depth_error(caught.value)
