"""Fixtures shared by every test suite.

- ``free_port``: a TCP port on 127.0.0.1 that was free a moment ago;
  ``get_free_port()`` hands out more of them.
- ``health_check``: ``health_check(target, service="", timeout=5.0)`` does one
  health Check and returns the ServingStatus value (raises grpc.RpcError).
- ``wait_serving``: ``wait_serving(target, timeout=20.0, proc=None)`` blocks until
  the gRPC health service at ``target`` reports SERVING (fails early if ``proc``,
  a daemon subprocess, exits first).
- ``inprocess_server``: ``inprocess_server(services=(), **config_fields)`` starts
  the real `start_server` on ``127.0.0.1:0`` in a background event loop with a
  temporary data directory and returns an `InProcessServer` (``.target``,
  ``.server``, ``.resources``, ``.run(coro)``, ``.stop(grace)``); every server
  still running at the end of the test is stopped.
- ``pki``: a test CA (`tests/pki.py`) writing its certificates under tmp_path;
  ``pki.server()``, ``pki.client(name)``; ``new_pki(name)`` makes another CA.
- ``s3_server``: a real S3 server (SeaweedFS, `scripts/s3-test-server.sh`) with
  bucket ``stratad-test``, shared by the session; each test gets its own
  `S3Server` view with a fresh key ``.prefix`` (``.endpoint``, ``.bucket``,
  ``.access_key``, ``.secret_key``, ``.region``, ``.store()`` an obstore
  ``S3Store`` rooted at that prefix). Skipped when ``.tools/bin/weed`` is not
  built (``make s3-server``), unless STRATAD_REQUIRE_S3 is set: then it fails.

``--runslow`` also runs the tests marked ``@pytest.mark.slow`` (skipped otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from obstore.store import S3Store
from pki import Pki

from stratad.config import Config
from stratad.server.app import StratadServer, start_server
from stratad.server.registry import Resources, ServiceRegistration, open_resources

T = TypeVar("T")

# Reconnect quickly while a daemon is still starting instead of gRPC's
# default 1 s (and growing) backoff.
FAST_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow", action="store_true", default=False, help="also run @pytest.mark.slow tests"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip @pytest.mark.slow tests unless --runslow was given."""
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow test: run with --runslow")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip_slow)


def find_free_port() -> int:
    """A TCP port on 127.0.0.1 that the kernel just handed out and we released."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def get_free_port() -> Callable[[], int]:
    return find_free_port


@pytest.fixture
def free_port() -> int:
    return find_free_port()


def health_status(target: str, service: str = "", timeout: float = 5.0) -> int:
    """One health Check; returns the ServingStatus value or raises grpc.RpcError."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        return int(stub.Check(request, timeout=timeout).status)


def wait_until_serving(
    target: str,
    timeout: float = 20.0,
    proc: subprocess.Popen[Any] | None = None,
    credentials: grpc.ChannelCredentials | None = None,
) -> None:
    """Block until ``target`` reports SERVING (over TLS with ``credentials``);
    fail if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    last_error = "no attempt made"
    channel = (
        grpc.secure_channel(target, credentials, options=FAST_RECONNECT_OPTIONS)
        if credentials is not None
        else grpc.insecure_channel(target, options=FAST_RECONNECT_OPTIONS)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while (remaining := deadline - time.monotonic()) > 0:
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"daemon exited with {proc.returncode} before serving")
            try:
                # wait_for_ready: the call waits for the connection instead of
                # failing at once, so this loop does not spin.
                response = stub.Check(
                    health_pb2.HealthCheckRequest(),
                    timeout=min(0.5, remaining),
                    wait_for_ready=True,
                )
            except grpc.RpcError as exc:
                last_error = f"{exc.code()}: {exc.details()}"
                continue
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
            last_error = f"status {response.status}"
    pytest.fail(f"{target} not SERVING after {timeout}s ({last_error})")


@pytest.fixture
def health_check() -> Callable[..., int]:
    return health_status


@pytest.fixture
def wait_serving() -> Callable[..., None]:
    return wait_until_serving


class InProcessServer:
    """The real server, run in its own event loop on a background thread.

    Tests talk to it with ordinary (sync) gRPC clients, as agents would.
    """

    def __init__(self, config: Config, services: Iterable[ServiceRegistration]) -> None:
        self.config = config
        self._services = tuple(services)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._exit_stack = contextlib.AsyncExitStack()
        self.server: StratadServer | None = None
        self.resources: Resources | None = None

    @property
    def target(self) -> str:
        assert self.server is not None, "server not started"
        return self.server.address

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the server's event loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> InProcessServer:
        self._thread.start()
        self.run(self._start())
        return self

    async def _start(self) -> None:
        self.resources = await self._exit_stack.enter_async_context(open_resources(self.config))
        self.server = await start_server(self.resources, self._services)

    def stop(self, grace: float | None = 0) -> None:
        """Stop the server (draining for ``grace`` s), release resources, end the loop."""
        if not self._thread.is_alive():
            return
        try:
            self.run(self._stop(grace))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    async def _stop(self, grace: float | None) -> None:
        if self.server is not None:
            await self.server.stop(grace)
        await self._exit_stack.aclose()
        # Calls cut off by stop() may leave grpc's per-call tasks behind; end
        # them here rather than have the closed loop destroy them mid-flight.
        leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in leftovers:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*leftovers, return_exceptions=True), 10)
        await asyncio.get_running_loop().shutdown_asyncgens()


@pytest.fixture
def inprocess_server(tmp_path: Path) -> Iterator[Callable[..., InProcessServer]]:
    started: list[InProcessServer] = []

    def start(services: Iterable[ServiceRegistration] = (), **config: Any) -> InProcessServer:
        config.setdefault("listen", "127.0.0.1:0")
        config.setdefault("data_dir", tmp_path / f"data{len(started)}")
        # No fixed metrics port: tests run side by side (metrics_listen="127.0.0.1:0" to test it).
        config.setdefault("metrics_listen", "")
        server = InProcessServer(Config(**config), services)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop(grace=0)


@pytest.fixture
def new_pki(tmp_path: Path) -> Callable[[str], Pki]:
    def make(name: str) -> Pki:
        return Pki(tmp_path / "pki" / name.replace(" ", "-"), name)

    return make


@pytest.fixture
def pki(new_pki: Callable[[str], Pki]) -> Pki:
    return new_pki("stratad test CA")


REPO_ROOT = Path(__file__).resolve().parents[1]
S3_TEST_SERVER = REPO_ROOT / "scripts" / "s3-test-server.sh"
# Where the script builds it (STRATAD_TOOLS_DIR as in scripts/check_deploy.sh).
WEED = Path(os.environ.get("STRATAD_TOOLS_DIR") or REPO_ROOT / ".tools") / "bin" / "weed"
# `start DIR PORT` listens on PORT and the 9 ports after it (see the script).
S3_SERVER_PORTS = 10


@dataclasses.dataclass(frozen=True)
class S3Server:
    """A running S3 server (`scripts/s3-test-server.sh start`) and where a test may write.

    ``prefix`` is a key prefix of the test's own; `store` is rooted at it.
    """

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    pid: int
    data_dir: Path
    region: str = "us-east-1"
    prefix: str = ""

    def store(self, prefix: str | None = None) -> S3Store:
        """An obstore S3Store for the bucket, rooted at ``prefix`` (default: ``self.prefix``)."""
        prefix = self.prefix if prefix is None else prefix
        return S3Store(
            self.bucket,
            prefix=prefix or None,
            endpoint=self.endpoint,
            access_key_id=self.access_key,
            secret_access_key=self.secret_key,
            region=self.region,
            allow_http=True,
        )


def _free_port_range(count: int) -> int:
    """A port P with P .. P+count-1 all free on 127.0.0.1, below Linux's ephemeral range."""
    for _ in range(200):
        base = random.randrange(20000, 32768 - count)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def _run_s3_test_server(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(S3_TEST_SERVER), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="session")
def s3_server_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The session's S3 server; tests use ``s3_server`` (a per-test prefix on it)."""
    if not WEED.exists():
        reason = f"the S3 test server {WEED} is not built: run `make s3-server`"
        if os.environ.get("STRATAD_REQUIRE_S3", "") not in ("", "0"):
            pytest.fail(f"STRATAD_REQUIRE_S3 is set but {reason}", pytrace=False)
        pytest.skip(reason)
    data_dir = tmp_path_factory.mktemp("s3-server")
    failures = []
    # A port taken between our check and weed's bind fails the start: try others.
    for _ in range(3):
        result = _run_s3_test_server("start", str(data_dir), str(_free_port_range(S3_SERVER_PORTS)))
        if result.returncode == 0:
            break
        failures.append(result.stdout + result.stderr)
    else:
        pytest.fail("s3-test-server.sh start failed:\n" + "\n---\n".join(failures))
    info = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    try:
        yield S3Server(
            endpoint=info["endpoint"],
            bucket=info["bucket"],
            access_key="stratad-test",
            secret_key="stratad-test-secret",
            pid=int(info["pid"]),
            data_dir=data_dir,
        )
    finally:
        stopped = _run_s3_test_server("stop", str(data_dir))
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.fixture
def s3_server(s3_server_session: S3Server) -> S3Server:
    """The session's S3 server with a key prefix no other test uses."""
    prefix = f"test-{time.time_ns()}-{random.randrange(1 << 32):08x}"
    return dataclasses.replace(s3_server_session, prefix=prefix)
