"""Group commit for the event loop: many writers, one fsync per journal per batch.

Small mutations run on the event loop thread (journal append + apply, no I/O
wait); what they still need before they may be acknowledged is an fsync of
their journal. Handing each one to a worker thread costs more CPU in thread
hand-offs than the mutation itself (strace: ~100 futex calls per save with a
thread per call). Instead, one committer thread takes every batch that queued
up while it was syncing the previous one, fsyncs each journal once up to its
furthest offset, and wakes all the waiting coroutines of the batch with one
call into their event loop.

A waiter may also hand over an action to take on the committer thread the
moment its fsync has returned (`wait(..., on_durable=...)`): the native front
door's early answer of a save (server/front.py), which then reaches its
client without waiting for the event loop to wake up and resume the call.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from stratad import tracing
from stratad.store.fsync import sync_filesystem
from stratad.store.journal import FSYNC_OBSERVERS, Journal

log = logging.getLogger(__name__)


class SyncPoint(Protocol):
    """A journal position that must be durable (e.g. domain.sessions.PendingCommit)."""

    @property
    def journal(self) -> Journal: ...

    @property
    def offset(self) -> int: ...


@dataclass
class _Waiter:
    points: Sequence[SyncPoint]
    future: asyncio.Future[None]
    loop: asyncio.AbstractEventLoop
    #: The waiting call's span (tracing on): the batch's fsync span links to it.
    span_context: Any = None
    #: Run on the committer thread once the points are durable (not on failure).
    on_durable: Callable[[], object] | None = None


class GroupCommitter:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[_Waiter] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="stratad-commit", daemon=True)
        self._thread.start()

    async def wait(
        self, points: Sequence[SyncPoint], on_durable: Callable[[], object] | None = None
    ) -> None:
        """Return once every point is durable (raises what the fsync raised).

        `on_durable`, if given, is called on the committer thread as soon as
        the points are durable, before this coroutine is woken up; never if
        the fsync failed, nor when there are no points. It must be quick and
        must not touch the event loop.
        """
        if not points:
            return  # nothing to wait for: the caller answers right away anyway
        # Even a lone writer's fsync goes to the committer thread: on the
        # event loop, one slow fsync (a busy disk: tens of ms) would stall
        # every other call, health checks included.
        loop = asyncio.get_running_loop()
        with tracing.span("stratad.journal.commit", {"stratad.journal.records": len(points)}):
            waiter = _Waiter(
                points, loop.create_future(), loop, tracing.current_span_context(), on_durable
            )
            with self._cond:
                if self._stopped:
                    raise RuntimeError("group committer stopped")
                self._queue.append(waiter)
                self._cond.notify()
            await waiter.future

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if not self._queue and self._stopped:
                    return
                batch, self._queue = self._queue, []
            self._commit(batch)

    def _commit(self, batch: list[_Waiter]) -> None:
        error: BaseException | None = None
        try:
            contexts = [w.span_context for w in batch]
            with tracing.batch_span(
                "stratad.journal.fsync", contexts, {"stratad.batch.calls": len(batch)}
            ):
                sync_all(p for w in batch for p in w.points)
        except BaseException as exc:  # handed to every waiter of the batch
            error = exc
        else:
            _run_on_durable(batch)
        by_loop: dict[asyncio.AbstractEventLoop, list[_Waiter]] = {}
        for waiter in batch:
            by_loop.setdefault(waiter.loop, []).append(waiter)
        for loop, waiters in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve(waiters, error))

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=10)


#: From this many journals in one batch, one syncfs(2) is cheaper than an
#: fdatasync each (measured here: ~0.25 ms per fdatasync, 1-2 ms per syncfs).
SYNCFS_MIN_JOURNALS = 6


def sync_all(points: Iterable[SyncPoint]) -> None:
    """fsync each journal once, up to the furthest offset asked of it."""
    furthest: dict[int, SyncPoint] = {}
    for point in points:
        if not point.journal.needs_sync(point.offset):
            continue
        known = furthest.get(id(point.journal))
        if known is None or known.offset < point.offset:
            furthest[id(point.journal)] = point
    syncfs = len(furthest) >= SYNCFS_MIN_JOURNALS
    tracing.annotate({"stratad.batch.journals": len(furthest), "stratad.batch.syncfs": syncfs})
    if syncfs:
        # Everything appended before the call is covered, so note each
        # journal's size first (appends may race with the syncfs).
        sizes = [(p.journal, p.journal.size) for p in furthest.values()]
        started = time.perf_counter()
        first = sizes[0][0]
        try:
            synced = sync_filesystem(first.path.parent)
        except OSError as exc:
            raise first.fail_stop.trip(f"syncfs of {first.path.parent}", exc) from exc
        if synced:
            elapsed = time.perf_counter() - started
            for journal, size in sizes:
                journal.mark_synced(size)
                for observe in FSYNC_OBSERVERS:
                    observe(journal.path, elapsed)
            return
    for point in furthest.values():
        point.journal.sync(point.offset)


def _run_on_durable(batch: list[_Waiter]) -> None:
    for waiter in batch:
        if waiter.on_durable is None:
            continue
        try:
            waiter.on_durable()
        except Exception:  # the waiter is still woken up and answers as usual
            log.exception("an action on a durable commit failed")


def _resolve(waiters: list[_Waiter], error: BaseException | None) -> Callable[[], None]:
    def resolve() -> None:
        for waiter in waiters:
            if waiter.future.done():
                continue
            if error is None:
                waiter.future.set_result(None)
            else:
                waiter.future.set_exception(error)

    return resolve
