"""A real ``stratad serve`` over TLS with bearer tokens: the SDK, ``stratad ctl``,
the audit log, and start-up refusals of insecure or broken settings.

The daemon also listens on a unix socket: plaintext, so the fixtures' health
wait (an insecure channel) can tell when it serves; health needs no token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pki import Pki

import stratad
from stratad.errors import PermissionDeniedError, UnauthenticatedError

STRATAD = [sys.executable, "-m", "stratad"]


def new_token(run_stratad: Callable[..., Any], tenant: str, role: str) -> tuple[str, str]:
    """``stratad ctl token new``: the token and its identities-file line, as an operator would."""
    made = run_stratad("ctl", "token", "new", "--for-tenant", tenant, "--role", role)
    assert made.returncode == 0, made.stderr
    token, entry = made.stdout.splitlines()
    return token, entry


@pytest.fixture
def tls_daemon(
    start_daemon: Callable[..., Any],
    wait_serving: Callable[..., None],
    run_stratad: Callable[..., Any],
    pki: Pki,
    tmp_path: Path,
) -> dict[str, Any]:
    agent, agent_entry = new_token(run_stratad, "acme", "agent")
    admin, admin_entry = new_token(run_stratad, "default", "admin")
    tokens = tmp_path / "identities.toml"
    tokens.write_text(f"[tokens]\n{agent_entry}\n{admin_entry}\n")
    issued = pki.server()
    unix = f"unix:{tmp_path}/stratad.sock"
    daemon = start_daemon(
        "--listen-unix", unix,
        "--tls-cert-file", str(issued.cert),
        "--tls-key-file", str(issued.key),
        "--auth", "token",
        "--auth-tokens-file", str(tokens),
        "--log-format", "json",
        wait=False,
    )  # fmt: skip
    wait_serving(unix, timeout=30.0, proc=daemon.proc)
    return {"daemon": daemon, "agent": agent, "admin": admin, "unix": unix}


def test_sdk_over_tls_with_a_token_against_a_real_daemon(
    tls_daemon: dict[str, Any], pki: Pki
) -> None:
    daemon = tls_daemon["daemon"]
    tls = stratad.TLSConfig(ca_file=str(pki.ca_file))
    with stratad.Client(daemon.target, token=tls_daemon["agent"], tls=tls) as client:
        client.create_session("chat-1")
        client.save_state("chat-1", b'{"messages": []}', content_type="application/json")
        assert client.load_state("chat-1").data == b'{"messages": []}'
        with pytest.raises(PermissionDeniedError):
            client.store_stats()
    with stratad.Client(daemon.target, tls=tls) as anonymous, pytest.raises(UnauthenticatedError):
        next(anonymous.list_sessions())
    with stratad.Client(daemon.target, token=tls_daemon["admin"], tenant="acme", tls=tls) as admin:
        assert [s.session_id for s in admin.list_sessions()] == ["chat-1"]
    assert daemon.stop() == 0

    audit = [json.loads(line) for line in daemon.output().splitlines() if '"stratad.audit"' in line]
    events = [(a["audit"]["event"], a["audit"]["code"]) for a in audit]
    assert ("auth_failure", "PERMISSION_DENIED") in events
    assert ("auth_failure", "UNAUTHENTICATED") in events
    assert all(a["level"] == "warning" for a in audit if a["audit"]["event"] == "auth_failure")


def test_ctl_with_tls_flags_and_a_token(
    tls_daemon: dict[str, Any], pki: Pki, stratad_env: dict[str, str], tmp_path: Path
) -> None:
    daemon = tls_daemon["daemon"]
    token_file = tmp_path / "admin.token"
    token_file.write_text(tls_daemon["admin"] + "\n")

    def ctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*STRATAD, "ctl", *args],
            env={**stratad_env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    tls = ["--address", daemon.target, "--tls-ca", str(pki.ca_file)]
    assert ctl(*tls, "health").stdout.strip() == "SERVING"  # no token needed
    assert ctl("--address", tls_daemon["unix"], "health").returncode == 0
    refused = ctl(*tls, "stats")
    assert refused.returncode == 1 and "Bearer" in refused.stderr
    stats = ctl(*tls, "--token-file", str(token_file), "--json", "stats")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["sessions"] == 0
    by_env = ctl("--json", "sessions", "ls", env={
        "STRATAD_ADDRESS": daemon.target,
        "STRATAD_TLS_CA": str(pki.ca_file),
        "STRATAD_TOKEN": tls_daemon["agent"],
    })  # fmt: skip
    assert by_env.returncode == 0, by_env.stderr
    plaintext = ctl("--address", daemon.target, "--timeout", "3", "stats")
    assert plaintext.returncode == 1


def test_plaintext_beyond_loopback_is_refused_at_start(
    run_stratad: Callable[..., Any], tmp_path: Path
) -> None:
    result = run_stratad("serve", "--listen", "0.0.0.0:0", "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert "allow_insecure" in result.stderr


def test_unreadable_tls_files_stop_start_up(
    run_stratad: Callable[..., Any], tmp_path: Path
) -> None:
    result = run_stratad(
        "serve",
        "--listen", "127.0.0.1:0",
        "--data-dir", str(tmp_path / "d"),
        "--tls-cert-file", str(tmp_path / "absent.crt"),
        "--tls-key-file", str(tmp_path / "absent.key"),
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot read TLS file" in result.stderr


def test_token_hash_matches_the_daemon(stratad_env: dict[str, str]) -> None:
    from stratad.server.auth import token_digest

    result = subprocess.run(
        [*STRATAD, "ctl", "token", "hash"],
        input="s3cr3t-token\n",
        env=stratad_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == token_digest("s3cr3t-token")
