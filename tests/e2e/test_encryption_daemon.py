"""Encryption at rest through a real ``stratad serve`` (docs/security.md).

A daemon with ``encryption = on`` and a master key file serves saves, loads,
forks, structured state, profiles and crystals; none of a distinctive string
is anywhere in the data directory's files; two identical saves store their
chunks once; Verify finds a flipped byte in a sealed object; ``stratad
rotate-key`` re-wraps the tenants' data keys offline, after which the daemon
starts with the new key alone. Starts with a missing or wrong key, or with
encryption off on an encrypted data directory, are refused with a message
naming the key id needed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest

import stratad
from stratad import native
from stratad.api.v1 import (
    cognitive_pb2,
    cognitive_pb2_grpc,
    crystal_pb2,
    crystal_pb2_grpc,
    profile_pb2,
    profile_pb2_grpc,
)
from stratad.errors import DataLossError
from stratad.store.crypto import load_master_key
from stratad.store.objects import find_on_disk

SECRET = "the-launch-code-is-7731-swordfish"
TENANT = "default"


class Daemon(Protocol):
    """What these tests use of the e2e conftest's ``Daemon``."""

    target: str
    data_dir: Path

    def stop(self, timeout: float = 30.0) -> int: ...
    def output(self) -> str: ...


StartDaemon = Callable[..., Daemon]
Run = Callable[..., subprocess.CompletedProcess[str]]


def keygen(run_stratad: Run, path: Path) -> str:
    """A new master key file (via `stratad keygen`); returns its key id."""
    result = run_stratad("keygen")
    assert result.returncode == 0, result.stderr
    path.write_text(result.stdout)
    path.chmod(0o600)
    return load_master_key(path).key_id


def chunk_digests(data: bytes) -> list[str]:
    return [native.digest_hex(data[o : o + n]) for o, n in native.chunk_boundaries(data)]


def state() -> bytes:
    return os.urandom(150_000) + SECRET.encode() * 50 + os.urandom(150_000)


def files_containing(root: Path, needle: bytes) -> list[str]:
    return [
        os.path.join(directory, name)
        for directory, _, files in os.walk(root)
        for name in files
        if needle in (Path(directory) / name).read_bytes()
    ]


def fill(client: stratad.Client) -> tuple[bytes, str]:
    """Every kind of user data, each with SECRET in it; returns (state, checkpoint id)."""
    data = state()
    client.create_session("s1", labels={"team": "x"})
    saved = client.save_state("s1", data, metadata={"note": SECRET})
    channel, md = client.channel, client.metadata
    cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
    cognitive.Initialize(cognitive_pb2.InitializeRequest(session_id="s1", goal=SECRET), metadata=md)
    cognitive.RecordDecision(
        cognitive_pb2.RecordDecisionRequest(session_id="s1", step=1, decision=SECRET), metadata=md
    )
    crystals = crystal_pb2_grpc.CrystalServiceStub(channel)
    step = crystal_pb2.TraceStep(decision=SECRET, tool="kubectl")
    request = crystal_pb2.CrystallizeRequest(
        goal=f"deploy {SECRET}", execution_trace=[step], success_score=0.9, session_id="s1"
    )
    crystals.Crystallize(request, metadata=md)
    profiles = profile_pb2_grpc.ProfileServiceStub(channel)
    profiles.UpdateProfile(
        profile_pb2.UpdateProfileRequest(user_id="u1", goals=[SECRET]), metadata=md
    )
    client.save_state("s1", b"small " + SECRET.encode())  # a single-chunk state too
    return data, saved.checkpoint_id


def check_everything_reads_back(client: stratad.Client, data: bytes, checkpoint_id: str) -> None:
    assert client.load_state("s1", checkpoint_id=checkpoint_id).data == data
    assert client.load_state("fork").data == data
    md = client.metadata
    cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(client.channel)
    got = cognitive.GetCognitiveState(
        cognitive_pb2.GetCognitiveStateRequest(session_id="s1"), metadata=md
    )
    assert got.state.crystallized.goal == SECRET
    crystals = crystal_pb2_grpc.CrystalServiceStub(client.channel).ListCrystals(
        crystal_pb2.ListCrystalsRequest(), metadata=md
    )
    assert list(crystals.crystals[0].decision_chain) == [SECRET]
    profile = profile_pb2_grpc.ProfileServiceStub(client.channel).GetProfile(
        profile_pb2.GetProfileRequest(user_id="u1"), metadata=md
    )
    assert SECRET in str(profile)
    assert client.verify().ok


def test_encrypted_daemon_round_trip_rotation_and_refusals(
    start_daemon: StartDaemon, run_stratad: Run, tmp_path: Path, get_free_port: Callable[[], int]
) -> None:
    old_key, new_key = tmp_path / "old.key", tmp_path / "new.key"
    old_id, new_id = keygen(run_stratad, old_key), keygen(run_stratad, new_key)
    encrypted = ("--encryption", "on", "--encryption-key-file")
    daemon = start_daemon(*encrypted, str(old_key))
    with stratad.Client(daemon.target) as client:
        data, checkpoint_id = fill(client)
        client.fork_session(checkpoint_id, new_session_id="fork")
        # Dedup within the tenant: the same state again adds no object.
        before = client.store_stats()
        client.create_session("twin")
        client.save_state("twin", data)
        after = client.store_stats()
        assert (after.objects, after.unique_bytes) == (before.objects, before.unique_bytes)
        assert after.logical_bytes == before.logical_bytes + len(data)
        check_everything_reads_back(client, data, checkpoint_id)
    assert daemon.stop() == 0, daemon.output()
    data_dir = daemon.data_dir
    object_files = [
        p for p in (data_dir / "tenants" / TENANT / "objects").rglob("*") if p.is_file()
    ]
    assert sum(p.stat().st_size for p in object_files) < 1.1 * len(data)  # once, not twice

    assert files_containing(data_dir, SECRET.encode()) == []
    assert files_containing(data_dir, data[1000:1064]) == []
    key_file = json.loads((data_dir / "tenants" / TENANT / "KEY").read_text())
    assert key_file["master_key_id"] == old_id

    # Encryption off, a missing key, the wrong key: refused, naming the key needed.
    listen = ("--listen", f"127.0.0.1:{get_free_port()}")
    for args in [(), (*encrypted, str(new_key))]:
        result = run_stratad("serve", "--data-dir", str(data_dir), *listen, *args)
        assert result.returncode != 0
        assert old_id in result.stderr, result.stderr
    result = run_stratad("serve", "--data-dir", str(data_dir), *listen, "--encryption", "on")
    assert result.returncode != 0 and "needs the master key" in result.stderr
    assert old_id in result.stderr, result.stderr

    # Offline rotation: afterwards the old key file is not needed.
    result = run_stratad(
        "rotate-key", "--data-dir", str(data_dir), "--encryption-key-file", str(new_key),
        "--encryption-old-key-files", str(old_key),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"tenant {TENANT}: re-wrapped from {old_id} to {new_id}" in result.stdout
    old_key.unlink()
    daemon = start_daemon(*encrypted, str(new_key), data_dir=data_dir)
    with stratad.Client(daemon.target) as client:
        check_everything_reads_back(client, data, checkpoint_id)
        # A flipped byte in a sealed object file: DATA_LOSS on read, named by Verify.
        # (The daemon runs: at a restart, the journal's copy would repair it.)
        digest = chunk_digests(data)[1]  # a chunk of `data` only
        found = find_on_disk(data_dir / "tenants" / TENANT / "objects", digest)
        assert found is not None
        path, offset, length = found
        with open(path, "r+b") as f:
            f.seek(offset + length // 2)
            byte = f.read(1)[0]
            f.seek(offset + length // 2)
            f.write(bytes([byte ^ 0x01]))
        report = client.verify()
        assert [c.digest for c in report.corrupt_objects] == [digest], report
        assert "fails authentication" in report.corrupt_objects[0].problem
        with pytest.raises(DataLossError):
            client.load_state("s1", checkpoint_id=checkpoint_id)


def test_encryption_on_over_a_plaintext_data_dir_is_refused(
    start_daemon: StartDaemon, run_stratad: Run, tmp_path: Path
) -> None:
    daemon = start_daemon()
    with stratad.Client(daemon.target) as client:
        client.create_session("plain")
        client.save_state("plain", b"written without encryption")
    assert daemon.stop() == 0, daemon.output()
    key = tmp_path / "master.key"
    keygen(run_stratad, key)
    result = run_stratad(
        "serve", "--data-dir", str(daemon.data_dir), "--encryption", "on",
        "--encryption-key-file", str(key),
    )  # fmt: skip
    assert result.returncode != 0
    assert "holds data written without encryption" in result.stderr, result.stderr
