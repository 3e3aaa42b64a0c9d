"""A real daemon whose journal fsync fails stops, and its restart recovers.

The fault is injected in the daemon process by a `sitecustomize` module on its
PYTHONPATH: once the flag file exists, fdatasync of any journal fails with EIO.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc
from stratad.sdk.client import Client
from stratad.store.failstop import EXIT_STORAGE_FAILED

PYTHON_SOURCE = Path(__file__).resolve().parents[2] / "python"

INJECT = """
import errno, os
_flag = os.environ["STRATAD_TEST_FSYNC_FLAG"]
_real = os.fdatasync

def fdatasync(fd):
    if os.path.exists(_flag):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.endswith("/journal"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
    return _real(fd)

os.fdatasync = fdatasync
"""


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc/self/fd")
def test_daemon_exits_on_a_failed_fsync_and_restarts_with_acknowledged_data(
    tmp_path: Path, start_daemon: Callable[..., Any]
) -> None:
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(INJECT)
    flag = tmp_path / "fail-fsync"
    env = {
        "PYTHONPATH": f"{inject}:{PYTHON_SOURCE}",
        "STRATAD_TEST_FSYNC_FLAG": str(flag),
    }
    daemon = start_daemon(env=env)
    with Client(daemon.target, timeout=10) as client:
        client.create_session("agent")
        first = client.save_state("agent", b"acknowledged" * 1000)
        flag.touch()
        # A plain stub: the SDK would retry UNAVAILABLE against the exiting daemon.
        with grpc.insecure_channel(daemon.target) as channel:
            stub = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
            request = checkpoint_pb2.SaveStateRequest(session_id="agent", data=b"lost?" * 1000)
            with pytest.raises(grpc.RpcError) as raised:
                stub.SaveState(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "storage failed" in (raised.value.details() or "")
    assert daemon.wait(timeout=30) == EXIT_STORAGE_FAILED
    assert "storage failed" in daemon.output()

    flag.unlink()
    restarted = start_daemon(data_dir=daemon.data_dir, env=env)
    with Client(restarted.target, timeout=10) as client:
        loaded = client.load_state("agent", first.checkpoint_id)
        assert loaded.data == b"acknowledged" * 1000
        client.save_state("agent", b"after the restart")
    assert restarted.stop() == 0
