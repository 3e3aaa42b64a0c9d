"""How a call runs: on the event loop, or on a worker thread. Decided here only.

Every servicer hands its domain work to the daemon's one `Runner`
(``Servicer.calls``) with the work's *cost class*:

- `CHEAP`: a bounded read or a small journaled mutation. Runs on the event
  loop: a hand-off to a worker thread would cost more than the work.
- `bounded(budget, n)`: work proportional to ``n`` (bytes to hash, decode
  and compress, tokens to render). Runs on the loop while ``n`` is at most
  the budget's limit in `INLINE_BUDGETS`, else on a worker thread. ``n`` may
  be a function of the command's arguments (a domain measure such as
  `Checkpoints.save_work`); the runner calls it with the same arguments.
- `IO`: file I/O, an fsync, native or otherwise unbounded work. Always on a
  worker thread.

Whatever the class, work that would wait for a lock held across fsyncs (a
session being compacted or deleted, a tenant's profile journal being
compacted) runs on a worker thread: the loop never waits for the disk.

The runner also owns what running a call on either side takes: the
fail-stop checks (after a failed fsync nothing is served), the group-commit
wait of mutations journaled on the loop and their early answer from the
committer thread (`mutate_and_answer`), the tracing context of work handed
to a thread, and the loop barrier that compactions and deletions wait for
before taking their lock (`attach`).

Servicers convert protobuf and name the command; they never choose a thread,
take a lock or compare a size (tests/unit/test_servicers_use_runner.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import Message

from stratad import tracing
from stratad.domain.sessions import Commit

if TYPE_CHECKING:
    from stratad.domain.engine import Engine

T = TypeVar("T")
M = TypeVar("M", bound=Message)

#: Is a lock the work would take held across fsyncs right now? (`Runner.session_lock`)
Held = Callable[[], bool]


class Kind(enum.Enum):
    CHEAP = "cheap"
    BOUNDED = "bounded"
    IO = "io"


class Place(enum.Enum):
    LOOP = "loop"
    THREAD = "thread"


@dataclass(frozen=True, slots=True)
class Budget:
    """How much bounded work of one kind runs on the event loop, and why."""

    limit: int
    unit: str
    why: str


#: Bytes a save hashes, decodes or compresses (Checkpoints.save_work; a
#: SaveStates batch counts all its saves: it runs in one loop slice).
SAVE_BYTES = "save_bytes"
#: Bytes of the values of a PutWrites call.
WRITE_BYTES = "write_bytes"
#: The token budget of a BuildContext call.
CONTEXT_TOKENS = "context_tokens"

#: The one table of inline budgets: bounded work up to `limit` runs on the
#: event loop, more on a worker thread.
INLINE_BUDGETS: Mapping[str, Budget] = MappingProxyType(
    {
        SAVE_BYTES: Budget(
            128 << 10,
            "bytes",
            "Below it a save costs the loop less than a hand-off to a worker thread "
            "and back (~100 futex calls per save with a thread per call, commit "
            "65f2170: the group commit on the loop); the reference conversation's "
            "saves (~2 KB of new bytes per step, however large the state: resumed "
            "digest checks) all stay on the loop. Above it hashing, decoding and "
            "compressing would hold up every other call (health checks included) "
            "for milliseconds.",
        ),
        WRITE_BYTES: Budget(
            128 << 10,
            "bytes",
            "The save budget, applied to the values of pending writes: they are "
            "encoded into one journal record on the loop as a save's new chunks "
            "are. Not measured on its own.",
        ),
        CONTEXT_TOKENS: Budget(
            8000,
            "tokens",
            "Rendering is bounded by the budget (4 characters per token); the "
            "default budget (2,000) and the budgets agents ask for render in well "
            "under a hand-off's cost, larger ones may walk long decision and "
            "error logs (commit 527a46d).",
        ),
    }
)


@dataclass(frozen=True, slots=True)
class Cost:
    """A command's cost class (build with `CHEAP`, `IO` or `bounded`)."""

    kind: Kind
    #: For BOUNDED: the key of `INLINE_BUDGETS` that `n` is weighed against.
    budget: str = ""
    #: For BOUNDED: the amount of work, or a function of the command's
    #: arguments returning it (called on the loop: it must be cheap).
    n: int | Callable[..., int] = 0

    def amount(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
        n = self.n
        return n(*args, **kwargs) if callable(n) else n


CHEAP = Cost(Kind.CHEAP)
IO = Cost(Kind.IO)


def bounded(budget: str, n: int | Callable[..., int]) -> Cost:
    """Work proportional to `n`, weighed against ``INLINE_BUDGETS[budget]``."""
    if budget not in INLINE_BUDGETS:
        raise ValueError(f"unknown inline budget {budget!r} (known: {', '.join(INLINE_BUDGETS)})")
    return Cost(Kind.BOUNDED, budget, n)


#: How long a compaction or deletion waits for the event loop to finish the
#: callback it is running before it takes its lock anyway (callbacks take
#: well under a millisecond; this only bounds a loop that is stuck).
LOOP_BARRIER_SECONDS = 1.0


def loop_barrier(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """SessionManager.loop_barrier for the daemon's event loop: returns once
    the loop has run a callback queued now, so whatever callback it was
    running when called has finished (see SessionManager._exclusively)."""

    def wait() -> None:
        with contextlib.suppress(RuntimeError):  # not on a running loop
            if asyncio.get_running_loop() is loop:
                return  # on the loop itself: no other callback is under way
        passed = threading.Event()
        try:
            loop.call_soon_threadsafe(passed.set)
        except RuntimeError:  # the loop is closed: nothing runs on it
            return
        passed.wait(LOOP_BARRIER_SECONDS)

    return wait


def _no_barrier() -> None:
    return None


def _never_held() -> bool:
    return False


class Runner:
    """Runs the domain commands of every call (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        executor: Executor,
        budgets: Mapping[str, Budget] = INLINE_BUDGETS,
    ) -> None:
        self.engine = engine
        self.executor = executor
        self.budgets = budgets
        self._fail_stop = engine.store.fail_stop

    # -- the decision -----------------------------------------------------------------

    def place(self, cost: Cost, *, n: int = 0, held: bool = False) -> Place:
        """Where work of `cost` (amounting to `n`) runs; `held`: a lock it
        would take is held across fsyncs. The only place this is decided."""
        if cost.kind is Kind.IO or held:
            return Place.THREAD
        if cost.kind is Kind.BOUNDED and n > self.budgets[cost.budget].limit:
            return Place.THREAD
        return Place.LOOP

    def _place(
        self, cost: Cost, args: Sequence[Any], kwargs: Mapping[str, Any], held: Held
    ) -> Place:
        if cost.kind is Kind.IO:
            return Place.THREAD
        n = cost.amount(args, kwargs) if cost.kind is Kind.BOUNDED else 0
        return self.place(cost, n=n, held=held())

    # -- what a call's work may wait for ----------------------------------------------

    def session_lock(self, tenant: str, session_ids: str | Sequence[str]) -> Held:
        """The locks of these sessions (held across a compaction's or deletion's fsyncs)."""
        return functools.partial(self.engine.sessions.held_for_io, tenant, session_ids)

    def profile_lock(self, tenant: str) -> Held:
        """The lock of the tenant's profile journal (held across its compaction's fsyncs)."""
        return functools.partial(self.engine.profiles.held_for_io, tenant)

    # -- running ----------------------------------------------------------------------

    async def run(
        self,
        cost: Cost,
        fn: Callable[..., T],
        *args: Any,
        waits_on: Held | None = None,
        **kwargs: Any,
    ) -> T:
        """``fn(*args, **kwargs)`` where `cost` puts it. `waits_on`: a lock it
        takes that may be held across fsyncs (`session_lock`, `profile_lock`)."""
        self._fail_stop.check()
        if self._place(cost, args, kwargs, waits_on or _never_held) is Place.THREAD:
            return await self._on_thread(fn, args, kwargs)
        result = fn(*args, **kwargs)
        # A read that raced a failed fsync may hold state the disk lost.
        self._fail_stop.check()
        return result

    async def read(
        self,
        cost: Cost,
        fn: Callable[..., T],
        tenant: str,
        session_id: str,
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """A read of one session, ``fn(tenant, session_id, *args, **kwargs)``,
        which takes the session's lock."""
        held = self.session_lock(tenant, session_id)
        return await self.run(cost, fn, tenant, session_id, *args, waits_on=held, **kwargs)

    async def mutate(
        self,
        cost: Cost,
        fn: Callable[..., T],
        tenant: str,
        session: str | Sequence[tuple[str, Any]],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """A journaled mutation of sessions: ``fn(tenant, session, *args, **kwargs)``.

        `session` is the session's ID (for a SaveStates batch, its (session ID,
        input) pairs). On the loop, `fn` is called with ``commit=`` (see
        SessionManager.mutate_live): it journals and applies without waiting
        for the disk, and the committer thread then fsyncs once for every
        mutation that queued up meanwhile; the call returns once the mutation
        is durable (and, with ``replication = sync``, replicated), and its
        change is announced to watchers. On a thread, `fn` is called without
        it and makes the mutation durable itself.
        """
        return await self._mutate(cost, fn, tenant, session, args, kwargs, None)

    async def mutate_and_answer(
        self,
        cost: Cost,
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

        result = await self._mutate(cost, fn, tenant, session, args, kwargs, on_applied)
        return answer if answer is not None else respond(result)

    async def _mutate(
        self,
        cost: Cost,
        fn: Callable[..., T],
        tenant: str,
        session: str | Sequence[tuple[str, Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        on_applied: Callable[[T], Callable[[], object] | None] | None,
    ) -> T:
        self._fail_stop.check()
        ids = session if isinstance(session, str) else [s for s, _ in session]
        held = self.session_lock(tenant, ids)
        if self._place(cost, (tenant, session, *args), kwargs, held) is Place.THREAD:
            return await self._on_thread(fn, (tenant, session, *args), kwargs)
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
        engine = self.engine
        sync_replica = engine.replicator is not None and engine.replicator.mode == "sync"
        tickets = [pending.ticket for pending in commit]
        await engine.committer.wait(tickets, None if sync_replica else on_durable)
        if sync_replica:
            await self._on_thread(engine.sessions.replicate, (commit,), {})
        engine.sessions.announce(commit)

    async def _on_thread(
        self, fn: Callable[..., T], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> T:
        """On the worker pool, in the call's tracing context: native work
        releases the GIL, so both cores work while the loop serves other calls."""
        self._fail_stop.check()
        loop = asyncio.get_running_loop()
        work = tracing.in_current_context(functools.partial(fn, *args, **kwargs))
        result = await loop.run_in_executor(self.executor, work)
        # A read that raced a failed fsync may hold state the disk lost.
        self._fail_stop.check()
        return result

    # -- the loop barrier -------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve calls on `loop`: domains that hold a lock across fsyncs wait
        for it to finish the callback it is running before they take their
        lock, so no call it runs is left waiting for the disk (loop_barrier)."""
        barrier = loop_barrier(loop)
        self.engine.sessions.loop_barrier = barrier
        self.engine.profiles.loop_barrier = barrier

    def detach(self) -> None:
        """The loop serves no more calls: nothing to wait for."""
        self.engine.sessions.loop_barrier = _no_barrier
        self.engine.profiles.loop_barrier = _no_barrier


__all__ = [
    "CHEAP",
    "CONTEXT_TOKENS",
    "INLINE_BUDGETS",
    "IO",
    "LOOP_BARRIER_SECONDS",
    "SAVE_BYTES",
    "WRITE_BYTES",
    "Budget",
    "Cost",
    "Held",
    "Kind",
    "Place",
    "Runner",
    "bounded",
    "loop_barrier",
]
