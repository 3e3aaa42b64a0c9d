"""Case 8: idle connections must not starve the web inspector, nor flood its log.

`IDLE` TCP connections to ``inspector_listen`` send nothing. A legitimate GET
must still be answered within `GET_WITHIN` seconds, and holding them past
the inspector's 10 s read timeout must not log an ERROR (with a traceback)
per connection. The gRPC listener is not involved (plaintext TCP only).
"""

from __future__ import annotations

import http.client
import time
from typing import Any

from h2attack import Endpoint, close_all, open_idle
from harness import GoodClient, Sampler, Verdict

IDLE = 300
GET_WITHIN = 1.0
#: Longer than the inspector's READ_TIMEOUT (10 s): the idle connections time out.
HOLD_SECONDS = 11.0


def _get(address: str, path: str, timeout: float) -> tuple[int | str, float]:
    host, _, port = address.rpartition(":")
    start = time.monotonic()
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - start
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}", time.monotonic() - start
    finally:
        connection.close()


def test_idle_connections_do_not_starve_the_inspector(hostile_daemon: Any) -> None:
    daemon = hostile_daemon("tcp", inspector=True)
    verdict = Verdict(f"8 {IDLE} idle connections to the inspector", daemon)
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        start = time.monotonic()
        idle = open_idle(Endpoint("tcp", daemon.inspector), IDLE)
        time.sleep(0.5)
        status, took = _get(daemon.inspector, "/api/tenants", timeout=GET_WITHIN + 2.0)
        time.sleep(max(0.0, start + HOLD_SECONDS - time.monotonic()))
        close_all(idle)
        time.sleep(1.0)
        report = good.stop()
    verdict.note(f"{len(idle)} idle connections held {HOLD_SECONDS:.0f}s")
    verdict.check(
        f"a GET during the flood answers 200 within {GET_WITHIN}s",
        status == 200 and took <= GET_WITHIN,
        f"{status} after {took:.2f}s",
    )
    after, after_took = _get(daemon.inspector, "/api/tenants", timeout=5.0)
    verdict.check("a GET after answers 200", after == 200, f"{after} after {after_took:.2f}s")
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish(clean_log=True)
