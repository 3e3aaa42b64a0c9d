"""The MCP tools: names, descriptions and argument schemas written for a model, and
what each one asks the daemon.

Arguments are pydantic models (strict: a string is not an integer, unknown
arguments are refused); their JSON schemas, with ``$ref``s inlined and
pydantic's titles dropped, are what ``tools/list`` publishes. IDs are checked
with the daemon's own rule (`stratad.domain.ids.validate_id`, reason
``INVALID_ID``) before anything is sent. A failure of any kind becomes a tool
result with ``isError`` whose text starts with the gRPC code and the stratad
reason (``NOT_FOUND SESSION_NOT_FOUND: ...``) and whose structured content
carries them as ``error.code``, ``error.reason``, ``error.message``,
``error.metadata``: the model reads why and can fix its call; the server goes
on serving.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from google.protobuf import field_mask_pb2, struct_pb2, timestamp_pb2
from mcp_types import CallToolResult, TextContent, Tool, ToolAnnotations
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from stratad.api.v1 import checkpoint_pb2, cognitive_pb2, crystal_pb2, task_pb2
from stratad.domain.ids import validate_id
from stratad.errors import (
    InternalError,
    InvalidArgumentError,
    ResourceExhaustedError,
    StratadError,
)
from stratad.mcp.daemon import DaemonLink, Identity, log
from stratad.sdk.client import check_depth, struct
from stratad.server.servicers.values import set_value, struct_to_py, to_py

#: What `[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}` IDs look like, for the schemas.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
#: The daemon's limit on one text field (docs/state.md, "Limits").
MAX_TEXT = 65_536
#: The daemon's limit on the items of one list field in one request.
MAX_ITEMS = 1_000
#: The largest integer argument (steps, counts): the largest a JSON double holds exactly.
MAX_INT = 2**53 - 1
#: The default cap on a checkpoint state passed through MCP (bytes, decoded).
DEFAULT_MAX_STATE_BYTES = 1 << 20
#: Deepest JSON the daemon stores (objects and lists, docs/state.md).
MAX_JSON_DEPTH = 32


@dataclass(frozen=True, slots=True)
class Limits:
    """What the MCP layer itself refuses (the daemon has its own limits behind)."""

    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES


@dataclass(frozen=True, slots=True)
class Call:
    """What a tool handler works with: the daemon, the caller, the limits."""

    link: DaemonLink
    who: Identity
    limits: Limits


@dataclass(slots=True)
class Output:
    """A tool's answer: structured data, and the text the model reads (JSON of
    the data unless a tool gives prose, e.g. the persistent context)."""

    data: dict[str, Any]
    text: str | None = None


# --- argument types -----------------------------------------------------------------------------


def _id(what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        return validate_id(value, what)

    return check


def _optional_id(what: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        return validate_id(value, what) if value else value

    return check


_ID_SCHEMA = {"pattern": ID_PATTERN, "minLength": 1, "maxLength": 128}

SessionId = Annotated[
    str,
    AfterValidator(_id("session_id")),
    Field(
        description="The stratad session this task's state lives in: 1-128 ASCII letters, "
        "digits, '_', '.', ':' or '-', starting with a letter or digit. Use one ID for the "
        "whole task (e.g. 'deploy-api-2024-06-01') and reuse it after a restart or a "
        "context compaction to find the state again.",
        json_schema_extra=_ID_SCHEMA,
    ),
]
Step = Annotated[
    int,
    Field(
        ge=0, le=MAX_INT, description="The step number of the task this belongs to (0, 1, 2, ...)."
    ),
]


def _text(description: str, *, min_length: int = 0, default: Any = "") -> Any:
    """A text argument (required when ``min_length`` is set)."""
    if min_length:
        return Field(min_length=min_length, max_length=MAX_TEXT, description=description)
    return Field(default=default, max_length=MAX_TEXT, description=description)


Text = Annotated[str, Field(max_length=MAX_TEXT)]
TextList = Annotated[list[Text], Field(max_length=MAX_ITEMS)]
TextMap = Annotated[dict[Annotated[str, Field(max_length=256)], Text], Field(max_length=MAX_ITEMS)]


class Args(BaseModel):
    """Tool arguments: strict JSON types, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True)


class InitializeArgs(Args):
    session_id: SessionId
    goal: str = _text("What the task must achieve, in one or two sentences.", min_length=1)
    constraints: TextList = Field(
        default_factory=list, description="Hard constraints the work must respect."
    )
    success_criteria: TextList = Field(
        default_factory=list, description="How to tell that the task succeeded."
    )
    user_identity: TextMap = Field(
        default_factory=dict,
        description='Who the work is for, as attribute -> value (e.g. {"name": "Ada"}).',
    )
    project_context: str = _text("Background on the project, if useful later.")


class SubGoal(Args):
    goal: str = _text("The sub-goal.", min_length=1)
    status: str = Field(
        default="pending",
        max_length=256,
        description="Its status, e.g. 'pending', 'in_progress', 'done'.",
    )


class UpdateProgressArgs(Args):
    session_id: SessionId
    progress: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Overall progress from 0.0 to 1.0.",
    )
    current_sub_goal: str | None = _text("What you are working on right now.", default=None)
    sub_goals: Annotated[list[SubGoal], Field(max_length=MAX_ITEMS)] | None = Field(
        default=None,
        description="The full list of sub-goals with their status (replaces the stored list; "
        "[] empties it).",
    )
    entities: TextMap | None = Field(
        default=None,
        description="Currently relevant entities as name -> short description (replaces the "
        "stored map; {} empties it).",
    )
    open_questions: TextList | None = Field(
        default=None,
        description="Questions still unanswered (replaces the stored list; [] empties it).",
    )
    step_count: int | None = Field(
        default=None, ge=0, le=MAX_INT, description="How many steps the task has taken so far."
    )


class RecordDecisionArgs(Args):
    session_id: SessionId
    step: Step
    decision: str = _text("What was decided.", min_length=1)
    rationale: str = _text("Why (kept with the decision; shown in the persistent context).")


class RecordErrorArgs(Args):
    session_id: SessionId
    step: Step
    error: str = _text("What went wrong: the error message or a short description.", min_length=1)
    resolution: str = _text(
        "How it was fixed, if it already is (the error is then recorded as resolved; leave "
        "empty to record it as open and resolve it later with cognitive_resolve_error)."
    )
    pattern: str = _text("A short label for the kind of error (e.g. 'connection', 'timeout').")


class ResolveErrorArgs(Args):
    session_id: SessionId
    step: Step = Field(ge=0, le=MAX_INT, description="The step the open error was recorded at.")
    resolution: str = _text("How the error was fixed.", min_length=1)


class LearnedConstraintArgs(Args):
    session_id: SessionId
    constraint: str = _text(
        "A rule learned while working (e.g. 'Port 5432 needs the service running').",
        min_length=1,
    )


class EntityRelationshipArgs(Args):
    session_id: SessionId
    entity_a: str = _text("The first entity (e.g. 'User').", min_length=1)
    relation: str = _text("How they relate (e.g. 'stored_in').", min_length=1)
    entity_b: str = _text("The second entity (e.g. 'PostgreSQL').", min_length=1)


class PatternArgs(Args):
    session_id: SessionId
    pattern: str = _text(
        "An observed pattern (e.g. 'Connection errors precede startup').", min_length=1
    )


class BuildContextArgs(Args):
    session_id: SessionId
    max_tokens: int = Field(
        default=2000,
        ge=1,
        le=1_048_576,
        description="Budget for the text, in tokens estimated as characters / 4. The goal is "
        "always kept; the oldest and least important items are left out first.",
    )


class TraceStep(Args):
    decision: str = Field(default="", max_length=8192, description="What was decided at this step.")
    tool: str = Field(default="", max_length=8192, description="The tool used at this step.")
    error: str = Field(default="", max_length=8192, description="An error met at this step.")
    resolution: str = Field(default="", max_length=8192, description="How that error was fixed.")


class CrystallizeArgs(Args):
    goal: str = Field(
        min_length=1,
        max_length=8192,
        description="The goal of the run that succeeded, as it was given (specific values such "
        "as paths, URLs and numbers are generalized into placeholders).",
    )
    execution_trace: list[TraceStep] = Field(
        min_length=1,
        max_length=10_000,
        description="The run's steps in order: each with the decision made, the tool used, and "
        "any error met with its resolution.",
    )
    success_score: float = Field(
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="How well the run went, from 0.0 to 1.0. Runs below the library's minimum "
        "(0.7 by default) are not stored.",
    )
    session_id: Annotated[str, AfterValidator(_optional_id("session_id"))] = Field(
        default="",
        description="The session the run happened in (recorded as the crystal's origin).",
        json_schema_extra={"pattern": f"^$|{ID_PATTERN}", "maxLength": 128},
    )
    min_success_score: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Override the library's minimum score for this call.",
    )


class QueryCrystalsArgs(Args):
    goal_text: str = Field(
        min_length=1, max_length=8192, description="The goal you are about to work on."
    )
    top_k: int = Field(default=3, ge=1, le=100, description="At most this many matches.")


CrystalId = Annotated[
    str,
    AfterValidator(_id("crystal_id")),
    Field(
        description="A crystal ID as crystal_query or crystal_crystallize returned it.",
        json_schema_extra=_ID_SCHEMA,
    ),
]


class ApplyCrystalArgs(Args):
    crystal_id: CrystalId
    context: str = _text("Your current context (accepted for reference, not used).")


class RecordReuseArgs(Args):
    crystal_id: CrystalId
    success: bool = Field(description="Whether reusing the crystal's approach worked.")


OptionalCheckpointId = Annotated[
    str,
    AfterValidator(_optional_id("checkpoint_id")),
    Field(json_schema_extra={"pattern": f"^$|{ID_PATTERN}", "maxLength": 128}),
]


class SaveCheckpointArgs(Args):
    session_id: SessionId
    state: Any = Field(
        default=None,
        description="The state to save, as any JSON value (stored as application/json). Give "
        "this or state_base64.",
    )
    state_base64: str | None = Field(
        default=None,
        description="A binary state, base64-encoded (give content_type too). Give this or state.",
    )
    content_type: str = Field(
        default="",
        max_length=256,
        description="The state's media type (default: application/json for state, "
        "application/octet-stream for state_base64).",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description='Small JSON object stored with the checkpoint (e.g. {"step": 3}).',
    )
    name: str = Field(
        default="",
        max_length=256,
        description="Also pin the saved state under this name: named checkpoints are kept until "
        "deleted (unnamed ones may be pruned by the session's retention).",
    )
    checkpoint_id: OptionalCheckpointId = Field(
        default="",
        description="Your own ID for the checkpoint (unique in the tenant); generated if empty.",
    )


class LoadCheckpointArgs(Args):
    session_id: SessionId
    checkpoint_id: OptionalCheckpointId = Field(
        default="", description="The checkpoint to load; empty for the latest saved state."
    )


class ListCheckpointsArgs(Args):
    session_id: SessionId
    limit: int = Field(default=20, ge=1, le=1000, description="At most this many, newest first.")


TaskStatus = Literal["pending", "in_progress", "completed", "failed"]


class TaskUpdateArgs(Args):
    session_id: SessionId
    task_id: Annotated[
        str,
        AfterValidator(_id("task_id")),
        Field(description="The task's ID (created on first use).", json_schema_extra=_ID_SCHEMA),
    ]
    status: TaskStatus | None = Field(default=None, description="The task's new status.")
    result: Any = Field(
        default=None,
        description="The task's result, any JSON value (at most 1 MiB). Give status, result or "
        "both.",
    )


# --- conversions ------------------------------------------------------------------------------


def _when(ts: timestamp_pb2.Timestamp) -> str | None:
    if not ts.seconds and not ts.nanos:
        return None
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, UTC).isoformat()


def _crystallized(c: cognitive_pb2.CrystallizedState) -> dict[str, Any]:
    return {
        "goal": c.goal,
        "constraints": list(c.constraints),
        "success_criteria": list(c.success_criteria),
        "user_identity": dict(c.user_identity),
        "project_context": c.project_context,
        "created_at": _when(c.created_at),
    }


def _fluid(f: cognitive_pb2.FluidState) -> dict[str, Any]:
    return {
        "progress": f.progress,
        "current_sub_goal": f.current_sub_goal,
        "sub_goals": [{"goal": g.goal, "status": g.status} for g in f.sub_goals],
        "active_entities": dict(f.active_entities),
        "open_questions": list(f.open_questions),
        "step_count": f.step_count,
        "last_updated": _when(f.last_updated),
    }


_ERROR_STATUS = {
    cognitive_pb2.ERROR_STATUS_OPEN: "open",
    cognitive_pb2.ERROR_STATUS_RESOLVED: "resolved",
}


def error_entry(e: cognitive_pb2.ErrorEntry) -> dict[str, Any]:
    return {
        "step": e.step,
        "error": e.error,
        "resolution": e.resolution,
        "pattern": e.pattern,
        "status": _ERROR_STATUS.get(e.status, "unknown"),
    }


def cognitive_state(state: cognitive_pb2.CognitiveState, version: int) -> dict[str, Any]:
    insights = state.insights
    return {
        "crystallized": _crystallized(state.crystallized),
        "fluid": _fluid(state.fluid),
        "insights": {
            "decision_log": [
                {
                    "step": d.step,
                    "decision": d.decision,
                    "rationale": d.rationale,
                    "timestamp": _when(d.timestamp),
                }
                for d in insights.decision_log
            ],
            "error_journal": [error_entry(e) for e in insights.error_journal],
            "learned_constraints": list(insights.learned_constraints),
            "entity_relationships": [
                {"from": r.entity_a, "relation": r.relation, "to": r.entity_b}
                for r in insights.entity_relationships
            ],
            "pattern_observations": list(insights.pattern_observations),
        },
        "version": version,
    }


def crystal_dict(c: crystal_pb2.Crystal) -> dict[str, Any]:
    return {
        "crystal_id": c.crystal_id,
        "goal_template": c.goal_template,
        "decision_chain": list(c.decision_chain),
        "tool_sequence": list(c.tool_sequence),
        "error_patterns": [
            {"error": p.error, "resolution": p.resolution} for p in c.error_patterns
        ],
        "success_score": c.success_score,
        "effectiveness": c.effectiveness,
        "reuse_count": c.reuse_count,
        "entity_types": list(c.entity_types),
        "created_from": c.created_from,
        "created_at": _when(c.created_at),
    }


def checkpoint_dict(cp: checkpoint_pb2.Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": cp.checkpoint_id,
        "name": cp.name,
        "version": cp.version,
        "created_at": _when(cp.created_at),
        "content_type": cp.content_type,
        "size": cp.size,
        "namespace": cp.namespace,
        "parent_checkpoint_id": cp.parent_checkpoint_id,
        "metadata": struct_to_py(cp.metadata, "metadata"),
    }


def is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def decode_state(data: bytes, content_type: str) -> tuple[str, Any]:
    """How a state is shown: ("state", JSON value) for a JSON state, ("state_text", str)
    for text/*, else ("state_base64", str). An empty content type whose bytes parse
    as JSON counts as JSON."""
    media = content_type.split(";", 1)[0].strip().lower()
    if is_json_type(content_type) or not media:
        try:
            return "state", json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            pass
    if media.startswith("text/"):
        try:
            return "state_text", data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return "state_base64", base64.b64encode(data).decode("ascii")


def check_state_size(size: int, limits: Limits, what: str = "the state") -> None:
    if size > limits.max_state_bytes:
        raise ResourceExhaustedError(
            f"{what} is {size} bytes, over this MCP server's limit of {limits.max_state_bytes} "
            "bytes (--max-state-bytes); save and load larger states with the SDK or "
            "`stratad ctl state get`",
            reason="STATE_TOO_LARGE",
            metadata={"size": str(size), "limit": str(limits.max_state_bytes)},
        )


def json_value(value: Any, what: str) -> struct_pb2.Value:
    """A JSON value as a protobuf Value, refused (INVALID_VALUE) when the daemon would refuse it."""
    check_depth(value, what)
    _check_finite(value, what)
    return set_value(struct_pb2.Value(), value)


def _check_finite(value: Any, what: str) -> None:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise InvalidArgumentError(
                f"{what} holds {node}, which is not a JSON number",
                reason="INVALID_VALUE",
                metadata={"field": what},
            )
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


# --- the tools ----------------------------------------------------------------------------------

A = TypeVar("A", bound=Args)
Handler = Callable[[Call, Any], Awaitable[Output]]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    args: type[Args]
    handler: Handler
    annotations: ToolAnnotations = field(default_factory=ToolAnnotations)

    def tool(self) -> Tool:
        return Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=input_schema(self.args),
            annotations=self.annotations,
        )


TOOLS: dict[str, ToolSpec] = {}

_WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
_IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
_READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def tool(
    name: str, title: str, args: type[A], annotations: ToolAnnotations = _WRITES
) -> Callable[[Callable[[Call, A], Awaitable[Output]]], Callable[[Call, A], Awaitable[Output]]]:
    """Register a tool; its description is the handler's docstring."""

    def register(
        fn: Callable[[Call, A], Awaitable[Output]],
    ) -> Callable[[Call, A], Awaitable[Output]]:
        description = " ".join((fn.__doc__ or "").split())
        TOOLS[name] = ToolSpec(name, title, description, args, fn, annotations)
        return fn

    return register


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
    await call.link.ensure_session(args.session_id, call.who)
    request = cognitive_pb2.InitializeRequest(
        session_id=args.session_id,
        goal=args.goal,
        constraints=args.constraints,
        success_criteria=args.success_criteria,
        user_identity=args.user_identity,
        project_context=args.project_context,
    )
    response = await call.link.call(call.link.cognitive.Initialize, request, call.who)
    data = {"session_id": args.session_id, **_crystallized(response.crystallized)}
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
    response = await call.link.call(call.link.cognitive.UpdateFluid, request, call.who)
    return Output({**_fluid(response.fluid), "version": response.version})


@tool("cognitive_record_decision", "Record a decision", RecordDecisionArgs)
async def cognitive_record_decision(call: Call, args: RecordDecisionArgs) -> Output:
    """Record a key decision and its rationale in the task's append-only decision log, so
    that after a restart or a context compaction you still know what was decided and why.
    Record decisions that shape later work (a library chosen, an approach abandoned), not
    every small step."""
    request = cognitive_pb2.RecordDecisionRequest(
        session_id=args.session_id, step=args.step, decision=args.decision, rationale=args.rationale
    )
    response = await call.link.call(call.link.cognitive.RecordDecision, request, call.who)
    d = response.decision
    data = {"step": d.step, "decision": d.decision, "rationale": d.rationale}
    return Output({**data, "timestamp": _when(d.timestamp), "version": response.version})


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
    response = await call.link.call(call.link.cognitive.RecordError, request, call.who)
    return Output({**error_entry(response.error), "version": response.version})


@tool("cognitive_resolve_error", "Resolve an open error", ResolveErrorArgs)
async def cognitive_resolve_error(call: Call, args: ResolveErrorArgs) -> Output:
    """Mark the most recent open error recorded at a step as resolved, with how it was
    fixed. Answers resolved: false (not an error) when that step has no open error."""
    request = cognitive_pb2.ResolveErrorRequest(
        session_id=args.session_id, step=args.step, resolution=args.resolution
    )
    response = await call.link.call(call.link.cognitive.ResolveError, request, call.who)
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
    response = await call.link.call(call.link.cognitive.AddLearnedConstraint, request, call.who)
    return Output({"added": response.added, "version": response.version})


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
    response = await call.link.call(call.link.cognitive.AddEntityRelationship, request, call.who)
    return Output({"added": response.added, "version": response.version})


@tool("cognitive_add_pattern", "Add a pattern observation", PatternArgs)
async def cognitive_add_pattern(call: Call, args: PatternArgs) -> Output:
    """Record a pattern you observed (something that keeps happening and is worth knowing
    next time). Duplicates are ignored (added: false)."""
    request = cognitive_pb2.AddPatternObservationRequest(
        session_id=args.session_id, pattern=args.pattern
    )
    response = await call.link.call(call.link.cognitive.AddPatternObservation, request, call.who)
    return Output({"added": response.added, "version": response.version})


@tool("cognitive_build_context", "Build the persistent context", BuildContextArgs, _READS)
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
    response = await call.link.call(call.link.cognitive.BuildContext, request, call.who)
    data = {
        "context": response.context,
        "truncated": response.truncated,
        "estimated_tokens": response.estimated_tokens,
        "omitted_items": response.omitted_items,
        "version": response.version,
    }
    return Output(data, text=response.context)


_OUTCOMES = {
    crystal_pb2.CRYSTALLIZE_OUTCOME_CREATED: "created",
    crystal_pb2.CRYSTALLIZE_OUTCOME_BELOW_THRESHOLD: "below_threshold",
    crystal_pb2.CRYSTALLIZE_OUTCOME_NOT_NOVEL: "not_novel",
}


@tool("crystal_crystallize", "Crystallize a successful run", CrystallizeArgs, _WRITES)
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
    response = await call.link.call(call.link.crystals.Crystallize, request, call.who)
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


@tool("crystal_query", "Find crystals for a goal", QueryCrystalsArgs, _READS)
async def crystal_query(call: Call, args: QueryCrystalsArgs) -> Output:
    """Before starting a task, look for crystals (approaches that worked on similar goals
    before), best first: each with its goal pattern, decisions, tools, known pitfalls, how
    similar it is and how effective it has been. Put the best one in your context with
    crystal_apply, and report afterwards with crystal_record_reuse."""
    request = crystal_pb2.QueryCrystalsRequest(goal_text=args.goal_text, top_k=args.top_k)
    response = await call.link.call(call.link.crystals.QueryCrystals, request, call.who)
    matches = [
        {**crystal_dict(m.crystal), "similarity": m.similarity, "score": m.score}
        for m in response.matches
    ]
    return Output({"goal_template": response.goal_template, "matches": matches})


@tool("crystal_apply", "Get a crystal as a prompt", ApplyCrystalArgs, _READS)
async def crystal_apply(call: Call, args: ApplyCrystalArgs) -> Output:
    """Get a crystal as a 'Similar Past Success' prompt section (goal pattern, approach, tools
    used, known pitfalls) to follow as a worked example. After trying it, call
    crystal_record_reuse with whether it helped."""
    request = crystal_pb2.ApplyCrystalRequest(crystal_id=args.crystal_id, context=args.context)
    response = await call.link.call(call.link.crystals.ApplyCrystal, request, call.who)
    return Output({"crystal_id": args.crystal_id, "prompt": response.prompt}, text=response.prompt)


@tool("crystal_record_reuse", "Report a crystal's reuse", RecordReuseArgs, _WRITES)
async def crystal_record_reuse(call: Call, args: RecordReuseArgs) -> Output:
    """Report whether reusing a crystal worked. Its effectiveness becomes the running average
    of its original score and every reported reuse, so crystals that keep helping rank
    higher and those that do not are evicted first."""
    request = crystal_pb2.RecordReuseRequest(crystal_id=args.crystal_id, success=args.success)
    response = await call.link.call(call.link.crystals.RecordReuse, request, call.who)
    c = response.crystal
    data = {"crystal_id": c.crystal_id, "reuse_count": c.reuse_count}
    return Output({**data, "effectiveness": c.effectiveness})


@tool("checkpoint_save", "Save a checkpoint", SaveCheckpointArgs, _WRITES)
async def checkpoint_save(call: Call, args: SaveCheckpointArgs) -> Output:
    """Save a snapshot of your working state (any JSON value, or base64 bytes) as a new
    checkpoint of the session, to resume from later with checkpoint_load. The checkpoint
    also captures the session's cognitive and task state. Give a name to keep it until it
    is deleted. Creates the session if it does not exist."""
    given = args.model_fields_set
    has_state = "state" in given
    has_blob = "state_base64" in given and args.state_base64 is not None
    if has_state == has_blob:
        raise InvalidArgumentError(
            "give exactly one of state (a JSON value) and state_base64 (base64 bytes)",
            reason="STATE_REQUIRED",
        )
    if has_blob:
        assert args.state_base64 is not None
        check_state_size(len(args.state_base64) * 3 // 4, call.limits)
        try:
            data = base64.b64decode(args.state_base64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgumentError(
                "state_base64 is not valid base64", reason="INVALID_BASE64"
            ) from None
        content_type = args.content_type or "application/octet-stream"
    else:
        check_depth(args.state, "state")
        try:
            text = json.dumps(
                args.state, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            )
        except ValueError:
            raise InvalidArgumentError(
                "state holds a number that is not JSON (NaN or infinity)", reason="INVALID_VALUE"
            ) from None
        data = text.encode("utf-8")
        content_type = args.content_type or "application/json"
    check_state_size(len(data), call.limits)
    await call.link.ensure_session(args.session_id, call.who)
    request = checkpoint_pb2.SaveStateRequest(
        session_id=args.session_id,
        data=data,
        content_type=content_type,
        metadata=struct(args.metadata),
        checkpoint_id=args.checkpoint_id,
    )
    response = await call.link.call(call.link.checkpoints.SaveState, request, call.who)
    out: dict[str, Any] = {
        "checkpoint_id": response.checkpoint_id,
        "version": response.version,
        "digest": response.digest,
        "size": response.size,
        "stored_bytes": response.stored_bytes,
        "content_type": content_type,
    }
    if args.name:
        pin = checkpoint_pb2.CreateCheckpointRequest(
            session_id=args.session_id, name=args.name, metadata=struct(args.metadata)
        )
        named = await call.link.call(call.link.checkpoints.CreateCheckpoint, pin, call.who)
        out["named_checkpoint_id"] = named.checkpoint.checkpoint_id
        out["name"] = named.checkpoint.name
        out["version"] = named.checkpoint.version
    return Output(out)


@tool("checkpoint_load", "Load a checkpoint", LoadCheckpointArgs, _READS)
async def checkpoint_load(call: Call, args: LoadCheckpointArgs) -> Output:
    """Load a saved state: the latest one of the session, or the checkpoint you name. A JSON
    state comes back as JSON (state), a text state as text (state_text), anything else as
    base64 (state_base64), with its content_type. States over the server's size limit are
    refused with RESOURCE_EXHAUSTED STATE_TOO_LARGE."""
    request = checkpoint_pb2.LoadStateRequest(
        session_id=args.session_id, checkpoint_id=args.checkpoint_id
    )
    response = await call.link.call(call.link.checkpoints.LoadState, request, call.who)
    check_state_size(len(response.data), call.limits)
    key, value = decode_state(response.data, response.content_type)
    out = {
        "checkpoint_id": response.checkpoint_id,
        "version": response.version,
        "content_type": response.content_type,
        "digest": response.digest,
        "size": len(response.data),
        "metadata": struct_to_py(response.metadata, "metadata"),
        key: value,
    }
    return Output(out)


@tool("checkpoint_list", "List checkpoints", ListCheckpointsArgs, _READS)
async def checkpoint_list(call: Call, args: ListCheckpointsArgs) -> Output:
    """List the session's checkpoints, newest first: ID, name (named ones are pinned),
    creation time, size, content type and metadata. Load one with checkpoint_load."""
    listed = await list_checkpoints(call.link, call.who, args.session_id, args.limit)
    checkpoints, more = listed
    return Output({"checkpoints": checkpoints, "more": more})


async def list_checkpoints(
    link: DaemonLink, who: Identity, session_id: str, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """Up to ``limit`` checkpoints, newest first, and whether there are more."""
    found: list[dict[str, Any]] = []
    token = ""
    while True:
        request = checkpoint_pb2.ListCheckpointsRequest(
            session_id=session_id, page_size=min(limit - len(found) + 1, 1000), page_token=token
        )
        page = await link.call(link.checkpoints.ListCheckpoints, request, who)
        for cp in page.checkpoints:
            if len(found) == limit:
                return found, True
            found.append(checkpoint_dict(cp))
        token = page.next_page_token
        if not token:
            return found, False
        if len(found) == limit:
            return found, True


_TASK_STATUS = {
    "pending": task_pb2.TASK_STATUS_PENDING,
    "in_progress": task_pb2.TASK_STATUS_IN_PROGRESS,
    "completed": task_pb2.TASK_STATUS_COMPLETED,
    "failed": task_pb2.TASK_STATUS_FAILED,
}
_TASK_STATUS_NAMES = {v: k for k, v in _TASK_STATUS.items()}


@tool("task_update", "Update a task's status and result", TaskUpdateArgs, _WRITES)
async def task_update(call: Call, args: TaskUpdateArgs) -> Output:
    """Set a task's status (pending, in_progress, completed, failed) and/or store its result
    (any JSON value) in the session, e.g. for the sub-tasks of a plan. The task is created
    on first use, and so is the session."""
    given = args.model_fields_set
    if args.status is None and "result" not in given:
        raise InvalidArgumentError("give status, result or both", reason="NOTHING_TO_UPDATE")
    value = json_value(args.result, "result") if "result" in given else None
    await call.link.ensure_session(args.session_id, call.who)
    version = 0
    status = ""
    if args.status is not None:
        request = task_pb2.UpdateTaskStatusRequest(
            session_id=args.session_id, task_id=args.task_id, status=_TASK_STATUS[args.status]
        )
        response = await call.link.call(call.link.tasks.UpdateTaskStatus, request, call.who)
        version = response.version
        status = _TASK_STATUS_NAMES.get(response.task.status, "")
    if value is not None:
        store = task_pb2.StoreTaskResultRequest(
            session_id=args.session_id, task_id=args.task_id, result=value
        )
        version = (await call.link.call(call.link.tasks.StoreTaskResult, store, call.who)).version
    get = task_pb2.GetTaskResultRequest(session_id=args.session_id, task_id=args.task_id)
    current = await call.link.call(call.link.tasks.GetTaskResult, get, call.who)
    out: dict[str, Any] = {
        "task_id": args.task_id,
        "status": _TASK_STATUS_NAMES.get(current.status, status or None),
        "has_result": current.has_result,
        "version": max(version, current.version),
    }
    if current.has_result:
        out["result"] = to_py(current.result, "result")
    return Output(out)


# --- schemas and the call path ------------------------------------------------------------------


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as a model reads it best: ``$ref``s inlined, no titles."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                inlined = dict(defs[ref.removeprefix("#/$defs/")])
                extra = {k: v for k, v in node.items() if k != "$ref"}
                return clean({**inlined, **extra})
            out: dict[str, Any] = {}
            for key, value in node.items():
                if key == "title" and isinstance(value, str):
                    continue
                if key == "properties" and isinstance(value, dict):
                    out[key] = {name: _not_null(clean(prop)) for name, prop in value.items()}
                else:
                    out[key] = clean(value)
            return out
        if isinstance(node, list):
            return [clean(item) for item in node]
        return node

    cleaned: dict[str, Any] = clean(schema)
    return cleaned


def _not_null(prop: Any) -> Any:
    """An optional argument whose null means "not given", published as its plain type:
    ``{"anyOf": [{"type": "string"}, {"type": "null"}], "default": null}`` becomes
    ``{"type": "string"}``."""
    if not isinstance(prop, dict) or prop.get("default", 0) is not None:
        return prop
    options = prop.get("anyOf")
    if options is None and "type" not in prop:  # any JSON value: null is a value, not "unset"
        return {k: v for k, v in prop.items() if k != "default"}
    if not isinstance(options, list) or {"type": "null"} not in options or len(options) != 2:
        return prop
    (kept,) = [o for o in options if o != {"type": "null"}]
    rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
    return {**kept, **rest}


def error_result(exc: StratadError) -> CallToolResult:
    """A stratad error as a tool result the model can read and act on."""
    head = f"{exc.grpc_status} {exc.reason}" if exc.reason != exc.grpc_status else exc.grpc_status
    error = {
        "code": exc.grpc_status,
        "reason": exc.reason,
        "message": exc.message,
        "metadata": exc.metadata,
    }
    return CallToolResult(
        content=[TextContent(type="text", text=f"{head}: {exc.message}")],
        structured_content={"error": error},
        is_error=True,
    )


def arguments_error(name: str, exc: ValidationError) -> InvalidArgumentError:
    """Pydantic's findings as INVALID_ARGUMENT, naming each argument (never echoing values)."""
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in err["loc"]) or "arguments"
        problems.append(f"{where}: {err['msg']}")
        if len(problems) == 10:
            break
    return InvalidArgumentError(
        f"invalid arguments for {name}: " + "; ".join(problems),
        reason="INVALID_ARGUMENTS",
        metadata={"tool": name},
    )


async def call_tool(spec: ToolSpec, arguments: dict[str, Any], call: Call) -> CallToolResult:
    """Validate, run, and shape one tool call; every failure becomes an error result."""
    try:
        try:
            args = spec.args.model_validate(arguments)
        except ValidationError as exc:
            raise arguments_error(spec.name, exc) from None
        output = await spec.handler(call, args)
    except StratadError as exc:
        return error_result(exc)
    except Exception as exc:  # a bug: say so, log it, keep serving
        log.exception("tool %s failed", spec.name)
        return error_result(InternalError(f"{spec.name} failed: {type(exc).__name__}"))
    text = output.text if output.text is not None else json.dumps(output.data, ensure_ascii=False)
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=output.data
    )


__all__ = [
    "DEFAULT_MAX_STATE_BYTES",
    "TOOLS",
    "Call",
    "Limits",
    "Output",
    "ToolSpec",
    "call_tool",
    "checkpoint_dict",
    "cognitive_state",
    "crystal_dict",
    "decode_state",
    "error_entry",
    "error_result",
    "input_schema",
    "list_checkpoints",
]
