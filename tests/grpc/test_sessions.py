"""SessionService over gRPC: good and bad input for every RPC, tenancy, paging, watching."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from stratad.api.v1 import checkpoint_pb2, common_pb2, session_pb2
from stratad.domain import events
from stratad.sdk.client import error_info

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
BAD_IDS = ["../x", "a/b", ".hidden", "-lead", "a b", "x" * 129, "k" * 1024, "é"]


def watch(api: Api, session_id: str, from_version: int = 0, timeout: float = 10) -> Any:
    request = session_pb2.WatchSessionRequest(session_id=session_id, from_version=from_version)
    return api.sessions.WatchSession(request, timeout=timeout, metadata=api.metadata)


def take(stream: Iterator[session_pb2.WatchSessionResponse], n: int) -> list[tuple[int, str]]:
    """Up to `n` events (fewer if the stream ends or its deadline passes first)."""
    events: list[tuple[int, str]] = []
    try:
        for response in stream:
            events.append((response.event.version, response.event.kind))
            if len(events) == n:
                break
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
            raise
    return events


def mutate_a_few_times(api: Api, session_id: str) -> None:
    """save, save, status (pause), status (resume), delete_checkpoint: versions 2..6."""
    first = api.save(session_id, b"one").checkpoint_id
    api.save(session_id, b"two")
    pause = checkpoint_pb2.PauseExecutionRequest(session_id=session_id)
    api.call(api.checkpoints.PauseExecution, pause)
    resume = checkpoint_pb2.ResumeExecutionRequest(session_id=session_id)
    api.call(api.checkpoints.ResumeExecution, resume)
    delete = checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id=first)
    api.call(api.checkpoints.DeleteCheckpoint, delete)


# -- CreateSession -----------------------------------------------------------------


def test_create_without_id_generates_a_valid_unique_id(api: Api) -> None:
    first, second = api.create(), api.create()
    assert ID_RE.fullmatch(first.session_id)
    assert first.session_id != second.session_id
    assert first.status == common_pb2.SESSION_STATUS_ACTIVE
    assert (first.version, first.checkpoint_count, first.head_checkpoint_id) == (1, 0, "")
    assert first.created_at.seconds > 0
    assert api.get(first.session_id) == first


def test_create_keeps_id_labels_and_retention(api: Api) -> None:
    retention = session_pb2.RetentionPolicy(keep_last=3, max_age_seconds=60.5)
    session = api.create("agent-1", labels={"team": "a", "env": "dev"}, retention=retention)
    assert session.session_id == "agent-1"
    assert dict(session.labels) == {"team": "a", "env": "dev"}
    assert session.retention == retention
    assert api.get("agent-1") == session


def test_create_accepts_the_longest_valid_id(api: Api) -> None:
    session_id = "a" + "b._:-" * 25 + "cd"  # 128 characters
    assert api.create(session_id).session_id == session_id


@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_create_rejects_bad_ids(api: Api, bad_id: str) -> None:
    request = session_pb2.CreateSessionRequest(session_id=bad_id)
    api.fails(api.sessions.CreateSession, request, INVALID, "invalid session_id")
    page = api.call(api.sessions.ListSessions, session_pb2.ListSessionsRequest())
    assert list(page.sessions) == []


def test_create_twice_is_already_exists_and_keeps_the_first(api: Api) -> None:
    first = api.create("dup", labels={"n": "1"})
    api.save("dup", b"state")
    before = api.snapshot("dup")
    request = session_pb2.CreateSessionRequest(session_id="dup", labels={"n": "2"})
    api.fails(api.sessions.CreateSession, request, grpc.StatusCode.ALREADY_EXISTS, "dup")
    assert api.snapshot("dup") == before
    assert api.get("dup").labels == first.labels


@pytest.mark.parametrize("max_age", [-1.0, math.nan])
def test_create_rejects_a_negative_or_nan_max_age(api: Api, max_age: float) -> None:
    retention = session_pb2.RetentionPolicy(max_age_seconds=max_age)
    request = session_pb2.CreateSessionRequest(session_id="neg", retention=retention)
    api.fails(api.sessions.CreateSession, request, INVALID, "max_age")
    api.fails(api.sessions.GetSession, session_pb2.GetSessionRequest(session_id="neg"), NOT_FOUND)


def test_same_session_id_in_two_tenants_are_two_sessions(api: Api) -> None:
    mine, theirs = api.as_tenant("t1"), api.as_tenant("t2")
    mine.create("shared", labels={"owner": "t1"})
    theirs.create("shared", labels={"owner": "t2"})
    mine.save("shared", b"mine")
    assert theirs.get("shared").labels["owner"] == "t2"
    assert theirs.get("shared").checkpoint_count == 0
    assert mine.load("shared").data == b"mine"


@pytest.mark.parametrize("tenant", ["../x", "a/b", "t" * 1024])
def test_a_bad_tenant_is_invalid_argument(api: Api, tenant: str) -> None:
    other = api.as_tenant(tenant)
    request = session_pb2.CreateSessionRequest(session_id="s")
    other.fails(other.sessions.CreateSession, request, INVALID, "invalid tenant")
    assert list((api.server.config.data_dir / "tenants").iterdir()) == []


# -- GetSession --------------------------------------------------------------------


def test_get_unknown_session_is_not_found(api: Api) -> None:
    request = session_pb2.GetSessionRequest(session_id="nope")
    api.fails(api.sessions.GetSession, request, NOT_FOUND, "'nope'", "not found")


@pytest.mark.parametrize("bad_id", ["", *BAD_IDS])
def test_get_rejects_bad_and_empty_ids(api: Api, bad_id: str) -> None:
    request = session_pb2.GetSessionRequest(session_id=bad_id)
    api.fails(api.sessions.GetSession, request, INVALID, "invalid session_id")


def test_another_tenants_session_is_not_found(api: Api) -> None:
    api.create("private")
    other = api.as_tenant("intruder")
    request = session_pb2.GetSessionRequest(session_id="private")
    other.fails(other.sessions.GetSession, request, NOT_FOUND, "not found")
    page = other.call(other.sessions.ListSessions, session_pb2.ListSessionsRequest())
    assert list(page.sessions) == []


def test_the_default_tenant_is_named_default(api: Api) -> None:
    api.create("s")
    assert api.as_tenant("default").get("s").session_id == "s"


# -- ListSessions --------------------------------------------------------------------


def list_all(api: Api, page_size: int, prefix: str = "") -> tuple[list[str], int]:
    ids: list[str] = []
    token, pages = "", 0
    while True:
        request = session_pb2.ListSessionsRequest(
            page_size=page_size, page_token=token, prefix=prefix
        )
        page = api.call(api.sessions.ListSessions, request)
        assert len(page.sessions) <= page_size
        ids += [s.session_id for s in page.sessions]
        pages += 1
        token = page.next_page_token
        if not token:
            return ids, pages


def test_list_orders_by_id_across_pages(api: Api) -> None:
    created = ["m", "b", "z", "a1", "a10", "a2", "q"]
    for session_id in created:
        api.create(session_id)
    ids, pages = list_all(api, page_size=3)
    assert ids == sorted(created)
    assert pages == 3


def test_list_exact_multiple_of_page_size_ends_without_an_empty_page(api: Api) -> None:
    for i in range(4):
        api.create(f"s{i}")
    ids, pages = list_all(api, page_size=2)
    assert ids == ["s0", "s1", "s2", "s3"]
    assert pages == 2


def test_list_pages_are_stable_while_sessions_come_and_go(api: Api) -> None:
    for session_id in ["b", "d", "f", "h"]:
        api.create(session_id)
    first = api.call(api.sessions.ListSessions, session_pb2.ListSessionsRequest(page_size=2))
    api.create("a")  # before the cursor: not listed, no repeat
    api.create("e")  # after the cursor: listed in order
    request = session_pb2.ListSessionsRequest(page_size=10, page_token=first.next_page_token)
    second = api.call(api.sessions.ListSessions, request)
    ids = [s.session_id for s in [*first.sessions, *second.sessions]]
    assert ids == ["b", "d", "e", "f", "h"]
    assert second.next_page_token == ""


def test_list_filters_by_prefix_across_pages(api: Api) -> None:
    for session_id in ["run-1", "run-2", "run-3", "runner", "other", "ru"]:
        api.create(session_id)
    ids, _ = list_all(api, page_size=1, prefix="run-")
    assert ids == ["run-1", "run-2", "run-3"]
    assert list_all(api, page_size=10, prefix="zzz") == ([], 1)


def test_list_page_size_zero_means_the_default(api: Api) -> None:
    for i in range(3):
        api.create(f"s{i}")
    page = api.call(api.sessions.ListSessions, session_pb2.ListSessionsRequest(page_size=0))
    assert [s.session_id for s in page.sessions] == ["s0", "s1", "s2"]
    assert page.next_page_token == ""


def test_list_rejects_a_negative_page_size(api: Api) -> None:
    request = session_pb2.ListSessionsRequest(page_size=-1)
    api.fails(api.sessions.ListSessions, request, INVALID, "page_size")


# "Li4veA==" is "../x" in base64: well-formed, but not an ID this server lists.
@pytest.mark.parametrize("token", ["garbage", "!!!!", "%%%", "\x00", "x" * 1024, "Li4veA=="])
def test_list_rejects_a_page_token_it_did_not_issue(api: Api, token: str) -> None:
    api.create("s")
    request = session_pb2.ListSessionsRequest(page_token=token)
    api.fails(api.sessions.ListSessions, request, INVALID, "page_token")


def test_list_returns_session_summaries(api: Api) -> None:
    api.create("s", labels={"k": "v"})
    api.save("s", b"data")
    (listed,) = api.call(api.sessions.ListSessions, session_pb2.ListSessionsRequest()).sessions
    assert listed == api.get("s")
    assert listed.checkpoint_count == 1


# -- DeleteSession ---------------------------------------------------------------------


def test_delete_removes_the_session_and_its_checkpoints(api: Api) -> None:
    api.create("gone")
    checkpoint_id = api.save("gone", b"bytes").checkpoint_id
    api.call(api.sessions.DeleteSession, session_pb2.DeleteSessionRequest(session_id="gone"))
    api.fails(api.sessions.GetSession, session_pb2.GetSessionRequest(session_id="gone"), NOT_FOUND)
    restore = checkpoint_pb2.RestoreCheckpointRequest(checkpoint_id=checkpoint_id)
    api.fails(api.checkpoints.RestoreCheckpoint, restore, NOT_FOUND, checkpoint_id)
    assert list_all(api, page_size=10) == ([], 1)


def test_delete_then_create_again_starts_fresh(api: Api) -> None:
    api.create("again", labels={"n": "1"})
    api.save("again", b"old")
    api.call(api.sessions.DeleteSession, session_pb2.DeleteSessionRequest(session_id="again"))
    session = api.create("again")
    assert (session.version, session.checkpoint_count, dict(session.labels)) == (1, 0, {})
    request = checkpoint_pb2.LoadStateRequest(session_id="again")
    api.fails(api.checkpoints.LoadState, request, NOT_FOUND, "no saved state")


def test_delete_with_a_wrong_expected_version_is_aborted(api: Api) -> None:
    api.create("s")
    api.save("s", b"x")
    before = api.snapshot("s")
    request = session_pb2.DeleteSessionRequest(session_id="s", expected_version=1)
    api.fails(api.sessions.DeleteSession, request, grpc.StatusCode.ABORTED, "version 2", "not 1")
    assert api.snapshot("s") == before
    api.call(
        api.sessions.DeleteSession,
        session_pb2.DeleteSessionRequest(session_id="s", expected_version=2),
    )


@pytest.mark.parametrize(
    ("session_id", "code"),
    [("nope", NOT_FOUND), ("", INVALID), ("../x", INVALID), ("k" * 1024, INVALID)],
)
def test_delete_bad_or_unknown_ids(api: Api, session_id: str, code: grpc.StatusCode) -> None:
    api.create("kept")
    request = session_pb2.DeleteSessionRequest(session_id=session_id)
    api.fails(api.sessions.DeleteSession, request, code)
    assert api.get("kept").version == 1


def test_delete_of_another_tenants_session_is_not_found(api: Api) -> None:
    api.create("mine")
    api.save("mine", b"data")
    before = api.snapshot("mine")
    other = api.as_tenant("other")
    request = session_pb2.DeleteSessionRequest(session_id="mine")
    other.fails(other.sessions.DeleteSession, request, NOT_FOUND)
    assert api.snapshot("mine") == before


# -- WatchSession ------------------------------------------------------------------------


def test_watch_sees_every_mutation_in_order(api: Api) -> None:
    api.create("w")
    stream = watch(api, "w", from_version=1)  # replay from creation: nothing can be missed
    mutate_a_few_times(api, "w")
    events = take(stream, 5)
    stream.cancel()
    assert events == [
        (2, "save"),
        (3, "save"),
        (4, "status"),
        (5, "status"),
        (6, "delete_checkpoint"),
    ]


def test_watch_events_carry_checkpoint_and_status(api: Api) -> None:
    api.create("w")
    stream = watch(api, "w", from_version=1)
    saved = api.save("w", b"s")
    api.call(api.checkpoints.PauseExecution, checkpoint_pb2.PauseExecutionRequest(session_id="w"))
    save_event, status_event = (next(stream).event for _ in range(2))
    stream.cancel()
    assert (save_event.session_id, save_event.checkpoint_id) == ("w", saved.checkpoint_id)
    assert save_event.at.seconds > 0
    assert status_event.status == common_pb2.SESSION_STATUS_PAUSED


def test_watch_resumes_after_a_given_version(api: Api) -> None:
    api.create("w")
    mutate_a_few_times(api, "w")  # versions 2..6
    stream = watch(api, "w", from_version=3)
    replayed = take(stream, 3)
    api.save("w", b"later")
    live = take(stream, 1)
    stream.cancel()
    assert replayed == [(4, "status"), (5, "status"), (6, "delete_checkpoint")]
    assert live == [(7, "save")]


def test_watch_from_zero_sees_only_new_events(api: Api) -> None:
    api.create("w")
    api.save("w", b"old")
    stream = watch(api, "w")
    # The watch may not be subscribed yet: keep saving until an event arrives.
    stop = threading.Event()

    def saver() -> None:
        while not stop.wait(0.05):
            api.save("w", b"new")

    thread = threading.Thread(target=saver)
    thread.start()
    try:
        ((version, kind),) = take(stream, 1)
    finally:
        stop.set()
        thread.join()
        stream.cancel()
    assert version > 2
    assert kind == "save"


def test_watch_from_version_one_replays_everything_after_creation(api: Api) -> None:
    api.create("w")
    api.save("w", b"a")
    stream = watch(api, "w", from_version=1)
    assert take(stream, 1) == [(2, "save")]
    stream.cancel()


def test_watch_ends_when_the_session_is_deleted(api: Api) -> None:
    api.create("w")
    stream = watch(api, "w", from_version=1)
    api.save("w", b"a")
    api.call(api.sessions.DeleteSession, session_pb2.DeleteSessionRequest(session_id="w"))
    assert take(stream, 10) == [(2, "save")]  # then the stream ends with OK
    assert stream.code() == grpc.StatusCode.OK


def test_watch_of_concurrent_writers_sees_every_version_once_in_order(api: Api) -> None:
    api.create("w")
    writers, saves = 6, 15
    stream = watch(api, "w", from_version=1, timeout=5)

    def write() -> None:
        for _ in range(saves):
            api.save("w", b"x" * 100)

    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    versions = [v for v, _ in take(stream, writers * saves)]
    stream.cancel()
    assert versions == list(range(2, 2 + writers * saves))


@pytest.mark.parametrize(
    ("session_id", "code"),
    [("nope", NOT_FOUND), ("", INVALID), ("../x", INVALID), ("k" * 1024, INVALID)],
)
def test_watch_bad_or_unknown_ids(api: Api, session_id: str, code: grpc.StatusCode) -> None:
    stream = watch(api, session_id)
    with pytest.raises(grpc.RpcError) as excinfo:
        next(stream)
    assert excinfo.value.code() == code  # type: ignore[attr-defined]


def test_watch_of_another_tenants_session_is_not_found(api: Api) -> None:
    api.create("mine")
    stream = watch(api.as_tenant("other"), "mine", from_version=1)
    with pytest.raises(grpc.RpcError) as excinfo:
        next(stream)
    assert excinfo.value.code() == NOT_FOUND  # type: ignore[attr-defined]


def test_a_watcher_that_falls_behind_is_ended_with_its_resume_point(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watcher not reading its stream must not queue events without bound."""
    monkeypatch.setattr(events, "WATCH_QUEUE_EVENTS", 4)
    api.create("w")
    mutate_a_few_times(api, "w")  # versions 2..6
    stream = watch(api, "w", from_version=1)
    assert [v for v, _ in take(stream, 5)] == [2, 3, 4, 5, 6]  # subscribed, read up to 6

    async def burst() -> None:  # more events than its queue holds, before it can take one
        hub = api.server.resources.engine.events
        for n in range(5):
            hub.publish(("default", "w"), events.SessionEvent(100 + n, "save", time.time()))

    api.server.run(burst())
    with pytest.raises(grpc.RpcError) as raised:
        next(stream)
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "from_version=6" in error.details()
    info = error_info(error)
    assert info is not None and info.reason == "WATCHER_TOO_SLOW"
    assert info.metadata["resume_from_version"] == "6"
    # Watching again from the resume point misses nothing.
    again = watch(api, "w", from_version=6)
    api.save("w", b"next")
    assert take(again, 1) == [(7, "save")]
    again.cancel()
