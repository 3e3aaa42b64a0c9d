"""Disk bytes of the growing conversation's session journal, in-process.

For each step count: a fresh Engine (fsync durability, default thresholds),
one session, every state of bench/_workload's conversation saved in order,
`engine.close()`, then the allocated bytes (st_blocks * 512) of the journal
and of the whole data directory, beside the target of 10 x zstd(final state).
The journal left depends on where the last compaction fell (the background
tick runs every 100 ms), so each count is run `--runs` times.

Usage: python bench/journal_bytes.py [--runs N] [STEPS ...]   (default: 500 2000)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _workload
from _report import disk_usage

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine


def run(steps: int) -> tuple[int, int, int, float]:
    """(journal allocated, data directory allocated, target, saves/s) of one run."""
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        engine = Engine(data_dir)
        engine.open()
        engine.sessions.create("default", "conversation")
        started = time.perf_counter()
        state = b""
        for state in _workload.conversation_states(steps):
            engine.checkpoints.save_state("default", "conversation", SaveInput(data=state))
        spent = time.perf_counter() - started
        engine.close()
        journal = sum(f.stat().st_blocks * 512 for f in data_dir.rglob("journal*"))
        _, allocated = disk_usage(data_dir)
    target = 10 * len(zstandard.ZstdCompressor(level=3).compress(state))
    return journal, allocated, target, steps / spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="*", type=int, default=[500, 2000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("| steps | journal (allocated) | data directory (allocated) | target | saves/s |")
    print("|---|---|---|---|---|")
    for steps in args.steps:
        for _ in range(args.runs):
            journal, total, target, rate = run(steps)
            print(f"| {steps} | {journal:,} | {total:,} | {target:,} | {rate:.0f} |")


if __name__ == "__main__":
    main()
