"""``stratad ctl`` usability, against real daemons:

- a command's ``--help`` lists its own options and one line pointing at
  ``stratad ctl --help``, not the ~25 lines of global options (which every
  command still accepts after it);
- ``import`` of an archive whose session or checkpoint IDs are taken in the
  tenant says what to do (another ``--tenant``, or delete the holder).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stratad
from stratad import cli
from stratad.ctl import subcommands

Daemon = Any
Ctl = Callable[..., "subprocess.CompletedProcess[bytes]"]
STRATAD = [sys.executable, "-m", "stratad"]
#: Global options that a subcommand's --help must not repeat (it points at ctl --help).
GLOBAL_ONLY = ("--address", "--tenant", "--token-file", "--tls-ca", "--tls-cert", "--timeout")


@pytest.fixture
def ctl() -> Ctl:
    """``ctl(*args)``: ``stratad ctl ARGS`` run in this process (daemons are real)."""

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        argv = ["ctl", *args]
        out, err = io.BytesIO(), io.BytesIO()
        out_text = io.TextIOWrapper(out, write_through=True)
        err_text = io.TextIOWrapper(err, write_through=True)
        with contextlib.redirect_stdout(out_text), contextlib.redirect_stderr(err_text):
            try:
                code = cli.main(argv)
            except SystemExit as exc:  # argparse usage errors and --help
                code = int(exc.code or 0)
        return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())

    return run


def help_of(ctl: Ctl, *command: str) -> str:
    result = ctl(*command, "--help")
    assert result.returncode == 0, result.stderr.decode()
    return str(result.stdout.decode())


def every_command() -> list[tuple[str, ...]]:
    """Every command below ``stratad ctl``, groups and leaves (``sessions``, ``sessions ls``)."""
    ctl_parser = subcommands(cli.build_parser())["ctl"]
    found: list[tuple[str, ...]] = []

    def walk(parser: Any, path: tuple[str, ...]) -> None:
        for name, child in subcommands(parser).items():
            found.append((*path, name))
            walk(child, (*path, name))

    walk(ctl_parser, ())
    return found


# --- --help of a command ---------------------------------------------------------------------


@pytest.mark.parametrize("command", every_command(), ids=" ".join)
def test_a_commands_help_leaves_out_the_global_options(ctl: Ctl, command: tuple[str, ...]) -> None:
    text = help_of(ctl, *command)
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("  -")]
    for option in GLOBAL_ONLY:
        assert option not in listed, f"{' '.join(command)} --help lists {option}:\n{text}"
        assert f"[{option}" not in text, f"its usage line shows {option}:\n{text}"
    assert "stratad ctl --help" in text
    assert len(text.splitlines()) < 25, text


def test_the_ctl_help_lists_the_global_options(ctl: Ctl) -> None:
    text = help_of(ctl)
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("  -")]
    for option in GLOBAL_ONLY:
        assert option in listed, text
    assert "--tls-key" in text and "--progress" in text


def test_a_commands_own_options_are_still_in_its_help(ctl: Ctl) -> None:
    text = help_of(ctl, "import")
    assert "--session-id" in text and "--verify-only" in text and "--max-state-bytes" in text
    assert "--prefix" in help_of(ctl, "sessions", "ls")


def test_global_options_still_work_after_the_command(daemon: Daemon, ctl: Ctl) -> None:
    with stratad.Client(daemon.target, tenant="t2") as client:
        client.create_session("s")
    listed = ctl("sessions", "ls", "--address", daemon.target, "--tenant", "t2", "--json")
    assert listed.returncode == 0, listed.stderr.decode()
    assert [s["session_id"] for s in json.loads(listed.stdout)["sessions"]] == ["s"]
    shown = ctl("sessions", "show", "s", "--timeout", "5", "--address", daemon.target,
                "--tenant", "t2", "--json", "--progress", "never")  # fmt: skip
    assert shown.returncode == 0, shown.stderr.decode()
    assert json.loads(shown.stdout)["session"]["session_id"] == "s"
    # Options that need files are parsed after the command too (and then fail on the file).
    missing = ctl("sessions", "ls", "--address", daemon.target, "--token-file", "/nonexistent")
    assert missing.returncode == 2
    assert b"/nonexistent" in missing.stderr
    # The usual usage error for an unknown option.
    assert ctl("sessions", "ls", "--no-such-flag").returncode == 2


def test_completion_keeps_the_global_options_and_their_help(ctl: Ctl) -> None:
    fish = ctl("completion", "fish")
    assert fish.returncode == 0
    script = fish.stdout.decode()
    assert "==SUPPRESS==" not in script
    line = next(
        x for x in script.splitlines() if "stratad ctl sessions ls'" in x and "-l tls-ca" in x
    )
    assert "PEM CA file" in line


# --- import into a tenant where the IDs are taken ------------------------------------------


@pytest.fixture
def exported(daemon: Daemon, ctl: Ctl, tmp_path: Path) -> Path:
    """An archive of session "chat" (three checkpoints, one named), exported from ``daemon``."""
    with stratad.Client(daemon.target) as client:
        client.create_session("chat")
        client.save_state("chat", b'{"step": 1}')
        client.create_checkpoint("chat", "milestone")
        client.save_state("chat", b'{"step": 2}')
    archive = tmp_path / "chat.stratad.tar"
    result = ctl("--address", daemon.target, "export", "chat", "-o", str(archive))
    assert result.returncode == 0, result.stderr.decode()
    return archive


def test_import_under_another_session_id_names_the_holder_and_the_way_out(
    daemon: Daemon, ctl: Ctl, exported: Path
) -> None:
    with stratad.Client(daemon.target) as client:
        first = next(reversed(list(client.list_checkpoints("chat")))).checkpoint_id
    clash = ctl("--address", daemon.target, "import", str(exported), "--session-id", "chat-2")
    assert clash.returncode == 1
    message = clash.stderr.decode()
    assert "rolled back" in message
    assert f"session 'chat' already has checkpoint '{first}'" in message
    assert "--tenant" in message
    assert "delete session 'chat' first" in message
    assert len(message.strip().splitlines()) == 1
    with stratad.Client(daemon.target) as client:  # nothing half-imported
        assert [s.session_id for s in client.list_sessions()] == ["chat"]

    # The same with --tenant naming the tenant, and the way out works as said.
    named = ctl("--address", daemon.target, "--tenant", "default", "import", str(exported),
                "--session-id", "chat-2")  # fmt: skip
    assert "in tenant 'default'" in named.stderr.decode()
    moved = ctl("--address", daemon.target, "--tenant", "elsewhere", "import", str(exported),
                "--session-id", "chat-2")  # fmt: skip
    assert moved.returncode == 0, moved.stderr.decode()


def test_import_again_under_the_same_id_says_another_session_id_is_not_enough(
    daemon: Daemon, ctl: Ctl, exported: Path
) -> None:
    again = ctl("--address", daemon.target, "import", str(exported))
    assert again.returncode == 1
    message = again.stderr.decode()
    assert "session 'chat' already exists" in message
    assert "--tenant" in message
    assert "another --session-id would not be enough" in message


def test_import_over_an_unrelated_session_of_that_id_suggests_session_id(
    start_daemon: Callable[..., Daemon], ctl: Ctl, exported: Path
) -> None:
    other = start_daemon()
    with stratad.Client(other.target) as client:
        client.create_session("chat")  # the same ID, none of the archive's checkpoints
    taken = ctl("--address", other.target, "import", str(exported))
    assert taken.returncode == 1
    message = taken.stderr.decode()
    assert "session 'chat' already exists" in message
    assert "another --session-id" in message and "--tenant" in message
    renamed = ctl("--address", other.target, "import", str(exported), "--session-id", "chat-2")
    assert renamed.returncode == 0, renamed.stderr.decode()
