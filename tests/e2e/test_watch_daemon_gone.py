"""A watch whose daemon dies ends with UNAVAILABLE instead of waiting for good.

The SDK retries UNAVAILABLE for every stratad service (gRPC's retry policy);
retried the same way, a WatchSession stream that had received no event yet
would wait on the dead daemon forever (and get nothing once it came back).
Both clients must raise UnavailableError soon after a SIGKILL, so that the
caller can watch again from the last version it saw.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import stratad
from stratad.errors import UnavailableError

#: Far above what ending the stream takes (milliseconds): a hang detector only.
GIVE_UP_SECONDS = 20.0


def _killed_mid_watch(start_daemon: Callable[..., Any], save_first: bool) -> list[object]:
    daemon = start_daemon()
    outcome: list[object] = []
    with stratad.Client(daemon.target) as client:
        client.create_session("w")
        watching = threading.Event()

        def watch() -> None:
            try:
                events = client.watch_session("w", timeout=None)
                watching.set()
                outcome.extend(event.version for event in events)
                outcome.append("ended")
            except Exception as exc:  # the point: which exception, if any
                outcome.append(exc)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        assert watching.wait(10)
        time.sleep(0.5)  # the stream is open on the daemon
        if save_first:
            client.save_state("w", b"{}")
        daemon.kill()
        thread.join(GIVE_UP_SECONDS)
        assert not thread.is_alive(), f"the watch still waits {GIVE_UP_SECONDS}s after SIGKILL"
    return outcome


def test_a_blocking_watch_without_events_raises_unavailable_when_the_daemon_is_killed(
    start_daemon: Callable[..., Any],
) -> None:
    outcome = _killed_mid_watch(start_daemon, save_first=False)
    assert len(outcome) == 1 and isinstance(outcome[0], UnavailableError), outcome


def test_a_blocking_watch_with_events_raises_unavailable_when_the_daemon_is_killed(
    start_daemon: Callable[..., Any],
) -> None:
    outcome = _killed_mid_watch(start_daemon, save_first=True)
    assert isinstance(outcome[-1], UnavailableError), outcome


def test_an_async_watch_raises_unavailable_when_the_daemon_is_killed(
    start_daemon: Callable[..., Any],
) -> None:
    daemon = start_daemon()

    async def run() -> list[object]:
        outcome: list[object] = []
        async with stratad.AsyncClient(daemon.target) as client:
            await client.create_session("w")

            async def watch() -> None:
                try:
                    async for event in client.watch_session("w"):
                        outcome.append(event.version)
                except UnavailableError as exc:
                    outcome.append(exc)

            task = asyncio.create_task(watch())
            await asyncio.sleep(0.5)  # the stream is open
            daemon.kill()
            await asyncio.wait_for(task, GIVE_UP_SECONDS)
        return outcome

    outcome = asyncio.run(run())
    assert len(outcome) == 1 and isinstance(outcome[0], UnavailableError), outcome


def test_ctl_watch_resumes_after_the_daemon_is_killed_and_restarted(
    start_daemon: Callable[..., Any], stratad_env: dict[str, str]
) -> None:
    """`stratad ctl sessions watch` outlives a SIGKILL and a restart of its
    daemon: it watches again from the last version it printed, so every event
    is printed once, in order, none lost (those saved while it was
    reconnecting included)."""
    daemon = start_daemon()
    with stratad.Client(daemon.target) as client:
        client.create_session("w")
    ctl = [sys.executable, "-m", "stratad", "ctl", "--address", daemon.target]
    watch = subprocess.Popen(
        [*ctl, "sessions", "watch", "w", "--json"],
        env=stratad_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(120, watch.kill)  # never hang the suite
    watchdog.start()
    try:
        assert watch.stdout is not None
        time.sleep(2.0)  # ctl has started and opened its stream
        with stratad.Client(daemon.target) as client:
            for n in range(3):
                client.save_state("w", f'{{"n": {n}}}'.encode())
        before = [json.loads(watch.stdout.readline())["version"] for _ in range(3)]
        daemon.kill()
        daemon = start_daemon(listen=daemon.target, data_dir=daemon.data_dir)
        with stratad.Client(daemon.target) as client:
            for n in range(3, 5):
                client.save_state("w", f'{{"n": {n}}}'.encode())
            final = client.get_session("w").version
        after = [json.loads(watch.stdout.readline())["version"] for _ in range(2)]
        with stratad.Client(daemon.target) as client:
            client.delete_session("w")
        _, err = watch.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if watch.poll() is None:
            watch.kill()
    assert before + after == list(range(2, final + 1)), (before, after, err)
    assert watch.returncode == 0, err
    assert "watching w again from version 4" in err
    assert "the session was deleted" in err
