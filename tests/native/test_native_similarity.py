"""Tokenization: native == reference.

Jaccard similarity and top-k are held to the reference through the crystal
index (test_native_crystal_index.py), the only index stratad uses.
"""

from __future__ import annotations

import pytest
import reference as ref
from hypothesis import given, settings
from strategies import any_text

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
