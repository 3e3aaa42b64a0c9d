"""The Python SDK (`stratad.Client`, `stratad.AsyncClient`) against an in-process daemon."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest

import stratad
from stratad import errors, native
from stratad.api.v1 import admin_pb2, checkpoint_pb2, checkpoint_pb2_grpc, session_pb2
from stratad.domain import checkpoints as checkpoints_domain
from stratad.sdk.client import save_request

if TYPE_CHECKING:
    from conftest import Api

WORDS = ["agent", "tool", "search", "user", "revenue", "table", "notes", "errors", "retries"]


def growing_states(steps: int, base: int = 256 << 10, step: int = 4 << 10) -> list[bytes]:
    """A large state that grows at its end: a long history plus one message per step."""
    rng = random.Random(7)
    text = " ".join(rng.choice(WORDS) for _ in range((base + steps * step) // 4)).encode()
    return [text[: base + i * step] + f'"step": {i}'.encode() for i in range(steps)]


class Recorder(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Records (method name, request) of every unary call on a channel."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        sent = type(request)()
        sent.CopyFrom(request)  # as sent: the SDK may change a request to retry it
        self.calls.append((details.method.rsplit("/", 1)[-1], sent))
        return continuation(details, request)

    @property
    def methods(self) -> list[str]:
        return [name for name, _ in self.calls]

    def requests(self, method: str) -> list[Any]:
        return [request for name, request in self.calls if name == method]


def record(client: stratad.Client) -> Recorder:
    """Route the client's CheckpointService calls through a Recorder."""
    recorder = Recorder()
    channel = grpc.intercept_channel(client.channel, recorder)
    client.checkpoints = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
    return recorder


@pytest.fixture
def client(api: Api) -> Iterator[stratad.Client]:
    with stratad.Client(api.target) as client:
        yield client


# -- Client basics ----------------------------------------------------------------------


def test_client_context_manager_closes_the_channel(api: Api) -> None:
    with stratad.Client(api.target) as client:
        assert client.create_session("s").session_id == "s"
    with pytest.raises(ValueError, match="closed channel"):
        client.get_session("s")


def test_client_methods_reach_the_daemon(client: stratad.Client) -> None:
    client.create_session("s", labels={"k": "v"}, keep_last=5)
    saved = client.save_state("s", b"one", content_type="text/plain", metadata={"n": 1})
    assert client.load_state("s").data == b"one"
    pinned = client.create_checkpoint("s", "pin", metadata={"why": "test"})
    assert client.restore_checkpoint(saved.checkpoint_id, make_current=True).data == b"one"
    assert [c.checkpoint_id for c in client.list_checkpoints("s", page_size=1)] == [
        pinned.checkpoint_id,
        saved.checkpoint_id,
    ]
    assert client.pause_execution("s", b"two").saved.size == 3
    assert client.resume_execution("s").state.data == b"two"
    forked = client.fork_session(saved.checkpoint_id, "f", labels={"from": "s"})
    assert [s.session_id for s in client.list_sessions(page_size=1)] == ["f", "s"]
    client.delete_checkpoint(pinned.checkpoint_id)
    client.delete_session(forked.session_id)
    assert client.get_session("s").retention.keep_last == 5
    assert client.verify().ok
    assert client.collect_garbage().objects_removed == 0
    assert client.store_stats().sessions == 1


def test_client_save_states_answers_each_request_in_order(client: stratad.Client) -> None:
    client.create_session("s")
    requests = [save_request("s", b"a"), save_request("../x", b"b"), save_request("s", b"c")]
    responses = list(client.save_states(requests, timeout=10))
    assert [r.response.version for r in responses] == [2, 0, 3]
    assert responses[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_client_watch_session_yields_events(client: stratad.Client) -> None:
    client.create_session("s")
    client.save_state("s", b"a")
    events = client.watch_session("s", from_version=1, timeout=10)
    first = next(events)
    events.close()
    assert (first.version, first.kind) == (2, "save")


def test_client_tenants_are_isolated(api: Api) -> None:
    with stratad.Client(api.target, tenant="a") as a, stratad.Client(api.target, tenant="b") as b:
        a.create_session("s")
        with pytest.raises(errors.NotFoundError):
            b.get_session("s")
        assert list(b.list_sessions()) == []


def test_call_sends_extra_metadata_with_the_clients_tenant(api: Api) -> None:
    """docs/observability.md: a request ID passed to `call` goes with the tenant header
    (passing metadata= to the stub replaced it) and errors are stratad errors."""
    seen: list[dict[str, str]] = []

    class Spy(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            seen.append(dict(details.metadata or ()))
            return continuation(details, request)

    with stratad.Client(api.target, tenant="acme") as client:
        client.create_session("s1")
        request = checkpoint_pb2.SaveStateRequest(session_id="s1", data=b"{}")
        extra = [("x-request-id", "req-42")]
        saved = client.call(client.checkpoints.SaveState, request, metadata=extra)
        assert client.load_state("s1").checkpoint_id == saved.checkpoint_id  # tenant acme
        with pytest.raises(errors.NotFoundError):
            missing = checkpoint_pb2.SaveStateRequest(session_id="nope", data=b"{}")
            client.call(client.checkpoints.SaveState, missing, metadata=extra)
        channel = grpc.intercept_channel(grpc.insecure_channel(api.target), Spy())
        stub = checkpoint_pb2_grpc.CheckpointServiceStub(channel)
        client.call(stub.SaveState, request, metadata=extra)
        channel.close()
    assert seen[-1]["x-request-id"] == "req-42" and seen[-1]["x-stratad-tenant"] == "acme"


# -- errors -----------------------------------------------------------------------------------


def _get_unknown(c: stratad.Client) -> Any:
    return c.get_session("nope")


def _get_bad_id(c: stratad.Client) -> Any:
    return c.get_session("../x")


def _create_twice(c: stratad.Client) -> Any:
    return c.create_session("s")


def _wrong_version(c: stratad.Client) -> Any:
    return c.save_state("s", b"x", expected_version=7)


def _resume_active(c: stratad.Client) -> Any:
    return c.resume_execution("s")


def _restore_unknown(c: stratad.Client) -> Any:
    return c.restore_checkpoint("unknown")


def _load_unsaved(c: stratad.Client) -> Any:
    return c.load_state("s")


@pytest.mark.parametrize(
    ("call", "error", "words", "reason"),
    [
        (_get_unknown, errors.NotFoundError, "'nope' not found", "SESSION_NOT_FOUND"),
        (_get_bad_id, errors.InvalidArgumentError, "invalid session_id", "INVALID_ID"),
        (_create_twice, errors.AlreadyExistsError, "already exists", "ALREADY_EXISTS"),
        (_wrong_version, errors.VersionConflictError, "not 7", "VERSION_CONFLICT"),
        (_resume_active, errors.FailedPreconditionError, "not paused", "SESSION_NOT_PAUSED"),
        (_restore_unknown, errors.NotFoundError, "unknown", "CHECKPOINT_NOT_FOUND"),
        (_load_unsaved, errors.NotFoundError, "no saved state", "CHECKPOINT_NOT_FOUND"),
    ],
)
def test_client_raises_the_stratad_error_of_each_status(
    client: stratad.Client,
    call: Callable[[stratad.Client], Any],
    error: type,
    words: str,
    reason: str,
) -> None:
    """With the reason the clients document (docs/errors.md, the Go and TS
    reason constants), not only the status code's."""
    client.create_session("s")
    with pytest.raises(error) as excinfo:
        call(client)
    assert isinstance(excinfo.value, errors.StratadError)
    assert words in excinfo.value.message
    assert excinfo.value.reason == reason
    assert client.get_session("s").version == 1


def test_client_oversized_state_is_resource_exhausted(start_api: Callable[..., Api]) -> None:
    api = start_api(max_message_bytes=64 << 10)
    with stratad.Client(api.target) as client:
        client.create_session("s")
        with pytest.raises(errors.ResourceExhaustedError, match="65536"):
            client.save_state("s", random.Random(1).randbytes(100_000))
        assert client.get_session("s").version == 1


def test_client_bad_tenant_is_invalid_argument(api: Api) -> None:
    client = stratad.Client(api.target, tenant="../x")
    with client, pytest.raises(errors.InvalidArgumentError, match="tenant"):
        client.create_session("s")


# -- deadlines ----------------------------------------------------------------------------------


def test_client_applies_its_deadline(black_hole: str) -> None:
    with stratad.Client(black_hole, timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(errors.DeadlineExceededError):
            client.get_session("s")
        assert time.monotonic() - started < 5


def test_client_per_call_timeout_overrides_the_default(black_hole: str) -> None:
    request = session_pb2.GetSessionRequest(session_id="s")
    with stratad.Client(black_hole, timeout=60) as client:
        started = time.monotonic()
        with pytest.raises(errors.DeadlineExceededError):
            client.call(client.sessions.GetSession, request, timeout=0.3)
        assert time.monotonic() - started < 5


def test_client_watch_ends_at_its_deadline(client: stratad.Client) -> None:
    client.create_session("s")
    with pytest.raises(errors.DeadlineExceededError):
        list(client.watch_session("s", timeout=0.3))


# -- chunked uploads ------------------------------------------------------------------------------


def test_growing_state_saved_50_times_loads_back_identical_and_stores_little(
    client: stratad.Client,
) -> None:
    client.create_session("s")
    recorder = record(client)
    states = growing_states(50)
    saved = [client.save_state("s", state) for state in states]
    for response, state in zip(saved, states, strict=True):
        assert client.load_state("s", response.checkpoint_id).data == state
    assert [r.size for r in saved] == [len(s) for s in states]
    assert saved[0].stored_bytes > 0
    assert max(r.stored_bytes for r in saved[1:]) < 40_000  # a tail chunk or two, compressed
    sent = [request.ByteSize() for request in recorder.requests("SaveState")]
    assert len(sent) == 50
    assert max(sent[1:]) < len(states[-1]) // 4  # only what the daemon lacks travels


def saved_one_by_one(client: stratad.Client, states: list[bytes]) -> Recorder:
    """Save `states` to a new session "s", each loaded back as saved; the calls made."""
    client.create_session("s")
    recorder = record(client)
    for state in states:
        client.save_state("s", state)
        assert client.load_state("s").data == state
    return recorder


@pytest.fixture
def predates_delta_uploads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon decodes every uploaded frame as daemons before delta uploads did."""
    monkeypatch.setattr(
        checkpoints_domain,
        "_decode_upload",
        lambda live, frame, listed: (frame, native.decode_frame(frame, listed)),
    )


def test_sdk_sends_a_rewritten_chunk_as_a_delta_on_the_one_it_replaces(
    client: stratad.Client,
) -> None:
    recorder = saved_one_by_one(client, growing_states(3))
    first, *later = recorder.requests("SaveState")
    assert all(native.frame_delta_base(f) is None for f in first.chunked.frames)
    for request in later:
        deltas = [f for f in request.chunked.frames if native.frame_delta_base(f) is not None]
        assert deltas, "the grown last chunk travels as a delta"


@pytest.mark.usefixtures("predates_delta_uploads")
def test_sdk_sends_plain_frames_to_a_daemon_that_predates_delta_uploads(
    client: stratad.Client,
) -> None:
    recorder = saved_one_by_one(client, growing_states(3))
    # Refused once as undecodable, then sent plain, and plain from then on.
    assert recorder.methods.count("SaveState") == 4
    refused, resent, last = recorder.requests("SaveState")[1:]
    assert any(native.frame_delta_base(f) is not None for f in refused.chunked.frames)
    for request in (resent, last):
        assert all(native.frame_delta_base(f) is None for f in request.chunked.frames)


def test_small_states_are_sent_whole(client: stratad.Client) -> None:
    client.create_session("s")
    recorder = record(client)
    client.save_state("s", b"tiny")
    client.save_state("s", growing_states(1)[0])
    small, large = recorder.requests("SaveState")
    assert (small.data, small.HasField("chunked")) == (b"tiny", False)
    assert (large.data, large.HasField("chunked")) == (b"", True)


def test_sdk_uploads_chunks_again_after_gc_removed_them(client: stratad.Client) -> None:
    states = growing_states(2)
    client.create_session("a")
    client.save_state("a", states[0])
    client.delete_session("a")
    assert client.collect_garbage().bytes_freed > 0  # the chunks the client believes stored
    client.create_session("b")
    recorder = record(client)
    saved = client.save_state("b", states[1])
    assert recorder.methods == ["SaveState", "FindMissingChunks", "SaveState"]
    assert client.load_state("b").data == states[1]
    assert saved.digest == client.load_state("b").digest


def test_sdk_saves_with_keep_last_one_and_gc_after_every_step(client: stratad.Client) -> None:
    client.create_session("s", keep_last=1)
    for state in growing_states(10):
        client.save_state("s", state)
        client.collect_garbage()
        assert client.load_state("s").data == state
    assert client.get_session("s").checkpoint_count == 1
    assert client.verify().ok


def test_sdk_recovers_when_its_base_checkpoint_is_gone(api: Api, client: stratad.Client) -> None:
    states = growing_states(3)
    client.create_session("s")
    client.save_state("s", states[0])
    base = client.save_state("s", states[1])
    request = checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id=base.checkpoint_id)
    api.call(api.checkpoints.DeleteCheckpoint, request)  # behind the SDK's back
    api.call(api.admin.CollectGarbage, admin_pb2.CollectGarbageRequest())
    recorder = record(client)
    client.save_state("s", states[2])
    assert recorder.methods[:2] == ["SaveState", "SaveState"]  # refused, then without the base
    assert client.load_state("s").data == states[2]


def test_sdk_recovers_when_a_new_daemon_replaces_the_old_one(
    start_api: Callable[..., Api],
) -> None:
    first = start_api()
    states = growing_states(2)
    with stratad.Client(first.target) as client:
        client.create_session("s")
        client.save_state("s", states[0])
        first.server.stop()
        start_api(listen=first.target)  # a fresh data directory at the same address
        client.create_session("s")
        recorder = record(client)
        saved = client.save_state("s", states[1])
        assert "FindMissingChunks" in recorder.methods
        assert client.load_state("s").data == states[1]
        assert saved.version == 2


# -- AsyncClient ---------------------------------------------------------------------------------


@pytest.mark.parametrize("chunked_uploads", [True, False])
def test_save_takes_the_state_beside_the_request_and_leaves_the_request_alone(
    api: Api, chunked_uploads: bool
) -> None:
    """`save(request, data)`: the state kept out of the message (the LangGraph
    saver does so: a chunked upload would copy it in only to empty it again)."""
    with stratad.Client(api.target, chunked_uploads=chunked_uploads) as client:
        client.create_session("s")
        recorder = record(client)
        for data in (b"tiny", growing_states(1)[0]):
            request = checkpoint_pb2.SaveStateRequest(session_id="s", content_type="text/plain")
            saved = client.save(request, data)
            assert request == checkpoint_pb2.SaveStateRequest(
                session_id="s", content_type="text/plain"
            )
            loaded = client.load_state("s", saved.checkpoint_id)
            assert (loaded.data, loaded.checkpoint.content_type) == (data, "text/plain")
        sent = recorder.requests("SaveState")
        chunked = [r.HasField("chunked") for r in sent]
        assert chunked == ([False, True] if chunked_uploads else [False, False])


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_async_client_round_trip_with_chunked_uploads(api: Api) -> None:
    states = growing_states(5)

    async def scenario() -> list[bytes]:
        async with stratad.AsyncClient(api.target) as client:
            await client.create_session("s")
            ids = [(await client.save_state("s", s)).checkpoint_id for s in states]
            return [(await client.load_state("s", cid)).data for cid in ids]

    assert run(scenario()) == states


@pytest.mark.usefixtures("predates_delta_uploads")
def test_async_client_sends_plain_frames_to_a_daemon_that_predates_delta_uploads(
    api: Api,
) -> None:
    states = growing_states(3)

    async def scenario() -> tuple[list[bytes], bool]:
        async with stratad.AsyncClient(api.target) as client:
            await client.create_session("s")
            ids = [(await client.save_state("s", s)).checkpoint_id for s in states]
            loaded = [(await client.load_state("s", cid)).data for cid in ids]
            return loaded, client._uploader is not None and client._uploader.deltas

    assert run(scenario()) == (states, False)


def test_async_client_context_manager_closes_the_channel(api: Api) -> None:
    async def scenario() -> None:
        async with stratad.AsyncClient(api.target) as client:
            await client.create_session("s")
        with pytest.raises(Exception, match=r"[Cc]losed"):
            await client.get_session("s")

    run(scenario())


@pytest.mark.parametrize(
    ("session_id", "error"),
    [("nope", errors.NotFoundError), ("../x", errors.InvalidArgumentError)],
)
def test_async_client_raises_stratad_errors(api: Api, session_id: str, error: type) -> None:
    async def scenario() -> None:
        async with stratad.AsyncClient(api.target) as client:
            await client.get_session(session_id)

    with pytest.raises(error):
        run(scenario())


def test_async_client_applies_its_deadline(black_hole: str) -> None:
    async def scenario() -> None:
        async with stratad.AsyncClient(black_hole, timeout=0.3) as client:
            await client.get_session("s")

    started = time.monotonic()
    with pytest.raises(errors.DeadlineExceededError):
        run(scenario())
    assert time.monotonic() - started < 5


def test_async_client_recovers_after_gc(api: Api) -> None:
    states = growing_states(2)

    async def scenario() -> bytes:
        async with stratad.AsyncClient(api.target) as client:
            await client.create_session("a")
            await client.save_state("a", states[0])
            await client.delete_session("a")
            await client.collect_garbage()
            await client.create_session("b")
            await client.save_state("b", states[1])
            return (await client.load_state("b")).data

    assert run(scenario()) == states[1]


def test_async_client_watch_session(api: Api) -> None:
    async def scenario() -> list[tuple[int, str]]:
        async with stratad.AsyncClient(api.target) as client:
            await client.create_session("s")
            await client.save_state("s", b"a")
            await client.pause_execution("s")
            events = []
            async for event in client.watch_session("s", from_version=1):
                events.append((event.version, event.kind))
                if len(events) == 2:
                    break
            return events

    assert run(scenario()) == [(2, "save"), (3, "status")]


def test_top_level_names() -> None:
    assert stratad.Client.__name__ == "Client"
    assert stratad.AsyncClient.__name__ == "AsyncClient"
    assert session_pb2.Session.DESCRIPTOR.full_name == "stratad.api.v1.Session"
