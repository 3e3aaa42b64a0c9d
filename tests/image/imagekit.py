"""Helpers of the container image's tests (tests/image): the docker CLI, and
`Container`, a running (or exited) container of the image under test."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

IMAGE = os.environ.get("STRATAD_IMAGE", "stratad:dev")
REQUIRE = os.environ.get("STRATAD_REQUIRE_DOCKER") == "1"
#: What Kubernetes' restricted pod security does (deploy/k8s/deployment.yaml).
HARDENED = ("--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges")
GRPC_PORT = 50051
METRICS_PORT = 9464


def docker(
    *args: str, timeout: float = 60.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
        )
    return result


def unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"{reason} (STRATAD_REQUIRE_DOCKER=1)")
    pytest.skip(reason)


def health_status(target: str, timeout: float = 5.0) -> int:
    """One gRPC health Check of the whole server: the ServingStatus value."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout).status)


def unique(kind: str) -> str:
    return f"stratad-test-{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class Container:
    name: str

    def inspect(self) -> dict[str, Any]:
        data: list[dict[str, Any]] = json.loads(docker("inspect", self.name).stdout)
        return data[0]

    @property
    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.inspect()["State"]
        return state

    def logs(self) -> str:
        result = docker("logs", self.name, check=False)
        return result.stdout + result.stderr

    def address(self, port: int) -> str:
        """HOST:PORT on this machine where the container's ``port`` is published."""
        out = docker("port", self.name, f"{port}/tcp").stdout.split()
        assert out, f"{self.name}: port {port} is not published"
        return out[0]

    def exec(self, *cmd: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return docker("exec", self.name, *cmd, timeout=timeout, check=False)

    def wait_exit(self, timeout: float = 60.0) -> int:
        """Wait for the container to exit by itself; its exit code."""
        result = docker("wait", self.name, timeout=timeout)
        return int(result.stdout.strip())

    def stop(self, timeout: int = 30) -> tuple[int, float]:
        """``docker stop`` (SIGTERM, SIGKILL after ``timeout`` s): (exit code, seconds taken)."""
        start = time.monotonic()
        docker("stop", "-t", str(timeout), self.name, timeout=timeout + 30)
        took = time.monotonic() - start
        return int(self.state["ExitCode"]), took

    def wait_serving(self, timeout: float = 60.0) -> str:
        """Wait until gRPC health, through the published port, says SERVING; the address."""
        target = self.address(GRPC_PORT)
        deadline = time.monotonic() + timeout
        last = "no attempt"
        while time.monotonic() < deadline:
            state = self.state
            if not state["Running"]:
                pytest.fail(
                    f"{self.name} exited {state['ExitCode']} before serving:\n{self.logs()}"
                )
            try:
                if health_status(target, timeout=2.0) == health_pb2.HealthCheckResponse.SERVING:
                    return target
                last = "not SERVING"
            except grpc.RpcError as exc:
                last = f"{exc.code()}: {exc.details()}"
            time.sleep(0.2)
        pytest.fail(
            f"{self.name} not SERVING at {target} after {timeout}s ({last}):\n{self.logs()}"
        )
