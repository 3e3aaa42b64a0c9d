"""A real full disk: SIGKILL, restart read-only, writes resume when space returns.

The data directory lives on a small tmpfs. With the background syncer held
off (a long fsync interval), acknowledged saves exist only in their journals
when the daemon is killed, so the restart has to write their objects to a
disk with no room left. Rather than exit ("disk full during object write"),
it must start, serve every acknowledged state, refuse writes with
RESOURCE_EXHAUSTED (reason READ_ONLY) and report the health name
``stratad.writes`` NOT_SERVING, until the volume grows.

Needs permission to mount a tmpfs (root, as in CI); skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc, session_pb2, session_pb2_grpc
from stratad.server.app import WRITES_HEALTH_NAME

DISK_MB = 12
WAIT = 30.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def stubs(target: str) -> tuple[grpc.Channel, Any, Any, Any]:
    channel = grpc.insecure_channel(target)
    return (
        channel,
        session_pb2_grpc.SessionServiceStub(channel),
        checkpoint_pb2_grpc.CheckpointServiceStub(channel),
        health_pb2_grpc.HealthStub(channel),
    )


def writes_status(health: Any) -> int:
    request = health_pb2.HealthCheckRequest(service=WRITES_HEALTH_NAME)
    return int(health.Check(request, timeout=10).status)


def test_restart_on_a_full_disk_is_read_only_until_space_returns(
    small_disk: Path, start_daemon: Callable[..., Any]
) -> None:
    data_dir = small_disk / "data"
    env = {"STRATAD_FSYNC_INTERVAL_MS": "3600000"}  # no background object writes
    daemon = start_daemon(data_dir=data_dir, env=env)
    channel, sessions, checkpoints, _ = stubs(daemon.target)
    sessions.CreateSession(session_pb2.CreateSessionRequest(session_id="agent"), timeout=10)
    acknowledged: dict[str, bytes] = {}
    for _ in range(DISK_MB * 8):
        data = os.urandom(200_000)
        request = checkpoint_pb2.SaveStateRequest(session_id="agent", data=data)
        try:
            saved = checkpoints.SaveState(request, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
            break
        acknowledged[saved.checkpoint_id] = data
    else:
        pytest.fail("the disk never filled up")
    channel.close()
    assert len(acknowledged) >= 5
    daemon.kill()

    restarted = start_daemon(data_dir=data_dir)
    channel, sessions, checkpoints, health = stubs(restarted.target)
    with channel:
        assert writes_status(health) == health_pb2.HealthCheckResponse.NOT_SERVING
        for checkpoint_id, data in acknowledged.items():
            request = checkpoint_pb2.LoadStateRequest(
                session_id="agent", checkpoint_id=checkpoint_id
            )
            assert checkpoints.LoadState(request, timeout=10).data == data
        with pytest.raises(grpc.RpcError) as refused:
            request = checkpoint_pb2.SaveStateRequest(session_id="agent", data=b"x")
            checkpoints.SaveState(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "read-only" in (refused.value.details() or "")

        # The operator grows the volume: writes resume without a restart.
        subprocess.run(["mount", "-o", f"remount,size={DISK_MB * 4}m", str(small_disk)], check=True)
        deadline = time.monotonic() + WAIT
        while writes_status(health) != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, "writes never resumed"
            time.sleep(0.1)
        request = checkpoint_pb2.SaveStateRequest(session_id="agent", data=b"space is back")
        checkpoints.SaveState(request, timeout=10)
    assert restarted.stop() == 0
