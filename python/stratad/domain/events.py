"""Session events for WatchSession: one per mutation, in version order.

Mutations happen on worker threads; watchers are asyncio tasks. The hub hands
each event to every subscriber's queue through its own event loop
(`call_soon_threadsafe`), so a slow watcher never blocks a writer.

Each queue holds at most `WATCH_QUEUE_EVENTS` events. A watcher whose queue
is full is not reading its stream (gRPC's flow control has stopped it): its
queue is emptied and it gets `LAGGED`, after which the hub gives it nothing
more, so its memory stays bounded. WatchSession then ends that stream with
RESOURCE_EXHAUSTED naming the version to watch again from.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

SessionKey = tuple[str, str]  # (tenant, session_id)
#: Events queued for one watcher before it counts as not reading.
WATCH_QUEUE_EVENTS = 1024


@dataclass(frozen=True)
class SessionEvent:
    version: int
    kind: str
    at: float
    checkpoint_id: str = ""
    status: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


class Lagged:
    """Queued instead of the events of a watcher that fell too far behind."""


LAGGED = Lagged()

#: What a watcher's queue holds: events, LAGGED, or None (the stream is over).
QueueItem = SessionEvent | Lagged | None


@dataclass
class Subscription:
    key: SessionKey
    queue: asyncio.Queue[QueueItem]
    loop: asyncio.AbstractEventLoop
    lagged: bool = False

    def offer(self, event: SessionEvent | None) -> None:
        """Queue `event` (on the subscriber's loop); a full queue means LAGGED."""
        if self.lagged:
            return
        if self.queue.full():
            self.lagged = True
            while not self.queue.empty():  # free what it will never read
                self.queue.get_nowait()
            self.queue.put_nowait(LAGGED)
            return
        self.queue.put_nowait(event)


class EventHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[SessionKey, list[Subscription]] = {}

    def subscribe(self, key: SessionKey) -> Subscription:
        sub = Subscription(key, asyncio.Queue(WATCH_QUEUE_EVENTS), asyncio.get_running_loop())
        with self._lock:
            self._subs.setdefault(key, []).append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.key, [])
            if sub in subs:
                subs.remove(sub)
            if not subs:
                self._subs.pop(sub.key, None)

    def publish(self, key: SessionKey, event: SessionEvent | None) -> None:
        """Deliver `event` to every watcher of `key`; None ends their streams."""
        with self._lock:
            subs = list(self._subs.get(key, ()))
        for sub in subs:
            if not sub.loop.is_closed():
                sub.loop.call_soon_threadsafe(sub.offer, event)
