"""Fixtures for end-to-end tests against real ``python -m stratad serve`` processes.

- ``stratad_env``: the environment daemons run in (this source tree on
  PYTHONPATH, no inherited STRATAD_* variables).
- ``run_stratad``: ``run_stratad(*args, timeout=30)`` runs ``python -m stratad ARGS``
  to completion and returns the `subprocess.CompletedProcess` (text output).
- ``start_daemon``: ``start_daemon(*extra_args, data_dir=None, listen=None,
  wait=True, env=None)`` starts ``stratad serve`` (on a free 127.0.0.1 port and
  a fresh data directory unless told otherwise), waits for SERVING unless
  ``wait=False``, and returns a `Daemon`. Every daemon still running at the end
  of the test is killed.
- ``daemon``: one daemon started with the defaults above.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PYTHON_SOURCE = Path(__file__).resolve().parents[2] / "python"
STRATAD = [sys.executable, "-m", "stratad"]


@dataclass
class Daemon:
    """A ``stratad serve`` subprocess; its stdout and stderr go to ``log_path``."""

    proc: subprocess.Popen[bytes]
    target: str
    data_dir: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"daemon {self.pid} still running after {timeout}s:\n{self.output()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def stratad_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    # No fixed metrics port: daemons run side by side (--metrics-listen overrides this).
    env["STRATAD_METRICS_LISTEN"] = "off"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PYTHON_SOURCE), env.get("PYTHONPATH", "")) if p
    )
    return env


@pytest.fixture
def run_stratad(
    stratad_env: dict[str, str],
) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*STRATAD, *args],
            env=stratad_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture
def start_daemon(
    tmp_path: Path,
    stratad_env: dict[str, str],
    wait_serving: Callable[..., None],
    get_free_port: Callable[[], int],
) -> Iterator[Callable[..., Daemon]]:
    daemons: list[Daemon] = []

    def start(
        *extra_args: str,
        data_dir: Path | None = None,
        listen: str | None = None,
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> Daemon:
        n = len(daemons)
        data_dir = data_dir or tmp_path / f"data{n}"
        listen = listen or f"127.0.0.1:{get_free_port()}"
        log_path = tmp_path / f"daemon{n}.log"
        args = ["serve", "--listen", listen, "--data-dir", str(data_dir), *extra_args]
        with log_path.open("wb") as log:
            # A file, not a pipe: a chatty daemon must never block on a full pipe.
            proc = subprocess.Popen(
                [*STRATAD, *args],
                env={**stratad_env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        daemon = Daemon(proc, listen, data_dir, log_path)
        daemons.append(daemon)
        if wait:
            try:
                wait_serving(listen, timeout=30.0, proc=proc)
            except BaseException:
                print(daemon.output(), file=sys.stderr)
                raise
        return daemon

    yield start
    for daemon in daemons:
        daemon.kill()


@pytest.fixture
def daemon(start_daemon: Callable[..., Daemon]) -> Daemon:
    return start_daemon()
