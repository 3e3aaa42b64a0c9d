"""Case 4: memory and work spent on answers the client never reads.

a. A client with a zero receive window asks for a 4 MiB state `LOADS` times:
   the answers cannot be sent, and must not all be held in memory: RSS stays
   within the idle daemon + max_inflight_bytes + RSS_SLACK (harness.py).
b. A SaveStates client that sends many requests and never reads the answers
   must be stopped by backpressure: after at most `MAX_UNREAD_SAVES` answers
   it has not read, the daemon stops reading (and saving) its requests.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from h2attack import LOAD_STATE, SAVE_STATES, H2Client, close_all, grpc_frame
from harness import MIB, GoodClient, Sampler, Verdict

from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc, session_pb2, session_pb2_grpc

STATE_BYTES = 4 * MIB
LOADS = 600
#: Streams per attacking connection (within every server's concurrent-stream limit).
STREAMS_PER_CONNECTION = 100
HOLD_SECONDS = 4.0
#: 4b: requests the attacker tries to send, and for how long at most.
SAVE_REQUESTS = 3000
SEND_SECONDS = 5.0
#: 4b: the most saves a client may get done without reading their answers: what
#: fits the client's receive window (64 KiB for these clients) plus the front
#: door's own 64 KiB of unread answers per stream (rust/stratad-front/src/
#: answers.rs), ~90 bytes each, plus its read-ahead of 16 requests. Measured:
#: 688-835. Beyond that it is not backpressure (an unbounded daemon did 3,000).
MAX_UNREAD_SAVES = 1600


def _create(daemon: Any, session_id: str, data: bytes | None = None) -> None:
    channel = daemon.endpoint.channel()
    try:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        sessions.CreateSession(session_pb2.CreateSessionRequest(session_id=session_id), timeout=10)
        if data is not None:
            checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
            request = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=data)
            checkpoints.SaveState(request, timeout=30)
    finally:
        channel.close()


def _version(daemon: Any, session_id: str) -> int:
    channel = daemon.endpoint.channel()
    try:
        sessions = session_pb2_grpc.SessionServiceStub(channel)
        request = session_pb2.GetSessionRequest(session_id=session_id)
        return int(sessions.GetSession(request, timeout=10).session.version)
    finally:
        channel.close()


def test_unread_load_state_answers_stay_within_the_memory_bound(
    hostile_daemon: Any, listener: str
) -> None:
    daemon = hostile_daemon(listener)
    verdict = Verdict(f"4a {LOADS} unread LoadState answers of 4 MiB [{listener}]", daemon)
    _create(daemon, "big", os.urandom(STATE_BYTES))
    request = grpc_frame(checkpoint_pb2.LoadStateRequest(session_id="big").SerializeToString())
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        clients: list[H2Client] = []
        calls = []
        for n in range(LOADS):
            if n % STREAMS_PER_CONNECTION == 0:
                clients.append(H2Client(daemon.endpoint, window=0, read=False))
            calls.append(
                (clients[-1], clients[-1].request(LOAD_STATE, body=request, end_stream=True))
            )
        time.sleep(HOLD_SECONDS)
        outcomes = Counter(
            c.streams[s].describe()
            if c.streams[s].done
            else ("headers, answer unread" if c.streams[s].headers else "no answer")
            for c, s in calls
        )
        report = good.stop()
        close_all(clients)
    verdict.note(f"{LOADS} LoadState calls on {len(clients)} connections: {dict(outcomes)}")
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()


def test_a_save_states_client_that_never_reads_is_stopped(
    hostile_daemon: Any, listener: str
) -> None:
    daemon = hostile_daemon(listener)
    verdict = Verdict(f"4b SaveStates answers never read [{listener}]", daemon)
    _create(daemon, "unread")
    before = _version(daemon, "unread")
    item = checkpoint_pb2.SaveStatesRequest(
        request=checkpoint_pb2.SaveStateRequest(session_id="unread", data=b"y" * 64)
    )
    batch = grpc_frame(item.SerializeToString()) * 50
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        attacker = H2Client(daemon.endpoint, window=0, read=False)
        stream_id = attacker.request(SAVE_STATES)
        sent = 0
        start = time.monotonic()
        while sent < SAVE_REQUESTS and time.monotonic() - start < SEND_SECONDS:
            if not attacker.send(stream_id, batch, timeout=0.5):
                break
            sent += 50
        time.sleep(2.0)  # whatever the daemon took, it has saved by now
        saves = _version(daemon, "unread") - before
        state = attacker.streams[stream_id].describe()
        report = good.stop()
        attacker.close()
    verdict.note(f"attacker: {sent} requests taken by the transport, stream: {state}")
    verdict.note(f"saves done without the answers being read: {saves}")
    verdict.check(
        f"backpressure: at most {MAX_UNREAD_SAVES} saves with unread answers",
        saves <= MAX_UNREAD_SAVES,
        f"{saves} saves done",
    )
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()
