"""stratad.compat.cogency against a real ``stratad serve`` subprocess: Cogency's loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stratad.compat.cogency import AgentState, UserProfile, compress
from stratad.errors import InvalidArgumentError


class FakeLLM:
    """Two tool rounds, then an answer."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def run(self, prompt: str) -> dict[str, Any]:
        self.prompts.append(prompt)
        n = len(self.prompts)
        if n <= 2:
            return {
                "thinking": f"round {n}: search",
                "tool_calls": [{"name": "search", "args": {"q": f"revenue {n}"}, "id": f"c{n}"}],
                "context_updates": {
                    "strategy": "search then answer",
                    "insights": [f"insight {n}", "revenue is quarterly"],
                },
            }
        return {"thinking": "enough", "response": "Q3 revenue was $4M"}


async def execute_tools(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": c["name"], "id": c["id"], "result": {"rows": 3}} for c in calls]


async def seed_flow(address: str, llm: FakeLLM) -> AgentState:
    loaded_profile = UserProfile.load("alice", address=address)
    # 1. Agent Initialization
    state = AgentState(
        query="user query", user_id="alice", user_profile=loaded_profile, address=address
    )
    # 2. Reasoning Loop
    state.update_from_reasoning(await llm.run("first"))  # the loop needs pending calls
    while state.execution.should_continue():
        tool_results = await execute_tools(state.execution.pending_calls)
        state.execution.finish_tools(tool_results)
        state.execution.advance_iteration()
        prompt = state.get_situated_context() + state.reasoning.compress_for_context()
        state.update_from_reasoning(await llm.run(prompt))
    return state


def test_the_seed_loop_and_memory_update(daemon: Any) -> None:
    address = daemon.target
    profile = UserProfile("alice", address=address)
    profile.update_from_interaction({"communication_style": "terse", "goals": ["revenue"]})
    llm = FakeLLM()
    state = asyncio.run(seed_flow(address, llm))
    e = state.execution
    assert e.response == "Q3 revenue was $4M" and e.stop_reason is None
    assert e.iteration == 2 and e.pending_calls == [] and not e.should_continue()
    assert [c["id"] for c in e.completed_calls] == ["c1", "c2"]
    assert e.completed_calls[0]["result"] == {"rows": 3}
    r = state.reasoning
    assert r.goal == "user query" and r.strategy == "search then answer"
    assert r.insights == ["insight 1", "revenue is quarterly", "insight 2"]
    assert [t["thinking"] for t in r.thoughts] == ["round 1: search", "round 2: search", "enough"]
    assert llm.prompts[1] == (
        "USER CONTEXT:\nCOMMUNICATION: terse\nCURRENT GOALS: revenue\n\n"
        "GOAL: user query\nSTRATEGY: search then answer\n"
        "INSIGHTS: insight 1; revenue is quarterly\nLAST THINKING: round 1: search"
    )
    # 3. Memory Update
    interaction_data = {
        "query": e.query, "response": e.response, "success": bool(e.response),
        "mode_used": e.mode, "iterations": e.iteration,
    }  # fmt: skip
    assert interaction_data["mode_used"] == "adapt"
    profile.update_from_interaction(
        {"goals": ["quarterly numbers"], "expertise": ["finance"], "success_pattern": "search"},
        synthesized=True,
    )
    again = UserProfile.load("alice", address=address)
    assert again is not None
    assert again.goals == ["revenue", "quarterly numbers"]
    assert (again.synthesis_version, again.interaction_count) == (2, 2)
    assert compress(again) == (
        "COMMUNICATION: terse\nCURRENT GOALS: revenue; quarterly numbers\nEXPERTISE: finance"
    )
    # another process picks the loop up from the session
    attached = AgentState.attach(state.session_id, address=address)
    assert attached.execution.response == "Q3 revenue was $4M"
    assert attached.reasoning.insights == r.insights
    state.close()
    attached.close()


def test_reasoning_context_methods_and_bounds(daemon: Any) -> None:
    state = AgentState(query="q", address=daemon.target, max_iterations=3, mode="fast")
    for n in range(12):
        state.reasoning.learn(f"i{n}")
    state.reasoning.learn("i11")
    assert state.reasoning.insights == [f"i{n}" for n in range(2, 12)]
    for n in range(6):
        state.reasoning.record_thinking(f"t{n}", [{"name": "x"}])
    assert [t["thinking"] for t in state.reasoning.thoughts] == [f"t{n}" for n in range(1, 6)]
    assert state.execution.pending_calls == []  # record_thinking alone sets no calls
    state.reasoning.update_facts("year", 2024)
    state.reasoning.goal = "new goal"
    state.reasoning.strategy = "s"
    assert state.reasoning.facts == {"year": 2024}
    assert state.reasoning.compress_for_context(max_tokens=30) == "GOAL: new goal\nSTRATEGY: s\nFAC"
    state.execution.set_tool_calls([{"name": "calc", "args": {"x": 1}}])
    assert state.execution.should_continue()
    state.execution.stop_reason = "user cancelled"
    assert state.execution.stop_reason == "user cancelled"
    assert not state.execution.should_continue()
    assert state.execution.max_iterations == 3 and state.execution.mode == "fast"
    with pytest.raises(InvalidArgumentError, match="name"):
        state.execution.set_tool_calls([{"args": {}}])
    state.close()


def test_situated_context_without_a_profile(daemon: Any) -> None:
    state = AgentState(query="q", address=daemon.target)
    assert state.get_situated_context() == ""
    assert UserProfile.load("nobody", address=daemon.target) is None
    state.close()
