"""The daemon as a real process: start, serve, refuse a shared data dir, stop."""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from stratad import __version__

SERVING = health_pb2.HealthCheckResponse.SERVING
GRACE = 5.0


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path may be longer.
    with tempfile.TemporaryDirectory(prefix="stratad-") as tmp:
        yield Path(tmp)


def test_version(run_stratad: Callable[..., Any]) -> None:
    result = run_stratad("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"stratad {__version__}"


def test_daemon_serves(daemon: Any, health_check: Callable[..., int]) -> None:
    assert health_check(daemon.target) == SERVING
    assert (daemon.data_dir / "FORMAT").is_file()
    assert (daemon.data_dir / "LOCK").read_text().strip() == str(daemon.pid)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_within_grace_period(
    start_daemon: Callable[..., Any], signum: int
) -> None:
    daemon = start_daemon("--grace-period", str(GRACE))
    daemon.signal(signum)
    # Nothing is in flight, so it must not need the whole grace period; the
    # bound is generous because this machine may be busy.
    assert daemon.wait(timeout=GRACE) == 0, daemon.output()
    assert "stratad stopped" in daemon.output()
    assert (daemon.data_dir / "LOCK").read_text() == ""


def test_second_daemon_on_same_data_dir_is_refused(
    start_daemon: Callable[..., Any], health_check: Callable[..., int]
) -> None:
    first = start_daemon()
    second = start_daemon(data_dir=first.data_dir, wait=False)
    assert second.wait(timeout=30) != 0
    message = second.output()
    assert str(first.data_dir / "LOCK") in message
    assert f"PID {first.pid}" in message
    assert "in use" in message
    assert "Traceback" not in message  # a clear message, not a crash
    assert health_check(first.target) == SERVING  # the first one is unaffected


def test_data_dir_is_usable_again_after_stop(start_daemon: Callable[..., Any]) -> None:
    first = start_daemon()
    assert first.stop() == 0
    second = start_daemon(data_dir=first.data_dir)
    assert second.stop() == 0


def test_data_dir_is_usable_again_after_sigkill(start_daemon: Callable[..., Any]) -> None:
    # The kernel drops a flock with its process: a crash never leaves the
    # directory locked (the crash tests rely on this).
    first = start_daemon()
    first.signal(signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    second = start_daemon(data_dir=first.data_dir)
    assert second.stop() == 0


def test_unix_socket_listen(
    start_daemon: Callable[..., Any], health_check: Callable[..., int], short_tmp: Path
) -> None:
    socket_path = short_tmp / "stratad.sock"
    daemon = start_daemon(listen=f"unix:{socket_path}")
    assert socket_path.exists()
    assert health_check(daemon.target) == SERVING
    assert daemon.stop() == 0
    assert not socket_path.exists()


def test_unix_socket_of_a_running_daemon_is_not_stolen(
    start_daemon: Callable[..., Any], health_check: Callable[..., int], short_tmp: Path
) -> None:
    listen = f"unix:{short_tmp / 'stratad.sock'}"
    first = start_daemon(listen=listen)
    second = start_daemon(listen=listen, wait=False)
    assert second.wait(timeout=30) == 1
    assert "another process is serving on it" in second.output()
    assert health_check(first.target) == SERVING


def test_port_in_use_exits_1(start_daemon: Callable[..., Any]) -> None:
    first = start_daemon()
    second = start_daemon(listen=first.target, wait=False)
    assert second.wait(timeout=30) == 1
    assert f"cannot listen on {first.target}" in second.output()


def test_config_error_exits_2(run_stratad: Callable[..., Any], tmp_path: Path) -> None:
    result = run_stratad("serve", "--data-dir", str(tmp_path), "--durability", "maybe")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "durability" in result.stderr


def test_settings_from_environment_and_config_file(
    start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    config = tmp_path / "stratad.toml"
    config.write_text('log_format = "text"\ndurability = "interval"\n')
    daemon = start_daemon(
        "--config", str(config), env={"STRATAD_LOG_FORMAT": "json", "STRATAD_LOG_LEVEL": "info"}
    )
    assert daemon.stop() == 0
    serving = next(line for line in daemon.output().splitlines() if "serving on" in line)
    assert serving.startswith("{")  # env beat the file: JSON logs
    assert "durability interval" in serving  # from the file
