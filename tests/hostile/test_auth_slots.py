"""Case 3: calls that carry no credential must not take the slots of those that do.

With token authentication on, two connections without a token open
`STREAMS` SaveStates streams between them (max_concurrent_rpcs, 256): half
stay idle, half send one byte a second. A client with a valid token must get
every one of its saves (and health checks) done meanwhile: a call without a
credential is refused when it starts, not kept until its first message.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from h2attack import SAVE_STATES, H2Client, close_all, grpc_frame
from harness import GoodClient, Sampler, Verdict

from stratad.api.v1 import checkpoint_pb2

CONNECTIONS = 2
STREAMS = 256
#: How long the streams are held (and the dribbling ones fed, a byte a second).
HOLD_SECONDS = 6.0


def test_unauthenticated_streams_do_not_take_the_slots(hostile_daemon: Any, listener: str) -> None:
    daemon = hostile_daemon(listener, auth=True)
    verdict = Verdict(f"3 unauthenticated streams vs slots [{listener}]", daemon)
    item = checkpoint_pb2.SaveStatesRequest(
        request=checkpoint_pb2.SaveStateRequest(session_id="intruder", data=b"x" * 64)
    )
    dribble = grpc_frame(item.SerializeToString())
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint, daemon.metadata()).start()
        attackers = [H2Client(daemon.endpoint) for _ in range(CONNECTIONS)]
        streams = [
            (attackers[n % CONNECTIONS], attackers[n % CONNECTIONS].request(SAVE_STATES))
            for n in range(STREAMS)
        ]
        dribbling = streams[1::2]
        start = time.monotonic()
        offset = 0
        while time.monotonic() - start < HOLD_SECONDS:
            for client, stream_id in dribbling:
                if not client.streams[stream_id].done:
                    client.send(stream_id, dribble[offset : offset + 1], timeout=0.1)
            offset += 1
            time.sleep(max(0.0, start + offset - time.monotonic()))
        outcomes = Counter(c.streams[s].describe() for c, s in streams)
        refused_fast = sum(
            1
            for c, s in streams
            if c.streams[s].ended_at is not None and c.streams[s].ended_at - c.streams[s].opened < 1
        )
        report = good.stop()
        close_all(attackers)
    verdict.note(
        f"{STREAMS} streams without a token: {dict(outcomes)}; {refused_fast} ended in < 1 s"
    )
    saves = sum(1 for e in report.errors if e.startswith("save"))
    verdict.note(f"good client (with a token): {report.calls // 2} saves tried, {saves} failed")
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()
