"""Start and stop real `stratad serve` daemons (and an echo baseline) for benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_serving(
    address: str, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if proc is not None and proc.poll() is not None:
                stderr = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"{' '.join(proc.args)} exited: {stderr}")  # type: ignore[arg-type]
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing serving at {address} after {timeout} s")
            time.sleep(0.05)


@contextlib.contextmanager
def process(
    args: Sequence[str], address: str, python_path: Path = ROOT / "python"
) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(python_path)}
    # stderr to a file, not a pipe: in a long run (bench/load.py's soak) a daemon
    # that logs would block once a pipe nobody reads is full.
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            try:
                wait_serving(address, proc=proc)
            except RuntimeError as e:
                stderr.seek(0)
                raise RuntimeError(f"{e}\n{stderr.read().decode(errors='replace')}") from None
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def daemon_process(
    data_dir: Path, *extra: str, python_path: Path = ROOT / "python"
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A `stratad serve` subprocess on a free loopback port; yields (address, process).
    `python_path`: the stratad package to run (another version's, for an A/B)."""
    address = f"127.0.0.1:{free_port()}"
    args = [sys.executable, "-m", "stratad", "serve", "--listen", address]
    # No metrics endpoint: its default port would collide between daemons.
    args += ["--data-dir", str(data_dir), "--log-level", "warning", "--metrics-listen", "off"]
    args += extra
    with process(args, address, python_path) as proc:
        yield address, proc


@contextlib.contextmanager
def daemon(data_dir: Path, *extra: str) -> Iterator[str]:
    """A `stratad serve` subprocess on a free loopback port; yields its address."""
    with daemon_process(data_dir, *extra) as (address, _):
        yield address


@contextlib.contextmanager
def echo_server() -> Iterator[str]:
    """A bare grpc.aio server echoing a small reply: the transport ceiling."""
    address = f"127.0.0.1:{free_port()}"
    args = [sys.executable, str(Path(__file__).resolve().parent / "_echo.py"), address]
    with process(args, address):
        yield address
