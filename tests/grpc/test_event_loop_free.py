"""The event loop stays free, and chunked uploads are checked when saved.

A save is classified by the size it *declares*, not by its bytes on the wire:
otherwise a 100 KB request of highly compressible frames would be decoded on
the event loop, holding health checks for seconds. The tests hold the heavy
work (decoding a frame, an fsync) on an event and check that a health check is
answered meanwhile: if that work ran on the event loop, the health check
could not be answered until it was released (no timing involved).
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stratad import native
from stratad.api.v1 import (
    checkpoint_pb2,
    cognitive_pb2,
    cognitive_pb2_grpc,
    profile_pb2,
    profile_pb2_grpc,
)
from stratad.store import journal as journal_module

if TYPE_CHECKING:
    from conftest import Api

WAIT = 30.0
BIG = 48 << 20  # declared size of the "small on the wire" uploads
SERVING = health_pb2.HealthCheckResponse.SERVING


def frame_length(frame: bytes) -> int:
    return int(struct.unpack_from("<Q", frame, 8)[0])  # docs/native.md, frame header


def chunked(
    data: bytes, *, frames: list[bytes] | None = None, **fields: Any
) -> checkpoint_pb2.ChunkedState:
    """`data` as one chunk, with its frame uploaded (or `frames`)."""
    digest = native.digest_hex(data)
    frame = native.encode_frame(data)
    values: dict[str, Any] = {
        "size": len(data),
        "digest": digest,
        "chunks": [checkpoint_pb2.ChunkRef(digest=digest, length=len(data))],
        "frames": [frame] if frames is None else frames,
    }
    values.update(fields)
    return checkpoint_pb2.ChunkedState(**values)


class Gate:
    """Blocks calls of a patched function until `release`; records that one started."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def hold(self) -> None:
        self.entered.set()
        assert self.released.wait(WAIT), "never released"


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.released.set()  # never leave a server thread blocked


def health_answers(api: Api) -> bool:
    stub = health_pb2_grpc.HealthStub(api.channel)
    response = stub.Check(health_pb2.HealthCheckRequest(), timeout=WAIT / 2)
    return bool(response.status == SERVING)


def in_background(fn: Callable[[], Any]) -> Future[Any]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn)
    pool.shutdown(wait=False)
    return future


def test_a_small_request_declaring_a_huge_state_is_decoded_off_the_event_loop(
    api: Api, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.create("agent")
    zeros = bytes(BIG)
    request = checkpoint_pb2.SaveStateRequest(session_id="agent", chunked=chunked(zeros))
    assert request.ByteSize() < 128 << 10, "the point: small on the wire"

    def held(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(frame: bytes, max_size: int) -> Any:
            if frame_length(frame) >= BIG:
                gate.hold()
            return real(frame, max_size)

        return call

    monkeypatch.setattr(native, "decode_frame", held(native.decode_frame))
    monkeypatch.setattr(native, "verify_frame", held(native.verify_frame))
    saving = in_background(lambda: api.call(api.checkpoints.SaveState, request))
    assert gate.entered.wait(WAIT)
    try:
        assert health_answers(api), "health held up while the upload was decoded"
    finally:
        gate.released.set()
    saved = saving.result(WAIT)
    assert saved.digest == native.digest_hex(zeros)
    assert api.get("agent").head_checkpoint_id == saved.checkpoint_id


def test_a_lone_writers_fsync_never_blocks_the_event_loop(
    api: Api, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.create("agent")
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/agent/journal"):
            gate.hold()
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    saving = in_background(lambda: api.save("agent", b"one small step"))
    assert gate.entered.wait(WAIT)
    try:
        assert health_answers(api), "health held up by a lone writer's fsync"
    finally:
        gate.released.set()
    assert saving.result(WAIT).digest == native.digest_hex(b"one small step")


def test_a_frame_longer_than_its_listed_chunk_is_refused_before_decoding(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.create("agent")
    api.save("agent", b"before")
    decoded: list[int] = []
    for name in ("decode_frame", "verify_frame"):
        real = getattr(native, name)

        def spy(frame: bytes, max_size: int, real: Callable[..., Any] = real) -> Any:
            decoded.append(frame_length(frame))
            return real(frame, max_size)

        monkeypatch.setattr(native, name, spy)
    zeros = bytes(BIG)
    digest = native.digest_hex(zeros)
    lying = chunked(
        zeros,
        size=1000,
        chunks=[checkpoint_pb2.ChunkRef(digest=digest, length=1000)],
    )
    request = checkpoint_pb2.SaveStateRequest(session_id="agent", chunked=lying)
    api.fails(
        api.checkpoints.SaveState, request, grpc.StatusCode.INVALID_ARGUMENT,
        "listed", digest, keeps="agent",
    )  # fmt: skip
    assert BIG not in decoded, "the frame was decoded before its header was checked"


def test_an_upload_whose_chunks_do_not_make_its_digest_is_refused_at_save_time(
    api: Api,
) -> None:
    """A wrong whole-state digest is refused when saved, not found only when loading."""
    api.create("agent")
    api.save("agent", b"before")
    data = os.urandom(200_000)
    wrong = native.digest_hex(b"another state")
    request = checkpoint_pb2.SaveStateRequest(
        session_id="agent", chunked=chunked(data, digest=wrong)
    )
    api.fails(
        api.checkpoints.SaveState, request, grpc.StatusCode.INVALID_ARGUMENT,
        "digest", wrong, keeps="agent",
    )  # fmt: skip
    # Nothing was stored: the chunk is still missing on the daemon.
    missing = api.call(
        api.checkpoints.FindMissingChunks,
        checkpoint_pb2.FindMissingChunksRequest(digests=[native.digest_hex(data)]),
    ).missing
    assert list(missing) == [native.digest_hex(data)]


def test_kept_base_chunks_count_towards_the_digest_check(api: Api) -> None:
    """A delta upload (keep N chunks of a base) is checked as the whole state."""
    api.create("agent")
    base = os.urandom(300_000)
    saved = api.save("agent", base)
    boundaries = native.chunk_boundaries(base)
    assert len(boundaries) > 2
    kept = boundaries[:-1]
    tail = os.urandom(5000)
    kept_bytes = sum(length for _, length in kept)
    state = base[:kept_bytes] + tail

    def upload(digest: str) -> checkpoint_pb2.SaveStateRequest:
        return checkpoint_pb2.SaveStateRequest(
            session_id="agent",
            chunked=chunked(
                tail,
                size=len(state),
                digest=digest,
                base_checkpoint_id=saved.checkpoint_id,
                keep=len(kept),
            ),
        )

    api.fails(
        api.checkpoints.SaveState, upload(native.digest_hex(tail)),
        grpc.StatusCode.INVALID_ARGUMENT, "digest", keeps="agent",
    )  # fmt: skip
    good = api.call(api.checkpoints.SaveState, upload(native.digest_hex(state)))
    assert api.load("agent", checkpoint_id=good.checkpoint_id).data == state


def _upload_of(
    state: bytes, cuts: list[tuple[int, int]], keep: int, base: str, **fields: Any
) -> checkpoint_pb2.SaveStateRequest:
    """`state` as an upload keeping `keep` chunks of checkpoint `base`, every other
    chunk listed and framed."""
    pieces = [state[o : o + n] for o, n in cuts[keep:]]
    values: dict[str, Any] = {
        "size": len(state),
        "digest": native.digest_hex(state),
        "chunks": [
            checkpoint_pb2.ChunkRef(digest=native.digest_hex(p), length=len(p)) for p in pieces
        ],
        "frames": [native.encode_frame(p) for p in pieces],
        "base_checkpoint_id": base,
        "keep": keep,
    }
    values.update(fields)
    return checkpoint_pb2.SaveStateRequest(
        session_id="agent", chunked=checkpoint_pb2.ChunkedState(**values)
    )


def _shared_cuts(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_a_digest_check_resumed_from_the_last_upload_still_refuses_bad_uploads(
    api: Api,
) -> None:
    """The daemon hashes only what follows the chunks an upload keeps of the
    session's last upload (it keeps its digest's progress there): a wrong
    state digest, or a stored chunk listed with a wrong length after that
    point, is refused all the same, and good uploads chain on."""
    api.create("agent")
    first = os.urandom(300_000)
    first_cuts = native.chunk_boundaries(first)
    saved = api.call(api.checkpoints.SaveState, _upload_of(first, first_cuts, 0, ""))
    grown = first + os.urandom(9000)
    cuts = native.chunk_boundaries(grown)
    keep = _shared_cuts(first_cuts, cuts)
    assert keep >= len(first_cuts) - 2
    kept_bytes = cuts[keep][0]

    wrong = native.digest_hex(b"another state")
    api.fails(
        api.checkpoints.SaveState, _upload_of(grown, cuts, keep, saved.checkpoint_id, digest=wrong),
        grpc.StatusCode.INVALID_ARGUMENT, "digest", wrong, keeps="agent",
    )  # fmt: skip
    # The first state's chunk after the kept ones is stored: listed again with
    # a length that is not its own (the sizes still adding up), it is caught
    # by its content.
    offset, length = first_cuts[keep]
    stored = first[offset : offset + length]
    lying = checkpoint_pb2.ChunkRef(digest=native.digest_hex(stored), length=length + 1)
    request = checkpoint_pb2.SaveStateRequest(
        session_id="agent",
        chunked=checkpoint_pb2.ChunkedState(
            size=kept_bytes + length + 1,
            digest=native.digest_hex(first[:kept_bytes] + stored + b"x"),
            chunks=[lying],
            base_checkpoint_id=saved.checkpoint_id,
            keep=keep,
        ),
    )
    api.fails(
        api.checkpoints.SaveState, request, grpc.StatusCode.INVALID_ARGUMENT,
        "listed with", keeps="agent",
    )  # fmt: skip

    good = api.call(api.checkpoints.SaveState, _upload_of(grown, cuts, keep, saved.checkpoint_id))
    again = grown + os.urandom(7000)
    again_cuts = native.chunk_boundaries(again)
    again_keep = _shared_cuts(cuts, again_cuts)
    third = api.call(
        api.checkpoints.SaveState, _upload_of(again, again_cuts, again_keep, good.checkpoint_id)
    )
    assert api.load("agent", checkpoint_id=good.checkpoint_id).data == grown
    assert api.load("agent", checkpoint_id=third.checkpoint_id).data == again


class Arrivals:
    """Records on which thread a patched domain method was entered, and when."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.arrived = threading.Event()

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.threads.append(threading.current_thread().name)
            self.arrived.set()
            return real(*args, **kwargs)

        return call

    def on_workers_only(self) -> bool:
        return bool(self.threads) and all(t.startswith("stratad-worker") for t in self.threads)


def spy_on(monkeypatch: pytest.MonkeyPatch, owner: Any, method: str) -> Arrivals:
    arrivals = Arrivals()
    monkeypatch.setattr(owner, method, arrivals.wrap(getattr(owner, method)))
    return arrivals


def hold_journal_rewrites(monkeypatch: pytest.MonkeyPatch, gate: Gate, directory: str) -> None:
    """A compaction of the journal in `directory` waits on `gate` (its fsync of
    the new journal, on a slow disk)."""
    real_rewrite = journal_module.rewrite

    def rewrite(path: Path, *args: Any, **kwargs: Any) -> None:
        if path.parent.name == directory:
            gate.hold()
        real_rewrite(path, *args, **kwargs)

    monkeypatch.setattr(journal_module, "rewrite", rewrite)


def test_a_compaction_holding_a_sessions_lock_never_holds_up_the_event_loop(
    api: Api, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction keeps its session's lock across fsyncs (objects, the new
    journal, its directory): on a slow disk, for as long as they take. Calls
    for that session meanwhile, a save and a cheap read, must wait for it on a
    worker thread: on the event loop they would hold up every other call."""
    api.create("agent")
    api.save("agent", b"history " * 1000)
    cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(api.channel)
    initialize = cognitive_pb2.InitializeRequest(session_id="agent", goal="g")
    cognitive.Initialize(initialize, timeout=WAIT)
    engine = api.server.resources.engine
    saves = spy_on(monkeypatch, engine.checkpoints, "save_state")
    reads = spy_on(monkeypatch, engine.cognitive, "stats")
    hold_journal_rewrites(monkeypatch, gate, "agent")
    compacting = in_background(lambda: engine.sessions.compact("default", "agent"))
    assert gate.entered.wait(WAIT)
    saving = in_background(lambda: api.save("agent", b"while compacting"))
    reading = in_background(
        lambda: cognitive.GetCognitiveStats(
            cognitive_pb2.GetCognitiveStatsRequest(session_id="agent"), timeout=WAIT
        )
    )
    try:
        assert saves.arrived.wait(WAIT) and reads.arrived.wait(WAIT)
        assert health_answers(api), "health held up by a compaction's fsync"
        assert not saving.done() and not reading.done(), "served without the session's lock"
    finally:
        gate.released.set()
    compacting.result(WAIT)
    assert saving.result(WAIT).digest == native.digest_hex(b"while compacting")
    assert reading.result(WAIT).initialized
    assert saves.on_workers_only() and reads.on_workers_only()
    assert api.load("agent").data == b"while compacting"


def test_a_deletion_holding_a_sessions_lock_never_holds_up_the_event_loop(
    api: Api, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletion keeps the session's lock across fsyncs (its objects, the
    directory it leaves): a call for the session meanwhile waits on a worker
    thread, and is answered NOT_FOUND once the deletion is done."""
    api.create("agent")
    api.save("agent", b"to be deleted")
    engine = api.server.resources.engine
    reads = spy_on(monkeypatch, engine.cognitive, "stats")
    real_fsync_dir = engine.store.fsync_dir

    def fsync_dir(path: Path) -> None:
        if path.name == "sessions":
            gate.hold()  # the deletion's directory fsync, on a slow disk
        real_fsync_dir(path)

    monkeypatch.setattr(engine.store, "fsync_dir", fsync_dir)
    deleting = in_background(lambda: engine.sessions.delete("default", "agent"))
    assert gate.entered.wait(WAIT)
    cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(api.channel)
    request = cognitive_pb2.GetCognitiveStatsRequest(session_id="agent")
    reading = in_background(lambda: cognitive.GetCognitiveStats(request, timeout=WAIT))
    try:
        assert reads.arrived.wait(WAIT)
        assert health_answers(api), "health held up by a deletion's fsync"
    finally:
        gate.released.set()
    assert deleting.result(WAIT) is True
    with pytest.raises(grpc.RpcError) as refused:
        reading.result(WAIT)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert reads.on_workers_only()


def test_a_profile_compaction_never_holds_up_the_event_loop(
    api: Api, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tenant's profile journal is compacted with its lock held across
    fsyncs; a GetProfile meanwhile (served on the event loop otherwise) waits
    on a worker thread, and health checks are answered."""
    profiles_stub = profile_pb2_grpc.ProfileServiceStub(api.channel)

    def update(text: str) -> None:
        request = profile_pb2.UpdateProfileRequest(user_id="ada", goals=[text])
        profiles_stub.UpdateProfile(request, timeout=WAIT)

    update("first")
    engine = api.server.resources.engine
    monkeypatch.setattr(engine.profiles, "compact_min_bytes", 1)  # the next update compacts
    reads = spy_on(monkeypatch, engine.profiles, "get")
    hold_journal_rewrites(monkeypatch, gate, "profiles")
    updating = in_background(lambda: update("second"))
    assert gate.entered.wait(WAIT)
    request = profile_pb2.GetProfileRequest(user_id="ada")
    reading = in_background(lambda: profiles_stub.GetProfile(request, timeout=WAIT))
    try:
        assert reads.arrived.wait(WAIT)
        assert health_answers(api), "health held up by a profile compaction's fsync"
        assert not reading.done(), "read without the profile lock"
    finally:
        gate.released.set()
    updating.result(WAIT)
    assert reading.result(WAIT).profile.user_id == "ada"
    assert reads.on_workers_only()
