"""ADK session services: StratadSessionService beside DatabaseSessionService on SQLite.

The growing conversation of docs/design.md in ADK's shape: step i appends one
`Event` to one session: message i of the reference workload as its content
(author "user" and role "user" when i is even, the agent and role "model" when
odd; 80 words) and the state delta {"step": i, "scratch": {"tool": "search",
"n": i}}. The conversation's `messages` are the session's events (ADK keeps
them there, not in the state), so after step i the session holds events 0..i
and the state {"step": i, "scratch": ...}: the reference state, in the form an
ADK agent stores it. Every service runs the same steps in the same run:

- StratadSessionService: a `stratad serve` subprocess (durability fsync);
- DatabaseSessionService on SQLite (`sqlite+aiosqlite:///<file>`): ADK's
  persistent service, SQLAlchemy over aiosqlite, in this process (SQLite's
  default synchronous=FULL: each commit is on disk);
- SqliteSessionService: ADK's lighter SQLite service (aiosqlite, no
  SQLAlchemy), in this process;
- InMemorySessionService: this process's memory, nothing stored (a floor for
  the time per step).

Reported: bytes on disk after the run (the files the service left: the
daemon's data directory, the database file and its journal), the time of an
`append_event` (mean and 99th percentile over the steps), and the time a new
process pays to resume: a fresh service instance's first `get_session` of the
whole session (connecting included). Each service runs three times at each
size, interleaved; the run with the median time per step is shown.

Usage: python bench/adk.py [--quick] [--steps 500,2000] [--runs 3]
(--quick: 100 and 300 steps, one run, no doc update). DatabaseSessionService
needs `pip install "sqlalchemy[asyncio]>=2"` (ADK's `db` extra); without it its
rows say so.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.adk.sessions.base_session_service import BaseSessionService  # noqa: E402
from google.adk.sessions.in_memory_session_service import InMemorySessionService  # noqa: E402
from google.adk.sessions.sqlite_session_service import SqliteSessionService  # noqa: E402
from google.genai import types  # noqa: E402

from stratad.integrations.adk import StratadSessionService  # noqa: E402
from stratad.sdk.client import Client  # noqa: E402

sys.path.insert(0, str(_HERE))

import _workload  # noqa: E402
from _daemon import daemon  # noqa: E402
from _report import (  # noqa: E402
    DOC,
    disk_usage,
    fmt_bytes,
    machine_facts,
    markdown_table,
    percentile,
    write_section,
)

HEADING = "## ADK session services (bench/adk.py)"
APP, USER, SESSION = "bench", "user", "conversation"
STRATAD = "StratadSessionService (daemon, fsync)"
DATABASE = "DatabaseSessionService (SQLite file)"
SQLITE = "SqliteSessionService (SQLite file)"
MEMORY = "InMemorySessionService (not persistent)"


def step_event(i: int) -> Event:
    message = _workload.message(i)
    user = message["role"] == "user"
    return Event(
        invocation_id=f"inv-{i // 2}",
        author="user" if user else "assistant",
        content=types.Content(
            role="user" if user else "model", parts=[types.Part(text=message["content"])]
        ),
        actions=EventActions(state_delta={"step": i, "scratch": {"tool": "search", "n": i}}),
    )


@dataclass
class Result:
    service: str
    steps: int
    per_step: list[float] = field(default_factory=list)
    stored: int | None = None
    resume: float | None = None
    note: str = ""

    @property
    def mean(self) -> float:
        return statistics.fmean(self.per_step) if self.per_step else float("nan")


async def drive(service: BaseSessionService, steps: int, result: Result) -> None:
    """Create the session and append the steps, timing each append."""
    session = await service.create_session(app_name=APP, user_id=USER, session_id=SESSION)
    events = [step_event(i) for i in range(steps)]  # built outside the timed part
    gc.collect()
    for event in events:
        started = time.perf_counter()
        await service.append_event(session, event)
        result.per_step.append(time.perf_counter() - started)


async def resume(service: BaseSessionService, steps: int) -> float:
    """A fresh instance's first get_session of the whole session (what a new process pays)."""
    started = time.perf_counter()
    session = await service.get_session(app_name=APP, user_id=USER, session_id=SESSION)
    elapsed = time.perf_counter() - started
    assert session is not None and len(session.events) == steps, "events lost"
    assert session.state["step"] == steps - 1, session.state
    assert session.events[-1].content is not None
    assert session.events[-1].content.parts[0].text == _workload.message(steps - 1)["content"]  # type: ignore[index]
    return elapsed


def bench_stratad(steps: int, keep_last: int = 0) -> Result:
    name = STRATAD if not keep_last else f"{STRATAD} keep_last={keep_last}"
    result = Result(name, steps)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        with daemon(data_dir, "--metrics-listen", "off") as address:

            async def main() -> None:
                async with StratadSessionService(address, keep_last=keep_last) as service:
                    await drive(service, steps, result)
                async with StratadSessionService(address) as fresh:
                    result.resume = await resume(fresh, steps)

            asyncio.run(main())
            result.stored = disk_usage(data_dir)[0]
            tenants = list((data_dir / "tenants").iterdir())
            packs = sum(disk_usage(t / "objects")[0] for t in tenants)
            journals = sum(disk_usage(t / "sessions")[0] for t in tenants)
            result.note = f"objects {fmt_bytes(packs)}, journals {fmt_bytes(journals)}"
            if keep_last:
                with Client(address) as client:
                    freed = client.collect_garbage().bytes_freed
                result.note += (
                    f"; CollectGarbage then frees {fmt_bytes(freed)} of dropped versions "
                    "(disk space returns when their pack is compacted)"
                )
    return result


def bench_file(name: str, make: Callable[[Path], Any], close: bool) -> Callable[[int], Result]:
    def run(steps: int) -> Result:
        result = Result(name, steps)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sessions.db"

            async def main() -> None:
                service = make(path)
                await drive(service, steps, result)
                if close:
                    await service.close()
                fresh = make(path)
                result.resume = await resume(fresh, steps)
                if close:
                    await fresh.close()

            asyncio.run(main())
            result.stored = disk_usage(Path(tmp))[0]
        return result

    return run


def make_database(path: Path) -> Any:
    from google.adk.sessions.database_session_service import DatabaseSessionService

    return DatabaseSessionService(f"sqlite+aiosqlite:///{path}")


def database_unavailable() -> str:
    try:
        import greenlet  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as exc:
        return f"not run: {exc.name} is not installed (pip install 'sqlalchemy[asyncio]>=2')"
    return ""


def bench_memory(steps: int) -> Result:
    result = Result(MEMORY, steps, note="nothing stored")

    async def main() -> None:
        service = InMemorySessionService()
        await drive(service, steps, result)
        result.resume = await resume(service, steps)

    asyncio.run(main())
    return result


# -- runs and report ------------------------------------------------------------------------

Runner = Callable[[int], Result]


def runners() -> list[tuple[str, Runner | None, str]]:
    db_note = database_unavailable()
    return [
        (STRATAD, bench_stratad, ""),
        (f"{STRATAD} keep_last=8", lambda steps: bench_stratad(steps, keep_last=8), ""),
        (DATABASE, None if db_note else bench_file(DATABASE, make_database, True), db_note),
        (SQLITE, bench_file(SQLITE, lambda p: SqliteSessionService(str(p)), False), ""),
        (MEMORY, bench_memory, ""),
    ]


def run_all(step_counts: Sequence[int], runs: int) -> list[Result]:
    results: list[Result] = []
    for steps in step_counts:
        tried: dict[str, list[Result]] = {}
        for _ in range(runs):  # interleaved: drift hits every service alike
            for name, runner, note in runners():
                if runner is None:
                    tried.setdefault(name, []).append(Result(name, steps, note=note))
                    continue
                tried.setdefault(name, []).append(runner(steps))
                report_line(tried[name][-1])
        for outcomes in tried.values():
            done = [r for r in outcomes if r.per_step]
            if not done:
                results.append(outcomes[0])
                continue
            done.sort(key=lambda r: r.mean)
            chosen = done[len(done) // 2]
            if len(done) > 1:
                runs_ms = " / ".join(f"{r.mean * 1e3:.2f}" for r in outcomes if r.per_step)
                chosen.note = (chosen.note + "; " if chosen.note else "") + f"runs: {runs_ms} ms"
            results.append(chosen)
    return results


def report_line(r: Result) -> None:
    if not r.per_step:
        print(f"  {r.service} @ {r.steps}: {r.note}", flush=True)
        return
    stored = fmt_bytes(r.stored) if r.stored is not None else "-"
    print(
        f"  {r.service} @ {r.steps}: {r.mean * 1e3:.2f} ms/step, {stored}, "
        f"resume {(r.resume or 0) * 1e3:.1f} ms",
        flush=True,
    )


def table(results: Sequence[Result]) -> str:
    rows = []
    for r in results:
        base = next((x for x in results if x.steps == r.steps and x.service == DATABASE), None)
        if not r.per_step:
            rows.append([str(r.steps), r.service, "-", "-", "-", "-", "-", "-", r.note])
            continue
        has_base = base is not None and bool(base.per_step) and bool(base.stored)
        ratio = "-"
        if has_base and r.stored:
            assert base is not None and base.stored
            ratio = f"{base.stored / r.stored:.1f}x"
        speed = f"{base.mean / r.mean:.2f}x" if has_base and base is not None else "-"
        rows.append([
            str(r.steps), r.service,
            fmt_bytes(r.stored) if r.stored is not None else "-", ratio,
            f"{r.mean * 1e3:.2f} ms", f"{percentile(r.per_step, 0.99) * 1e3:.2f} ms", speed,
            f"{(r.resume or 0) * 1e3:.1f} ms", r.note,
        ])  # fmt: skip
    headers = ["steps", "service", "bytes on disk", "DatabaseSessionService bytes / these",
               "time per step (mean)", "p99", "DatabaseSessionService time / this",
               "resume (fresh get_session)", "note"]  # fmt: skip
    return markdown_table(headers, rows)


NOTES = """\
How it is stored. The SQLite services write each event once, as a row of its
JSON, and update the session's state row in place. StratadSessionService saves
the whole session document (the events, then the state) at every step, but the
document grows at its end: the SDK cuts only its changed tail and uploads only
the new chunk, as a delta on the chunk it replaces, and the daemon stores it
compressed, with a delta manifest. So its bytes grow linearly too: per step,
about the new event compressed, a delta frame's and a manifest's headers (a
plain copy of the tail chunk ends each chain of 16 deltas), and a journal record
for the checkpoint (the note splits objects and journals). Those checkpoints are
every earlier version of the session, which the SQLite services do not keep;
`keep_last` bounds them (its row: smaller journals; CollectGarbage frees the
dropped versions' objects).

Where a step's time goes. A StratadSessionService append is one SaveState
through a second process: the client joins the document and compares it with
the last one (O(size), about a millisecond at 2,000 events here), cuts and
hashes only the tail, and the call returns after the daemon's journal fsync.
A DatabaseSessionService append is one SQLAlchemy transaction in process (it
reads the session, app and user state rows, inserts the event, updates the
session row) and a SQLite commit, through aiosqlite's thread. Resuming reads the
whole document in one LoadState and parses every event, as the SQL services read
and parse every row. A step with `app:` or `user:` keys costs a small GetSession and
one atomic MERGE per scope more; this workload has none. The machine is
shared: take differences under 1.5x between runs as noise (each row's note has
every run's mean)."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 and 300 steps; no doc update")
    parser.add_argument("--steps", default="", help="comma-separated step counts")
    parser.add_argument("--runs", type=int, default=0, help="runs per service and size")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")] if args.steps else []
    steps = steps or ([100, 300] if args.quick else [500, 2000])
    runs = args.runs or (1 if args.quick else 3)
    results = run_all(steps, runs)
    section = "\n".join([
        HEADING, "",
        f"Command: `python bench/adk.py`. Measured {machine_facts()}.",
        "Step i appends one ADK `Event` to one session: message i of the growing conversation",
        "([design.md](design.md#the-reference-workload-a-growing-conversation)) as its content and",
        '`{"step": i, "scratch": {...}}` as its state delta, so the session holds the reference',
        "workload's messages as its events and the rest as its state. Time per step is the",
        "wall time of `append_event`; bytes on disk are the files the service left",
        "(StratadSessionService: the daemon's data directory; the SQLite services: the database",
        "file and its journal); resume is a fresh service instance's first `get_session` of",
        f"the whole session. {runs} run(s) per service and size, interleaved; the run with the",
        "median time per step is shown (the others' means in the note).", "",
        table(results), "",
        NOTES, "",
    ])  # fmt: skip
    print(section)
    if not args.quick and not args.steps:
        write_section(HEADING, section)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
