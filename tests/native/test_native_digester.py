"""Digests fed piece by piece (`Digester`) and common prefixes of byte strings.

The SDK and the daemon resume a growing state's digest from a copy taken
where its unchanged prefix ends: any split of the input, and any copy taken
along the way, must give the one-shot BLAKE3 digest of the reference.
"""

from __future__ import annotations

import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import payloads

native = pytest.importorskip("stratad.native")


@settings(max_examples=150, deadline=None)
@given(payloads, st.lists(st.integers(0, 20_000), max_size=6))
def test_any_split_and_copy_give_the_one_shot_digest(data: bytes, splits: list[int]) -> None:
    points = sorted({min(s, len(data)) for s in splits})
    digester = native.Digester()
    copies = []
    position = 0
    for point in points:
        digester.update(data[position:point])
        position = point
        copies.append((point, digester.copy()))
    digester.update(data[position:])
    assert digester.hexdigest() == ref.digest_hex(data)
    assert digester.count == len(data)
    for point, copy in copies:
        assert copy.count == point
        assert copy.hexdigest() == ref.digest_hex(data[:point])  # a copy is independent
        copy.update(data[point:])
        assert copy.hexdigest() == ref.digest_hex(data)


def test_large_updates_and_the_empty_digest() -> None:
    assert native.Digester().hexdigest() == ref.digest_hex(b"")
    big = bytes(range(256)) * 4096  # 1 MiB: hashed with the GIL released
    digester = native.Digester()
    digester.update(big)
    digester.update(b"")
    assert digester.hexdigest() == ref.digest_hex(big)
    with pytest.raises(TypeError):
        digester.update("text")  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(payloads, payloads)
def test_common_prefix_length(a: bytes, b: bytes) -> None:
    n = native.common_prefix_length(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]
    assert native.common_prefix_length(a, a + b) == len(a)
