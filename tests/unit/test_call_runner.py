"""The call runner's decisions (server/runner.py): where each cost class runs.

Each command here reports where it ran: on the event loop (the thread
running the test's loop) or on a worker thread. A real engine over a
temporary data directory stands behind the runner, so journaled mutations
really go through the group committer.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from stratad.api.v1 import checkpoint_pb2
from stratad.domain.checkpoints import SaveInput, SaveResult
from stratad.domain.engine import Engine
from stratad.server.runner import (
    CHEAP,
    CONTEXT_TOKENS,
    INLINE_BUDGETS,
    IO,
    SAVE_BYTES,
    WRITE_BYTES,
    Budget,
    Place,
    Runner,
    bounded,
)
from stratad.store.failstop import StorageFailedError

LIMIT = INLINE_BUDGETS[SAVE_BYTES].limit


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path / "data")
    engine.open()
    engine.sessions.create("default", "s")
    yield engine
    engine.close()


@pytest.fixture
def runner(engine: Engine) -> Iterator[Runner]:
    executor = ThreadPoolExecutor(2, thread_name_prefix="test-worker")
    yield Runner(engine, executor)
    executor.shutdown(wait=True)


def where() -> str:
    """Where the caller runs: "loop" (on the running event loop) or "thread"."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return "thread"
    return "loop"


def where_with(*args: Any, **kwargs: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return where(), args, kwargs


def hold_session(engine: Engine, session_id: str = "s") -> None:
    """Mark the session as about to be held across fsyncs (SessionManager._exclusively)."""
    engine.sessions.live("default", session_id).log.held_for_io = True


# -- the decision ------------------------------------------------------------------------


def test_the_table_keeps_the_measured_values_and_says_why(runner: Runner) -> None:
    assert INLINE_BUDGETS[SAVE_BYTES].limit == 128 << 10
    assert INLINE_BUDGETS[WRITE_BYTES].limit == 128 << 10
    assert INLINE_BUDGETS[CONTEXT_TOKENS].limit == 8000
    assert all(budget.why and budget.unit for budget in INLINE_BUDGETS.values())


def test_place_is_the_one_decision(runner: Runner) -> None:
    assert runner.place(CHEAP) is Place.LOOP
    assert runner.place(IO) is Place.THREAD
    assert runner.place(bounded(SAVE_BYTES, 0), n=LIMIT) is Place.LOOP
    assert runner.place(bounded(SAVE_BYTES, 0), n=LIMIT + 1) is Place.THREAD
    assert runner.place(CHEAP, held=True) is Place.THREAD
    assert runner.place(bounded(SAVE_BYTES, 0), n=1, held=True) is Place.THREAD


def test_an_unknown_budget_is_refused_when_declared() -> None:
    with pytest.raises(ValueError, match="unknown inline budget"):
        bounded("lines", 3)


def test_budgets_are_the_runners_own(engine: Engine) -> None:
    """A runner given other budgets (say, a faster machine) decides by them."""
    tight = {**INLINE_BUDGETS, SAVE_BYTES: Budget(10, "bytes", "a tiny machine")}
    runner = Runner(engine, ThreadPoolExecutor(1), tight)
    assert runner.place(bounded(SAVE_BYTES, 0), n=10) is Place.LOOP
    assert runner.place(bounded(SAVE_BYTES, 0), n=11) is Place.THREAD


# -- running -----------------------------------------------------------------------------


def test_cheap_runs_on_the_loop(runner: Runner) -> None:
    assert asyncio.run(runner.run(CHEAP, where)) == "loop"


def test_io_always_runs_on_a_thread(runner: Runner) -> None:
    assert asyncio.run(runner.run(IO, where)) == "thread"


def test_bounded_runs_on_the_loop_within_its_budget_and_on_a_thread_over_it(
    runner: Runner,
) -> None:
    assert asyncio.run(runner.run(bounded(SAVE_BYTES, LIMIT), where)) == "loop"
    assert asyncio.run(runner.run(bounded(SAVE_BYTES, LIMIT + 1), where)) == "thread"
    tokens = INLINE_BUDGETS[CONTEXT_TOKENS].limit
    assert asyncio.run(runner.run(bounded(CONTEXT_TOKENS, tokens + 1), where)) == "thread"


def test_a_bounded_measure_is_called_with_the_commands_arguments(runner: Runner) -> None:
    seen: list[tuple[Any, ...]] = []

    def measure(*args: Any, **kwargs: Any) -> int:
        seen.append((args, kwargs))
        return len(args[0])

    cost = bounded(SAVE_BYTES, measure)
    ran, args, kwargs = asyncio.run(runner.run(cost, where_with, b"x" * LIMIT, key="k"))
    assert (ran, args, kwargs) == ("loop", (b"x" * LIMIT,), {"key": "k"})
    ran, _, _ = asyncio.run(runner.run(cost, where_with, b"x" * (LIMIT + 1), key="k"))
    assert ran == "thread"
    assert seen == [((b"x" * LIMIT,), {"key": "k"}), ((b"x" * (LIMIT + 1),), {"key": "k"})]


def test_a_read_of_a_held_session_runs_on_a_thread(runner: Runner, engine: Engine) -> None:
    def read(tenant: str, session_id: str) -> str:
        return where()

    assert asyncio.run(runner.read(CHEAP, read, "default", "s")) == "loop"
    hold_session(engine)
    assert asyncio.run(runner.read(CHEAP, read, "default", "s")) == "thread"
    # Another session is not held: its reads stay on the loop.
    engine.sessions.create("default", "other")
    assert asyncio.run(runner.read(CHEAP, read, "default", "other")) == "loop"


def test_a_read_of_a_held_profile_journal_runs_on_a_thread(runner: Runner, engine: Engine) -> None:
    engine.profiles.update("default", "u", {"goals": ["ship"]})
    lock = runner.profile_lock("default")
    assert asyncio.run(runner.run(CHEAP, where, waits_on=lock)) == "loop"
    engine.profiles._tenants["default"].held_for_io = True
    assert asyncio.run(runner.run(CHEAP, where, waits_on=lock)) == "thread"


# -- journaled mutations -----------------------------------------------------------------


class Recorder:
    """Wraps Checkpoints.save_state: where it ran and whether it was given a commit."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.calls: list[tuple[str, bool]] = []

    def save_state(self, tenant: str, session_id: str, inp: SaveInput, **kw: Any) -> SaveResult:
        self.calls.append((where(), "commit" in kw))
        return self.engine.checkpoints.save_state(tenant, session_id, inp, **kw)


def test_a_cheap_mutation_journals_on_the_loop_and_returns_once_durable(
    runner: Runner, engine: Engine
) -> None:
    recorder = Recorder(engine)
    waits: list[int] = []
    real_wait = engine.committer.wait

    async def wait(points: Any, on_durable: Any = None) -> None:
        waits.append(len(points))
        await real_wait(points, on_durable)

    engine.committer.wait = wait  # type: ignore[method-assign]
    result = asyncio.run(
        runner.mutate(CHEAP, recorder.save_state, "default", "s", SaveInput(data=b"step"))
    )
    assert recorder.calls == [("loop", True)]
    assert waits == [1]  # the group committer made it durable
    assert engine.sessions.info("default", "s").head == result.checkpoint.checkpoint_id


def test_a_mutation_over_its_budget_runs_on_a_thread_and_commits_itself(
    runner: Runner, engine: Engine
) -> None:
    recorder = Recorder(engine)
    data = b"y" * (LIMIT + 1)
    cost = bounded(SAVE_BYTES, engine.checkpoints.save_work)
    result = asyncio.run(runner.mutate(cost, recorder.save_state, "default", "s", SaveInput(data)))
    assert recorder.calls == [("thread", False)]
    assert result.checkpoint.size == len(data)


def test_a_mutation_of_a_held_session_runs_on_a_thread(runner: Runner, engine: Engine) -> None:
    recorder = Recorder(engine)
    hold_session(engine)
    asyncio.run(runner.mutate(CHEAP, recorder.save_state, "default", "s", SaveInput(b"z")))
    assert recorder.calls == [("thread", False)]


def test_a_batch_of_sessions_runs_on_a_thread_when_any_is_held(
    runner: Runner, engine: Engine
) -> None:
    engine.sessions.create("default", "t")
    hold_session(engine, "t")
    ran: list[str] = []

    def save_many(tenant: str, items: list[tuple[str, SaveInput]], **kw: Any) -> list[Any]:
        ran.append(where())
        return engine.checkpoints.save_many(tenant, items, **kw)

    items = [("s", SaveInput(b"1")), ("t", SaveInput(b"2"))]
    asyncio.run(runner.mutate(CHEAP, save_many, "default", items))
    assert ran == ["thread"]


class EarlyContext:
    """Stands in for the native front door's FrontContext: answer_early."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, bytes]] = []

    def answer_early(self, response: bytes) -> None:
        self.answers.append((threading.current_thread().name, response))


def respond(result: SaveResult) -> checkpoint_pb2.SaveStateResponse:
    return checkpoint_pb2.SaveStateResponse(
        checkpoint_id=result.checkpoint.checkpoint_id, version=result.version
    )


def test_mutate_and_answer_answers_from_the_committer_thread(
    runner: Runner, engine: Engine
) -> None:
    context = EarlyContext()
    save = engine.checkpoints.save_state
    cost = bounded(SAVE_BYTES, engine.checkpoints.save_work)
    answer = asyncio.run(
        runner.mutate_and_answer(cost, context, respond, save, "default", "s", SaveInput(b"a"))
    )
    assert context.answers == [("stratad-commit", answer.SerializeToString())]


def test_a_mutation_run_on_a_thread_is_answered_by_the_call_not_early(
    runner: Runner, engine: Engine
) -> None:
    context = EarlyContext()
    save = engine.checkpoints.save_state
    cost = bounded(SAVE_BYTES, engine.checkpoints.save_work)
    data = SaveInput(b"b" * (LIMIT + 1))
    answer = asyncio.run(
        runner.mutate_and_answer(cost, context, respond, save, "default", "s", data)
    )
    assert context.answers == []
    assert answer.checkpoint_id == engine.sessions.info("default", "s").head


# -- fail-stop ---------------------------------------------------------------------------


def test_nothing_runs_after_storage_failed(runner: Runner, engine: Engine) -> None:
    engine.store.fail_stop.trip("test", OSError(errno.EIO, "injected"))
    ran: list[str] = []

    def record() -> None:
        ran.append(where())

    for cost in (CHEAP, IO, bounded(SAVE_BYTES, 1)):
        with pytest.raises(StorageFailedError):
            asyncio.run(runner.run(cost, record))
    with pytest.raises(StorageFailedError):
        asyncio.run(runner.mutate(CHEAP, lambda *a, **k: record(), "default", "s"))
    assert ran == []


# -- the loop barrier --------------------------------------------------------------------


def test_attach_makes_compactions_wait_for_the_loop_and_detach_undoes_it(
    runner: Runner, engine: Engine
) -> None:
    async def barrier_from_a_thread() -> bool:
        loop = asyncio.get_running_loop()
        runner.attach(loop)
        passed = threading.Event()

        def compaction() -> None:
            engine.sessions.loop_barrier()  # returns once the loop ran a callback
            passed.set()

        thread = threading.Thread(target=compaction)
        thread.start()
        await asyncio.sleep(0)  # let the loop run the barrier's callback
        await loop.run_in_executor(None, thread.join, 5)
        return passed.is_set()

    assert asyncio.run(barrier_from_a_thread())
    assert engine.profiles.loop_barrier is engine.sessions.loop_barrier
    runner.detach()
    engine.sessions.loop_barrier()  # no loop: returns at once
    assert engine.profiles.loop_barrier is engine.sessions.loop_barrier
