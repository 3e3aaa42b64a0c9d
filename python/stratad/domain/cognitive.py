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
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from stratad.domain import structured as st
from stratad.domain.models import SessionState, reducer
from stratad.domain.sessions import Commit, LiveSession, SessionManager
from stratad.errors import AlreadyExistsError, FailedPreconditionError, InvalidArgumentError

FACET = "cognitive"
OPEN = "open"
RESOLVED = "resolved"
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


def estimate_tokens(text: str) -> int:
    """The token estimate BuildContext budgets with: one token per 4 characters, rounded up."""
    return (len(text) + 3) // 4


def facet_of(state: SessionState) -> dict[str, Any]:
    """The session's cognitive facet; FAILED_PRECONDITION before Initialize."""
    cog: dict[str, Any] | None = state.structured.get(FACET)
    if cog is None:
        raise FailedPreconditionError(
            f"session {state.session_id!r} has no cognitive state yet: call Initialize first",
            reason="NOT_INITIALIZED",
        )
    return cog


def _empty_fluid(at: float) -> dict[str, Any]:
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


def _empty_insights() -> dict[str, list[Any]]:
    return {
        "decision_log": [],
        "error_journal": [],
        "learned_constraints": [],
        "entity_relationships": [],
        "pattern_observations": [],
    }


# -- reducers (live and at replay) ---------------------------------------------------------


@reducer("cognitive.init")
def _apply_init(state: SessionState, body: dict[str, Any]) -> None:
    state.structured[FACET] = {
        "crystallized": body["crystallized"],
        "fluid": _empty_fluid(body["at"]),
        "insights": _empty_insights(),
    }


@reducer("cognitive.fluid")
def _apply_fluid(state: SessionState, body: dict[str, Any]) -> None:
    cog = state.structured[FACET]
    cog["fluid"] = {**cog["fluid"], **body["fields"], "last_updated": body["at"]}


@reducer("cognitive.decision")
def _apply_decision(state: SessionState, body: dict[str, Any]) -> None:
    _append(state, "decision_log", body["entry"])


@reducer("cognitive.error")
def _apply_error(state: SessionState, body: dict[str, Any]) -> None:
    _append(state, "error_journal", body["entry"])


@reducer("cognitive.resolve")
def _apply_resolve(state: SessionState, body: dict[str, Any]) -> None:
    insights = state.structured[FACET]["insights"]
    journal = list(insights["error_journal"])
    index = body["index"]
    journal[index] = {**journal[index], "resolution": body["resolution"], "status": RESOLVED}
    insights["error_journal"] = journal


@reducer("cognitive.constraint")
def _apply_constraint(state: SessionState, body: dict[str, Any]) -> None:
    _append(state, "learned_constraints", body["constraint"])


@reducer("cognitive.relationship")
def _apply_relationship(state: SessionState, body: dict[str, Any]) -> None:
    _append(state, "entity_relationships", body["entry"])


@reducer("cognitive.pattern")
def _apply_pattern(state: SessionState, body: dict[str, Any]) -> None:
    _append(state, "pattern_observations", body["pattern"])


def _append(state: SessionState, list_name: str, item: Any) -> None:
    # Appending to the list in place is safe for readers, who copy the lists
    # (not just reference them) under the session lock; see `state_of`.
    state.structured[FACET]["insights"][list_name].append(item)


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
        plan: st.Plan[Any],
        commit: Commit | None,
    ) -> st.Applied[Any]:
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
    ) -> st.Applied[dict[str, Any]]:
        """Set the crystallized layer; ALREADY_EXISTS when it is set already."""
        crystallized = {
            "goal": st.text(goal, "goal", required=True),
            "success_criteria": st.texts(success_criteria or [], "success_criteria"),
            "constraints": st.texts(constraints or [], "constraints"),
            "user_identity": st.string_map(user_identity or {}, "user_identity"),
            "project_context": st.text(project_context, "project_context"),
        }

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], dict[str, Any]]:
            if FACET in live.state.structured:
                raise AlreadyExistsError(
                    f"session {session_id!r} is initialized already: the crystallized layer "
                    "is immutable"
                )
            value = {**crystallized, "created_at": at}
            return {"crystallized": value}, value

        return self._mutate(tenant, session_id, expected_version, "cognitive.init", plan, commit)

    def update_fluid(
        self,
        tenant: str,
        session_id: str,
        fields: dict[str, Any],
        *,
        expected_version: int = 0,
        commit: Commit | None = None,
    ) -> st.Applied[dict[str, Any]]:
        """Change the fluid fields given (request names, see FLUID_FIELDS)."""
        changes = _validate_fluid(fields)

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], dict[str, Any]]:
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
    ) -> st.Applied[dict[str, Any]]:
        st.step(step)
        st.text(decision, "decision", required=True)
        st.text(rationale, "rationale")

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], dict[str, Any]]:
            facet_of(live.state)
            entry = {"step": step, "decision": decision, "rationale": rationale, "timestamp": at}
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
    ) -> st.Applied[dict[str, Any]]:
        st.step(step)
        st.text(error, "error", required=True)
        st.text(resolution, "resolution")
        st.text(pattern, "pattern")
        entry = {
            "step": step,
            "error": error,
            "resolution": resolution,
            "pattern": pattern,
            "status": RESOLVED if resolution else OPEN,
        }

        def plan(live: LiveSession, at: float) -> tuple[dict[str, Any], dict[str, Any]]:
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
        entry = {"from": entity_a, "relation": relation, "to": entity_b}

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

    def state(self, tenant: str, session_id: str) -> st.Applied[dict[str, Any]]:
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

    def stats(self, tenant: str, session_id: str) -> st.Applied[dict[str, Any]]:
        return st.read(
            self.sessions, tenant, session_id, lambda s: stats_of(tenant, s, facet_of(s))
        )


def state_of(state: SessionState) -> dict[str, Any]:
    cog = facet_of(state)
    insights = cog["insights"]
    return {
        "crystallized": cog["crystallized"],
        "fluid": cog["fluid"],
        "insights": {name: list(items) for name, items in insights.items()},
    }


def stats_of(tenant: str, state: SessionState, cog: dict[str, Any]) -> dict[str, Any]:
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


def _validate_fluid(fields: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for name, value in fields.items():
        target = FLUID_FIELDS.get(name)
        if target is None:
            raise InvalidArgumentError(
                f"unknown fluid field {name!r} (fields: {', '.join(FLUID_FIELDS)})"
            )
        if name == "progress":
            value = min(1.0, max(0.0, st.finite(float(value), "progress")))
        elif name == "current_sub_goal":
            st.text(value, "current_sub_goal")
        elif name == "sub_goals":
            if len(value) > st.MAX_ITEMS:
                raise InvalidArgumentError(f"sub_goals has more than {st.MAX_ITEMS} items")
            value = [
                {"goal": st.text(g["goal"], "a sub-goal"), "status": st.text(g["status"], "status")}
                for g in value
            ]
        elif name == "entities":
            value = st.string_map(value, "entities")
        elif name == "questions":
            value = st.texts(value, "questions")
        elif name == "brain_digest":
            st.json_value(value, "brain_digest")
        elif name == "step_count" and value < 0:
            raise InvalidArgumentError("step_count must not be negative")
        changes[target] = value
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


def _decision_line(d: dict[str, Any]) -> str:
    rationale = f" ({d['rationale']})" if d["rationale"] else ""
    return f"- Step {d['step']}: {d['decision']}{rationale}"


def _error_line(e: dict[str, Any]) -> str:
    return f"- Step {e['step']}: {e['error']}"


def _newest_first(items: list[Any]) -> Iterator[tuple[int, Any]]:
    for index in range(len(items) - 1, -1, -1):
        yield index, items[index]


def build_context(cog: dict[str, Any], max_tokens: int) -> ContextResult:
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
