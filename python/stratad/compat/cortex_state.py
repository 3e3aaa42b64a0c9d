"""corteX's ``StateFileManager`` on stratad's CognitiveStateService.

Code written against ``corteX.engine.cognitive.state_files`` moves to stratad by
changing its import and naming the daemon::

    from stratad.compat.cortex import StateFileManager

    manager = StateFileManager(
        base_path=".cortex_state", tenant_id="acme", session_id="sess_001",
        address="127.0.0.1:50051",
    )
    await manager.initialize(goal="Build a user management API", constraints=["REST only"])
    await manager.update_fluid(progress=0.3, current_sub_goal="Create User model")
    await manager.record_decision(1, "Use FastAPI", "Async support needed")
    context = manager.build_persistent_context(max_tokens=2000)

The three layers live in the stratad session ``session_id`` of tenant
``tenant_id`` instead of ``{base_path}/{tenant_id}/{session_id}/state.json``:

- **No file, no lock.** Every update is one atomic, journaled call on the
  daemon, acknowledged once durable, so any number of processes may update one
  session at the same time and no update is lost; a new manager (in any
  process) for the same tenant and session sees everything after ``load()``.
- ``base_path`` is accepted for signature compatibility and ignored.
- ``tenant_id`` is the stratad tenant (the ``x-stratad-tenant`` header when the
  daemon runs without authentication; ``"default"`` is stratad's default
  tenant). ``session_id`` is created on the daemon by ``initialize()`` when it
  does not exist yet; an empty one is generated (``sess_<12 hex>``).
- The crystallized layer is immutable on the daemon too: a second
  ``initialize()`` of a session raises `stratad.errors.AlreadyExistsError`, and
  updates before ``initialize()`` (of this or any manager of the session)
  raise `stratad.errors.FailedPreconditionError`.
- The getters, ``build_persistent_context`` and ``get_stats`` ask the daemon
  (they are blocking calls, as corteX's are synchronous); before the session
  is initialized they answer as corteX's empty manager would (default
  layers, ``""``, ``initialized: False``).
- ``build_persistent_context`` is the daemon's BuildContext: corteX's
  markdown sections, truncated to ``max_tokens`` estimated as characters / 4,
  never dropping the goal, oldest and least important material first.

The async methods run their call on a worker thread (``asyncio.to_thread``),
so a manager may be used from any event loop. Other failures are
`stratad.errors` classes (e.g. `~stratad.errors.UnavailableError` when no daemon
answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import field_mask_pb2, timestamp_pb2

from stratad.api.v1 import cognitive_pb2 as pb
from stratad.api.v1 import cognitive_pb2_grpc
from stratad.errors import AlreadyExistsError, FailedPreconditionError, NotFoundError
from stratad.sdk.client import Client
from stratad.sdk.connection import TLSConfig
from stratad.sdk.constants import ADDRESS_ENV
from stratad.values import fill_struct, struct_to_py

__all__ = ["ADDRESS_ENV", "CrystallizedState", "FluidState", "InsightState", "StateFileManager"]

DEFAULT_TENANT = "default"
T = TypeVar("T")
_ERROR_STATUS = {pb.ERROR_STATUS_OPEN: "open", pb.ERROR_STATUS_RESOLVED: "resolved"}


@dataclass
class CrystallizedState:
    """Layer 1: immutable identity state set once at initialization."""

    goal: str = ""
    success_criteria: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    user_identity: dict[str, str] = field(default_factory=dict)
    project_context: str = ""
    created_at: float = field(default_factory=time.time)


@dataclass
class FluidState:
    """Layer 2: mutable current-session working state."""

    current_sub_goal: str = ""
    progress: float = 0.0
    sub_goals: list[dict[str, str]] = field(default_factory=list)
    active_entities: dict[str, str] = field(default_factory=dict)
    open_questions: list[str] = field(default_factory=list)
    brain_state_digest: dict[str, Any] = field(default_factory=dict)
    step_count: int = 0
    last_updated: float = field(default_factory=time.time)


@dataclass
class InsightState:
    """Layer 3: append-only accumulated wisdom (oldest first)."""

    decision_log: list[dict[str, Any]] = field(default_factory=list)
    error_journal: list[dict[str, Any]] = field(default_factory=list)
    learned_constraints: list[str] = field(default_factory=list)
    entity_relationships: list[dict[str, str]] = field(default_factory=list)
    pattern_observations: list[str] = field(default_factory=list)


def _seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.ToNanoseconds() / 1e9


def _crystallized(c: pb.CrystallizedState) -> CrystallizedState:
    return CrystallizedState(
        goal=c.goal,
        success_criteria=list(c.success_criteria),
        constraints=list(c.constraints),
        user_identity=dict(c.user_identity),
        project_context=c.project_context,
        created_at=_seconds(c.created_at),
    )


def _fluid(f: pb.FluidState) -> FluidState:
    return FluidState(
        current_sub_goal=f.current_sub_goal,
        progress=f.progress,
        sub_goals=[{"goal": g.goal, "status": g.status} for g in f.sub_goals],
        active_entities=dict(f.active_entities),
        open_questions=list(f.open_questions),
        brain_state_digest=struct_to_py(f.brain_state_digest),
        step_count=f.step_count,
        last_updated=_seconds(f.last_updated),
    )


def _decision(d: pb.Decision) -> dict[str, Any]:
    return {
        "step": d.step,
        "decision": d.decision,
        "rationale": d.rationale,
        "timestamp": _seconds(d.timestamp),
    }


def _error(e: pb.ErrorEntry) -> dict[str, Any]:
    return {
        "step": e.step,
        "error": e.error,
        "resolution": e.resolution,
        "pattern": e.pattern,
        "status": _ERROR_STATUS.get(e.status, "open"),
    }


def _insights(i: pb.InsightState) -> InsightState:
    return InsightState(
        decision_log=[_decision(d) for d in i.decision_log],
        error_journal=[_error(e) for e in i.error_journal],
        learned_constraints=list(i.learned_constraints),
        entity_relationships=[
            {"from": r.entity_a, "relation": r.relation, "to": r.entity_b}
            for r in i.entity_relationships
        ],
        pattern_observations=list(i.pattern_observations),
    )


class StateFileManager:
    """Three-layer externalized state in a stratad session (see the module docstring).

    ``base_path`` is accepted and ignored: the state lives in the daemon at
    ``address`` (default ``$STRATAD_ADDRESS`` or ``127.0.0.1:50051``), not in files.
    """

    def __init__(
        self,
        base_path: str = ".cortex_state",
        tenant_id: str = DEFAULT_TENANT,
        session_id: str = "",
        *,
        address: str | None = None,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.base_path = base_path  # ignored: see the class docstring
        self._tenant_id = tenant_id or DEFAULT_TENANT
        self._session_id = session_id or f"sess_{uuid.uuid4().hex[:12]}"
        self._initialized = False
        # address, token, tls: None = the STRATAD_* variables (stratad.sdk.connection).
        self._client = Client(
            address, tenant=self._tenant_id, token=token, tls=tls, timeout=timeout
        )
        self._stub = cognitive_pb2_grpc.CognitiveStateServiceStub(self._client.channel)

    # -- properties -----------------------------------------------------------

    @property
    def tenant_id(self) -> str:
        return self._tenant_id

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def is_initialized(self) -> bool:
        """Whether ``initialize()`` or a successful ``load()`` ran on this manager."""
        return self._initialized

    def close(self) -> None:
        """Close the connection to the daemon (the state stays there)."""
        self._client.close()

    def __enter__(self) -> StateFileManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------

    def _call(self, method: str, request: Any) -> Any:
        return self._client.call(getattr(self._stub, method), request)

    async def _acall(self, method: str, request: Any) -> Any:
        try:
            return await asyncio.to_thread(self._call, method, request)
        except NotFoundError:  # no session yet: corteX's "not initialized"
            raise FailedPreconditionError(
                f"session {self._session_id!r} has no cognitive state yet: call initialize() first"
            ) from None

    def _or_default(self, fn: Callable[[], T], default: Callable[[], T]) -> T:
        """`fn()`, or `default()` while the session has no cognitive state."""
        try:
            return fn()
        except (FailedPreconditionError, NotFoundError):
            return default()

    # -- updates (async, as in corteX) --------------------------------------------------

    async def initialize(
        self,
        goal: str,
        constraints: list[str] | None = None,
        success_criteria: list[str] | None = None,
        user_identity: dict[str, str] | None = None,
        project_context: str = "",
    ) -> None:
        """Set the crystallized (immutable) layer, creating the session if needed."""
        await asyncio.to_thread(self._ensure_session)
        request = pb.InitializeRequest(
            session_id=self._session_id,
            goal=goal,
            constraints=constraints or [],
            success_criteria=success_criteria or [],
            user_identity=user_identity or {},
            project_context=project_context,
        )
        await self._acall("Initialize", request)
        self._initialized = True

    def _ensure_session(self) -> None:
        with contextlib.suppress(AlreadyExistsError):
            self._client.create_session(self._session_id, labels={"stratad.compat": "cortex"})

    async def update_fluid(
        self,
        progress: float | None = None,
        current_sub_goal: str | None = None,
        sub_goals: list[dict[str, str]] | None = None,
        entities: dict[str, str] | None = None,
        questions: list[str] | None = None,
        brain_digest: dict[str, Any] | None = None,
        step_count: int | None = None,
    ) -> None:
        """Update the fluid layer: only the fields given; progress clamped to [0.0, 1.0]."""
        request = pb.UpdateFluidRequest(session_id=self._session_id)
        paths = []
        if progress is not None:
            request.progress = progress
            paths.append("progress")
        if current_sub_goal is not None:
            request.current_sub_goal = current_sub_goal
            paths.append("current_sub_goal")
        if sub_goals is not None:
            request.sub_goals.extend(
                pb.SubGoal(goal=g.get("goal", ""), status=g.get("status", "")) for g in sub_goals
            )
            paths.append("sub_goals")
        if entities is not None:
            request.entities.update(entities)
            paths.append("entities")
        if questions is not None:
            request.questions.extend(questions)
            paths.append("questions")
        if brain_digest is not None:
            fill_struct(request.brain_digest, brain_digest)
            paths.append("brain_digest")
        if step_count is not None:
            request.step_count = step_count
            paths.append("step_count")
        request.update_mask.CopyFrom(field_mask_pb2.FieldMask(paths=paths))
        await self._acall("UpdateFluid", request)

    async def record_decision(self, step: int, decision: str, rationale: str) -> None:
        """Append a decision to the insight layer's decision log."""
        request = pb.RecordDecisionRequest(
            session_id=self._session_id, step=step, decision=decision, rationale=rationale
        )
        await self._acall("RecordDecision", request)

    async def record_error(
        self, step: int, error: str, resolution: str = "", pattern: str = ""
    ) -> None:
        """Record an error: "resolved" if a resolution is given, "open" otherwise."""
        request = pb.RecordErrorRequest(
            session_id=self._session_id,
            step=step,
            error=error,
            resolution=resolution,
            pattern=pattern,
        )
        await self._acall("RecordError", request)

    async def resolve_error(self, step: int, resolution: str) -> bool:
        """Resolve the most recent open error at `step`; True if there was one."""
        request = pb.ResolveErrorRequest(
            session_id=self._session_id, step=step, resolution=resolution
        )
        return bool((await self._acall("ResolveError", request)).resolved)

    async def add_learned_constraint(self, constraint: str) -> None:
        """Append a learned constraint (deduplicated)."""
        request = pb.AddLearnedConstraintRequest(session_id=self._session_id, constraint=constraint)
        await self._acall("AddLearnedConstraint", request)

    async def add_entity_relationship(self, entity_a: str, relation: str, entity_b: str) -> None:
        """Record a relationship between two entities (deduplicated)."""
        request = pb.AddEntityRelationshipRequest(
            session_id=self._session_id, entity_a=entity_a, relation=relation, entity_b=entity_b
        )
        await self._acall("AddEntityRelationship", request)

    async def add_pattern_observation(self, pattern: str) -> None:
        """Record a pattern observation (deduplicated)."""
        request = pb.AddPatternObservationRequest(session_id=self._session_id, pattern=pattern)
        await self._acall("AddPatternObservation", request)

    async def load(self) -> bool:
        """True if the session holds (initialized) state, which this manager then uses."""
        try:
            await self._acall(
                "GetCognitiveStats", pb.GetCognitiveStatsRequest(session_id=self._session_id)
            )
        except FailedPreconditionError:
            return False
        self._initialized = True
        return True

    # -- reads (synchronous, as in corteX) ------------------------------------------------

    def _state(self) -> pb.CognitiveState:
        request = pb.GetCognitiveStateRequest(session_id=self._session_id)
        return self._call("GetCognitiveState", request).state  # type: ignore[no-any-return]

    def build_persistent_context(self, max_tokens: int = 2000) -> str:
        """The markdown context of all three layers for an LLM prompt, within max_tokens."""
        request = pb.BuildContextRequest(session_id=self._session_id, max_tokens=max_tokens)
        return self._or_default(lambda: str(self._call("BuildContext", request).context), str)

    def get_crystallized(self) -> CrystallizedState:
        return self._or_default(
            lambda: _crystallized(self._state().crystallized), CrystallizedState
        )

    def get_fluid(self) -> FluidState:
        return self._or_default(lambda: _fluid(self._state().fluid), FluidState)

    def get_insights(self) -> InsightState:
        return self._or_default(lambda: _insights(self._state().insights), InsightState)

    def get_decision_log(self) -> list[dict[str, Any]]:
        return self.get_insights().decision_log

    def get_error_journal(self) -> list[dict[str, Any]]:
        return self.get_insights().error_journal

    def get_open_errors(self) -> list[dict[str, Any]]:
        return [e for e in self.get_error_journal() if e["status"] == "open"]

    def get_stats(self) -> dict[str, Any]:
        """Keys: initialized, tenant_id, session_id, progress, decisions_count, errors_total,
        errors_open, learned_constraints, entity_relationships, active_entities,
        pattern_observations."""
        request = pb.GetCognitiveStatsRequest(session_id=self._session_id)

        def stats() -> dict[str, Any]:
            s = self._call("GetCognitiveStats", request)
            return {
                "initialized": s.initialized,
                "tenant_id": self._tenant_id,
                "session_id": s.session_id,
                "progress": s.progress,
                "decisions_count": s.decisions_count,
                "errors_total": s.errors_total,
                "errors_open": s.errors_open,
                "learned_constraints": s.learned_constraints,
                "entity_relationships": s.entity_relationships,
                "active_entities": s.active_entities,
                "pattern_observations": s.pattern_observations,
            }

        def empty() -> dict[str, Any]:
            counts = (
                "decisions_count", "errors_total", "errors_open", "learned_constraints",
                "entity_relationships", "active_entities", "pattern_observations",
            )  # fmt: skip
            return {
                "initialized": False,
                "tenant_id": self._tenant_id,
                "session_id": self._session_id,
                "progress": 0.0,
                **dict.fromkeys(counts, 0),
            }

        return self._or_default(stats, empty)
