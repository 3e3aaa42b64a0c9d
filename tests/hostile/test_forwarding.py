"""Case 1: what one client's health, reflection and compressed calls do to the others.

The issue: on the TCP port, every call the native front door did not serve
itself (health, reflection, compressed calls) was forwarded to grpc.aio over
one shared HTTP/2 connection, so a client that stalled its streams, or
poisoned that connection's header state, reached everyone else. Whoever
serves these calls, on whichever listener, one client's calls must not
reach the others': the same attacks run on every listener.
"""

from __future__ import annotations

import gzip
import time
from typing import Any

from grpc_health.v1 import health_pb2
from h2attack import HEALTH_CHECK, REFLECTION, H2Client, grpc_frame
from harness import GoodClient, Sampler, Verdict

#: ServerReflectionRequest{list_services: ""}: field 7, an empty string (~400-byte answer).
LIST_SERVICES = b"\x3a\x00"
#: ServerReflectionRequest{file_containing_symbol: the CheckpointService}: field 4
#: (a ~10 KB answer: checkpoint.proto and what it imports).
_SYMBOL = b"stratad.api.v1.CheckpointService"
FILE_CONTAINING_SYMBOL = b"\x22" + bytes([len(_SYMBOL)]) + _SYMBOL
#: Phase 2 of 1a: file_containing_symbol requests sent in all, and for at most how
#: long. 32,000 answers of ~10 KB are ~330 MB: well over what the RSS bound allows
#: above the idle daemon, if they are all kept.
PILE_UP_REQUESTS = 32_000
PILE_UP_SECONDS = 6.0
UNIMPLEMENTED, INTERNAL = 12, 13


def test_unread_reflection_streams_do_not_stall_other_clients(
    hostile_daemon: Any, listener: str
) -> None:
    """1a. A client announcing a zero receive window (and never sending a
    WINDOW_UPDATE) opens 4 reflection streams with a list_services request
    each and never reads: other clients' health checks and saves go on
    (phase 1, 2 s). Phase 2: it keeps asking on those streams
    (file_containing_symbol, ~10 KB answers, up to PILE_UP_REQUESTS in
    PILE_UP_SECONDS), then waits 3 s: answers nobody reads must neither pile
    up in the daemon's memory (the RSS bound) nor stall anyone."""
    daemon = hostile_daemon(listener)
    verdict = Verdict(f"1a unread reflection streams [{listener}]", daemon)
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        attacker = H2Client(daemon.endpoint, window=0, read=False)
        streams = [attacker.request(REFLECTION) for _ in range(4)]
        for stream_id in streams:
            attacker.send(stream_id, grpc_frame(LIST_SERVICES))
        time.sleep(2.0)
        phase1 = good.report.summary()
        batch = grpc_frame(FILE_CONTAINING_SYMBOL) * 50
        sent = 0
        deadline = time.monotonic() + PILE_UP_SECONDS
        while sent < PILE_UP_REQUESTS and time.monotonic() < deadline:
            for stream_id in streams:
                if attacker.send(stream_id, batch, timeout=0.5):
                    sent += 50
        time.sleep(3.0)  # the answers wait, unread; the good client goes on calling
        report = good.stop()
        states = sorted({attacker.streams[s].describe() for s in streams})
        attacker.close()
    verdict.note(f"phase 1 (4 streams, 1 request each, 2 s): {phase1}")
    verdict.note(f"phase 2: {sent} more requests taken on the 4 streams; streams: {states}")
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()


#: Headers a client might send that the daemon cannot accept as they are, each
#: with a valid value of the same header that other clients send afterwards.
BAD_HEADERS = {
    "grpc-encoding: br": (("grpc-encoding", "br"), ("grpc-encoding", "gzip")),
    "grpc-timeout: abc": (("grpc-timeout", "abc"), ("grpc-timeout", "5S")),
    "x-trace-bin: not base64": (("x-trace-bin", "!!not*base64!!"), ("x-trace-bin", "dHJhY2U")),
}
#: Calls from other clients (each on a connection of its own) after the bad one.
OTHER_CLIENTS = 5


def _health(endpoint: Any, header: tuple[str, str]) -> tuple[int | None, str]:
    """One health Check on a new connection carrying ``header``; (status, text).

    With grpc-encoding, the request message is flagged compressed: gzip-
    compressed for gzip, and for anything else bytes no decoder can read."""
    client = H2Client(endpoint)
    try:
        message = health_pb2.HealthCheckRequest(service="").SerializeToString()
        compressed = header[0] == "grpc-encoding"
        if compressed:
            message = gzip.compress(message) if header[1] == "gzip" else b"\x01\x02\x03"
        state = client.call(HEALTH_CHECK, message, [header], compressed=compressed)
        return state.status, state.describe()
    finally:
        client.close()


def test_a_bad_header_on_a_forwarded_call_does_not_poison_other_clients(
    hostile_daemon: Any, listener: str
) -> None:
    """1b. One client sends a health Check (forwarded on TCP) with an unknown
    grpc-encoding, an unparseable grpc-timeout or a -bin value that is not
    base64. Each bad call must end with a gRPC status, the unknown encoding
    with UNIMPLEMENTED (the gRPC spec), as must the same call from other
    clients; and other clients' calls carrying that header with a valid value
    (a gzip-compressed call, a 5 s timeout, valid base64) must succeed, not
    fail INTERNAL "Error parsing '...' metadata" because of the first one."""
    daemon = hostile_daemon(listener)
    verdict = Verdict(f"1b bad headers on forwarded calls [{listener}]", daemon)
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        for label, (bad, valid) in BAD_HEADERS.items():
            status, text = _health(daemon.endpoint, bad)
            verdict.note(f"{label}: the bad call got {text}")
            verdict.check(f"{label}: the bad call ends with a gRPC status", status is not None)
            if bad[0] == "grpc-encoding":
                verdict.check(
                    f"{label}: the bad call is UNIMPLEMENTED", status == UNIMPLEMENTED, text
                )
                same = [_health(daemon.endpoint, bad) for _ in range(OTHER_CLIENTS)]
                verdict.check(
                    f"{label}: the same call from {OTHER_CLIENTS} other clients is UNIMPLEMENTED",
                    all(s == UNIMPLEMENTED for s, _ in same),
                    str(sorted({t for _, t in same})),
                )
            later = [_health(daemon.endpoint, valid) for _ in range(OTHER_CLIENTS)]
            poisoned = [t for s, t in later if s == INTERNAL and "Error parsing" in t]
            verdict.check(
                f"{label}: {OTHER_CLIENTS} other clients with {valid[0]}: {valid[1]} not "
                "INTERNAL 'Error parsing'",
                not poisoned,
                f"{len(poisoned)}/{OTHER_CLIENTS}: {poisoned[:1]}",
            )
            verdict.check(
                f"{label}: {OTHER_CLIENTS} other clients with {valid[0]}: {valid[1]} are OK",
                all(s == 0 for s, _ in later),
                str(sorted({t for _, t in later})),
            )
        report = good.stop()
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()
