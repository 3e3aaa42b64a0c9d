"""The source tree stays one a newcomer can find their way in (docs/design.md "Layers").

- No hand-written source file in python/stratad or rust/ is over 1,000 lines:
  a file that grows past it holds more than one concern and is split by concern.
- No Rust crate has a circle between its modules (`use crate::a` in b and
  `use crate::b` in a, directly or through others). Python's circles and layers
  are checked by import-linter (`make lint`, contracts in pyproject.toml).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 1000
#: Generated code (protoc, grpcio-tools, mypy-protobuf): not written by hand.
GENERATED = (ROOT / "python" / "stratad" / "api",)


def hand_written_sources() -> list[Path]:
    files = [*(ROOT / "python" / "stratad").rglob("*.py"), *(ROOT / "rust").rglob("*.rs")]
    return sorted(
        f
        for f in files
        if not any(f.is_relative_to(g) for g in GENERATED) and "target" not in f.parts
    )


def test_the_walk_finds_the_sources() -> None:
    names = {f.relative_to(ROOT).as_posix() for f in hand_written_sources()}
    assert "python/stratad/cli.py" in names
    assert "rust/stratad-core/src/lib.rs" in names
    assert not any(n.startswith("python/stratad/api/") for n in names)


def test_no_hand_written_source_file_is_over_1000_lines() -> None:
    too_long = {
        f.relative_to(ROOT).as_posix(): n
        for f in hand_written_sources()
        if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"split these by concern (over {MAX_LINES} lines): {too_long}"


USE_CRATE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def module_of(src: Path, path: Path) -> str:
    """`similarity/search.rs` -> "similarity"; `frame.rs` -> "frame"; lib.rs -> ""."""
    parts = path.relative_to(src).with_suffix("").parts
    return "" if parts in (("lib",), ("main",)) else parts[0]


def crate_graph(src: Path) -> dict[str, set[str]]:
    """Top-level module -> the top-level modules it names through `crate::`."""
    graph: dict[str, set[str]] = {}
    for path in src.rglob("*.rs"):
        module = module_of(src, path)
        if not module:
            continue  # lib.rs declares and re-exports every module
        text = path.read_text(encoding="utf-8")
        used = {m for m in USE_CRATE.findall(text) if m != module}
        graph.setdefault(module, set()).update(used)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


CRATES = sorted(p.parent for p in (ROOT / "rust").glob("*/src/lib.rs"))


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("src", CRATES, ids=lambda p: p.parent.name)
def test_no_module_circles_in_rust_crates(src: Path) -> None:
    graph = crate_graph(src)
    assert graph, f"no modules found in {src}"
    cycle = find_cycle(graph)
    assert not cycle, f"{src.parent.name}: modules import each other: {' -> '.join(cycle)}"
