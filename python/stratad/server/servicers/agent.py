"""AgentStateService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

from typing import Any

import grpc

from stratad.api.v1 import agent_pb2, agent_pb2_grpc
from stratad.domain.agent import AgentFacet, Agents, should_continue
from stratad.domain.structured import Applied
from stratad.server.runner import CHEAP
from stratad.server.servicers.base import Servicer, tenant_of
from stratad.values import set_value, struct_to_py, structs_to_py, to_py, to_struct


def state_to_pb(agent: AgentFacet) -> agent_pb2.AgentState:
    e, r = agent["execution"], agent["reasoning"]
    facts = []
    for k, v in r["facts"].items():
        fact = agent_pb2.Fact(key=k)
        set_value(fact.value, v)
        facts.append(fact)
    return agent_pb2.AgentState(
        execution=agent_pb2.ExecutionState(
            query=e["query"],
            user_id=e["user_id"],
            iteration=e["iteration"],
            max_iterations=e["max_iterations"],
            mode=e["mode"],
            stop_reason=e["stop_reason"],
            response=e["response"],
            pending_calls=[to_struct(dict(c)) for c in e["pending_calls"]],
            completed_calls=[to_struct(c) for c in e["completed_calls"]],
            should_continue=should_continue(e),
        ),
        reasoning=agent_pb2.ReasoningContext(
            goal=r["goal"],
            strategy=r["strategy"],
            facts=facts,
            insights=r["insights"],
            thoughts=[
                agent_pb2.Thought(
                    thinking=t["thinking"],
                    tool_calls=[to_struct(dict(c)) for c in t["tool_calls"]],
                    timestamp=t["timestamp"],
                )
                for t in r["thoughts"]
            ],
        ),
    )


def _state(applied: Applied[AgentFacet]) -> dict[str, Any]:
    return {"state": state_to_pb(applied.result), "version": applied.version}


class AgentStateServicer(Servicer, agent_pb2_grpc.AgentStateServiceServicer):
    @property
    def domain(self) -> Agents:
        return self.engine.agents

    async def StartAgent(
        self, request: agent_pb2.StartAgentRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.StartAgentResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: agent_pb2.StartAgentResponse(**_state(applied)),
            self.domain.start,
            tenant_of(context),
            request.session_id,
            query=request.query,
            user_id=request.user_id,
            max_iterations=request.max_iterations,
            mode=request.mode,
            expected_version=request.expected_version,
        )

    async def ApplyReasoning(
        self, request: agent_pb2.ApplyReasoningRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.ApplyReasoningResponse:
        updates = request.context_updates
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: agent_pb2.ApplyReasoningResponse(**_state(applied)),
            self.domain.apply_reasoning,
            tenant_of(context),
            request.session_id,
            thinking=request.thinking,
            tool_calls=structs_to_py(request.tool_calls, "tool_calls"),
            goal=updates.goal if updates.HasField("goal") else None,
            strategy=updates.strategy if updates.HasField("strategy") else None,
            insights=list(updates.insights),
            facts=[(f.key, to_py(f.value, f"fact {f.key!r}")) for f in updates.facts],
            response=request.response if request.HasField("response") else None,
            record_only=request.record_only,
            expected_version=request.expected_version,
        )

    async def RecordToolResults(
        self, request: agent_pb2.RecordToolResultsRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RecordToolResultsResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: agent_pb2.RecordToolResultsResponse(**_state(applied)),
            self.domain.record_tool_results,
            tenant_of(context),
            request.session_id,
            [struct_to_py(r, "results") for r in request.results],
            expected_version=request.expected_version,
        )

    async def AdvanceIteration(
        self, request: agent_pb2.AdvanceIterationRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.AdvanceIterationResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: agent_pb2.AdvanceIterationResponse(**_state(applied)),
            self.domain.advance_iteration,
            tenant_of(context),
            request.session_id,
            expected_version=request.expected_version,
        )

    async def StopAgent(
        self, request: agent_pb2.StopAgentRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.StopAgentResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: agent_pb2.StopAgentResponse(**_state(applied)),
            self.domain.stop,
            tenant_of(context),
            request.session_id,
            request.stop_reason,
            expected_version=request.expected_version,
        )

    async def GetAgentState(
        self, request: agent_pb2.GetAgentStateRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.GetAgentStateResponse:
        applied = await self.calls.read(
            CHEAP, self.domain.state, tenant_of(context), request.session_id
        )
        return agent_pb2.GetAgentStateResponse(**_state(applied))

    async def CompressContext(
        self, request: agent_pb2.CompressContextRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.CompressContextResponse:
        applied = await self.calls.read(
            CHEAP, self.domain.compress, tenant_of(context), request.session_id, request.max_tokens
        )
        text, truncated = applied.result
        return agent_pb2.CompressContextResponse(context=text, truncated=truncated)
