"""Tokenization, Jaccard similarity, top-k and JaccardIndex: native == reference."""

from __future__ import annotations

import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import any_text, token_lists

native = pytest.importorskip("stratad.native")


@settings(max_examples=300, deadline=None)
@given(any_text)
def test_tokenize(text: str) -> None:
    assert native.tokenize(text) == ref.tokenize(text)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", []),
        ("Deploy {file_path} to {URL}", ["deploy", "{file_path}", "to", "{url}"]),
        ("Hello, HELLO hello!", ["hello"]),
        ("snake_case and CamelCase9", ["snake_case", "and", "camelcase9"]),
        ("x{N}y {} {a-b}", ["x", "{n}", "y", "a", "b"]),
        ("{{N}}", ["{n}"]),
        ("caf\u00e9 na\u00efve", ["caf", "na", "ve"]),
        ("\u212a \u0130stanbul", ["stanbul"]),  # Kelvin sign and dotted I are not ASCII
        ("\u0663\u00b2 12", ["12"]),  # non-ASCII digits separate tokens
    ],
)
def test_tokenize_vectors(text: str, tokens: list[str]) -> None:
    assert ref.tokenize(text) == tokens
    assert native.tokenize(text) == tokens


@settings(max_examples=300, deadline=None)
@given(token_lists, token_lists)
def test_jaccard_exact(a: list[str], b: list[str]) -> None:
    score = native.jaccard(a, b)
    assert type(score) is float
    assert score == ref.jaccard(a, b)  # exact: both divide the same two integers
    assert native.jaccard(b, a) == score


def test_jaccard_vectors() -> None:
    assert native.jaccard([], []) == 0.0
    assert native.jaccard(["a"], []) == 0.0
    assert native.jaccard(["a", "a", "b"], ["b", "a"]) == 1.0
    assert native.jaccard(["a", "b", "c"], ["c", "d"]) == 0.25
    assert native.jaccard(("a", "b", "c"), ["a"]) == 1 / 3


@settings(max_examples=200, deadline=None)
@given(token_lists, st.lists(token_lists, max_size=30), st.integers(0, 40))
def test_top_k(query: list[str], corpus: list[list[str]], k: int) -> None:
    got = [(int(i), s) for i, s in native.top_k(query, corpus, k)]
    assert got == ref.top_k(query, corpus, k)


def test_top_k_ordering() -> None:
    corpus = [["a", "b"], ["a"], ["c"], ["a", "b"], [], ["b", "a", "x"]]
    want = [(0, 1.0), (3, 1.0), (1, 0.5), (5, 2 / 3)]
    want.sort(key=lambda hit: (-hit[1], hit[0]))
    assert native.top_k(["a", "b"], corpus, 10) == want
    assert native.top_k(["a", "b"], corpus, 2) == want[:2]
    assert native.top_k(["a", "b"], corpus, 0) == []
    assert native.top_k([], corpus, 10) == []


keys = st.integers(0, 40)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), keys, token_lists),
        st.tuples(st.just("remove"), keys),
        st.tuples(st.just("query"), token_lists, st.integers(0, 12)),
        st.tuples(st.just("contains"), keys),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_jaccard_index(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """Random add/remove/replace/query sequences give the same answers."""
    mine, theirs = native.JaccardIndex(), ref.JaccardIndex()
    for op in ops:
        if op[0] == "add":
            mine.add(op[1], op[2])
            theirs.add(op[1], op[2])
        elif op[0] == "remove":
            assert mine.remove(op[1]) == theirs.remove(op[1])
        elif op[0] == "query":
            assert mine.top_k(op[1], op[2]) == theirs.top_k(op[1], op[2])
        else:
            assert (op[1] in mine) == (op[1] in theirs)
        assert len(mine) == len(theirs)


def test_jaccard_index_replace_and_remove() -> None:
    index = native.JaccardIndex()
    index.add(7, ["deploy", "app"])
    index.add(3, ["deploy", "app"])
    index.add(9, ["unrelated"])
    assert index.top_k(["deploy", "app"], 5) == [(3, 1.0), (7, 1.0)]
    index.add(7, ["deploy"])  # replaces, does not merge
    assert len(index) == 3
    assert index.top_k(["deploy", "app"], 5) == [(3, 1.0), (7, 0.5)]
    index.add(3, [])  # still present, but shares no token
    assert 3 in index
    assert index.top_k(["deploy", "app"], 5) == [(7, 0.5)]
    assert index.remove(7) is True
    assert index.remove(7) is False
    assert 7 not in index
    assert index.top_k(["deploy", "app"], 5) == []
    assert len(index) == 2
