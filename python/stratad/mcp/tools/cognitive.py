"""The ``cognitive_*`` tools: a task's durable cognitive state (goal and constraints,
progress, decisions, errors, learned constraints, entity relationships, patterns)
and the persistent context built from it (CognitiveStateService)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import field_mask_pb2

from stratad.api.v1 import cognitive_pb2
from stratad.errors import InvalidArgumentError
from stratad.mcp.tools.arguments import (
    BuildContextArgs,
    EntityRelationshipArgs,
    InitializeArgs,
    LearnedConstraintArgs,
    PatternArgs,
    RecordDecisionArgs,
    RecordErrorArgs,
    ResolveErrorArgs,
    UpdateProgressArgs,
)
from stratad.mcp.tools.base import READS, Call, Output, Toolbox
from stratad.mcp.tools.convert import crystallized_dict, error_entry, fluid_dict, when

toolbox = Toolbox()
tool = toolbox.tool


@tool("cognitive_initialize", "Start a task's durable state", InitializeArgs)
async def cognitive_initialize(call: Call, args: InitializeArgs) -> Output:
    """Start the durable cognitive state of a task: its goal, hard constraints and success
    criteria, kept outside your context window so they survive restarts and context
    compaction. Call it once, at the start of a task, before the other cognitive_* tools
    (until then they fail with NOT_FOUND SESSION_NOT_FOUND, or FAILED_PRECONDITION
    NOT_INITIALIZED for a session that holds only checkpoints or tasks). The goal, constraints
    and success criteria cannot be changed afterwards: a second call fails with
    ALREADY_EXISTS, which means the task is already set up and you can continue. Creates
    the session if it does not exist."""
    await call.ensure_session(args.session_id)
    request = cognitive_pb2.InitializeRequest(
        session_id=args.session_id,
        goal=args.goal,
        constraints=args.constraints,
        success_criteria=args.success_criteria,
        user_identity=args.user_identity,
        project_context=args.project_context,
    )
    response = await call.ask(call.link.cognitive.Initialize, request)
    data = {"session_id": args.session_id, **crystallized_dict(response.crystallized)}
    return Output({**data, "version": response.version})


@tool("cognitive_update_progress", "Update progress and current sub-goal", UpdateProgressArgs)
async def cognitive_update_progress(call: Call, args: UpdateProgressArgs) -> Output:
    """Update the task's working state: overall progress (0.0-1.0), the sub-goal you are on
    now, the list of sub-goals, the entities that matter right now, open questions, the
    step count. Only the fields you give change; a list or map you give replaces the stored
    one ([] or {} empties it). Call it whenever your focus moves on, so that the persistent
    context (cognitive_build_context) says where you are."""
    request = cognitive_pb2.UpdateFluidRequest(session_id=args.session_id)
    given = args.model_fields_set
    paths: list[str] = []
    if "progress" in given and args.progress is not None:
        request.progress = args.progress
        paths.append("progress")
    if "current_sub_goal" in given and args.current_sub_goal is not None:
        request.current_sub_goal = args.current_sub_goal
        paths.append("current_sub_goal")
    if "sub_goals" in given and args.sub_goals is not None:
        request.sub_goals.extend(
            cognitive_pb2.SubGoal(goal=g.goal, status=g.status) for g in args.sub_goals
        )
        paths.append("sub_goals")
    if "entities" in given and args.entities is not None:
        request.entities.update(args.entities)
        paths.append("entities")
    if "open_questions" in given and args.open_questions is not None:
        request.questions.extend(args.open_questions)
        paths.append("questions")
    if "step_count" in given and args.step_count is not None:
        request.step_count = args.step_count
        paths.append("step_count")
    if not paths:
        raise InvalidArgumentError(
            "nothing to update: give at least one of progress, current_sub_goal, sub_goals, "
            "entities, open_questions, step_count",
            reason="NOTHING_TO_UPDATE",
        )
    request.update_mask.CopyFrom(field_mask_pb2.FieldMask(paths=paths))
    response = await call.ask(call.link.cognitive.UpdateFluid, request)
    return Output({**fluid_dict(response.fluid), "version": response.version})


@tool("cognitive_record_decision", "Record a decision", RecordDecisionArgs)
async def cognitive_record_decision(call: Call, args: RecordDecisionArgs) -> Output:
    """Record a key decision and its rationale in the task's append-only decision log, so
    that after a restart or a context compaction you still know what was decided and why.
    Record decisions that shape later work (a library chosen, an approach abandoned), not
    every small step."""
    request = cognitive_pb2.RecordDecisionRequest(
        session_id=args.session_id, step=args.step, decision=args.decision, rationale=args.rationale
    )
    response = await call.ask(call.link.cognitive.RecordDecision, request)
    d = response.decision
    data = {"step": d.step, "decision": d.decision, "rationale": d.rationale}
    return Output({**data, "timestamp": when(d.timestamp), "version": response.version})


@tool("cognitive_record_error", "Record an error", RecordErrorArgs)
async def cognitive_record_error(call: Call, args: RecordErrorArgs) -> Output:
    """Record an error met at a step in the task's error journal. Without a resolution it is
    recorded as open and listed under 'Unresolved Errors' in the persistent context until
    you resolve it with cognitive_resolve_error; with a resolution it is recorded as
    resolved at once."""
    request = cognitive_pb2.RecordErrorRequest(
        session_id=args.session_id,
        step=args.step,
        error=args.error,
        resolution=args.resolution,
        pattern=args.pattern,
    )
    response = await call.ask(call.link.cognitive.RecordError, request)
    return Output({**error_entry(response.error), "version": response.version})


@tool("cognitive_resolve_error", "Resolve an open error", ResolveErrorArgs)
async def cognitive_resolve_error(call: Call, args: ResolveErrorArgs) -> Output:
    """Mark the most recent open error recorded at a step as resolved, with how it was
    fixed. Answers resolved: false (not an error) when that step has no open error."""
    request = cognitive_pb2.ResolveErrorRequest(
        session_id=args.session_id, step=args.step, resolution=args.resolution
    )
    response = await call.ask(call.link.cognitive.ResolveError, request)
    data = {"resolved": response.resolved, "step": args.step, "version": response.version}
    if not response.resolved:
        data["note"] = f"no open error was recorded at step {args.step}"
    return Output(data)


@tool("cognitive_add_learned_constraint", "Add a learned constraint", LearnedConstraintArgs)
async def cognitive_add_learned_constraint(call: Call, args: LearnedConstraintArgs) -> Output:
    """Add a constraint discovered while working (a rule the environment imposes that was not
    in the original constraints). Duplicates are ignored (added: false)."""
    request = cognitive_pb2.AddLearnedConstraintRequest(
        session_id=args.session_id, constraint=args.constraint
    )
    return await _added(call, call.link.cognitive.AddLearnedConstraint, request)


@tool("cognitive_add_entity_relationship", "Add an entity relationship", EntityRelationshipArgs)
async def cognitive_add_entity_relationship(call: Call, args: EntityRelationshipArgs) -> Output:
    """Record how two entities of the task relate, as entity_a -relation-> entity_b (e.g.
    User stored_in PostgreSQL). The same triple twice is ignored (added: false)."""
    request = cognitive_pb2.AddEntityRelationshipRequest(
        session_id=args.session_id,
        entity_a=args.entity_a,
        relation=args.relation,
        entity_b=args.entity_b,
    )
    return await _added(call, call.link.cognitive.AddEntityRelationship, request)


@tool("cognitive_add_pattern", "Add a pattern observation", PatternArgs)
async def cognitive_add_pattern(call: Call, args: PatternArgs) -> Output:
    """Record a pattern you observed (something that keeps happening and is worth knowing
    next time). Duplicates are ignored (added: false)."""
    request = cognitive_pb2.AddPatternObservationRequest(
        session_id=args.session_id, pattern=args.pattern
    )
    return await _added(call, call.link.cognitive.AddPatternObservation, request)


async def _added(call: Call, method: Callable[..., Awaitable[Any]], request: Any) -> Output:
    """An ``Add*`` call's answer: added (false for a duplicate, which is ignored), version."""
    response = await call.ask(method, request)
    return Output({"added": response.added, "version": response.version})


@tool("cognitive_build_context", "Build the persistent context", BuildContextArgs, READS)
async def cognitive_build_context(call: Call, args: BuildContextArgs) -> Output:
    """Build the task's persistent context: markdown with the goal, constraints, success
    criteria, progress, current focus, key decisions, unresolved errors, learned
    constraints, entity relationships and patterns, cut to a token budget (least important
    and oldest items first; the goal is always kept). Call it after a restart or a context
    compaction, or whenever you need to re-read where the task stands, and put the text in
    your working context."""
    request = cognitive_pb2.BuildContextRequest(
        session_id=args.session_id, max_tokens=args.max_tokens
    )
    response = await call.ask(call.link.cognitive.BuildContext, request)
    data = {
        "context": response.context,
        "truncated": response.truncated,
        "estimated_tokens": response.estimated_tokens,
        "omitted_items": response.omitted_items,
        "version": response.version,
    }
    return Output(data, text=response.context)


__all__ = ["toolbox"]
