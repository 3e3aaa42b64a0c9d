"""Size limits of stored fields: labels and metadata, wherever they are accepted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import struct_pb2

from stratad.api.v1 import checkpoint_pb2, session_pb2
from stratad.domain.checkpoints import MAX_METADATA_BYTES
from stratad.domain.sessions import MAX_LABEL_KEY, MAX_LABEL_VALUE, MAX_LABELS
from stratad.sdk.client import error_info

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT

TOO_MANY = {f"k{i}": "v" for i in range(MAX_LABELS + 1)}
BAD_LABELS = [
    pytest.param(TOO_MANY, f"at most {MAX_LABELS} labels", id="count"),
    pytest.param({"k" * (MAX_LABEL_KEY + 1): "v"}, "label keys", id="key"),
    pytest.param({"": "v"}, "label keys", id="empty-key"),
    pytest.param({"k": "v" * (MAX_LABEL_VALUE + 1)}, "values must be at most", id="value"),
]


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def half_metadata() -> dict[str, str]:
    """Metadata just over half the limit: one fits, two merged do not."""
    return {"blob": "x" * (MAX_METADATA_BYTES // 2 + 100)}


@pytest.mark.parametrize(("labels", "words"), BAD_LABELS)
def test_labels_over_the_limits_are_refused_everywhere(
    api: Api, labels: dict[str, str], words: str
) -> None:
    api.fails(
        api.sessions.CreateSession,
        session_pb2.CreateSessionRequest(session_id="s", labels=labels),
        INVALID,
        words,
    )
    sessions = api.server.resources.data_dir.path / "tenants" / "default" / "sessions"
    assert not (sessions / "s").exists()
    api.create("src")
    saved = api.save("src", b"state")
    fork = checkpoint_pb2.ForkSessionRequest(checkpoint_id=saved.checkpoint_id, labels=labels)
    api.fails(api.checkpoints.ForkSession, fork, INVALID, words)
    copy = checkpoint_pb2.CopySessionRequest(source_session_id="src", labels=labels)
    api.fails(api.checkpoints.CopySession, copy, INVALID, words)
    with pytest.raises(grpc.RpcError) as raised:
        api.create("s", labels=labels)
    info = error_info(raised.value)
    assert info is not None and info.metadata["field"] == "labels"


def test_labels_at_the_limits_are_accepted(api: Api) -> None:
    labels = {f"{i:0{MAX_LABEL_KEY}d}": "v" * MAX_LABEL_VALUE for i in range(MAX_LABELS)}
    assert dict(api.create("s", labels=labels).labels) == labels


def test_merged_checkpoint_metadata_is_held_to_the_limit(api: Api) -> None:
    """CreateCheckpoint merges the head's metadata with its own: the result must fit."""
    api.create("s")
    api.save("s", b"state", metadata=struct(half_metadata()))
    request = checkpoint_pb2.CreateCheckpointRequest(
        session_id="s", metadata=struct({"other": "y" * (MAX_METADATA_BYTES // 2 + 100)})
    )
    api.fails(api.checkpoints.CreateCheckpoint, request, INVALID, "metadata", keeps="s")


def test_metadata_filters_are_held_to_the_limit(api: Api) -> None:
    api.create("s")
    big = struct({"blob": "x" * (MAX_METADATA_BYTES + 1)})
    listing = checkpoint_pb2.ListCheckpointsRequest(session_id="s", metadata_filter=big)
    api.fails(api.checkpoints.ListCheckpoints, listing, INVALID, "metadata")
    deleting = checkpoint_pb2.DeleteCheckpointsRequest(metadata_filters=[big])
    api.fails(api.checkpoints.DeleteCheckpoints, deleting, INVALID, "metadata")


def test_save_metadata_over_the_limit_is_refused_alone_in_a_stream(api: Api) -> None:
    api.create("s")
    big = struct({"blob": "x" * (MAX_METADATA_BYTES + 1)})
    items = [
        checkpoint_pb2.SaveStatesRequest(
            request=checkpoint_pb2.SaveStateRequest(session_id="s", data=b"a", metadata=big)
        ),
        checkpoint_pb2.SaveStatesRequest(
            request=checkpoint_pb2.SaveStateRequest(session_id="s", data=b"b")
        ),
    ]
    responses = list(api.checkpoints.SaveStates(iter(items), timeout=15))
    assert responses[0].error.code == INVALID.value[0]
    assert "metadata" in responses[0].error.message
    assert responses[1].HasField("response")
