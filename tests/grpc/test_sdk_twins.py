"""The parameters and methods tests/unit/test_sdk_surface.py asks of both SDK twins,
against an in-process daemon: each test runs the same scenario through `Client`
and `AsyncClient` (the ``twin`` fixture wraps the async one so that a scenario is
written once; what is async-only is tested on its own)."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import struct_pb2

import stratad
from stratad import errors
from stratad.api.v1 import common_pb2, task_pb2, task_pb2_grpc
from stratad.sdk.client import save_request
from stratad.sdk.constants import TENANT_HEADER

if TYPE_CHECKING:
    from conftest import Api


class Blocking:
    """An `AsyncClient` driven like a `Client`: each call runs to completion on a
    loop of its own thread (the client belongs to that loop); iterators are
    collected into lists."""

    def __init__(self, target: str, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.client: stratad.AsyncClient = self._run(self._make(target, options))

    @staticmethod
    async def _make(target: str, options: dict[str, Any]) -> stratad.AsyncClient:
        return stratad.AsyncClient(target, **options)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    def __getattr__(self, name: str) -> Any:
        member = getattr(self.client, name)
        if inspect.isasyncgenfunction(getattr(type(self.client), name, None)):

            async def collect(*args: Any, **kwargs: Any) -> list[Any]:
                return [item async for item in member(*args, **kwargs)]

            return lambda *args, **kwargs: iter(self._run(collect(*args, **kwargs)))
        if inspect.iscoroutinefunction(getattr(type(self.client), name, None)):
            return lambda *args, **kwargs: self._run(member(*args, **kwargs))
        return member

    def close(self) -> None:
        self._run(self.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


Twin = Any  # a stratad.Client, or a Blocking AsyncClient


@pytest.fixture(params=["Client", "AsyncClient"])
def connect(request: pytest.FixtureRequest) -> Iterator[Callable[..., Twin]]:
    made: list[Any] = []

    def make(target: str, **options: Any) -> Twin:
        twin = (
            stratad.Client(target, **options)
            if request.param == "Client"
            else Blocking(target, **options)
        )
        made.append(twin)
        return twin

    yield make
    for twin in made:
        twin.close()


@pytest.fixture
def twin(api: Api, connect: Callable[..., Twin]) -> Twin:
    return connect(api.target)


def parent_of(twin: Twin, session_id: str, checkpoint_id: str) -> str:
    return str(twin.load_state(session_id, checkpoint_id).checkpoint.parent_checkpoint_id)


# -- no_parent ------------------------------------------------------------------------------


def test_save_state_with_no_parent_starts_a_new_line(twin: Twin) -> None:
    twin.create_session("s")
    first = twin.save_state("s", b"one").checkpoint_id
    second = twin.save_state("s", b"two").checkpoint_id
    third = twin.save_state("s", b"three", no_parent=True).checkpoint_id
    assert parent_of(twin, "s", second) == first
    assert parent_of(twin, "s", third) == ""
    assert twin.get_session("s").head_checkpoint_id == third  # still the head
    fourth = twin.save_state("s", b"four").checkpoint_id
    assert parent_of(twin, "s", fourth) == third


def test_save_state_no_parent_with_a_parent_is_invalid(twin: Twin) -> None:
    twin.create_session("s")
    first = twin.save_state("s", b"one").checkpoint_id
    with pytest.raises(errors.InvalidArgumentError, match="no_parent"):
        twin.save_state("s", b"two", parent_checkpoint_id=first, no_parent=True)


def test_a_large_state_saved_in_chunks_keeps_no_parent(twin: Twin) -> None:
    """The chunked upload carries the request's fields (the state is not sent whole)."""
    twin.create_session("s")
    big = bytes(range(256)) * 4096  # 1 MiB: uploaded in chunks
    twin.save_state("s", big)
    saved = twin.save_state("s", big + b"more", no_parent=True, namespace="", metadata={"n": 2})
    loaded = twin.load_state("s", saved.checkpoint_id)
    assert loaded.data == big + b"more" and loaded.checkpoint.parent_checkpoint_id == ""
    assert dict(loaded.metadata) == {"n": 2}


def test_pause_execution_saves_with_the_save_options(twin: Twin) -> None:
    twin.create_session("s")
    twin.save_state("s", b"one")
    paused = twin.pause_execution("s", b"two", no_parent=True, content_type="text/plain")
    loaded = twin.load_state("s", paused.saved.checkpoint_id)
    assert (loaded.data, loaded.content_type) == (b"two", "text/plain")
    assert loaded.checkpoint.parent_checkpoint_id == ""
    assert twin.get_session("s").status == common_pb2.SESSION_STATUS_PAUSED


def test_save_state_refuses_an_unknown_option(twin: Twin) -> None:
    twin.create_session("s")
    with pytest.raises(TypeError, match="no_such_option"):
        twin.save_state("s", b"x", no_such_option=True)


# -- include_writes, include_structured -------------------------------------------------------


def test_load_state_and_list_checkpoints_include_pending_writes_when_asked(twin: Twin) -> None:
    twin.create_session("s")
    saved = twin.save_state("s", b"one").checkpoint_id
    twin.put_writes("s", saved, "task-1", [(0, "messages", "json", b'"hi"')])
    plain = twin.load_state("s")
    assert (plain.checkpoint.pending_write_count, len(plain.checkpoint.pending_writes)) == (1, 0)
    loaded = twin.load_state("s", include_writes=True)
    assert [w.value for w in loaded.checkpoint.pending_writes] == [b'"hi"']
    (listed,) = twin.list_checkpoints("s", include_writes=True)
    assert [w.channel for w in listed.pending_writes] == ["messages"]
    (unlisted,) = twin.list_checkpoints("s")
    assert list(unlisted.pending_writes) == []


def test_structured_state_round_trip_and_capture(twin: Twin) -> None:
    twin.create_session("a")
    tasks = task_pb2_grpc.TaskServiceStub(twin.channel)
    value = struct_pb2.Value()
    value.string_value = "eu-west"
    request = task_pb2.UpdateGlobalStateRequest(session_id="a", key="region", value=value)
    twin.call(tasks.UpdateGlobalState, request)
    got = twin.get_structured_state("a")
    structured = json.loads(got.structured_json)
    assert "tasks" in structured and got.version == twin.get_session("a").version

    saved = twin.save_state("a", b"state")  # captures the structured state
    loaded = twin.load_state("a", saved.checkpoint_id, include_structured=True)
    assert json.loads(loaded.structured_json) == structured
    assert twin.load_state("a", saved.checkpoint_id).structured_json == b""

    twin.create_session("b")
    assert json.loads(twin.get_structured_state("b").structured_json) == {}
    version = twin.get_session("b").version
    with pytest.raises(errors.VersionConflictError):
        twin.replace_structured_state("b", got.structured_json, expected_version=version + 5)
    replaced = twin.replace_structured_state("b", got.structured_json, expected_version=version)
    assert replaced.version == version + 1
    assert json.loads(twin.get_structured_state("b").structured_json) == structured
    twin.replace_structured_state("b", b"{}")
    assert json.loads(twin.get_structured_state("b").structured_json) == {}


# -- admin: replication ---------------------------------------------------------------------


def test_replication_status_and_restore_from_remote(
    start_api: Callable[..., Api], connect: Callable[..., Twin]
) -> None:
    replicating = start_api(replication="sync", remote_url="memory:///", node_id="node-1")
    twin = connect(replicating.target)
    twin.create_session("s1")
    twin.save_state("s1", b"state")
    status = twin.replication_status()
    assert (status.mode, status.node_id, status.sessions_owned) == ("sync", "node-1", 1)
    restored = twin.restore_session_from_remote("s1")
    assert (restored.session_id, restored.checkpoint_count) == ("s1", 1)
    with pytest.raises(errors.NotFoundError):
        twin.restore_session_from_remote("never-saved")


def test_replication_status_without_replication_is_a_failed_precondition(twin: Twin) -> None:
    with pytest.raises(errors.FailedPreconditionError):
        twin.replication_status()


# -- what AsyncClient lacked: channel, metadata, wait_ready, save_states, watch timeout ------


def test_metadata_carries_the_tenant_and_calls_act_in_it(
    api: Api, connect: Callable[..., Twin]
) -> None:
    twin = connect(api.target, tenant="acme", token="")
    assert twin.metadata == ((TENANT_HEADER, "acme"),)
    twin.create_session("s")
    other = connect(api.target, tenant="other")
    with pytest.raises(errors.NotFoundError):
        other.get_session("s")


def test_wait_ready_returns_when_the_daemon_answers(twin: Twin) -> None:
    twin.wait_ready(timeout=5)
    assert twin.store_stats().sessions == 0


def test_wait_ready_says_no_daemon_is_reachable(
    black_hole: str, connect: Callable[..., Twin]
) -> None:
    twin = connect(black_hole)
    started = time.monotonic()
    with pytest.raises(errors.StratadError, match=f"no stratad daemon reachable at {black_hole}"):
        twin.wait_ready(timeout=0.3)
    assert time.monotonic() - started < 10


def test_save_states_answers_each_request_in_order(twin: Twin) -> None:
    twin.create_session("s")
    requests = [save_request("s", b"a"), save_request("../x", b"b"), save_request("s", b"c")]
    responses = list(twin.save_states(requests, timeout=10))
    assert [r.response.version for r in responses] == [2, 0, 3]
    assert responses[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_watch_session_ends_at_its_deadline(twin: Twin) -> None:
    twin.create_session("s")
    with pytest.raises(errors.DeadlineExceededError):
        list(twin.watch_session("s", timeout=0.3))


def test_async_save_states_takes_an_async_iterable(api: Api) -> None:
    async def requests() -> AsyncIterator[Any]:
        for data in (b"a", b"b", b"c"):
            await asyncio.sleep(0)  # produced as the stream goes
            yield save_request("s", data, no_parent=data == b"c")

    async def scenario() -> tuple[list[str], list[str]]:
        async with stratad.AsyncClient(api.target) as client:
            await client.create_session("s")
            saved = [r.response.checkpoint_id async for r in client.save_states(requests())]
            parents = [
                (await client.load_state("s", cid)).checkpoint.parent_checkpoint_id for cid in saved
            ]
            return saved, parents

    saved, parents = asyncio.run(scenario())
    assert parents == ["", saved[0], ""]
