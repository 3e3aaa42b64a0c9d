"""An agent loop's execution state and reasoning context (Cogency's).

``SessionState.structured["agent"]``::

    {"execution": {query, user_id, iteration, max_iterations, mode, stop_reason,
                   response, pending_calls, completed_calls},
     "reasoning": {goal, strategy, facts, insights, thoughts}}

``stop_reason`` and ``response`` are "" for Cogency's None. Bounds: insights
10 newest unique, thoughts 5 newest (Cogency's); facts 20 newest keys
(Cogency's update_facts); completed calls 100 newest (stratad's, so the
state stays bounded). Record kinds: agent.start, agent.reasoning,
agent.tools, agent.advance, agent.stop. Every record carries what its
reducer needs (thought timestamps included), and the reducer is the same
pure function the live update used.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from stratad.domain import structured as st
from stratad.domain.models import SessionState, reducer
from stratad.domain.sessions import Commit, LiveSession, SessionManager
from stratad.errors import FailedPreconditionError, InvalidArgumentError
from stratad.ids import validate_id

FACET = "agent"
MAX_INSIGHTS = 10
MAX_THOUGHTS = 5
MAX_FACTS = 20
MAX_COMPLETED_CALLS = 100
DEFAULT_MAX_ITERATIONS = 10
MAX_ITERATIONS_LIMIT = 1_000_000
DEFAULT_MODE = "adapt"
#: CompressContext's default (Cogency's max_tokens, applied to characters).
DEFAULT_COMPRESS_CHARS = 1000
MAX_CALLS = 1000


def facet_of(state: SessionState) -> dict[str, Any]:
    agent: dict[str, Any] | None = state.structured.get(FACET)
    if agent is None:
        raise FailedPreconditionError(
            f"session {state.session_id!r} has no agent state yet: call StartAgent first",
            reason="NOT_INITIALIZED",
        )
    return agent


def should_continue(execution: dict[str, Any]) -> bool:
    """Cogency's ExecutionState.should_continue, exactly."""
    return (
        execution["iteration"] < execution["max_iterations"]
        and not execution["response"]
        and not execution["stop_reason"]
        and bool(execution["pending_calls"])
    )


# -- pure updates (the reducers and the live path share them) ----------------------------------


def learn(insights: list[str], insight: str) -> list[str]:
    """ReasoningContext.learn: stripped, unique, the 10 newest."""
    if insight and insight.strip() and insight not in insights:
        insights = [*insights, insight.strip()]
        if len(insights) > MAX_INSIGHTS:
            insights = insights[-MAX_INSIGHTS:]
    return insights


def update_facts(facts: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """Cogency's update_facts: set, keep the 20 most recently added keys."""
    if key and key.strip():
        facts = {**facts, key: value}
        if len(facts) > MAX_FACTS:
            facts = dict(list(facts.items())[-MAX_FACTS:])
    return facts


def apply_reasoning(agent: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """update_from_reasoning on a copy: the new agent facet."""
    execution, reasoning = dict(agent["execution"]), dict(agent["reasoning"])
    thought = body.get("thought")
    if thought is not None:  # record_thinking
        reasoning["thoughts"] = [*reasoning["thoughts"], thought][-MAX_THOUGHTS:]
    if body.get("tool_calls"):  # set_tool_calls
        execution["pending_calls"] = body["tool_calls"]
    if "goal" in body:
        reasoning["goal"] = body["goal"]
    if "strategy" in body:
        reasoning["strategy"] = body["strategy"]
    for insight in body.get("insights", ()):
        reasoning["insights"] = learn(reasoning["insights"], insight)
    for fact_key, value in body.get("facts", ()):
        reasoning["facts"] = update_facts(reasoning["facts"], fact_key, value)
    if "response" in body:
        execution["response"] = body["response"]
    return {"execution": execution, "reasoning": reasoning}


def finish_tools(agent: dict[str, Any], results: list[Any]) -> dict[str, Any]:
    execution = dict(agent["execution"])
    execution["completed_calls"] = [*execution["completed_calls"], *results][-MAX_COMPLETED_CALLS:]
    execution["pending_calls"] = []
    return {"execution": execution, "reasoning": agent["reasoning"]}


def advance_iteration(agent: dict[str, Any]) -> dict[str, Any]:
    execution = {**agent["execution"], "iteration": agent["execution"]["iteration"] + 1}
    return {"execution": execution, "reasoning": agent["reasoning"]}


def stop(agent: dict[str, Any], reason: str) -> dict[str, Any]:
    return {
        "execution": {**agent["execution"], "stop_reason": reason},
        "reasoning": agent["reasoning"],
    }


@reducer("agent.start")
def _apply_start(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = body["agent"]


@reducer("agent.reasoning")
def _apply_reasoning(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = apply_reasoning(state.structured[FACET], body)


@reducer("agent.tools")
def _apply_tools(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = finish_tools(state.structured[FACET], body["results"])


@reducer("agent.advance")
def _apply_advance(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = advance_iteration(state.structured[FACET])


@reducer("agent.stop")
def _apply_stop(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = stop(state.structured[FACET], body["stop_reason"])


# -- the service ---------------------------------------------------------------------------------


def compress_for_context(
    reasoning: dict[str, Any], max_tokens: int = DEFAULT_COMPRESS_CHARS
) -> str:
    """ReasoningContext.compress_for_context, exactly (max_tokens counts characters)."""
    sections = []
    if reasoning["goal"]:
        sections.append(f"GOAL: {reasoning['goal']}")
    if reasoning["strategy"]:
        sections.append(f"STRATEGY: {reasoning['strategy']}")
    if reasoning["facts"]:
        recent_facts = list(reasoning["facts"].items())[-5:]
        facts_str = "; ".join(f"{k}: {v}" for k, v in recent_facts)
        sections.append(f"FACTS: {facts_str}")
    if reasoning["insights"]:
        insights_str = "; ".join(reasoning["insights"][-3:])
        sections.append(f"INSIGHTS: {insights_str}")
    if reasoning["thoughts"]:
        last_thought = reasoning["thoughts"][-1]
        sections.append(f"LAST THINKING: {last_thought['thinking'][:200]}")
    result = "\n".join(sections)
    return result[:max_tokens] if len(result) > max_tokens else result


class Agents:
    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions

    def _update(
        self,
        tenant: str,
        session_id: str,
        expected_version: int,
        kind: str,
        body: dict[str, Any],
        update: Any,
        commit: Commit | None,
    ) -> st.Applied[dict[str, Any]]:
        """Journal `body`; the result is the agent facet after `update(facet)`."""

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], dict[str, Any]]:
            return body, update(facet_of(live.state))

        return st.mutate(
            self.sessions, tenant, session_id, expected_version, kind, plan, commit=commit
        )

    def start(
        self,
        tenant: str,
        session_id: str,
        *,
        query: str,
        user_id: str = "",
        max_iterations: int = 0,
        mode: str = "",
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[dict[str, Any]]:
        """A fresh loop for `query`: AgentState(query, user_id) (replaces any earlier loop)."""
        st.text(query, "query", required=True)
        if user_id:
            validate_id(user_id, "user_id")
        if not 0 <= max_iterations <= MAX_ITERATIONS_LIMIT:
            raise InvalidArgumentError(f"max_iterations must be 0-{MAX_ITERATIONS_LIMIT}")
        st.text(mode, "mode", limit=64)
        agent = {
            "execution": {
                "query": query,
                "user_id": user_id or "default",
                "iteration": 0,
                "max_iterations": max_iterations or DEFAULT_MAX_ITERATIONS,
                "mode": mode or DEFAULT_MODE,
                "stop_reason": "",
                "response": "",
                "pending_calls": [],
                "completed_calls": [],
            },
            "reasoning": {
                "goal": query,
                "strategy": "",
                "facts": {},
                "insights": [],
                "thoughts": [],
            },
        }

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], dict[str, Any]]:
            return {"agent": agent}, agent

        return st.mutate(
            self.sessions, tenant, session_id, expected_version, "agent.start", plan, commit=commit
        )

    def apply_reasoning(
        self,
        tenant: str,
        session_id: str,
        *,
        thinking: str = "",
        tool_calls: list[dict[str, Any]] | None = None,
        goal: str | None = None,
        strategy: str | None = None,
        insights: list[str] | None = None,
        facts: list[tuple[str, Any]] | None = None,
        response: str | None = None,
        record_only: bool = False,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[dict[str, Any]]:
        """update_from_reasoning (record_only: record_thinking alone)."""
        st.text(thinking, "thinking")
        calls = [_tool_call(c) for c in _bounded(tool_calls or [], "tool_calls")]
        st.json_value(calls, "tool_calls")
        if record_only and not thinking:
            raise InvalidArgumentError("record_only needs thinking to record")
        body: dict[str, Any] = {}
        if calls and not record_only:
            body["tool_calls"] = calls
        if goal is not None:
            body["goal"] = st.text(goal, "goal")
        if strategy is not None:
            body["strategy"] = st.text(strategy, "strategy")
        if insights:
            body["insights"] = st.texts(insights, "insights")
        if facts:
            for fact_key, _ in _bounded(facts, "facts"):
                st.key(fact_key, "a fact key")
            st.json_value([v for _, v in facts], "facts")
            body["facts"] = [[k, v] for k, v in facts]
        if response is not None:
            body["response"] = st.text(response, "response")

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], dict[str, Any]]:
            agent = facet_of(live.state)
            full = dict(body)
            if thinking:  # Cogency's datetime.now().isoformat(), fixed in the record
                stamp = dt.datetime.fromtimestamp(at).isoformat()
                full["thought"] = {"thinking": thinking, "tool_calls": calls, "timestamp": stamp}
            return full, apply_reasoning(agent, full)

        return st.mutate(
            self.sessions,
            tenant,
            session_id,
            expected_version,
            "agent.reasoning",
            plan,
            commit=commit,
        )

    def record_tool_results(
        self,
        tenant: str,
        session_id: str,
        results: list[Any],
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[dict[str, Any]]:
        """finish_tools: the results join the completed calls; no call is pending any more."""
        _bounded(results, "results")
        st.json_value(results, "results")
        body = {"results": list(results)}
        return self._update(
            tenant,
            session_id,
            expected_version,
            "agent.tools",
            body,
            lambda agent: finish_tools(agent, body["results"]),
            commit,
        )

    def advance_iteration(
        self,
        tenant: str,
        session_id: str,
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[dict[str, Any]]:
        return self._update(
            tenant, session_id, expected_version, "agent.advance", {}, advance_iteration, commit
        )

    def stop(
        self,
        tenant: str,
        session_id: str,
        stop_reason: str,
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[dict[str, Any]]:
        st.text(stop_reason, "stop_reason", required=True)
        return self._update(
            tenant,
            session_id,
            expected_version,
            "agent.stop",
            {"stop_reason": stop_reason},
            lambda agent: stop(agent, stop_reason),
            commit,
        )

    def state(self, tenant: str, session_id: str) -> st.Applied[dict[str, Any]]:
        return st.read(self.sessions, tenant, session_id, facet_of)

    def compress(
        self, tenant: str, session_id: str, max_tokens: int = 0
    ) -> st.Applied[tuple[str, bool]]:
        if max_tokens < 0:
            raise InvalidArgumentError("max_tokens must not be negative")
        limit = max_tokens or DEFAULT_COMPRESS_CHARS

        def compress(state: SessionState) -> tuple[str, bool]:
            reasoning = facet_of(state)["reasoning"]
            full = compress_for_context(reasoning, 1 << 62)
            return compress_for_context(reasoning, limit), len(full) > limit

        return st.read(self.sessions, tenant, session_id, compress)


def _bounded(items: list[Any], what: str) -> list[Any]:
    if len(items) > MAX_CALLS:
        raise InvalidArgumentError(f"{what} has more than {MAX_CALLS} items")
    return items


def _tool_call(call: Any) -> dict[str, Any]:
    """A tool call as Cogency validates it: {"name": str, "args": dict, "id"?}."""
    if not isinstance(call, dict):
        raise InvalidArgumentError("a tool call must be an object")
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError('a tool call needs a non-empty string "name"')
    args = call.get("args", {})
    if not isinstance(args, dict):
        raise InvalidArgumentError(f'the "args" of tool call {name!r} must be an object')
    validated = {"name": name, "args": args}
    if "id" in call:
        validated["id"] = call["id"]
    return validated
