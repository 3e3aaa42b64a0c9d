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

``--runslow`` also runs the tests marked ``@pytest.mark.slow`` (skipped otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
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
    target: str, timeout: float = 20.0, proc: subprocess.Popen[Any] | None = None
) -> None:
    """Block until ``target`` reports SERVING; fail if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    last_error = "no attempt made"
    with grpc.insecure_channel(target, options=FAST_RECONNECT_OPTIONS) as channel:
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
