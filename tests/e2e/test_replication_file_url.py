"""Replication to a ``file://`` directory, with real daemons.

obstore's LocalFileSystem has no conditional replace (``PutMode::Update``),
which a session's HEAD needs after its creation: without one, every save
after CreateSession would fail in `sync` mode, and in `async` mode the lag
would grow forever with a warning every round. So store/remote.py replaces a
HEAD in a directory under a lock file (docs/replication.md).

1. Sync mode: every save succeeds, the history and objects are files under the
   directory, and a daemon with an empty data directory resumes the session
   from it (reads every checkpoint, then writes once the lease lapsed).
2. Async mode: the lag of a saved session returns to 0, and the shipping
   loop logs no failure.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stratad import native
from stratad.api.v1 import admin_pb2
from stratad.errors import FailedPreconditionError
from stratad.sdk.client import Client

TENANT = "default"
LEASE_MS = 1000
#: A generous bound for things that take well under a second.
DEADLINE = 60.0


def on_directory(
    start_daemon: Callable[..., Any], remote: Path, mode: str, node: str, data_dir: Path
) -> Any:
    args = [
        "--replication", mode, "--remote-url", remote.as_uri(),
        "--replication-lease-ms", str(LEASE_MS), "--replication-lag-ms", "200",
        "--node-id", node,
    ]  # fmt: skip
    return start_daemon(*args, data_dir=data_dir)


def replication_status(client: Client) -> Any:
    return client.call(client.admin.GetReplicationStatus, admin_pb2.GetReplicationStatusRequest())


def shipping_failures(daemon: Any) -> list[str]:
    return [line for line in daemon.output().splitlines() if "failed" in line.lower()]


def test_sync_mode_on_a_directory_saves_and_resumes_elsewhere(
    start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    a = on_directory(start_daemon, remote, "sync", "a", tmp_path / "a")
    saved: dict[str, str] = {}
    with Client(a.target, timeout=30) as client:
        client.create_session("s1")
        for n in range(6):  # each one moves the HEAD: a conditional replace
            data = os.urandom(20_000) + bytes([n]) * 50_000
            response = client.save_state("s1", data)
            saved[response.checkpoint_id] = response.digest
        assert client.get_session("s1").checkpoint_count == 6

    session = remote / "tenants" / TENANT / "sessions" / "s1"
    assert (session / "HEAD").is_file()
    segments = sorted((session / "seg").iterdir())
    assert segments and all(s.stat().st_size > 0 for s in segments)
    packs = remote / "tenants" / TENANT / "packs"
    assert list(packs.glob("*.pack")) and list(packs.glob("*.idx"))
    assert not shipping_failures(a), a.output()

    a.kill()  # the pod goes, and its volume with it
    shutil.rmtree(tmp_path / "a")
    b = on_directory(start_daemon, remote, "sync", "b", tmp_path / "b")
    with Client(b.target, timeout=30) as client:
        listed = {cp.checkpoint_id for cp in client.list_checkpoints("s1")}
        assert listed == set(saved)
        for checkpoint_id, digest in saved.items():
            loaded = client.load_state("s1", checkpoint_id)
            assert loaded.digest == digest and native.digest_hex(loaded.data) == digest
        # b takes the session over once a's lease has lapsed: a conditional
        # replace of the HEAD a wrote.
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                last = client.save_state("s1", b"written by b")
                break
            except FailedPreconditionError as exc:
                assert exc.reason == "LEASE_HELD", exc
                assert time.monotonic() < deadline, "b never took the session over"
                time.sleep(0.2)
        client.save_state("s1", b"written by b, again")
    b.stop()

    c = on_directory(start_daemon, remote, "sync", "c", tmp_path / "c")
    with Client(c.target, timeout=30) as client:
        assert client.load_state("s1").data == b"written by b, again"
        history = {cp.checkpoint_id for cp in client.list_checkpoints("s1")}
        assert history >= {*saved, last.checkpoint_id} and len(history) == 8


def test_async_mode_on_a_directory_catches_up(
    start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    a = on_directory(start_daemon, remote, "async", "a", tmp_path / "a")
    with Client(a.target, timeout=30) as client:
        client.create_session("s1")
        ids = [client.save_state("s1", os.urandom(10_000)).checkpoint_id for _ in range(5)]
        deadline = time.monotonic() + DEADLINE
        while True:
            status = replication_status(client)
            if status.bytes_behind == 0 and status.lag_seconds == 0:
                break
            assert time.monotonic() < deadline, f"never shipped: {status}\n{a.output()}"
            time.sleep(0.1)
        assert status.sessions_owned == 1
    assert not shipping_failures(a), a.output()

    a.kill()
    b = on_directory(start_daemon, remote, "async", "b", tmp_path / "b")
    with Client(b.target, timeout=30) as client:
        assert {cp.checkpoint_id for cp in client.list_checkpoints("s1")} == set(ids)
