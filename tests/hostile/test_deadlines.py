"""Case 2: calls whose requests never (fully) arrive must still end at their deadline.

Three kinds of call, each with ``grpc-timeout: 500m``: a SaveStates stream that
sends nothing, a unary SaveState whose request message never comes, and one
whose message stops half-way. Each must end DEADLINE_EXCEEDED within
`WITHIN` seconds, and waves of `WAVE` of them at once (more than
max_concurrent_rpcs, 256: the attacker's own calls beyond it may be refused
RESOURCE_EXHAUSTED) must not make a well-behaved client's calls
RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from h2attack import SAVE_STATE, SAVE_STATES, H2Client, close_all, grpc_frame
from harness import GoodClient, Sampler, Verdict

from stratad.api.v1 import checkpoint_pb2

TIMEOUT = "500m"
#: A call must have ended this long after its headers were sent (3x its deadline).
WITHIN = 1.5
#: Calls opened at once in a wave, spread over connections of STREAMS_PER_CONNECTION.
WAVE = 260
WAVES = 2
STREAMS_PER_CONNECTION = 65
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 4, 8
KINDS = ("quiet SaveStates stream", "SaveState, no request", "SaveState, half a request")


def _half_request(session_id: str) -> bytes:
    message = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=b"x" * 200)
    framed = grpc_frame(message.SerializeToString())
    return framed[: len(framed) // 2]


def _open(client: H2Client, kind: str, session_id: str) -> int:
    """Open one call of ``kind`` that will never complete its request."""
    if kind == KINDS[0]:
        return client.request(SAVE_STATES, timeout=TIMEOUT)
    stream_id = client.request(SAVE_STATE, timeout=TIMEOUT)
    if kind == KINDS[2]:
        client.send(stream_id, _half_request(session_id))
    return stream_id


def _ended_in_time(client: H2Client, stream_id: int, codes: tuple[int, ...]) -> bool:
    state = client.streams[stream_id]
    return (
        state.status in codes
        and state.ended_at is not None
        and state.ended_at - state.opened <= WITHIN
    )


def _outcome(client: H2Client, stream_id: int) -> str:
    state = client.streams[stream_id]
    took = f" after {state.ended_at - state.opened:.2f}s" if state.ended_at else ""
    return f"{state.describe()}{took}"


def test_calls_without_their_request_end_at_their_deadline(
    hostile_daemon: Any, listener: str
) -> None:
    daemon = hostile_daemon(listener)
    verdict = Verdict(f"2 deadlines of calls without their request [{listener}]", daemon)
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        session = good.session_id
        # Each kind alone.
        client = H2Client(daemon.endpoint)
        alone = {kind: _open(client, kind, session) for kind in KINDS}
        client.wait_done(alone.values(), WITHIN + 1.0)
        for kind, stream_id in alone.items():
            verdict.check(
                f"{kind}: DEADLINE_EXCEEDED within {WITHIN}s",
                _ended_in_time(client, stream_id, (DEADLINE_EXCEEDED,)),
                _outcome(client, stream_id),
            )
        client.close()
        # Waves of WAVE at once, while the good client calls.
        late: Counter[str] = Counter()
        outcomes: Counter[str] = Counter()
        for _ in range(WAVES):
            clients: list[H2Client] = []
            opened: list[tuple[H2Client, int, str]] = []
            for n in range(WAVE):
                if n % STREAMS_PER_CONNECTION == 0:
                    clients.append(H2Client(daemon.endpoint))
                kind = KINDS[n % len(KINDS)]
                opened.append((clients[-1], _open(clients[-1], kind, session), kind))
            deadline = time.monotonic() + WITHIN + 1.0
            for c in clients:
                mine = [s for owner, s, _ in opened if owner is c]
                c.wait_done(mine, max(0.0, deadline - time.monotonic()))
            for owner, stream_id, kind in opened:
                state = owner.streams[stream_id]
                outcomes[state.describe()] += 1
                # Beyond max_concurrent_rpcs the attacker's own calls may be refused.
                if not _ended_in_time(owner, stream_id, (DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)):
                    late[kind] += 1
            close_all(clients)
        report = good.stop()
    verdict.note(f"{WAVES} waves of {WAVE}: {dict(outcomes)}")
    verdict.check(
        f"every call of the waves ended DEADLINE_EXCEEDED (or RESOURCE_EXHAUSTED) within {WITHIN}s",
        not late,
        f"not in time: {dict(late)} of {WAVES * WAVE // len(KINDS)} each",
    )
    exhausted = [e for e in report.errors if "RESOURCE_EXHAUSTED" in e]
    verdict.check("good client: no RESOURCE_EXHAUSTED", not exhausted, f"{len(exhausted)} calls")
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()
