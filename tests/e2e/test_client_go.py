"""The Go client (clients/go) against real daemons: its test suite and its quickstart.

``go test`` runs the module's tests with the addresses of two daemons (one
plaintext with auth off, one with TLS and bearer tokens) in STRATAD_TEST_*
variables and STRATAD_TEST_REQUIRE_DAEMON=1, so every test must pass: none may
skip. Then ``go run ./examples/quickstart`` saves, loads, lists and forks, and
the Python SDK must see what it did.

Needs Go (PATH or /usr/local/go/bin); Go modules come from the Go module proxy
(cached in GOMODCACHE). Without Go the tests skip, unless STRATAD_REQUIRE_GO is
set (CI): then they fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from go_toolchain import find_go
from pki import Pki

import stratad

GO_MODULE = Path(__file__).resolve().parents[2] / "clients" / "go"
MAX_MESSAGE_BYTES = 1 << 20
GO_TIMEOUT = 900  # a cold build compiles gRPC: minutes on a busy 2-core machine


def go_env(**extra: str) -> dict[str, str]:
    """The caller's environment (Go caches, proxy) without STRATAD_* variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    return {**env, **extra}


def run_go(go: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [go, *args],
        cwd=GO_MODULE,
        env=env,
        capture_output=True,
        text=True,
        timeout=GO_TIMEOUT,
        check=False,
    )


def declared_tests() -> set[str]:
    """Every top-level Test function of the module's root package."""
    names = set()
    for path in GO_MODULE.glob("*_test.go"):
        names.update(re.findall(r"^func (Test\w+)\(t \*testing\.T\)", path.read_text(), re.M))
    return names


def go_test_outcomes(json_lines: str) -> dict[str, str]:
    """Top-level test name -> its final action (pass, fail, skip) from `go test -json`."""
    outcomes = {}
    for line in json_lines.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        test = event.get("Test", "")
        if test and "/" not in test and event.get("Action") in ("pass", "fail", "skip"):
            outcomes[test] = event["Action"]
    return outcomes


def new_token(run_stratad: Callable[..., Any], tenant: str, role: str) -> tuple[str, str]:
    """``stratad ctl token new``: the token and its identities-file line."""
    made = run_stratad("ctl", "token", "new", "--for-tenant", tenant, "--role", role)
    assert made.returncode == 0, made.stderr
    token, entry = made.stdout.splitlines()
    return token, entry


@pytest.fixture
def auth_daemon(
    start_daemon: Callable[..., Any],
    wait_serving: Callable[..., None],
    run_stratad: Callable[..., Any],
    pki: Pki,
    tmp_path: Path,
) -> dict[str, str]:
    """A daemon with TLS and auth=token (an agent of tenant acme, an admin)."""
    agent, agent_entry = new_token(run_stratad, "acme", "agent")
    admin, admin_entry = new_token(run_stratad, "default", "admin")
    identities = tmp_path / "identities.toml"
    identities.write_text(f"[tokens]\n{agent_entry}\n{admin_entry}\n")
    issued = pki.server()
    # Plaintext on a unix socket too, only so that the health wait can tell it serves.
    unix = f"unix:{tmp_path}/auth.sock"
    daemon = start_daemon(
        "--listen-unix", unix,
        "--tls-cert-file", str(issued.cert),
        "--tls-key-file", str(issued.key),
        "--auth", "token",
        "--auth-tokens-file", str(identities),
        wait=False,
    )  # fmt: skip
    wait_serving(unix, timeout=30.0, proc=daemon.proc)
    return {
        "STRATAD_TEST_AUTH_ADDRESS": daemon.target,
        "STRATAD_TEST_AUTH_CA": str(pki.ca_file),
        "STRATAD_TEST_AGENT_TOKEN": agent,
        "STRATAD_TEST_ADMIN_TOKEN": admin,
    }


def test_go_client_tests_pass_against_real_daemons(
    start_daemon: Callable[..., Any], auth_daemon: dict[str, str]
) -> None:
    go = find_go()
    # A small message limit, so that a state above it is cheap to send.
    daemon = start_daemon("--max-message-bytes", str(MAX_MESSAGE_BYTES))
    env = go_env(
        STRATAD_TEST_ADDRESS=daemon.target,
        STRATAD_TEST_MAX_MESSAGE_BYTES=str(MAX_MESSAGE_BYTES),
        STRATAD_TEST_REQUIRE_DAEMON="1",
        **auth_daemon,
    )
    result = run_go(go, "test", "-count=1", "-json", "-timeout", "600s", "./...", env=env)
    outcomes = go_test_outcomes(result.stdout)
    failed = sorted(name for name, action in outcomes.items() if action != "pass")
    output = "\n".join(
        json.loads(line).get("Output", "")
        for line in result.stdout.splitlines()
        if line.startswith("{")
    )
    assert result.returncode == 0 and not failed, (
        f"go test failed: {failed}\n{output}\n{result.stderr}"
    )
    # Every test ran and passed: none skipped, none missing from the run.
    expected = declared_tests()
    assert len(expected) >= 20, expected
    assert expected <= {name for name, action in outcomes.items() if action == "pass"}


def test_go_quickstart_effects_are_visible_from_python(start_daemon: Callable[..., Any]) -> None:
    go = find_go()
    daemon = start_daemon()
    env = go_env(STRATAD_ADDRESS=daemon.target, STRATAD_TENANT="go-example")
    result = run_go(go, "run", "./examples/quickstart", "-session", "go-quickstart", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "forked go-quickstart-fork" in result.stdout, result.stdout

    with stratad.Client(daemon.target, tenant="go-example") as client:
        session = client.get_session("go-quickstart")
        checkpoints = list(client.list_checkpoints("go-quickstart"))
        assert session.checkpoint_count == len(checkpoints) == 2
        latest = client.load_state("go-quickstart")
        assert latest.content_type == "application/json"
        assert json.loads(latest.data) == {
            "messages": ["user: hello", "agent: hi, how can I help?"]
        }
        assert dict(latest.metadata) == {"messages": 2.0}
        fork = client.get_session("go-quickstart-fork")
        assert fork.forked_from_checkpoint_id == checkpoints[-1].checkpoint_id
        assert dict(fork.labels) == {"forked": "quickstart"}
        assert json.loads(client.load_state("go-quickstart-fork").data) == {
            "messages": ["user: hello"]
        }
    # Tenant isolation holds for the example's sessions too.
    with stratad.Client(daemon.target, tenant="someone-else") as other:
        assert [s.session_id for s in other.list_sessions()] == []


def test_the_go_reasons_include_every_reason_the_daemon_raises() -> None:
    """Every reason literal in python/stratad has a `Reason` constant in clients/go/errors.go."""
    literal = re.compile(r"""\b(?:default_)?reason\s*=\s*["']([A-Z][A-Z0-9_]+)["']""")
    raised = {
        reason
        for source in (GO_MODULE.parents[1] / "python" / "stratad").rglob("*.py")
        # MCP tool errors and adapters' in-process errors never cross the gRPC API.
        if not {"mcp", "integrations"} & set(source.parts)
        for reason in literal.findall(source.read_text())
    }
    listed = set(
        re.findall(r'\bReason = "([A-Z][A-Z0-9_]+)"', (GO_MODULE / "errors.go").read_text())
    )
    assert len(raised) > 20 and len(listed) > 20
    missing = sorted(raised - listed)
    assert not missing, f"add {missing} to the Reason constants in clients/go/errors.go"
