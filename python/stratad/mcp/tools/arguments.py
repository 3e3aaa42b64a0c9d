"""The tools' arguments: pydantic models, strict (a string is not an integer, unknown
arguments are refused), with descriptions written for a model and the daemon's
limits (text length, list items, integers a JSON double holds, IDs checked with
the daemon's own rule, `stratad.ids.validate_id`, reason ``INVALID_ID``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from stratad.ids import validate_id

#: What `[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}` IDs look like, for the schemas.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
#: The daemon's limit on one text field (docs/state.md, "Limits").
MAX_TEXT = 65_536
#: The daemon's limit on the items of one list field in one request.
MAX_ITEMS = 1_000
#: The largest integer argument (steps, counts): the largest a JSON double holds exactly.
MAX_INT = 2**53 - 1
#: Deepest JSON the daemon stores (objects and lists, docs/state.md).
MAX_JSON_DEPTH = 32


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


__all__ = [
    "ID_PATTERN",
    "MAX_INT",
    "MAX_ITEMS",
    "MAX_JSON_DEPTH",
    "MAX_TEXT",
    "ApplyCrystalArgs",
    "Args",
    "BuildContextArgs",
    "CrystallizeArgs",
    "EntityRelationshipArgs",
    "InitializeArgs",
    "LearnedConstraintArgs",
    "ListCheckpointsArgs",
    "LoadCheckpointArgs",
    "PatternArgs",
    "QueryCrystalsArgs",
    "RecordDecisionArgs",
    "RecordErrorArgs",
    "RecordReuseArgs",
    "ResolveErrorArgs",
    "SaveCheckpointArgs",
    "TaskStatus",
    "TaskUpdateArgs",
]
