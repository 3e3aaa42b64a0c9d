"""StratadSessionService (stratad.integrations.adk) against a real daemon, held to ADK's
own expectations for session services.

The first part ports the contract ADK holds its session services to: the tests
of google/adk-python's tests/unittests/sessions/test_session_service.py that
take its shared ``session_service`` fixture (tests/unittests/sessions/
_conformance.py), as of commit 11cc0931 (ADK 2.x; this venv has google-adk
2.13.0). They run here against both `InMemorySessionService` (ADK's reference,
which shows the port asks what ADK asks) and `StratadSessionService`; a backend
that failed one would be listed in DIVERGENCES with its reason (none is).
Then the expectations that upstream file holds only its persistent backends
to (DatabaseSessionService and SqliteSessionService: stale writers, a deleted
session, values JSON cannot hold) or only the in-memory one (an event
delivered twice), then stratad's own: names of any shape, state shared across
service instances, error classes, what is stored where, and an ADK `Runner`
with a scripted model whose session a new process resumes
(examples/adk_resume.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.sessions.session import Session
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types
from grpc_health.v1 import health_pb2, health_pb2_grpc

import stratad.errors
from stratad.api.v1 import task_pb2, task_pb2_grpc
from stratad.ids import validate_id
from stratad.integrations.adk import (
    CONTENT_TYPE,
    StratadSessionService,
    app_state_id,
    decode_document,
    session_id_of,
    user_state_id,
)
from stratad.sdk.client import Client

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "adk_resume.py"
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- a daemon for the module, a tenant per test ---------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "python"), env.get("PYTHONPATH")) if p
    )
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `stratad serve` for the module (each test acts in a tenant of its own)."""
    data = tmp_path_factory.mktemp("adk")
    target = f"127.0.0.1:{_free_port()}"
    log = (data / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stratad",
            "serve",
            "--listen",
            target,
            "--data-dir",
            str(data / "data"),
            "--metrics-listen",
            "off",
        ],
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        break
                except grpc.RpcError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail((data / "daemon.log").read_text(errors="replace"))
                time.sleep(0.1)
        yield target
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def tenant() -> str:
    return f"adk-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def stratad_service(address: str, tenant: str) -> Iterator[StratadSessionService]:
    with StratadSessionService(address, tenant=tenant) as service:
        yield service


#: Contract test -> why a backend fails it today (the test is then a strict xfail).
DIVERGENCES: dict[str, dict[str, str]] = {"in_memory": {}, "stratad": {}}


@pytest.fixture(params=["in_memory", "stratad"])
def session_service(request: pytest.FixtureRequest) -> Iterator[BaseSessionService]:
    """Each backend held to ADK's contract for session services."""
    reason = DIVERGENCES[request.param].get(request.node.originalname)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    if request.param == "in_memory":
        yield InMemorySessionService()
    else:
        yield request.getfixturevalue("stratad_service")


def text_event(text: str = "text", **fields: Any) -> Event:
    content = types.Content(role="user", parts=[types.Part(text=text)])
    return Event(
        invocation_id=fields.pop("invocation_id", "inv"), author="user", content=content, **fields
    )


def delta_event(delta: dict[str, Any], **fields: Any) -> Event:
    return Event(
        invocation_id=fields.pop("invocation_id", "inv1"),
        author="user",
        actions=EventActions(state_delta=delta),
        **fields,
    )


# -- ADK's contract (test_session_service.py @ 11cc0931, `session_service` tests) ----------


def test_get_empty_session(session_service: BaseSessionService) -> None:
    got = run(session_service.get_session(app_name="my_app", user_id="test_user", session_id="123"))
    assert got is None


def test_create_get_session(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        created = await session_service.create_session(
            app_name="my_app", user_id="test_user", state={"key": "value"}
        )
        assert (created.app_name, created.user_id, created.state) == (
            "my_app",
            "test_user",
            {"key": "value"},
        )
        assert created.id
        assert created.last_update_time <= time.time()
        got = await session_service.get_session(
            app_name="my_app", user_id="test_user", session_id=created.id
        )
        assert got == created
        assert got is not None and got.last_update_time <= time.time()
        await session_service.delete_session(
            app_name="my_app", user_id="test_user", session_id=created.id
        )
        gone = await session_service.get_session(
            app_name="my_app", user_id="test_user", session_id=created.id
        )
        assert gone is None

    run(scenario())


def test_create_and_list_sessions(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        ids = [f"session{i}" for i in range(5)]
        for sid in ids:
            await session_service.create_session(
                app_name="my_app", user_id="test_user", session_id=sid, state={"key": "value" + sid}
            )
        listed = (
            await session_service.list_sessions(app_name="my_app", user_id="test_user")
        ).sessions
        assert sorted(s.id for s in listed) == ids
        assert all(s.state == {"key": "value" + s.id} for s in listed)
        assert all(not s.events for s in listed)

    run(scenario())


def test_list_sessions_ordered_by_last_update_time(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        for sid in ("a", "b", "c"):
            await session_service.create_session(app_name="my_app", user_id="u", session_id=sid)
        oldest = await session_service.get_session(app_name="my_app", user_id="u", session_id="a")
        assert oldest is not None
        await asyncio.sleep(0.01)
        await session_service.append_event(oldest, Event(invocation_id="inv", author="user"))
        listed = (await session_service.list_sessions(app_name="my_app", user_id="u")).sessions
        assert [s.id for s in listed] == ["b", "c", "a"]

    run(scenario())


def test_list_sessions_all_users(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        for user, sid in (("user1", "session1a"), ("user1", "session1b"), ("user2", "session2a")):
            await session_service.create_session(
                app_name="my_app", user_id=user, session_id=sid, state={"key": "value" + sid[-2:]}
            )
        one = (await session_service.list_sessions(app_name="my_app", user_id="user1")).sessions
        assert {s.id: s.state for s in one} == {
            "session1a": {"key": "value1a"},
            "session1b": {"key": "value1b"},
        }
        two = (await session_service.list_sessions(app_name="my_app", user_id="user2")).sessions
        assert [(s.id, s.state) for s in two] == [("session2a", {"key": "value2a"})]
        every = (await session_service.list_sessions(app_name="my_app", user_id=None)).sessions
        assert {s.id: (s.user_id, s.state["key"]) for s in every} == {
            "session1a": ("user1", "value1a"),
            "session1b": ("user1", "value1b"),
            "session2a": ("user2", "value2a"),
        }
        other_app = await session_service.list_sessions(app_name="other_app", user_id=None)
        assert other_app.sessions == []

    run(scenario())


def test_app_state_is_shared_by_all_users_of_app(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        first = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"app:k1": "v1"}
        )
        await session_service.append_event(first, delta_event({"app:k2": "v2"}))
        second = await session_service.create_session(
            app_name="my_app", user_id="u2", session_id="s2"
        )
        assert second.state == {"app:k1": "v1", "app:k2": "v2"}
        again = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert again is not None
        assert (again.state.get("app:k1"), again.state.get("app:k2")) == ("v1", "v2")

    run(scenario())


def test_user_state_is_shared_only_by_user_sessions(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        first = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"user:k1": "v1"}
        )
        await session_service.append_event(first, delta_event({"user:k2": "v2"}))
        same_user = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1b"
        )
        assert same_user.state == {"user:k1": "v1", "user:k2": "v2"}
        other_user = await session_service.create_session(
            app_name="my_app", user_id="u2", session_id="s2"
        )
        assert other_user.state == {}

    run(scenario())


def test_session_state_is_not_shared(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        first = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"sk1": "v1"}
        )
        await session_service.append_event(first, delta_event({"sk2": "v2"}))
        again = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert again is not None and again.state == {"sk1": "v1", "sk2": "v2"}
        another = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1b"
        )
        assert another.state == {}

    run(scenario())


def test_dict_valued_state_delta_replaces_stored_value(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(
            app_name="my_app",
            user_id="u1",
            session_id="s1",
            state={"profile": {"name": "ada", "role": "admin"}},
        )
        await session_service.append_event(session, delta_event({"profile": {"name": "bob"}}))
        again = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert again is not None and again.state["profile"] == {"name": "bob"}
        assert session.state["profile"] == {"name": "bob"}

    run(scenario())


def test_none_valued_state_delta_is_stored_not_dropped(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"flag": True}
        )
        await session_service.append_event(session, delta_event({"flag": None}))
        again = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert again is not None and "flag" in again.state and again.state["flag"] is None
        assert "flag" in session.state and session.state["flag"] is None

    run(scenario())


def test_boolean_state_survives_unrelated_state_delta(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"flag": False}
        )
        await session_service.append_event(session, delta_event({"new_flag": True}))
        again = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert again is not None
        assert again.state["new_flag"] is True and again.state["flag"] is False
        assert session.state["new_flag"] is True and session.state["flag"] is False

    run(scenario())


def test_app_state_dict_valued_delta_replaces_stored_value(
    session_service: BaseSessionService,
) -> None:
    async def scenario() -> None:
        first = await session_service.create_session(
            app_name="my_app",
            user_id="u1",
            session_id="s1",
            state={"app:cfg": {"name": "ada", "role": "admin"}},
        )
        await session_service.append_event(first, delta_event({"app:cfg": {"name": "bob"}}))
        other = await session_service.create_session(
            app_name="my_app", user_id="u2", session_id="s2"
        )
        assert other.state["app:cfg"] == {"name": "bob"}
        assert first.state["app:cfg"] == {"name": "bob"}

    run(scenario())


def test_user_state_none_valued_delta_is_stored_not_dropped(
    session_service: BaseSessionService,
) -> None:
    async def scenario() -> None:
        first = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1", state={"user:pref": "dark_mode"}
        )
        await session_service.append_event(first, delta_event({"user:pref": None}))
        second = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1b"
        )
        assert "user:pref" in second.state and second.state["user:pref"] is None
        assert "user:pref" in first.state and first.state["user:pref"] is None

    run(scenario())


def test_temp_state_is_not_persisted_in_state_or_events(
    session_service: BaseSessionService,
) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1"
        )
        event = delta_event({"temp:k1": "v1", "sk": "v2"})
        await session_service.append_event(session, event)
        # For the rest of the invocation the session object has it ...
        assert session.state["temp:k1"] == "v1" and session.state["sk"] == "v2"
        # ... but the event's delta (what is stored) does not.
        assert "temp:k1" not in event.actions.state_delta
        assert event.actions.state_delta["sk"] == "v2"
        again = await session_service.get_session(app_name="my_app", user_id="u1", session_id="s1")
        assert again is not None and "temp:k1" not in again.state
        assert all("temp:k1" not in e.actions.state_delta for e in again.events)

    run(scenario())


def test_temp_state_visible_across_sequential_events(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s_seq"
        )
        first = Event(
            invocation_id="inv1",
            author="agent1",
            actions=EventActions(state_delta={"temp:output": "result_from_a1"}),
        )
        await session_service.append_event(session, first)
        assert session.state["temp:output"] == "result_from_a1"
        assert "temp:output" not in first.actions.state_delta

    run(scenario())


def test_get_session_respects_user_id(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        first = await session_service.create_session(
            app_name="my_app", user_id="u1", session_id="s1"
        )
        await session_service.append_event(first, Event(invocation_id="inv1", author="user"))
        await session_service.create_session(app_name="my_app", user_id="u2", session_id="s1")
        theirs = await session_service.get_session(app_name="my_app", user_id="u2", session_id="s1")
        assert theirs is not None and theirs.user_id == "u2" and theirs.events == []

    run(scenario())


def test_create_session_with_existing_id_raises_error(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        await session_service.create_session(
            app_name="my_app", user_id="test_user", session_id="existing_session"
        )
        with pytest.raises(AlreadyExistsError):
            await session_service.create_session(
                app_name="my_app", user_id="test_user", session_id="existing_session"
            )

    run(scenario())


def test_padded_session_id_reads_and_deletes(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        created = await session_service.create_session(
            app_name="my_app", user_id="test_user", session_id="order-42\n", state={"cart": "book"}
        )
        assert created.id == "order-42"
        got = await session_service.get_session(
            app_name="my_app", user_id="test_user", session_id="order-42\n"
        )
        assert got is not None and got.id == "order-42" and got.state["cart"] == "book"
        await session_service.delete_session(
            app_name="my_app", user_id="test_user", session_id="order-42\n"
        )
        gone = await session_service.get_session(
            app_name="my_app", user_id="test_user", session_id="order-42"
        )
        assert gone is None

    run(scenario())


def test_append_event_bytes(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(app_name="my_app", user_id="user")
        content = types.Content(
            role="user",
            parts=[types.Part.from_bytes(data=b"\x00\xfftest_image_data", mime_type="image/png")],
        )
        grounding = types.GroundingMetadata(
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob")
        )
        event = Event(
            invocation_id="invocation", author="user", content=content, grounding_metadata=grounding
        )
        await session_service.append_event(session, event)
        assert session.events[0].content == content
        again = await session_service.get_session(
            app_name="my_app", user_id="user", session_id=session.id
        )
        assert again is not None and len(again.events) == 1
        assert again.events[0].content == content
        assert again.events[0].grounding_metadata == grounding

    run(scenario())


def test_append_event_complete(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(app_name="my_app", user_id="user")
        event = Event(
            invocation_id="invocation",
            author="user",
            content=types.Content(role="user", parts=[types.Part(text="test_text")]),
            turn_complete=True,
            partial=False,
            actions=EventActions(
                artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True
            ),
            long_running_tool_ids={"tool1"},
            error_code="error_code",
            error_message="error_message",
            interrupted=True,
            grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2
            ),
            citation_metadata=types.CitationMetadata(),
            custom_metadata={"custom_key": "custom_value"},
            timestamp=1700000000.123,
            input_transcription=types.Transcription(text="input transcription", finished=True),
            output_transcription=types.Transcription(text="output transcription", finished=True),
        )
        await session_service.append_event(session, event)
        again = await session_service.get_session(
            app_name="my_app", user_id="user", session_id=session.id
        )
        assert again == session

    run(scenario())


def test_append_event_with_requested_tool_confirmations(
    session_service: BaseSessionService,
) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(app_name="my_app", user_id="user")
        confirmation = ToolConfirmation(
            hint="dynamic hint",
            confirmed=False,
            payload={"collection_name": "photos", "resource_id": "album_1"},
        )
        event = Event(
            invocation_id="invocation",
            author="user",
            actions=EventActions(requested_tool_confirmations={"tool_call_1": confirmation}),
        )
        await session_service.append_event(session, event)
        again = await session_service.get_session(
            app_name="my_app", user_id="user", session_id=session.id
        )
        assert again is not None and len(again.events) == 1
        got = again.events[0].actions.requested_tool_confirmations["tool_call_1"]
        assert (got.hint, got.confirmed) == ("dynamic hint", False)
        assert got.payload == {"collection_name": "photos", "resource_id": "album_1"}

    run(scenario())


def test_session_last_update_time_updates_on_event(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(app_name="my_app", user_id="user")
        before = session.last_update_time
        event = Event(invocation_id="invocation", author="user", timestamp=before + 10)
        await session_service.append_event(session, event)
        assert session.last_update_time == pytest.approx(before + 10, abs=1e-6)
        again = await session_service.get_session(
            app_name="my_app", user_id="user", session_id=session.id
        )
        assert again is not None
        assert again.last_update_time == pytest.approx(before + 10, abs=1e-6)
        assert again.last_update_time > before

    run(scenario())


def test_get_session_with_config(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        base = int(time.time())
        session = await session_service.create_session(app_name="my_app", user_id="user")
        for i in range(1, 6):
            await session_service.append_event(session, Event(author="user", timestamp=base + i))

        async def timestamps(config: GetSessionConfig | None) -> list[float]:
            got = await session_service.get_session(
                app_name="my_app", user_id="user", session_id=session.id, config=config
            )
            assert got is not None
            return [e.timestamp for e in got.events]

        assert await timestamps(None) == [base + i for i in range(1, 6)]
        assert await timestamps(GetSessionConfig(num_recent_events=0)) == []
        assert await timestamps(GetSessionConfig(num_recent_events=3)) == [
            base + 3,
            base + 4,
            base + 5,
        ]
        assert await timestamps(GetSessionConfig(after_timestamp=base + 4)) == [base + 4, base + 5]
        assert await timestamps(GetSessionConfig(after_timestamp=base + 50)) == []
        both = GetSessionConfig(after_timestamp=base + 4, num_recent_events=3)
        assert await timestamps(both) == [base + 4, base + 5]

    run(scenario())


def test_partial_events_are_not_persisted(session_service: BaseSessionService) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(app_name="my_app", user_id="user")
        await session_service.append_event(session, Event(author="user", partial=True))
        assert session.events == []
        again = await session_service.get_session(
            app_name="my_app", user_id="user", session_id=session.id
        )
        assert again is not None and again.events == []

    run(scenario())


def test_get_user_state_returns_empty_dict_when_no_state_exists(
    session_service: BaseSessionService,
) -> None:
    assert run(session_service.get_user_state(app_name="my_app", user_id="u1")) == {}


def test_get_user_state_returns_state_written_via_append_event(
    session_service: BaseSessionService,
) -> None:
    async def scenario() -> dict[str, Any]:
        session = await session_service.create_session(app_name="my_app", user_id="u1")
        delta = {"user:profile": {"name": "Alice"}, "session_key": 1}
        await session_service.append_event(
            session, Event(author="system", actions=EventActions(state_delta=delta))
        )
        return await session_service.get_user_state(app_name="my_app", user_id="u1")

    assert run(scenario()) == {"profile": {"name": "Alice"}}


def test_get_user_state_is_not_visible_across_users_or_apps(
    session_service: BaseSessionService,
) -> None:
    async def scenario() -> None:
        session = await session_service.create_session(app_name="my_app", user_id="u1")
        await session_service.append_event(session, delta_event({"user:secret": "only-for-u1"}))
        assert await session_service.get_user_state(app_name="my_app", user_id="u2") == {}
        assert await session_service.get_user_state(app_name="other_app", user_id="u1") == {}

    run(scenario())


def test_get_user_state_reflects_latest_write(session_service: BaseSessionService) -> None:
    async def scenario() -> dict[str, Any]:
        session = await session_service.create_session(app_name="my_app", user_id="u1")
        await session_service.append_event(session, delta_event({"user:counter": 1}))
        await session_service.append_event(session, delta_event({"user:counter": 2}))
        return await session_service.get_user_state(app_name="my_app", user_id="u1")

    assert run(scenario()) == {"counter": 2}


def test_get_session_keeps_exact_epoch_across_a_repeated_local_hour(
    session_service: BaseSessionService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        # 01:00 and 01:30 US Eastern, the second time that night (2024-11-03).
        epochs = [1730613600.0, 1730615400.0]

        async def scenario() -> list[float]:
            session = await session_service.create_session(app_name="my_app", user_id="user")
            for epoch in epochs:
                await session_service.append_event(session, Event(author="user", timestamp=epoch))
            got = await session_service.get_session(
                app_name="my_app", user_id="user", session_id=session.id
            )
            assert got is not None
            return [e.timestamp for e in got.events]

        assert run(scenario()) == epochs
    finally:
        monkeypatch.undo()
        time.tzset()


# -- what the upstream file asks only of its persistent backends (Database, Sqlite) ----------


def test_append_event_to_stale_session_is_refused(stratad_service: StratadSessionService) -> None:
    async def scenario() -> None:
        svc = stratad_service
        now = time.time()
        original = await svc.create_session(app_name="my_app", user_id="user")
        await svc.append_event(original, delta_event({"sk1": "v1"}, timestamp=now + 1))
        updated = await svc.get_session(app_name="my_app", user_id="user", session_id=original.id)
        assert updated is not None
        await svc.append_event(
            updated, delta_event({"sk2": "v2"}, invocation_id="inv2", timestamp=now + 2)
        )
        assert original.last_update_time < updated.last_update_time
        assert len(original.events) == 1 and "sk2" not in original.state
        with pytest.raises(StaleSessionError, match="modified in storage"):
            await svc.append_event(
                original,
                delta_event(
                    {"sk3": "v3", "user:u3": "v3", "app:a3": "v3"},
                    invocation_id="inv3",
                    timestamp=now + 3,
                ),
            )
        # The refused event's app: and user: keys were not applied either.
        assert await svc.get_user_state(app_name="my_app", user_id="user") == {}
        assert await svc.get_app_state(app_name="my_app") == {}
        final = await svc.get_session(app_name="my_app", user_id="user", session_id=original.id)
        assert final is not None
        assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
        assert (final.state.get("sk1"), final.state.get("sk2"), final.state.get("sk3")) == (
            "v1",
            "v2",
            None,
        )

    run(scenario())


def test_concurrent_stale_copies_one_writer_wins(stratad_service: StratadSessionService) -> None:
    async def scenario() -> None:
        svc = stratad_service
        session = await svc.create_session(app_name="my_app", user_id="user")
        rounds = 8
        for i in range(rounds):
            latest = await svc.get_session(app_name="my_app", user_id="user", session_id=session.id)
            assert latest is not None
            copies = [latest.model_copy(deep=True) for _ in range(2)]
            base = latest.last_update_time + 10.0
            events = [
                delta_event(
                    {f"sk{i}-{n}": f"v{i}-{n}"}, invocation_id=f"inv{i}-{n}", timestamp=base + n
                )
                for n in (1, 2)
            ]
            results = await asyncio.gather(
                *(svc.append_event(c, e) for c, e in zip(copies, events, strict=True)),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            assert len(errors) == 1, results
            assert isinstance(errors[0], StaleSessionError)
            assert "modified in storage" in str(errors[0])
        final = await svc.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert final is not None and len(final.events) == rounds
        for i in range(rounds):
            values = {final.state.get(f"sk{i}-1"), final.state.get(f"sk{i}-2")}
            assert None in values and values & {f"v{i}-1", f"v{i}-2"}

    run(scenario())


def test_append_event_allows_markerless_current_session(
    stratad_service: StratadSessionService,
) -> None:
    async def scenario() -> None:
        svc = stratad_service
        session = await svc.create_session(app_name="my_app", user_id="user", session_id="s1")
        first = Event(invocation_id="inv1", author="user", timestamp=session.last_update_time + 10)
        await svc.append_event(session, first)
        session._storage_update_marker = None
        session.last_update_time -= 0.0001
        second = Event(invocation_id="inv2", author="user", timestamp=first.timestamp + 10)
        await svc.append_event(session, second)
        got = await svc.get_session(app_name="my_app", user_id="user", session_id="s1")
        assert got is not None and [e.invocation_id for e in got.events] == ["inv1", "inv2"]
        # A markerless copy that storage has moved past is stale.
        behind = got.model_copy(deep=True)
        behind.events = behind.events[:1]
        behind._storage_update_marker = None
        await svc.append_event(
            got, Event(invocation_id="inv3", author="user", timestamp=second.timestamp + 10)
        )
        behind.last_update_time = first.timestamp
        with pytest.raises(StaleSessionError):
            await svc.append_event(behind, Event(invocation_id="inv4", author="user"))

    run(scenario())


def test_append_event_to_deleted_session_raises_session_not_found(
    stratad_service: StratadSessionService,
) -> None:
    async def scenario() -> None:
        svc = stratad_service
        session = await svc.create_session(app_name="my_app", user_id="user")
        await svc.delete_session(app_name="my_app", user_id="user", session_id=session.id)
        with pytest.raises(SessionNotFoundError) as caught:
            await svc.append_event(session, Event(invocation_id="inv1", author="user"))
        assert isinstance(caught.value, stratad.errors.NotFoundError)
        # Deleting what is not there is a no-op, as in ADK's own services.
        await svc.delete_session(app_name="my_app", user_id="user", session_id=session.id)

    run(scenario())


def test_append_event_with_non_serializable_state_delta(
    stratad_service: StratadSessionService,
) -> None:
    async def scenario() -> None:
        svc = stratad_service
        session = await svc.create_session(app_name="my_app", user_id="user")
        event = delta_event({"callback": lambda: 1, "ok": 2, "user:cb": print})
        await svc.append_event(session, event)
        got = await svc.get_session(app_name="my_app", user_id="user", session_id=session.id)
        assert got is not None and len(got.events) == 1
        assert got.state["ok"] == 2
        assert isinstance(got.state["callback"], str) and isinstance(got.state["user:cb"], str)

    run(scenario())


# -- what the upstream file asks only of InMemorySessionService ----------------------------


def test_an_event_delivered_again_is_stored_once(stratad_service: StratadSessionService) -> None:
    async def scenario() -> None:
        svc = stratad_service
        session = await svc.create_session(app_name="app", user_id="u", session_id="dup")
        event = delta_event({"counter": 1}, invocation_id="inv_dup")
        await svc.append_event(session, event)
        await svc.append_event(session, event)
        await svc.append_event(session, event.model_copy(deep=True))
        assert [e.id for e in session.events] == [event.id]
        got = await svc.get_session(app_name="app", user_id="u", session_id="dup")
        assert got is not None and [e.id for e in got.events] == [event.id]
        # The session object is current still.
        await svc.append_event(session, Event(invocation_id="next", author="user"))

    run(scenario())


def test_distinct_events_sharing_an_id_are_both_stored(
    stratad_service: StratadSessionService,
) -> None:
    async def scenario() -> None:
        svc = stratad_service
        session = await svc.create_session(app_name="app", user_id="u", session_id="multi")
        await svc.append_event(session, Event(id="same", invocation_id="a", author="user"))
        await svc.append_event(session, Event(id="same", invocation_id="b", author="agent"))
        got = await svc.get_session(app_name="app", user_id="u", session_id="multi")
        assert got is not None and [e.author for e in got.events] == ["user", "agent"]

    run(scenario())


def test_a_blank_session_id_gets_one_generated(stratad_service: StratadSessionService) -> None:
    session = run(stratad_service.create_session(app_name="app", user_id="u", session_id="   "))
    assert session.id.strip() and session.id == session.id.strip()


# -- stratad's own ---------------------------------------------------------------------------


NAMES = [
    ("my app/v2", "ada@example.org", "chat 1.2:3"),
    ("日本語アプリ", "ユーザー", "セッション"),
    ("a" * 300, "u" * 200, "s" * 129),
    ("", "", "x"),
    ("dots.and:colons", "-leading-dash", "_under_score"),
]


@pytest.mark.parametrize("names", NAMES, ids=["spaces", "unicode", "long", "empty", "separators"])
def test_names_of_any_shape(
    stratad_service: StratadSessionService, names: tuple[str, str, str], address: str, tenant: str
) -> None:
    app, user, sid = names

    async def scenario() -> None:
        svc = stratad_service
        created = await svc.create_session(
            app_name=app, user_id=user, session_id=sid, state={"k": 1, "app:a": 2, "user:u": 3}
        )
        assert created.id == sid
        await svc.append_event(created, delta_event({"k": 4, "user:u": 5}))
        got = await svc.get_session(app_name=app, user_id=user, session_id=sid)
        assert got is not None
        assert (got.app_name, got.user_id, got.id) == (app, user, sid)
        assert got.state == {"k": 4, "app:a": 2, "user:u": 5}
        mine = (await svc.list_sessions(app_name=app, user_id=user)).sessions
        assert [(s.id, s.user_id, s.state) for s in mine] == [(sid, user, got.state)]
        every = (await svc.list_sessions(app_name=app)).sessions
        assert [(s.id, s.user_id) for s in every] == [(sid, user)]
        assert await svc.get_user_state(app_name=app, user_id=user) == {"u": 5}
        await svc.delete_session(app_name=app, user_id=user, session_id=sid)
        assert await svc.get_session(app_name=app, user_id=user, session_id=sid) is None

    run(scenario())
    for key in (session_id_of(app, user, sid), app_state_id(app), user_state_id(app, user)):
        assert validate_id(key, "session_id") == key and len(key) <= 128


def test_names_that_differ_map_to_different_sessions(
    stratad_service: StratadSessionService,
) -> None:
    """Separators and escapes in names cannot make two ADK sessions one."""
    triples = [
        ("a.b", "c", "d"),
        ("a", "b.c", "d"),
        ("a", "b", "c.d"),
        ("a:2eb", "c", "d"),
        ("a b", "c", "d"),
        ("a_b", "c", "d"),
    ]

    async def scenario() -> None:
        for i, (app, user, sid) in enumerate(triples):
            await stratad_service.create_session(
                app_name=app, user_id=user, session_id=sid, state={"i": i}
            )
        for i, (app, user, sid) in enumerate(triples):
            got = await stratad_service.get_session(app_name=app, user_id=user, session_id=sid)
            assert got is not None and got.state == {"i": i}
            listed = (await stratad_service.list_sessions(app_name=app, user_id=user)).sessions
            assert [s.id for s in listed] == [sid]

    run(scenario())


def test_another_service_instance_sees_every_write(address: str, tenant: str) -> None:
    """Two service instances (as two processes would have): each reads what the
    other wrote, and a session object the other moved past is stale."""

    async def scenario() -> None:
        with (
            StratadSessionService(address, tenant=tenant) as a,
            StratadSessionService(address, tenant=tenant) as b,
        ):
            mine = await a.create_session(app_name="app", user_id="u", session_id="s")
            await a.append_event(mine, text_event("one"))
            theirs = await b.get_session(app_name="app", user_id="u", session_id="s")
            assert theirs is not None and len(theirs.events) == 1
            await b.append_event(theirs, delta_event({"user:seen_by_b": True, "n": 2}))
            again = await a.get_session(app_name="app", user_id="u", session_id="s")
            assert again is not None and len(again.events) == 2
            assert again.state == {"user:seen_by_b": True, "n": 2}
            with pytest.raises(StaleSessionError) as caught:
                await a.append_event(mine, text_event("two"))
            assert isinstance(caught.value, stratad.errors.VersionConflictError)
            await a.append_event(again, text_event("three"))
            final = await b.get_session(app_name="app", user_id="u", session_id="s")
            assert final is not None
            texts = [e.content.parts[0].text for e in final.events if e.content and e.content.parts]
            assert texts == ["one", "three"]

    run(scenario())


def test_concurrent_scoped_writes_from_many_sessions_lose_nothing(
    address: str, tenant: str
) -> None:
    """user: and app: keys written at once from eight sessions (and two service
    instances) all land: each scope's update is one atomic merge in the daemon."""

    async def scenario() -> None:
        with (
            StratadSessionService(address, tenant=tenant) as a,
            StratadSessionService(address, tenant=tenant) as b,
        ):
            sessions = [
                await a.create_session(app_name="app", user_id="u", session_id=f"s{i}")
                for i in range(8)
            ]
            services = [a if i % 2 else b for i in range(8)]
            await asyncio.gather(
                *(
                    svc.append_event(s, delta_event({f"user:k{i}": i, f"app:k{i}": i}))
                    for i, (svc, s) in enumerate(zip(services, sessions, strict=True))
                )
            )
            assert await a.get_user_state(app_name="app", user_id="u") == {
                f"k{i}": i for i in range(8)
            }
            assert await b.get_app_state(app_name="app") == {f"k{i}": i for i in range(8)}

    run(scenario())


def test_errors_are_both_the_adk_and_the_stratad_class(
    stratad_service: StratadSessionService,
) -> None:
    async def scenario() -> None:
        svc = stratad_service
        await svc.create_session(app_name="app", user_id="u", session_id="s")
        with pytest.raises(AlreadyExistsError) as exists:
            await svc.create_session(app_name="app", user_id="u", session_id="s")
        assert isinstance(exists.value, stratad.errors.AlreadyExistsError)
        assert "already exists" in str(exists.value)
        ghost = Session(id="ghost", app_name="app", user_id="u")
        with pytest.raises(SessionNotFoundError) as missing:
            await svc.append_event(ghost, Event(author="user"))
        assert isinstance(missing.value, stratad.errors.NotFoundError)
        assert isinstance(missing.value, ValueError)  # what ADK's SessionNotFoundError is
        session = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert session is not None
        too_big = {"user:blob": "x" * (2 << 20), "k": 1}  # a scope holds at most 1 MiB of JSON
        with pytest.raises(ValueError) as refused:
            await svc.append_event(session, delta_event(too_big))
        assert isinstance(refused.value, stratad.errors.InvalidArgumentError)
        # Nothing of the refused event is stored, and the session object is still current.
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None and got.events == [] and got.state == {}
        await svc.append_event(session, delta_event({"user:small": 1, "k": 2}))
        got = await svc.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None and len(got.events) == 1
        assert got.state == {"k": 2, "user:small": 1}

    run(scenario())


def test_a_daemon_that_is_gone_is_unavailable() -> None:
    with (
        StratadSessionService(f"127.0.0.1:{_free_port()}", timeout=2) as svc,
        pytest.raises(stratad.errors.StratadError) as caught,
    ):
        run(svc.get_session(app_name="app", user_id="u", session_id="s"))
    assert isinstance(
        caught.value, stratad.errors.UnavailableError | stratad.errors.DeadlineExceededError
    )


def test_what_is_stored_where(
    stratad_service: StratadSessionService, address: str, tenant: str
) -> None:
    async def scenario() -> Session:
        svc = stratad_service
        session = await svc.create_session(
            app_name="app",
            user_id="ada",
            session_id="s1",
            state={"topic": "billing", "app:plan": "pro", "user:lang": "en", "temp:x": 1},
        )
        for i in range(3):
            await svc.append_event(
                session,
                text_event(
                    f"m{i}", actions=EventActions(state_delta={"step": i, "temp:scratch": i})
                ),
            )
        return session

    session = run(scenario())
    with Client(address, tenant=tenant) as client:
        key = session_id_of("app", "ada", "s1")
        info = client.get_session(key)
        assert info.labels["stratad.integration"] == "adk"
        assert (
            info.labels["adk.app_name"],
            info.labels["adk.user_id"],
            info.labels["adk.session_id"],
        ) == ("app", "ada", "s1")
        assert info.checkpoint_count == 4  # the created session, then one per event
        loaded = client.load_state(key)
        assert loaded.content_type == CONTENT_TYPE
        lines, state_json, meta = decode_document(loaded.data)
        assert [json.loads(line)["id"] for line in lines] == [e.id for e in session.events]
        assert json.loads(state_json) == {"topic": "billing", "step": 2}  # no app:, user:, temp:
        assert meta["id"] == "s1" and meta["last_update_time"] == session.last_update_time
        assert b"temp:" not in loaded.data
        for scope, values in (
            (app_state_id("app"), {"plan": "pro"}),
            (user_state_id("app", "ada"), {"lang": "en"}),
        ):
            scope_info = client.get_session(scope)
            assert scope_info.labels["stratad.dev/keep"] == "true"
            stub = task_pb2_grpc.TaskServiceStub(client.channel)
            got = client.call(stub.GetGlobalState, task_pb2.GetGlobalStateRequest(session_id=scope))
            fields = got.value.struct_value.fields["state"].struct_value.fields
            assert {k: json.loads(v.string_value) for k, v in fields.items()} == values


# -- an ADK Runner, resumed by a new process -----------------------------------------------


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("adk_resume_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the model's annotations there
    spec.loader.exec_module(module)
    return module


def _turn_in_new_process(
    address: str, tenant: str, session: str, text: str, user: str = "ada"
) -> tuple[list[str], dict[str, Any]]:
    env = {**_env(), "STRATAD_TENANT": tenant}
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "turn",
            "--address",
            address,
            "--user",
            user,
            "--session",
            session,
            text,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    seen = [json.loads(line[len("seen: ") :]) for line in lines if line.startswith("seen: ")]
    assert len(seen) == 1, lines
    return lines, seen[0]


def test_runner_session_resumed_in_a_new_process(address: str, tenant: str) -> None:
    example = _example()

    async def first_turn() -> dict[str, Any]:
        with StratadSessionService(address, tenant=tenant) as svc:
            seen: dict[str, Any] = await example.turn(
                svc, "ada", "s1", "remember: invoice due Friday"
            )
            return seen

    first = run(first_turn())
    assert first["contents"][0] == "user: remember: invoice due Friday"

    lines, seen = _turn_in_new_process(address, tenant, "s1", "what do you remember?")
    assert lines[0] == "resuming session s1: 4 events"
    # The new process's model was sent the whole first turn, then the new question ...
    assert seen["contents"] == [
        "user: remember: invoice due Friday",
        'model: call remember({"note": "invoice due Friday"})',
        'user: result remember {"notes": 1}',
        "model: Noted. I keep 1 note(s) for you.",
        "user: what do you remember?",
    ]
    # ... and the state the first turn's tool wrote (user: and app: scopes).
    assert "Notes so far: ['invoice due Friday']" in seen["instruction"]
    assert "Notes taken by everyone: 1." in seen["instruction"]
    assert any("Your notes: ['invoice due Friday']" in line for line in lines)
    assert any("sent me 2 message(s)" in line for line in lines)

    # Another session of the same user (another process again) has the user's notes,
    # not the conversation.
    lines, seen = _turn_in_new_process(address, tenant, "s2", "what do you remember?")
    assert seen["contents"] == ["user: what do you remember?"]
    assert "Notes so far: ['invoice due Friday']" in seen["instruction"]
    # Another user of the app has the app's count, not the notes.
    lines, seen = _turn_in_new_process(address, tenant, "s3", "what do you remember?", user="bob")
    assert "Notes so far: ." in seen["instruction"]
    assert "Notes taken by everyone: 1." in seen["instruction"]

    async def stored() -> Session | None:
        with StratadSessionService(address, tenant=tenant) as svc:
            return await svc.get_session(app_name=example.APP, user_id="ada", session_id="s1")

    session = run(stored())
    assert session is not None and len(session.events) == 6
    assert session.state["user:notes"] == ["invoice due Friday"]
    assert session.state["app:notes_total"] == 1
    assert session.state["notes_here"] == 1
    assert session.state["last_reply"].startswith("You have sent me 2 message(s)")
    assert not any(k.startswith("temp:") for k in session.state)


def test_example_demo_runs_two_processes() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "demo"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "[first process] new session demo" in lines
    assert "[second process] resuming session demo: 4 events" in lines
    assert any(
        line.startswith("[second process] [note_keeper] model: You have sent me 2 message(s)")
        and "invoice due Friday" in line
        for line in lines
    ), lines


def test_runner_run_sync_uses_a_loop_per_call(address: str, tenant: str) -> None:
    """`Runner.run` (the blocking API) starts an event loop per call: one service serves all."""
    example = _example()
    model = example.ScriptedModel()
    with StratadSessionService(address, tenant=tenant) as svc:
        from google.adk.runners import Runner

        runner = Runner(app_name=example.APP, agent=example.build(model), session_service=svc)
        run(svc.create_session(app_name=example.APP, user_id="ada", session_id="sync"))
        for text in ("remember: pay rent", "what do you remember?"):
            message = types.Content(role="user", parts=[types.Part(text=text)])
            list(runner.run(user_id="ada", session_id="sync", new_message=message))
        assert (
            "Your notes: ['pay rent']"
            in run(svc.get_session(app_name=example.APP, user_id="ada", session_id="sync")).state[
                "last_reply"
            ]
        )  # type: ignore[union-attr]


def test_services_share_nothing_but_the_daemon(address: str) -> None:
    """Tenants isolate: the same names in two tenants are two sessions."""
    one, two = f"adk-{uuid.uuid4().hex[:8]}", f"adk-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        with (
            StratadSessionService(address, tenant=one) as a,
            StratadSessionService(address, tenant=two) as b,
        ):
            await a.create_session(app_name="app", user_id="u", session_id="s", state={"t": 1})
            assert await b.get_session(app_name="app", user_id="u", session_id="s") is None
            assert (await b.list_sessions(app_name="app")).sessions == []

    run(scenario())
