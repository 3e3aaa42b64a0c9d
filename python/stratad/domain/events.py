"""Session events for WatchSession: one per mutation, in version order.

Mutations happen on worker threads; watchers are asyncio tasks. The hub hands
each event to every subscriber's queue through its own event loop
(`call_soon_threadsafe`), so a slow watcher never blocks a writer.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

SessionKey = tuple[str, str]  # (tenant, session_id)


@dataclass(frozen=True)
class SessionEvent:
    version: int
    kind: str
    at: float
    checkpoint_id: str = ""
    status: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Subscription:
    key: SessionKey
    queue: asyncio.Queue[SessionEvent | None]
    loop: asyncio.AbstractEventLoop


class EventHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[SessionKey, list[Subscription]] = {}

    def subscribe(self, key: SessionKey) -> Subscription:
        sub = Subscription(key, asyncio.Queue(), asyncio.get_running_loop())
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
                sub.loop.call_soon_threadsafe(sub.queue.put_nowait, event)
