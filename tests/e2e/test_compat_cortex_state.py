"""stratad.compat.cortex StateFileManager against a real ``stratad serve`` subprocess.

corteX's StateFileManager example runs verbatim (apart from the import and the
daemon's address), and a new manager for the same tenant and session loads the
same state.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from stratad.compat.cortex_state import (
    CrystallizedState,
    FluidState,
    InsightState,
    StateFileManager,
)
from stratad.errors import AlreadyExistsError, FailedPreconditionError

EXAMPLE_CONTEXT = """\
## Goal
Build a user management API
## Constraints
- Use PostgreSQL
- REST only
## Success Criteria
- CRUD endpoints
- Auth middleware
## Progress: 30%
## Current Focus
Create User model
## Key Decisions
- Step 1: Use FastAPI (Async support needed)"""


async def seed_example(address: str) -> dict[str, Any]:
    """corteX's example; only `address=` is added to the constructors."""
    manager = StateFileManager(
        base_path=".cortex_state",
        tenant_id="acme",
        session_id="sess_001",
        address=address,
    )

    # Initialize with goal
    await manager.initialize(
        goal="Build a user management API",
        constraints=["Use PostgreSQL", "REST only"],
        success_criteria=["CRUD endpoints", "Auth middleware"],
    )

    # Update progress
    await manager.update_fluid(
        progress=0.3,
        current_sub_goal="Create User model",
        entities={"User": "Main entity", "PostgreSQL": "Database"},
    )

    # Record decisions and errors
    await manager.record_decision(1, "Use FastAPI", "Async support needed")
    await manager.record_error(2, "Port 5432 refused", pattern="connection")
    await manager.resolve_error(2, "Started PostgreSQL service")

    # Build context for LLM injection
    context = manager.build_persistent_context(max_tokens=2000)

    # Reload in a new session
    new_manager = StateFileManager(
        base_path=".cortex_state", tenant_id="acme", session_id="sess_001", address=address
    )
    loaded = await new_manager.load()
    return {"manager": manager, "context": context, "new_manager": new_manager, "loaded": loaded}


def test_the_seed_example_and_a_new_manager_loads_the_same_state(daemon: Any) -> None:
    got = asyncio.run(seed_example(daemon.target))
    manager, new_manager = got["manager"], got["new_manager"]
    assert got["context"] == EXAMPLE_CONTEXT
    assert got["loaded"] is True and new_manager.is_initialized
    assert (manager.tenant_id, manager.session_id) == ("acme", "sess_001")
    assert new_manager.get_crystallized() == manager.get_crystallized()
    assert new_manager.get_fluid() == manager.get_fluid()
    assert new_manager.get_insights() == manager.get_insights()
    assert new_manager.build_persistent_context() == EXAMPLE_CONTEXT

    crystal = new_manager.get_crystallized()
    assert dataclasses.replace(crystal, created_at=0) == CrystallizedState(
        goal="Build a user management API",
        success_criteria=["CRUD endpoints", "Auth middleware"],
        constraints=["Use PostgreSQL", "REST only"],
        created_at=0,
    )
    fluid = new_manager.get_fluid()
    assert (fluid.progress, fluid.current_sub_goal) == (0.3, "Create User model")
    assert fluid.active_entities == {"User": "Main entity", "PostgreSQL": "Database"}
    [decision] = new_manager.get_decision_log()
    assert decision == {
        "step": 1, "decision": "Use FastAPI", "rationale": "Async support needed",
        "timestamp": decision["timestamp"],
    }  # fmt: skip
    assert new_manager.get_error_journal() == [
        {"step": 2, "error": "Port 5432 refused", "resolution": "Started PostgreSQL service",
         "pattern": "connection", "status": "resolved"},
    ]  # fmt: skip
    assert new_manager.get_open_errors() == []
    assert new_manager.get_stats() == {
        "initialized": True, "tenant_id": "acme", "session_id": "sess_001", "progress": 0.3,
        "decisions_count": 1, "errors_total": 1, "errors_open": 0, "learned_constraints": 0,
        "entity_relationships": 0, "active_entities": 2, "pattern_observations": 0,
    }  # fmt: skip
    manager.close()
    new_manager.close()


def test_a_fresh_manager_before_initialize(daemon: Any) -> None:
    async def run() -> None:
        with StateFileManager(tenant_id="acme", address=daemon.target) as manager:
            assert manager.session_id.startswith("sess_")
            assert not manager.is_initialized
            assert await manager.load() is False
            assert manager.build_persistent_context() == ""
            assert manager.get_insights() == InsightState()
            assert manager.get_fluid().progress == 0.0 and isinstance(
                manager.get_fluid(), FluidState
            )
            stats = manager.get_stats()
            assert stats["initialized"] is False and stats["decisions_count"] == 0
            with pytest.raises(FailedPreconditionError):
                await manager.record_decision(1, "too early", "")
            await manager.initialize(goal="g")
            assert manager.is_initialized
            with pytest.raises(AlreadyExistsError):
                await manager.initialize(goal="again")

    asyncio.run(run())


def test_insight_dedup_and_fluid_semantics_through_the_facade(daemon: Any) -> None:
    async def run() -> None:
        with StateFileManager(tenant_id="t1", session_id="s", address=daemon.target) as m:
            await m.initialize(goal="g", user_identity={"name": "Ada"}, project_context="p")
            await m.update_fluid(
                progress=3.0, sub_goals=[{"goal": "a", "status": "open"}], questions=["q"],
                brain_digest={"focus": "api", "depth": 2}, step_count=5,
            )  # fmt: skip
            await m.update_fluid(questions=[])  # given, even empty: replaced
            fluid = m.get_fluid()
            assert fluid.progress == 1.0 and fluid.open_questions == []
            assert fluid.sub_goals == [{"goal": "a", "status": "open"}]
            assert fluid.brain_state_digest == {"focus": "api", "depth": 2}
            assert fluid.step_count == 5
            for _ in range(2):
                await m.add_learned_constraint("No ORM")
                await m.add_entity_relationship("User", "stored_in", "PostgreSQL")
                await m.add_pattern_observation("retries help")
            insights = m.get_insights()
            assert insights.learned_constraints == ["No ORM"]
            assert insights.entity_relationships == [
                {"from": "User", "relation": "stored_in", "to": "PostgreSQL"}
            ]
            assert insights.pattern_observations == ["retries help"]
            await m.record_error(4, "boom")
            assert await m.resolve_error(4, "fixed") is True
            assert await m.resolve_error(4, "fixed") is False
            assert m.get_crystallized().user_identity == {"name": "Ada"}
        # the same session ID in another tenant is another session
        with StateFileManager(tenant_id="t2", session_id="s", address=daemon.target) as other:
            assert await other.load() is False

    asyncio.run(run())
