"""LangGraph checkpointers: StratadSaver beside SqliteSaver, InMemorySaver and PostgresSaver.

A real LangGraph StateGraph runs the growing conversation of
docs/design.md: its state is {"messages", "step", "scratch"}, `messages` uses the
`add_messages` reducer, and one node adds message i (80 words, role user /
assistant) per super-step, so run N takes N steps in one `invoke` (one
checkpoint and one put_writes per step, LangGraph's default durability
"async"). Every saver runs the same graph in the same run, interleaved: run r of
every saver and step count before run r + 1 of any (medians are reported, every
run listed):

- StratadSaver: a `stratad serve` subprocess (durability fsync), chunked uploads;
- SqliteSaver: a file database in this process;
- InMemorySaver: this process's memory (bytes = its serialized blobs, checkpoints
  and writes);
- PostgresSaver: a local PostgreSQL (Debian's packages) started by
  scripts/postgres-test-server.sh under /tmp, fsync on (otherwise the table says why).

Reported per saver and step count: bytes stored after the run (files on disk;
for PostgreSQL the relation sizes of its checkpoint tables), steps/s (steps over
the wall time of the whole invoke, graph work included), CPU per step (this
process's CPU over the invoke plus the server's: the daemon, or PostgreSQL's
processes), get latest (`get_tuple` of the thread, median of 7 after the run)
and list(limit=10) (median of 5); and what the SDK path (bench/checkpoints.py's
stratad run: the JSON states saved with `save_state`) stores for the same
conversation.

Usage: python bench/langgraph.py [--quick] [--steps 500,2000] [--runs 3] [--no-postgres]
(--quick: 100 and 300 steps, one run, no doc update). PostgresSaver needs
`pip install langgraph-checkpoint-postgres "psycopg[binary]"` and `postgresql`
(`scripts/postgres-test-server.sh install`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

# This file is named like the package it measures, and `langgraph` is a namespace
# package, which any langgraph.py on sys.path would hide: import it with bench/
# off the path, then put bench/ back for the shared helpers.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

from stratad.integrations.langgraph import StratadSaver  # noqa: E402

sys.path.insert(0, str(_HERE))

import _workload  # noqa: E402
from _daemon import daemon_process, free_port  # noqa: E402
from _report import DOC, disk_usage, fmt_bytes, machine_facts, markdown_table, write_section  # noqa: E402

HEADING = "## LangGraph checkpointers (bench/langgraph.py)"


class State(TypedDict):
    messages: Annotated[list[Any], add_messages]
    step: int
    scratch: dict[str, Any]


def build_graph(steps: int) -> Any:
    """One node adds message i per super-step until `steps` messages exist."""

    def speak(state: State) -> dict[str, Any]:
        i = len(state["messages"])
        return {
            "messages": [_workload.message(i)],
            "step": i,
            "scratch": {"tool": "search", "n": i},
        }

    def route(state: State) -> str:
        return "speak" if len(state["messages"]) < steps else END

    builder = StateGraph(State)
    builder.add_node("speak", speak)
    builder.add_edge(START, "speak")
    builder.add_conditional_edges("speak", route, ["speak", END])
    return builder


ROOT = _HERE.parent
PG_SCRIPT = ROOT / "scripts" / "postgres-test-server.sh"
LATEST_CALLS = 7
LIST_CALLS = 5


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process, 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu(root: int) -> float:
    """CPU seconds of a process and its children (PostgreSQL's postmaster and backends)."""
    total = _proc_cpu(root)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == root:
                total += _proc_cpu(int(stat.parent.name))
    return total


@dataclass
class Run:
    seconds: float
    stored: int
    cpu: float  # client + server CPU seconds over the invoke
    latest: float  # seconds, median
    list10: float  # seconds, median
    #: Wall seconds of one `put` and of one `put_writes` during the invoke, medians
    #: (each of StratadSaver's is a call answered after its journal's fsync).
    put: float = 0.0
    writes: float = 0.0
    #: StratadSaver only: bytes of the object packs and of the session journals.
    parts: tuple[int, int] = (0, 0)


def run_graph(
    saver: BaseCheckpointSaver[Any],
    steps: int,
    thread: str,
    server_cpu: Callable[[], float] = lambda: 0.0,
) -> tuple[float, float, float, float, float, float]:
    """Run the conversation; returns (wall time of the invoke, client + server CPU
    over it, median get latest, median list(limit=10), median put, median put_writes)."""
    put_times: list[float] = []
    writes_times: list[float] = []
    saver.put = _timed(saver.put, put_times)
    saver.put_writes = _timed(saver.put_writes, writes_times)
    graph = build_graph(steps).compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
    _workload.message(steps)  # draw the words outside the timed part
    gc.collect()
    cpu_before = time.process_time() + server_cpu()
    started = time.perf_counter()
    out = graph.invoke({"messages": [], "step": 0, "scratch": {}}, config)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() + server_cpu() - cpu_before
    assert len(out["messages"]) == steps, len(out["messages"])
    latest_config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    latest_times = []
    for _ in range(LATEST_CALLS):
        t0 = time.perf_counter()
        latest = saver.get_tuple(latest_config)
        latest_times.append(time.perf_counter() - t0)
        assert latest is not None and len(latest.checkpoint["channel_values"]["messages"]) == steps
    list_times = []
    for _ in range(LIST_CALLS):
        t0 = time.perf_counter()
        listed = list(saver.list({"configurable": {"thread_id": thread}}, limit=10))
        list_times.append(time.perf_counter() - t0)
        assert len(listed) == 10
    return (
        elapsed, cpu, statistics.median(latest_times), statistics.median(list_times),
        statistics.median(put_times), statistics.median(writes_times),
    )  # fmt: skip


def _timed(call: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    """`call`, appending the wall time of each call to `into`."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - started)

    return timed


@dataclass
class Result:
    saver: str
    steps: int
    runs: list[Run]
    note: str = ""
    #: CPU seconds per step of the graph itself (NullSaver), median.
    graph_cpu: float = 0.0

    def _median(self, field: str) -> float | None:
        return statistics.median(getattr(r, field) for r in self.runs) if self.runs else None

    @property
    def seconds(self) -> float | None:
        return self._median("seconds")

    @property
    def stored(self) -> int | None:
        value = self._median("stored")
        return int(value) if value is not None else None

    @property
    def sps(self) -> float | None:
        return self.steps / self.seconds if self.seconds else None

    @property
    def cpu_per_step(self) -> float | None:
        cpu = self._median("cpu")
        return cpu / self.steps if cpu is not None else None

    @property
    def saver_cpu(self) -> float | None:
        """CPU per step beyond the graph's own work: the saver's (client + server)."""
        cpu = self.cpu_per_step
        return cpu - self.graph_cpu if cpu is not None else None

    @property
    def latest(self) -> float | None:
        return self._median("latest")

    @property
    def list10(self) -> float | None:
        return self._median("list10")

    @property
    def put(self) -> float | None:
        return self._median("put")

    @property
    def writes(self) -> float | None:
        return self._median("writes")


STRATAD = "StratadSaver (daemon, fsync)"
SQLITE = "SqliteSaver (file, in-process)"
MEMORY = "InMemorySaver (serialized bytes held)"
POSTGRES = "PostgresSaver (local PostgreSQL, fsync on)"


def bench_stratad(steps: int) -> Run:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        # No metrics endpoint: its default port would collide with other daemons.
        with (
            daemon_process(data_dir, "--metrics-listen", "off") as (address, proc),
            StratadSaver(address) as saver,
        ):
            timings = run_graph(saver, steps, "conversation", lambda: _proc_cpu(proc.pid))
            stored, _ = disk_usage(data_dir)
        tenants = list((data_dir / "tenants").iterdir())
        objects = sum(disk_usage(t / "objects")[0] for t in tenants)
        journals = sum(disk_usage(t / "sessions")[0] for t in tenants)
        return Run(timings[0], stored, *timings[1:], parts=(objects, journals))


def bench_sqlite(steps: int) -> Run:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "checkpoints.db", check_same_thread=False)
        try:
            timings = run_graph(SqliteSaver(conn), steps, "conversation")
        finally:
            conn.close()
        stored, _ = disk_usage(Path(tmp))
    return Run(timings[0], stored, *timings[1:])


def bench_memory(steps: int) -> Run:
    saver = InMemorySaver()
    timings = run_graph(saver, steps, "conversation")
    stored = sum(len(b) for _, b in saver.blobs.values())
    for namespaces in saver.storage.values():
        for checkpoints in namespaces.values():
            stored += sum(len(cp[1]) + len(md[1]) for cp, md, _ in checkpoints.values())
    for writes in saver.writes.values():
        stored += sum(len(value[1]) for _, _, value, _ in writes.values())
    return Run(timings[0], stored, *timings[1:])


class NullSaver(InMemorySaver):
    """Keeps nothing: the graph's own work per step, without a saver's."""

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        configurable = config["configurable"]
        return {
            "configurable": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        return None


def graph_cpu(steps: int) -> float:
    """CPU seconds per step of the graph alone (a saver that keeps nothing)."""
    graph = build_graph(steps).compile(checkpointer=NullSaver())
    config = {"configurable": {"thread_id": "null"}, "recursion_limit": steps + 10}
    _workload.message(steps)
    gc.collect()
    before = time.process_time()
    out = graph.invoke({"messages": [], "step": 0, "scratch": {}}, config)
    assert len(out["messages"]) == steps
    return (time.process_time() - before) / steps


def sdk_bytes(steps: int) -> tuple[int, tuple[int, int]]:
    """What the SDK path (bench/checkpoints.py's stratad run) stores for the same
    conversation, the JSON states of docs/design.md saved with `save_state`: bytes,
    and (objects, journals)."""
    import stratad

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        with (
            daemon_process(data_dir, "--metrics-listen", "off") as (address, _),
            stratad.Client(address) as client,
        ):
            client.create_session("conversation")  # as bench/checkpoints.py run_stratad
            for state in _workload.conversation_states(steps):
                client.save_state("conversation", state, content_type="application/json")
            stored, _ = disk_usage(data_dir)
        tenants = list((data_dir / "tenants").iterdir())
        objects = sum(disk_usage(t / "objects")[0] for t in tenants)
        journals = sum(disk_usage(t / "sessions")[0] for t in tenants)
    return stored, (objects, journals)


def message_sizes(steps: int) -> tuple[int, int]:
    """The conversation's `steps` messages serialized as each path stores them:
    (as LangGraph's messages through the saver's serde, one piece per message, as
    StratadSaver stores them; as the SDK path's JSON). Both are compressed the
    same way by the daemon, so their ratio is where the objects' ratio comes from."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    messages = add_messages([], [_workload.message(i) for i in range(steps)])
    serde = JsonPlusSerializer()
    saver_bytes = sum(len(serde.dumps_typed(m)[1]) for m in messages)
    json_bytes = len(_workload.conversation_state(steps - 1))
    return saver_bytes, json_bytes


# -- PostgreSQL ----------------------------------------------------------------------


@contextlib.contextmanager
def postgres() -> Iterator[tuple[str, int]]:
    """A throwaway PostgreSQL cluster under /tmp (scripts/postgres-test-server.sh);
    yields (connection string, postmaster pid)."""
    tmp = Path(tempfile.mkdtemp(prefix="stratad-pg-"))
    try:
        started = subprocess.run(
            [str(PG_SCRIPT), "start", str(tmp), str(free_port())],
            check=True,
            capture_output=True,
            text=True,
        )
        info = dict(line.split("=", 1) for line in started.stdout.split())
        try:
            yield info["dsn"], int(info["pid"])
        finally:
            subprocess.run([str(PG_SCRIPT), "stop", str(tmp)], check=False, capture_output=True)
    finally:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def bench_postgres(steps: int, conn_string: str, postmaster: int) -> Run:
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import Connection

    with Connection.connect(conn_string, autocommit=True, prepare_threshold=0) as conn:
        for table in ("checkpoint_writes", "checkpoint_blobs", "checkpoints"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute("DROP TABLE IF EXISTS checkpoint_migrations")
        conn.execute("VACUUM")
        saver = PostgresSaver(conn)  # type: ignore[arg-type]
        saver.setup()
        timings = run_graph(saver, steps, "conversation", lambda: _tree_cpu(postmaster))
        conn.execute("CHECKPOINT")
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
            "WHERE c.relname IN ('checkpoints', 'checkpoint_blobs', 'checkpoint_writes')"
        ).fetchone()
    stored = int(row[0]) if row and row[0] is not None else 0
    return Run(timings[0], stored, *timings[1:])


def postgres_unavailable() -> str:
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
        import psycopg  # noqa: F401
    except ImportError as exc:
        return f"not run: {exc.name} is not installed"
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        return "not run: no PostgreSQL server binaries (scripts/postgres-test-server.sh install)"
    return ""


# -- report --------------------------------------------------------------------------


def run_all(
    step_counts: Sequence[int], use_postgres: bool, runs: int, only: Sequence[str] = ()
) -> tuple[list[Result], dict[int, tuple[int, tuple[int, int]]]]:
    """Every saver at every step count, `runs` times, interleaved; and the SDK
    path's bytes per step count."""
    runners: list[tuple[str, str, Callable[[int], Run]]] = [
        ("stratad", STRATAD, bench_stratad),
        ("sqlite", SQLITE, bench_sqlite),
        ("memory", MEMORY, bench_memory),
    ]
    runners = [r for r in runners if not only or r[0] in only]
    pg_note = postgres_unavailable() if use_postgres else "not run (--no-postgres)"
    if only and "postgres" not in only:
        pg_note = "not run (--only)"
    results = {(name, steps): Result(label, steps, []) for name, label, _ in runners
               for steps in step_counts}  # fmt: skip
    pg = {steps: Result(POSTGRES, steps, [], pg_note) for steps in step_counts}
    graph: dict[int, list[float]] = {steps: [] for steps in step_counts}
    with contextlib.ExitStack() as stack:
        conn_string, postmaster = "", 0
        if not pg_note:
            try:
                conn_string, postmaster = stack.enter_context(postgres())
            except (OSError, subprocess.CalledProcessError, KeyError, ValueError) as exc:
                detail = getattr(exc, "stderr", "") or ""
                for r in pg.values():
                    r.note = f"not run: the cluster did not start ({exc} {detail[-200:]!r})"
        for run in range(runs):
            for steps in step_counts:
                graph[steps].append(graph_cpu(steps))
                for name, label, runner in runners:
                    results[(name, steps)].runs.append(runner(steps))
                    report_line(label, steps, run, results[(name, steps)].runs[-1])
                if conn_string:
                    pg[steps].runs.append(bench_postgres(steps, conn_string, postmaster))
                    report_line(POSTGRES, steps, run, pg[steps].runs[-1])
    ordered = []
    for steps in step_counts:
        ordered += [results[(name, steps)] for name, _, _ in runners]
        ordered.append(pg[steps])
    sdk = {steps: sdk_bytes(steps) for steps in step_counts} if not only else {}
    for r in ordered:
        r.graph_cpu = statistics.median(graph[r.steps])
    return ordered, sdk


def report_line(saver: str, steps: int, run: int, r: Run) -> None:
    print(
        f"  run {run + 1} {saver} @ {steps}: {steps / r.seconds:.1f} steps/s, "
        f"{fmt_bytes(r.stored)}, CPU {r.cpu / steps * 1e3:.2f} ms/step, "
        f"get latest {r.latest * 1e3:.2f} ms, list(10) {r.list10 * 1e3:.1f} ms",
        flush=True,
    )


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.2f}" if seconds is not None else "-"


def table(results: Sequence[Result]) -> str:
    rows = []
    for r in results:
        sqlite = next(x for x in results if x.steps == r.steps and x.saver == SQLITE)
        if not r.runs:
            rows.append([str(r.steps), r.saver, "-", "-", "-", "-", "-", "-", "-", "-", r.note])
            continue
        assert sqlite.stored and sqlite.sps and r.sps and r.stored
        rows.append([
            str(r.steps), r.saver, fmt_bytes(r.stored), f"{sqlite.stored / r.stored:.1f}x",
            f"{r.sps:.1f}", f"{r.sps / sqlite.sps:.2f}x", _ms(r.cpu_per_step), _ms(r.saver_cpu),
            _ms(r.latest), _ms(r.list10),
            ", ".join(f"{r.steps / x.seconds:.1f}" for x in r.runs),
        ])  # fmt: skip
    headers = ["steps", "saver", "bytes stored", "SqliteSaver bytes / these",
               "steps/s (median)", "steps/s vs SqliteSaver", "CPU ms/step (client + server)",
               "of which the saver's (CPU ms/put)",
               "get latest ms", "list(limit=10) ms", "steps/s of each run"]  # fmt: skip
    return markdown_table(headers, rows)


def paired(ours: Result, theirs: Result, field: str) -> float:
    """Median over the runs of ours / theirs within the same round (run i of both
    ran back to back): steadier than a ratio of medians when the load moves."""
    ratios = [
        float(getattr(a, field)) / float(getattr(b, field))
        for a, b in zip(ours.runs, theirs.runs, strict=False)
    ]
    return statistics.median(ratios)


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def targets(results: Sequence[Result], sdk: dict[int, tuple[int, tuple[int, int]]]) -> str:
    def get(label: str, steps: int) -> Result:
        return next(r for r in results if r.steps == steps and r.saver == label)

    counts = sorted({r.steps for r in results})
    top, low = counts[-1], counts[0]
    ours, sq = get(STRATAD, top), get(SQLITE, top)
    assert ours.stored and sq.stored
    lines = []
    if top in sdk:
        sdk_stored, (sdk_objects, sdk_journals) = sdk[top]
        objects, journals = ours.runs[0].parts
        ratio = ours.stored / sdk_stored
        lines.append(
            f"- bytes at {top} steps: {fmt_bytes(ours.stored)}, {ratio:.2f}x the SDK path's "
            f"{fmt_bytes(sdk_stored)} for the same conversation (target <= 1.2x): "
            f"{_verdict(ratio <= 1.2)}; {sq.stored / ours.stored:.0f}x fewer than "
            f"SqliteSaver. Objects {fmt_bytes(objects)} (SDK path {fmt_bytes(sdk_objects)}), "
            f"journals {fmt_bytes(journals)} (SDK path {fmt_bytes(sdk_journals)}; "
            "StratadSaver's also hold every put_writes, the new message once more)"
        )
        saver_bytes, json_bytes = message_sizes(top)
        lines.append(
            f"  - why the objects differ: the {top} messages serialized as StratadSaver "
            f"stores them (LangGraph's message objects, one piece each) are "
            f"{fmt_bytes(saver_bytes)}, the same conversation as the SDK path's JSON "
            f"{fmt_bytes(json_bytes)} ({saver_bytes / json_bytes:.2f}x); why the journals "
            "differ: every step's put_writes is journaled with its message"
        )
    for steps in counts:
        o, s = get(STRATAD, steps), get(SQLITE, steps)
        assert o.sps and s.sps and o.saver_cpu and s.saver_cpu
        assert o.list10 and s.list10 and o.latest and s.latest
        want = 1.5 if steps >= 2000 else 1.0
        speed = o.sps / s.sps
        per_round = 1 / paired(o, s, "seconds")
        rounds = ", ".join(
            f"{b.seconds / a.seconds:.2f}x" for a, b in zip(o.runs, s.runs, strict=False)
        )
        cpu = o.saver_cpu / s.saver_cpu
        assert o.put and o.writes and s.put and s.writes
        lines += [
            f"- steps/s at {steps} steps: {speed:.2f}x SqliteSaver's (medians; target >= "
            f"{want}x): {_verdict(speed >= want)}; run by run {rounds}, median "
            f"{per_round:.2f}x: {_verdict(per_round >= want)}. Wall time of a step's two "
            f"saver calls (medians): put {_ms(o.put)} ms + put_writes {_ms(o.writes)} ms "
            f"= {_ms(o.put + o.writes)} ms, SqliteSaver's {_ms(s.put)} + {_ms(s.writes)} "
            f"= {_ms(s.put + s.writes)} ms",
            f"- CPU per put at {steps} steps (client + server, beyond the graph's own "
            f"{_ms(o.graph_cpu)} ms): {_ms(o.saver_cpu)} ms, {cpu:.2f}x SqliteSaver's "
            f"{_ms(s.saver_cpu)} ms (target <= 1.5x): {_verdict(cpu <= 1.5)}",
            f"- list(limit=10) at {steps} steps: {_ms(o.list10)} ms vs SqliteSaver's "
            f"{_ms(s.list10)} ms (target <=): {_verdict(o.list10 <= s.list10)}",
        ]
    o, s = get(STRATAD, top), get(SQLITE, top)
    assert o.latest and s.latest
    lines.append(
        f"- get latest at {top} steps: {_ms(o.latest)} ms vs SqliteSaver's {_ms(s.latest)} ms "
        f"(target <=): {_verdict(o.latest <= s.latest)}"
    )
    if top != low:
        a, b = get(STRATAD, low).saver_cpu, get(STRATAD, top).saver_cpu
        assert a and b
        lines.append(
            f"- StratadSaver's CPU per put from {low} to {top} steps: {_ms(a)} -> {_ms(b)} ms "
            f"({b / a:.2f}x; target: not growing with the state, <= 1.25x): "
            f"{_verdict(b / a <= 1.25)}"
        )
    return "\n".join(lines)


NOTES = """\
How StratadSaver stores a checkpoint (docs/langgraph.md#how-a-checkpoint-is-stored):
each message of `messages` is serialized on its own, lists first and the rest of the
checkpoint (IDs, versions, metadata) last, so the state grows at its end only; the
messages earlier puts serialized are not serialized again, and the SDK cuts, hashes
and sends only the chunks after the first difference. SqliteSaver serializes and
writes the whole checkpoint every step, PostgresSaver every channel whose version
changed (here `messages` at every step), so their cost per step grows with the
conversation. Every step also calls put_writes (a second journaled call for
StratadSaver), and the writes keep each new message once more. Each of
StratadSaver's two calls per step is a round trip to the daemon answered after
its journal's fdatasync, and costs about the same at 500 and 2,000 steps (the
"wall time of a step's two saver calls" above); SqliteSaver's commits are
in-process and grow with the checkpoint it rewrites whole. get latest and
list(limit=10) of StratadSaver load the states from the daemon and decode only the
messages the saver has not decoded or serialized before (as after a run); SqliteSaver
decodes every checkpoint whole. CPU per step counts this process (graph work
included, the same for every saver) and the server's processes; CPU per put is
that minus the graph's own CPU per step (the same graph with a saver that keeps
nothing, median of the runs); load on the
machine (shared, 2 cores) moves every figure, hence the interleaved runs."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 and 300 steps; no doc update")
    parser.add_argument("--steps", default="", help="comma-separated step counts")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--runs", type=int, default=0, help="interleaved runs (default 3)")
    parser.add_argument("--only", default="", help="stratad,sqlite,memory,postgres (default: all)")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")] if args.steps else []
    steps = steps or ([100, 300] if args.quick else [500, 2000])
    runs = args.runs or (1 if args.quick else 3)
    only = [s for s in args.only.split(",") if s]
    load_before = os.getloadavg()
    graph_cpu(20)  # warm up: imports, the first compile
    results, sdk = run_all(steps, not args.no_postgres, runs, only)
    load_after = os.getloadavg()
    if only:  # a partial run: print, do not tabulate
        return
    load = (
        f"Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {', '.join(f'{x:.2f}' for x in load_after)}."
    )
    sdk_line = ", ".join(f"{fmt_bytes(b)} at {n} steps" for n, (b, _) in sorted(sdk.items()))
    section = "\n".join([
        HEADING, "",
        f"Command: `python bench/langgraph.py`. Measured {machine_facts()}.",
        "A LangGraph StateGraph (`add_messages` on `messages`, plus `step` and `scratch`)",
        "adds one message of the growing conversation "
        "([design.md](design.md#the-reference-workload-a-growing-conversation)) per super-step,",
        "in one `invoke` per run: one checkpoint and one `put_writes` per step, LangGraph's",
        "default durability (`async`). steps/s is over the whole invoke (graph work and",
        "serialization included, the same for every saver); bytes stored are the files the",
        "saver left (StratadSaver: the daemon's data directory; SqliteSaver: the database",
        "file; InMemorySaver: the serialized bytes it holds; PostgresSaver: the relation",
        "sizes of its tables). Medians of "
        f"{runs} interleaved runs per saver and step count (every run's steps/s listed). {load}",
        f"The SDK path (bench/checkpoints.py's stratad run, JSON states) stores {sdk_line}.", "",
        table(results), "",
        "### Targets", "",
        targets(results, sdk), "",
        NOTES, "",
    ])  # fmt: skip
    print(section)
    if not args.quick and not args.steps:
        write_section(HEADING, section)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
