"""Delta frames (codec 2): native encoding checked against the reference.

The payload after the base digest and depth is a standard zstd frame whose
dictionary is the base's raw content: the `zstandard` package must decode it
to the data, and the header must be the reference header with codec 2.
"""

from __future__ import annotations

import pytest
import reference as ref
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import payloads

from stratad.errors import CorruptObjectError

native = pytest.importorskip("stratad.native")

H = ref.FRAME_HEADER_SIZE
CODEC_ZSTD_DELTA = 2
WORDS = ["agent", "search", "tool", "revenue", "table", "retries", "the", "user", "notes"]
# States worth a delta: text that grows or is edited in place (and any payload).
texts = st.lists(st.sampled_from(WORDS), min_size=40, max_size=3000).map(
    lambda words: " ".join(words).encode()
)
bases = st.one_of(texts, payloads)
edits = st.tuples(st.integers(0, 20_000), st.integers(0, 300), st.binary(max_size=600))


def edited(base: bytes, edit: tuple[int, int, bytes]) -> bytes:
    """`base` with `cut` bytes at `at` replaced by `insert` (an append when at the end)."""
    at, cut, insert = edit
    at = min(at, len(base))
    return base[:at] + insert + base[at + cut :]


def raw_content_decode(payload: bytes, base: bytes, size: int) -> bytes:
    prefix = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    return zstandard.ZstdDecompressor(dict_data=prefix).decompress(payload, max_output_size=size)


@settings(max_examples=150, deadline=None)
@given(bases, edits, st.integers(0, native.MAX_DELTA_DEPTH), st.sampled_from([1, 3, 9]))
def test_delta_frames_decode_and_cross_decode(
    base: bytes, edit: tuple[int, int, bytes], depth: int, level: int
) -> None:
    data = edited(base, edit)
    frame = native.encode_delta_frame(data, base, depth, level)
    plain = native.encode_frame(data, level)
    found = native.frame_delta_base(frame)
    if found is None:  # no delta paid (or the chain was full): the plain frame
        assert frame == plain
        return
    assert depth < native.MAX_DELTA_DEPTH
    assert found == (ref.digest_hex(base), depth + 1)
    assert len(frame) < len(plain)
    assert frame[:H] == ref.frame_header(CODEC_ZSTD_DELTA, data)
    assert frame[H : H + 32] == ref.digest(base)
    assert frame[H + 32] == depth + 1
    assert raw_content_decode(frame[H + 33 :], base, len(data)) == data
    assert native.decode_delta_frame(frame, base, len(data)) == data
    assert native.frame_digest_hex(frame) == ref.digest_hex(data)


@settings(max_examples=80, deadline=None)
@given(bases, edits, st.binary(min_size=1, max_size=64))
def test_a_delta_frame_never_decodes_with_another_base(
    base: bytes, edit: tuple[int, int, bytes], noise: bytes
) -> None:
    data = edited(base, edit)
    frame = native.encode_delta_frame(data, base, 0)
    if native.frame_delta_base(frame) is None:
        return
    other = noise + base[len(noise) :]
    if other == base:
        other = base + b"\0"
    with pytest.raises(CorruptObjectError):
        native.decode_delta_frame(frame, other, 1 << 30)
    with pytest.raises(CorruptObjectError):  # no base: undecodable, never data
        native.decode_frame(frame, 1 << 30)


@settings(max_examples=80, deadline=None)
@given(bases, edits, st.integers(0, native.MAX_DELTA_DEPTH))
def test_a_given_plain_frame_is_what_a_delta_is_weighed_against(
    base: bytes, edit: tuple[int, int, bytes], depth: int
) -> None:
    """With the chunk's plain frame at hand (an uploaded one), the result is
    the same as when the frame is made again; when no delta pays, that frame."""
    data = edited(base, edit)
    plain = native.encode_frame(data)
    assert native.encode_delta_frame(data, base, depth, plain=plain) == native.encode_delta_frame(
        data, base, depth
    )
    # A smaller plain frame than any delta (level 19 vs 3 here, or a stand-in)
    # is returned as given: it is the caller's verified frame, not re-made.
    tiny = plain[: ref.FRAME_HEADER_SIZE]
    assert native.encode_delta_frame(data, base, depth, plain=tiny) == tiny
