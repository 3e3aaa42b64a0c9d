"""Self-checks of the pure-Python reference, independent of the Rust build.

They pin the reference to its sources of truth (the fastcdc crate's tables
and test vectors, the frame layout of docs/native.md), so that agreement
between reference and native means agreement with the contract.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import reference as ref
import zstandard

from stratad.errors import CorruptObjectError, DecompressionLimitError, InvalidArgumentError

# BLAKE3 of the crate's GEAR table as 256 little-endian u64, taken from
# fastcdc 5.0.0 src/v2020/mod.rs.
GEAR_TABLE_BLAKE3 = "9af822d1e10df25d0157a43ccd0a73b56d1c1d0a5d77acb4e6e979522d0fe149"


def _crate_source() -> str | None:
    found = sorted(Path.home().glob(".cargo/registry/src/*/fastcdc-5.*/src/v2020/mod.rs"))
    return found[-1].read_text() if found else None


def _crate_table(source: str, name: str, size: int) -> list[int]:
    body = source.split(f"const {name}: [u64; {size}] = [")[1].split("];")[0]
    body = re.sub(r"//[^\n]*", "", body)
    return [int(x, 0) for x in re.findall(r"0x[0-9a-fA-F]+|\b\d+\b", body)]


def test_gear_table_digest() -> None:
    packed = b"".join(g.to_bytes(8, "little") for g in ref.GEAR)
    assert ref.digest_hex(packed) == GEAR_TABLE_BLAKE3
    assert tuple((g << 1) % 2**64 for g in ref.GEAR) == ref.GEAR_LS


def test_tables_match_crate_source() -> None:
    source = _crate_source()
    if source is None:
        pytest.skip("fastcdc crate source not in ~/.cargo/registry")
    assert tuple(_crate_table(source, "GEAR", 256)) == ref.GEAR
    assert tuple(_crate_table(source, "GEAR_LS", 256)) == ref.GEAR_LS
    masks = source.split("pub const MASKS: [u64; 26] = [")[1].split("];")[0]
    values = [int(v, 0) for v in re.findall(r"^\s*(0x[0-9a-fA-F]+|0),", masks, re.M)]
    assert tuple(values) == ref.MASKS


def test_crate_vectors() -> None:
    # test_cut_all_zeros and test_odd_tail_hash_not_stale of the crate.
    zeros = ref.chunk_hashes(bytes(10240), 64, 256, 1024)
    assert zeros == [(i * 1024, 1024, 14169102344523991076) for i in range(10)]
    tail = ref.chunk_hashes(bytes(1024 + 65), 64, 256, 1024)
    assert tail == [(0, 1024, 14169102344523991076), (1024, 65, ref.GEAR[0])]
    # test_size_hint_short_tail: a source shorter than min_size is one chunk.
    assert ref.chunk_boundaries(bytes(50), 64, 256, 1024) == [(0, 50)]
    assert ref.chunk_boundaries(b"", 64, 256, 1024) == []


@pytest.mark.parametrize(
    ("sizes", "small", "large"),
    [
        ((64, 256, 1024), 9, 7),
        ((8192, 16384, 32768), 15, 13),
        ((1_048_576, 4_194_304, 16_777_216), 23, 21),
        ((3072, 12288, 49152), 15, 13),  # log2(12288) = 13.58 rounds to 14
    ],
)
def test_select_masks(sizes: tuple[int, int, int], small: int, large: int) -> None:
    assert ref.select_masks(sizes[1]) == (ref.MASKS[small], ref.MASKS[large])


@pytest.mark.parametrize(
    "sizes",
    [(62, 256, 1024), (65, 256, 1024), (64, 254, 1024), (64, 257, 1024), (64, 256, 1022),
     (64, 256, 1025), (2048, 1024, 4096), (64, 8192, 4096), (1_048_578, 4_194_304, 16_777_216),
     (64, 4_194_306, 16_777_216), (64, 256, 16_777_218)],
)  # fmt: skip
def test_bad_chunk_sizes(sizes: tuple[int, int, int]) -> None:
    with pytest.raises(InvalidArgumentError):
        ref.chunk_boundaries(b"x" * 100, *sizes)


def test_frame_layout() -> None:
    data = b"hello frame " * 50
    frame = ref.encode_frame(data)
    assert frame[:4] == b"STRD"
    assert frame[4] == 1
    assert frame[5] == ref.CODEC_ZSTD
    assert frame[6:8] == b"\0\0"
    assert int.from_bytes(frame[8:16], "little") == len(data)
    assert frame[16:48] == ref.digest(data)
    assert frame[48:52] == ref.digest(frame[:48])[:4]
    assert zstandard.ZstdDecompressor().decompress(frame[52:]) == data
    raw = ref.encode_frame(b"abc")
    assert raw[5] == ref.CODEC_RAW
    assert raw[52:] == b"abc"
    assert ref.decode_frame(frame, len(data)) == data
    assert ref.frame_digest_hex(frame) == ref.digest_hex(data)
    with pytest.raises(DecompressionLimitError):
        ref.decode_frame(frame, len(data) - 1)
    with pytest.raises(CorruptObjectError):
        ref.decode_frame(frame[:-1], len(data))


def test_decompress_without_content_size() -> None:
    data = bytes(range(256)) * 40
    packed = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert ref.decompress(packed, len(data)) == data
    with pytest.raises(DecompressionLimitError):
        ref.decompress(packed, len(data) - 1)
