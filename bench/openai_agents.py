"""OpenAI Agents SDK sessions: StratadSession beside SQLiteSession (file).

Two workloads, each run for every session in the same run:

- **steps**: the messages of the growing conversation of docs/design.md (message
  i: role user / assistant, 80 words), added one per step with
  `session.add_items([message_i])`, N steps in one session. A session stores
  items, so the reference state's `step` and `scratch` have no place in it; the
  messages are the state that grows. Reported: bytes on disk after the run, the
  time per step (wall time of the N adds over N), and the time of a
  `get_items()` of the whole conversation at the end (median of 20; for
  StratadSession both from the instance that wrote it, which checks the
  version only, and from a new instance, which loads the list).
- **turns**: `Runner.run(agent, text, session=...)` with a scripted model (the
  SDK's `agents.testing.ScriptedModel`, no network), one user message of the
  workload in and one 80-word reply out per turn: what a chat application does.
  Reported: time per turn (the Runner reads the history and appends twice).

StratadSession talks to a `stratad serve` subprocess (durability fsync, the
default); SQLiteSession writes a database file in this process (Python's
sqlite3 defaults: WAL journal, synchronous FULL, so every commit is fsynced too).
Bytes: StratadSession, the daemon's data directory (journal and packs); SQLiteSession,
the database with its -wal and -shm files after `close()`.

Usage: python bench/openai_agents.py [--quick] [--steps 500,2000] [--turns 200]
(--quick: 100 and 300 steps, 50 turns, no doc update).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# `agents` is imported before bench/ is on the path (nothing there shadows it).
from agents import Agent, Runner, set_tracing_disabled
from agents.memory import Session, SQLiteSession
from agents.testing import ScriptedModel, assistant_message

from stratad import Client
from stratad.integrations.openai_agents import StratadSession

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _workload
from _daemon import daemon
from _report import (
    DOC,
    disk_usage,
    fmt_bytes,
    fmt_time,
    machine_facts,
    markdown_table,
    write_section,
)

HEADING = "## OpenAI Agents SDK sessions (bench/openai_agents.py)"
set_tracing_disabled(True)


@dataclass
class Result:
    session: str
    steps: int
    per_step: float
    stored: int
    read_warm: float
    read_cold: float | None = None
    stored_open: int | None = None  # SQLiteSession: before close(), with its WAL
    note: str = ""


@dataclass
class TurnResult:
    session: str
    turns: int
    per_turn: float


async def add_steps(session: Session, steps: int) -> float:
    messages: list[Any] = [_workload.message(i) for i in range(steps)]
    gc.collect()
    started = time.perf_counter()
    for item in messages:
        await session.add_items([item])
    return (time.perf_counter() - started) / steps


async def read_time(session: Session, steps: int, repeat: int = 20) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        items = await session.get_items()
        times.append(time.perf_counter() - started)
        assert len(items) == steps, len(items)
    return statistics.median(times)


def bench_stratad(steps: int, **options: Any) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        with daemon(data_dir) as address:

            async def run() -> Result:
                with StratadSession("conversation", address, **options) as session:
                    per_step = await add_steps(session, steps)
                    warm = await read_time(session, steps)
                times = []
                for _ in range(20):  # a new instance (a new process) loads the list
                    with StratadSession("conversation", address) as fresh:
                        started = time.perf_counter()
                        assert len(await fresh.get_items()) == steps
                        times.append(time.perf_counter() - started)
                stored, _ = disk_usage(data_dir)
                label = "StratadSession (daemon, fsync)"
                note = ""
                if options:
                    label += " " + ", ".join(f"{k}={v}" for k, v in options.items())
                    with Client(address) as client:
                        freed = client.collect_garbage().bytes_freed
                    note = (f"CollectGarbage then frees {fmt_bytes(freed)} of dropped versions "
                            "(disk space returns when their pack is compacted)")  # fmt: skip
                return Result(label, steps, per_step, stored, warm, statistics.median(times),
                              note=note)  # fmt: skip

            return asyncio.run(run())


def bench_sqlite(steps: int) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "sessions.db"

        async def run() -> Result:
            session = SQLiteSession("conversation", db)
            try:
                per_step = await add_steps(session, steps)
                warm = await read_time(session, steps)
                stored_open, _ = disk_usage(Path(tmp))
            finally:
                session.close()
            stored, _ = disk_usage(Path(tmp))
            note = f"{fmt_bytes(stored_open)} before close(), with its write-ahead log"
            return Result("SQLiteSession (file, in-process)", steps, per_step, stored, warm,
                          stored_open=stored_open, note=note)  # fmt: skip

        return asyncio.run(run())


async def run_turns(session: Session, turns: int) -> float:
    model = ScriptedModel()
    agent = Agent(name="assistant", model=model)
    for i in range(turns):
        reply = _workload.message(2 * i + 1)["content"]
        model.enqueue([assistant_message(reply, item_id=f"msg-{i}")])
    gc.collect()
    started = time.perf_counter()
    for i in range(turns):
        await Runner.run(agent, _workload.message(2 * i)["content"], session=session)
    elapsed = time.perf_counter() - started
    assert len(await session.get_items()) == 2 * turns
    return elapsed / turns


def turns_stratad(turns: int) -> TurnResult:
    with tempfile.TemporaryDirectory() as tmp, daemon(Path(tmp) / "data") as address:

        async def run() -> float:
            with StratadSession("chat", address) as session:
                return await run_turns(session, turns)

        return TurnResult("StratadSession (daemon, fsync)", turns, asyncio.run(run()))


def turns_sqlite(turns: int) -> TurnResult:
    with tempfile.TemporaryDirectory() as tmp:

        async def run() -> float:
            session = SQLiteSession("chat", Path(tmp) / "sessions.db")
            try:
                return await run_turns(session, turns)
            finally:
                session.close()

        return TurnResult("SQLiteSession (file, in-process)", turns, asyncio.run(run()))


def steps_table(results: Sequence[Result]) -> str:
    rows = []
    for r in results:
        sq = next(x for x in results if x.steps == r.steps and x.session.startswith("SQLite"))
        rows.append([
            str(r.steps), r.session, fmt_bytes(r.stored), f"{sq.stored / r.stored:.2f}x",
            fmt_time(r.per_step), f"{sq.per_step / r.per_step:.2f}x",
            fmt_time(r.read_warm), fmt_time(r.read_cold) if r.read_cold is not None else "-",
            r.note,
        ])  # fmt: skip
    headers = ["steps", "session", "bytes on disk", "SQLiteSession bytes / these",
               "time per step (add_items)", "speed vs SQLiteSession",
               "get_items() of all, same instance", "get_items() of all, new instance",
               "note"]  # fmt: skip
    return markdown_table(headers, rows)


def turns_table(results: Sequence[TurnResult]) -> str:
    rows = []
    for r in results:
        sq = next(x for x in results if x.turns == r.turns and x.session.startswith("SQLite"))
        rows.append([str(r.turns), r.session, fmt_time(r.per_turn),
                     f"{sq.per_turn / r.per_turn:.2f}x"])  # fmt: skip
    return markdown_table(["turns", "session", "time per turn", "speed vs SQLiteSession"], rows)


NOTES = """\
How it is stored. SQLiteSession inserts one row per item, so it stores each item
once, uncompressed, with its row and index overhead. StratadSession keeps the
conversation as one state (JSON Lines) and saves it whole at every change, but a
list that grows at its end shares every chunk but the last with the previous
save: the SDK uploads only the new tail (delta-encoded on the chunk it
replaces) and the daemon stores it compressed, with a delta manifest. So both
grow linearly with the conversation; stratad's bytes are compressed ones, and
they include every earlier version of the list (retention `keep_last` bounds
those, see docs/openai-agents.md), where SQLiteSession keeps only the current one.

Where a step's time goes. An add_items is one SaveState (cut, hash, upload of
the new chunks, the daemon's journal fsync), through a second process; an
SQLiteSession insert is a local transaction with its own fsync. A Runner turn
reads the history first: StratadSession answers that from the list it wrote
after one GetSession call that confirms the version, SQLiteSession decodes its
rows. A new process (a new instance) loads the list once."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 and 300 steps; no doc update")
    parser.add_argument("--steps", default="", help="comma-separated step counts")
    parser.add_argument("--turns", type=int, default=0, help="Runner turns (default 200)")
    parser.add_argument("--keep-last", type=int, default=8,
                        help="also run StratadSession with this keep_last (0: not)")  # fmt: skip
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")] if args.steps else []
    steps = steps or ([100, 300] if args.quick else [500, 2000])
    turns = args.turns or (50 if args.quick else 200)

    results: list[Result] = []
    runners: list[Callable[[int], Result]] = [bench_stratad, bench_sqlite]
    if args.keep_last:
        runners.insert(1, lambda n: bench_stratad(n, keep_last=args.keep_last))
    for n in steps:
        for runner in runners:
            results.append(runner(n))
            r = results[-1]
            print(f"  {r.session} @ {n}: {fmt_time(r.per_step)}/step, {fmt_bytes(r.stored)}",
                  flush=True)  # fmt: skip
    turn_results = [turns_stratad(turns), turns_sqlite(turns)]
    for t in turn_results:
        print(f"  {t.session}: {fmt_time(t.per_turn)}/turn over {t.turns} turns", flush=True)

    section = "\n".join([
        HEADING, "",
        f"Command: `python bench/openai_agents.py`. Measured {machine_facts()}.",
        "One session; step i adds message i of the growing conversation",
        "([design.md](design.md#the-reference-workload-a-growing-conversation)) with",
        "`add_items`. Bytes on disk after the run; time per step over the whole run.", "",
        steps_table(results), "",
        f"Runner turns: `Runner.run` with a scripted model (no network), {turns} turns of one",
        "user message and one reply of the same workload, one session.", "",
        turns_table(turn_results), "",
        NOTES, "",
    ])  # fmt: skip
    print(section)
    if not args.quick and not args.steps:
        write_section(HEADING, section)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
