"""The cognitive facet in-process on `Engine`: corteX's StateFileManager rules, BuildContext,
replay, checkpoints.

- Initialize once (ALREADY_EXISTS after), everything else FAILED_PRECONDITION before it.
- UpdateFluid changes only what it is given; progress is clamped; last_updated moves.
- Errors are OPEN or RESOLVED; ResolveError closes the newest open one at a step.
- Learned constraints, relationships and patterns are deduplicated (nothing journaled).
- BuildContext: corteX's markdown, and truncation by the documented estimate.
- A reopened engine replays every record kind to the same state (compacted or not).
- Checkpoints capture the facet; RestoreCheckpoint(make_current) and ForkSession bring it back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stratad.domain.checkpoints import SaveInput
from stratad.domain.cognitive import build_context, estimate_tokens
from stratad.domain.engine import Engine
from stratad.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    VersionConflictError,
)

T = "default"
S = "sess_001"


@contextlib.contextmanager
def open_engine(data_dir: Path, **options: Any) -> Iterator[Engine]:
    engine = Engine(data_dir, durability="none", **options)
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with open_engine(tmp_path) as engine:
        engine.sessions.create(T, S)
        yield engine


def init(engine: Engine, **fields: Any) -> None:
    fields.setdefault("goal", "Build a REST API")
    engine.cognitive.initialize(T, S, **fields)


def version(engine: Engine) -> int:
    return engine.sessions.info(T, S).version


# -- Initialize and the precondition ------------------------------------------------------


def test_initialize_sets_the_crystallized_layer_once(engine: Engine) -> None:
    applied = engine.cognitive.initialize(
        T, S, goal="g", constraints=["c"], success_criteria=["s"],
        user_identity={"name": "Ada"}, project_context="p",
    )  # fmt: skip
    assert applied.version == 2
    crystal = engine.cognitive.state(T, S).result["crystallized"]
    assert crystal == {
        "goal": "g", "success_criteria": ["s"], "constraints": ["c"],
        "user_identity": {"name": "Ada"}, "project_context": "p",
        "created_at": crystal["created_at"],
    }  # fmt: skip
    assert crystal["created_at"] > 0
    with pytest.raises(AlreadyExistsError, match="immutable"):
        engine.cognitive.initialize(T, S, goal="other")
    assert engine.cognitive.state(T, S).result["crystallized"]["goal"] == "g"
    assert version(engine) == 2


@pytest.mark.parametrize(
    "call",
    [
        lambda e: e.cognitive.update_fluid(T, S, {"progress": 0.5}),
        lambda e: e.cognitive.record_decision(T, S, step=1, decision="d"),
        lambda e: e.cognitive.record_error(T, S, step=1, error="e"),
        lambda e: e.cognitive.resolve_error(T, S, step=1, resolution="r"),
        lambda e: e.cognitive.add_learned_constraint(T, S, "c"),
        lambda e: e.cognitive.add_entity_relationship(T, S, "a", "r", "b"),
        lambda e: e.cognitive.add_pattern_observation(T, S, "p"),
        lambda e: e.cognitive.state(T, S),
        lambda e: e.cognitive.build_context(T, S),
        lambda e: e.cognitive.stats(T, S),
    ],
)
def test_every_other_call_before_initialize_is_failed_precondition(
    engine: Engine, call: Any
) -> None:
    with pytest.raises(FailedPreconditionError, match="Initialize"):
        call(engine)
    assert version(engine) == 1


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"goal": ""}, "goal is required"),
        ({"goal": "   "}, "goal is required"),
        ({"goal": "x" * ((64 << 10) + 1)}, "longer"),
        ({"goal": "g", "constraints": ["x"] * 1001}, "more than 1000"),
        ({"goal": "g", "user_identity": {"": "x"}}, "user_identity"),
        ({"goal": "g", "user_identity": {"a\nb": "x"}}, "user_identity"),
    ],
)
def test_initialize_refuses_bad_input(engine: Engine, fields: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        engine.cognitive.initialize(T, S, **fields)
    assert version(engine) == 1


def test_unknown_session_and_version_conflict(engine: Engine) -> None:
    with pytest.raises(NotFoundError):
        engine.cognitive.initialize(T, "nope", goal="g")
    with pytest.raises(NotFoundError):
        engine.cognitive.initialize("other-tenant", S, goal="g")
    with pytest.raises(VersionConflictError):
        engine.cognitive.initialize(T, S, goal="g", expected_version=7)
    engine.cognitive.initialize(T, S, goal="g", expected_version=1)


# -- the fluid layer ------------------------------------------------------------------------


def test_update_fluid_changes_only_given_fields_and_clamps_progress(engine: Engine) -> None:
    init(engine)
    before = engine.cognitive.state(T, S).result["fluid"]
    assert before["progress"] == 0.0 and before["step_count"] == 0
    engine.cognitive.update_fluid(
        T, S, {"progress": 0.3, "current_sub_goal": "Create User model",
               "entities": {"User": "Main entity"}},
    )  # fmt: skip
    fluid = engine.cognitive.update_fluid(T, S, {"progress": 7.5, "step_count": 4}).result
    assert fluid["progress"] == 1.0
    assert fluid["current_sub_goal"] == "Create User model"
    assert fluid["active_entities"] == {"User": "Main entity"}
    assert fluid["step_count"] == 4
    assert fluid["last_updated"] >= before["last_updated"]
    assert engine.cognitive.update_fluid(T, S, {"progress": -2}).result["progress"] == 0.0
    after = engine.cognitive.state(T, S).result["fluid"]
    assert after == {**fluid, "progress": 0.0, "last_updated": after["last_updated"]}


def test_update_fluid_replaces_lists_and_maps_and_digest(engine: Engine) -> None:
    init(engine)
    engine.cognitive.update_fluid(
        T, S, {"sub_goals": [{"goal": "a", "status": "done"}], "questions": ["q?"],
               "brain_digest": {"mood": "calm", "n": 2}},
    )  # fmt: skip
    fluid = engine.cognitive.update_fluid(T, S, {"questions": []}).result
    assert fluid["open_questions"] == []
    assert fluid["sub_goals"] == [{"goal": "a", "status": "done"}]
    assert fluid["brain_state_digest"] == {"mood": "calm", "n": 2}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"progress": float("nan")}, "finite"),
        ({"progress": float("inf")}, "finite"),
        ({"step_count": -1}, "step_count"),
        ({"mood": "x"}, "unknown fluid field"),
        ({"entities": {"": "x"}}, "entities"),
        ({"brain_digest": {"x": float("nan")}}, "not a JSON value"),
        ({"current_sub_goal": "x" * 70000}, "longer"),
    ],
)
def test_update_fluid_refuses_bad_input(engine: Engine, fields: dict[str, Any], words: str) -> None:
    init(engine)
    with pytest.raises(InvalidArgumentError, match=words):
        engine.cognitive.update_fluid(T, S, fields)
    assert version(engine) == 2


# -- the insight layer ----------------------------------------------------------------------


def test_decisions_are_appended_with_a_timestamp(engine: Engine) -> None:
    init(engine)
    first = engine.cognitive.record_decision(
        T, S, step=1, decision="Use FastAPI", rationale="async"
    )
    engine.cognitive.record_decision(T, S, step=1, decision="Use FastAPI", rationale="async")
    log = engine.cognitive.state(T, S).result["insights"]["decision_log"]
    assert len(log) == 2  # a log, not a set: no dedup
    assert log[0] == {
        "step": 1, "decision": "Use FastAPI", "rationale": "async",
        "timestamp": first.result["timestamp"],
    }  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="decision is required"):
        engine.cognitive.record_decision(T, S, step=1, decision="")
    with pytest.raises(InvalidArgumentError, match="step"):
        engine.cognitive.record_decision(T, S, step=-1, decision="d")


def test_errors_open_or_resolved_and_resolve_the_newest_open_at_a_step(engine: Engine) -> None:
    init(engine)
    engine.cognitive.record_error(T, S, step=2, error="first", pattern="connection")
    engine.cognitive.record_error(T, S, step=2, error="second")
    engine.cognitive.record_error(T, S, step=3, error="fixed", resolution="retry")
    journal = engine.cognitive.state(T, S).result["insights"]["error_journal"]
    assert [e["status"] for e in journal] == ["open", "open", "resolved"]
    assert journal[0] == {
        "step": 2, "error": "first", "resolution": "", "pattern": "connection", "status": "open"
    }  # fmt: skip
    assert engine.cognitive.resolve_error(T, S, step=2, resolution="restarted").result is True
    journal = engine.cognitive.state(T, S).result["insights"]["error_journal"]
    assert journal[1] == {**journal[1], "status": "resolved", "resolution": "restarted"}
    assert journal[0]["status"] == "open"
    assert engine.cognitive.resolve_error(T, S, step=2, resolution="again").result is True
    before = version(engine)
    missing = engine.cognitive.resolve_error(T, S, step=2, resolution="nothing left")
    assert (missing.result, missing.version) == (False, before)
    assert engine.cognitive.resolve_error(T, S, step=9, resolution="r").result is False
    assert version(engine) == before  # nothing journaled
    with pytest.raises(InvalidArgumentError, match="resolution is required"):
        engine.cognitive.resolve_error(T, S, step=2, resolution="")
    with pytest.raises(InvalidArgumentError, match="error is required"):
        engine.cognitive.record_error(T, S, step=2, error=" ")


def test_learned_constraints_relationships_and_patterns_are_deduplicated(engine: Engine) -> None:
    init(engine)
    c = engine.cognitive
    assert c.add_learned_constraint(T, S, "No ORM").result is True
    v = version(engine)
    assert c.add_learned_constraint(T, S, "No ORM").result is False
    assert c.add_learned_constraint(T, S, "no orm").result is True  # exact text only
    assert c.add_entity_relationship(T, S, "User", "stored_in", "PostgreSQL").result is True
    assert c.add_entity_relationship(T, S, "User", "stored_in", "PostgreSQL").result is False
    assert c.add_entity_relationship(T, S, "User", "cached_in", "PostgreSQL").result is True
    assert c.add_pattern_observation(T, S, "retries help").result is True
    assert c.add_pattern_observation(T, S, "retries help").result is False
    insights = c.state(T, S).result["insights"]
    assert insights["learned_constraints"] == ["No ORM", "no orm"]
    assert insights["entity_relationships"] == [
        {"from": "User", "relation": "stored_in", "to": "PostgreSQL"},
        {"from": "User", "relation": "cached_in", "to": "PostgreSQL"},
    ]
    assert insights["pattern_observations"] == ["retries help"]
    assert version(engine) == v + 4  # the three duplicates journaled nothing
    bad_calls: list[Callable[[], object]] = [
        lambda: c.add_learned_constraint(T, S, ""),
        lambda: c.add_entity_relationship(T, S, "a", "", "b"),
        lambda: c.add_pattern_observation(T, S, "  "),
    ]
    for bad in bad_calls:
        with pytest.raises(InvalidArgumentError):
            bad()


def test_stats_have_exactly_the_seed_keys(engine: Engine) -> None:
    init(engine)
    engine.cognitive.update_fluid(T, S, {"progress": 0.25, "entities": {"a": "1", "b": "2"}})
    engine.cognitive.record_decision(T, S, step=1, decision="d")
    engine.cognitive.record_error(T, S, step=1, error="e1")
    engine.cognitive.record_error(T, S, step=1, error="e2", resolution="r")
    engine.cognitive.add_pattern_observation(T, S, "p")
    assert engine.cognitive.stats(T, S).result == {
        "initialized": True, "tenant_id": T, "session_id": S, "progress": 0.25,
        "decisions_count": 1, "errors_total": 2, "errors_open": 1, "learned_constraints": 0,
        "entity_relationships": 0, "active_entities": 2, "pattern_observations": 1,
    }  # fmt: skip


# -- BuildContext ---------------------------------------------------------------------------

#: The output corteX documents for StateFileManager.build_persistent_context, verbatim.
SEED_CONTEXT = """\
## Goal
Build a REST API
## Constraints
- Must use PostgreSQL
## Success Criteria
- All endpoints return JSON
## Progress: 45%
## Current Focus
Implementing user endpoints
## Key Decisions
- Step 3: Chose FastAPI (lightweight, async support)
## Unresolved Errors
- Step 7: Connection refused on port 5432"""


def seed_state(engine: Engine) -> None:
    init(
        engine, constraints=["Must use PostgreSQL"], success_criteria=["All endpoints return JSON"]
    )
    engine.cognitive.update_fluid(
        T, S, {"progress": 0.45, "current_sub_goal": "Implementing user endpoints"}
    )
    engine.cognitive.record_decision(
        T, S, step=3, decision="Chose FastAPI", rationale="lightweight, async support"
    )
    engine.cognitive.record_error(T, S, step=7, error="Connection refused on port 5432")


def test_build_context_is_the_seed_example(engine: Engine) -> None:
    seed_state(engine)
    result = engine.cognitive.build_context(T, S).result
    assert result.text == SEED_CONTEXT
    assert (result.truncated, result.omitted_items) == (False, 0)
    assert result.estimated_tokens == (len(SEED_CONTEXT) + 3) // 4


def test_build_context_with_the_rest_of_the_insight_layer(engine: Engine) -> None:
    seed_state(engine)
    c = engine.cognitive
    c.record_decision(T, S, step=4, decision="No rationale")
    c.record_error(T, S, step=5, error="Resolved one", resolution="fixed")  # not shown
    c.add_learned_constraint(T, S, "Port 5432 needs the service running")
    c.add_entity_relationship(T, S, "User", "stored_in", "PostgreSQL")
    c.add_pattern_observation(T, S, "Connection errors precede startup")
    assert c.build_context(T, S).result.text == SEED_CONTEXT.replace(
        "async support)\n", "async support)\n- Step 4: No rationale\n"
    ) + (
        "\n## Learned Constraints\n- Port 5432 needs the service running"
        "\n## Entity Relationships\n- User stored_in PostgreSQL"
        "\n## Pattern Observations\n- Connection errors precede startup"
    )


def test_build_context_leaves_out_empty_sections(engine: Engine) -> None:
    init(engine, goal="Only a goal")
    result = engine.cognitive.build_context(T, S).result
    assert result.text == "## Goal\nOnly a goal\n## Progress: 0%"


def test_truncation_drops_the_oldest_decisions_first(engine: Engine) -> None:
    init(engine, goal="G")
    for i in range(100):
        engine.cognitive.record_decision(T, S, step=i, decision=f"decision {i:03d}")
    result = engine.cognitive.build_context(T, S, 40).result
    assert result.truncated and result.estimated_tokens <= 40
    assert result.estimated_tokens == estimate_tokens(result.text)
    lines = result.text.splitlines()
    assert lines[:4] == ["## Goal", "G", "## Progress: 0%", "## Key Decisions"]
    kept = [int(line.split()[2].rstrip(":")) for line in lines[4:]]
    assert kept == list(range(100 - len(kept), 100))  # the newest, in order
    assert result.omitted_items == 100 - len(kept)
    # one more token of budget never keeps fewer
    assert len(engine.cognitive.build_context(T, S, 41).result.text) >= len(result.text)


def test_truncation_drops_less_important_sections_before_more_important_ones(
    engine: Engine,
) -> None:
    seed_state(engine)
    c = engine.cognitive
    c.add_pattern_observation(T, S, "a pattern that is the least important material here")
    c.add_learned_constraint(T, S, "a learned constraint")
    full = c.build_context(T, S).result
    budgets = range(estimate_tokens(full.text), 0, -1)
    order = []
    for budget in budgets:
        text = c.build_context(T, S, budget).result.text
        for header in ("## Pattern Observations", "## Learned Constraints", "## Key Decisions",
                       "## Unresolved Errors", "## Success Criteria", "## Constraints",
                       "## Current Focus", "## Progress"):  # fmt: skip
            if header not in text and header not in order:
                order.append(header)
        assert text.startswith("## Goal\nBuild a REST API")
    assert order == [
        "## Pattern Observations", "## Learned Constraints", "## Key Decisions",
        "## Unresolved Errors", "## Success Criteria", "## Constraints", "## Current Focus",
        "## Progress",
    ]  # fmt: skip


def test_the_goal_is_never_dropped(engine: Engine) -> None:
    init(engine, goal="A goal far longer than the budget " * 10, constraints=["c"])
    result = engine.cognitive.build_context(T, S, 1).result
    assert result.text == "## Goal\n" + "A goal far longer than the budget " * 10
    assert result.truncated and result.omitted_items == 2  # progress and the constraint


def test_build_context_refuses_bad_budgets(engine: Engine) -> None:
    init(engine)
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        engine.cognitive.build_context(T, S, -1)
    assert engine.cognitive.build_context(T, S, 0).result.truncated is False  # default 2000


def test_build_context_on_ten_thousand_decisions_keeps_the_newest() -> None:
    cog = {
        "crystallized": {"goal": "g", "constraints": [], "success_criteria": []},
        "fluid": {"progress": 0.5, "current_sub_goal": ""},
        "insights": {
            "decision_log": [
                {"step": i, "decision": f"d{i}", "rationale": ""} for i in range(10_000)
            ],
            "error_journal": [],
            "learned_constraints": [],
            "entity_relationships": [],
            "pattern_observations": [],
        },
    }
    result = build_context(cog, 2000)
    assert result.truncated and result.estimated_tokens <= 2000
    assert result.text.endswith("- Step 9999: d9999")
    assert result.omitted_items + result.text.count("\n- Step") == 10_000


# -- replay, compaction, checkpoints ----------------------------------------------------------


def populate(engine: Engine) -> dict[str, Any]:
    seed_state(engine)
    c = engine.cognitive
    c.update_fluid(T, S, {"sub_goals": [{"goal": "x", "status": "open"}], "brain_digest": {"a": 1}})
    c.record_error(T, S, step=8, error="boom")
    c.resolve_error(T, S, step=8, resolution="fixed")
    c.add_learned_constraint(T, S, "lc")
    c.add_entity_relationship(T, S, "a", "b", "c")
    c.add_pattern_observation(T, S, "p")
    return c.state(T, S).result


def test_a_reopened_engine_replays_every_cognitive_record(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.sessions.create(T, S)
        expected = populate(engine)
        expected_version = version(engine)
    with open_engine(tmp_path) as engine:
        assert engine.cognitive.state(T, S).result == expected
        assert version(engine) == expected_version
        assert engine.cognitive.build_context(T, S).result.text.startswith(SEED_CONTEXT[:40])


def test_compacted_journals_keep_the_cognitive_state(tmp_path: Path) -> None:
    with open_engine(tmp_path, compact_min_bytes=4096) as engine:
        engine.sessions.create(T, S)
        expected = populate(engine)
        for i in range(300):
            engine.cognitive.record_decision(T, S, step=i, decision=f"decision number {i}")
        engine.sessions.compact_requested()
        journal = tmp_path / "tenants" / T / "sessions" / S / "journal"
        assert journal.stat().st_size < 64 << 10
        expected = engine.cognitive.state(T, S).result
    with open_engine(tmp_path) as engine:
        assert engine.cognitive.state(T, S).result == expected
        assert len(expected["insights"]["decision_log"]) == 301


def test_checkpoints_capture_and_restore_the_cognitive_state(engine: Engine) -> None:
    init(engine)
    engine.cognitive.record_decision(T, S, step=1, decision="before")
    saved = engine.checkpoints.save_state(T, S, SaveInput(data=b"opaque"))
    named = engine.checkpoints.create_checkpoint(T, S, name="named")
    engine.cognitive.record_decision(T, S, step=2, decision="after")
    engine.cognitive.update_fluid(T, S, {"progress": 0.9})
    engine.checkpoints.restore_checkpoint(T, saved.checkpoint.checkpoint_id, make_current=True)
    state = engine.cognitive.state(T, S).result
    assert [d["decision"] for d in state["insights"]["decision_log"]] == ["before"]
    assert state["fluid"]["progress"] == 0.0
    forked = engine.checkpoints.fork_session(T, named.checkpoint_id, new_session_id="fork")
    fork_state = engine.cognitive.state(T, forked.session_id).result
    assert [d["decision"] for d in fork_state["insights"]["decision_log"]] == ["before"]
    # the fork and the original are independent from here on
    engine.cognitive.record_decision(T, "fork", step=3, decision="fork only")
    assert len(engine.cognitive.state(T, S).result["insights"]["decision_log"]) == 1
