"""Rust core (`stratad.native`) against the best Python stacks.

    python bench/native.py           # full run, writes docs/benchmarks.md
    python bench/native.py --quick   # smoke run, prints only

(a) chunk + digest + frame (zstd) of the growing-conversation JSON
    (DESIGN.md section 8) at 1 MB and 16 MB. Python stacks: the `fastcdc`
    package's Cython chunker (the fastest Python option; it also ships a
    pure-Python one, measured too) + `blake3` + `zstandard`, and the
    pure-Python port of fastcdc v2020 in tests/native/reference.py.
(b) Jaccard top-10 over 10k and 100k goal-like token sets. Python baseline:
    a loop over every set with set intersection; also a Python inverted index.
(c) generalize_goal over 10k goals. Python: the `re`-based reference.

Every timing is the median of several repetitions; pure-Python runs that take
seconds get fewer repetitions (a time budget per measurement).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import heapq
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "native"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _workload  # noqa: E402
import reference as ref  # noqa: E402
from fastcdc.fastcdc_cy import fastcdc_cy  # noqa: E402
from fastcdc.fastcdc_py import fastcdc_py  # noqa: E402
from stratad import native  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
HEADING = "## Native core (bench/native.py)"
DOC_INTRO = (
    "# Benchmarks\n\n"
    "Numbers measured by the scripts under `bench/`, each of which prints a table and "
    "rewrites its own section below. They are medians over repetitions on a shared "
    "2-core machine, so treat differences under about 1.5x as noise; rerun a script "
    "to refresh its section.\n"
)
MB = 1_000_000


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def measure(fn: Callable[[], object], reps: int, budget: float = 20.0) -> float:
    """Median seconds of fn over up to reps runs (fewer if budget is spent)."""
    times: list[float] = []
    spent = 0.0
    while len(times) < reps and (not times or spent < budget):
        gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return statistics.median(times)


@dataclass
class Row:
    operation: str
    size: str
    python: float
    rust: float
    target: float | None

    @property
    def speedup(self) -> float:
        return self.python / self.rust

    def cells(self) -> list[str]:
        target = f">= {self.target:g}x" if self.target else "(info)"
        met = "" if not self.target else ("yes" if self.speedup >= self.target else "**no**")
        return [
            self.operation,
            self.size,
            _fmt_time(self.python),
            _fmt_time(self.rust),
            f"{self.speedup:.1f}x",
            target,
            met,
        ]


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------
# (a) chunk + digest + frame
# --------------------------------------------------------------------------

SIZES = (native.DEFAULT_MIN_CHUNK, native.DEFAULT_AVG_CHUNK, native.DEFAULT_MAX_CHUNK)
Chunker = Callable[[bytes], list[tuple[int, int]]]


def cython_chunker(data: bytes) -> list[tuple[int, int]]:
    return [(c.offset, c.length) for c in fastcdc_cy(data, *SIZES)]


def pure_chunker(data: bytes) -> list[tuple[int, int]]:
    return [(c.offset, c.length) for c in fastcdc_py(data, *SIZES)]


def python_prepare(data: bytes, chunker: Chunker) -> list[tuple[str, int, int, bytes]]:
    """prepare_chunks with Python libraries: same frames, other chunker."""
    cctx = zstandard.ZstdCompressor(level=3)  # reused, as a server would
    view = memoryview(data)
    out = []
    for offset, length in chunker(data):
        piece = view[offset : offset + length]
        digest = blake3.blake3(piece).digest()
        packed = cctx.compress(piece)
        codec, payload = (1, packed) if len(packed) < length else (0, bytes(piece))
        head = b"STRD\x01" + bytes([codec]) + b"\0\0" + length.to_bytes(8, "little") + digest
        frame = head + blake3.blake3(head).digest()[:4] + payload
        out.append((digest.hex(), offset, length, frame))
    return out


@dataclass
class Phase:
    phase: str
    size: str
    python: float
    rust: float

    def cells(self) -> list[str]:
        speedup = f"{self.python / self.rust:.1f}x"
        return [self.phase, self.size, _fmt_time(self.python), _fmt_time(self.rust), speedup]


def bench_chunking(sizes_mb: Sequence[int], reps: int) -> tuple[list[Row], list[Phase]]:
    rows: list[Row] = []
    phases: list[Phase] = []
    for size_mb in sizes_mb:
        data = _workload.state_of_size(size_mb * MB)
        label = f"{size_mb} MB"
        rust = measure(lambda d=data: native.prepare_chunks(d), reps)
        for name, fn in python_stacks(data):
            python = measure(fn, reps)
            rows.append(Row(f"(a) chunk+digest+frame vs {name}", label, python, rust, 10))
        _check_reference_agrees(data)
        phases += profile_chunking(data, label, reps)
    return rows, phases


def python_stacks(data: bytes) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("fastcdc Cython + blake3 + zstandard", lambda: python_prepare(data, cython_chunker)),
        ("fastcdc pure Python + blake3 + zstandard", lambda: python_prepare(data, pure_chunker)),
        ("reference port (pure Python v2020)", lambda: ref.prepare_chunks(data, 3, *SIZES)),
    ]


def _check_reference_agrees(data: bytes) -> None:
    mine = [(c.digest, c.offset, c.length) for c in native.prepare_chunks(data)]
    theirs = [(c.digest, c.offset, c.length) for c in ref.prepare_chunks(data, 3, *SIZES)]
    assert mine == theirs, "native and reference chunk differently"


def profile_chunking(data: bytes, label: str, reps: int) -> list[Phase]:
    """Time each phase alone, to show where (a) spends its time."""
    bounds = native.chunk_boundaries(data)
    pieces = [data[o : o + n] for o, n in bounds]
    label = f"{label}, {len(bounds)} chunks"
    cctx = zstandard.ZstdCompressor(level=3)
    rows = [
        ("chunk", lambda: cython_chunker(data), lambda: native.chunk_boundaries(data)),
        (
            "digest every chunk",
            lambda: [blake3.blake3(p).digest() for p in pieces],
            lambda: [native.digest(p) for p in pieces],
        ),
        (
            "zstd level 3 every chunk",
            lambda: [cctx.compress(p) for p in pieces],
            lambda: [native.compress(p, 3) for p in pieces],
        ),
        (
            "all (prepare_chunks)",
            lambda: python_prepare(data, cython_chunker),
            lambda: native.prepare_chunks(data),
        ),
    ]
    return [Phase(name, label, measure(py, reps), measure(rs, reps)) for name, py, rs in rows]


# --------------------------------------------------------------------------
# (b) Jaccard top-10
# --------------------------------------------------------------------------

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "de", "va", "ri", "gu", "zo", "fe")


def vocabulary(size: int, rng: random.Random) -> list[str]:
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4)))] = None
    return list(words)


def goal_token_sets(count: int, vocab: Sequence[str], rng: random.Random) -> list[list[str]]:
    """Goal-like sentences of 5-15 words, Zipf-distributed like real text, as token lists."""
    weights = [1 / (rank + 1) for rank in range(len(vocab))]
    return [
        list(dict.fromkeys(rng.choices(vocab, weights, k=rng.randint(5, 15)))) for _ in range(count)
    ]


def python_loop_top_k(query: Sequence[str], sets: Sequence[set[str]], k: int) -> list[Any]:
    """The straightforward baseline: score every set."""
    q = set(query)
    scored = []
    for i, s in enumerate(sets):
        inter = len(q & s)
        if inter:
            scored.append((-inter / (len(q) + len(s) - inter), i))
    return heapq.nsmallest(k, scored)


class PythonInvertedIndex:
    """Postings lists and a Counter of shared tokens per candidate."""

    def __init__(self, docs: Sequence[Sequence[str]]) -> None:
        self.lengths = [len(set(d)) for d in docs]
        self.postings: dict[str, list[int]] = {}
        for i, doc in enumerate(docs):
            for token in set(doc):
                self.postings.setdefault(token, []).append(i)

    def top_k(self, query: Sequence[str], k: int) -> list[Any]:
        q = set(query)
        shared = Counter(i for t in q for i in self.postings.get(t, ()))
        lq, lengths = len(q), self.lengths
        scored = ((-c / (lq + lengths[i] - c), i) for i, c in shared.items())
        return heapq.nsmallest(k, scored)


def bench_jaccard(counts: Sequence[int], reps: int, queries: int = 50) -> list[Row]:
    rng = random.Random(11)
    vocab = vocabulary(3000, rng)
    rows = []
    for count in counts:
        docs = goal_token_sets(count, vocab, rng)
        qs = goal_token_sets(queries, vocab, rng)
        sets = [set(d) for d in docs]
        index = native.JaccardIndex()
        for key, doc in enumerate(docs):
            index.add(key, doc)
        py_index = PythonInvertedIndex(docs)
        _check_top_k_agrees(index, sets, qs)
        label = f"{count // 1000}k sets"

        def per_query(fn: Callable[[list[str]], object], q: list[list[str]] = qs) -> float:
            return measure(lambda: [fn(x) for x in q], reps) / len(q)

        rust = per_query(lambda x, i=index: i.top_k(x, 10))
        loop = per_query(lambda x, s=sets: python_loop_top_k(x, s, 10))
        rows += [
            Row("(b) Jaccard top-10, Rust index vs Python loop", label, loop, rust, 20),
            Row(
                "(b) Jaccard top-10, Rust index vs Python inverted index",
                label,
                per_query(lambda x, p=py_index: p.top_k(x, 10)),
                rust,
                None,
            ),
            Row(
                "(b) Jaccard top-10, Rust top_k(list) vs Python loop",
                label,
                loop,
                per_query(lambda x, d=docs: native.top_k(x, d, 10), qs[:5]),
                None,
            ),
        ]
    return rows


def _check_top_k_agrees(index: Any, sets: Sequence[set[str]], queries: Sequence[list[str]]) -> None:
    for q in queries[:5]:
        want = [(i, -s) for s, i in python_loop_top_k(q, sets, 10)]
        assert index.top_k(q, 10) == want, "Rust and Python top-10 differ"


# --------------------------------------------------------------------------
# (c) goal generalization
# --------------------------------------------------------------------------

_TEMPLATES = (
    "Deploy {path} to {url}",
    "Process {n} records from {file} and write {file}",
    'Call {endpoint} with mode "{word}" and retry {n} times',
    "Summarize the quarterly revenue figures for {word} in {n} bullet points",
    "Fix the failing test in {path} after the {word} refactor",
    "Fetch {url} then parse it with {path}",
    "Compare {file} against {file} and report {n} differences",
    "Ask the user about {word} before calling {endpoint}",
)


def goals(count: int, rng: random.Random) -> list[str]:
    words = ("production", "staging", "billing", "search", "auth", "reports", "cache")
    fills = {
        "path": lambda: f"src/{rng.choice(words)}/{rng.choice(words)}_{rng.randint(1, 99)}.py",
        "url": lambda: f"https://{rng.choice(words)}.example.com:{rng.randint(1000, 9999)}/x?q=1",
        "file": lambda: (
            f"{rng.choice(words)}_{rng.randint(1, 999)}.{rng.choice(['csv', 'json', 'md'])}"
        ),
        "endpoint": lambda: f"/api/{rng.choice(words)}/{rng.choice(words)}",
        "n": lambda: str(rng.choice([rng.randint(1, 10_000), round(rng.random() * 100, 2)])),
        "word": lambda: rng.choice(words),
    }
    out = []
    for _ in range(count):
        text = rng.choice(_TEMPLATES)
        while "{" in text:
            start = text.index("{")
            name = text[start + 1 : text.index("}", start)]
            text = text[:start] + fills[name]() + text[start + len(name) + 2 :]
        out.append(text)
    return out


def bench_generalize(count: int, reps: int) -> list[Row]:
    sample = goals(count, random.Random(5))
    assert [native.generalize_goal(g) for g in sample[:200]] == [
        ref.generalize_goal(g) for g in sample[:200]
    ], "Rust and reference generalize differently"
    python = measure(lambda: [ref.generalize_goal(g) for g in sample], reps)
    rust = measure(lambda: [native.generalize_goal(g) for g in sample], reps)
    label = f"{count // 1000}k goals" if count >= 1000 else f"{count} goals"
    return [Row("(c) generalize_goal", label, python, rust, 5)]


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


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


def explain_chunking(rows: Sequence[Row], phases: Sequence[Phase]) -> str:
    """Why (a) misses its target, from the measured phases (empty if it does not)."""
    missed = [r for r in rows if r.operation.startswith("(a)") and r.speedup < (r.target or 0)]
    if not missed:
        return ""
    by = {(p.phase, p.size): p for p in phases}
    size = phases[-1].size  # the largest input
    total = by[("all (prepare_chunks)", size)]
    zstd = by[("zstd level 3 every chunk", size)]
    chunk = by[("chunk", size)]
    digest = by[("digest every chunk", size)]
    share = zstd.python / total.python
    return (
        f"Why (a) misses 10x against the Cython stack: that stack is native code "
        f"already. At {size}, zstd level 3 alone takes {_fmt_time(zstd.python)} of its "
        f"{_fmt_time(total.python)} ({share:.0%}), and it is the same libzstd (1.5.x) that the "
        f"Rust core calls ({_fmt_time(zstd.rust)} there); the Cython chunker "
        f"({_fmt_time(chunk.python)}) and the blake3 package ({_fmt_time(digest.python)}) are "
        f"compiled too. With compression identical on both sides, no single-threaded "
        f"implementation can be more than about {1 / share:.1f}x faster than this stack. "
        f"What the Rust core does remove is the Python loop over the chunks (one call for "
        f"all of them) and, above all, any pure-Python chunker: against the `fastcdc` "
        f"package's pure-Python mode and the reference port, (a) is "
        f"{_speedups(rows, 'fastcdc pure Python')} and {_speedups(rows, 'reference port')} faster. "
        "Reaching 10x against the Cython stack would take a cheaper codec setting "
        "(level 1 or negative levels) on both sides, or compressing chunks in parallel "
        "on more cores than this 2-core machine has."
    )


def _speedups(rows: Sequence[Row], needle: str) -> str:
    picked = [r for r in rows if r.operation.startswith("(a)") and needle in r.operation]
    return (
        "/".join(f"{r.speedup:.0f}x" for r in picked)
        + " ("
        + "/".join(r.size for r in picked)
        + ")"
    )


def report(rows: Sequence[Row], phases: Sequence[Phase], notes: str) -> str:
    headers = ("operation", "size", "python median", "rust median", "speedup", "target", "met?")
    parts = [
        HEADING,
        "",
        f"Command: `python bench/native.py`. Measured {machine_facts()}. Chunk sizes "
        f"{'/'.join(str(s) for s in SIZES)} (min/avg/max, the defaults), zstd level 3.",
        "",
        markdown_table(headers, [r.cells() for r in rows]),
    ]
    if phases:
        parts += [
            "",
            "Phases of (a), each timed alone (Python: Cython fastcdc, blake3, zstandard; "
            "Rust: one native call per chunk for digest and zstd):",
            "",
            markdown_table(
                ("phase", "size", "python", "rust", "speedup"), [p.cells() for p in phases]
            ),
        ]
    if notes:
        parts += ["", notes]
    return "\n".join(parts) + "\n"


def write_section(section: str) -> None:
    text = DOC.read_text() if DOC.exists() else DOC_INTRO
    start = text.find(HEADING)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(HEADING))
        rest = "" if end < 0 else "\n" + text[end + 1 :]
        text = text[:start] + section + rest
    DOC.write_text(text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, no doc")
    args = parser.parse_args(argv)
    reps = 2 if args.quick else 7
    rows, phases = bench_chunking([1] if args.quick else [1, 16], reps)
    rows += bench_jaccard([10_000] if args.quick else [10_000, 100_000], reps)
    rows += bench_generalize(1000 if args.quick else 10_000, reps)
    notes = explain_chunking(rows, phases)
    section = report(rows, phases, notes)
    print(section)
    if not args.quick:
        write_section(section)
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
