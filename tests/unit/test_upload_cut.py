"""The SDK cuts a session's next state from where it differs from the last one.

`cut_state(data, previous)` must give exactly what cutting and hashing the
whole state gives (FastCDC cut points, chunk digests, state digest), whatever
the edit: appended, truncated, rewritten in the middle, or unrelated.
"""

from __future__ import annotations

import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stratad import native
from stratad.api.v1 import checkpoint_pb2
from stratad.sdk import upload
from stratad.sdk.upload import StateCut, Uploader, cut_state


def _whole(data: bytes) -> tuple[list[tuple[int, int]], list[str], str]:
    cuts = native.chunk_boundaries(data)
    return cuts, [native.digest_hex(data[o : o + n]) for o, n in cuts], native.digest_hex(data)


def _assert_exact(cut: StateCut, data: bytes) -> None:
    assert (cut.cuts, cut.digests, cut.digest) == _whole(data)


def _text(rng: random.Random, size: int) -> bytes:
    """JSON-like text: what agents checkpoint (repeated keys, words)."""
    words = [b'"role":"user"', b'"content":', b"the", b"tool", b"result", b"{", b"}", b","]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + str(rng.randrange(10**6)).encode()
    return bytes(out[:size])


@st.composite
def state_chains(draw: st.DrawFn) -> list[bytes]:
    """A first state and edits of it, each applied to the state before."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    size = draw(st.integers(0, 160_000))
    states = [_text(rng, size) if draw(st.booleans()) else rng.randbytes(size)]
    for _ in range(draw(st.integers(1, 4))):
        data = states[-1]
        at = draw(st.integers(0, len(data)))
        extra = _text(rng, draw(st.integers(0, 40_000)))
        edit = draw(
            st.sampled_from(
                ["append", "truncate", "insert", "flip", "replace_tail", "new", "at_a_cut"]
            )
        )
        if edit == "at_a_cut":
            # Right at a cut, or a byte either side: where reuse could go wrong
            # (FastCDC reads the byte after a cut before cutting there).
            cuts = native.chunk_boundaries(data)
            at = draw(st.sampled_from(cuts))[0] + draw(st.integers(-1, 1)) if cuts else 0
            at = max(0, min(at, len(data)))
            edit = draw(st.sampled_from(["flip", "replace_tail", "insert", "truncate"]))
        if edit == "append":
            data += extra
        elif edit == "truncate":
            data = data[:at]
        elif edit == "insert":
            data = data[:at] + extra + data[at:]
        elif edit == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
        elif edit == "replace_tail":
            data = data[:at] + extra
        else:
            data = rng.randbytes(len(extra))
        states.append(data)
    return states


@settings(max_examples=150, deadline=None)
@given(state_chains())
def test_incremental_cuts_equal_whole_cuts(states: list[bytes]) -> None:
    cut = cut_state(states[0])
    _assert_exact(cut, states[0])
    for data in states[1:]:
        cut = cut_state(data, cut)
        _assert_exact(cut, data)


def test_a_growing_state_recuts_only_its_tail() -> None:
    rng = random.Random(7)
    data = _text(rng, 200_000)
    cut = cut_state(data)
    assert cut.reused == 0
    for _ in range(20):
        data += _text(rng, 300)
        cut = cut_state(data, cut)
        _assert_exact(cut, data)
        # All but the last chunk or two are taken as they were.
        assert cut.reused >= len(cut.cuts) - 3


def test_an_unrelated_state_reuses_nothing() -> None:
    first = cut_state(os.urandom(100_000))
    second = os.urandom(100_000)
    cut = cut_state(second, first)
    assert cut.reused == 0
    _assert_exact(cut, second)


def _request(session: str, data: bytes) -> checkpoint_pb2.SaveStateRequest:
    return checkpoint_pb2.SaveStateRequest(session_id=session, data=data)


def test_the_uploader_keeps_previous_states_within_its_byte_bound(monkeypatch) -> None:
    monkeypatch.setattr(upload, "KEPT_STATE_BYTES", 250_000)
    uploader = Uploader()
    for session in ("a", "b", "c"):
        plan = uploader.plan(_request(session, os.urandom(100_000)))
        assert plan is not None
        uploader.saved(plan, f"cp-{session}")
    # Three 100 KB states do not fit in 250 KB: the oldest session's went.
    assert [key[0] for key in uploader._cuts] == ["b", "c"]
    assert uploader._cut_bytes == 200_000
    uploader.forget_session("b")
    assert [key[0] for key in uploader._cuts] == ["c"]
    assert uploader._cut_bytes == 100_000


def test_the_uploader_sends_what_whole_cutting_would() -> None:
    rng = random.Random(3)
    uploader = Uploader()
    data = _text(rng, 120_000)
    first = uploader.plan(_request("s", data))
    assert first is not None
    uploader.saved(first, "cp-1")
    grown = data + _text(rng, 500)
    plan = uploader.plan(_request("s", grown))
    assert plan is not None
    cuts, digests, digest = _whole(grown)
    chunked = plan.request.chunked
    assert chunked.digest == digest and chunked.size == len(grown)
    assert chunked.base_checkpoint_id == "cp-1"
    assert chunked.keep + len(chunked.chunks) == len(cuts)
    assert [c.digest for c in chunked.chunks] == digests[chunked.keep :]
    # Only chunks the daemon was not sent before travel, each exactly once.
    sent = [native.frame_digest_hex(f) for f in chunked.frames]
    assert sent and set(sent) == set(digests[chunked.keep :]) - set(first.digests)
    # The rewritten last chunk goes as a delta on the chunk it replaces (which
    # the daemon holds); every frame decodes to its chunk.
    replaced = first.digests[-1]
    bases = [native.frame_delta_base(f) for f in chunked.frames]
    assert [b[0] for b in bases if b is not None] == [replaced]
    for frame, base in zip(chunked.frames, bases, strict=True):
        found = plan.chunk(native.frame_digest_hex(frame))
        assert found is not None
        if base is None:
            assert native.decode_frame(frame, len(found)) == found
        else:
            old = first.chunk(replaced)
            assert old is not None and native.decode_delta_frame(frame, old, len(found)) == found


def test_edits_right_around_every_cut() -> None:
    """Truncated or rewritten a few bytes either side of each cut: where FastCDC's
    reading past a cut makes reuse go wrong if the margin were too small."""
    rng = random.Random(11)
    for data in (_text(rng, 90_000), rng.randbytes(90_000)):
        previous = cut_state(data)
        for offset, _ in previous.cuts[1:]:
            for shift in range(-3, 4):
                at = offset + shift
                for edited in (data[:at], data[:at] + rng.randbytes(3000)):
                    _assert_exact(cut_state(edited, previous), edited)
