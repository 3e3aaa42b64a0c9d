"""LangGraph.js checkpointers: @stratad/langgraph's StratadSaver beside SqliteSaver and MemorySaver.

A LangGraph.js StateGraph (MessagesAnnotation's reducer on `messages`, plus `step`
and `scratch`) runs the growing conversation of docs/design.md: one node adds
message i per super-step, so run N takes N steps in one `invoke` (a checkpoint
and a putWrites per step, LangGraph's default durability "async"), in a node
process (clients/langgraph-js/bench/run.mjs). The messages are drawn here with
Python's random.Random(7) (bench/_workload.py) and handed to node as JSON, so
every benchmark of the reference workload saves the same conversation.

- StratadSaver: a `stratad serve` subprocess (durability fsync); the TypeScript
  client sends each checkpoint whole (docs/langgraph-js.md#limits);
- SqliteSaver (@langchain/langgraph-checkpoint-sqlite, LangGraph.js's persistent
  saver): a file database in the node process (better-sqlite3, WAL);
- MemorySaver: the node process's memory (bytes = its serialized checkpoints,
  metadata and writes).

Reported: bytes on disk after the run (the daemon's data directory; the database
file once closed) and time per step (the invoke's wall time over its steps), of
the run with the median time among --runs runs per saver, the savers interleaved.

Usage: python bench/langgraph_js.py [--quick] [--steps 500,2000] [--runs 3] [--only stratad,sqlite]
(--quick: 100 and 300 steps, no doc update). Needs Node.js >= 20 and npm: it runs
clients/langgraph-js/scripts/deps.sh, then `npm ci` in clients/langgraph-js/bench
(better-sqlite3 is compiled there when no prebuilt binary downloads: minutes, once).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "langgraph-js"
NODE_BENCH = PACKAGE / "bench"
HEADING = "## LangGraph.js checkpointers (bench/langgraph_js.py)"
SAVERS = {
    "stratad": "StratadSaver (daemon, fsync)",
    "sqlite": "SqliteSaver (file, in-process)",
    "memory": "MemorySaver (serialized bytes held)",
}


@dataclass
class Result:
    saver: str
    steps: int
    seconds: float
    stored: int
    runs: tuple[float, ...] = ()

    @property
    def per_step(self) -> float:
        return self.seconds / self.steps


def install() -> None:
    """The package built, and the bench's own dependencies (SqliteSaver) installed."""
    subprocess.run([str(PACKAGE / "scripts" / "deps.sh")], check=True, stdout=subprocess.DEVNULL)
    stamp = NODE_BENCH / "node_modules" / ".stratad-lock-sha256"
    want = hashlib.sha256((NODE_BENCH / "package-lock.json").read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != want:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=NODE_BENCH, check=True)  # fmt: skip
        stamp.write_text(want)


def node_run(saver: str, steps: int, messages: Path, cwd: Path, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    args = ["node", str(NODE_BENCH / "run.mjs"), "--saver", saver, "--steps", str(steps),
            "--messages", str(messages), "--db", str(cwd / "checkpoints.db")]  # fmt: skip
    done = subprocess.run(args, cwd=cwd, env={**clean, **env}, capture_output=True, text=True,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def bench(saver: str, steps: int, messages: Path) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if saver == "stratad":
            data_dir = work / "data"
            with daemon(data_dir) as address:
                out = node_run(saver, steps, messages, work, STRATAD_ADDRESS=address)
                stored, _ = disk_usage(data_dir)
        else:
            out = node_run(saver, steps, messages, work)
            stored = int(out["stored"]) if saver == "memory" else disk_usage(work)[0]  # type: ignore[call-overload]
    return Result(SAVERS[saver], steps, float(out["seconds"]), stored)  # type: ignore[arg-type]


def table(results: Sequence[Result]) -> str:
    rows = []
    for r in results:
        sq = next((x for x in results if x.steps == r.steps and x.saver.startswith("Sqlite")), None)
        ratio = f"{sq.stored / r.stored:.1f}x" if sq else "-"
        speed = f"{sq.per_step / r.per_step:.2f}x" if sq else "-"
        runs = " / ".join(fmt_time(t / r.steps) for t in r.runs)
        rows.append([str(r.steps), r.saver, fmt_bytes(r.stored), ratio, fmt_time(r.per_step),
                     f"{1 / r.per_step:.1f}", speed, runs])  # fmt: skip
    headers = ["steps", "saver", "bytes on disk", "SqliteSaver bytes / these", "time per step",
               "steps/s", "speed vs SqliteSaver", "runs (time per step)"]  # fmt: skip
    return markdown_table(headers, rows)


NOTES = """\
How it is stored. LangGraph.js's SqliteSaver (and MemorySaver) keep every checkpoint
whole, the full message history included, so the bytes grow with the square of the
conversation. StratadSaver stores each checkpoint as a stratad state, in the Python
saver's layout (the messages one by one, then the other channels, then IDs, versions
and metadata, so a growing conversation grows the state at its end): the daemon cuts
it into content-defined chunks, keeps the chunks successive checkpoints share once,
stores a rewritten last chunk as a zstd delta on the one it replaces and the
manifest as a delta on the previous one ([storage.md](storage.md)). That is the same
storage as the Python saver's ([bench/langgraph.py](#langgraph-checkpointers-benchlanggraphpy)),
because the daemon does it: the bytes per step are what the conversation added, compressed.

Where a step's time goes. LangGraph chains its puts, so a saver's steps/s is at most
one over its put latency; every step also calls putWrites. A StratadSaver put
serializes what changed since the thread's previous put (the new messages; SqliteSaver
serializes the whole checkpoint) and makes one gRPC call that carries the whole
serialized checkpoint and returns after the daemon's journal fsync; putWrites is a
second journaled call. For a short conversation two costs SqliteSaver does not have
set the pace: the TypeScript client's per-call cost (a unary call through
connect-node's gRPC transport took 2.5-3.4 ms of wall time and ~1.7 ms of CPU on this
machine, against 0.8 ms for the same request as a bare `node:http2` stream and 0.8 ms
from the Python SDK), and sending the whole state at every step (the Python SDK
uploads only the chunks the daemon lacks; the TypeScript client has no chunked upload
yet, see [clients.md](clients.md#typescript)). SqliteSaver's cost grows with the
conversation (it serializes and writes the whole checkpoint every step) faster than
StratadSaver's, which passes it before 2,000 steps."""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 and 300 steps; no doc update")
    parser.add_argument("--steps", default="", help="comma-separated step counts")
    parser.add_argument("--runs", type=int, default=3, help="runs per saver and size (median)")
    parser.add_argument("--only", default="", help="stratad,sqlite,memory (default: all)")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")] if args.steps else []
    steps = steps or ([100, 300] if args.quick else [500, 2000])
    only = [s for s in args.only.split(",") if s] or list(SAVERS)
    install()
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        messages = Path(tmp) / "messages.json"
        messages.write_text(json.dumps([_workload.message(i) for i in range(max(steps))]))
        for n in steps:
            runs: dict[str, list[Result]] = {saver: [] for saver in only}
            for _ in range(args.runs):
                for saver in only:
                    r = bench(saver, n, messages)
                    runs[saver].append(r)
                    print(f"  {r.saver} @ {n}: {fmt_time(r.per_step)}/step, {fmt_bytes(r.stored)}",
                          flush=True)  # fmt: skip
            for saver in only:
                ordered = sorted(runs[saver], key=lambda x: x.seconds)
                middle = ordered[(len(ordered) - 1) // 2]
                middle.runs = tuple(x.seconds for x in runs[saver])
                results.append(middle)
    langgraph = json.loads((PACKAGE / "package.json").read_text())["devDependencies"]
    sqlite = json.loads((NODE_BENCH / "package.json").read_text())["dependencies"]
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    section = "\n".join([
        HEADING, "",
        f"Command: `python bench/langgraph_js.py`. Measured {machine_facts()}, Node.js {node},",
        f"@langchain/langgraph {langgraph['@langchain/langgraph']}, @langchain/langgraph-"
        f"checkpoint-sqlite {sqlite['@langchain/langgraph-checkpoint-sqlite']}.",
        "A LangGraph.js StateGraph (`MessagesAnnotation` on `messages`, plus `step` and `scratch`)",
        "adds one message of the growing conversation "
        "([design.md](design.md#the-reference-workload-a-growing-conversation)) per super-step,",
        "in one `invoke` per run in a node process: a checkpoint and a `putWrites` per step,",
        "LangGraph's default durability (`async`). Time per step is the invoke's wall time over",
        "its steps (graph work and serialization included, the same for every saver); bytes on",
        "disk are the files the saver left (StratadSaver: the daemon's data directory;",
        "SqliteSaver: the database file, closed; MemorySaver: the serialized bytes it holds).",
        f"Each row is the run with the median time of {args.runs}, the savers interleaved.",
        "", table(results), "", NOTES, "",
    ])  # fmt: skip
    print(section)
    if not args.quick and not args.steps and not args.only and args.runs >= 3:
        write_section(HEADING, section)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    sys.exit(main())
