"""Rust core (`stratad.native`) against the best Python stacks.

    python bench/native.py           # full run, writes docs/benchmarks.md
    python bench/native.py --quick   # smoke run, prints only

(a) chunk + digest + frame (zstd) of the growing-conversation JSON
    (docs/design.md) at 1 MB and 16 MB. Python stacks: the `fastcdc`
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
import gc
import heapq
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
from _report import DOC, fmt_time, machine_facts, markdown_table, write_section  # noqa: E402
from fastcdc.fastcdc_cy import fastcdc_cy  # noqa: E402
from fastcdc.fastcdc_py import fastcdc_py  # noqa: E402

from stratad import native  # noqa: E402

HEADING = "## Native core (bench/native.py)"
MB = 1_000_000


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def measure_all(
    fns: dict[str, Callable[[], object]], reps: int, budget: float = 20.0
) -> dict[str, float]:
    """Median seconds of each fn, run in rotation so that drift of a shared
    machine hits all of them alike; a fn that has used up its time budget
    stops after 3 runs (pure-Python runs take seconds)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            if len(times[name]) >= 3 and sum(times[name]) > budget:
                continue
            gc.collect()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


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
            fmt_time(self.python),
            fmt_time(self.rust),
            f"{self.speedup:.1f}x",
            target,
            met,
        ]


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
        return [self.phase, self.size, fmt_time(self.python), fmt_time(self.rust), speedup]


def bench_chunking(sizes_mb: Sequence[int], reps: int) -> tuple[list[Row], list[Phase]]:
    rows: list[Row] = []
    phases: list[Phase] = []
    for size_mb in sizes_mb:
        data = _workload.state_of_size(size_mb * MB)
        _check_reference_agrees(data)
        label = f"{size_mb} MB"
        fns = {"rust": lambda d=data: native.prepare_chunks(d)} | python_stacks(data)
        fns |= phase_fns(data)
        t = measure_all(fns, reps)
        for name in python_stacks(data):
            rows.append(Row(f"(a) chunk+digest+frame vs {name}", label, t[name], t["rust"], 10))
        label = f"{label}, {len(native.chunk_boundaries(data))} chunks"
        for phase in ("chunk", "digest every chunk", "zstd level 3 every chunk"):
            phases.append(Phase(phase, label, t[f"py {phase}"], t[f"rs {phase}"]))
        cython = "fastcdc Cython + blake3 + zstandard"
        phases.append(Phase("all (prepare_chunks)", label, t[cython], t["rust"]))
    return rows, phases


def python_stacks(data: bytes) -> dict[str, Callable[[], object]]:
    return {
        "fastcdc Cython + blake3 + zstandard": lambda: python_prepare(data, cython_chunker),
        "fastcdc pure Python + blake3 + zstandard": lambda: python_prepare(data, pure_chunker),
        "reference port (pure Python v2020)": lambda: ref.prepare_chunks(data, 3, *SIZES),
    }


def _check_reference_agrees(data: bytes) -> None:
    mine = [(c.digest, c.offset, c.length) for c in native.prepare_chunks(data)]
    theirs = [(c.digest, c.offset, c.length) for c in ref.prepare_chunks(data, 3, *SIZES)]
    assert mine == theirs, "native and reference chunk differently"


def phase_fns(data: bytes) -> dict[str, Callable[[], object]]:
    """Each phase of (a) alone, to show where the time goes."""
    pieces = [data[o : o + n] for o, n in native.chunk_boundaries(data)]
    cctx = zstandard.ZstdCompressor(level=3)  # reused, like prepare_chunks' context
    return {
        "py chunk": lambda: cython_chunker(data),
        "rs chunk": lambda: native.chunk_boundaries(data),
        "py digest every chunk": lambda: [blake3.blake3(p).digest() for p in pieces],
        "rs digest every chunk": lambda: [native.digest(p) for p in pieces],
        "py zstd level 3 every chunk": lambda: [cctx.compress(p) for p in pieces],
        "rs zstd level 3 every chunk": lambda: [native.compress(p, 3) for p in pieces],
    }


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
        few = qs[:5]  # top_k(list) converts the whole corpus on every call: slow
        t = measure_all(
            {
                "rust": lambda q=qs, i=index: [i.top_k(x, 10) for x in q],
                "loop": lambda q=qs, s=sets: [python_loop_top_k(x, s, 10) for x in q],
                "pyindex": lambda q=qs, p=py_index: [p.top_k(x, 10) for x in q],
                "list": lambda q=few, d=docs: [native.top_k(x, d, 10) for x in q],
            },
            reps,
        )
        rust, loop = t["rust"] / len(qs), t["loop"] / len(qs)
        rows += [
            Row("(b) Jaccard top-10, Rust index vs Python loop", label, loop, rust, 20),
            Row(
                "(b) Jaccard top-10, Rust index vs Python inverted index",
                label,
                t["pyindex"] / len(qs),
                rust,
                None,
            ),
            Row(
                "(b) Jaccard top-10, Rust top_k(list) vs Python loop",
                label,
                loop,
                t["list"] / len(few),
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
    t = measure_all(
        {
            "python": lambda: [ref.generalize_goal(g) for g in sample],
            "rust": lambda: [native.generalize_goal(g) for g in sample],
        },
        reps,
    )
    python, rust = t["python"], t["rust"]
    label = f"{count // 1000}k goals" if count >= 1000 else f"{count} goals"
    return [Row("(c) generalize_goal", label, python, rust, 5)]


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def explain_chunking(rows: Sequence[Row], phases: Sequence[Phase]) -> str:
    """Why (a) misses its target, from the measured phases (empty if it does not)."""
    missed = [r for r in rows if r.operation.startswith("(a)") and r.speedup < (r.target or 0)]
    if not missed:
        return ""
    by = {(p.phase, p.size): p for p in phases}
    size = phases[-1].size  # the largest input
    total, zstd = by[("all (prepare_chunks)", size)], by[("zstd level 3 every chunk", size)]
    chunk, digest = by[("chunk", size)], by[("digest every chunk", size)]
    floor = zstd.python + chunk.rust + digest.rust  # zstd cannot get faster in Rust
    return (
        "**Why (a) misses 10x against the Cython stack.** That stack is compiled code "
        f"end to end. At {size}, zstd level 3 takes {fmt_time(zstd.python)} of its "
        f"{fmt_time(total.python)}, and it is the same libzstd 1.5 that the Rust core "
        "links (the `zstandard` wheel and the `zstd` crate both build it from C), at "
        "the same speed once a context is reused; chunking (Cython "
        f"{fmt_time(chunk.python)}) and BLAKE3 (the `blake3` package, itself Rust, "
        f"{fmt_time(digest.python)}) are native too. A single-threaded core can at best "
        f"take {fmt_time(floor)} (Python's zstd time plus Rust's chunking and digests), "
        f"{total.python / floor:.1f}x faster; the Rust core removes the per-chunk Python "
        "loop and framing, which is the rest of the gap. Against the pure-Python chunkers, "
        f"where the chunker dominates, (a) is {_speedups(rows, 'fastcdc pure Python')} "
        f"faster than the `fastcdc` package's pure-Python mode and "
        f"{_speedups(rows, 'reference port')} faster than the reference port. 10x against "
        f"the Cython stack means {fmt_time(total.python / 10)}, below zstd level 3's own "
        "time even if `prepare_chunks` (single-threaded today) compressed on both cores; "
        "a cheaper level would not help either, since it speeds up both stacks alike. "
        "The target holds against a pure-Python chunker, not against compiled Python "
        "libraries."
    )


def general_notes(phases: Sequence[Phase]) -> str:
    zstd = [p for p in phases if p.phase == "zstd level 3 every chunk"]
    slower = zstd and zstd[-1].rust > zstd[-1].python
    return "\n\n".join(
        [
            "The `top_k(list)` rows are for information: that form converts every token "
            "list of the corpus from Python on each call, so repeated queries belong in a "
            "`JaccardIndex`, which converts each set once when it is added.",
        ]
        + (
            [
                "In the phase table, Rust's zstd row calls `native.compress` once per "
                "chunk, and each call creates a fresh zstd context (about 8 µs), while the "
                "Python row reuses one `ZstdCompressor`; `prepare_chunks` reuses one "
                "context for all chunks, so the difference does not reach (a)."
            ]
            if slower
            else []
        )
    )


def _speedups(rows: Sequence[Row], needle: str) -> str:
    picked = [r for r in rows if r.operation.startswith("(a)") and needle in r.operation]
    sizes = "/".join(r.size for r in picked)
    return "/".join(f"{r.speedup:.0f}x" for r in picked) + f" ({sizes})"


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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, no doc")
    args = parser.parse_args(argv)
    reps = 2 if args.quick else 7
    rows, phases = bench_chunking([1] if args.quick else [1, 16], reps)
    rows += bench_jaccard([10_000] if args.quick else [10_000, 100_000], reps)
    rows += bench_generalize(1000 if args.quick else 10_000, reps)
    notes = "\n\n".join(filter(None, [explain_chunking(rows, phases), general_notes(phases)]))
    section = report(rows, phases, notes)
    print(section)
    if not args.quick:
        write_section(HEADING, section)
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
