"""stratad.integrations.openai_agents without a daemon: IDs, the JSON Lines
layout, the error classes and the cancellation rule of a change."""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any

import pytest
from agents import AgentsException
from agents.memory import Session

from stratad.errors import (
    CorruptObjectError,
    DataLossError,
    NotFoundError,
    StratadError,
    UnavailableError,
    VersionConflictError,
)
from stratad.integrations import openai_agents as oa


def test_session_ids() -> None:
    assert oa.session_id_of("chat-42") == "chat-42"
    assert oa.session_id_of("chat-42", "agents.") == "agents.chat-42"
    odd = oa.session_id_of("user 7 / chat")
    assert odd.startswith("oa-") and len(odd) == 3 + 32
    assert odd == oa.session_id_of("user 7 / chat") != oa.session_id_of("user 7 / chat ")
    assert oa.session_id_of("x" * 129).startswith("oa-")  # too long for an ID
    assert oa.session_id_of("").startswith("oa-")


def test_the_json_lines_layout_round_trips() -> None:
    items: list[Any] = [
        {"role": "user", "content": "two\nlines"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "é 😊 \u2028"}]},
        {"type": "function_call_output", "call_id": "c1", "output": '{"a": [1, 2.5]}'},
    ]
    data = oa._encode(items)
    assert data.count(b"\n") == 3 and data.endswith(b"\n")
    ends = oa._line_ends(data)
    snap = oa._Snapshot(data, ends, 1, "cp")
    assert snap.count == 3
    assert [json.loads(snap.line(i)) for i in range(3)] == items
    assert oa._decode([snap.line(i) for i in range(3)]) == items
    assert oa._decode([]) == []


def test_lines_that_are_not_items_are_skipped() -> None:
    lines = [b'{"a":1}', b"not json {{{", b"[1,2]", b'{"b":2},{"c":3}', b'{"d":4}']
    assert oa._decode(lines) == [{"a": 1}, {"d": 4}]
    # A last line without its newline (not written by StratadSession) still counts.
    data = b'{"a":1}\n{"b":2}'
    snap = oa._Snapshot(data, oa._line_ends(data), 1, "cp")
    assert [snap.line(i) for i in range(snap.count)] == [b'{"a":1}', b'{"b":2}']


def test_items_json_cannot_hold_are_refused() -> None:
    with pytest.raises(TypeError):
        oa._encode([{"content": object()}])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        oa._encode([{"n": float("inf")}])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "error",
    [
        UnavailableError("down", reason="STORAGE_FAILED", metadata={"a": "b"}),
        VersionConflictError("raced"),
        CorruptObjectError("bad bytes"),
        StratadError("unknown"),
    ],
)
def test_errors_are_agents_exceptions_of_their_stratad_class(error: StratadError) -> None:
    wrapped = oa.session_error(error, "StratadSession 'x': get_items failed")
    assert isinstance(wrapped, oa.StratadSessionError)
    assert isinstance(wrapped, AgentsException) and wrapped.run_data is None
    assert isinstance(wrapped, type(error))
    assert wrapped.error is error
    assert wrapped.reason == error.reason and wrapped.metadata == error.metadata
    assert str(wrapped) == f"StratadSession 'x': get_items failed: {error.message}"
    assert type(oa.session_error(error, "again")) is type(wrapped)  # one class per class
    assert oa.session_error(wrapped, "twice") is wrapped
    if isinstance(error, CorruptObjectError):
        assert isinstance(wrapped, DataLossError)
    assert not isinstance(wrapped, NotFoundError)


def test_a_session_needs_no_daemon_until_it_is_used() -> None:
    session = oa.StratadSession("chat 1", "127.0.0.1:1", session_settings={"limit": 3})
    assert isinstance(session, Session)
    assert session.stratad_session_id == oa.session_id_of("chat 1")
    assert session.session_settings is not None and session.session_settings.limit == 3
    assert session.labels == {
        "stratad.integration": "openai-agents",
        "openai_agents.session_id": "chat 1",
    }
    assert "stratad.dev/keep" in oa.StratadSession("k", keep=True).labels
    assert "openai_agents.session_id" not in oa.StratadSession("x" * 300).labels
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(session.get_items())
    with pytest.raises(RuntimeError, match="closed"):
        _ = session.client


def test_a_cancelled_change_waits_for_its_outcome() -> None:
    async def body() -> None:
        started, finish = asyncio.Event(), asyncio.Event()
        done: list[str] = []

        async def change() -> str:
            started.set()
            await finish.wait()
            done.append("applied")
            return "ok"

        task = asyncio.ensure_future(oa._await_outcome(change()))
        await started.wait()
        task.cancel()
        await asyncio.sleep(0)
        assert not task.done()  # still waiting for the change
        finish.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert done == ["applied"]
        assert await oa._await_outcome(asyncio.sleep(0, "value")) == "value"

    asyncio.run(body())


def test_the_error_classes_are_module_level_names() -> None:
    wrapped = oa.session_error(UnavailableError("down"), "x")
    assert type(wrapped).__module__ == oa.__name__
    assert type(wrapped).__name__ == "StratadSessionUnavailableError"
    again = pickle.loads(pickle.dumps(wrapped))  # e.g. out of a process pool
    assert type(again) is type(wrapped)
    assert (again.message, again.reason, again.error.message) == ("x: down", "UNAVAILABLE", "down")
