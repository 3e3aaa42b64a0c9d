"""CognitiveStateService: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import grpc

from stratad.api.v1 import cognitive_pb2, cognitive_pb2_grpc
from stratad.domain.cognitive import (
    FLUID_FIELDS,
    RESOLVED,
    Cognitive,
    CognitiveFacet,
    Crystallized,
    Decision,
    ErrorEntry,
    Fluid,
    FluidUpdate,
)
from stratad.errors import InvalidArgumentError
from stratad.server.runner import CHEAP, CONTEXT_TOKENS, IO, bounded
from stratad.server.servicers.base import Servicer, tenant_of
from stratad.server.servicers.convert import timestamp
from stratad.values import fill_struct, struct_to_py

_ERROR_STATUS = {
    "open": cognitive_pb2.ERROR_STATUS_OPEN,
    RESOLVED: cognitive_pb2.ERROR_STATUS_RESOLVED,
}


def crystallized_to_pb(c: Crystallized) -> cognitive_pb2.CrystallizedState:
    return cognitive_pb2.CrystallizedState(
        goal=c["goal"],
        success_criteria=c["success_criteria"],
        constraints=c["constraints"],
        user_identity=c["user_identity"],
        project_context=c["project_context"],
        created_at=timestamp(c["created_at"]),
    )


def fluid_to_pb(f: Fluid) -> cognitive_pb2.FluidState:
    out = cognitive_pb2.FluidState(
        current_sub_goal=f["current_sub_goal"],
        progress=f["progress"],
        sub_goals=[cognitive_pb2.SubGoal(**g) for g in f["sub_goals"]],
        active_entities=f["active_entities"],
        open_questions=f["open_questions"],
        step_count=f["step_count"],
        last_updated=timestamp(f["last_updated"]),
    )
    fill_struct(out.brain_state_digest, f["brain_state_digest"])
    return out


def decision_to_pb(d: Decision) -> cognitive_pb2.Decision:
    return cognitive_pb2.Decision(
        step=d["step"],
        decision=d["decision"],
        rationale=d["rationale"],
        timestamp=timestamp(d["timestamp"]),
    )


def error_to_pb(e: ErrorEntry) -> cognitive_pb2.ErrorEntry:
    return cognitive_pb2.ErrorEntry(
        step=e["step"],
        error=e["error"],
        resolution=e["resolution"],
        pattern=e["pattern"],
        status=_ERROR_STATUS[e["status"]],
    )


def state_to_pb(s: CognitiveFacet) -> cognitive_pb2.CognitiveState:
    insights = s["insights"]
    return cognitive_pb2.CognitiveState(
        crystallized=crystallized_to_pb(s["crystallized"]),
        fluid=fluid_to_pb(s["fluid"]),
        insights=cognitive_pb2.InsightState(
            decision_log=[decision_to_pb(d) for d in insights["decision_log"]],
            error_journal=[error_to_pb(e) for e in insights["error_journal"]],
            learned_constraints=insights["learned_constraints"],
            entity_relationships=[
                cognitive_pb2.EntityRelationship(
                    entity_a=r["from"], relation=r["relation"], entity_b=r["to"]
                )
                for r in insights["entity_relationships"]
            ],
            pattern_observations=insights["pattern_observations"],
        ),
    )


def fluid_fields(request: cognitive_pb2.UpdateFluidRequest) -> FluidUpdate:
    """The fields an UpdateFluid changes (request field names, see the proto)."""
    masked = set(request.update_mask.paths)
    unknown = masked - FLUID_FIELDS.keys()
    if unknown:
        raise InvalidArgumentError(
            f"update_mask names unknown field {sorted(unknown)[0]!r} "
            f"(fields: {', '.join(FLUID_FIELDS)})"
        )
    fields: FluidUpdate = {}
    if request.HasField("progress") or "progress" in masked:
        fields["progress"] = request.progress
    if request.HasField("current_sub_goal") or "current_sub_goal" in masked:
        fields["current_sub_goal"] = request.current_sub_goal
    if request.HasField("step_count") or "step_count" in masked:
        fields["step_count"] = request.step_count
    if request.HasField("brain_digest") or "brain_digest" in masked:
        fields["brain_digest"] = struct_to_py(request.brain_digest, "brain_digest")
    if request.sub_goals or "sub_goals" in masked:
        fields["sub_goals"] = [{"goal": g.goal, "status": g.status} for g in request.sub_goals]
    if request.entities or "entities" in masked:
        fields["entities"] = dict(request.entities)
    if request.questions or "questions" in masked:
        fields["questions"] = list(request.questions)
    return fields


class CognitiveStateServicer(Servicer, cognitive_pb2_grpc.CognitiveStateServiceServicer):
    @property
    def domain(self) -> Cognitive:
        return self.engine.cognitive

    async def Initialize(
        self, request: cognitive_pb2.InitializeRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.InitializeResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: cognitive_pb2.InitializeResponse(
                crystallized=crystallized_to_pb(applied.result), version=applied.version
            ),
            self.domain.initialize,
            tenant_of(context),
            request.session_id,
            goal=request.goal,
            constraints=list(request.constraints),
            success_criteria=list(request.success_criteria),
            user_identity=dict(request.user_identity),
            project_context=request.project_context,
            expected_version=request.expected_version,
        )

    async def UpdateFluid(
        self, request: cognitive_pb2.UpdateFluidRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.UpdateFluidResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: cognitive_pb2.UpdateFluidResponse(
                fluid=fluid_to_pb(applied.result), version=applied.version
            ),
            self.domain.update_fluid,
            tenant_of(context),
            request.session_id,
            fluid_fields(request),
            expected_version=request.expected_version,
        )

    async def RecordDecision(
        self, request: cognitive_pb2.RecordDecisionRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.RecordDecisionResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: cognitive_pb2.RecordDecisionResponse(
                decision=decision_to_pb(applied.result), version=applied.version
            ),
            self.domain.record_decision,
            tenant_of(context),
            request.session_id,
            step=request.step,
            decision=request.decision,
            rationale=request.rationale,
            expected_version=request.expected_version,
        )

    async def RecordError(
        self, request: cognitive_pb2.RecordErrorRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.RecordErrorResponse:
        return await self.calls.mutate_and_answer(
            CHEAP,
            context,
            lambda applied: cognitive_pb2.RecordErrorResponse(
                error=error_to_pb(applied.result), version=applied.version
            ),
            self.domain.record_error,
            tenant_of(context),
            request.session_id,
            step=request.step,
            error=request.error,
            resolution=request.resolution,
            pattern=request.pattern,
            expected_version=request.expected_version,
        )

    # The next four may change nothing (a duplicate, no open error); such an
    # answer waits for the disk (structured.mutate), so they are IO.

    async def ResolveError(
        self, request: cognitive_pb2.ResolveErrorRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.ResolveErrorResponse:
        applied = await self.calls.mutate(
            IO,
            self.domain.resolve_error,
            tenant_of(context),
            request.session_id,
            step=request.step,
            resolution=request.resolution,
            expected_version=request.expected_version,
        )
        return cognitive_pb2.ResolveErrorResponse(resolved=applied.result, version=applied.version)

    async def AddLearnedConstraint(
        self, request: cognitive_pb2.AddLearnedConstraintRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.AddLearnedConstraintResponse:
        applied = await self.calls.mutate(
            IO,
            self.domain.add_learned_constraint,
            tenant_of(context),
            request.session_id,
            request.constraint,
            expected_version=request.expected_version,
        )
        return cognitive_pb2.AddLearnedConstraintResponse(
            added=applied.result, version=applied.version
        )

    async def AddEntityRelationship(
        self, request: cognitive_pb2.AddEntityRelationshipRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.AddEntityRelationshipResponse:
        applied = await self.calls.mutate(
            IO,
            self.domain.add_entity_relationship,
            tenant_of(context),
            request.session_id,
            request.entity_a,
            request.relation,
            request.entity_b,
            expected_version=request.expected_version,
        )
        return cognitive_pb2.AddEntityRelationshipResponse(
            added=applied.result, version=applied.version
        )

    async def AddPatternObservation(
        self, request: cognitive_pb2.AddPatternObservationRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.AddPatternObservationResponse:
        applied = await self.calls.mutate(
            IO,
            self.domain.add_pattern_observation,
            tenant_of(context),
            request.session_id,
            request.pattern,
            expected_version=request.expected_version,
        )
        return cognitive_pb2.AddPatternObservationResponse(
            added=applied.result, version=applied.version
        )

    async def GetCognitiveState(
        self, request: cognitive_pb2.GetCognitiveStateRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.GetCognitiveStateResponse:
        tenant = tenant_of(context)

        def get() -> cognitive_pb2.GetCognitiveStateResponse:
            applied = self.domain.state(tenant, request.session_id)
            return cognitive_pb2.GetCognitiveStateResponse(
                state=state_to_pb(applied.result), version=applied.version
            )

        return await self.calls.run(IO, get)  # large logs take a while to convert

    async def BuildContext(
        self, request: cognitive_pb2.BuildContextRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.BuildContextResponse:
        applied = await self.calls.read(
            bounded(CONTEXT_TOKENS, request.max_tokens),
            self.domain.build_context,
            tenant_of(context),
            request.session_id,
            request.max_tokens,
        )
        result = applied.result
        return cognitive_pb2.BuildContextResponse(
            context=result.text,
            truncated=result.truncated,
            estimated_tokens=result.estimated_tokens,
            omitted_items=result.omitted_items,
            version=applied.version,
        )

    async def GetCognitiveStats(
        self, request: cognitive_pb2.GetCognitiveStatsRequest, context: grpc.aio.ServicerContext
    ) -> cognitive_pb2.GetCognitiveStatsResponse:
        applied = await self.calls.read(
            CHEAP, self.domain.stats, tenant_of(context), request.session_id
        )
        return cognitive_pb2.GetCognitiveStatsResponse(**applied.result)
