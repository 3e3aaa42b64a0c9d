"""The ``crystal_*`` tools: store a successful run's approach as a reusable crystal,
find crystals for a goal, get one as a prompt, report its reuse (CrystalService)."""

from __future__ import annotations

from typing import Any

from stratad.api.v1 import crystal_pb2
from stratad.mcp.tools.arguments import (
    ApplyCrystalArgs,
    CrystallizeArgs,
    QueryCrystalsArgs,
    RecordReuseArgs,
)
from stratad.mcp.tools.base import READS, WRITES, Call, Output, Toolbox
from stratad.mcp.tools.convert import crystal_dict

toolbox = Toolbox()
tool = toolbox.tool


_OUTCOMES = {
    crystal_pb2.CRYSTALLIZE_OUTCOME_CREATED: "created",
    crystal_pb2.CRYSTALLIZE_OUTCOME_BELOW_THRESHOLD: "below_threshold",
    crystal_pb2.CRYSTALLIZE_OUTCOME_NOT_NOVEL: "not_novel",
}


@tool("crystal_crystallize", "Crystallize a successful run", CrystallizeArgs, WRITES)
async def crystal_crystallize(call: Call, args: CrystallizeArgs) -> Output:
    """After a task succeeded, store its approach as a reusable 'crystal': the goal with its
    specifics generalized into placeholders, the decisions made, the tools used and the
    errors met with their fixes. Similar future tasks find it with crystal_query. Outcome
    'below_threshold' (the score is under the minimum) and 'not_novel' (a crystal like it
    exists: similar_crystal_id) store nothing and are not errors."""
    request = crystal_pb2.CrystallizeRequest(
        goal=args.goal,
        execution_trace=[
            crystal_pb2.TraceStep(
                decision=s.decision, tool=s.tool, error=s.error, resolution=s.resolution
            )
            for s in args.execution_trace
        ],
        success_score=args.success_score,
        session_id=args.session_id,
    )
    if args.min_success_score is not None:
        request.min_success_score = args.min_success_score
    response = await call.ask(call.link.crystals.Crystallize, request)
    data: dict[str, Any] = {
        "outcome": _OUTCOMES.get(response.outcome, "unknown"),
        "min_success_score": response.min_success_score,
    }
    if response.HasField("crystal") and response.crystal.crystal_id:
        data["crystal"] = crystal_dict(response.crystal)
    if response.similar_crystal_id:
        data["similar_crystal_id"] = response.similar_crystal_id
        data["tool_similarity"] = response.tool_similarity
        data["goal_similarity"] = response.goal_similarity
    if response.evicted_crystal_ids:
        data["evicted_crystal_ids"] = list(response.evicted_crystal_ids)
    return Output(data)


@tool("crystal_query", "Find crystals for a goal", QueryCrystalsArgs, READS)
async def crystal_query(call: Call, args: QueryCrystalsArgs) -> Output:
    """Before starting a task, look for crystals (approaches that worked on similar goals
    before), best first: each with its goal pattern, decisions, tools, known pitfalls, how
    similar it is and how effective it has been. Put the best one in your context with
    crystal_apply, and report afterwards with crystal_record_reuse."""
    request = crystal_pb2.QueryCrystalsRequest(goal_text=args.goal_text, top_k=args.top_k)
    response = await call.ask(call.link.crystals.QueryCrystals, request)
    matches = [
        {**crystal_dict(m.crystal), "similarity": m.similarity, "score": m.score}
        for m in response.matches
    ]
    return Output({"goal_template": response.goal_template, "matches": matches})


@tool("crystal_apply", "Get a crystal as a prompt", ApplyCrystalArgs, READS)
async def crystal_apply(call: Call, args: ApplyCrystalArgs) -> Output:
    """Get a crystal as a 'Similar Past Success' prompt section (goal pattern, approach, tools
    used, known pitfalls) to follow as a worked example. After trying it, call
    crystal_record_reuse with whether it helped."""
    request = crystal_pb2.ApplyCrystalRequest(crystal_id=args.crystal_id, context=args.context)
    response = await call.ask(call.link.crystals.ApplyCrystal, request)
    return Output({"crystal_id": args.crystal_id, "prompt": response.prompt}, text=response.prompt)


@tool("crystal_record_reuse", "Report a crystal's reuse", RecordReuseArgs, WRITES)
async def crystal_record_reuse(call: Call, args: RecordReuseArgs) -> Output:
    """Report whether reusing a crystal worked. Its effectiveness becomes the running average
    of its original score and every reported reuse, so crystals that keep helping rank
    higher and those that do not are evicted first."""
    request = crystal_pb2.RecordReuseRequest(crystal_id=args.crystal_id, success=args.success)
    response = await call.ask(call.link.crystals.RecordReuse, request)
    c = response.crystal
    data = {"crystal_id": c.crystal_id, "reuse_count": c.reuse_count}
    return Output({**data, "effectiveness": c.effectiveness})


__all__ = ["toolbox"]
