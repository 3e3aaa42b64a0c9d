"""Fixtures for tests of the daemon's network edge against outside tools.

- ``h2spec_bin``: the h2spec binary (`scripts/h2spec.sh`, built once from the
  Go module proxy and cached); ``h2spec-mtls`` is beside it.
- ``grpc_go_server_bin``: grpc-go's interop server (`scripts/interop-tools.sh`,
  shared with tests/interop), the reference gRPC server.
- ``start_stratad``: ``start_stratad(*args, wait_target, credentials=None)``
  starts a real ``python -m stratad serve`` subprocess on a fresh data
  directory with ARGS, waits until the health service at ``wait_target``
  (reached with ``credentials``, else plaintext) reports SERVING and returns a
  `Daemon`; every daemon is killed at the end of the test.
- ``start_grpc_go``: ``start_grpc_go(tls=None)`` starts the interop server on a
  free port (``tls``: an `Issued` certificate to serve TLS with) and returns
  its port once it accepts connections.

`Daemon` and `TcpRelay` (a byte-for-byte relay from TCP to a unix socket: h2spec
dials TCP only) are in edge_support.py.

Needs Go (PATH or /usr/local/go/bin) to build the tools; without it the tests
skip, unless STRATAD_REQUIRE_GO is set (CI): then they fail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from edge_support import BUILD_TIMEOUT, Daemon
from go_toolchain import find_go
from pki import Issued

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON_SOURCE = REPO_ROOT / "python"
H2SPEC_SCRIPT = REPO_ROOT / "scripts" / "h2spec.sh"
INTEROP_TOOLS = REPO_ROOT / "scripts" / "interop-tools.sh"


def _run_script(*command: str) -> str:
    try:
        built = subprocess.run(
            ["bash", *command], capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{command} took over {BUILD_TIMEOUT}s:\n{exc.stderr!r}")
    assert built.returncode == 0, f"{command} failed:\n{built.stdout}{built.stderr}"
    return built.stdout


@pytest.fixture(scope="session")
def h2spec_bin() -> Path:
    find_go()
    path = Path(_run_script(str(H2SPEC_SCRIPT), "build").strip().splitlines()[-1])
    assert path.exists() and (path.parent / "h2spec-mtls").exists(), path
    return path


@pytest.fixture(scope="session")
def grpc_go_server_bin() -> Path:
    find_go()
    out = _run_script(str(INTEROP_TOOLS), "build")
    paths = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    server = Path(paths.get("server", ""))
    assert paths.get("server") and server.exists(), out
    return server


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_accepting(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"exited with {proc.returncode} before listening:\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    pytest.fail(f"nothing listening on 127.0.0.1:{port} after {timeout}s:\n{log.read_text()}")


@pytest.fixture
def start_stratad(
    tmp_path: Path, wait_serving: Callable[..., None]
) -> Iterator[Callable[..., Daemon]]:
    daemons: list[Daemon] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    env["STRATAD_METRICS_LISTEN"] = "off"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PYTHON_SOURCE), env.get("PYTHONPATH", "")) if p
    )

    def start(
        *args: str,
        wait_target: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> Daemon:
        n = len(daemons)
        port = _free_port()
        log_path = tmp_path / f"stratad{n}.log"
        command = [sys.executable, "-m", "stratad", "serve", "--listen", f"127.0.0.1:{port}"]
        command += ["--data-dir", str(tmp_path / f"data{n}"), *args]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        daemon = Daemon(proc, port, log_path)
        daemons.append(daemon)
        try:
            wait_serving(wait_target or f"127.0.0.1:{port}", 30.0, proc, credentials)
        except BaseException:
            print(daemon.output(), file=sys.stderr)
            raise
        return daemon

    yield start
    for daemon in daemons:
        if daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait(timeout=30)


@pytest.fixture
def start_grpc_go(grpc_go_server_bin: Path, tmp_path: Path) -> Iterator[Callable[..., int]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(tls: Issued | None = None) -> int:
        port = _free_port()
        command = [str(grpc_go_server_bin), f"--port={port}"]
        if tls is not None:
            command += ["--use_tls", f"--tls_cert_file={tls.cert}", f"--tls_key_file={tls.key}"]
        log_path = tmp_path / f"grpc-go{len(procs)}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        _wait_accepting(port, proc, log_path, timeout=30.0)
        return port

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
