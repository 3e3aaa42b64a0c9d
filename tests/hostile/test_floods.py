"""Case 5: HTTP/2 floods, on the TLS listeners and (for comparison) the others.

Each flood goes on for `FLOOD_SECONDS`, on a new connection whenever the daemon
cuts one (h2attack.py has what each sends):

- HPACK bomb: a 4,000-byte header in the server's dynamic table, referenced
  16,384 times per header block (16 KiB on the wire, 66 MB decoded);
- CONTINUATION flood: a header block that never ends (CVE-2024-27316 style);
- rapid reset: HEADERS then RST_STREAM, stream after stream (CVE-2023-44487).

The daemon's RSS must stay within the bound (harness.py), every attacking
connection must be cut (GOAWAY or closed) while its flood goes on, and the
well-behaved client must not notice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from h2attack import FloodResult, continuation_flood, hpack_bomb, rapid_reset, sustained
from harness import GoodClient, Sampler, Verdict

FLOOD_SECONDS = 5.0
FLOODS: dict[str, Callable[..., FloodResult]] = {
    "hpack-bomb": hpack_bomb,
    "continuation-flood": continuation_flood,
    "rapid-reset": rapid_reset,
}


@pytest.mark.parametrize("flood", list(FLOODS))
def test_floods_are_cut_off(hostile_daemon: Any, listener: str, flood: str) -> None:
    daemon = hostile_daemon(listener)
    verdict = Verdict(f"5 {flood} [{listener}]", daemon)
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        results = sustained(FLOODS[flood], daemon.endpoint, seconds=FLOOD_SECONDS)
        report = good.stop()
    frames = sum(r.sent_frames for r in results)
    cut = [r for r in results if r.cut]
    after = sorted(r.cut_after for r in cut if r.cut_after is not None)
    verdict.note(
        f"{flood}: {len(results)} connections, {frames} frames sent, {len(cut)} cut"
        + (f" (after {after[0]:.2f}..{after[-1]:.2f}s)" if after else "")
    )
    verdict.note(f"outcomes: {sorted({r.outcome for r in results})[:4]}")
    still_open = [r for r in results if not r.cut]
    verdict.check(
        "every attacking connection was cut (GOAWAY or closed)",
        not still_open,
        f"{len(still_open)} of {len(results)} still open after {FLOOD_SECONDS}s",
    )
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()
