"""CheckpointService over gRPC: every RPC with good and bad input, tenancy and retention."""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import blake3
import grpc
import pytest
from google.protobuf import struct_pb2

from stratad import native
from stratad.api.v1 import checkpoint_pb2, common_pb2, session_pb2
from stratad.errors import ERROR_DOMAIN
from stratad.sdk.client import error_info
from stratad.store.objects import find_on_disk

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
ABORTED = grpc.StatusCode.ABORTED
EXISTS = grpc.StatusCode.ALREADY_EXISTS
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
BAD_IDS = ["../x", "a/b", "k" * 1024]


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def sha(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


_rng = random.Random(7)
_TEXT = " ".join(_rng.choice(["agent", "tool", "search", "user", "table"]) for _ in range(60_000))


def growing(step: int) -> bytes:
    """A state that grows by appending 3 KB a step: successive steps share a long prefix."""
    return _TEXT[: (step + 1) * 3000].encode()


@pytest.fixture
def s(api: Api) -> str:
    """A session with two saved states: b"first" then b"second" (head), version 3."""
    api.create("s")
    api.save("s", b"first", checkpoint_id="c1", content_type="text/plain")
    api.save("s", b"second", checkpoint_id="c2", content_type="text/plain")
    return "s"


def save_request(session_id: str = "s", data: bytes = b"new", **fields: Any) -> Any:
    return checkpoint_pb2.SaveStateRequest(session_id=session_id, data=data, **fields)


# -- SaveState ---------------------------------------------------------------------------


def test_save_returns_id_version_blake3_digest_size_and_stored_bytes(api: Api) -> None:
    api.create("s")
    data = b"hello state " * 100
    saved = api.save("s", data)
    assert saved.checkpoint_id.startswith("ckpt-")
    assert saved.version == 2
    assert saved.digest == sha(data)
    assert saved.size == len(data)
    assert 0 < saved.stored_bytes < len(data)  # compressed
    session = api.get("s")
    assert (session.version, session.head_checkpoint_id) == (2, saved.checkpoint_id)


def test_save_then_load_returns_bytes_content_type_and_metadata(api: Api) -> None:
    api.create("s")
    meta = {"step": 3, "tags": ["a", "b"], "nested": {"ok": True}}
    saved = api.save(
        "s", b"\x00\xffbinary", content_type="application/x-raw", metadata=struct(meta)
    )
    loaded = api.load("s")
    assert loaded.data == b"\x00\xffbinary"
    assert loaded.content_type == "application/x-raw"
    assert dict(loaded.metadata) == struct(meta)
    assert (loaded.checkpoint_id, loaded.digest, loaded.version) == (
        saved.checkpoint_id,
        saved.digest,
        2,
    )
    assert loaded.checkpoint.size == 8


def test_save_an_empty_state(api: Api) -> None:
    api.create("s")
    saved = api.save("s", b"")
    assert (saved.size, saved.stored_bytes, saved.digest) == (0, 0, sha(b""))
    assert api.load("s").data == b""


def test_save_the_same_state_again_stores_nothing_new(api: Api) -> None:
    api.create("s")
    data = os.urandom(50_000)
    first, second = api.save("s", data), api.save("s", data)
    assert first.stored_bytes > 50_000
    assert second.stored_bytes < 200  # at most a manifest
    assert second.digest == first.digest


def test_a_growing_state_stores_only_what_changed(api: Api) -> None:
    api.create("s")
    api.save("s", growing(20))
    saved = api.save("s", growing(21))
    assert saved.size > 60_000
    assert saved.stored_bytes < saved.size // 4
    assert api.load("s").data == growing(21)


def test_save_keeps_a_client_checkpoint_id(s: str, api: Api) -> None:
    saved = api.save(s, b"third", checkpoint_id="step-3")
    assert saved.checkpoint_id == "step-3"
    assert api.load(s, checkpoint_id="step-3").data == b"third"


def test_save_reusing_a_checkpoint_id_is_already_exists(s: str, api: Api) -> None:
    api.fails(api.checkpoints.SaveState, save_request(checkpoint_id="c1"), EXISTS, "c1", keeps=s)


def test_checkpoint_ids_are_unique_across_the_tenants_sessions(s: str, api: Api) -> None:
    api.create("other")
    request = save_request("other", checkpoint_id="c2")
    api.fails(api.checkpoints.SaveState, request, EXISTS, "c2", keeps="other")
    restored = api.call(
        api.checkpoints.RestoreCheckpoint,
        checkpoint_pb2.RestoreCheckpointRequest(checkpoint_id="c2"),
    )
    assert restored.state.data == b"second"


def test_another_tenant_may_use_the_same_checkpoint_id(s: str, api: Api) -> None:
    other = api.as_tenant("t2")
    other.create("s")
    assert other.save("s", b"theirs", checkpoint_id="c1").checkpoint_id == "c1"
    assert api.load(s, checkpoint_id="c1").data == b"first"


def test_concurrent_saves_with_one_checkpoint_id_let_exactly_one_win(api: Api) -> None:
    sessions = [api.create(f"s{i}").session_id for i in range(6)]
    barrier = threading.Barrier(len(sessions))
    codes: list[grpc.StatusCode] = []

    def save(session_id: str) -> None:
        barrier.wait()
        try:
            api.save(session_id, b"x", checkpoint_id="contested")
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())  # type: ignore[attr-defined]

    threads = [threading.Thread(target=save, args=(sid,)) for sid in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(codes, key=str) == sorted([grpc.StatusCode.OK] + [EXISTS] * 5, key=str)
    assert sum(api.get(sid).checkpoint_count for sid in sessions) == 1


def test_save_parent_defaults_to_the_head(s: str, api: Api) -> None:
    saved = api.save(s, b"third")
    assert api.load(s, checkpoint_id=saved.checkpoint_id).checkpoint.parent_checkpoint_id == "c2"


def test_save_with_an_explicit_parent(s: str, api: Api) -> None:
    saved = api.save(s, b"branch", parent_checkpoint_id="c1")
    assert api.load(s).checkpoint.parent_checkpoint_id == "c1"
    assert api.get(s).head_checkpoint_id == saved.checkpoint_id


def test_save_with_an_unknown_parent_is_not_found(s: str, api: Api) -> None:
    request = save_request(parent_checkpoint_id="nope")
    api.fails(api.checkpoints.SaveState, request, NOT_FOUND, "parent", "nope", keeps=s)


def test_save_with_the_expected_version_succeeds(s: str, api: Api) -> None:
    assert api.save(s, b"third", expected_version=3).version == 4


@pytest.mark.parametrize("expected", [1, 2, 4, 999])
def test_save_with_a_wrong_expected_version_is_aborted(s: str, api: Api, expected: int) -> None:
    request = save_request(expected_version=expected)
    api.fails(api.checkpoints.SaveState, request, ABORTED, "version 3", f"not {expected}", keeps=s)


@pytest.mark.parametrize("session_id", ["", *BAD_IDS])
def test_save_rejects_bad_session_ids(s: str, api: Api, session_id: str) -> None:
    request = save_request(session_id)
    api.fails(api.checkpoints.SaveState, request, INVALID, "session_id", keeps=s)


@pytest.mark.parametrize("field", ["checkpoint_id", "parent_checkpoint_id"])
@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_save_rejects_bad_checkpoint_ids(s: str, api: Api, field: str, bad_id: str) -> None:
    request = save_request(**{field: bad_id})
    api.fails(api.checkpoints.SaveState, request, INVALID, f"invalid {field}", keeps=s)


@pytest.mark.parametrize(
    ("fields", "word"),
    [
        ({"content_type": "t" * 257}, "content_type"),
        ({"namespace": "n" * 257}, "namespace"),
        ({"namespace": "bad\nline"}, "namespace"),
        ({"metadata": struct({"big": "m" * (1 << 20)})}, "metadata"),
    ],
)
def test_save_rejects_oversized_fields(s: str, api: Api, fields: dict[str, Any], word: str) -> None:
    api.fails(api.checkpoints.SaveState, save_request(**fields), INVALID, word, keeps=s)


def test_save_to_an_unknown_session_is_not_found(api: Api) -> None:
    api.fails(api.checkpoints.SaveState, save_request("nope"), NOT_FOUND, "nope")


def test_save_to_another_tenants_session_is_not_found(s: str, api: Api) -> None:
    other = api.as_tenant("t2")
    other.fails(other.checkpoints.SaveState, save_request(), NOT_FOUND)
    assert api.snapshot(s).version == 3


def test_save_larger_than_the_message_limit_is_resource_exhausted(
    start_api: Callable[..., Api],
) -> None:
    api = start_api(max_message_bytes=64 << 10)
    api.create("s")
    api.save("s", b"small")
    request = save_request(data=os.urandom(70_000))
    api.fails(api.checkpoints.SaveState, request, EXHAUSTED, "65536", keeps="s")


def test_chunked_upload_larger_than_the_limit_is_resource_exhausted(
    start_api: Callable[..., Api],
) -> None:
    api = start_api(max_message_bytes=64 << 10)
    api.create("s")
    chunked = checkpoint_pb2.ChunkedState(size=(64 << 10) + 1, digest="0" * 64)
    request = checkpoint_pb2.SaveStateRequest(session_id="s", chunked=chunked)
    api.fails(api.checkpoints.SaveState, request, EXHAUSTED, "65536", "max_message_bytes")
    assert api.get("s").version == 1


def test_a_state_at_the_size_limit_loads_back(start_api: Callable[..., Api]) -> None:
    api = start_api(max_message_bytes=64 << 10)
    api.create("s")
    data = os.urandom(64 << 10)
    assert api.call(api.checkpoints.SaveState, chunked_request(data)).size == len(data)
    assert api.load("s").data == data


# -- SaveState with a client-chunked state (the SDK's upload path) -------------------------


def chunked_request(data: bytes, *, frames: bool = True, **fields: Any) -> Any:
    pieces = [data[o : o + n] for o, n in native.chunk_boundaries(data)]
    chunked = checkpoint_pb2.ChunkedState(size=len(data), digest=sha(data), **fields)
    for piece in pieces:
        chunked.chunks.add(digest=sha(piece), length=len(piece))
        if frames:
            chunked.frames.append(native.encode_frame(piece))
    return checkpoint_pb2.SaveStateRequest(session_id="s", chunked=chunked)


def test_chunked_upload_saves_the_state(s: str, api: Api) -> None:
    data = growing(30)
    saved = api.call(api.checkpoints.SaveState, chunked_request(data))
    assert (saved.digest, saved.size) == (sha(data), len(data))
    assert api.load(s).data == data


def test_chunked_upload_without_the_frames_names_missing_chunks(s: str, api: Api) -> None:
    request = chunked_request(growing(30), frames=False)
    api.fails(api.checkpoints.SaveState, request, PRECONDITION, "chunks are missing", keeps=s)


def test_chunked_upload_with_a_corrupt_frame_is_invalid(s: str, api: Api) -> None:
    request = chunked_request(growing(10))
    frame = bytearray(request.chunked.frames[0])
    frame[-1] ^= 0xFF
    request.chunked.frames[0] = bytes(frame)
    api.fails(api.checkpoints.SaveState, request, INVALID, "corrupt", keeps=s)


def delta_request(old: bytes, new: bytes, *, claimed_depth: int = 0, **fields: Any) -> Any:
    """The chunked request of `new`: a chunk that rewrites the chunk of `old` at
    its place (same first bytes) as a delta on it, the SDK's way; others plain."""
    before = [old[o : o + n] for o, n in native.chunk_boundaries(old)]
    request = chunked_request(new, **fields)
    pieces = [new[o : o + n] for o, n in native.chunk_boundaries(new)]
    for index, piece in enumerate(pieces):
        replaced = before[index] if index < len(before) else b""
        if replaced and replaced != piece and replaced[:64] == piece[:64]:
            delta = native.encode_delta_frame_always(piece, replaced, claimed_depth)
            request.chunked.frames[index] = delta
    return request


def stored_depth(api: Api, digest: str) -> int:
    tenant = api.server.resources.engine.store.tenant("default")
    return int(tenant.objects.content_and_depth(digest, 1 << 30)[1])


def test_chunked_upload_takes_a_delta_on_a_stored_chunk_at_the_stores_depth(
    s: str, api: Api
) -> None:
    old, new = growing(8), growing(8) + b" more words at the end"
    api.call(api.checkpoints.SaveState, chunked_request(old))
    request = delta_request(old, new, claimed_depth=9)  # the client's guess is ignored
    deltas = [f for f in request.chunked.frames if native.frame_delta_base(f) is not None]
    assert len(deltas) == 1
    saved = api.call(api.checkpoints.SaveState, request)
    assert (saved.digest, saved.size) == (sha(new), len(new))
    assert api.load(s).data == new
    base, _ = native.frame_delta_base(deltas[0]) or ("", 0)
    assert stored_depth(api, base) == 0
    assert stored_depth(api, native.frame_digest_hex(deltas[0])) == 1


def test_delta_uploads_never_chain_past_the_limit(s: str, api: Api) -> None:
    states = [growing(8) + b" step" * i for i in range(native.MAX_DELTA_DEPTH + 4)]
    api.call(api.checkpoints.SaveState, chunked_request(states[0]))
    for old, new in itertools.pairwise(states):
        api.call(api.checkpoints.SaveState, delta_request(old, new))
        assert api.load(s).data == new
    last = [new[o : o + n] for o, n in native.chunk_boundaries(states[-1])][-1]
    depths = [stored_depth(api, sha(new[o : o + n])) for new in states for o, n in
              native.chunk_boundaries(new)]  # fmt: skip
    assert max(depths) == native.MAX_DELTA_DEPTH
    assert stored_depth(api, sha(last)) < native.MAX_DELTA_DEPTH  # restarted from a plain frame


def test_a_delta_on_a_chunk_the_daemon_lacks_is_a_missing_chunk(s: str, api: Api) -> None:
    old, new = growing(8), growing(8) + b" more"
    request = delta_request(old, new)  # `old` was never saved
    api.fails(api.checkpoints.SaveState, request, PRECONDITION, "chunks are missing", keeps=s)


def damaged_delta_upload(api: Api, damage: Callable[[bytearray], None]) -> Any:
    """A stored state, then the upload of its grown successor with its delta frame
    passed through `damage`."""
    old, new = growing(8), growing(8) + b" more"
    api.call(api.checkpoints.SaveState, chunked_request(old))
    request = delta_request(old, new)
    frames = request.chunked.frames
    index = next(i for i, f in enumerate(frames) if native.frame_delta_base(f) is not None)
    frame = bytearray(frames[index])
    damage(frame)
    frames[index] = bytes(frame)
    return request


@pytest.mark.parametrize("depth", [0, native.MAX_DELTA_DEPTH + 1, 255])
def test_a_delta_upload_of_impossible_depth_is_invalid(s: str, api: Api, depth: int) -> None:
    def set_depth(frame: bytearray) -> None:
        frame[native.FRAME_HEADER_SIZE + 32] = depth  # after the base's digest

    request = damaged_delta_upload(api, set_depth)
    api.fails(api.checkpoints.SaveState, request, INVALID, "depth", keeps=s)


def test_a_corrupt_delta_upload_is_invalid(s: str, api: Api) -> None:
    def flip(frame: bytearray) -> None:
        frame[-2] ^= 0xFF

    request = damaged_delta_upload(api, flip)
    api.fails(api.checkpoints.SaveState, request, INVALID, "corrupt", keeps=s)


@pytest.mark.parametrize(
    ("change", "word"),
    [
        (lambda c: setattr(c, "size", c.size + 1), "add up"),
        (lambda c: setattr(c, "digest", "XYZ"), "digest"),
        (lambda c: setattr(c, "keep", 1), "base_checkpoint_id"),
        (lambda c: c.chunks[0].__setattr__("digest", "../x"), "malformed"),
        (lambda c: c.frames.append(native.encode_frame(b"stray")), "not in the chunk list"),
    ],
)
def test_chunked_upload_rejects_inconsistent_fields(
    s: str, api: Api, change: Callable[[Any], None], word: str
) -> None:
    request = chunked_request(growing(10))
    change(request.chunked)
    api.fails(api.checkpoints.SaveState, request, INVALID, word, keeps=s)


def test_chunked_upload_on_another_tenants_base_is_not_found(api: Api) -> None:
    api.create("s")
    base = api.call(api.checkpoints.SaveState, chunked_request(growing(10)))
    other = api.as_tenant("t2")
    other.create("s")
    request = chunked_request(growing(10), base_checkpoint_id=base.checkpoint_id, keep=1)
    other.fails(other.checkpoints.SaveState, request, NOT_FOUND, base.checkpoint_id, keeps="s")


def test_find_missing_chunks_never_looks_into_another_tenant(api: Api) -> None:
    api.create("s")
    api.call(api.checkpoints.SaveState, chunked_request(growing(10)))
    digests = [ref.digest for ref in chunked_request(growing(10)).chunked.chunks]
    find = checkpoint_pb2.FindMissingChunksRequest(digests=digests)
    assert list(api.call(api.checkpoints.FindMissingChunks, find).missing) == []
    other = api.as_tenant("t2")
    assert list(other.call(other.checkpoints.FindMissingChunks, find).missing) == digests


def test_find_missing_chunks_rejects_malformed_digests(api: Api) -> None:
    request = checkpoint_pb2.FindMissingChunksRequest(digests=["../x"])
    api.fails(api.checkpoints.FindMissingChunks, request, INVALID, "digest")


# -- LoadState ----------------------------------------------------------------------------


def test_load_returns_the_latest_state(s: str, api: Api) -> None:
    loaded = api.load(s)
    assert (loaded.data, loaded.checkpoint_id, loaded.version) == (b"second", "c2", 3)
    assert loaded.digest == sha(b"second")
    assert loaded.checkpoint.session_id == s


def test_load_a_given_checkpoint(s: str, api: Api) -> None:
    loaded = api.load(s, checkpoint_id="c1")
    assert (loaded.data, loaded.digest) == (b"first", sha(b"first"))
    assert loaded.version == 3  # the session's version when read


def test_load_by_namespace_returns_that_namespaces_latest(api: Api) -> None:
    api.create("s")
    api.save("s", b"plan-1", namespace="plan")
    api.save("s", b"main-1")
    api.save("s", b"plan-2", namespace="plan")
    assert api.load("s", namespace="plan").data == b"plan-2"
    assert api.load("s").data == b"main-1"
    api.fails(
        api.checkpoints.LoadState,
        checkpoint_pb2.LoadStateRequest(session_id="s", namespace="other"),
        NOT_FOUND,
        "no saved state",
    )


def test_load_of_a_session_without_state_is_not_found(api: Api) -> None:
    api.create("empty")
    request = checkpoint_pb2.LoadStateRequest(session_id="empty")
    api.fails(api.checkpoints.LoadState, request, NOT_FOUND, "no saved state")


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({"session_id": ""}, INVALID, "session_id"),
        ({"session_id": "../x"}, INVALID, "session_id"),
        ({"session_id": "k" * 1024}, INVALID, "session_id"),
        ({"session_id": "nope"}, NOT_FOUND, "nope"),
        ({"checkpoint_id": "../x"}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "k" * 1024}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "unknown"}, NOT_FOUND, "unknown"),
    ],
)
def test_load_bad_input(
    s: str, api: Api, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    request = checkpoint_pb2.LoadStateRequest(**{"session_id": s, **fields})
    api.fails(api.checkpoints.LoadState, request, code, word, keeps=s)


def test_load_of_another_sessions_checkpoint_is_not_found(s: str, api: Api) -> None:
    api.create("t")
    request = checkpoint_pb2.LoadStateRequest(session_id="t", checkpoint_id="c1")
    api.fails(api.checkpoints.LoadState, request, NOT_FOUND, "c1")


def test_load_of_another_tenants_session_is_not_found(s: str, api: Api) -> None:
    other = api.as_tenant("t2")
    request = checkpoint_pb2.LoadStateRequest(session_id=s)
    other.fails(other.checkpoints.LoadState, request, NOT_FOUND)


def test_load_of_damaged_bytes_is_data_loss_never_data(api: Api) -> None:
    api.create("s")
    saved = api.save("s", os.urandom(1500))  # one raw (incompressible) chunk
    api.server.resources.engine.store.sync_objects()  # the object file is on disk now
    digest = saved.digest
    objects = api.server.config.data_dir / "tenants" / "default" / "objects"
    found = find_on_disk(objects, digest)
    assert found is not None
    path, offset, length = found
    with open(path, "r+b") as f:  # flip one bit of the frame's last bytes
        f.seek(offset + length - 10)
        byte = f.read(1)[0]
        f.seek(offset + length - 10)
        f.write(bytes([byte ^ 0x01]))
    request = checkpoint_pb2.LoadStateRequest(session_id="s")
    api.fails(api.checkpoints.LoadState, request, grpc.StatusCode.DATA_LOSS, digest)
    assert api.get("s").version == 2  # still serving


# -- PauseExecution / ResumeExecution -------------------------------------------------------


def pause(api: Api, session_id: str = "s", **fields: Any) -> Any:
    request = checkpoint_pb2.PauseExecutionRequest(session_id=session_id, **fields)
    return api.call(api.checkpoints.PauseExecution, request)


def resume(api: Api, session_id: str = "s", **fields: Any) -> Any:
    request = checkpoint_pb2.ResumeExecutionRequest(session_id=session_id, **fields)
    return api.call(api.checkpoints.ResumeExecution, request)


def test_pause_then_resume_returns_the_latest_state(s: str, api: Api) -> None:
    paused = pause(api)
    assert paused.session.status == common_pb2.SESSION_STATUS_PAUSED
    assert paused.session.version == 4
    assert not paused.HasField("saved")
    resumed = resume(api)
    assert resumed.session.status == common_pb2.SESSION_STATUS_ACTIVE
    assert resumed.session.version == 5
    assert (resumed.state.data, resumed.state.checkpoint_id) == (b"second", "c2")


def test_pause_with_a_state_saves_it_first(s: str, api: Api) -> None:
    paused = pause(api, state=save_request("ignored", b"paused state"), expected_version=3)
    assert paused.saved.version == 4
    assert paused.saved.digest == sha(b"paused state")
    assert paused.session.version == 5
    assert resume(api).state.data == b"paused state"


def test_a_paused_session_still_accepts_saves(s: str, api: Api) -> None:
    pause(api)
    api.save(s, b"while paused")
    assert resume(api).state.data == b"while paused"


def test_resume_without_a_saved_state_has_no_state(api: Api) -> None:
    api.create("s")
    pause(api)
    assert not resume(api).HasField("state")


def test_resume_of_an_active_session_is_failed_precondition(s: str, api: Api) -> None:
    request = checkpoint_pb2.ResumeExecutionRequest(session_id=s)
    api.fails(api.checkpoints.ResumeExecution, request, PRECONDITION, "active", "paused", keeps=s)


def test_resume_twice_is_failed_precondition(s: str, api: Api) -> None:
    pause(api)
    resume(api)
    request = checkpoint_pb2.ResumeExecutionRequest(session_id=s)
    api.fails(api.checkpoints.ResumeExecution, request, PRECONDITION, keeps=s)


def test_pause_with_a_wrong_expected_version_saves_nothing(s: str, api: Api) -> None:
    request = checkpoint_pb2.PauseExecutionRequest(
        session_id=s, expected_version=2, state=save_request(data=b"lost")
    )
    api.fails(api.checkpoints.PauseExecution, request, ABORTED, "version 3", keeps=s)
    request = checkpoint_pb2.PauseExecutionRequest(session_id=s, expected_version=9)
    api.fails(api.checkpoints.PauseExecution, request, ABORTED, keeps=s)


def test_resume_with_a_wrong_expected_version_is_aborted(s: str, api: Api) -> None:
    pause(api)
    request = checkpoint_pb2.ResumeExecutionRequest(session_id=s, expected_version=3)
    api.fails(api.checkpoints.ResumeExecution, request, ABORTED, "version 4", keeps=s)


def test_pause_with_a_bad_state_pauses_nothing(s: str, api: Api) -> None:
    request = checkpoint_pb2.PauseExecutionRequest(
        session_id=s, state=save_request(checkpoint_id="../x")
    )
    api.fails(api.checkpoints.PauseExecution, request, INVALID, "checkpoint_id", keeps=s)


@pytest.mark.parametrize(
    ("session_id", "code"),
    [("", INVALID), ("../x", INVALID), ("k" * 1024, INVALID), ("no", NOT_FOUND)],
)
@pytest.mark.parametrize("rpc", ["PauseExecution", "ResumeExecution"])
def test_pause_and_resume_bad_ids(
    s: str, api: Api, rpc: str, session_id: str, code: grpc.StatusCode
) -> None:
    request_type = getattr(checkpoint_pb2, f"{rpc}Request")
    api.fails(getattr(api.checkpoints, rpc), request_type(session_id=session_id), code, keeps=s)


@pytest.mark.parametrize("rpc", ["PauseExecution", "ResumeExecution"])
def test_pause_and_resume_of_another_tenants_session_is_not_found(
    s: str, api: Api, rpc: str
) -> None:
    other = api.as_tenant("t2")
    request = getattr(checkpoint_pb2, f"{rpc}Request")(session_id=s)
    other.fails(getattr(other.checkpoints, rpc), request, NOT_FOUND)
    assert api.snapshot(s).version == 3


# -- CreateCheckpoint ---------------------------------------------------------------------------


def create_checkpoint(api: Api, session_id: str = "s", **fields: Any) -> Any:
    request = checkpoint_pb2.CreateCheckpointRequest(session_id=session_id, **fields)
    return api.call(api.checkpoints.CreateCheckpoint, request).checkpoint


def test_create_checkpoint_pins_the_current_state_without_copying(s: str, api: Api) -> None:
    pinned = create_checkpoint(api, name="before-refactor", metadata=struct({"why": "safe"}))
    assert pinned.name == "before-refactor"
    assert (pinned.digest, pinned.size, pinned.stored_bytes) == (sha(b"second"), 6, 0)
    assert pinned.parent_checkpoint_id == "c2"
    assert pinned.metadata["why"] == "safe"
    assert api.load(s, checkpoint_id=pinned.checkpoint_id).data == b"second"


def test_create_checkpoint_names_it_after_the_version_by_default(s: str, api: Api) -> None:
    pinned = create_checkpoint(api, checkpoint_id="pin")
    assert (pinned.checkpoint_id, pinned.name, pinned.version) == ("pin", "checkpoint-4", 4)


def test_create_checkpoint_without_a_state_is_failed_precondition(api: Api) -> None:
    api.create("empty")
    request = checkpoint_pb2.CreateCheckpointRequest(session_id="empty")
    api.fails(api.checkpoints.CreateCheckpoint, request, PRECONDITION, "no saved state")
    assert api.get("empty").version == 1


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({"session_id": ""}, INVALID, "session_id"),
        ({"session_id": "../x"}, INVALID, "session_id"),
        ({"session_id": "nope"}, NOT_FOUND, "nope"),
        ({"checkpoint_id": "../x"}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "k" * 1024}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "c1"}, EXISTS, "c1"),
        ({"name": "n" * 257}, INVALID, "name"),
        ({"metadata": struct({"big": "m" * (1 << 20)})}, INVALID, "metadata"),
        ({"expected_version": 2}, ABORTED, "version 3"),
    ],
)
def test_create_checkpoint_bad_input(
    s: str, api: Api, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    request = checkpoint_pb2.CreateCheckpointRequest(**{"session_id": s, **fields})
    api.fails(api.checkpoints.CreateCheckpoint, request, code, word, keeps=s)


def test_create_checkpoint_in_another_tenant_is_not_found(s: str, api: Api) -> None:
    other = api.as_tenant("t2")
    request = checkpoint_pb2.CreateCheckpointRequest(session_id=s)
    other.fails(other.checkpoints.CreateCheckpoint, request, NOT_FOUND)
    assert api.snapshot(s).checkpoint_count == 2


# -- RestoreCheckpoint --------------------------------------------------------------------------


def restore(api: Api, checkpoint_id: str, **fields: Any) -> Any:
    request = checkpoint_pb2.RestoreCheckpointRequest(checkpoint_id=checkpoint_id, **fields)
    return api.call(api.checkpoints.RestoreCheckpoint, request).state


def test_restore_returns_the_state_from_the_id_alone(s: str, api: Api) -> None:
    before = api.snapshot(s)
    state = restore(api, "c1")
    assert (state.data, state.checkpoint.session_id, state.digest) == (b"first", s, sha(b"first"))
    assert api.snapshot(s) == before  # not made current


def test_restore_make_current_makes_it_the_head_as_a_new_version(s: str, api: Api) -> None:
    state = restore(api, "c1", make_current=True, expected_version=3)
    assert state.version == 4
    session = api.get(s)
    assert (session.version, session.head_checkpoint_id) == (4, "c1")
    assert api.load(s).data == b"first"
    assert api.save(s, b"next").version == 5
    assert api.load(s).checkpoint.parent_checkpoint_id == "c1"


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({"checkpoint_id": ""}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "../x"}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "k" * 1024}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "unknown"}, NOT_FOUND, "unknown"),
        ({"checkpoint_id": "c1", "make_current": True, "expected_version": 2}, ABORTED, "version"),
    ],
)
def test_restore_bad_input(
    s: str, api: Api, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    request = checkpoint_pb2.RestoreCheckpointRequest(**fields)
    api.fails(api.checkpoints.RestoreCheckpoint, request, code, word, keeps=s)


def test_restore_of_another_tenants_checkpoint_is_not_found(s: str, api: Api) -> None:
    other = api.as_tenant("t2")
    request = checkpoint_pb2.RestoreCheckpointRequest(checkpoint_id="c1", make_current=True)
    other.fails(other.checkpoints.RestoreCheckpoint, request, NOT_FOUND, "c1")
    assert api.snapshot(s).head == "c2"


# -- ListCheckpoints ----------------------------------------------------------------------------


def list_request(session_id: str = "s", **fields: Any) -> Any:
    return checkpoint_pb2.ListCheckpointsRequest(session_id=session_id, **fields)


def pages(api: Api, page_size: int, **fields: Any) -> Iterator[list[str]]:
    token = ""
    while True:
        request = list_request(page_size=page_size, page_token=token, **fields)
        page = api.call(api.checkpoints.ListCheckpoints, request)
        yield [c.checkpoint_id for c in page.checkpoints]
        token = page.next_page_token
        if not token:
            return


@pytest.fixture
def five(api: Api) -> list[str]:
    """Session "s" with checkpoints k0..k4 (oldest first): even ones in namespace "a"."""
    api.create("s")
    for i in range(5):
        api.save(
            "s",
            f"state {i}".encode(),
            checkpoint_id=f"k{i}",
            namespace="a" if i % 2 == 0 else "",
            metadata=struct({"step": i, "kind": "even" if i % 2 == 0 else "odd"}),
        )
    return [f"k{i}" for i in range(5)]


def test_list_is_newest_first(five: list[str], api: Api) -> None:
    assert api.checkpoint_ids("s") == five[::-1]


def test_list_pages_through_every_checkpoint_once(five: list[str], api: Api) -> None:
    assert list(pages(api, page_size=2)) == [["k4", "k3"], ["k2", "k1"], ["k0"]]


def test_list_page_token_survives_deleting_the_last_listed_checkpoint(
    five: list[str], api: Api
) -> None:
    first = api.call(api.checkpoints.ListCheckpoints, list_request(page_size=2))
    assert [c.checkpoint_id for c in first.checkpoints] == ["k4", "k3"]
    delete_checkpoint(api, "k3")
    request = list_request(page_size=2, page_token=first.next_page_token)
    second = api.call(api.checkpoints.ListCheckpoints, request)
    assert [c.checkpoint_id for c in second.checkpoints] == ["k2", "k1"]


def test_list_filters_by_namespace(five: list[str], api: Api) -> None:
    assert api.checkpoint_ids("s", namespace="a") == ["k4", "k2", "k0"]
    assert api.checkpoint_ids("s", namespace="") == ["k3", "k1"]
    assert list(pages(api, page_size=1, namespace="a")) == [["k4"], ["k2"], ["k0"]]


def test_list_filters_by_a_metadata_subset(five: list[str], api: Api) -> None:
    assert api.checkpoint_ids("s", metadata_filter=struct({"kind": "odd"})) == ["k3", "k1"]
    assert api.checkpoint_ids("s", metadata_filter=struct({"kind": "odd", "step": 1})) == ["k1"]
    assert api.checkpoint_ids("s", metadata_filter=struct({"kind": "none"})) == []


def test_list_before_a_checkpoint(five: list[str], api: Api) -> None:
    assert api.checkpoint_ids("s", before="k2") == ["k1", "k0"]
    assert api.checkpoint_ids("s", before="k0") == []


def test_list_of_a_session_without_checkpoints_is_empty(api: Api) -> None:
    api.create("empty")
    assert api.checkpoint_ids("empty") == []


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({"session_id": ""}, INVALID, "session_id"),
        ({"session_id": "../x"}, INVALID, "session_id"),
        ({"session_id": "k" * 1024}, INVALID, "session_id"),
        ({"session_id": "nope"}, NOT_FOUND, "nope"),
        ({"page_size": -1}, INVALID, "page_size"),
        ({"page_token": "garbage"}, INVALID, "page_token"),
        ({"page_token": "!!!!"}, INVALID, "page_token"),
        ({"before": "unknown"}, NOT_FOUND, "unknown"),
        ({"before": "../x"}, INVALID, "before"),
        ({"before": "k" * 1024}, INVALID, "before"),
    ],
)
def test_list_bad_input(
    five: list[str], api: Api, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    api.fails(api.checkpoints.ListCheckpoints, list_request(**fields), code, word, keeps="s")


def test_list_of_another_tenants_session_is_not_found(five: list[str], api: Api) -> None:
    other = api.as_tenant("t2")
    other.fails(other.checkpoints.ListCheckpoints, list_request(), NOT_FOUND)


# -- DeleteCheckpoint ----------------------------------------------------------------------------


def delete_checkpoint(api: Api, checkpoint_id: str, **fields: Any) -> None:
    request = checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id=checkpoint_id, **fields)
    api.call(api.checkpoints.DeleteCheckpoint, request)


def test_delete_checkpoint_removes_it(s: str, api: Api) -> None:
    delete_checkpoint(api, "c1", expected_version=3)
    assert api.checkpoint_ids(s) == ["c2"]
    assert api.get(s).version == 4
    api.fails(
        api.checkpoints.LoadState,
        checkpoint_pb2.LoadStateRequest(session_id=s, checkpoint_id="c1"),
        NOT_FOUND,
    )


def test_delete_of_the_head_moves_the_head_back(s: str, api: Api) -> None:
    delete_checkpoint(api, "c2")
    assert api.get(s).head_checkpoint_id == "c1"
    assert api.load(s).data == b"first"


def test_a_deleted_checkpoint_id_can_be_used_again(s: str, api: Api) -> None:
    delete_checkpoint(api, "c1")
    assert api.save(s, b"again", checkpoint_id="c1").checkpoint_id == "c1"


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({"checkpoint_id": ""}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "../x"}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "k" * 1024}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "unknown"}, NOT_FOUND, "unknown"),
        ({"checkpoint_id": "c1", "expected_version": 2}, ABORTED, "version 3"),
    ],
)
def test_delete_checkpoint_bad_input(
    s: str, api: Api, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    request = checkpoint_pb2.DeleteCheckpointRequest(**fields)
    api.fails(api.checkpoints.DeleteCheckpoint, request, code, word, keeps=s)


def test_delete_of_another_tenants_checkpoint_is_not_found(s: str, api: Api) -> None:
    other = api.as_tenant("t2")
    request = checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id="c1")
    other.fails(other.checkpoints.DeleteCheckpoint, request, NOT_FOUND)
    assert api.snapshot(s).checkpoint_count == 2


# -- ForkSession -----------------------------------------------------------------------------


def fork(api: Api, checkpoint_id: str, **fields: Any) -> Any:
    request = checkpoint_pb2.ForkSessionRequest(checkpoint_id=checkpoint_id, **fields)
    return api.call(api.checkpoints.ForkSession, request).session


def test_fork_starts_a_new_session_at_the_checkpoint(s: str, api: Api) -> None:
    before = api.snapshot(s)
    forked = fork(api, "c1", new_session_id="f", labels={"from": "s"})
    assert (forked.session_id, forked.forked_from_checkpoint_id) == ("f", "c1")
    assert (forked.version, forked.checkpoint_count, dict(forked.labels)) == (2, 1, {"from": "s"})
    loaded = api.load("f")
    assert (loaded.data, loaded.checkpoint.stored_bytes) == (b"first", 0)  # shared objects
    assert loaded.checkpoint_id != "c1"
    assert api.snapshot(s) == before


def test_fork_without_an_id_generates_one_and_keeps_retention(api: Api) -> None:
    api.create("s", retention=session_pb2.RetentionPolicy(keep_last=2))
    saved = api.save("s", b"x")
    forked = fork(api, saved.checkpoint_id)
    assert forked.session_id not in ("", "s")
    assert forked.retention.keep_last == 2


def test_a_fork_and_its_source_evolve_apart(s: str, api: Api) -> None:
    fork(api, "c2", new_session_id="f")
    api.save("f", b"fork only")
    api.save(s, b"source only")
    assert (api.load("f").data, api.load(s).data) == (b"fork only", b"source only")


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({"checkpoint_id": ""}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "../x"}, INVALID, "checkpoint_id"),
        ({"checkpoint_id": "unknown"}, NOT_FOUND, "unknown"),
        ({"checkpoint_id": "c1", "new_session_id": "../x"}, INVALID, "session_id"),
        ({"checkpoint_id": "c1", "new_session_id": "k" * 1024}, INVALID, "session_id"),
        ({"checkpoint_id": "c1", "new_session_id": "s"}, EXISTS, "'s'"),
    ],
)
def test_fork_bad_input(
    s: str, api: Api, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    request = checkpoint_pb2.ForkSessionRequest(**fields)
    api.fails(api.checkpoints.ForkSession, request, code, word, keeps=s)
    assert [x.session_id for x in api.call(api.sessions.ListSessions, _list_all()).sessions] == [s]


def _list_all() -> Any:
    return session_pb2.ListSessionsRequest()


def test_fork_of_another_tenants_checkpoint_is_not_found(s: str, api: Api) -> None:
    other = api.as_tenant("t2")
    request = checkpoint_pb2.ForkSessionRequest(checkpoint_id="c1", new_session_id="f")
    other.fails(other.checkpoints.ForkSession, request, NOT_FOUND, "c1")
    assert list(other.call(other.sessions.ListSessions, _list_all()).sessions) == []


# -- SaveStates -------------------------------------------------------------------------------


def save_states(api: Api, requests: list[Any]) -> list[Any]:
    stream = api.checkpoints.SaveStates(
        (checkpoint_pb2.SaveStatesRequest(request=r) for r in requests),
        timeout=15,
        metadata=api.metadata,
    )
    return list(stream)


def test_save_states_answers_each_request_in_order(api: Api) -> None:
    api.create("s")
    responses = save_states(api, [save_request(data=f"state {i}".encode()) for i in range(20)])
    assert [r.response.version for r in responses] == list(range(2, 22))
    assert all(not r.HasField("error") for r in responses)
    assert api.load("s").data == b"state 19"


def test_save_states_fails_bad_items_and_goes_on(s: str, api: Api) -> None:
    requests = [
        save_request(data=b"ok 1"),
        save_request("../x"),
        save_request(data=b"ok 2"),
        save_request("nope"),
        save_request(expected_version=1),
        save_request(checkpoint_id="c1"),
        save_request(parent_checkpoint_id="unknown"),
        save_request(data=b"ok 3", expected_version=5),
    ]
    responses = save_states(api, requests)
    assert len(responses) == len(requests)
    codes = [grpc.StatusCode.OK if r.HasField("response") else r.error.code for r in responses]
    assert codes == [
        grpc.StatusCode.OK,
        INVALID.value[0],
        grpc.StatusCode.OK,
        NOT_FOUND.value[0],
        ABORTED.value[0],
        EXISTS.value[0],
        NOT_FOUND.value[0],
        grpc.StatusCode.OK,
    ]
    assert "session_id" in responses[1].error.message
    assert [r.response.version for r in responses if r.HasField("response")] == [4, 5, 6]
    assert api.load(s).data == b"ok 3"


def test_save_states_fails_an_oversized_item_and_goes_on(start_api: Callable[..., Api]) -> None:
    api = start_api(max_message_bytes=64 << 10)
    api.create("s")
    big = save_request(data=os.urandom(70_000))
    responses = save_states(api, [save_request(data=b"a"), big, save_request(data=b"c")])
    assert [r.error.code for r in responses] == [0, EXHAUSTED.value[0], 0]
    assert api.load("s").data == b"c"


def test_save_states_of_nothing_answers_nothing(api: Api) -> None:
    assert save_states(api, []) == []


def test_save_states_of_another_tenants_session_fails_that_item(s: str, api: Api) -> None:
    other = api.as_tenant("t2")
    (response,) = save_states(other, [save_request()])
    assert response.error.code == NOT_FOUND.value[0]
    assert api.snapshot(s).version == 3


# -- Retention ---------------------------------------------------------------------------------


def test_keep_last_drops_the_oldest_unnamed_checkpoints_but_keeps_named_ones(api: Api) -> None:
    api.create("s", retention=session_pb2.RetentionPolicy(keep_last=3))
    api.save("s", b"0", checkpoint_id="u0")
    api.save("s", b"1", checkpoint_id="u1")
    create_checkpoint(api, name="pinned", checkpoint_id="named")
    for i in range(2, 7):
        api.save("s", str(i).encode(), checkpoint_id=f"u{i}")
    assert api.checkpoint_ids("s") == ["u6", "u5", "u4", "named"]
    assert api.load("s", checkpoint_id="named").data == b"1"
    request = checkpoint_pb2.RestoreCheckpointRequest(checkpoint_id="u0")
    api.fails(api.checkpoints.RestoreCheckpoint, request, NOT_FOUND, "u0")


def test_keep_last_one_keeps_only_the_head(api: Api) -> None:
    api.create("s", retention=session_pb2.RetentionPolicy(keep_last=1))
    for i in range(4):
        api.save("s", str(i).encode(), checkpoint_id=f"u{i}")
    assert api.checkpoint_ids("s") == ["u3"]
    assert api.load("s").data == b"3"


def test_max_age_drops_old_unnamed_checkpoints_but_keeps_named_ones(api: Api) -> None:
    api.create("s", retention=session_pb2.RetentionPolicy(max_age_seconds=0.3))
    api.save("s", b"old", checkpoint_id="old")
    create_checkpoint(api, name="pinned", checkpoint_id="named")
    api.save("s", b"older", checkpoint_id="older")
    time.sleep(0.4)
    api.save("s", b"new", checkpoint_id="new")
    assert api.checkpoint_ids("s") == ["new", "named"]
    assert api.load("s").data == b"new"


def test_without_retention_every_checkpoint_is_kept(api: Api) -> None:
    api.create("s")
    for i in range(12):
        api.save("s", str(i).encode())
    assert len(api.checkpoint_ids("s")) == 12


def test_errors_carry_a_reason_and_metadata_clients_can_match(api: Api) -> None:
    """ErrorInfo (domain stratad.dev) instead of matching English text."""
    api.create("s1")
    api.save("s1", b"one")
    stale = checkpoint_pb2.SaveStateRequest(session_id="s1", data=b"two", expected_version=1)
    with pytest.raises(grpc.RpcError) as raised:
        api.call(api.checkpoints.SaveState, stale)
    info = error_info(raised.value)
    assert info is not None
    assert (info.domain, info.reason) == (ERROR_DOMAIN, "VERSION_CONFLICT")
    with pytest.raises(grpc.RpcError) as raised:
        api.call(api.sessions.GetSession, session_pb2.GetSessionRequest(session_id="../x"))
    info = error_info(raised.value)
    assert info is not None and info.reason == "INVALID_ID"
