"""Case 6: legitimate load must not trip the protections against floods.

a. While the daemon is busy (two clients saving 64 KiB states flat out), one
   client makes `SHORT_CALLS` SaveState calls with a 1 ms deadline, in bursts
   of `SHORT_BURST` (its grpcio resets each stream whose deadline passes), on
   a connection that also
   carries a SaveStates stream and a WatchSession stream. The connection must
   not be cut (GOAWAY ENHANCE_YOUR_CALM "too_many_resets" would end both long
   streams): each short call ends OK or DEADLINE_EXCEEDED, and the long
   streams still answer afterwards.
b. `CONCURRENT_STREAMS` SaveStates streams at once on one connection (a
   grpc.aio client): every one gets its answer within `STREAM_DEADLINE`, none
   waits for a slot of HTTP/2's concurrent-stream limit until its deadline.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
from h2attack import Endpoint
from harness import GoodClient, Sampler, Verdict

from stratad.api.v1 import checkpoint_pb2, checkpoint_pb2_grpc, session_pb2, session_pb2_grpc

SHORT_CALLS = 400
SHORT_DEADLINE = 0.001
#: The short calls go out in bursts of this many at once, as an agent fanning out would.
SHORT_BURST = 50
BUSY_CLIENTS = 2
CONCURRENT_STREAMS = 220
STREAM_DEADLINE = 5.0


def _busy(endpoint: Endpoint, session_id: str, stop: threading.Event, errors: list[str]) -> None:
    """Save 64 KiB states back to back until ``stop``: the load a busy daemon has."""
    channel = endpoint.channel()
    stub = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
    try:
        while not stop.is_set():
            request = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=os.urandom(65536))
            try:
                stub.SaveState(request, timeout=5.0)
            except grpc.RpcError as exc:
                errors.append(f"busy save: {exc.code().name}")
    finally:
        channel.close()


class _Stream:
    """A long-lived SaveStates stream: `save` sends one request and waits for its answer."""

    def __init__(self, stub: Any, session_id: str) -> None:
        self.session_id = session_id
        self._requests: queue.Queue[Any] = queue.Queue()
        self.answers: queue.Queue[Any] = queue.Queue()
        self._call = stub.SaveStates(self._iterate())
        threading.Thread(target=self._read, daemon=True).start()

    def _iterate(self) -> Iterator[Any]:
        while (item := self._requests.get()) is not None:
            yield item

    def _read(self) -> None:
        try:
            for answer in self._call:
                self.answers.put(answer)
        except grpc.RpcError as exc:
            self.answers.put(exc)

    def save(self, data: bytes, timeout: float) -> str | None:
        """None if the save was answered in time, else what happened."""
        request = checkpoint_pb2.SaveStateRequest(session_id=self.session_id, data=data)
        self._requests.put(checkpoint_pb2.SaveStatesRequest(request=request))
        try:
            answer = self.answers.get(timeout=timeout)
        except queue.Empty:
            return f"no answer within {timeout}s"
        if isinstance(answer, grpc.RpcError):
            return f"stream ended: {answer.code().name} {answer.details()!r}"
        return None if answer.HasField("response") else f"item error {answer.error}"

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


class _Watch:
    """A WatchSession stream whose events (or end) are queued as they come."""

    def __init__(self, stub: Any, session_id: str) -> None:
        self.events: queue.Queue[Any] = queue.Queue()
        self._call = stub.WatchSession(session_pb2.WatchSessionRequest(session_id=session_id))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for event in self._call:
                self.events.put(event)
        except grpc.RpcError as exc:
            self.events.put(exc)

    def next_save(self, timeout: float) -> str | None:
        """None once a save event arrives in time, else what happened."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                break
            if isinstance(event, grpc.RpcError):
                return f"watch ended: {event.code().name} {event.details()!r}"
            if event.event.kind == "save":
                return None
        return f"no save event within {timeout}s"

    def close(self) -> None:
        self._call.cancel()


def _create(channel: grpc.Channel, session_id: str) -> None:
    sessions = session_pb2_grpc.SessionServiceStub(channel)
    sessions.CreateSession(session_pb2.CreateSessionRequest(session_id=session_id), timeout=10)


def test_short_deadlines_do_not_get_a_connection_cut(hostile_daemon: Any, listener: str) -> None:
    daemon = hostile_daemon(listener)
    verdict = Verdict(f"6a {SHORT_CALLS} calls with a 1 ms deadline [{listener}]", daemon)
    channel = daemon.endpoint.channel()
    for name in ("busy", "short", "long"):
        _create(channel, name)
    checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
    sessions = session_pb2_grpc.SessionServiceStub(channel)
    stream = _Stream(checkpoints, "long")
    watch = _Watch(sessions, "long")
    stop = threading.Event()
    busy_errors: list[str] = []
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        busy = [
            threading.Thread(target=_busy, args=(daemon.endpoint, "busy", stop, busy_errors))
            for _ in range(BUSY_CLIENTS)
        ]
        for thread in busy:
            thread.start()
        first = stream.save(b"first", timeout=5.0)
        verdict.check("the long SaveStates stream answers before", first is None, first or "")
        seen = watch.next_save(5.0)
        verdict.check("the watch sees that save", seen is None, seen or "")
        codes: Counter[str] = Counter()
        request = checkpoint_pb2.SaveStateRequest(session_id="short", data=b"s" * 512)
        for _ in range(SHORT_CALLS // SHORT_BURST):
            calls = [
                checkpoints.SaveState.future(request, timeout=SHORT_DEADLINE)
                for _ in range(SHORT_BURST)
            ]
            for call in calls:
                code = call.code()
                codes[code.name if code is not None else "?"] += 1
        after = stream.save(b"after", timeout=5.0)
        watched = watch.next_save(5.0)
        time.sleep(1.0)  # the good client and the busy ones go on a moment
        stop.set()
        for thread in busy:
            thread.join(timeout=10)
        report = good.stop()
    stream.close()
    watch.close()
    channel.close()
    verdict.note(f"{SHORT_CALLS} calls with a 1 ms deadline: {dict(codes)}")
    verdict.note(f"busy clients: {len(busy_errors)} errors {sorted(set(busy_errors))[:3]}")
    wrong = {code: n for code, n in codes.items() if code not in ("OK", "DEADLINE_EXCEEDED")}
    verdict.check("short calls end OK or DEADLINE_EXCEEDED only", not wrong, str(wrong))
    verdict.check("the long SaveStates stream still answers", after is None, after or "")
    verdict.check("the watch stream still delivers", watched is None, watched or "")
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()


async def _concurrent_streams(endpoint: Endpoint, session_id: str) -> tuple[int, Counter[str]]:
    """Open CONCURRENT_STREAMS SaveStates streams on one grpc.aio channel, one save
    each, all kept open until every one is answered or STREAM_DEADLINE passes."""
    channel = endpoint.aio_channel()
    stub = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
    calls = [stub.SaveStates(timeout=STREAM_DEADLINE) for _ in range(CONCURRENT_STREAMS)]
    outcomes: Counter[str] = Counter()

    async def one(call: Any, n: int) -> None:
        request = checkpoint_pb2.SaveStateRequest(session_id=session_id, data=b"%d" % n)
        await call.write(checkpoint_pb2.SaveStatesRequest(request=request))
        answer = await call.read()
        outcomes["answered" if answer is not grpc.aio.EOF else "EOF"] += 1

    tasks = [asyncio.ensure_future(one(call, n)) for n, call in enumerate(calls)]
    done, pending = await asyncio.wait(tasks, timeout=STREAM_DEADLINE + 1.0)
    for task in done:
        if task.exception() is not None:
            exc = task.exception()
            code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else repr(exc)
            outcomes[code] += 1
    outcomes["still waiting"] += len(pending)
    for call in calls:
        call.cancel()
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await channel.close()
    return outcomes["answered"], outcomes


def test_220_concurrent_streams_on_one_connection_are_all_served(
    hostile_daemon: Any, listener: str
) -> None:
    daemon = hostile_daemon(listener)
    verdict = Verdict(f"6b {CONCURRENT_STREAMS} streams on one connection [{listener}]", daemon)
    channel = daemon.endpoint.channel()
    _create(channel, "many")
    channel.close()
    with Sampler(daemon) as sampler:
        good = GoodClient(daemon.endpoint).start()
        start = time.monotonic()
        answered, outcomes = asyncio.run(_concurrent_streams(daemon.endpoint, "many"))
        took = time.monotonic() - start
        report = good.stop()
    verdict.note(f"{CONCURRENT_STREAMS} streams: {dict(outcomes)} in {took:.1f}s")
    verdict.check(
        f"all {CONCURRENT_STREAMS} streams answered within {STREAM_DEADLINE}s",
        answered == CONCURRENT_STREAMS,
        f"{answered} answered",
    )
    verdict.good_client(report)
    verdict.rss(sampler)
    verdict.finish()
