"""TLS mismatches name the fix, in every client, against real daemons.

Three daemons: plaintext, TLS, and mTLS (client certificates required). Each
client meets each mismatch: a plaintext client on the TLS daemon
(TLS_REQUIRED), a TLS client without a certificate on the mTLS daemon
(CLIENT_CERT_REQUIRED), a TLS client on the plaintext daemon
(TLS_NOT_SUPPORTED). Each must fail with the transport's status, UNAVAILABLE,
and a message that names the setting to change (python/stratad/sdk/diagnose.py,
clients/go/diagnose.go, clients/ts/src/diagnose.ts; docs/security.md,
"Troubleshooting connection errors").

The Go and TypeScript cases run the clients' own tests (TestTLSMismatchesNameTheFix,
test/tls-mismatch.test.ts) with the daemons' addresses; they skip without Go
or Node, unless STRATAD_REQUIRE_GO / STRATAD_REQUIRE_NODE is set (CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from go_toolchain import find_go
from node_toolchain import install, node_env
from pki import Pki

import stratad
from stratad.errors import UnavailableError
from stratad.sdk import diagnose

ROOT = Path(__file__).resolve().parents[2]
GO_MODULE = ROOT / "clients" / "go"
TS_PACKAGE = ROOT / "clients" / "ts"
#: The console script of this environment, as an operator runs it.
STRATAD_CTL = [str(Path(sys.executable).with_name("stratad")), "ctl"]


@dataclass
class Daemons:
    plain: str  # HOST:PORT, plaintext
    tls: str  # HOST:PORT, TLS
    mtls: str  # HOST:PORT, TLS requiring a client certificate
    unix: str  # unix:/path of the plaintext daemon
    ca: str  # the CA file of both TLS daemons' certificates (and of client certificates)
    client_cert: str
    client_key: str


@pytest.fixture
def daemons(
    start_daemon: Callable[..., Any],
    wait_serving: Callable[..., None],
    pki: Pki,
    tmp_path: Path,
) -> Daemons:
    issued = pki.server()
    tls = ["--tls-cert-file", str(issued.cert), "--tls-key-file", str(issued.key)]
    unix = f"unix:{tmp_path}/plain.sock"
    plain = start_daemon("--listen-unix", unix, wait=False)
    # The health waits are plaintext: the TLS daemons are watched on their unix sockets.
    secured = start_daemon("--listen-unix", f"unix:{tmp_path}/tls.sock", *tls, wait=False)
    mutual = start_daemon(
        "--listen-unix", f"unix:{tmp_path}/mtls.sock",
        *tls,
        "--tls-client-ca-file", str(pki.ca_file),
        wait=False,
    )  # fmt: skip
    for daemon, socket in ((plain, "plain"), (secured, "tls"), (mutual, "mtls")):
        wait_serving(f"unix:{tmp_path}/{socket}.sock", timeout=30.0, proc=daemon.proc)
    client = pki.client("agent-1")
    return Daemons(
        plain.target,
        secured.target,
        mutual.target,
        unix,
        str(pki.ca_file),
        str(client.cert),
        str(client.key),
    )


def cases(d: Daemons) -> list[tuple[str, str, stratad.TLSConfig | bool, list[str]]]:
    """(reason, address, the client's tls, what the message must name) per mismatch."""
    ca = stratad.TLSConfig(ca_file=d.ca)
    return [
        (
            "TLS_REQUIRED",
            d.tls,
            False,
            [f"{d.tls} speaks TLS", "tls=stratad.TLSConfig(ca_file=", "STRATAD_TLS_CA"],
        ),
        (
            "CLIENT_CERT_REQUIRED",
            d.mtls,
            ca,
            [f"{d.mtls} requires a client certificate", "cert_file=", "STRATAD_TLS_CERT"],
        ),
        (
            "TLS_NOT_SUPPORTED",
            d.plain,
            ca,
            [f"{d.plain} does not speak TLS", "tls=False", "unset STRATAD_TLS"],
        ),
    ]


def assert_names_the_fix(error: UnavailableError, reason: str, fixes: list[str]) -> None:
    assert isinstance(error, UnavailableError), error
    assert error.grpc_status == "UNAVAILABLE"
    assert error.reason == reason, error.message
    for fix in fixes:
        assert fix in error.message, f"{fix!r} not in {error.message!r}"


# --- the Python SDK ---------------------------------------------------------------------------


@pytest.mark.parametrize("native_calls", [True, False], ids=["native", "grpcio"])
def test_sync_client_names_the_fix(daemons: Daemons, native_calls: bool) -> None:
    for reason, address, tls, fixes in cases(daemons):
        with stratad.Client(address, tls=tls, timeout=20, native_calls=native_calls) as client:
            with pytest.raises(UnavailableError) as unary:
                client.get_session("s")
            assert_names_the_fix(unary.value, reason, fixes)
            assert unary.value.metadata == {"address": address}
            with pytest.raises(UnavailableError) as stream:
                next(client.watch_session("s", timeout=20))
            assert_names_the_fix(stream.value, reason, fixes)
            with pytest.raises(UnavailableError) as ready:
                client.wait_ready(timeout=1.0)
            assert_names_the_fix(ready.value, reason, fixes)


def test_async_client_names_the_fix(daemons: Daemons) -> None:
    async def fail(address: str, tls: stratad.TLSConfig | bool) -> list[UnavailableError]:
        errors = []
        async with stratad.AsyncClient(address, tls=tls, timeout=20) as client:
            with pytest.raises(UnavailableError) as unary:
                await client.get_session("s")
            errors.append(unary.value)
            with pytest.raises(UnavailableError) as stream:
                await anext(client.watch_session("s"))
            errors.append(stream.value)
        return errors

    for reason, address, tls, fixes in cases(daemons):
        for error in asyncio.run(fail(address, tls)):
            assert_names_the_fix(error, reason, fixes)


def test_the_right_settings_and_unix_sockets_are_never_probed(
    daemons: Daemons, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_probe(*args: object, **kwargs: object) -> str:
        raise AssertionError("probed")

    monkeypatch.setattr(diagnose, "probe", no_probe)
    ca = stratad.TLSConfig(ca_file=daemons.ca)
    mtls = stratad.TLSConfig(daemons.ca, daemons.client_cert, daemons.client_key)
    for address, tls in ((daemons.plain, False), (daemons.tls, ca), (daemons.mtls, mtls)):
        with stratad.Client(address, tls=tls) as client:
            client.create_session("s")
            assert client.get_session("s").session_id == "s"
            assert [s.session_id for s in client.list_sessions()] == ["s"]
    with stratad.Client(daemons.unix) as client:
        assert client.get_session("s").session_id == "s"
    # A unix socket nobody serves: the transport's UNAVAILABLE, nothing probed.
    with stratad.Client(f"{daemons.unix}.absent", timeout=5) as client:
        with pytest.raises(UnavailableError) as absent:
            client.get_session("s")
        assert absent.value.reason == "UNAVAILABLE"


def test_a_port_nobody_serves_keeps_its_error(
    daemons: Daemons, get_free_port: Callable[[], int]
) -> None:
    address = f"127.0.0.1:{get_free_port()}"
    for tls in (False, stratad.TLSConfig(ca_file=daemons.ca)):
        with stratad.Client(address, tls=tls, timeout=5) as client:
            with pytest.raises(UnavailableError) as refused:
                client.get_session("s")
            assert refused.value.reason == "UNAVAILABLE"
            assert "speak TLS" not in refused.value.message


# --- stratad ctl --------------------------------------------------------------------------------


def test_ctl_names_the_fix(daemons: Daemons, stratad_env: dict[str, str]) -> None:
    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*STRATAD_CTL, "--timeout", "20", *args],
            env=stratad_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    d = daemons
    mismatches = [
        (["--address", d.tls], f"{d.tls} speaks TLS", ["--tls-ca FILE", "STRATAD_TLS_CA"]),
        (
            ["--address", d.mtls, "--tls-ca", d.ca],
            f"{d.mtls} requires a client certificate",
            ["--tls-cert FILE --tls-key FILE", "STRATAD_TLS_CERT"],
        ),
        (
            ["--address", d.plain, "--tls-ca", d.ca],
            f"{d.plain} does not speak TLS",
            ["leave out --tls, --tls-ca", "unset STRATAD_TLS"],
        ),
    ]
    for connection, diagnosis, fixes in mismatches:
        # health dials the channel itself; sessions ls goes through the SDK's calls;
        # verify through a future (a long call with a spinner).
        for command in (["health"], ["sessions", "ls"], ["verify"]):
            result = ctl(*connection, *command)
            assert result.returncode == 1, result
            assert diagnosis in result.stderr, result.stderr
            for fix in fixes:
                assert fix in result.stderr, result.stderr
        health = ctl(*connection, "--json", "health")
        assert json.loads(health.stdout)["status"] == "UNREACHABLE"
        assert diagnosis in json.loads(health.stdout)["error"]
    # The right settings: no complaint.
    right = ctl("--address", d.mtls, "--tls-ca", d.ca, "--tls-cert", d.client_cert,
                "--tls-key", d.client_key, "health")  # fmt: skip
    assert (right.returncode, right.stdout.strip()) == (0, "SERVING"), right.stderr


# --- Go -----------------------------------------------------------------------------------------


def test_go_client_names_the_fix(daemons: Daemons) -> None:
    go = find_go()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    env.update(
        STRATAD_TEST_ADDRESS=daemons.plain,
        STRATAD_TEST_AUTH_ADDRESS=daemons.tls,
        STRATAD_TEST_AUTH_CA=daemons.ca,
        STRATAD_TEST_MTLS_ADDRESS=daemons.mtls,
        STRATAD_TEST_REQUIRE_DAEMON="1",
        STRATAD_TEST_REQUIRE_MTLS="1",
    )
    tests = "^(TestTLSMismatchesNameTheFix|TestProbeTellsWhatThePortSpeaks|TestTCPEndpoint)$"
    result = subprocess.run(
        [go, "test", "-count=1", "-json", "-run", tests, "."],
        cwd=GO_MODULE,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a cold build compiles gRPC
        check=False,
    )
    outcomes = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("Test") and event.get("Action") in ("pass", "fail", "skip"):
                outcomes[event["Test"]] = event["Action"]
    output = "".join(
        json.loads(line).get("Output", "")
        for line in result.stdout.splitlines()
        if line.startswith("{")
    )
    mismatches = {t: a for t, a in outcomes.items() if t.startswith("TestTLSMismatchesNameTheFix/")}
    assert result.returncode == 0, output + result.stderr
    assert len(mismatches) == 3 and set(mismatches.values()) == {"pass"}, (outcomes, output)
    assert set(outcomes.values()) == {"pass"}, outcomes


# --- TypeScript ---------------------------------------------------------------------------------


def test_ts_client_names_the_fix(daemons: Daemons) -> None:
    install(ROOT / "scripts" / "ts-client-deps.sh")
    env = node_env()
    env.update(
        STRATAD_TEST_ADDRESS=daemons.plain,
        STRATAD_TEST_AUTH_ADDRESS=daemons.tls,
        STRATAD_TEST_TLS_CA=daemons.ca,
        STRATAD_TEST_MTLS_ADDRESS=daemons.mtls,
    )
    result = subprocess.run(
        ["node", "--import", "tsx", "--test", "test/tls-mismatch.test.ts"],
        cwd=TS_PACKAGE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    counts = dict(
        line[2:].split(" ", 1)
        for line in result.stdout.splitlines()
        if line.startswith(("# pass ", "# fail ", "# skipped ", "# tests "))
    )
    assert result.returncode == 0, output
    assert counts == {"tests": "3", "pass": "3", "fail": "0", "skipped": "0"}, output
