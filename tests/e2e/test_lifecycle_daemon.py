"""Idle-session TTL and scheduled GC in a real daemon (``stratad serve``).

Tiny intervals; the test polls until the daemon has done its work (generous
deadline), it never asserts how long anything took.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import stratad
from stratad.errors import NotFoundError

Daemon = Any
StartDaemon = Callable[..., Daemon]
DEADLINE = 60.0


def value(address: str, name: str, **labels: str) -> float:
    """The sum of the samples of metric ``name`` whose labels include ``labels`` (0: none)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = set(labels.items())
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted <= set(sample.labels.items())
    )


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def gone(client: stratad.Client, session_id: str) -> bool:
    try:
        client.get_session(session_id)
    except NotFoundError:
        return True
    return False


def test_idle_sessions_expire_and_scheduled_gc_frees_their_objects(
    start_daemon: StartDaemon, get_free_port: Callable[[], int]
) -> None:
    metrics = f"127.0.0.1:{get_free_port()}"
    daemon = start_daemon(
        "--session-idle-ttl", "3s",  # long enough for the set-up calls, even on a busy host
        "--lifecycle-sweep-interval", "0.2",
        "--gc-interval", "0.3",
        "--metrics-listen", metrics,
        "--metrics-tenant-labels", "5",
    )  # fmt: skip
    with stratad.Client(daemon.target) as client:
        client.create_session("idle")
        client.save_state("idle", os.urandom(200_000))
        client.create_session("pinned", labels={"stratad.dev/keep": "true"})
        client.save_state("pinned", b"kept forever")

        wait_until(lambda: gone(client, "idle"), "the idle session to expire")
        assert client.load_state("pinned").data == b"kept forever"

        def collected() -> bool:
            return value(metrics, "stratad_gc_bytes_freed_total", tenant="default") > 0

        wait_until(collected, "a scheduled GC to free the expired session's objects")
        assert value(metrics, "stratad_sessions_expired_total") == 1
        assert value(metrics, "stratad_scheduled_gc_runs_total", tenant="default") >= 1
        # What is left in the store is the pinned session's, and it still reads back.
        assert client.store_stats().sessions == 1
        assert client.load_state("pinned").data == b"kept forever"
    assert daemon.stop() == 0
    log = daemon.output()
    assert "expired session default/idle" in log
    assert "scheduled GC of tenant default" in log
