"""The agent facet in-process on `Engine`: Cogency's loop, bounds, compression, replay."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stratad.domain.agent import compress_for_context, should_continue
from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.errors import FailedPreconditionError, InvalidArgumentError

T = "default"
S = "loop"


@contextlib.contextmanager
def open_engine(data_dir: Path) -> Iterator[Engine]:
    engine = Engine(data_dir, durability="none")
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with open_engine(tmp_path) as engine:
        engine.sessions.create(T, S)
        yield engine


def execution(engine: Engine) -> dict[str, Any]:
    return engine.agents.state(T, S).result["execution"]  # type: ignore[no-any-return]


def reasoning(engine: Engine) -> dict[str, Any]:
    return engine.agents.state(T, S).result["reasoning"]  # type: ignore[no-any-return]


def test_calls_before_start_are_failed_precondition(engine: Engine) -> None:
    for call in (
        lambda: engine.agents.apply_reasoning(T, S, thinking="x"),
        lambda: engine.agents.record_tool_results(T, S, []),
        lambda: engine.agents.advance_iteration(T, S),
        lambda: engine.agents.stop(T, S, "done"),
        lambda: engine.agents.state(T, S),
        lambda: engine.agents.compress(T, S),
    ):
        with pytest.raises(FailedPreconditionError, match="StartAgent"):
            call()


def test_the_seed_loop(engine: Engine) -> None:
    agents = engine.agents
    state = agents.start(T, S, query="user query", user_id="alice").result
    assert state["execution"] == {
        "query": "user query", "user_id": "alice", "iteration": 0, "max_iterations": 10,
        "mode": "adapt", "stop_reason": "", "response": "", "pending_calls": [],
        "completed_calls": [],
    }  # fmt: skip
    assert state["reasoning"]["goal"] == "user query"
    assert not should_continue(state["execution"])  # nothing pending
    call = {"name": "search", "args": {"q": "x"}, "id": "c1", "ignored": 1}
    state = agents.apply_reasoning(T, S, thinking="search first", tool_calls=[call]).result
    assert state["execution"]["pending_calls"] == [
        {"name": "search", "args": {"q": "x"}, "id": "c1"}
    ]
    assert should_continue(state["execution"])
    assert state["reasoning"]["thoughts"][0]["thinking"] == "search first"
    assert state["reasoning"]["thoughts"][0]["tool_calls"] == state["execution"]["pending_calls"]
    state = agents.record_tool_results(T, S, [{"name": "search", "result": "ok"}]).result
    assert state["execution"]["pending_calls"] == []
    assert state["execution"]["completed_calls"] == [{"name": "search", "result": "ok"}]
    state = agents.advance_iteration(T, S).result
    assert state["execution"]["iteration"] == 1
    state = agents.apply_reasoning(T, S, tool_calls=[{"name": "calc"}], response="42").result
    assert state["execution"]["response"] == "42"
    assert state["execution"]["pending_calls"] == [{"name": "calc", "args": {}}]
    assert not should_continue(state["execution"])  # a response ends the loop
    assert engine.agents.state(T, S).result == state


def test_should_continue_is_the_seed_expression() -> None:
    base = {"iteration": 0, "max_iterations": 2, "response": "", "stop_reason": "",
            "pending_calls": [{"name": "x"}]}  # fmt: skip
    assert should_continue(base)
    assert not should_continue({**base, "iteration": 2})
    assert not should_continue({**base, "response": "r"})
    assert not should_continue({**base, "stop_reason": "s"})
    assert not should_continue({**base, "pending_calls": []})


def test_stop_and_max_iterations(engine: Engine) -> None:
    engine.agents.start(T, S, query="q", max_iterations=1, mode="fast")
    engine.agents.apply_reasoning(T, S, tool_calls=[{"name": "t"}])
    assert should_continue(execution(engine))
    engine.agents.advance_iteration(T, S)
    assert not should_continue(execution(engine))
    engine.agents.start(T, S, query="q2")  # a new loop replaces the old one
    engine.agents.apply_reasoning(T, S, tool_calls=[{"name": "t"}])
    state = engine.agents.stop(T, S, "user cancelled").result
    assert state["execution"]["stop_reason"] == "user cancelled"
    assert not should_continue(state["execution"])


def test_insights_are_the_ten_newest_unique_and_thoughts_the_five_newest(engine: Engine) -> None:
    engine.agents.start(T, S, query="q")
    engine.agents.apply_reasoning(T, S, insights=["  a  ", "a", "", "   "])
    assert reasoning(engine)["insights"] == ["a"]
    engine.agents.apply_reasoning(T, S, insights=[f"i{n}" for n in range(12)])
    assert reasoning(engine)["insights"] == [f"i{n}" for n in range(2, 12)]
    engine.agents.apply_reasoning(T, S, insights=["i5"])  # known: nothing changes
    assert reasoning(engine)["insights"] == [f"i{n}" for n in range(2, 12)]
    for n in range(7):
        engine.agents.apply_reasoning(T, S, thinking=f"t{n}")
    assert [t["thinking"] for t in reasoning(engine)["thoughts"]] == [f"t{n}" for n in range(2, 7)]


def test_record_only_and_context_updates(engine: Engine) -> None:
    engine.agents.start(T, S, query="q")
    engine.agents.apply_reasoning(
        T, S, thinking="plan", tool_calls=[{"name": "x"}], record_only=True
    )
    assert execution(engine)["pending_calls"] == []
    assert reasoning(engine)["thoughts"][0]["tool_calls"] == [{"name": "x", "args": {}}]
    engine.agents.apply_reasoning(
        T, S, goal="new goal", strategy="divide", facts=[(f"k{n}", n) for n in range(22)]
    )
    r = reasoning(engine)
    assert (r["goal"], r["strategy"]) == ("new goal", "divide")
    assert list(r["facts"]) == [f"k{n}" for n in range(2, 22)]  # the 20 newest


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"tool_calls": [{"args": {}}]}, '"name"'),
        ({"tool_calls": [{"name": ""}]}, '"name"'),
        ({"tool_calls": [{"name": "x", "args": [1]}]}, '"args"'),
        ({"record_only": True}, "record_only"),
        ({"facts": [("", 1)]}, "fact key"),
        ({"thinking": "x" * 70000}, "longer"),
        ({"tool_calls": [{"name": "x"}] * 1001}, "more than"),
    ],
)
def test_apply_reasoning_bad_input(engine: Engine, kwargs: dict[str, Any], words: str) -> None:
    engine.agents.start(T, S, query="q")
    with pytest.raises(InvalidArgumentError, match=words):
        engine.agents.apply_reasoning(T, S, **kwargs)


def test_start_bad_input(engine: Engine) -> None:
    for kwargs in ({"query": ""}, {"query": "q", "user_id": "a b"},
                   {"query": "q", "max_iterations": -1}):  # fmt: skip
        with pytest.raises(InvalidArgumentError):
            engine.agents.start(T, S, **kwargs)
    with pytest.raises(InvalidArgumentError):
        engine.agents.start(T, S, query="q")
        engine.agents.stop(T, S, "")


def test_compress_for_context_is_the_seed_function() -> None:
    r = {
        "goal": "g", "strategy": "s", "facts": {f"k{n}": n for n in range(7)},
        "insights": ["a", "b", "c", "d"],
        "thoughts": [{"thinking": "old"}, {"thinking": "x" * 300}],
    }  # fmt: skip
    text = compress_for_context(r, 10_000)
    assert text == (
        "GOAL: g\nSTRATEGY: s\nFACTS: k2: 2; k3: 3; k4: 4; k5: 5; k6: 6\n"
        "INSIGHTS: b; c; d\nLAST THINKING: " + "x" * 200
    )
    assert compress_for_context(r, 20) == text[:20]
    empty = {"goal": "", "strategy": "", "facts": {}, "insights": [], "thoughts": []}
    assert compress_for_context(empty) == ""


def test_compress_reports_truncation(engine: Engine) -> None:
    engine.agents.start(T, S, query="a fairly long query")
    assert engine.agents.compress(T, S).result == ("GOAL: a fairly long query", False)
    assert engine.agents.compress(T, S, 6).result == ("GOAL: ", True)
    with pytest.raises(InvalidArgumentError):
        engine.agents.compress(T, S, -1)


def test_a_reopened_engine_replays_the_agent_and_checkpoints_capture_it(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.sessions.create(T, S)
        engine.agents.start(T, S, query="q")
        engine.agents.apply_reasoning(
            T, S, thinking="t", tool_calls=[{"name": "x"}], insights=["i"], facts=[("k", {"v": 1})]
        )
        saved = engine.checkpoints.save_state(T, S, SaveInput(data=b"x"))
        expected = engine.agents.state(T, S).result
        engine.agents.record_tool_results(T, S, [{"ok": True}])
        engine.agents.advance_iteration(T, S)
        engine.agents.stop(T, S, "enough")
        final = engine.agents.state(T, S).result
    with open_engine(tmp_path) as engine:
        assert engine.agents.state(T, S).result == final
        engine.checkpoints.restore_checkpoint(T, saved.checkpoint.checkpoint_id, make_current=True)
        assert engine.agents.state(T, S).result == expected
