"""AgentStateService over gRPC: Cogency's loop, bounds, every RPC's bad input, tenancy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from stratad.api.v1 import agent_pb2 as pb
from stratad.api.v1 import agent_pb2_grpc

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
S = "loop"


def struct(v: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(v)
    return out


def value(v: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    json_format.ParseDict(v, out)
    return out


def py(message: Any) -> Any:
    return json_format.MessageToDict(message)


class Agent:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.stub = agent_pb2_grpc.AgentStateServiceStub(api.channel)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.stub, name)
        return lambda request: self.api.call(method, request)

    def method(self, name: str) -> Any:
        return getattr(self.stub, name)


@pytest.fixture
def agent(api: Api) -> Agent:
    api.create(S)
    return Agent(api)


def start(agent: Agent, **fields: Any) -> pb.AgentState:
    fields.setdefault("query", "user query")
    return agent.StartAgent(pb.StartAgentRequest(session_id=S, **fields)).state  # type: ignore[no-any-return]


def other_requests(session_id: str) -> list[tuple[str, Any]]:
    return [
        ("ApplyReasoning", pb.ApplyReasoningRequest(session_id=session_id, thinking="t")),
        ("RecordToolResults", pb.RecordToolResultsRequest(session_id=session_id)),
        ("AdvanceIteration", pb.AdvanceIterationRequest(session_id=session_id)),
        ("StopAgent", pb.StopAgentRequest(session_id=session_id, stop_reason="done")),
        ("GetAgentState", pb.GetAgentStateRequest(session_id=session_id)),
        ("CompressContext", pb.CompressContextRequest(session_id=session_id)),
    ]


def all_requests(session_id: str) -> list[tuple[str, Any]]:
    return [
        ("StartAgent", pb.StartAgentRequest(session_id=session_id, query="q")),
        *other_requests(session_id),
    ]


def test_the_seed_loop(agent: Agent) -> None:
    state = start(agent, user_id="alice", max_iterations=3, mode="deep")
    e = state.execution
    assert (e.query, e.user_id, e.iteration, e.max_iterations, e.mode) == (
        "user query", "alice", 0, 3, "deep",
    )  # fmt: skip
    assert not e.should_continue and state.reasoning.goal == "user query"
    call = struct({"name": "search", "args": {"q": "revenue", "limit": 5}})
    response = agent.ApplyReasoning(
        pb.ApplyReasoningRequest(
            session_id=S,
            thinking="look it up",
            tool_calls=[call],
            context_updates=pb.ContextUpdates(
                strategy="search then answer",
                insights=["  revenue is quarterly "],
                facts=[pb.Fact(key="year", value=value(2024))],
            ),
        )
    )
    state = response.state
    assert state.execution.should_continue
    assert py(state.execution.pending_calls[0]) == {
        "name": "search", "args": {"q": "revenue", "limit": 5.0}
    }  # fmt: skip
    r = state.reasoning
    assert (r.strategy, list(r.insights)) == ("search then answer", ["revenue is quarterly"])
    assert [(f.key, py(f.value)) for f in r.facts] == [("year", 2024.0)]
    assert r.thoughts[0].thinking == "look it up" and r.thoughts[0].timestamp
    results = agent.RecordToolResults(
        pb.RecordToolResultsRequest(session_id=S, results=[struct({"name": "search", "ok": True})])
    ).state
    assert not results.execution.pending_calls
    assert py(results.execution.completed_calls[0]) == {"name": "search", "ok": True}
    advanced = agent.AdvanceIteration(pb.AdvanceIterationRequest(session_id=S))
    assert advanced.state.execution.iteration == 1
    done = agent.ApplyReasoning(pb.ApplyReasoningRequest(session_id=S, response="Q3: $4M")).state
    assert done.execution.response == "Q3: $4M" and not done.execution.should_continue
    got = agent.GetAgentState(pb.GetAgentStateRequest(session_id=S))
    assert got.state == done and got.version == advanced.version + 1
    compressed = agent.CompressContext(pb.CompressContextRequest(session_id=S))
    assert compressed.context == (
        "GOAL: user query\nSTRATEGY: search then answer\nFACTS: year: 2024\n"
        "INSIGHTS: revenue is quarterly\nLAST THINKING: look it up"
    )
    assert not compressed.truncated
    cut = agent.CompressContext(pb.CompressContextRequest(session_id=S, max_tokens=10))
    assert (cut.context, cut.truncated) == ("GOAL: user", True)


def test_stop_agent_and_bounds(agent: Agent) -> None:
    start(agent)
    for n in range(12):
        agent.ApplyReasoning(
            pb.ApplyReasoningRequest(
                session_id=S,
                thinking=f"t{n}",
                context_updates=pb.ContextUpdates(insights=[f"i{n}", f"i{n}"]),
            )
        )
    state = agent.GetAgentState(pb.GetAgentStateRequest(session_id=S)).state
    assert list(state.reasoning.insights) == [f"i{n}" for n in range(2, 12)]
    assert [t.thinking for t in state.reasoning.thoughts] == [f"t{n}" for n in range(7, 12)]
    agent.ApplyReasoning(pb.ApplyReasoningRequest(session_id=S, tool_calls=[struct({"name": "x"})]))
    stopped = agent.StopAgent(pb.StopAgentRequest(session_id=S, stop_reason="budget")).state
    assert stopped.execution.stop_reason == "budget" and not stopped.execution.should_continue


@pytest.mark.parametrize(("name", "request_"), other_requests(S))
def test_every_rpc_before_start_agent_is_failed_precondition(
    api: Api, agent: Agent, name: str, request_: Any
) -> None:
    api.fails(
        agent.method(name), request_, grpc.StatusCode.FAILED_PRECONDITION, "StartAgent", keeps=S
    )


@pytest.mark.parametrize(("name", "request_"), all_requests("nope"))
def test_unknown_session_is_not_found(api: Api, agent: Agent, name: str, request_: Any) -> None:
    api.fails(agent.method(name), request_, NOT_FOUND, "nope")


@pytest.mark.parametrize(("name", "request_"), all_requests(S))
def test_another_tenants_session_is_not_found(
    api: Api, agent: Agent, name: str, request_: Any
) -> None:
    start(agent)
    api.as_tenant("intruder").fails(agent.method(name), request_, NOT_FOUND, S)


@pytest.mark.parametrize(("name", "request_"), all_requests("a/b"))
def test_a_bad_session_id_is_invalid(api: Api, agent: Agent, name: str, request_: Any) -> None:
    api.fails(agent.method(name), request_, INVALID, "session_id")


BAD_REQUESTS: list[tuple[str, Any, str]] = [
    ("StartAgent", pb.StartAgentRequest(session_id=S), "query is required"),
    ("StartAgent", pb.StartAgentRequest(session_id=S, query="q", user_id="a b"), "user_id"),
    (
        "StartAgent",
        pb.StartAgentRequest(session_id=S, query="q", max_iterations=-1),
        "max_iterations",
    ),
    ("StartAgent", pb.StartAgentRequest(session_id=S, query="q", mode="m" * 65), "mode"),
    ("ApplyReasoning", pb.ApplyReasoningRequest(session_id=S, tool_calls=[struct({})]), "name"),
    (
        "ApplyReasoning",
        pb.ApplyReasoningRequest(session_id=S, tool_calls=[struct({"name": "x", "args": 1})]),
        "args",
    ),
    ("ApplyReasoning", pb.ApplyReasoningRequest(session_id=S, record_only=True), "record_only"),
    (
        "ApplyReasoning",
        pb.ApplyReasoningRequest(
            session_id=S, context_updates=pb.ContextUpdates(facts=[pb.Fact(key="k")])
        ),
        "required",
    ),
    (
        "RecordToolResults",
        pb.RecordToolResultsRequest(session_id=S, results=[struct({"x": "y" * (1 << 20)})]),
        "limit",
    ),
    ("StopAgent", pb.StopAgentRequest(session_id=S), "stop_reason is required"),
    ("CompressContext", pb.CompressContextRequest(session_id=S, max_tokens=-1), "max_tokens"),
]


@pytest.mark.parametrize(("name", "request_", "words"), BAD_REQUESTS)
def test_bad_input_is_invalid_and_changes_nothing(
    api: Api, agent: Agent, name: str, request_: Any, words: str
) -> None:
    start(agent)
    api.fails(agent.method(name), request_, INVALID, words, keeps=S)
