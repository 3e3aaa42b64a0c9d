"""No "Task was destroyed but it is pending!" in the daemon's log.

A WatchSession waits for its next event with two tasks (the queue's get and
the daemon's stop). A watch the client cancels while it waits must not leave
both pending: once its queue was dropped, the get task would be
garbage-collected while still pending, and asyncio would log that ERROR line
(once per cancelled watch, whenever the garbage collector ran). The daemon
here is used as `make run` users use it: calls, watches cancelled by their
clients, then a SIGTERM with a watch still open.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import stratad
from stratad.errors import StratadError

Daemon = Any
CANCELLED_WATCHES = 20
#: Calls after the watches: enough allocations for the garbage collector to run.
CALLS = 500


def test_cancelled_watches_and_a_shutdown_leave_no_pending_task_behind(
    start_daemon: Callable[..., Daemon],
) -> None:
    daemon = start_daemon("--grace-period", "5")
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        client.save_state("s", b"first")
        for i in range(CANCELLED_WATCHES):
            version = client.get_session("s").version
            client.save_state("s", b"step %d" % i)
            watch = client.watch_session("s", from_version=version)
            assert next(watch).version == version + 1  # the replayed event
            watch.close()  # cancels the stream while the daemon waits for the next event
        for _ in range(CALLS):
            list(client.list_sessions())
            client.load_state("s")

        # A watch still open when the daemon is told to stop.
        received: list[Any] = []
        ended = threading.Event()

        def watch_until_the_end() -> None:
            try:
                for event in client.watch_session("s"):
                    received.append(event)
            except StratadError as exc:
                received.append(exc)
            finally:
                ended.set()

        watcher = threading.Thread(target=watch_until_the_end, daemon=True)
        watcher.start()
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:  # until the watch is under way
            client.save_state("s", b"seen by the open watch")
            time.sleep(0.1)
        assert received, "the open watch saw no event"

        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
        assert ended.wait(timeout=10), "the open watch did not end with the daemon"
    log = daemon.output()
    assert "stratad stopped" in log
    assert "Task was destroyed" not in log, log
    assert "ERROR" not in log, log
