"""The TypeScript client (clients/ts) against real ``stratad serve`` daemons.

Installs the package as a user would (``npm ci`` through
scripts/ts-client-deps.sh), checks that its generated code matches proto/ and
that it type-checks, runs its node:test suites against a plaintext daemon and
a daemon with TLS and bearer tokens, and runs the quickstart example, whose
effects the Python SDK then reads back.

Skipped when node/npm are missing, unless STRATAD_REQUIRE_NODE is set (CI):
then it fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from node_toolchain import install, node_env
from pki import Pki

import stratad

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "ts"
DEPS_SCRIPT = ROOT / "scripts" / "ts-client-deps.sh"


@pytest.fixture(scope="module")
def ts_package() -> Path:
    """clients/ts installed (npm ci when stale) and built."""
    install(DEPS_SCRIPT)
    return PACKAGE


def npm(package: Path, *args: str, env: dict[str, str], timeout: float = 300) -> str:
    result = subprocess.run(
        ["npm", "run", "--silent", *args],
        cwd=package,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"npm run {' '.join(args)} failed:\n{output}"
    return output


def new_token(run_stratad: Callable[..., Any], tenant: str, role: str) -> tuple[str, str]:
    """``stratad ctl token new``: the token and its identities-file line."""
    made = run_stratad("ctl", "token", "new", "--for-tenant", tenant, "--role", role)
    assert made.returncode == 0, made.stderr
    token, entry = made.stdout.splitlines()
    return token, entry


def test_the_ts_reason_list_knows_every_reason_the_daemon_raises() -> None:
    """`Reason` in clients/ts/src/errors.ts lists every reason literal in python/stratad."""
    literal = re.compile(r"""\b(?:default_)?reason\s*=\s*["']([A-Z][A-Z0-9_]+)["']""")
    raised = {
        reason
        for source in (ROOT / "python" / "stratad").rglob("*.py")
        # MCP tool errors and adapters' in-process errors never cross the gRPC API.
        if not {"mcp", "integrations"} & set(source.parts)
        for reason in literal.findall(source.read_text())
    }
    listed = set(
        re.findall(
            r"^  ([A-Z][A-Z0-9_]+): \"\1\",$", (PACKAGE / "src" / "errors.ts").read_text(), re.M
        )
    )
    assert len(raised) > 20 and len(listed) > 20
    missing = sorted(raised - listed)
    assert not missing, f"add {missing} to Reason in clients/ts/src/errors.ts (and docs/errors.md)"


def test_generated_code_is_fresh_and_the_package_type_checks(ts_package: Path) -> None:
    env = node_env(STRATAD_PYTHON=sys.executable)
    assert "up to date" in npm(ts_package, "check:generated", env=env)
    npm(ts_package, "typecheck", env=env)


def test_ts_suites_pass_against_real_daemons(
    ts_package: Path,
    start_daemon: Callable[..., Any],
    wait_serving: Callable[..., None],
    run_stratad: Callable[..., Any],
    pki: Pki,
    tmp_path: Path,
) -> None:
    unix = f"unix:{tmp_path}/plain.sock"
    plain = start_daemon("--listen-unix", unix)

    agent, agent_entry = new_token(run_stratad, "acme", "agent")
    admin, admin_entry = new_token(run_stratad, "default", "admin")
    identities = tmp_path / "identities.toml"
    identities.write_text(f"[tokens]\n{agent_entry}\n{admin_entry}\n")
    issued = pki.server()
    # The fixtures' health wait is plaintext: it watches the unix socket.
    auth_unix = f"unix:{tmp_path}/auth.sock"
    secured = start_daemon(
        "--listen-unix", auth_unix,
        "--tls-cert-file", str(issued.cert),
        "--tls-key-file", str(issued.key),
        "--auth", "token",
        "--auth-tokens-file", str(identities),
        wait=False,
    )  # fmt: skip
    wait_serving(auth_unix, timeout=30.0, proc=secured.proc)

    # mTLS: the identity is the client certificate's name.
    client_cert = pki.client("agent-1.acme.svc", dns=("agent-1.acme.svc",))
    mtls_identities = tmp_path / "mtls-identities.toml"
    mtls_identities.write_text(
        '[clients]\n"agent-1.acme.svc" = { tenant = "acme", role = "agent" }\n'
    )
    mtls_unix = f"unix:{tmp_path}/mtls.sock"
    mutual = start_daemon(
        "--listen-unix", mtls_unix,
        "--tls-cert-file", str(issued.cert),
        "--tls-key-file", str(issued.key),
        "--tls-client-ca-file", str(pki.ca_file),
        "--auth", "mtls",
        "--auth-tokens-file", str(mtls_identities),
        wait=False,
    )  # fmt: skip
    wait_serving(mtls_unix, timeout=30.0, proc=mutual.proc)

    output = npm(
        ts_package,
        "test",
        env=node_env(
            STRATAD_TEST_ADDRESS=plain.target,
            STRATAD_TEST_UNIX_ADDRESS=unix,
            STRATAD_TEST_AUTH_ADDRESS=secured.target,
            STRATAD_TEST_TLS_CA=str(pki.ca_file),
            STRATAD_TEST_AGENT_TOKEN=agent,
            STRATAD_TEST_ADMIN_TOKEN=admin,
            STRATAD_TEST_MTLS_ADDRESS=mutual.target,
            STRATAD_TEST_CLIENT_CERT=str(client_cert.cert),
            STRATAD_TEST_CLIENT_KEY=str(client_cert.key),
        ),
    )
    counts = dict(re.findall(r"^# (tests|pass|fail|skipped|cancelled) (\d+)$", output, re.M))
    # Every daemon variable is set: a skipped test would be a test that did not run.
    assert counts.get("fail") == "0" and counts.get("skipped") == "0", output
    assert counts.get("cancelled") == "0", output
    assert int(counts["pass"]) == int(counts["tests"]) >= 33, output
    # The daemons kept serving through every refusal the suites provoked.
    assert all(d.proc.poll() is None for d in (plain, secured, mutual))


def test_quickstart_example_effects_are_visible_from_python(
    ts_package: Path, start_daemon: Callable[..., Any]
) -> None:
    daemon = start_daemon()
    result = subprocess.run(
        ["node", "examples/quickstart.mjs", "ts-quickstart"],
        cwd=ts_package,
        env=node_env(STRATAD_ADDRESS=daemon.target, STRATAD_TENANT="examples"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stale write refused: VERSION_CONFLICT" in result.stdout

    with stratad.Client(daemon.target, tenant="examples") as client:
        session = client.get_session("ts-quickstart")
        assert dict(session.labels) == {"agent": "quickstart"}
        checkpoints = list(client.list_checkpoints("ts-quickstart"))
        assert [dict(c.metadata) for c in checkpoints] == [{"step": 2.0}, {"step": 1.0}]
        latest = client.load_state("ts-quickstart")
        assert latest.content_type == "application/json"
        assert json.loads(latest.data) == {"messages": ["hi", "hello!"]}
        assert latest.checkpoint_id == checkpoints[0].checkpoint_id

        fork = client.get_session("ts-quickstart-fork")
        assert fork.forked_from_checkpoint_id == checkpoints[1].checkpoint_id
        assert json.loads(client.load_state("ts-quickstart-fork").data) == {"messages": ["hi"]}
        # The example's stale write changed nothing.
        assert session.checkpoint_count == 2
    # Its sessions live in the tenant it named (STRATAD_TENANT), nowhere else.
    with stratad.Client(daemon.target) as default_tenant:
        assert [s.session_id for s in default_tenant.list_sessions()] == []
