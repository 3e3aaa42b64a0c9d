"""A/B of two versions of stratad under bench/checkpoints.py's (b) unary load.

    python bench/ab_load.py --baseline REF --baseline-core BUILT.so [--runs 6] [--doc]

16 clients (this tree's SDK, grpc.aio channels, one call in flight each) save
distinct 8 KB states with SaveState, durability fsync. The versions alternate
run by run with the bare grpc.aio echo server (the transport ceiling the
throughput target is set against), each run a fresh daemon: echo, baseline,
this tree, echo, baseline, ... so that a slow spell of this shared machine
hits all three. Each run is a warm-up round and then one measured round of
16 x 200 calls; the medians, each version's ratio to the echo server, and the
ratio of the two versions are printed (with --doc written to
docs/benchmarks.md).

REF is checked out into a temporary git worktree (bench/ab_sequential.py);
``--baseline-core`` names REF's own native extension, so that changes to the
Rust front door are part of what is compared (build it with `git worktree add
/tmp/ref REF && cd /tmp/ref && maturin build --release`, then take
`_core.abi3.so` out of the wheel).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

import checkpoints as cb
from _daemon import ROOT, daemon_process, echo_server
from _report import machine_facts, markdown_table, median, write_section
from ab_sequential import head_commit, worktree
from front import stratad_run

HEADING = "## Code A/B: 16 clients, unary SaveState (bench/ab_load.py)"
PER_CLIENT = 200


def stratad_rate(tree: Path) -> float:
    """Saves/s of one measured round against a fresh daemon of ``tree``."""
    with tempfile.TemporaryDirectory() as tmp:
        python = tree / "python"
        with daemon_process(Path(tmp) / "data", python_path=python) as (address, _):
            run = stratad_run(address, PER_CLIENT)
            asyncio.run(run())  # warm-up
            return asyncio.run(run()).throughput


def echo_rate() -> float:
    with echo_server() as address:
        asyncio.run(cb.echo_unary(address, PER_CLIENT))  # warm-up
        return asyncio.run(cb.echo_unary(address, PER_CLIENT)).throughput


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git commit, tag or branch")
    parser.add_argument("--baseline-core", type=Path, help="REF's own _core.abi3.so")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--doc", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args(argv)
    echo = "echo server (grpc.aio)"
    names = [echo, args.baseline, f"this tree ({head_commit()})"]
    rates: dict[str, list[float]] = {name: [] for name in names}
    with worktree(args.baseline, args.baseline_core) as baseline:
        for run in range(args.runs):
            rates[echo].append(echo_rate())
            rates[args.baseline].append(stratad_rate(baseline))
            rates[names[2]].append(stratad_rate(ROOT))
            print(f"run {run + 1}: " + ", ".join(f"{n} {r[-1]:.0f}" for n, r in rates.items()))
    medians = {name: median(r) for name, r in rates.items()}
    rows = [
        [
            name,
            f"{medians[name]:.0f}",
            f"{medians[name] / medians[echo]:.2f}x",
            " / ".join(f"{x:.0f}" for x in r),
        ]
        for name, r in rates.items()
    ]
    ratio = medians[names[2]] / medians[args.baseline]
    rows.append(["**this tree / baseline**", f"**{ratio:.2f}x**", "", ""])
    table = markdown_table(["server", "saves/s (median)", "vs echo", "runs, in order"], rows)
    print(table)
    if args.doc:
        core = " --baseline-core BUILT.so" if args.baseline_core else ""
        command = f"`python bench/ab_load.py --baseline {args.baseline}{core} --runs {args.runs}`"
        write_section(
            HEADING,
            f"{HEADING}\n\nCommand: {command}. Measured {machine_facts()}.\n"
            f"{cb.CLIENTS} clients x {PER_CLIENT} SaveState calls of distinct 8 KB states "
            "(durability fsync) per run, after a warm-up round; each run a fresh daemon; "
            "the echo server, the baseline and this tree alternate run by run.\n\n" + table + "\n",
        )


if __name__ == "__main__":
    main()
