"""Per-tenant quotas over gRPC: RESOURCE_EXHAUSTED, reason QUOTA_EXCEEDED, nothing changed."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from stratad.api.v1 import admin_pb2, checkpoint_pb2, session_pb2
from stratad.errors import ERROR_DOMAIN
from stratad.sdk.client import error_info

if TYPE_CHECKING:
    from conftest import Api

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def refused(api: Api, method: Callable[..., Any], request: Any, quota: str, limit: int) -> Any:
    """The call fails with QUOTA_EXCEEDED naming `quota`; returns the ErrorInfo."""
    with pytest.raises(grpc.RpcError) as raised:
        api.call(method, request)
    error: Any = raised.value
    assert error.code() == EXHAUSTED, error.details()
    assert quota in error.details()
    info = error_info(error)
    assert info is not None
    assert (info.domain, info.reason) == (ERROR_DOMAIN, "QUOTA_EXCEEDED")
    assert info.metadata["quota"] == quota
    assert info.metadata["limit"] == str(limit)
    return info


def save_request(session_id: str, data: bytes) -> checkpoint_pb2.SaveStateRequest:
    return checkpoint_pb2.SaveStateRequest(session_id=session_id, data=data)


def stored_bytes(api: Api) -> int:
    return int(api.call(api.admin.GetStoreStats, admin_pb2.GetStoreStatsRequest()).stored_bytes)


# -- sessions per tenant ------------------------------------------------------------


def test_sessions_quota(start_api: Callable[..., Api]) -> None:
    api = start_api(max_tenant_sessions=2)
    api.create("a")
    api.create("b")
    info = refused(
        api,
        api.sessions.CreateSession,
        session_pb2.CreateSessionRequest(session_id="c"),
        "max_tenant_sessions",
        2,
    )
    assert info.metadata["usage"] == "2"
    sessions_dir = api.server.resources.data_dir.path / "tenants" / "default" / "sessions"
    assert sorted(p.name for p in sessions_dir.iterdir()) == ["a", "b"]  # nothing written
    # Forks and copies are new sessions too.
    saved = api.save("a", b"state")
    fork = checkpoint_pb2.ForkSessionRequest(checkpoint_id=saved.checkpoint_id)
    refused(api, api.checkpoints.ForkSession, fork, "max_tenant_sessions", 2)
    copy = checkpoint_pb2.CopySessionRequest(source_session_id="a")
    refused(api, api.checkpoints.CopySession, copy, "max_tenant_sessions", 2)
    # The quota is per tenant; deleting makes room.
    api.as_tenant("other").create("c")
    api.call(api.sessions.DeleteSession, session_pb2.DeleteSessionRequest(session_id="b"))
    api.create("c")


# -- checkpoints per session -----------------------------------------------------------


def test_checkpoints_quota_refuses_saves_and_named_checkpoints(
    start_api: Callable[..., Api],
) -> None:
    api = start_api(max_session_checkpoints=3)
    api.create("s")
    ids = [api.save("s", f"step {i}".encode()).checkpoint_id for i in range(3)]
    api.fails(
        api.checkpoints.SaveState,
        save_request("s", b"step 3"),
        EXHAUSTED,
        "max_session_checkpoints",
        keeps="s",
    )
    info = refused(
        api, api.checkpoints.SaveState, save_request("s", b"step 3"), "max_session_checkpoints", 3
    )
    assert info.metadata["usage"] == "3"
    create = checkpoint_pb2.CreateCheckpointRequest(session_id="s", name="pin")
    refused(api, api.checkpoints.CreateCheckpoint, create, "max_session_checkpoints", 3)
    api.call(
        api.checkpoints.DeleteCheckpoint,
        checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id=ids[0]),
    )
    api.save("s", b"step 3")
    assert api.load("s").data == b"step 3"


def test_checkpoints_quota_lets_retention_make_room(start_api: Callable[..., Api]) -> None:
    api = start_api(max_session_checkpoints=3)
    api.create("s", retention=session_pb2.RetentionPolicy(keep_last=3))
    for i in range(10):  # each save drops the oldest at the same time
        api.save("s", f"step {i}".encode())
    assert len(api.checkpoint_ids("s")) == 3


def test_checkpoints_quota_fails_a_save_states_item_alone(start_api: Callable[..., Api]) -> None:
    api = start_api(max_session_checkpoints=1)
    api.create("full")
    api.create("empty")
    api.save("full", b"one")
    items = [
        checkpoint_pb2.SaveStatesRequest(request=save_request(s, b"two")) for s in ("full", "empty")
    ]
    responses = list(api.checkpoints.SaveStates(iter(items), timeout=15))
    assert responses[0].error.code == EXHAUSTED.value[0]
    assert "max_session_checkpoints" in responses[0].error.message
    assert responses[1].HasField("response")


# -- stored bytes per tenant ------------------------------------------------------------

QUOTA = 300_000


def fill(api: Api, session_id: str) -> int:
    """Save incompressible states until the quota refuses one; the number saved."""
    for n in range(100):
        try:
            api.save(session_id, os.urandom(40_000))
        except grpc.RpcError as exc:
            assert exc.code() == EXHAUSTED, exc.details()
            return n
    raise AssertionError("the quota never refused a save")


def test_stored_bytes_quota_refuses_the_save_that_would_exceed_it(
    start_api: Callable[..., Api],
) -> None:
    api = start_api(max_tenant_stored_bytes=QUOTA)
    api.create("s")
    saved = fill(api, "s")
    assert saved >= 2
    assert stored_bytes(api) <= QUOTA  # the usage the quota sees is what stats report
    info = refused(
        api,
        api.checkpoints.SaveState,
        save_request("s", os.urandom(40_000)),
        "max_tenant_stored_bytes",
        QUOTA,
    )
    assert 0 < int(info.metadata["usage"]) <= QUOTA
    api.fails(
        api.checkpoints.SaveState,
        save_request("s", os.urandom(40_000)),
        EXHAUSTED,
        "max_tenant_stored_bytes",
        "CollectGarbage",
        keeps="s",
    )
    # Another tenant has a quota of its own.
    other = api.as_tenant("other")
    other.create("s")
    other.save("s", os.urandom(40_000))


def test_a_full_tenant_may_delete_and_collect_to_make_room(
    start_api: Callable[..., Api], tmp_path: Path
) -> None:
    # A tenant over its quota (here: the quota was lowered across a restart).
    before = start_api(data_dir=tmp_path / "data")
    before.create("s")
    for _ in range(9):  # over the quota in objects alone (the journal compacts on the way)
        before.save("s", os.urandom(40_000))
    assert stored_bytes(before) > QUOTA
    before.server.stop()
    api = start_api(data_dir=tmp_path / "data", max_tenant_stored_bytes=QUOTA)
    # Even small mutations are refused: the tenant is full...
    refused(
        api,
        api.checkpoints.PauseExecution,
        checkpoint_pb2.PauseExecutionRequest(session_id="s"),
        "max_tenant_stored_bytes",
        QUOTA,
    )
    # ...but deleting never is.
    ids = api.checkpoint_ids("s")
    api.call(
        api.checkpoints.DeleteCheckpoint,
        checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id=ids[-1]),
    )
    api.call(api.sessions.DeleteSession, session_pb2.DeleteSessionRequest(session_id="s"))
    api.call(api.admin.CollectGarbage, admin_pb2.CollectGarbageRequest())
    assert stored_bytes(api) == 0
    api.create("t")
    api.save("t", os.urandom(40_000))


def test_the_quota_counts_what_a_save_adds_not_its_size(start_api: Callable[..., Api]) -> None:
    api = start_api(max_tenant_stored_bytes=QUOTA)
    state = os.urandom(100_000)
    api.create("s")
    for _ in range(10):  # 1 MB of states; after the first, every chunk is stored already
        api.save("s", state)
    assert stored_bytes(api) <= QUOTA
