"""Journal commit latency: records appended at the file's end against records
written into preallocated zeros (store/journal.py, "Preallocation").

What each acknowledged save waits for is one journal append and one
fdatasync. Appending grows the file, so every fdatasync also commits the new
size through the filesystem's own journal (ext4: a jbd2 transaction); writing
into space the file already holds needs the data flush only. Both ways run on
a `Journal` in this process, rounds interleaved (one round of each, then the
next), records of the reference workload's median size (~700 bytes; one save
of the growing conversation) and of a larger 8 KB state; the median per-record
append + fdatasync and its p99 over all rounds are reported, and the bytes the
file holds at the end (allocated, before close; after close it ends with its
last record again).

Usage: python bench/journal_fsync.py [--records N] [--rounds N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import fmt_bytes, machine_facts, markdown_table, median, percentile, write_section

from stratad.store.journal import Journal, Record

HEADING = "## Journal commit latency (bench/journal_fsync.py)"
RECORD_SIZES = (700, 8192)
WAYS = {"appended (file grows)": False, "into preallocated zeros": True}


def run(preallocate: bool, record_bytes: int, records: int) -> tuple[list[float], int]:
    """Per-record append+fdatasync seconds, and the file's allocated bytes at the end."""
    record = Record("save", {"checkpoint": "c" * 32}, [os.urandom(record_bytes)])
    spent: list[float] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        path = Path(tmp) / "journal"
        journal = Journal(path, durable=True, preallocate=preallocate)
        try:
            for _ in range(records):
                started = time.perf_counter()
                journal.sync(journal.append(record))
                spent.append(time.perf_counter() - started)
            allocated = path.stat().st_blocks * 512
        finally:
            journal.close()
    return spent, allocated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000, help="records per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="print only, 100 records, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.records, args.rounds = 100, 1
    rows = []
    medians: dict[tuple[int, bool], float] = {}
    for size in RECORD_SIZES:
        samples: dict[bool, list[float]] = {False: [], True: []}
        allocated: dict[bool, int] = {}
        for _ in range(args.rounds):
            for preallocate in WAYS.values():
                spent, allocated[preallocate] = run(preallocate, size, args.records)
                samples[preallocate] += spent
        for name, preallocate in WAYS.items():
            medians[size, preallocate] = median(samples[preallocate])
            rows.append([
                fmt_bytes(size), name, str(len(samples[preallocate])),
                f"{medians[size, preallocate] * 1e6:.0f} µs",
                f"{percentile(samples[preallocate], 0.99) * 1e6:.0f} µs",
                fmt_bytes(allocated[preallocate]),
            ])  # fmt: skip
    table = markdown_table(
        ["record", "written", "records", "append + fdatasync (median)", "p99",
         "file allocated at the end"],
        rows,
    )  # fmt: skip
    ratios = ", ".join(
        f"{medians[size, True] / medians[size, False]:.2f}x at {fmt_bytes(size)}"
        for size in RECORD_SIZES
    )
    section = "\n".join([
        HEADING, "",
        f"Command: `python bench/journal_fsync.py`. Measured {machine_facts()}, in the "
        f"directory of `BENCH_DIR` (default: the system's temporary directory), "
        f"{args.rounds} interleaved rounds of {args.records:,} records each way.", "",
        "Every acknowledged mutation waits for one journal append and one fdatasync. An",
        "append that grows the file makes the fdatasync commit the file's new size too (on",
        "ext4, a transaction of its journal); a record written into zeros the file already",
        "holds needs its data flushed only. Open journals keep zero-filled space after",
        "their last record (docs/storage.md, \"Preallocation\"), 1/8 of their size and at",
        "most 1 MiB, and extend it when a record reaches its end: that append grows the file.",
        "",
        table, "",
        f"Preallocated / appended, median latency: {ratios}.",
    ])  # fmt: skip
    print(section)
    if not args.quick:
        write_section(HEADING, section + "\n")
        print(f"wrote {Path(__file__).resolve().parent.parent / 'docs' / 'benchmarks.md'}")


if __name__ == "__main__":
    main()
