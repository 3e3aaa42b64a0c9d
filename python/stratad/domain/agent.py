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

The shape is `AgentFacet` (TypedDicts: the JSON above, nothing else);
`parse` checks a facet from outside against it (ReplaceStructuredState).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict, TypeVar, cast

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
#: The largest iteration count (ExecutionState's int32 fields).
MAX_ITERATION = (1 << 31) - 1
#: The longest `mode` and thought timestamp.
MAX_SHORT_TEXT = 64

T = TypeVar("T")


# -- the facet's shape ----------------------------------------------------------------------


class ToolCall(TypedDict):
    """A tool call as Cogency validates it (see `_tool_call`)."""

    name: str
    args: st.JsonObject
    id: NotRequired[st.Json]


class Thought(TypedDict):
    thinking: str
    tool_calls: list[ToolCall]
    timestamp: str  # Cogency's datetime.now().isoformat()


class Execution(TypedDict):
    query: str
    user_id: str
    iteration: int
    max_iterations: int
    mode: str
    stop_reason: str  # "" for Cogency's None
    response: str  # "" for Cogency's None
    pending_calls: list[ToolCall]
    completed_calls: list[st.JsonObject]


class Reasoning(TypedDict):
    goal: str
    strategy: str
    facts: st.JsonObject  # in the order they were added
    insights: list[str]
    thoughts: list[Thought]


class AgentFacet(TypedDict):
    """``SessionState.structured["agent"]``."""

    execution: Execution
    reasoning: Reasoning


class ReasoningRecord(TypedDict, total=False):
    """The body of an agent.reasoning record: what update_from_reasoning changes."""

    tool_calls: list[ToolCall]
    goal: str
    strategy: str
    insights: list[str]
    facts: list[list[st.Json]]  # [key, value] pairs
    response: str
    thought: Thought


def parse(raw: object) -> AgentFacet:
    """`raw` as an agent facet, or INVALID_ARGUMENT naming the first field that is not.

    Accepts what the facet's own RPCs store (Cogency's bounds included), so a
    facet that parses is one every reader serves (see structured.py).
    """
    agent = st.want_object(raw, FACET, tuple(AgentFacet.__annotations__))
    path = f"{FACET}.execution"
    e = st.want_object(agent["execution"], path, tuple(Execution.__annotations__))
    st.want_text(e["query"], f"{path}.query")
    st.want_id(e["user_id"], f"{path}.user_id")
    st.want_int(e["iteration"], f"{path}.iteration", 0, MAX_ITERATION)
    st.want_int(e["max_iterations"], f"{path}.max_iterations", 1, MAX_ITERATIONS_LIMIT)
    st.want_text(e["mode"], f"{path}.mode", limit=MAX_SHORT_TEXT)
    st.want_text(e["stop_reason"], f"{path}.stop_reason")
    st.want_text(e["response"], f"{path}.response")
    pending = st.want_list(e["pending_calls"], f"{path}.pending_calls", max_items=MAX_CALLS)
    for i, call in enumerate(pending):
        _parse_call(call, f"{path}.pending_calls[{i}]")
    completed = st.want_list(
        e["completed_calls"], f"{path}.completed_calls", max_items=MAX_COMPLETED_CALLS
    )
    for i, result in enumerate(completed):
        st.want_json_object(result, f"{path}.completed_calls[{i}]")

    path = f"{FACET}.reasoning"
    r = st.want_object(agent["reasoning"], path, tuple(Reasoning.__annotations__))
    st.want_text(r["goal"], f"{path}.goal")
    st.want_text(r["strategy"], f"{path}.strategy")
    for key, value in st.want_map(r["facts"], f"{path}.facts", max_items=MAX_FACTS).items():
        st.want_json(value, f"{path}.facts[{key!r}]")
    st.want_texts(r["insights"], f"{path}.insights", max_items=MAX_INSIGHTS)
    thoughts = st.want_list(r["thoughts"], f"{path}.thoughts", max_items=MAX_THOUGHTS)
    for i, item in enumerate(thoughts):
        where = f"{path}.thoughts[{i}]"
        t = st.want_object(item, where, tuple(Thought.__annotations__))
        st.want_text(t["thinking"], f"{where}.thinking")
        calls = st.want_list(t["tool_calls"], f"{where}.tool_calls", max_items=MAX_CALLS)
        for j, call in enumerate(calls):
            _parse_call(call, f"{where}.tool_calls[{j}]")
        st.want_text(t["timestamp"], f"{where}.timestamp", limit=MAX_SHORT_TEXT)
    return cast(AgentFacet, agent)


def _parse_call(raw: object, path: str) -> None:
    call = st.want_object(raw, path, ("name", "args"), ("id",))
    st.want_text(call["name"], f"{path}.name", limit=st.MAX_JSON_BYTES)  # bounded by the request
    st.want_json_object(call["args"], f"{path}.args")
    if "id" in call:
        st.want_json(call["id"], f"{path}.id")


def facet_of(state: SessionState) -> AgentFacet:
    """The session's agent facet; FAILED_PRECONDITION before StartAgent.

    Typed without parsing: what the facet holds was written by the reducers
    below or passed `parse` (see structured.py)."""
    agent: AgentFacet | None = state.structured.get(FACET)
    if agent is None:
        raise FailedPreconditionError(
            f"session {state.session_id!r} has no agent state yet: call StartAgent first",
            reason="NOT_INITIALIZED",
        )
    return agent


def should_continue(execution: Execution) -> bool:
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


def update_facts(facts: st.JsonObject, key: str, value: st.Json) -> st.JsonObject:
    """Cogency's update_facts: set, keep the 20 most recently added keys."""
    if key and key.strip():
        facts = {**facts, key: value}
        if len(facts) > MAX_FACTS:
            facts = dict(list(facts.items())[-MAX_FACTS:])
    return facts


def apply_reasoning(agent: AgentFacet, body: ReasoningRecord) -> AgentFacet:
    """update_from_reasoning on a copy: the new agent facet."""
    execution, reasoning = agent["execution"].copy(), agent["reasoning"].copy()
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
        # A string: Agents.apply_reasoning checked it before journaling.
        reasoning["facts"] = update_facts(reasoning["facts"], cast(str, fact_key), value)
    if "response" in body:
        execution["response"] = body["response"]
    return {"execution": execution, "reasoning": reasoning}


def finish_tools(agent: AgentFacet, results: list[st.JsonObject]) -> AgentFacet:
    execution = agent["execution"].copy()
    execution["completed_calls"] = [*execution["completed_calls"], *results][-MAX_COMPLETED_CALLS:]
    execution["pending_calls"] = []
    return {"execution": execution, "reasoning": agent["reasoning"]}


def advance_iteration(agent: AgentFacet) -> AgentFacet:
    execution: Execution = {
        **agent["execution"],
        "iteration": agent["execution"]["iteration"] + 1,
    }
    return {"execution": execution, "reasoning": agent["reasoning"]}


def stop(agent: AgentFacet, reason: str) -> AgentFacet:
    return {
        "execution": {**agent["execution"], "stop_reason": reason},
        "reasoning": agent["reasoning"],
    }


# Record bodies are the journal's JSON (models.Reducer: dict[str, Any]); each
# reducer reads the values its plan below put there into the typed facet.


@reducer("agent.start")
def _apply_start(state: SessionState, body: dict[str, Any]) -> None:
    agent: AgentFacet = body["agent"]
    state.structured[FACET] = agent


@reducer("agent.reasoning")
def _apply_reasoning(state: SessionState, body: dict[str, Any]) -> None:
    record = cast(ReasoningRecord, body)  # what Agents.apply_reasoning journaled
    state.structured[FACET] = apply_reasoning(facet_of(state), record)


@reducer("agent.tools")
def _apply_tools(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = finish_tools(facet_of(state), body["results"])


@reducer("agent.advance")
def _apply_advance(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = advance_iteration(facet_of(state))


@reducer("agent.stop")
def _apply_stop(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = stop(facet_of(state), body["stop_reason"])


# -- the service ---------------------------------------------------------------------------------


def compress_for_context(reasoning: Reasoning, max_tokens: int = DEFAULT_COMPRESS_CHARS) -> str:
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
        update: Callable[[AgentFacet], AgentFacet],
        commit: Commit | None,
    ) -> st.Applied[AgentFacet]:
        """Journal `body`; the result is the agent facet after `update(facet)`."""

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], AgentFacet]:
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
    ) -> st.Applied[AgentFacet]:
        """A fresh loop for `query`: AgentState(query, user_id) (replaces any earlier loop)."""
        st.text(query, "query", required=True)
        if user_id:
            validate_id(user_id, "user_id")
        if not 0 <= max_iterations <= MAX_ITERATIONS_LIMIT:
            raise InvalidArgumentError(f"max_iterations must be 0-{MAX_ITERATIONS_LIMIT}")
        st.text(mode, "mode", limit=MAX_SHORT_TEXT)
        agent: AgentFacet = {
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

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], AgentFacet]:
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
        tool_calls: list[st.JsonObject] | None = None,
        goal: str | None = None,
        strategy: str | None = None,
        insights: list[str] | None = None,
        facts: list[tuple[str, st.Json]] | None = None,
        response: str | None = None,
        record_only: bool = False,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[AgentFacet]:
        """update_from_reasoning (record_only: record_thinking alone)."""
        st.text(thinking, "thinking")
        calls = [_tool_call(c) for c in _bounded(tool_calls or [], "tool_calls")]
        st.json_value(calls, "tool_calls")
        if record_only and not thinking:
            raise InvalidArgumentError("record_only needs thinking to record")
        body: ReasoningRecord = {}
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

        def plan(live: LiveSession, at: float) -> tuple[ReasoningRecord, AgentFacet]:
            agent = facet_of(live.state)
            full = body.copy()
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
        results: list[st.JsonObject],
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[AgentFacet]:
        """finish_tools: the results join the completed calls; no call is pending any more."""
        _bounded(results, "results")
        for index, result in enumerate(results):
            if not isinstance(result, dict):
                raise InvalidArgumentError(f"results[{index}] must be an object")
        st.json_value(results, "results")
        completed = list(results)
        return self._update(
            tenant,
            session_id,
            expected_version,
            "agent.tools",
            {"results": completed},
            lambda agent: finish_tools(agent, completed),
            commit,
        )

    def advance_iteration(
        self,
        tenant: str,
        session_id: str,
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[AgentFacet]:
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
    ) -> st.Applied[AgentFacet]:
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

    def state(self, tenant: str, session_id: str) -> st.Applied[AgentFacet]:
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


def _bounded(items: list[T], what: str) -> list[T]:
    if len(items) > MAX_CALLS:
        raise InvalidArgumentError(f"{what} has more than {MAX_CALLS} items")
    return items


def _tool_call(call: object) -> ToolCall:
    """A tool call as Cogency validates it: {"name": str, "args": dict, "id"?}."""
    if not isinstance(call, dict):
        raise InvalidArgumentError("a tool call must be an object")
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError('a tool call needs a non-empty string "name"')
    args = call.get("args", {})
    if not isinstance(args, dict):
        raise InvalidArgumentError(f'the "args" of tool call {name!r} must be an object')
    validated: ToolCall = {"name": name, "args": args}
    if "id" in call:
        validated["id"] = call["id"]
    return validated
