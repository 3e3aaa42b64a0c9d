"""``stratad ctl`` against a real daemon: global options after the command,
``checkpoints show`` / ``diff``, ``sessions watch``, ``state get --decode
langgraph`` (tests/e2e/test_ctl.py covers the other commands)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

import stratad
from stratad import cli
from stratad.integrations.langgraph import StratadSaver, session_id_of

Daemon = Any
STRATAD = [sys.executable, "-m", "stratad"]
Ctl = Callable[..., "subprocess.CompletedProcess[bytes]"]
DEADLINE = 60.0


@pytest.fixture
def ctl() -> Ctl:
    """``ctl(*args)``: ``stratad ctl ARGS`` run in this process (the daemon is real)."""

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        argv = ["ctl", *args]
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


def ok_json(result: subprocess.CompletedProcess[bytes]) -> Any:
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


# --- global options anywhere --------------------------------------------------------------


def test_global_options_before_or_after_the_command(daemon: Daemon, ctl: Ctl) -> None:
    with stratad.Client(daemon.target, tenant="t2") as client:
        client.create_session("s")
    before = ok_json(ctl("--address", daemon.target, "--tenant", "t2", "--json", "sessions", "ls"))
    after = ok_json(ctl("sessions", "ls", "--json", "--address", daemon.target, "--tenant", "t2"))
    mixed = ok_json(ctl("--address", daemon.target, "sessions", "ls", "--tenant", "t2", "--json"))
    assert [s["session_id"] for s in before["sessions"]] == ["s"]
    assert after == before == mixed
    # Given twice, the one after the command wins (as with any repeated option).
    overridden = ok_json(
        ctl(
            "--tenant",
            "t2",
            "--address",
            daemon.target,
            "sessions",
            "ls",
            "--tenant",
            "t3",
            "--json",
        )
    )
    assert overridden == {"sessions": []}
    # Text output stays the default when --json is given nowhere.
    text = ctl("--address", daemon.target, "sessions", "ls", "--tenant", "t2").stdout.decode()
    assert text.split()[:2] == ["SESSION", "STATUS"]


def test_global_options_after_a_nested_command_and_in_help(daemon: Daemon, ctl: Ctl) -> None:
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        saved = client.save_state("s", b"{}")
    listed = ok_json(ctl("checkpoints", "ls", "s", "--address", daemon.target, "--json"))
    assert [c["checkpoint_id"] for c in listed["checkpoints"]] == [saved.checkpoint_id]
    usage = ctl("sessions", "ls", "--help")
    assert usage.returncode == 0
    assert "--json" in usage.stdout.decode() and "global options" in usage.stdout.decode()
    wrong = ctl("sessions", "ls", "--no-such-flag")
    assert wrong.returncode == 2


# --- checkpoints show / diff ------------------------------------------------------------------


def test_checkpoints_show(daemon: Daemon, ctl: Ctl) -> None:
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        first = client.save_state("s", json.dumps({"step": 1}).encode(), metadata={"node": "a"})
        second = client.save_state(
            "s",
            json.dumps({"step": 2, "messages": ["hi"]}).encode(),
            content_type="application/json",
            metadata={"node": "b"},
        )
        third = client.save_state("s", b"\x00\x01binary")
        client.put_writes("s", second.checkpoint_id, "task-1", [(0, "messages", "json", b'"x"')])

    shown = ok_json(
        ctl("--address", daemon.target, "--json", "checkpoints", "show", "s", second.checkpoint_id)
    )
    cp = shown["checkpoint"]
    assert cp["checkpoint_id"] == second.checkpoint_id
    assert cp["parent_checkpoint_id"] == first.checkpoint_id
    assert cp["metadata"] == {"node": "b"}
    assert cp["size"] == len(json.dumps({"step": 2, "messages": ["hi"]}))
    assert cp["pending_write_count"] == 1
    assert shown["ancestors"] == [first.checkpoint_id]
    assert shown["state"] == {"kind": "json", "value": {"step": 2, "messages": ["hi"]}}
    assert shown["pending_writes"] == [
        {
            "task_id": "task-1",
            "task_path": "",
            "idx": 0,
            "channel": "messages",
            "type": "json",
            "size": 3,
        }
    ]

    text = ctl(
        "--address", daemon.target, "checkpoints", "show", "s", third.checkpoint_id
    ).stdout.decode()
    assert f"ancestors:    {second.checkpoint_id} <- {first.checkpoint_id}" in text
    assert "state (bytes):" in text and "00 01 62 69 6e" in text
    raw = ok_json(
        ctl(
            "--address",
            daemon.target,
            "--json",
            "checkpoints",
            "show",
            "s",
            first.checkpoint_id,
            "--decode",
            "raw",
        )
    )
    assert raw["state"]["kind"] == "bytes"

    missing = ctl("--address", daemon.target, "checkpoints", "show", "s", "ckpt-nope")
    assert missing.returncode == 1
    assert "ckpt-nope" in missing.stderr.decode()


def test_checkpoints_diff_of_json_states(daemon: Daemon, ctl: Ctl) -> None:
    a = {"messages": ["hello", "how are you"], "step": 1, "tools": {"search": True}, "a/b": 1}
    b = {"messages": ["hello", "fine", "thanks"], "step": 2, "tools": {}, "done": None}
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        one = client.save_state("s", json.dumps(a).encode())
        two = client.save_state("s", json.dumps(b).encode())

    result = ok_json(
        ctl(
            "checkpoints",
            "diff",
            "s",
            one.checkpoint_id,
            two.checkpoint_id,
            "--json",
            "--address",
            daemon.target,
        )
    )
    assert result["kind"] == "json" and not result["identical"]
    assert {(c["op"], c["path"]) for c in result["changes"]} == {
        ("changed", "/messages/1"),
        ("added", "/messages/2"),
        ("changed", "/step"),
        ("removed", "/tools/search"),
        ("removed", "/a~1b"),
        ("added", "/done"),
    }
    step = next(c for c in result["changes"] if c["path"] == "/step")
    assert (step["before"], step["after"]) == (1, 2)
    assert (result["added"], result["removed"], result["changed"]) == (2, 2, 2)

    text = ctl(
        "--address", daemon.target, "checkpoints", "diff", "s", one.checkpoint_id, two.checkpoint_id
    )
    lines = text.stdout.decode().splitlines()
    assert "~ /step: 1 -> 2" in lines
    assert '+ /messages/2: "thanks"' in lines
    same = ok_json(
        ctl(
            "--address",
            daemon.target,
            "--json",
            "checkpoints",
            "diff",
            "s",
            one.checkpoint_id,
            one.checkpoint_id,
        )
    )
    assert same["identical"] and same["changes"] == []


def test_checkpoints_diff_of_binary_states(daemon: Daemon, ctl: Ctl) -> None:
    base = os.urandom(200_000)
    changed = base[:100_000] + b"\xff" + base[100_001:]
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        one = client.save_state("s", base)
        two = client.save_state("s", changed)
    result = ok_json(
        ctl(
            "--address",
            daemon.target,
            "--json",
            "checkpoints",
            "diff",
            "s",
            one.checkpoint_id,
            two.checkpoint_id,
        )
    )
    assert result["kind"] == "bytes" and not result["identical"]
    assert result["first_difference_at"] == 100_000
    assert result["common_prefix_bytes"] == 100_000
    assert result["common_suffix_bytes"] == 99_999
    # One byte changed: the chunks around it differ, the rest are shared.
    assert 0 < result["chunks_shared"] < result["chunks_a"]
    assert result["bytes_shared"] > 100_000


# --- sessions watch ----------------------------------------------------------------------------


@contextlib.contextmanager
def watching(daemon: Daemon, env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [*STRATAD, "ctl", "--address", daemon.target, "sessions", "watch", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(DEADLINE, proc.kill)  # never hang the suite
    watchdog.start()
    try:
        yield proc
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_sessions_watch_streams_json_lines_until_the_session_is_deleted(
    daemon: Daemon, stratad_env: dict[str, str]
) -> None:
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        first = client.save_state("s", b"one")
        # --from-version 1: replay what followed the creation, then follow live.
        with watching(daemon, stratad_env, "s", "--json", "--from-version", "1") as proc:
            assert proc.stdout is not None
            replayed = json.loads(proc.stdout.readline())
            assert (replayed["version"], replayed["kind"]) == (2, "save")
            assert replayed["checkpoint_id"] == first.checkpoint_id
            client.pause_execution("s")
            live = json.loads(proc.stdout.readline())
            assert (live["version"], live["status"]) == (3, "paused")
            client.delete_session("s")
            out, err = proc.communicate(timeout=DEADLINE)
            assert proc.returncode == 0, err
            assert out == ""
            assert "the watch of s ended" in err


def test_sessions_watch_stops_on_ctrl_c(daemon: Daemon, stratad_env: dict[str, str]) -> None:
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        saved = client.save_state("s", b"one")
    with watching(daemon, stratad_env, "s", "--from-version", "1") as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.split()[2:4] == ["v2", "save"] and saved.checkpoint_id in line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 130
        assert "interrupted" in err


def test_sessions_watch_of_a_missing_session(daemon: Daemon, ctl: Ctl) -> None:
    result = ctl("--address", daemon.target, "sessions", "watch", "nope")
    assert result.returncode == 1
    assert "nope" in result.stderr.decode()


# --- state get --decode langgraph -------------------------------------------------------------


def test_state_get_decodes_a_langgraph_checkpoint(daemon: Daemon, ctl: Ctl) -> None:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": ["hi", "there"], "count": 2, "seen": {"a"}}
    checkpoint["channel_versions"] = {"messages": 1, "count": 1}
    config = {"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}}
    with StratadSaver(daemon.target) as saver:
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {})  # type: ignore[arg-type]
    session = session_id_of("thread-1", "")

    decoded = json.loads(
        ctl("--address", daemon.target, "state", "get", session, "--decode", "langgraph").stdout
    )
    assert decoded["checkpoint"]["id"] == checkpoint["id"]
    assert decoded["checkpoint"]["channel_values"] == {
        "messages": ["hi", "there"],
        "count": 2,
        "seen": ["a"],
    }
    assert decoded["metadata"]["source"] == "input"
    assert decoded["parent_checkpoint_id"] is None

    with_info = ok_json(
        ctl("--address", daemon.target, "--json", "state", "get", session, "--decode", "langgraph")
    )
    assert with_info["content_type"].startswith("application/vnd.langgraph.checkpoint+")
    assert with_info["state"] == decoded
    # checkpoints show decodes it too, on its own (auto).
    shown = ok_json(
        ctl(
            "--address",
            daemon.target,
            "--json",
            "checkpoints",
            "show",
            session,
            with_info["checkpoint_id"],
        )
    )
    assert shown["state"] == {"kind": "langgraph", "value": decoded}

    with stratad.Client(daemon.target) as client:
        client.create_session("plain")
        client.save_state("plain", b'{"not": "langgraph"}')
    refused = ctl("--address", daemon.target, "state", "get", "plain", "--decode", "langgraph")
    assert refused.returncode == 1
    assert "not a checkpoint StratadSaver stored" in refused.stderr.decode()
