"""What every servicer shares: the tenant of a call and running domain work off the loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf.message import Message

from stratad import tracing
from stratad.domain.sessions import Commit
from stratad.server.auth import (
    DEFAULT_TENANT,
    TENANT_METADATA_KEY,
    authenticated_tenant,
    requested_tenant,
)

if TYPE_CHECKING:
    from stratad.server.resources import Resources

T = TypeVar("T")
M = TypeVar("M", bound=Message)
__all__ = ["DEFAULT_TENANT", "TENANT_METADATA_KEY", "Servicer", "tenant_of"]


def tenant_of(context: grpc.aio.ServicerContext) -> str:
    """The tenant a call acts in: the one its credential settled (auth on, see
    server/auth.py), else the ``x-stratad-tenant`` metadata, else `default`."""
    settled = authenticated_tenant()
    if settled is not None:
        return settled
    return requested_tenant(context.invocation_metadata()) or DEFAULT_TENANT


def answer_admission(context: grpc.aio.ServicerContext) -> Callable[[int], None]:
    """What a handler calls with its answer's size before building a large
    answer: the native front door holds that much of its answer budget for the
    call, or refuses it RESOURCE_EXHAUSTED (FrontContext.reserve_answer).
    Without the front door (grpc.aio) nothing is held."""
    reserve: Callable[[int], None] | None = getattr(context, "reserve_answer", None)
    return reserve if reserve is not None else _admit_any


def _admit_any(size: int) -> None:
    del size


class Servicer:
    def __init__(self, resources: Resources) -> None:
        self.resources = resources
        self.engine = resources.engine

    async def mutate(
        self,
        fn: Callable[..., T],
        tenant: str,
        session: str | Sequence[tuple[str, Any]],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """Run a small journaled mutation on the event loop, then await its group commit.

        `fn` is called as ``fn(tenant, session, *args, commit=..., **kwargs)``;
        `session` is the session's ID (for a SaveStates batch, its (session ID,
        input) pairs). `fn` must take `commit=` (see SessionManager.mutate_live):
        it journals and applies without waiting for the disk, which costs less
        than a hand-off to a worker thread; the committer thread then fsyncs
        once for every mutation that queued up meanwhile. Large or slow work
        uses `run`, and so does a mutation of a session whose lock is held
        across fsyncs (a compaction, a deletion: waiting for it on the loop
        would hold up every other call).
        """
        return await self._mutate(fn, tenant, session, args, kwargs, None)

    async def mutate_and_answer(
        self,
        context: Any,
        respond: Callable[[T], M],
        fn: Callable[..., T],
        tenant: str,
        session: str,
        *args: Any,
        **kwargs: Any,
    ) -> M:
        """`mutate`, then ``respond(result)``: the call's answer. Served by the
        native front door, the answer leaves from the committer thread the
        moment the mutation is durable, without waiting for the event loop to
        resume this call (one thread hand-off less per save); the rest of the
        call (announcing the change to watchers, metrics) follows. With
        synchronous replication nothing is answered early: the answer leaves
        by the ordinary path, once the replica holds the record."""
        answer_early = getattr(context, "answer_early", None)
        answer: M | None = None

        def on_applied(result: T) -> Callable[[], object] | None:
            nonlocal answer
            answer = respond(result)
            if answer_early is None:
                return None
            return functools.partial(answer_early, answer.SerializeToString())

        result = await self._mutate(fn, tenant, session, args, kwargs, on_applied)
        return answer if answer is not None else respond(result)

    async def _mutate(
        self,
        fn: Callable[..., T],
        tenant: str,
        session: str | Sequence[tuple[str, Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        on_applied: Callable[[T], Callable[[], object] | None] | None,
    ) -> T:
        ids = session if isinstance(session, str) else [s for s, _ in session]
        if self.engine.sessions.held_for_io(tenant, ids):
            return await self.run(fn, tenant, session, *args, **kwargs)
        commit: Commit = []
        result = fn(tenant, session, *args, commit=commit, **kwargs)
        on_durable = None
        try:
            if on_applied is not None:
                on_durable = on_applied(result)
        finally:  # applied is applied: made durable and announced even if that raised
            await self._commit(commit, on_durable)
        return result

    async def _commit(self, commit: Commit, on_durable: Callable[[], object] | None) -> None:
        sync_replica = self.engine.replicator is not None and self.engine.replicator.mode == "sync"
        await self.engine.committer.wait(commit, None if sync_replica else on_durable)
        if sync_replica:
            await self.run(self.engine.sessions.replicate, commit)
        self.engine.sessions.announce(commit)

    async def read(
        self, fn: Callable[..., T], tenant: str, session_id: str, *args: Any, **kwargs: Any
    ) -> T:
        """A cheap read of one session: on the event loop (a hand-off to a worker
        thread would cost more than the read), unless the session's lock is
        held across fsyncs (see `mutate`)."""
        if self.engine.sessions.held_for_io(tenant, session_id):
            return await self.run(fn, tenant, session_id, *args, **kwargs)
        return fn(tenant, session_id, *args, **kwargs)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking domain work (file I/O, native code) on the worker pool.

        The event loop must stay free: native work releases the GIL, so both
        cores work while the loop keeps serving other calls.
        """
        fail_stop = self.engine.store.fail_stop
        fail_stop.check()
        loop = asyncio.get_running_loop()
        work = tracing.in_current_context(functools.partial(fn, *args, **kwargs))
        result = await loop.run_in_executor(self.resources.executor, work)
        # A read that raced a failed fsync may hold state the disk lost.
        fail_stop.check()
        return result
