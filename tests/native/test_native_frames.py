"""zstd and object frames: native == reference.

zstd output bytes may differ between the `zstandard` package and the Rust
`zstd` crate, so payloads are compared by round trips and cross-decoding
(each side decodes what the other encoded); frame headers must be equal.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import reference as ref
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import json_bytes, payloads

from stratad.errors import CorruptObjectError, DecompressionLimitError, InvalidArgumentError

native = pytest.importorskip("stratad.native")

H = ref.FRAME_HEADER_SIZE
levels = st.one_of(st.integers(-7, 12), st.sampled_from([0, 19, 22]))
small_payloads = st.one_of(st.binary(max_size=1500), json_bytes.filter(lambda b: len(b) < 3000))


def test_constants() -> None:
    assert native.FRAME_HEADER_SIZE == H
    assert native.FORMAT_VERSION == ref.FORMAT_VERSION


# -- compress / decompress ----------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(payloads, levels)
def test_compress_round_trip_and_cross_decode(data: bytes, level: int) -> None:
    packed = native.compress(data, level)
    assert zstandard.frame_content_size(packed) == len(data)  # content size recorded
    assert native.decompress(packed, len(data)) == data
    assert ref.decompress(packed, len(data)) == data
    assert native.decompress(ref.compress(data, level), len(data)) == data


@settings(max_examples=80, deadline=None)
@given(payloads.filter(bool), st.booleans())
def test_decompress_cap(data: bytes, record_size: bool) -> None:
    # Frames without a recorded size must be capped while decoding.
    packed = zstandard.ZstdCompressor(write_content_size=record_size).compress(data)
    assert native.decompress(packed, len(data)) == data
    assert native.decompress(packed, len(data) + 1000) == data
    for impl in (native, ref):
        with pytest.raises(DecompressionLimitError):
            impl.decompress(packed, len(data) - 1)


def test_decompress_bomb_is_capped() -> None:
    packed = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 << 20))
    assert len(packed) < 10_000
    with pytest.raises(DecompressionLimitError):
        native.decompress(packed, 1 << 20)


@settings(max_examples=80, deadline=None)
@given(payloads.filter(lambda b: len(b) > 8), st.data())
def test_decompress_malformed(data: bytes, draw: st.DataObject) -> None:
    packed = native.compress(data)
    cut = draw.draw(st.integers(0, len(packed) - 1), label="truncate at")
    for impl in (native, ref):
        with pytest.raises(CorruptObjectError):
            impl.decompress(packed[:cut], len(data))
    garbage = draw.draw(st.binary(max_size=100).filter(lambda b: b[:4] != packed[:4]))
    with pytest.raises(CorruptObjectError):
        native.decompress(garbage, 1 << 20)


@pytest.mark.parametrize("level", [23, 100, ref.ZSTD_MIN_LEVEL - 1, -(1 << 31)])
def test_bad_level(level: int) -> None:
    with pytest.raises(InvalidArgumentError):
        native.compress(b"abc" * 100, level)
    with pytest.raises(InvalidArgumentError):
        native.encode_frame(b"abc" * 100, level)


def test_extreme_levels_accepted() -> None:
    data = b"abc" * 1000
    for level in (ref.ZSTD_MIN_LEVEL, ref.ZSTD_MAX_LEVEL):
        assert native.decompress(native.compress(data, level), len(data)) == data


# -- frames -------------------------------------------------------------------


def _codec_consistent(frame: bytes, data: bytes, level: int) -> None:
    """Codec rule: zstd only when it is smaller, raw bytes otherwise."""
    if frame[5] == ref.CODEC_RAW:
        assert frame[H:] == data
        assert len(native.compress(data, level)) >= len(data)
    else:
        assert frame[5] == ref.CODEC_ZSTD
        assert len(frame) - H < len(data)
        assert zstandard.ZstdDecompressor().decompress(frame[H:]) == data


@settings(max_examples=150, deadline=None)
@given(payloads, levels)
def test_frame_round_trip(data: bytes, level: int) -> None:
    frame = native.encode_frame(data, level)
    theirs = ref.encode_frame(data, level)
    assert frame[:H] == theirs[:H]
    _codec_consistent(frame, data, level)
    digest = ref.digest_hex(data)
    for impl in (native, ref):
        assert impl.decode_frame(frame, len(data)) == data
        assert impl.decode_frame(theirs, len(data)) == data
        assert impl.verify_frame(frame, len(data)) == digest
        assert impl.frame_digest_hex(frame) == digest


@settings(max_examples=60, deadline=None)
@given(payloads.filter(bool))
def test_frame_size_limit(data: bytes) -> None:
    frame = native.encode_frame(data)
    for impl in (native, ref):
        with pytest.raises(DecompressionLimitError):
            impl.decode_frame(frame, len(data) - 1)
        with pytest.raises(DecompressionLimitError):
            impl.verify_frame(frame, len(data) - 1)


def _flip_each_byte(frame: bytes, xor: int) -> list[tuple[int, bytes]]:
    return [(i, frame[:i] + bytes([frame[i] ^ xor]) + frame[i + 1 :]) for i in range(len(frame))]


def _caught(impl: ModuleType, bad: bytes, data: bytes) -> bool:
    """True when decoding bad raises; otherwise it must give exactly data."""
    try:
        out = impl.decode_frame(bad, 1 << 30)
    except CorruptObjectError:
        with pytest.raises(CorruptObjectError):
            impl.verify_frame(bad, 1 << 30)
        return True
    assert out == data
    assert impl.verify_frame(bad, 1 << 30) == ref.digest_hex(data)
    return False


flip_payloads = st.one_of(st.binary(max_size=800), json_bytes.filter(lambda b: len(b) < 1500))


@settings(max_examples=25, deadline=None)
@given(flip_payloads, st.integers(1, 255), levels)
def test_every_single_byte_flip_is_caught(data: bytes, xor: int, level: int) -> None:
    """Flip each byte in turn: CorruptObjectError, never wrong data.

    The header and a raw payload have no slack, so there a flip always
    raises. A zstd payload has a little (padding bits of its entropy-coded
    streams): a flip there may decode to the same bytes, which the digest
    then vouches for.
    """
    frame = native.encode_frame(data, level)
    for pos, bad in _flip_each_byte(frame, xor):
        for impl in (native, ref):
            caught = _caught(impl, bad, data)
            assert caught or (pos >= H and frame[5] == ref.CODEC_ZSTD)
            if pos < H:  # the header check covers the whole header
                with pytest.raises(CorruptObjectError):
                    impl.frame_digest_hex(bad)


@settings(max_examples=25, deadline=None)
@given(flip_payloads, levels)
def test_every_truncation_is_caught(data: bytes, level: int) -> None:
    frame = native.encode_frame(data, level)
    for cut in range(len(frame)):
        for impl in (native, ref):
            with pytest.raises(CorruptObjectError):
                impl.decode_frame(frame[:cut], 1 << 30)
        if cut < H:
            with pytest.raises(CorruptObjectError):
                native.frame_digest_hex(frame[:cut])


@settings(max_examples=40, deadline=None)
@given(small_payloads, st.binary(min_size=1, max_size=16))
def test_trailing_bytes_are_caught(data: bytes, junk: bytes) -> None:
    frame = native.encode_frame(data)
    with pytest.raises(CorruptObjectError):
        native.decode_frame(frame + junk, 1 << 30)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_is_not_a_frame(garbage: bytes) -> None:
    for impl in (native, ref):
        with pytest.raises(CorruptObjectError):
            impl.decode_frame(garbage, 1 << 30)


def _reheader(frame: bytes, **fields: int) -> bytes:
    """A frame with header fields changed and a *valid* header check."""
    head = bytearray(frame[:48])
    if "version" in fields:
        head[4] = fields["version"]
    if "codec" in fields:
        head[5] = fields["codec"]
    if "flags" in fields:
        head[6:8] = fields["flags"].to_bytes(2, "little")
    if "length" in fields:
        head[8:16] = fields["length"].to_bytes(8, "little")
    return bytes(head) + ref.digest(bytes(head))[:4] + frame[H:]


@pytest.mark.parametrize(
    "fields",
    [{"version": 0}, {"version": 2}, {"codec": 2}, {"codec": 255}, {"flags": 1},
     {"flags": 0x8000}, {"codec": ref.CODEC_RAW}, {"length": 1}, {"length": 5001}],
)  # fmt: skip
def test_well_checked_but_wrong_headers(fields: dict[str, int]) -> None:
    # A header with a valid check but wrong content must still be refused.
    data = b"compressible " * 400
    frame = _reheader(native.encode_frame(data), **fields)
    for impl in (native, ref):
        with pytest.raises(CorruptObjectError):
            impl.decode_frame(frame, 1 << 30)


def test_huge_declared_length_is_a_limit_not_an_allocation() -> None:
    frame = _reheader(native.encode_frame(b"x" * 100), length=(1 << 64) - 1)
    with pytest.raises(DecompressionLimitError):
        native.decode_frame(frame, 1 << 30)
