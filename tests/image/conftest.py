"""Fixtures for the container image's tests (``make image-test``; docs/deploy.md).

They run the real image, ``stratad:dev`` as ``make image`` built it
(STRATAD_IMAGE overrides), in a real Docker engine, and talk to it from this
venv through published ports and from a second container through a shared
unix socket.

- ``image``: the image reference, checked to exist. Without an engine that
  answers (or without the image) every test here is skipped, unless
  STRATAD_REQUIRE_DOCKER=1 (``make image-test``, CI): then it fails.
- ``docker``: ``docker(*args, timeout=60, check=True)`` runs the docker CLI and
  returns the `subprocess.CompletedProcess` (text output).
- ``volume``: ``volume()`` creates a named volume with a unique name.
- ``run_container``: ``run_container(*cmd, volumes={}, env={}, publish=True,
  hardened=True, extra=())`` starts ``docker run -d`` of the image (with
  ``HARDENED`` options: read-only root, every capability dropped, no new
  privileges; and ports 50051 and 9464 published on 127.0.0.1) and returns a
  `Container`.

Every container and volume made here is removed at the end of the test, pass
or fail; the names carry this process's id and a random suffix, so parallel
runs and leftovers from a killed run never collide.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from imagekit import (
    GRPC_PORT,
    HARDENED,
    IMAGE,
    METRICS_PORT,
    Container,
    docker,
    unavailable,
    unique,
)


@pytest.fixture(scope="session")
def image() -> str:
    if shutil.which("docker") is None:
        unavailable("no docker CLI on PATH (make image installs the engine)")
    info = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if info.returncode != 0:
        unavailable(
            f"no Docker engine answers: {info.stderr.strip()[:200]} (make image starts one)"
        )
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        unavailable(f"no image {IMAGE} in the engine: run make image")
    return IMAGE


@pytest.fixture(name="docker")
def docker_fixture(image: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    return docker


@pytest.fixture
def volume(image: str) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def create() -> str:
        name = unique("vol")
        docker("volume", "create", name)
        made.append(name)
        return name

    yield create
    for name in made:
        # After the containers (fixture teardown order): a volume in use cannot go.
        docker("volume", "rm", "-f", name, check=False)


@pytest.fixture
def run_container(image: str, volume: Callable[[], str]) -> Iterator[Callable[..., Container]]:
    started: list[Container] = []

    def run(
        *cmd: str,
        volumes: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        publish: bool = True,
        hardened: bool = True,
        extra: tuple[str, ...] = (),
    ) -> Container:
        container = Container(unique("ctr"))
        args = ["run", "-d", "--name", container.name, "--label", "stratad-test=1"]
        if hardened:
            args += HARDENED
        if publish:
            # Port 0 on the host: the engine picks free ones (Container.address).
            args += ["-p", f"127.0.0.1::{GRPC_PORT}", "-p", f"127.0.0.1::{METRICS_PORT}"]
        for source, target in (volumes or {}).items():
            args += ["-v", f"{source}:{target}"]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        docker(*args, *extra, image, *cmd)
        started.append(container)
        return container

    yield run
    for container in started:
        docker("rm", "-f", "-v", container.name, check=False)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The image's size, in every run's output (docs/deploy.md quotes it)."""
    result = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}} {{.Id}}", IMAGE],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if result.returncode == 0:
        size, image_id = result.stdout.split()
        terminalreporter.write_line(
            f"{IMAGE} ({image_id[7:19]}): {int(size) / 1e6:.0f} MB uncompressed"
        )
