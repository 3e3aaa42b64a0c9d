"""GetReplicationStatus and RestoreSessionFromRemote, in-process.

The daemon replicates to obstore's in-memory store (`memory:///`), a real
obstore backend; the S3 scenarios are in tests/e2e/test_replication_s3.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from stratad.api.v1 import admin_pb2, checkpoint_pb2, crystal_pb2, crystal_pb2_grpc
from stratad.store.objects import pack_entries

if TYPE_CHECKING:
    from conftest import Api


@pytest.fixture
def replicating(start_api: Callable[..., Api]) -> Api:
    return start_api(replication="sync", remote_url="memory:///", node_id="node-1")


def test_replication_status_reports_mode_owner_and_backlog(replicating: Api) -> None:
    replicating.create("s1")
    replicating.save("s1", b"state")
    status = replicating.call(
        replicating.admin.GetReplicationStatus, admin_pb2.GetReplicationStatusRequest()
    )
    assert (status.mode, status.node_id, status.sessions_owned) == ("sync", "node-1", 1)
    assert status.bytes_behind == 0 and status.lag_seconds == 0
    assert status.library_segments == 0  # nothing of the library written yet


def test_replication_status_counts_the_library_stream(replicating: Api) -> None:
    crystals = crystal_pb2_grpc.CrystalServiceStub(replicating.channel)
    step = crystal_pb2.TraceStep(decision="search", tool="web")
    replicating.call(
        crystals.Crystallize,
        crystal_pb2.CrystallizeRequest(
            goal="find flights", execution_trace=[step], success_score=1
        ),
    )
    status = replicating.call(
        replicating.admin.GetReplicationStatus, admin_pb2.GetReplicationStatusRequest()
    )
    # Sync: acknowledged once shipped; the first shipment also wrote the stream's base.
    assert status.library_records_behind == 0 and status.library_lag_seconds == 0
    assert status.library_segments == 2 and status.library_damaged_segments == 0


def test_a_damaged_local_copy_is_repaired_from_object_storage(replicating: Api) -> None:
    replicating.create("s1")
    data = bytes(range(256)) * 2000
    replicating.save("s1", data)
    resources = replicating.server.resources
    resources.engine.store.sync_objects()
    objects = Path(resources.data_dir.path) / "tenants" / "default" / "objects"
    for path, offset, _, length in list(pack_entries(objects / "packs")):
        with open(path, "r+b") as f:  # bit rot in every object
            f.seek(offset + length // 2)
            f.write(b"rotten")
    replicating.fails(
        replicating.checkpoints.LoadState,
        checkpoint_pb2.LoadStateRequest(session_id="s1"),
        grpc.StatusCode.DATA_LOSS,
    )
    restored = replicating.call(
        replicating.admin.RestoreSessionFromRemote,
        admin_pb2.RestoreSessionFromRemoteRequest(session_id="s1"),
    )
    assert restored.session.checkpoint_count == 1
    assert replicating.load("s1").data == data


def test_restore_of_an_unknown_session_is_not_found(replicating: Api) -> None:
    replicating.fails(
        replicating.admin.RestoreSessionFromRemote,
        admin_pb2.RestoreSessionFromRemoteRequest(session_id="nowhere"),
        grpc.StatusCode.NOT_FOUND,
        "object storage",
    )


def test_without_replication_the_admin_calls_say_so(api: Api) -> None:
    api.fails(
        api.admin.GetReplicationStatus,
        admin_pb2.GetReplicationStatusRequest(),
        grpc.StatusCode.FAILED_PRECONDITION,
        "replication is off",
    )
