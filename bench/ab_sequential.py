"""A/B of two versions of stratad on sequential saves of the growing conversation.

    python bench/ab_sequential.py --baseline REF [--runs 8] [--steps 500] [--doc]

This shared machine's speed drifts by more than most changes gain, so two
versions are compared by alternating them: run 1 of the baseline, run 1 of
this tree, run 2 of each..., each run a fresh daemon of that version (fsync
durability, fresh data directory) and a client of the same version's SDK
saving the reference conversation (docs/design.md) one step after another.
The medians and their ratio are printed (and with --doc written to
docs/benchmarks.md).

REF (a commit, tag or branch) is checked out into a temporary git worktree.
Both versions use the native extension built for this tree, so a change to
the Rust core is not what this compares, unless --baseline-core names the
baseline's own extension (built from REF: `git worktree add /tmp/ref REF &&
cd /tmp/ref && maturin build --release`, then `_core.abi3.so` from the wheel).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from _daemon import ROOT, daemon_process
from _report import machine_facts, markdown_table, median, write_section

HEADING = "## Code A/B: sequential saves (bench/ab_sequential.py)"
#: What the client of one run executes (in a process of its version's SDK).
CLIENT = """
import sys, time
sys.path.insert(0, {bench!r})
import _workload, stratad
states = list(_workload.conversation_states({steps}))
with stratad.Client({address!r}) as client:
    client.create_session("ab")
    started = time.perf_counter()
    for state in states:
        client.save_state("ab", state, content_type="application/json")
    print({steps} / (time.perf_counter() - started))
"""


@contextlib.contextmanager
def worktree(ref: str, core: Path | None = None) -> Iterator[Path]:
    """`ref` checked out in a temporary directory, with ``core`` as its native
    extension (default: this tree's)."""
    with tempfile.TemporaryDirectory(prefix="stratad-ab-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), ref],
            check=True,
        )
        try:
            builds = [core] if core else (ROOT / "python" / "stratad").glob("_core*.so")
            for built in builds:
                (path / "python" / "stratad" / built.name).write_bytes(built.read_bytes())
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False
            )


def head_commit() -> str:
    """This tree's HEAD, abbreviated (how the tables name this tree)."""
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip


def one_run(tree: Path, steps: int) -> float:
    """Checkpoints/s of one sequential run of `tree`'s daemon and SDK."""
    python = tree / "python"
    env = {**os.environ, "PYTHONPATH": str(python)}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        address, _ = stack.enter_context(daemon_process(Path(tmp) / "data", python_path=python))
        program = CLIENT.format(bench=str(ROOT / "bench"), steps=steps, address=address)
        out = subprocess.run(
            [sys.executable, "-c", program], env=env, check=True, capture_output=True, text=True
        )
        return float(out.stdout.strip())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git commit, tag or branch")
    parser.add_argument(
        "--baseline-core", type=Path, help="the baseline's own built _core*.so (Rust changes)"
    )
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--doc", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {args.baseline: [], f"this tree ({head_commit()})": []}
    with worktree(args.baseline, args.baseline_core) as baseline:
        trees = dict(zip(rates, (baseline, ROOT), strict=True))
        for run in range(args.runs):
            for name, tree in trees.items():
                rates[name].append(one_run(tree, args.steps))
            print(f"run {run + 1}: " + ", ".join(f"{n} {r[-1]:.0f}" for n, r in rates.items()))
    old, new = (median(r) for r in rates.values())
    rows = [
        [name, f"{median(r):.0f}", " / ".join(f"{x:.0f}" for x in r)] for name, r in rates.items()
    ]
    rows.append(["**ratio** (this tree / baseline)", f"**{new / old:.2f}x**", ""])
    table = markdown_table(["version", "checkpoints/s (median)", "runs, in order"], rows)
    print(table)
    if args.doc:
        core = " --baseline-core BUILT.so" if args.baseline_core else ""
        command = (
            f"`python bench/ab_sequential.py --baseline {args.baseline}{core} "
            f"--runs {args.runs} --steps {args.steps} --doc`"
        )
        write_section(
            HEADING,
            f"{HEADING}\n\nCommand: {command}. Measured {machine_facts()}.\n"
            f"{args.steps} steps of the growing conversation, one save after another, each run "
            "a fresh daemon (durability fsync) and a client of the same version's SDK; the "
            "versions alternate run by run so that a slow spell of this shared machine hits "
            "both.\n\n" + table + "\n",
        )


if __name__ == "__main__":
    main()
