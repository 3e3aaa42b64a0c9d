"""``stratad ctl`` against real daemons: every command, text and --json output,
exit codes, export -> import into a fresh daemon, a damaged archive, and a
daemon serving TCP and a unix socket at once."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stratad
from stratad import cli, native
from stratad.api.v1 import common_pb2
from stratad.ctl.archive import MANIFEST, MANIFEST_DIGEST
from stratad.store.objects import find_on_disk

#: A ``Daemon`` of tests/e2e/conftest.py (``.target``, ``.data_dir``, ``.output()``, ``.stop()``).
Daemon = Any
StartDaemon = Callable[..., Daemon]
STRATAD = [sys.executable, "-m", "stratad"]
Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def ctl_process(stratad_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[bytes]]:
    """``ctl_process(address, *args)``: run ``python -m stratad ctl --address ADDRESS ARGS``."""

    def run(address: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*STRATAD, "ctl", "--address", address, *args],
            env=stratad_env,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture
def ctl() -> Callable[..., subprocess.CompletedProcess[bytes]]:
    """``ctl(address, *args)``: ``stratad ctl --address ADDRESS ARGS`` run in this process
    (the daemon is a real subprocess; an interpreter per command would be slow)."""

    def run(address: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        argv = ["ctl", "--address", address, *args]
        out, err = io.BytesIO(), io.BytesIO()
        out_text = io.TextIOWrapper(out, write_through=True)
        err_text = io.TextIOWrapper(err, write_through=True)
        with contextlib.redirect_stdout(out_text), contextlib.redirect_stderr(err_text):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse usage errors
                code = int(exc.code or 0)
        return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())

    return run


Ctl = Callable[..., "subprocess.CompletedProcess[bytes]"]


def ok_json(result: subprocess.CompletedProcess[bytes]) -> Any:
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def growing_states(n: int, prefix: str = "") -> list[bytes]:
    """Successive states of a growing conversation (shared prefixes: chunks dedup)."""
    messages: list[str] = []
    states = []
    for i in range(n):
        messages.append(f"{prefix} message {i}: " + "the agent called the search tool " * 40)
        states.append(json.dumps({"messages": messages, "step": i}).encode())
    return states


# --- health, unix socket ------------------------------------------------------------------


def test_health_and_an_unreachable_daemon(
    daemon: Daemon, ctl: Ctl, ctl_process: Ctl, free_port: int
) -> None:
    result = ctl_process(daemon.target, "health")  # as the container's HEALTHCHECK runs it
    assert result.returncode == 0
    assert result.stdout.decode().strip() == "SERVING"
    assert ok_json(ctl(daemon.target, "--json", "health")) == {"status": "SERVING"}

    down = ctl_process(f"127.0.0.1:{free_port}", "--timeout", "2", "health")
    assert down.returncode == 1
    assert f"127.0.0.1:{free_port}" in down.stderr.decode()


def test_serves_tcp_and_a_unix_socket_at_once(
    start_daemon: StartDaemon, ctl: Ctl, tmp_path: Path
) -> None:
    sock = tmp_path / "run" / "stratad.sock"
    sock.parent.mkdir()
    daemon = start_daemon("--listen-unix", str(sock))
    assert sock.is_socket()
    unix = f"unix:{sock}"
    assert ctl(unix, "health").returncode == 0
    with stratad.Client(unix) as client:
        client.create_session("over-the-socket")
        client.save_state("over-the-socket", b"state")
    # The same daemon, over TCP.
    sessions = ok_json(ctl(daemon.target, "--json", "sessions", "ls"))["sessions"]
    assert [s["session_id"] for s in sessions] == ["over-the-socket"]
    assert "and unix:" in daemon.output()  # the start-up line names both addresses
    assert daemon.stop() == 0


# --- sessions, checkpoints, state -------------------------------------------------------------


def test_sessions_ls_show_rm(daemon: Daemon, ctl: Ctl) -> None:
    with stratad.Client(daemon.target) as client:
        client.create_session("alpha", labels={"team": "search"}, keep_last=5)
        client.create_session("beta")
        client.save_state("alpha", b"one")
        client.create_session("other-tenant", labels={}, keep_last=0)

    listed = ok_json(ctl(daemon.target, "--json", "sessions", "ls"))["sessions"]
    assert [s["session_id"] for s in listed] == ["alpha", "beta", "other-tenant"]
    assert listed[0]["labels"] == {"team": "search"}
    assert listed[0]["status"] == "active"
    assert listed[0]["checkpoint_count"] == 1

    text = ctl(daemon.target, "sessions", "ls", "--prefix", "al").stdout.decode()
    assert text.splitlines()[0].split() == [
        "SESSION", "STATUS", "VERSION", "CHECKPOINTS", "UPDATED", "LABELS",
    ]  # fmt: skip
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["alpha"]

    shown = ok_json(ctl(daemon.target, "--json", "sessions", "show", "alpha"))["session"]
    assert shown["retention"]["keep_last"] == 5
    assert shown["head_checkpoint_id"]
    assert "keep_last=5" in ctl(daemon.target, "sessions", "show", "alpha").stdout.decode()

    removed = ok_json(ctl(daemon.target, "--json", "sessions", "rm", "beta", "other-tenant"))
    assert removed == {"deleted": ["beta", "other-tenant"]}
    missing = ctl(daemon.target, "sessions", "show", "beta")
    assert missing.returncode == 1
    assert "beta" in missing.stderr.decode()
    assert ctl(daemon.target, "sessions", "rm", "beta").returncode == 1

    # --tenant: another tenant sees none of it.
    assert ok_json(ctl(daemon.target, "--tenant", "t2", "--json", "sessions", "ls")) == {
        "sessions": []
    }


def test_checkpoints_ls_and_state_get(
    daemon: Daemon, ctl: Ctl, ctl_process: Ctl, tmp_path: Path
) -> None:
    states = growing_states(4)
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        saved = [
            client.save_state("s", data, content_type="application/json", metadata={"step": i})
            for i, data in enumerate(states)
        ]
        side = client.save_state("s", b"side", namespace="scratch")
        named = client.create_checkpoint("s", "milestone")

    listed = ok_json(ctl(daemon.target, "--json", "checkpoints", "ls", "s"))["checkpoints"]
    ids = [c["checkpoint_id"] for c in listed]
    assert ids == [named.checkpoint_id, side.checkpoint_id, *[s.checkpoint_id for s in saved][::-1]]
    assert listed[0]["name"] == "milestone"
    assert listed[-1]["metadata"] == {"step": 0.0}
    assert listed[-1]["size"] == len(states[0])

    scratch = ok_json(
        ctl(daemon.target, "--json", "checkpoints", "ls", "s", "--namespace", "scratch")
    )
    assert [c["checkpoint_id"] for c in scratch["checkpoints"]][-1] == side.checkpoint_id
    limited = ok_json(ctl(daemon.target, "--json", "checkpoints", "ls", "s", "--limit", "2"))
    assert len(limited["checkpoints"]) == 2
    table = ctl(daemon.target, "checkpoints", "ls", "s").stdout.decode()
    assert "milestone" in table and "scratch" in table

    # Latest state to stdout, byte for byte.
    latest = ctl_process(daemon.target, "state", "get", "s")
    assert latest.returncode == 0
    # (the head is the named pin of the "scratch" save: the default namespace's
    # latest is the last state saved there)
    assert latest.stdout == states[-1]
    # A given checkpoint to a file.
    out = tmp_path / "state.json"
    result = ctl(
        daemon.target, "state", "get", "s", "--checkpoint", saved[1].checkpoint_id, "-o", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == states[1]
    assert saved[1].checkpoint_id in result.stdout.decode()
    # The latest of a namespace, as JSON.
    info = ok_json(ctl(daemon.target, "--json", "state", "get", "s", "--namespace", "scratch"))
    assert base64.b64decode(info["data_base64"]) == b"side"
    info = ok_json(
        ctl(daemon.target, "--json", "state", "get", "s", "--checkpoint", saved[0].checkpoint_id)
    )
    assert base64.b64decode(info["data_base64"]) == states[0]
    assert info["digest"] == native.digest_hex(states[0])
    assert info["metadata"] == {"step": 0.0}

    missing = ctl(daemon.target, "state", "get", "s", "--checkpoint", "no-such-checkpoint")
    assert missing.returncode == 1
    assert b"no-such-checkpoint" in missing.stderr


# --- verify, gc, stats ------------------------------------------------------------------------


def test_stats_gc_and_verify(daemon: Daemon, ctl: Ctl) -> None:
    states = growing_states(30)  # ~40 KB each: several chunks, shared
    with stratad.Client(daemon.target) as client:
        client.create_session("s", keep_last=2)
        for data in states:
            client.save_state("s", data)
        client.create_session("doomed")
        client.save_state("doomed", b"x" * 50_000)
        client.delete_session("doomed")

    stats = ok_json(ctl(daemon.target, "--json", "stats"))
    assert stats["sessions"] == 1
    assert stats["checkpoints"] == 2
    assert stats["logical_bytes"] == len(states[-1]) + len(states[-2])
    assert stats["dedup_ratio"] > 1
    assert "dedup ratio" in ctl(daemon.target, "stats").stdout.decode()

    gc = ok_json(ctl(daemon.target, "--json", "gc"))
    assert gc["objects_removed"] > 0
    assert gc["bytes_freed"] > 0
    again = ctl(daemon.target, "--progress", "always", "gc")
    assert again.returncode == 0
    assert "removed 0 objects" in again.stdout.decode()
    assert "gc " in again.stderr.decode()  # the progress line

    verified = ok_json(ctl(daemon.target, "--json", "verify"))
    assert verified["ok"] is True
    assert verified["objects_checked"] == stats["objects"] - gc["objects_removed"]
    assert ctl(daemon.target, "verify").stdout.decode().splitlines()[-1] == "ok"


def test_verify_exits_3_and_names_a_corrupt_object(daemon: Daemon, ctl: Ctl) -> None:
    data = b"a state that will rot " * 100
    with stratad.Client(daemon.target) as client:
        client.create_session("rotting")
        digest = client.save_state("rotting", data).digest
    objects = daemon.data_dir / "tenants" / "default" / "objects"
    deadline = time.monotonic() + 10
    while (found := find_on_disk(objects, digest)) is None:  # written in the background
        assert time.monotonic() < deadline, f"object {digest} never written"
        time.sleep(0.05)
    path, offset, length = found
    with open(path, "r+b") as f:  # flip the frame's last byte
        f.seek(offset + length - 1)
        byte = f.read(1)[0]
        f.seek(offset + length - 1)
        f.write(bytes([byte ^ 0xFF]))

    result = ctl(daemon.target, "verify")
    assert result.returncode == 3, result.stderr
    text = result.stdout.decode()
    assert f"CORRUPT {digest}" in text and "rotting" in text
    assert text.splitlines()[-1] == "PROBLEMS FOUND"
    report = json.loads(ctl(daemon.target, "--json", "verify").stdout)
    assert report["ok"] is False
    assert [c["digest"] for c in report["corrupt_objects"]] == [digest]


# --- export and import ----------------------------------------------------------------------


def build_session(client: stratad.Client) -> dict[str, Any]:
    """A session with every kind of checkpoint an archive must carry."""
    states = growing_states(8, "main")
    client.create_session("chat", labels={"team": "search", "tier": "gold"}, keep_last=20)
    ids = []
    for i, data in enumerate(states[:5]):
        ids.append(
            client.save_state(
                "chat", data, content_type="application/json", metadata={"step": i, "tag": "x"}
            ).checkpoint_id
        )
    # A named checkpoint whose parent is in the archive.
    client.create_checkpoint(
        "chat", "milestone-1", metadata={"reviewed": True}, checkpoint_id="m-1"
    )
    # A namespace of its own.
    client.save_state("chat", b'{"notes": 1}', content_type="application/json", namespace="notes")
    for data in states[5:]:
        ids.append(client.save_state("chat", data, content_type="application/json").checkpoint_id)
    # A named checkpoint whose parent is then deleted (not in the archive).
    orphan_parent = client.save_state("chat", b"short-lived parent", content_type="text/plain")
    client.create_checkpoint("chat", "orphan", checkpoint_id="m-2")
    client.delete_checkpoint(orphan_parent.checkpoint_id)
    # The head moved back to an older checkpoint; the session is paused.
    client.restore_checkpoint(ids[6], make_current=True)
    client.pause_execution("chat")
    return {"states": states}


def snapshot(client: stratad.Client, session_id: str) -> dict[str, Any]:
    session = client.get_session(session_id)
    checkpoints = []
    for cp in reversed(list(client.list_checkpoints(session_id))):
        loaded = client.load_state(session_id, cp.checkpoint_id)
        checkpoints.append(
            (
                cp.checkpoint_id,
                cp.name,
                cp.namespace,
                cp.content_type,
                dict(cp.metadata),
                cp.digest,
                cp.size,
                loaded.data,
            )
        )
    return {
        "labels": dict(session.labels),
        "keep_last": session.retention.keep_last,
        "status": session.status,
        "head": session.head_checkpoint_id,
        "checkpoints": checkpoints,
    }


def test_export_then_import_into_a_fresh_daemon(
    start_daemon: StartDaemon, ctl: Ctl, tmp_path: Path
) -> None:
    source = start_daemon()
    with stratad.Client(source.target) as client:
        build_session(client)
        before = snapshot(client, "chat")
        parents = {c.checkpoint_id: c.parent_checkpoint_id for c in client.list_checkpoints("chat")}
    assert before["status"] == common_pb2.SESSION_STATUS_PAUSED

    archive = tmp_path / "chat.stratad.tar"
    exported = ok_json(
        ctl(source.target, "--json", "--progress", "always", "export", "chat", "-o", str(archive))
    )
    assert exported["checkpoints"] == len(before["checkpoints"])
    logical = sum(c[6] for c in before["checkpoints"])
    assert exported["logical_bytes"] == logical
    assert exported["archive_bytes"] < logical  # chunks shared and compressed (tar pads)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert MANIFEST in names and MANIFEST_DIGEST in names

    target = start_daemon()
    result = ctl(target.target, "--progress", "always", "import", str(archive))
    assert result.returncode == 0, result.stderr.decode()
    assert "imported chat" in result.stdout.decode()
    assert "import chat [" in result.stderr.decode()  # the progress bar
    with stratad.Client(target.target) as client:
        after = snapshot(client, "chat")
        imported_parents = {
            c.checkpoint_id: c.parent_checkpoint_id for c in client.list_checkpoints("chat")
        }
    assert after == before
    for checkpoint_id, parent in parents.items():
        if parent in parents and checkpoint_id != "m-2":
            assert imported_parents[checkpoint_id] == parent, checkpoint_id

    # Importing again: the session exists; the daemon's copy is untouched.
    again = ctl(target.target, "import", str(archive))
    assert again.returncode == 1
    assert b"already exists" in again.stderr
    # Under another session ID on the source daemon: the checkpoint IDs are
    # taken, so the import fails and is rolled back (no half-imported session).
    clash = ctl(source.target, "import", str(archive), "--session-id", "chat-copy")
    assert clash.returncode == 1
    assert b"rolled back" in clash.stderr
    with stratad.Client(source.target) as client:
        assert [s.session_id for s in client.list_sessions()] == ["chat"]


def damage_member(archive: Path, out: Path, member: str, edit: Callable[[bytes], bytes]) -> None:
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for info in src.getmembers():
            f = src.extractfile(info)
            assert f is not None
            payload = f.read()
            if info.name == member:
                payload = edit(payload)
                info.size = len(payload)
            dst.addfile(info, io.BytesIO(payload))


def flip_last(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def test_import_refuses_a_damaged_archive(
    start_daemon: StartDaemon, ctl: Ctl, tmp_path: Path
) -> None:
    source = start_daemon()
    with stratad.Client(source.target) as client:
        client.create_session("s")
        for data in growing_states(3):
            client.save_state("s", data)
    archive = tmp_path / "s.tar"
    assert ctl(source.target, "export", "s", "-o", str(archive)).returncode == 0
    with tarfile.open(archive) as tar:
        chunk = next(n for n in tar.getnames() if n.startswith("chunks/"))

    target = start_daemon()
    verified = ok_json(ctl(target.target, "--json", "import", "--verify-only", str(archive)))
    assert verified["ok"] is True

    def manifest_edit(data: bytes) -> bytes:
        return data.replace(b'"session_id": "s"', b'"session_id": "t"')

    cases = {
        "a chunk's bytes": (chunk, flip_last, "does not match"),
        "the manifest": (MANIFEST, manifest_edit, "MANIFEST.json does not match"),
    }
    for label, (member, edit, words) in cases.items():
        bad = tmp_path / f"bad-{member.replace('/', '_')}.tar"
        damage_member(archive, bad, member, edit)
        result = ctl(target.target, "import", str(bad))
        assert result.returncode == 1, label
        stderr = result.stderr.decode()
        assert "refusing the archive" in stderr and words in stderr, (label, stderr)

    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    result = ctl(target.target, "import", str(truncated))
    assert result.returncode == 1
    assert b"refusing the archive" in result.stderr

    # Nothing was created by the refused imports.
    with stratad.Client(target.target) as client:
        assert list(client.list_sessions()) == []
    # The good archive still imports.
    assert ctl(target.target, "import", str(archive)).returncode == 0


def test_import_bounds_state_sizes(start_daemon: StartDaemon, ctl: Ctl, tmp_path: Path) -> None:
    source = start_daemon()
    with stratad.Client(source.target) as client:
        client.create_session("z")
        client.save_state("z", bytes(1 << 20))  # 1 MiB of zeros: one chunk, referenced 32 times
    archive = tmp_path / "z.tar"
    assert ctl(source.target, "export", "z", "-o", str(archive)).returncode == 0

    def repeat_chunks(data: bytes) -> bytes:
        manifest = json.loads(data)
        manifest["checkpoints"][0]["chunks"] *= 200  # 200 MiB of zeros, 1 MiB declared
        return json.dumps(manifest).encode()

    bomb = tmp_path / "bomb.tar"
    damage_member(archive, bomb, MANIFEST, repeat_chunks)
    resigned = tmp_path / "bomb-signed.tar"
    with tarfile.open(bomb) as tar:
        manifest = tar.extractfile(MANIFEST).read()  # type: ignore[union-attr]
    damage_member(bomb, resigned, MANIFEST_DIGEST, lambda _: native.digest_hex(manifest).encode())

    target = start_daemon()
    limit = str(1 << 20)
    result = ctl(target.target, "import", "--max-state-bytes", limit, str(resigned))
    assert result.returncode == 1
    assert b"refusing the archive: checkpoint " in result.stderr
    assert b"its chunks add up to more than the 1048576 bytes it declares" in result.stderr
    result = ctl(target.target, "import", "--max-state-bytes", str((1 << 20) - 1), str(archive))
    assert result.returncode == 1
    assert b"more than the maximum state size of 1048575 bytes" in result.stderr
    with stratad.Client(target.target) as client:
        assert list(client.list_sessions()) == []
    assert ctl(target.target, "import", "--max-state-bytes", limit, str(archive)).returncode == 0
    assert ctl(target.target, "import", "--max-state-bytes", "0", str(archive)).returncode == 2


def test_usage_errors_exit_2(run_stratad: Run) -> None:
    result = run_stratad("ctl", "sessions")
    assert result.returncode == 2
    assert "ACTION" in result.stderr or "required" in result.stderr
    assert run_stratad("ctl", "--help").returncode == 0
