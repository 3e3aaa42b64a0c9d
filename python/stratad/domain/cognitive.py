"""The three-layer cognitive state of a session (corteX's StateFileManager).

``SessionState.structured["cognitive"]``::

    {"crystallized": {goal, success_criteria, constraints, user_identity,
                      project_context, created_at},          # set once
     "fluid": {current_sub_goal, progress, sub_goals, active_entities,
               open_questions, brain_state_digest, step_count, last_updated},
     "insights": {decision_log, error_journal, learned_constraints,
                  entity_relationships, pattern_observations}}  # append-only

Record kinds: cognitive.init, cognitive.fluid, cognitive.decision,
cognitive.error, cognitive.resolve, cognitive.constraint,
cognitive.relationship, cognitive.pattern. Timestamps and the index of the
error a resolve closes are in the record, so replay recomputes nothing.

The shape is `CognitiveFacet` (TypedDicts: the JSON above, nothing else);
`parse` checks a facet from outside against it (ReplaceStructuredState).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict, TypeVar, cast

from stratad.domain import structured as st
from stratad.domain.models import SessionState, reducer
from stratad.domain.sessions import Commit, LiveSession, SessionManager
from stratad.errors import AlreadyExistsError, FailedPreconditionError, InvalidArgumentError

T = TypeVar("T")

FACET = "cognitive"
OPEN: Final = "open"
RESOLVED: Final = "resolved"
#: BuildContext's default budget (corteX's max_tokens default).
DEFAULT_MAX_TOKENS = 2000
MAX_CONTEXT_TOKENS = 1 << 20
#: Fluid fields UpdateFluid may change: request name -> state name.
FLUID_FIELDS = {
    "progress": "progress",
    "current_sub_goal": "current_sub_goal",
    "sub_goals": "sub_goals",
    "entities": "active_entities",
    "questions": "open_questions",
    "brain_digest": "brain_state_digest",
    "step_count": "step_count",
}


# -- the facet's shape ----------------------------------------------------------------------


class Crystallized(TypedDict):
    """The immutable layer, set by Initialize."""

    goal: str
    success_criteria: list[str]
    constraints: list[str]
    user_identity: dict[str, str]
    project_context: str
    created_at: float


class SubGoal(TypedDict):
    goal: str
    status: str


class Fluid(TypedDict):
    """The mutable layer, changed by UpdateFluid."""

    current_sub_goal: str
    progress: float  # 0.0-1.0
    sub_goals: list[SubGoal]
    active_entities: dict[str, str]
    open_questions: list[str]
    brain_state_digest: st.JsonObject
    step_count: int
    last_updated: float


class FluidChanges(TypedDict, total=False):
    """What one UpdateFluid changes, by state name (its record's ``fields``)."""

    progress: float
    current_sub_goal: str
    sub_goals: list[SubGoal]
    active_entities: dict[str, str]
    open_questions: list[str]
    brain_state_digest: st.JsonObject
    step_count: int


class FluidUpdate(TypedDict, total=False):
    """UpdateFluid's fields, by request name (FLUID_FIELDS)."""

    progress: float
    current_sub_goal: str
    sub_goals: list[SubGoal]
    entities: dict[str, str]
    questions: list[str]
    brain_digest: st.JsonObject
    step_count: int


class Decision(TypedDict):
    step: int
    decision: str
    rationale: str
    timestamp: float


ErrorStatus = Literal["open", "resolved"]


class ErrorEntry(TypedDict):
    step: int
    error: str
    resolution: str
    pattern: str
    status: ErrorStatus


#: An entity relationship (the functional form: "from" is a Python keyword).
Relationship = TypedDict("Relationship", {"from": str, "relation": str, "to": str})


class Insights(TypedDict):
    """The append-only layer."""

    decision_log: list[Decision]
    error_journal: list[ErrorEntry]
    learned_constraints: list[str]
    entity_relationships: list[Relationship]
    pattern_observations: list[str]


class CognitiveFacet(TypedDict):
    """``SessionState.structured["cognitive"]``."""

    crystallized: Crystallized
    fluid: Fluid
    insights: Insights


class CognitiveStats(TypedDict):
    """StateFileManager.get_stats(), key for key."""

    initialized: bool
    tenant_id: str
    session_id: str
    progress: float
    decisions_count: int
    errors_total: int
    errors_open: int
    learned_constraints: int
    entity_relationships: int
    active_entities: int
    pattern_observations: int


def parse(raw: object) -> CognitiveFacet:
    """`raw` as a cognitive facet, or INVALID_ARGUMENT naming the first field that is not.

    Accepts what the facet's own RPCs store (their bounds included), so a
    facet that parses is one every reader serves (see structured.py).
    """
    cog = st.want_object(raw, FACET, tuple(CognitiveFacet.__annotations__))
    path = f"{FACET}.crystallized"
    c = st.want_object(cog["crystallized"], path, tuple(Crystallized.__annotations__))
    st.want_text(c["goal"], f"{path}.goal")
    st.want_texts(c["success_criteria"], f"{path}.success_criteria")
    st.want_texts(c["constraints"], f"{path}.constraints")
    st.want_string_map(c["user_identity"], f"{path}.user_identity")
    st.want_text(c["project_context"], f"{path}.project_context")
    st.want_time(c["created_at"], f"{path}.created_at")

    path = f"{FACET}.fluid"
    f = st.want_object(cog["fluid"], path, tuple(Fluid.__annotations__))
    st.want_text(f["current_sub_goal"], f"{path}.current_sub_goal")
    st.want_number(f["progress"], f"{path}.progress", 0.0, 1.0)
    sub_goals = st.want_list(f["sub_goals"], f"{path}.sub_goals", max_items=st.MAX_ITEMS)
    for i, item in enumerate(sub_goals):
        where = f"{path}.sub_goals[{i}]"
        g = st.want_object(item, where, tuple(SubGoal.__annotations__))
        st.want_text(g["goal"], f"{where}.goal")
        st.want_text(g["status"], f"{where}.status")
    st.want_string_map(f["active_entities"], f"{path}.active_entities")
    st.want_texts(f["open_questions"], f"{path}.open_questions")
    st.want_json_object(f["brain_state_digest"], f"{path}.brain_state_digest")
    st.want_int(f["step_count"], f"{path}.step_count")
    st.want_time(f["last_updated"], f"{path}.last_updated")

    path = f"{FACET}.insights"
    ins = st.want_object(cog["insights"], path, tuple(Insights.__annotations__))
    for i, item in enumerate(st.want_list(ins["decision_log"], f"{path}.decision_log")):
        where = f"{path}.decision_log[{i}]"
        d = st.want_object(item, where, tuple(Decision.__annotations__))
        st.want_int(d["step"], f"{where}.step")
        st.want_text(d["decision"], f"{where}.decision")
        st.want_text(d["rationale"], f"{where}.rationale")
        st.want_time(d["timestamp"], f"{where}.timestamp")
    for i, item in enumerate(st.want_list(ins["error_journal"], f"{path}.error_journal")):
        where = f"{path}.error_journal[{i}]"
        e = st.want_object(item, where, tuple(ErrorEntry.__annotations__))
        st.want_int(e["step"], f"{where}.step")
        for name in ("error", "resolution", "pattern"):
            st.want_text(e[name], f"{where}.{name}")
        st.want_one_of(e["status"], f"{where}.status", (OPEN, RESOLVED))
    st.want_texts(ins["learned_constraints"], f"{path}.learned_constraints", max_items=None)
    relationships = st.want_list(ins["entity_relationships"], f"{path}.entity_relationships")
    for i, item in enumerate(relationships):
        where = f"{path}.entity_relationships[{i}]"
        r = st.want_object(item, where, tuple(Relationship.__annotations__))
        for name in ("from", "relation", "to"):
            st.want_text(r[name], f"{where}.{name}")
    st.want_texts(ins["pattern_observations"], f"{path}.pattern_observations", max_items=None)
    return cast(CognitiveFacet, cog)


def estimate_tokens(text: str) -> int:
    """The token estimate BuildContext budgets with: one token per 4 characters, rounded up."""
    return (len(text) + 3) // 4


def facet_of(state: SessionState) -> CognitiveFacet:
    """The session's cognitive facet; FAILED_PRECONDITION before Initialize.

    Typed without parsing: what the facet holds was written by the reducers
    below or passed `parse` (see structured.py)."""
    cog: CognitiveFacet | None = state.structured.get(FACET)
    if cog is None:
        raise FailedPreconditionError(
            f"session {state.session_id!r} has no cognitive state yet: call Initialize first",
            reason="NOT_INITIALIZED",
        )
    return cog


def _empty_fluid(at: float) -> Fluid:
    return {
        "current_sub_goal": "",
        "progress": 0.0,
        "sub_goals": [],
        "active_entities": {},
        "open_questions": [],
        "brain_state_digest": {},
        "step_count": 0,
        "last_updated": at,
    }


def _empty_insights() -> Insights:
    return {
        "decision_log": [],
        "error_journal": [],
        "learned_constraints": [],
        "entity_relationships": [],
        "pattern_observations": [],
    }


# -- reducers (live and at replay) ---------------------------------------------------------


# Record bodies are the journal's JSON (models.Reducer: dict[str, Any]); each
# reducer reads the values its plan below put there into the typed facet.
#
# The insight reducers append to the lists in place. That is safe for readers,
# who copy the lists (not just reference them) under the session lock; see
# `state_of`.


@reducer("cognitive.init")
def _apply_init(state: SessionState, body: dict[str, Any]) -> None:
    cog: CognitiveFacet = {
        "crystallized": body["crystallized"],
        "fluid": _empty_fluid(body["at"]),
        "insights": _empty_insights(),
    }
    state.structured[FACET] = cog


@reducer("cognitive.fluid")
def _apply_fluid(state: SessionState, body: dict[str, Any]) -> None:
    cog = facet_of(state)
    changes: FluidChanges = body["fields"]
    cog["fluid"] = {**cog["fluid"], **changes, "last_updated": body["at"]}


@reducer("cognitive.decision")
def _apply_decision(state: SessionState, body: dict[str, Any]) -> None:
    facet_of(state)["insights"]["decision_log"].append(body["entry"])


@reducer("cognitive.error")
def _apply_error(state: SessionState, body: dict[str, Any]) -> None:
    facet_of(state)["insights"]["error_journal"].append(body["entry"])


@reducer("cognitive.resolve")
def _apply_resolve(state: SessionState, body: dict[str, Any]) -> None:
    insights = facet_of(state)["insights"]
    journal = list(insights["error_journal"])
    index: int = body["index"]
    journal[index] = {**journal[index], "resolution": body["resolution"], "status": RESOLVED}
    insights["error_journal"] = journal


@reducer("cognitive.constraint")
def _apply_constraint(state: SessionState, body: dict[str, Any]) -> None:
    facet_of(state)["insights"]["learned_constraints"].append(body["constraint"])


@reducer("cognitive.relationship")
def _apply_relationship(state: SessionState, body: dict[str, Any]) -> None:
    facet_of(state)["insights"]["entity_relationships"].append(body["entry"])


@reducer("cognitive.pattern")
def _apply_pattern(state: SessionState, body: dict[str, Any]) -> None:
    facet_of(state)["insights"]["pattern_observations"].append(body["pattern"])


# -- the service ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextResult:
    text: str
    truncated: bool
    estimated_tokens: int
    omitted_items: int


class Cognitive:
    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions

    def _mutate(
        self,
        tenant: str,
        session_id: str,
        expected_version: int,
        kind: str,
        plan: st.Plan[T],
        commit: Commit | None,
    ) -> st.Applied[T]:
        return st.mutate(
            self.sessions, tenant, session_id, expected_version, kind, plan, commit=commit
        )

    def initialize(
        self,
        tenant: str,
        session_id: str,
        *,
        goal: str,
        constraints: list[str] | None = None,
        success_criteria: list[str] | None = None,
        user_identity: dict[str, str] | None = None,
        project_context: str = "",
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[Crystallized]:
        """Set the crystallized layer; ALREADY_EXISTS when it is set already."""
        st.text(goal, "goal", required=True)
        criteria = st.texts(success_criteria or [], "success_criteria")
        constraint_list = st.texts(constraints or [], "constraints")
        identity = st.string_map(user_identity or {}, "user_identity")
        st.text(project_context, "project_context")

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], Crystallized]:
            if FACET in live.state.structured:
                raise AlreadyExistsError(
                    f"session {session_id!r} is initialized already: the crystallized layer "
                    "is immutable"
                )
            value: Crystallized = {
                "goal": goal,
                "success_criteria": criteria,
                "constraints": constraint_list,
                "user_identity": identity,
                "project_context": project_context,
                "created_at": at,
            }
            return {"crystallized": value}, value

        return self._mutate(tenant, session_id, expected_version, "cognitive.init", plan, commit)

    def update_fluid(
        self,
        tenant: str,
        session_id: str,
        fields: FluidUpdate,
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[Fluid]:
        """Change the fluid fields given (request names, see FLUID_FIELDS)."""
        changes = _validate_fluid(fields)

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], Fluid]:
            cog = facet_of(live.state)
            return {"fields": changes}, {**cog["fluid"], **changes, "last_updated": at}

        return self._mutate(tenant, session_id, expected_version, "cognitive.fluid", plan, commit)

    def record_decision(
        self,
        tenant: str,
        session_id: str,
        *,
        step: int,
        decision: str,
        rationale: str = "",
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[Decision]:
        st.step(step)
        st.text(decision, "decision", required=True)
        st.text(rationale, "rationale")

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], Decision]:
            facet_of(live.state)
            entry: Decision = {
                "step": step,
                "decision": decision,
                "rationale": rationale,
                "timestamp": at,
            }
            return {"entry": entry}, entry

        return self._mutate(
            tenant, session_id, expected_version, "cognitive.decision", plan, commit
        )

    def record_error(
        self,
        tenant: str,
        session_id: str,
        *,
        step: int,
        error: str,
        resolution: str = "",
        pattern: str = "",
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[ErrorEntry]:
        st.step(step)
        st.text(error, "error", required=True)
        st.text(resolution, "resolution")
        st.text(pattern, "pattern")
        entry: ErrorEntry = {
            "step": step,
            "error": error,
            "resolution": resolution,
            "pattern": pattern,
            "status": RESOLVED if resolution else OPEN,
        }

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], ErrorEntry]:
            facet_of(live.state)
            return {"entry": entry}, entry

        return self._mutate(tenant, session_id, expected_version, "cognitive.error", plan, commit)

    def resolve_error(
        self,
        tenant: str,
        session_id: str,
        *,
        step: int,
        resolution: str,
        expected_version: int = 0,
    ) -> st.Applied[bool]:
        """Resolve the most recent open error at `step`; False (no change) if none."""
        st.step(step)
        st.text(resolution, "resolution", required=True)

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], bool]:
            journal = facet_of(live.state)["insights"]["error_journal"]
            for index in range(len(journal) - 1, -1, -1):
                entry = journal[index]
                if entry["step"] == step and entry["status"] == OPEN:
                    return {"index": index, "resolution": resolution}, True
            raise st.Unchanged(False)

        return self._mutate(tenant, session_id, expected_version, "cognitive.resolve", plan, None)

    def add_learned_constraint(
        self, tenant: str, session_id: str, constraint: str, *, expected_version: int = 0
    ) -> st.Applied[bool]:
        st.text(constraint, "constraint", required=True)

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], bool]:
            if constraint in facet_of(live.state)["insights"]["learned_constraints"]:
                raise st.Unchanged(False)
            return {"constraint": constraint}, True

        return self._mutate(
            tenant, session_id, expected_version, "cognitive.constraint", plan, None
        )

    def add_entity_relationship(
        self,
        tenant: str,
        session_id: str,
        entity_a: str,
        relation: str,
        entity_b: str,
        *,
        expected_version: int = 0,
    ) -> st.Applied[bool]:
        st.text(entity_a, "entity_a", required=True)
        st.text(relation, "relation", required=True)
        st.text(entity_b, "entity_b", required=True)
        entry: Relationship = {"from": entity_a, "relation": relation, "to": entity_b}

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], bool]:
            if entry in facet_of(live.state)["insights"]["entity_relationships"]:
                raise st.Unchanged(False)
            return {"entry": entry}, True

        return self._mutate(
            tenant, session_id, expected_version, "cognitive.relationship", plan, None
        )

    def add_pattern_observation(
        self, tenant: str, session_id: str, pattern: str, *, expected_version: int = 0
    ) -> st.Applied[bool]:
        st.text(pattern, "pattern", required=True)

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], bool]:
            if pattern in facet_of(live.state)["insights"]["pattern_observations"]:
                raise st.Unchanged(False)
            return {"pattern": pattern}, True

        return self._mutate(tenant, session_id, expected_version, "cognitive.pattern", plan, None)

    # -- reads ---------------------------------------------------------------------------

    def state(self, tenant: str, session_id: str) -> st.Applied[CognitiveFacet]:
        """All three layers (lists copied: safe to use outside the lock)."""
        return st.read(self.sessions, tenant, session_id, state_of)

    def build_context(
        self, tenant: str, session_id: str, max_tokens: int = 0
    ) -> st.Applied[ContextResult]:
        if max_tokens < 0 or max_tokens > MAX_CONTEXT_TOKENS:
            raise InvalidArgumentError(f"max_tokens must be 0-{MAX_CONTEXT_TOKENS}")
        budget = max_tokens or DEFAULT_MAX_TOKENS
        return st.read(
            self.sessions, tenant, session_id, lambda s: build_context(facet_of(s), budget)
        )

    def stats(self, tenant: str, session_id: str) -> st.Applied[CognitiveStats]:
        return st.read(
            self.sessions, tenant, session_id, lambda s: stats_of(tenant, s, facet_of(s))
        )


def state_of(state: SessionState) -> CognitiveFacet:
    cog = facet_of(state)
    insights = cog["insights"]
    return {
        "crystallized": cog["crystallized"],
        "fluid": cog["fluid"],
        "insights": {
            "decision_log": list(insights["decision_log"]),
            "error_journal": list(insights["error_journal"]),
            "learned_constraints": list(insights["learned_constraints"]),
            "entity_relationships": list(insights["entity_relationships"]),
            "pattern_observations": list(insights["pattern_observations"]),
        },
    }


def stats_of(tenant: str, state: SessionState, cog: CognitiveFacet) -> CognitiveStats:
    """StateFileManager.get_stats(), key for key."""
    insights = cog["insights"]
    errors = insights["error_journal"]
    return {
        "initialized": True,
        "tenant_id": tenant,
        "session_id": state.session_id,
        "progress": cog["fluid"]["progress"],
        "decisions_count": len(insights["decision_log"]),
        "errors_total": len(errors),
        "errors_open": sum(1 for e in errors if e["status"] == OPEN),
        "learned_constraints": len(insights["learned_constraints"]),
        "entity_relationships": len(insights["entity_relationships"]),
        "active_entities": len(cog["fluid"]["active_entities"]),
        "pattern_observations": len(insights["pattern_observations"]),
    }


def _validate_fluid(fields: FluidUpdate) -> FluidChanges:
    """The changes, by state name, in the order `fields` gives them (the record keeps it)."""
    changes: FluidChanges = {}
    for name in fields:
        if name == "progress":
            progress = st.finite(float(fields["progress"]), "progress")
            changes["progress"] = min(1.0, max(0.0, progress))
        elif name == "current_sub_goal":
            changes["current_sub_goal"] = st.text(fields["current_sub_goal"], "current_sub_goal")
        elif name == "sub_goals":
            sub_goals = fields["sub_goals"]
            if len(sub_goals) > st.MAX_ITEMS:
                raise InvalidArgumentError(f"sub_goals has more than {st.MAX_ITEMS} items")
            changes["sub_goals"] = [
                {"goal": st.text(g["goal"], "a sub-goal"), "status": st.text(g["status"], "status")}
                for g in sub_goals
            ]
        elif name == "entities":
            changes["active_entities"] = st.string_map(fields["entities"], "entities")
        elif name == "questions":
            changes["open_questions"] = st.texts(fields["questions"], "questions")
        elif name == "brain_digest":
            digest = fields["brain_digest"]
            st.json_value(digest, "brain_digest")
            if not isinstance(digest, dict):
                raise InvalidArgumentError("brain_digest must be an object")
            changes["brain_state_digest"] = digest
        elif name == "step_count":
            if fields["step_count"] < 0:
                raise InvalidArgumentError("step_count must not be negative")
            changes["step_count"] = fields["step_count"]
        else:
            raise InvalidArgumentError(
                f"unknown fluid field {name!r} (fields: {', '.join(FLUID_FIELDS)})"
            )
    return changes


# -- BuildContext ------------------------------------------------------------------------------

_SECTIONS = (
    "## Goal",
    "## Constraints",
    "## Success Criteria",
    "",  # progress: its header is its content
    "## Current Focus",
    "## Key Decisions",
    "## Unresolved Errors",
    "## Learned Constraints",
    "## Entity Relationships",
    "## Pattern Observations",
)
(
    GOAL,
    CONSTRAINTS,
    SUCCESS,
    PROGRESS,
    FOCUS,
    DECISIONS,
    ERRORS,
    LEARNED,
    RELATIONSHIPS,
    PATTERNS,
) = range(len(_SECTIONS))


def _decision_line(d: Decision) -> str:
    rationale = f" ({d['rationale']})" if d["rationale"] else ""
    return f"- Step {d['step']}: {d['decision']}{rationale}"


def _error_line(e: ErrorEntry) -> str:
    return f"- Step {e['step']}: {e['error']}"


def _newest_first(items: Sequence[T]) -> Iterator[tuple[int, T]]:
    for index in range(len(items) - 1, -1, -1):
        yield index, items[index]


def build_context(cog: CognitiveFacet, max_tokens: int) -> ContextResult:
    """corteX's markdown context, within `max_tokens` (see estimate_tokens).

    Sections in corteX's order: Goal, Constraints, Success Criteria,
    Progress, Current Focus, Key Decisions, Unresolved Errors, then the rest
    of the insight layer (Learned Constraints, Entity Relationships, Pattern
    Observations); empty sections are left out. When everything does not fit,
    material is kept in order of importance until the next piece would not
    fit: the Goal (always, even beyond the budget), Progress, Current Focus,
    Constraints, Success Criteria, then Unresolved Errors, Key Decisions,
    Learned Constraints, Entity Relationships and Pattern Observations, each
    newest first. So what is dropped is the least important, and within a
    section the oldest, material.
    """
    crystal, fluid, insights = cog["crystallized"], cog["fluid"], cog["insights"]
    decisions = insights["decision_log"]
    open_errors = [e for e in insights["error_journal"] if e["status"] == OPEN]

    def tiers() -> Iterator[tuple[int, Iterator[tuple[int, str]]]]:
        # (section, items as (position in the section, line)), most important first.
        yield PROGRESS, iter([(0, f"## Progress: {fluid['progress']:.0%}")])
        if fluid["current_sub_goal"]:
            yield FOCUS, iter([(0, fluid["current_sub_goal"])])
        yield CONSTRAINTS, ((i, f"- {c}") for i, c in enumerate(crystal["constraints"]))
        yield SUCCESS, ((i, f"- {c}") for i, c in enumerate(crystal["success_criteria"]))
        yield ERRORS, ((i, _error_line(e)) for i, e in _newest_first(open_errors))
        yield DECISIONS, ((i, _decision_line(d)) for i, d in _newest_first(decisions))
        yield LEARNED, ((i, f"- {c}") for i, c in _newest_first(insights["learned_constraints"]))
        yield (
            RELATIONSHIPS,
            (
                (i, f"- {r['from']} {r['relation']} {r['to']}")
                for i, r in _newest_first(insights["entity_relationships"])
            ),
        )
        yield PATTERNS, ((i, f"- {p}") for i, p in _newest_first(insights["pattern_observations"]))

    kept: list[list[tuple[int, str]]] = [[] for _ in _SECTIONS]
    kept[GOAL].append((0, crystal["goal"]))
    # Characters available: "\n".join of the lines must stay within 4 * max_tokens.
    room = 4 * max_tokens + 1 - (len(_SECTIONS[GOAL]) + 1) - (len(crystal["goal"]) + 1)
    total_items = (
        (1 if fluid["current_sub_goal"] else 0)
        + 1
        + len(crystal["constraints"])
        + len(crystal["success_criteria"])
        + len(open_errors)
        + len(insights["decision_log"])
        + len(insights["learned_constraints"])
        + len(insights["entity_relationships"])
        + len(insights["pattern_observations"])
    )
    taken = 0
    full = False
    for section, items in tiers():
        if full:
            break
        for position, line in items:
            cost = len(line) + 1
            if not kept[section] and _SECTIONS[section]:
                cost += len(_SECTIONS[section]) + 1
            if cost > room:
                full = True
                break
            room -= cost
            kept[section].append((position, line))
            taken += 1
    lines: list[str] = []
    for section, header in enumerate(_SECTIONS):
        if not kept[section]:
            continue
        if header:
            lines.append(header)
        lines.extend(line for _, line in sorted(kept[section]))
    text = "\n".join(lines)
    omitted = total_items - taken
    return ContextResult(text, omitted > 0, estimate_tokens(text), omitted)
