"""CrystalIndex (the crystal library's search structure): native == brute-force reference."""

from __future__ import annotations

import math

import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

native = pytest.importorskip("stratad.native")
errors = pytest.importorskip("stratad.errors")

# Small vocabularies, so that sets overlap, thresholds are hit exactly and
# scores tie often.
goal_tokens = st.lists(st.sampled_from([f"g{i}" for i in range(10)]), max_size=8)
tool_names = st.lists(st.sampled_from([f"t{i}" for i in range(6)]), max_size=5)
effectiveness = st.integers(0, 8).map(lambda n: n / 8)
thresholds = st.sampled_from([0.0, 0.25, 0.5, 0.7, 0.8, 1.0])
slots = st.integers(0, 30)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 50), goal_tokens, tool_names, effectiveness),
        st.tuples(st.just("remove"), slots),
        st.tuples(st.just("update"), slots, effectiveness, st.integers(0, 5)),
        st.tuples(st.just("query"), goal_tokens, st.integers(0, 8)),
        st.tuples(st.just("similar"), goal_tokens, tool_names, thresholds, thresholds),
        st.tuples(st.just("least"), st.one_of(st.none(), slots)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_crystal_index(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """Random add/remove/update/query/novelty/eviction sequences give the same answers."""
    mine, theirs = native.CrystalIndex(), ref.CrystalIndex()
    for op in ops:
        kind = op[0]
        if kind == "add":
            _, order, goal, tools, eff = op
            assert mine.add(order, goal, tools, eff, 0) == theirs.add(order, goal, tools, eff, 0)
        elif kind == "remove":
            assert mine.remove(op[1]) == theirs.remove(op[1])
        elif kind == "update":
            assert mine.update(op[1], op[2], op[3]) == theirs.update(op[1], op[2], op[3])
        elif kind == "query":
            assert mine.top_k(op[1], op[2]) == theirs.top_k(op[1], op[2])
        elif kind == "similar":
            assert mine.find_similar(*op[1:]) == theirs.find_similar(*op[1:])
        else:
            assert mine.least_effective(op[1]) == theirs.least_effective(op[1])
        assert len(mine) == len(theirs)
    assert mine.stats(0.5) == theirs.stats(0.5)


def test_boosted_ranking_is_exact() -> None:
    """A less similar but more effective crystal outranks a more similar, less effective one."""
    index = native.CrystalIndex()
    weak = index.add(0, ["deploy", "app", "to", "prod"], [], 0.0, 0)  # sim 1.0 -> 0.5
    strong = index.add(1, ["deploy", "app", "to"], [], 1.0, 0)  # sim 0.75 -> 0.75
    hits = index.top_k(["deploy", "app", "to", "prod"], 1)
    assert hits == [(strong, 0.75, 0.75)]
    assert index.top_k(["deploy", "app", "to", "prod"], 2) == [
        (strong, 0.75, 0.75),
        (weak, 0.5, 1.0),
    ]


def test_ties_rank_by_order() -> None:
    index = native.CrystalIndex()
    late = index.add(9, ["a"], [], 1.0, 0)
    early = index.add(3, ["a"], [], 1.0, 0)
    assert [slot for slot, _, _ in index.top_k(["a"], 5)] == [early, late]


def test_large_index_with_common_tokens() -> None:
    """Many entries share the common tokens (long lists, skipped at first); exact anyway."""
    index = native.CrystalIndex()
    for order in range(20_000):
        index.add(order, ["to", "the", f"w{order % 997}"], [], 0.5, 0)
    target = index.add(20_000, ["to", "the", "deploy", "staging"], [], 1.0, 0)
    hits = index.top_k(["deploy", "staging", "to", "the"], 3)
    assert hits[0] == (target, 1.0, 1.0)
    reference = ref.CrystalIndex()
    for order in range(20_000):
        reference.add(order, ["to", "the", f"w{order % 997}"], [], 0.5, 0)
    reference.add(20_000, ["to", "the", "deploy", "staging"], [], 1.0, 0)
    assert hits == reference.top_k(["deploy", "staging", "to", "the"], 3)


@pytest.mark.parametrize(
    ("goal", "tools", "found"),
    [
        (["g0", "g1", "g2", "g3", "g4", "g5", "g6"], ["t0", "t1", "t2", "t3", "t4"], False),
        (["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"], ["t0", "t1", "t2", "t3"], False),
        (["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"], ["t0", "t1", "t2", "t3", "t4"], True),
    ],
)
def test_novelty_thresholds_are_strict(goal: list[str], tools: list[str], found: bool) -> None:
    index = native.CrystalIndex()
    index.add(0, [f"g{i}" for i in range(10)], [f"t{i}" for i in range(5)], 0.7, 0)
    assert (index.find_similar(goal, tools, 0.7, 0.8) is not None) is found


def test_bad_arguments() -> None:
    index = native.CrystalIndex()
    for bad in (-0.1, 1.5, math.nan, math.inf):
        with pytest.raises(errors.InvalidArgumentError):
            index.add(0, ["a"], [], bad, 0)
    with pytest.raises(errors.InvalidArgumentError):
        index.add(-1, ["a"], [], 0.5, 0)
    with pytest.raises(errors.InvalidArgumentError):
        index.add(0, ["a"], [], 0.5, -1)
    slot = index.add(0, ["a"], [], 0.5, 0)
    with pytest.raises(errors.InvalidArgumentError):
        index.update(slot, 2.0, 0)
    with pytest.raises(errors.InvalidArgumentError):
        index.find_similar(["a"], [], 1.1, 0.5)
    with pytest.raises(errors.InvalidArgumentError):
        index.top_k(["a"], -1)
    assert index.update("x", 0.5, 0) is False
    assert index.remove(-1) is False
    assert "x" not in index
    assert index.least_effective(exclude=-5) == slot
    assert index.least_effective(exclude=slot) is None
    assert index.stats(0.5) == (1, 1, 0, 0.5)
    assert index.memory_usage() > 0
    # -0.0 is stored as 0.0 (eviction order is by the number, not the bits).
    zero = index.add(1, ["b"], [], -0.0, 0)
    assert index.least_effective() == zero
