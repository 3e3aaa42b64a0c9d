"""CrystalService: protobuf in, domain call (stratad.domain.crystals), protobuf out."""

from __future__ import annotations

import grpc
from google.protobuf import timestamp_pb2

from stratad.api.v1 import crystal_pb2, crystal_pb2_grpc
from stratad.domain.crystals import Crystal, CrystallizeResult, LibraryConfig, Outcome, TraceStep
from stratad.server.runner import IO
from stratad.server.servicers.base import Servicer, tenant_of

_OUTCOMES = {
    Outcome.CREATED: crystal_pb2.CRYSTALLIZE_OUTCOME_CREATED,
    Outcome.BELOW_THRESHOLD: crystal_pb2.CRYSTALLIZE_OUTCOME_BELOW_THRESHOLD,
    Outcome.NOT_NOVEL: crystal_pb2.CRYSTALLIZE_OUTCOME_NOT_NOVEL,
}


def crystal_to_pb(crystal: Crystal) -> crystal_pb2.Crystal:
    created_at = timestamp_pb2.Timestamp()
    created_at.FromNanoseconds(round(crystal.created_at * 1e9))
    return crystal_pb2.Crystal(
        crystal_id=crystal.crystal_id,
        goal_template=crystal.goal_template,
        decision_chain=crystal.decision_chain,
        tool_sequence=crystal.tool_sequence,
        error_patterns=[
            crystal_pb2.ErrorPattern(error=p.error, resolution=p.resolution)
            for p in crystal.error_patterns
        ],
        success_score=crystal.success_score,
        reuse_count=crystal.reuse_count,
        effectiveness=crystal.effectiveness,
        entity_types=crystal.entity_types,
        created_from=crystal.created_from,
        created_at=created_at,
    )


def _config_to_pb(config: LibraryConfig) -> crystal_pb2.CrystalLibraryConfig:
    return crystal_pb2.CrystalLibraryConfig(
        max_crystals=config.max_crystals, min_success_score=config.min_success_score
    )


def _crystallize_to_pb(result: CrystallizeResult) -> crystal_pb2.CrystallizeResponse:
    return crystal_pb2.CrystallizeResponse(
        outcome=_OUTCOMES[result.outcome],
        crystal=crystal_to_pb(result.crystal) if result.crystal is not None else None,
        similar_crystal_id=result.similar_crystal_id,
        tool_similarity=result.tool_similarity,
        goal_similarity=result.goal_similarity,
        evicted_crystal_ids=result.evicted,
        min_success_score=result.min_success_score,
    )


class CrystalServicer(Servicer, crystal_pb2_grpc.CrystalServiceServicer):
    async def Crystallize(
        self, request: crystal_pb2.CrystallizeRequest, context: grpc.aio.ServicerContext
    ) -> crystal_pb2.CrystallizeResponse:
        trace = [
            TraceStep(s.decision, s.tool, s.error, s.resolution) for s in request.execution_trace
        ]
        result = await self.calls.run(
            IO,
            self.engine.crystals.crystallize,
            tenant_of(context),
            request.goal,
            trace,
            request.success_score,
            request.session_id,
            min_success_score=(
                request.min_success_score if request.HasField("min_success_score") else None
            ),
        )
        return _crystallize_to_pb(result)

    async def QueryCrystals(
        self, request: crystal_pb2.QueryCrystalsRequest, context: grpc.aio.ServicerContext
    ) -> crystal_pb2.QueryCrystalsResponse:
        template, matches = await self.calls.run(
            IO, self.engine.crystals.query, tenant_of(context), request.goal_text, request.top_k
        )
        return crystal_pb2.QueryCrystalsResponse(
            matches=[
                crystal_pb2.CrystalMatch(
                    crystal=crystal_to_pb(m.crystal), similarity=m.similarity, score=m.score
                )
                for m in matches
            ],
            goal_template=template,
        )

    async def ApplyCrystal(
        self, request: crystal_pb2.ApplyCrystalRequest, context: grpc.aio.ServicerContext
    ) -> crystal_pb2.ApplyCrystalResponse:
        prompt = await self.calls.run(
            IO, self.engine.crystals.apply, tenant_of(context), request.crystal_id, request.context
        )
        return crystal_pb2.ApplyCrystalResponse(prompt=prompt)

    async def RecordReuse(
        self, request: crystal_pb2.RecordReuseRequest, context: grpc.aio.ServicerContext
    ) -> crystal_pb2.RecordReuseResponse:
        crystal = await self.calls.run(
            IO,
            self.engine.crystals.record_reuse,
            tenant_of(context),
            request.crystal_id,
            request.success,
        )
        return crystal_pb2.RecordReuseResponse(crystal=crystal_to_pb(crystal))

    async def GetCrystal(
        self, request: crystal_pb2.GetCrystalRequest, context: grpc.aio.ServicerContext
    ) -> crystal_pb2.GetCrystalResponse:
        crystal = await self.calls.run(
            IO, self.engine.crystals.get, tenant_of(context), request.crystal_id
        )
        return crystal_pb2.GetCrystalResponse(crystal=crystal_to_pb(crystal))

    async def ListCrystals(
        self, request: crystal_pb2.ListCrystalsRequest, context: grpc.aio.ServicerContext
    ) -> crystal_pb2.ListCrystalsResponse:
        page, token = await self.calls.run(
            IO,
            self.engine.crystals.list,
            tenant_of(context),
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return crystal_pb2.ListCrystalsResponse(
            crystals=[crystal_to_pb(c) for c in page], next_page_token=token
        )

    async def DeleteCrystal(
        self, request: crystal_pb2.DeleteCrystalRequest, context: grpc.aio.ServicerContext
    ) -> crystal_pb2.DeleteCrystalResponse:
        await self.calls.run(
            IO, self.engine.crystals.delete, tenant_of(context), request.crystal_id
        )
        return crystal_pb2.DeleteCrystalResponse()

    async def GetCrystalStats(
        self, request: crystal_pb2.GetCrystalStatsRequest, context: grpc.aio.ServicerContext
    ) -> crystal_pb2.GetCrystalStatsResponse:
        stats = await self.calls.run(IO, self.engine.crystals.stats, tenant_of(context))
        return crystal_pb2.GetCrystalStatsResponse(
            total_crystals=stats.total_crystals,
            effective_crystals=stats.effective_crystals,
            total_reuses=stats.total_reuses,
            avg_effectiveness=stats.avg_effectiveness,
            max_crystals=stats.max_crystals,
            memory_bytes=stats.memory_bytes,
            journal_bytes=stats.journal_bytes,
        )

    async def GetCrystalLibraryConfig(
        self,
        request: crystal_pb2.GetCrystalLibraryConfigRequest,
        context: grpc.aio.ServicerContext,
    ) -> crystal_pb2.GetCrystalLibraryConfigResponse:
        config = await self.calls.run(IO, self.engine.crystals.config, tenant_of(context))
        return crystal_pb2.GetCrystalLibraryConfigResponse(config=_config_to_pb(config))

    async def SetCrystalLibraryConfig(
        self,
        request: crystal_pb2.SetCrystalLibraryConfigRequest,
        context: grpc.aio.ServicerContext,
    ) -> crystal_pb2.SetCrystalLibraryConfigResponse:
        config, evicted = await self.calls.run(
            IO,
            self.engine.crystals.set_config,
            tenant_of(context),
            max_crystals=request.max_crystals if request.HasField("max_crystals") else None,
            min_success_score=(
                request.min_success_score if request.HasField("min_success_score") else None
            ),
        )
        return crystal_pb2.SetCrystalLibraryConfigResponse(
            config=_config_to_pb(config), evicted_count=evicted
        )
