"""StratadSession (stratad.integrations.openai_agents) against a real daemon.

The first part holds StratadSession to the semantics the OpenAI Agents SDK's
own tests check for its SQLiteSession: tests/memory/test_session.py and
tests/memory/test_session_limit.py of openai/openai-agents-python at commit
7f7a44f8 (v0.22.0 and later; the installed SDK is 0.24.0). Each test here
says which upstream test it mirrors; they are rewritten for StratadSession,
not copied. Upstream tests of SQLite internals (connection pools, file locks,
rollbacks of a half-written transaction) have no counterpart; their
observable promise (a failed write changes nothing and the session stays
usable) is checked instead. Runner tests use the SDK's `agents.testing.
ScriptedModel` (no network), with run, run_sync and run_streamed as upstream.

The second part checks what stratad adds: concurrent writers in other
instances, threads and processes (versions), a session cleared and created
again under a stale cache, retention, labels and the idle TTL, the mapping of
daemon errors to the SDK's exceptions, and the resume of a conversation in a
new process (examples/openai_agents_resume.py as a subprocess).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from agents import (
    Agent,
    AgentsException,
    RunConfig,
    Runner,
    SessionSettings,
    TResponseInputItem,
    set_tracing_disabled,
)
from agents.memory import Session
from agents.testing import ScriptedModel, assistant_message
from grpc_health.v1 import health_pb2, health_pb2_grpc

import stratad
from stratad.errors import (
    FailedPreconditionError,
    NotFoundError,
    StratadError,
    UnavailableError,
)
from stratad.integrations.openai_agents import (
    CONTENT_TYPE,
    StratadSession,
    StratadSessionError,
    session_id_of,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openai_agents_resume.py"
RUNNER_METHODS = ["run", "run_sync", "run_streamed"]

set_tracing_disabled(True)  # no trace export: nothing here talks to OpenAI


# -- a daemon for the module ---------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAD_")}
    env["STRATAD_METRICS_LISTEN"] = "off"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "python"), env.get("PYTHONPATH", "")) if p
    )
    return env


def _serving(address: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the daemon exited"
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"nothing serving at {address}")


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `stratad serve` for the module's tests (each uses its own sessions)."""
    tmp = tmp_path_factory.mktemp("openai-agents-daemon")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{s.getsockname()[1]}"
    with (tmp / "daemon.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stratad", "serve", "--listen", target,
             "--data-dir", str(tmp / "data")],
            env=_env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _serving(target, proc)
        yield target
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def new_session(address: str) -> Iterator[Callable[..., StratadSession]]:
    """``new_session(name="", **options)``: a StratadSession on a session ID no
    other test uses (the same ``name`` gives the same ID within a test)."""
    made: list[StratadSession] = []
    run = uuid.uuid4().hex[:8]

    def make(name: str = "s", **options: Any) -> StratadSession:
        session = StratadSession(f"{name}-{run}", address, **options)
        made.append(session)
        return session

    yield make
    for session in made:
        session.close()


def message(role: str, content: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": role, "content": content})


def contents(items: list[TResponseInputItem]) -> list[Any]:
    return [cast(dict[str, Any], item).get("content") for item in items]


def _run_sync_in_new_loop(agent: Agent[Any], input_data: Any, **kwargs: Any) -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, input_data, **kwargs)
    finally:
        loop.close()


async def run_agent(method: str, agent: Agent[Any], input_data: Any, **kwargs: Any) -> Any:
    """Run `agent` once with Runner.run, run_sync (in a thread with its own
    loop) or run_streamed (consuming every event)."""
    if method == "run":
        return await Runner.run(agent, input_data, **kwargs)
    if method == "run_sync":
        return await asyncio.to_thread(_run_sync_in_new_loop, agent, input_data, **kwargs)
    result = Runner.run_streamed(agent, input_data, **kwargs)
    async for _ in result.stream_events():
        pass
    return result


def scripted() -> tuple[ScriptedModel, Agent[Any]]:
    model = ScriptedModel()
    return model, Agent(name="test", model=model)


def write_raw(session: StratadSession, data: bytes) -> None:
    """Save `data` as the session's list, as a foreign writer could."""
    with stratad.Client(session.address) as client:
        client.create_session(session.stratad_session_id, exist_ok=True)
        client.save_state(session.stratad_session_id, data, content_type=CONTENT_TYPE)


# == the SDK's session semantics (upstream tests/memory/test_session.py) ===================


def test_it_is_a_session_of_the_sdk(new_session: Callable[..., StratadSession]) -> None:
    assert isinstance(new_session(), Session)


@pytest.mark.parametrize("runner_method", RUNNER_METHODS)
def test_history_reaches_the_model_on_the_next_turn(
    new_session: Callable[..., StratadSession], runner_method: str
) -> None:
    """Mirrors test_session_memory_basic_functionality_parametrized and
    test_session_memory_with_explicit_instance_parametrized."""
    session = new_session()
    model, agent = scripted()

    async def body() -> None:
        model.enqueue([assistant_message("San Francisco")])
        first = await run_agent(runner_method, agent, "Where is the Golden Gate?", session=session)
        assert first.final_output == "San Francisco"
        model.enqueue([assistant_message("California")])
        second = await run_agent(runner_method, agent, "Which state?", session=session)
        assert second.final_output == "California"
        last_input = model.calls[-1].input
        assert len(last_input) == 3
        assert last_input[0]["content"] == "Where is the Golden Gate?"
        assert last_input[1]["content"][0]["text"] == "San Francisco"
        assert last_input[2]["content"] == "Which state?"

    asyncio.run(body())


@pytest.mark.parametrize("runner_method", RUNNER_METHODS)
def test_sessions_keep_separate_histories(
    new_session: Callable[..., StratadSession], runner_method: str
) -> None:
    """Mirrors test_session_memory_different_sessions_parametrized."""
    cats, dogs = new_session("cats"), new_session("dogs")
    model, agent = scripted()

    async def body() -> None:
        model.enqueue([assistant_message("cats noted")])
        await run_agent(runner_method, agent, "I like cats", session=cats)
        model.enqueue([assistant_message("dogs noted")])
        await run_agent(runner_method, agent, "I like dogs", session=dogs)
        model.enqueue([assistant_message("You like cats")])
        result = await run_agent(runner_method, agent, "What do I like?", session=cats)
        assert result.final_output == "You like cats"
        seen = json.dumps(model.calls[-1].input)
        assert "I like cats" in seen and "dogs" not in seen

    asyncio.run(body())


def test_add_get_and_clear(new_session: Callable[..., StratadSession]) -> None:
    """Mirrors test_sqlite_session_memory_direct."""
    session = new_session()

    async def body() -> None:
        items = [message("user", "Hello"), message("assistant", "Hi there!")]
        await session.add_items(items)
        assert await session.get_items() == items
        await session.clear_session()
        assert await session.get_items() == []
        # A cleared conversation starts again.
        await session.add_items([message("user", "again")])
        assert contents(await session.get_items()) == ["again"]

    asyncio.run(body())


def test_a_closed_session_refuses_even_an_empty_add(
    new_session: Callable[..., StratadSession],
) -> None:
    """Mirrors test_sqlite_session_closed_rejects_empty_add_items."""
    session = new_session()
    session.close()

    async def body() -> None:
        for call in (session.add_items([]), session.get_items(), session.pop_item(),
                     session.clear_session()):  # fmt: skip
            with pytest.raises(RuntimeError, match="StratadSession is closed"):
                await call

    asyncio.run(body())


def test_pop_item(new_session: Callable[..., StratadSession]) -> None:
    """Mirrors test_sqlite_session_memory_pop_item."""
    session = new_session()

    async def body() -> None:
        assert await session.pop_item() is None
        items = [message("user", "Hello"), message("assistant", "Hi there!"),
                 message("user", "How are you?")]  # fmt: skip
        await session.add_items(items)
        assert len(await session.get_items()) == 3
        assert await session.pop_item() == items[2]
        assert contents(await session.get_items()) == ["Hello", "Hi there!"]
        assert await session.pop_item() == items[1]
        assert await session.pop_item() == items[0]
        assert await session.pop_item() is None
        assert await session.get_items() == []

    asyncio.run(body())


def test_pop_affects_only_its_session(new_session: Callable[..., StratadSession]) -> None:
    """Mirrors test_session_memory_pop_different_sessions."""
    one, two = new_session("one"), new_session("two")

    async def body() -> None:
        await one.add_items([message("user", "Session 1 message")])
        await two.add_items([message("user", "Session 2 message 1"),
                             message("user", "Session 2 message 2")])  # fmt: skip
        popped = await two.pop_item()
        assert popped is not None and contents([popped]) == ["Session 2 message 2"]
        assert contents(await one.get_items()) == ["Session 1 message"]
        assert contents(await two.get_items()) == ["Session 2 message 1"]

    asyncio.run(body())


def test_pop_skips_lines_that_are_not_items(new_session: Callable[..., StratadSession]) -> None:
    """Mirrors test_sqlite_session_pop_item_skips_corrupt_most_recent and
    ..._returns_none_after_dropping_only_corrupt_rows (stratad never returns
    damaged bytes; a line that is not an item can only come from another writer)."""
    session, other = new_session("a"), new_session("b")
    valid = message("user", "valid")

    async def body() -> None:
        await session.add_items([valid])
        write_raw(session, b'{"role":"user","content":"valid"}\nnot valid json {{{\n')
        assert await session.pop_item() == valid
        assert await session.get_items() == []
        write_raw(other, b"not valid json {{{\n[1, 2]\n")
        assert await other.pop_item() is None
        assert await other.get_items() == []

    asyncio.run(body())


def test_get_items_with_a_limit(new_session: Callable[..., StratadSession]) -> None:
    """Mirrors test_sqlite_session_get_items_with_limit (and a negative limit,
    which SQLite's LIMIT treats as none)."""
    session = new_session()
    texts = ["Message 1", "Response 1", "Message 2", "Response 2", "Message 3", "Response 3"]

    async def body() -> None:
        await session.add_items(
            [message("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]
        )
        assert contents(await session.get_items()) == texts
        assert contents(await session.get_items(limit=2)) == texts[-2:]
        assert contents(await session.get_items(limit=4)) == texts[-4:]
        assert contents(await session.get_items(limit=10)) == texts
        assert await session.get_items(limit=0) == []
        assert contents(await session.get_items(limit=-1)) == texts

    asyncio.run(body())


def test_a_limit_counts_items_past_lines_that_are_not_items(
    new_session: Callable[..., StratadSession],
) -> None:
    """Mirrors test_sqlite_session_get_items_limit_skips_corrupt_newest_rows and
    test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows."""
    explicit = new_session("explicit")
    settings = new_session("settings", session_settings=SessionSettings(limit=2))
    data = b"".join(
        json.dumps({"role": "user", "content": f"valid {i}"}).encode() + b"\n" for i in range(3)
    )

    async def body() -> None:
        for session in (explicit, settings):
            write_raw(session, data + b"not valid json {{{\n")
        assert contents(await explicit.get_items(limit=2)) == ["valid 1", "valid 2"]
        assert contents(await settings.get_items()) == ["valid 1", "valid 2"]

    asyncio.run(body())


@pytest.mark.parametrize("runner_method", RUNNER_METHODS)
def test_list_input_is_appended_to_the_history(
    new_session: Callable[..., StratadSession], runner_method: str
) -> None:
    """Mirrors test_session_memory_appends_list_input_by_default."""
    session = new_session()
    model, agent = scripted()
    history = [message("user", "Earlier message"), message("assistant", "Saved reply")]
    list_input = [message("user", "Test message")]

    async def body() -> None:
        await session.add_items(history)
        model.enqueue([assistant_message("This should run")])
        await run_agent(runner_method, agent, list_input, session=session)
        assert model.calls[-1].input == history + list_input

    asyncio.run(body())


@pytest.mark.parametrize("runner_method", RUNNER_METHODS)
def test_session_input_callback_shapes_the_input(
    new_session: Callable[..., StratadSession], runner_method: str
) -> None:
    """Mirrors test_session_callback_prepared_input."""
    session = new_session()
    model, agent = scripted()
    history = [message("user", "Hello there."), message("assistant", "Hi, I'm here to assist.")]
    new_input = [message("user", "What is your name?")]

    def user_messages_only(past: list[Any], new: list[Any]) -> list[Any]:
        return [item for item in past if item["role"] == "user"] + new

    async def body() -> None:
        await session.add_items(history)
        model.enqueue([assistant_message("I'm a test")])
        config = RunConfig(session_input_callback=user_messages_only)
        await run_agent(runner_method, agent, new_input, session=session, run_config=config)
        assert model.calls[-1].input == [history[0], new_input[0]]

    asyncio.run(body())


@pytest.mark.parametrize("runner_method", RUNNER_METHODS)
def test_a_callback_repeating_history_does_not_grow_the_session(
    new_session: Callable[..., StratadSession], runner_method: str
) -> None:
    """Mirrors test_session_callback_repeating_history_does_not_grow_session."""
    session = new_session()
    model, agent = scripted()

    def repeat_first(past: list[Any], new: list[Any]) -> list[Any]:
        return [*past, past[0], *new] if past else new

    async def body() -> None:
        for turn in range(3):
            model.enqueue([assistant_message(f"assistant {turn}")])
            await run_agent(runner_method, agent, f"user {turn}", session=session,
                            run_config=RunConfig(session_input_callback=repeat_first))  # fmt: skip
        stored = await session.get_items()
        assert len(stored) == 6
        users = [item for item in stored if cast(dict[str, Any], item).get("role") == "user"]
        assert contents(users) == ["user 0", "user 1", "user 2"]

    asyncio.run(body())


def test_unicode_and_special_characters(new_session: Callable[..., StratadSession]) -> None:
    """Mirrors test_sqlite_session_unicode_content and
    test_sqlite_session_special_characters_and_sql_injection (and line breaks,
    which the JSON Lines layout must keep inside an item)."""
    session = new_session()
    texts = ["こんにちは", "😊👍", "Привет", "O'Reilly", "DROP TABLE sessions;",
             '"SELECT * FROM users WHERE name = "admin";"', "Robert'); DROP TABLE students;--",
             "two\nlines\r\n", "\u2028\u2029 separators", "nul \x00 byte"]  # fmt: skip

    async def body() -> None:
        await session.add_items([message("user", t) for t in texts])
        assert contents(await session.get_items()) == texts
        again = StratadSession(session.session_id, session.address)
        try:
            assert contents(await again.get_items(limit=3)) == texts[-3:]
        finally:
            again.close()

    asyncio.run(body())


def test_concurrent_adds_on_one_instance(new_session: Callable[..., StratadSession]) -> None:
    """Mirrors test_sqlite_session_concurrent_access: threads with their own
    event loops share one session object."""
    session = new_session()
    items = [message("user", f"Message {i}") for i in range(10)]

    def add(item: TResponseInputItem) -> None:
        asyncio.run(session.add_items([item]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, items))
    stored = asyncio.run(session.get_items())
    assert sorted(contents(stored)) == sorted(contents(items))


def test_an_item_json_cannot_hold_changes_nothing(
    new_session: Callable[..., StratadSession],
) -> None:
    """Mirrors test_sqlite_session_failed_add_items_releases_write_lock: the
    failed add stores nothing and the session stays usable."""
    session = new_session()

    async def body() -> None:
        await session.add_items([message("user", "before")])
        bad = cast(TResponseInputItem, {"role": "user", "content": object()})
        with pytest.raises(TypeError):
            await session.add_items([message("user", "fine"), bad])
        with pytest.raises(ValueError):
            await session.add_items([cast(TResponseInputItem, {"n": float("nan")})])
        await session.add_items([message("user", "after failure")])
        assert contents(await session.get_items()) == ["before", "after failure"]

    asyncio.run(body())


def test_an_add_items_failure_ends_a_streamed_run(
    new_session: Callable[..., StratadSession],
) -> None:
    """Mirrors test_session_add_items_exception_propagates_in_streamed."""
    session = new_session()

    async def failing_add_items(_items: list[TResponseInputItem]) -> None:
        raise RuntimeError("Simulated session.add_items failure")

    session.add_items = failing_add_items  # type: ignore[method-assign]
    model, agent = scripted()
    model.enqueue([assistant_message("This should not be reached")])

    async def body() -> None:
        result = Runner.run_streamed(agent, "Hello", session=session)

        async def consume() -> None:
            async for _ in result.stream_events():
                pass

        with pytest.raises(RuntimeError, match=r"Simulated session\.add_items failure"):
            await asyncio.wait_for(consume(), timeout=30)

    asyncio.run(body())


def test_session_settings(new_session: Callable[..., StratadSession]) -> None:
    """Mirrors test_session_settings_default, _constructor,
    _constructor_normalizes_dictionary, _rejects_unknown_dictionary_fields,
    test_get_items_uses_session_settings_limit and
    test_get_items_explicit_limit_overrides_session_settings."""
    default = new_session("default")
    assert isinstance(default.session_settings, SessionSettings)
    assert default.session_settings.limit is None
    assert new_session("five", session_settings=SessionSettings(limit=5)).session_settings == (
        SessionSettings(limit=5)
    )
    from_dict = new_session("dict", session_settings={"limit": 0})
    assert isinstance(from_dict.session_settings, SessionSettings)
    assert from_dict.session_settings.limit == 0
    assert from_dict.session_settings.resolve({"limit": 4}).limit == 4
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        new_session("bad", session_settings={"limitt": 1})

    three = new_session("three", session_settings=SessionSettings(limit=3))

    async def body() -> None:
        await three.add_items([message("user", f"Message {i}") for i in range(10)])
        assert contents(await three.get_items()) == ["Message 7", "Message 8", "Message 9"]
        assert contents(await three.get_items(limit=2)) == ["Message 8", "Message 9"]

    asyncio.run(body())


def test_run_config_overrides_the_session_settings(
    new_session: Callable[..., StratadSession],
) -> None:
    """Mirrors test_runner_with_session_settings_override."""
    session = new_session(session_settings=SessionSettings(limit=100))
    model, agent = scripted()

    async def body() -> None:
        await session.add_items([message("user", f"Turn {i}") for i in range(10)])
        model.enqueue([assistant_message("Got it")])
        config = RunConfig(session_settings=SessionSettings(limit=2))
        await Runner.run(agent, "New question", session=session, run_config=config)
        assert contents(model.calls[-1].input) == ["Turn 8", "Turn 9", "New question"]

    asyncio.run(body())


@pytest.mark.parametrize("operation", ["add", "pop", "clear"])
def test_a_cancelled_change_completes_before_the_cancellation_is_raised(
    new_session: Callable[..., StratadSession], operation: str
) -> None:
    """Mirrors test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome:
    the daemon has acknowledged the change when the caller is cancelled; the
    cancellation comes through once the outcome is known, and it is not retried."""
    session = new_session()
    item = message("user", "once")
    acknowledged, release = threading.Event(), threading.Event()

    async def body() -> None:
        if operation != "add":
            await session.add_items([item])
        client = session.client
        name = "delete_session" if operation == "clear" else "save"
        real = getattr(client, name)

        def pausing(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            acknowledged.set()
            assert release.wait(timeout=30)
            return out

        setattr(client, name, pausing)
        change = {"add": lambda: session.add_items([item]), "pop": session.pop_item,
                  "clear": session.clear_session}[operation]  # fmt: skip
        task: asyncio.Task[Any] = asyncio.ensure_future(change())
        try:
            assert await asyncio.to_thread(acknowledged.wait, 30)
            task.cancel()
            await asyncio.sleep(0)
            task.cancel()
            await asyncio.sleep(0)
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            release.set()
            setattr(client, name, real)
        assert task.cancelled()
        assert await session.get_items() == ([item] if operation == "add" else [])

    asyncio.run(body())


# == the session limit (upstream tests/memory/test_session_limit.py) ===========================


@pytest.mark.parametrize("runner_method", RUNNER_METHODS)
def test_session_limit_in_run_config(
    new_session: Callable[..., StratadSession], runner_method: str
) -> None:
    """Mirrors test_session_limit_parameter, test_session_limit_zero,
    test_session_limit_none_gets_all_history and test_session_limit_larger_than_history."""
    session = new_session()
    model, agent = scripted()

    async def turn(text: str, limit: int | None = None, *, configured: bool = False) -> list[Any]:
        model.enqueue([assistant_message(f"Reply to {text}")])
        run_config = (
            RunConfig(session_settings=SessionSettings(limit=limit)) if configured else None
        )
        await run_agent(runner_method, agent, text, session=session, run_config=run_config)
        return list(model.calls[-1].input)

    async def body() -> None:
        for i in (1, 2, 3):
            await turn(f"Message {i}")
        assert len(await session.get_items()) == 6
        last = await turn("Message 4", 2, configured=True)
        assert len(last) == 3
        assert last[0]["content"] == "Message 3"
        assert last[1]["content"][0]["text"] == "Reply to Message 3"
        assert last[2]["content"] == "Message 4"
        assert contents(await turn("Message 5", 0, configured=True)) == ["Message 5"]
        everything = await turn("Message 6", None, configured=True)
        assert len(everything) == 11 and everything[0]["content"] == "Message 1"
        larger = await turn("Message 7", 100, configured=True)
        assert len(larger) == 13 and larger[-1]["content"] == "Message 7"

    asyncio.run(body())


@pytest.mark.parametrize("runner_method", RUNNER_METHODS)
def test_a_limit_does_not_pass_a_tool_output_without_its_call(
    new_session: Callable[..., StratadSession], runner_method: str
) -> None:
    """Mirrors test_session_limit_drops_unmatched_history_function_call_output."""
    session = new_session()
    history = cast(
        list[TResponseInputItem],
        [
            {"role": "user", "content": "What is the weather?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}]},
        ],
    )  # fmt: skip
    model, agent = scripted()

    async def body() -> None:
        await session.add_items(history)
        assert await session.get_items(limit=2) == history[-2:]
        model.enqueue([assistant_message("Tomorrow is sunny too.")])
        config = RunConfig(session_settings=SessionSettings(limit=2))
        await run_agent(runner_method, agent, "What about tomorrow?", session=session,
                        run_config=config)  # fmt: skip
        assert model.calls[-1].input == [history[-1], message("user", "What about tomorrow?")]

    asyncio.run(body())


# == what stratad adds ==========================================================================


def test_concurrent_writers_lose_nothing(address: str) -> None:
    """Instances with their own connections (as separate processes would be)
    add and pop at once: every change lands once, in each writer's order."""
    sid = f"writers-{uuid.uuid4().hex[:8]}"
    per_writer = 12
    popped: list[TResponseInputItem] = []

    def writer(name: str) -> None:
        with StratadSession(sid, address) as session:
            for i in range(per_writer):
                asyncio.run(session.add_items([message("user", f"{name}-{i}")]))

    def popper() -> None:
        with StratadSession(sid, address) as session:
            for _ in range(per_writer):
                item = asyncio.run(session.pop_item())
                if item is not None:
                    popped.append(item)

    threads = [threading.Thread(target=writer, args=(f"w{k}",)) for k in range(3)]
    threads.append(threading.Thread(target=popper))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    with StratadSession(sid, address) as session:
        final = contents(asyncio.run(session.get_items()))
    gone = contents(popped)
    added = sorted(f"w{k}-{i}" for k in range(3) for i in range(per_writer))
    assert sorted(final + gone) == added  # nothing lost, nothing twice
    for k in range(3):
        mine = [c for c in final if c.startswith(f"w{k}-")]
        assert mine == sorted(mine, key=lambda c: int(c.split("-")[1]))


def test_concurrent_writer_processes(address: str) -> None:
    sid = f"processes-{uuid.uuid4().hex[:8]}"
    script = (
        "import asyncio, sys\n"
        "from stratad.integrations.openai_agents import StratadSession\n"
        "async def main():\n"
        "    with StratadSession(sys.argv[1], sys.argv[2]) as s:\n"
        "        for i in range(10):\n"
        "            await s.add_items([{'role': 'user', 'content': f'{sys.argv[3]}-{i}'}])\n"
        "asyncio.run(main())\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, sid, address, f"p{k}"], env=_env())
        for k in range(3)
    ]
    for proc in procs:
        assert proc.wait(timeout=180) == 0
    with StratadSession(sid, address) as session:
        final = contents(asyncio.run(session.get_items()))
    assert sorted(final) == sorted(f"p{k}-{i}" for k in range(3) for i in range(10))


def test_a_stale_cache_never_brings_back_a_cleared_conversation(address: str) -> None:
    """A writer whose cached list is of a session that was cleared and created
    again, up to the very version it remembers, still appends to the new list."""
    sid = f"stale-{uuid.uuid4().hex[:8]}"

    async def body() -> None:
        with StratadSession(sid, address) as a, StratadSession(sid, address) as b:
            await a.add_items([message("user", "a1")])
            await a.add_items([message("user", "a2")])

            def version_now() -> int:
                try:
                    return b.client.get_session(b.stratad_session_id).version
                except NotFoundError:
                    return 0

            version = version_now()
            await b.clear_session()
            n = 0
            while version_now() < version:
                n += 1
                await b.add_items([message("user", f"b{n}")])
            assert version_now() == version
            await a.add_items([message("user", "a3")])
            expected = [f"b{i}" for i in range(1, n + 1)] + ["a3"]
            assert contents(await a.get_items()) == expected
            assert contents(await b.get_items()) == expected

    asyncio.run(body())


def test_reading_or_popping_nothing_creates_no_session(
    new_session: Callable[..., StratadSession],
) -> None:
    session = new_session()

    async def body() -> None:
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.clear_session()
        with pytest.raises(NotFoundError):
            session.client.get_session(session.stratad_session_id)
        await session.add_items([message("user", "now")])
        assert session.client.get_session(session.stratad_session_id).checkpoint_count == 1

    asyncio.run(body())


def test_one_stratad_session_per_agent_session_with_labels_and_retention(
    address: str,
) -> None:
    plain = f"chat-{uuid.uuid4().hex[:8]}"
    odd = f"user 42 / chat {uuid.uuid4().hex[:8]}"
    assert session_id_of(plain) == plain
    assert session_id_of(plain, "oa.") == f"oa.{plain}"
    assert session_id_of(odd).startswith("oa-") and session_id_of(odd) == session_id_of(odd)

    async def body() -> None:
        with StratadSession(odd, address, keep_last=3, max_age_seconds=3600, keep=True,
                            labels={"team": "support"}) as session:  # fmt: skip
            for i in range(8):
                await session.add_items([message("user", f"m{i}")])
            stored = session.client.get_session(session_id_of(odd))
            assert stored.retention.keep_last == 3
            assert stored.retention.max_age_seconds == 3600
            assert dict(stored.labels) == {
                "stratad.integration": "openai-agents",
                "openai_agents.session_id": odd,
                "stratad.dev/keep": "true",
                "team": "support",
            }
            assert stored.checkpoint_count <= 3
            checkpoint = next(iter(session.client.list_checkpoints(session_id_of(odd))))
            assert checkpoint.content_type == CONTENT_TYPE
            assert dict(checkpoint.metadata) in (
                {"op": "add_items", "added": 1.0, "items": float(n)} for n in range(1, 9)
            )
        with StratadSession(odd, address) as again:
            assert contents(await again.get_items()) == [f"m{i}" for i in range(8)]

    asyncio.run(body())


def test_the_idle_ttl_expires_a_conversation_unless_kept(
    start_daemon: Callable[..., Any],
) -> None:
    daemon = start_daemon("--session-idle-ttl", "1s", "--lifecycle-sweep-interval", "0.2")

    async def body() -> None:
        with StratadSession("idle", daemon.target) as idle, \
                StratadSession("kept", daemon.target, keep=True) as kept:  # fmt: skip
            await idle.add_items([message("user", "soon gone")])
            await kept.add_items([message("user", "stays")])
            deadline = time.monotonic() + 30
            while await idle.get_items() and time.monotonic() < deadline:
                await asyncio.sleep(0.3)
            assert await idle.get_items() == []
            assert contents(await kept.get_items()) == ["stays"]
            await idle.add_items([message("user", "a new conversation")])
            assert contents(await idle.get_items()) == ["a new conversation"]

    asyncio.run(body())


def test_daemon_errors_reach_the_runner_as_agents_exceptions(address: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
    model, agent = scripted()
    model.enqueue([assistant_message("never")])

    async def body() -> None:
        with StratadSession("gone", nobody, timeout=3) as down:
            with pytest.raises(StratadSessionError) as caught:
                await Runner.run(agent, "hello", session=down)
            error = caught.value
            assert isinstance(error, AgentsException)
            assert isinstance(error, UnavailableError) and isinstance(error, StratadError)
            assert isinstance(error.error, UnavailableError)
            assert error.reason and "get_items failed" in str(error)
        # A session holding a state that StratadSession did not save.
        sid = f"foreign-{uuid.uuid4().hex[:8]}"
        with stratad.Client(address) as client:
            client.create_session(sid)
            client.save_state(sid, b'{"not": "ours"}', content_type="application/json")
        with StratadSession(sid, address) as foreign:
            with pytest.raises(FailedPreconditionError) as refused:
                await foreign.get_items()
            assert isinstance(refused.value, AgentsException)
            assert refused.value.reason == "FOREIGN_STATE"

    asyncio.run(body())


def test_a_conversation_resumes_in_a_new_process(address: str) -> None:
    """examples/openai_agents_resume.py: each turn is a new process running
    Runner.run with a scripted Model; the second one's model gets the first's items."""
    sid = f"resume-{uuid.uuid4().hex[:8]}"
    env = _env()

    def example(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), *args, "--address", address, "--session", sid],
            capture_output=True, text=True, env=env, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    first = example("turn", "My name is Ada.")
    assert first == [
        'model input (1 items): ["user: My name is Ada."]',
        "reply: Noted (0 earlier items in this conversation).",
    ]
    second = example("turn", "What is my name?")
    assert json.loads(second[0].split(": ", 1)[1]) == [
        "user: My name is Ada.",
        "assistant: Noted (0 earlier items in this conversation).",
        "user: What is my name?",
    ]
    assert second[1] == "reply: Your name is Ada."
    assert example("show") == [
        "user: My name is Ada.",
        "assistant: Noted (0 earlier items in this conversation).",
        "user: What is my name?",
        "assistant: Your name is Ada.",
    ]
    assert example("clear") == ["cleared"]
    assert example("show") == []
