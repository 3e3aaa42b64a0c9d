"""Shared by the benchmarks: markdown tables, machine facts, docs/benchmarks.md sections."""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
DOC_INTRO = (
    "# Benchmarks\n\n"
    "Numbers measured by the scripts under `bench/`, each of which prints a table and "
    "rewrites its own section below. They are medians over repetitions on a shared 2-core "
    "machine, so treat differences under about 1.5x as noise; rerun a script to refresh its "
    "section.\n"
)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine_facts() -> str:
    cpu = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{dt.date.today().isoformat()}, nproc {os.cpu_count()}, {cpu}, "
        f"Python {platform.python_version()}, {platform.system()} {platform.machine()}"
    )


def write_section(heading: str, section: str) -> None:
    """Replace (or append) the `## heading` section of docs/benchmarks.md."""
    text = DOC.read_text() if DOC.exists() else DOC_INTRO
    start = text.find(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(heading))
        rest = "" if end < 0 else "\n" + text[end + 1 :]
        text = text[:start] + section + rest
    DOC.write_text(text)


def disk_usage(path: Path) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of every file under `path`."""
    apparent = allocated = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated
