"""The WatchSession event hub: a subscriber's queue is bounded."""

from __future__ import annotations

import asyncio

import pytest

from stratad.domain import events
from stratad.domain.events import LAGGED, EventHub, SessionEvent

KEY = ("default", "s")


def event(version: int) -> SessionEvent:
    return SessionEvent(version, "save", 0.0)


def test_a_full_queue_is_replaced_by_lagged_and_takes_nothing_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events, "WATCH_QUEUE_EVENTS", 3)

    async def run() -> list[object]:
        hub = EventHub()
        sub = hub.subscribe(KEY)
        for v in range(1, 4):
            hub.publish(KEY, event(v))
        await asyncio.sleep(0)  # deliveries run on the subscriber's loop
        assert sub.queue.qsize() == 3 and not sub.lagged
        for v in range(4, 10):
            hub.publish(KEY, event(v))
        hub.publish(KEY, None)
        await asyncio.sleep(0)
        assert sub.lagged
        return [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]

    assert asyncio.run(run()) == [LAGGED]


def test_a_watcher_that_keeps_up_gets_every_event_and_the_end() -> None:
    async def run() -> list[object]:
        hub = EventHub()
        sub = hub.subscribe(KEY)
        received: list[object] = []
        for v in range(1, 3 * events.WATCH_QUEUE_EVENTS):
            hub.publish(KEY, event(v))
            await asyncio.sleep(0)
            received.append(await sub.queue.get())
        hub.publish(KEY, None)
        received.append(await sub.queue.get())
        return received

    received = asyncio.run(run())
    assert received[-1] is None
    assert [e.version for e in received[:-1]] == list(range(1, 3 * events.WATCH_QUEUE_EVENTS))  # type: ignore[union-attr]
