"""Digests and FastCDC boundaries: native == reference."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import chunk_sizes, json_bytes, payloads

from stratad.errors import InvalidArgumentError

native = pytest.importorskip("stratad.native")


def _workload() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "_workload.py"
    spec = importlib.util.spec_from_file_location("_workload", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _defaults() -> tuple[int, int, int]:
    return native.DEFAULT_MIN_CHUNK, native.DEFAULT_AVG_CHUNK, native.DEFAULT_MAX_CHUNK


def _assert_covers(bounds: list[tuple[int, int]], size: int, sizes: tuple[int, int, int]) -> None:
    """Chunks tile the input in order; all but the last respect min and max."""
    min_size, _, max_size = sizes
    pos = 0
    for i, (offset, length) in enumerate(bounds):
        assert offset == pos
        assert 0 < length <= max_size
        if i < len(bounds) - 1:
            assert length >= min_size
        pos += length
    assert pos == size


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=5000))
def test_digests(data: bytes) -> None:
    assert native.digest_hex(data) == ref.digest_hex(data)


def test_digest_known_answer() -> None:
    # BLAKE3 of the empty input, from the BLAKE3 test vectors.
    empty = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert native.digest_hex(b"") == empty


@settings(max_examples=120, deadline=None)
@given(payloads, chunk_sizes())
def test_boundaries_match_reference(data: bytes, sizes: tuple[int, int, int]) -> None:
    bounds = native.chunk_boundaries(data, *sizes)
    assert [tuple(b) for b in bounds] == ref.chunk_boundaries(data, *sizes)
    _assert_covers(bounds, len(data), sizes)


@settings(max_examples=40, deadline=None)
@given(st.lists(json_bytes, min_size=1, max_size=30).map(b"\n".join))
def test_boundaries_structured_json_defaults(data: bytes) -> None:
    assert native.chunk_boundaries(data) == ref.chunk_boundaries(data, *_defaults())


def test_boundaries_large_workload() -> None:
    # About 1 MB of the growing-conversation JSON with the default sizes.
    data = _workload().state_of_size(1_000_000)
    bounds = native.chunk_boundaries(data)
    assert bounds == ref.chunk_boundaries(data, *_defaults())
    _assert_covers(bounds, len(data), _defaults())
    assert len(bounds) > 1


def test_boundaries_edge_lengths() -> None:
    sizes = (64, 256, 1024)
    for n in (0, 1, 63, 64, 65, 66, 255, 256, 1023, 1024, 1025, 1026, 2049):
        data = bytes(range(256)) * 9
        assert native.chunk_boundaries(data[:n], *sizes) == ref.chunk_boundaries(data[:n], *sizes)
        zeros = bytes(n)
        assert native.chunk_boundaries(zeros, *sizes) == ref.chunk_boundaries(zeros, *sizes)


def test_default_sizes_valid() -> None:
    ref.check_chunk_sizes(*_defaults())


_BAD_SIZES = [
    (62, 256, 1024),
    (65, 256, 1024),
    (64, 254, 1024),
    (64, 257, 1024),
    (64, 256, 1022),
    (64, 256, 1025),
    (2048, 1024, 4096),
    (64, 8192, 4096),
    (1_048_578, 4_194_304, 16_777_216),
    (64, 4_194_306, 16_777_216),
    (64, 256, 16_777_218),
    (0, 256, 1024),
    (-64, 256, 1024),
]


@pytest.mark.parametrize("sizes", _BAD_SIZES)
def test_bad_sizes_rejected(sizes: tuple[int, int, int]) -> None:
    with pytest.raises(InvalidArgumentError):
        native.chunk_boundaries(b"x" * 5000, *sizes)
