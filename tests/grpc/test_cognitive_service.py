"""CognitiveStateService over gRPC: every RPC with good and bad input, tenancy, events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import field_mask_pb2

from stratad.api.v1 import checkpoint_pb2, cognitive_pb2_grpc, session_pb2
from stratad.api.v1 import cognitive_pb2 as pb

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
S = "sess_001"

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


class Cog:
    """The stub plus the API helper: `cog.Initialize(request)` calls with tenant and deadline."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.stub = cognitive_pb2_grpc.CognitiveStateServiceStub(api.channel)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.stub, name)
        return lambda request: self.api.call(method, request)

    def method(self, name: str) -> Any:
        return getattr(self.stub, name)


@pytest.fixture
def cog(api: Api) -> Cog:
    api.create(S)
    return Cog(api)


def initialize(cog: Cog, session_id: str = S) -> pb.InitializeResponse:
    return cog.Initialize(  # type: ignore[no-any-return]
        pb.InitializeRequest(
            session_id=session_id,
            goal="Build a REST API",
            constraints=["Must use PostgreSQL"],
            success_criteria=["All endpoints return JSON"],
        )
    )


def seed_state(cog: Cog) -> None:
    initialize(cog)
    cog.UpdateFluid(
        pb.UpdateFluidRequest(
            session_id=S, progress=0.45, current_sub_goal="Implementing user endpoints"
        )
    )
    cog.RecordDecision(
        pb.RecordDecisionRequest(
            session_id=S, step=3, decision="Chose FastAPI", rationale="lightweight, async support"
        )
    )
    cog.RecordError(
        pb.RecordErrorRequest(session_id=S, step=7, error="Connection refused on port 5432")
    )


#: One valid request per RPC other than Initialize (session S).
def other_requests(session_id: str = S) -> list[tuple[str, Any]]:
    return [
        ("UpdateFluid", pb.UpdateFluidRequest(session_id=session_id, progress=0.5)),
        ("RecordDecision", pb.RecordDecisionRequest(session_id=session_id, step=1, decision="d")),
        ("RecordError", pb.RecordErrorRequest(session_id=session_id, step=1, error="e")),
        ("ResolveError", pb.ResolveErrorRequest(session_id=session_id, step=1, resolution="r")),
        (
            "AddLearnedConstraint",
            pb.AddLearnedConstraintRequest(session_id=session_id, constraint="c"),
        ),
        (
            "AddEntityRelationship",
            pb.AddEntityRelationshipRequest(
                session_id=session_id, entity_a="a", relation="r", entity_b="b"
            ),
        ),
        (
            "AddPatternObservation",
            pb.AddPatternObservationRequest(session_id=session_id, pattern="p"),
        ),
        ("GetCognitiveState", pb.GetCognitiveStateRequest(session_id=session_id)),
        ("BuildContext", pb.BuildContextRequest(session_id=session_id)),
        ("GetCognitiveStats", pb.GetCognitiveStatsRequest(session_id=session_id)),
    ]


def all_requests(session_id: str) -> list[tuple[str, Any]]:
    init = pb.InitializeRequest(session_id=session_id, goal="g")
    return [("Initialize", init), *other_requests(session_id)]


# -- Initialize --------------------------------------------------------------------------------


def test_initialize_then_already_exists(api: Api, cog: Cog) -> None:
    response = initialize(cog)
    assert response.version == 2
    c = response.crystallized
    assert (c.goal, list(c.constraints), list(c.success_criteria)) == (
        "Build a REST API", ["Must use PostgreSQL"], ["All endpoints return JSON"],
    )  # fmt: skip
    assert c.created_at.seconds > 0
    api.fails(
        cog.method("Initialize"), pb.InitializeRequest(session_id=S, goal="again"),
        grpc.StatusCode.ALREADY_EXISTS, "immutable", keeps=S,
    )  # fmt: skip
    state = cog.GetCognitiveState(pb.GetCognitiveStateRequest(session_id=S)).state
    assert state.crystallized == c


@pytest.mark.parametrize(("name", "request_"), other_requests())
def test_every_other_rpc_before_initialize_is_failed_precondition(
    api: Api, cog: Cog, name: str, request_: Any
) -> None:
    api.fails(cog.method(name), request_, PRECONDITION, "Initialize", keeps=S)


@pytest.mark.parametrize(("name", "request_"), all_requests("nope"))
def test_unknown_session_is_not_found(api: Api, cog: Cog, name: str, request_: Any) -> None:
    api.fails(cog.method(name), request_, NOT_FOUND, "nope")


@pytest.mark.parametrize(("name", "request_"), all_requests(S))
def test_another_tenants_session_is_not_found(api: Api, cog: Cog, name: str, request_: Any) -> None:
    initialize(cog)
    api.as_tenant("intruder").fails(cog.method(name), request_, NOT_FOUND, S)


@pytest.mark.parametrize(("name", "request_"), all_requests("../etc"))
def test_a_bad_session_id_is_invalid(api: Api, cog: Cog, name: str, request_: Any) -> None:
    api.fails(cog.method(name), request_, INVALID, "session_id")


BAD_REQUESTS: list[tuple[str, Any, str]] = [
    ("Initialize", pb.InitializeRequest(session_id=S), "goal is required"),
    (
        "Initialize",
        pb.InitializeRequest(session_id=S, goal="g", user_identity={"": "x"}),
        "user_identity",
    ),
    ("Initialize", pb.InitializeRequest(session_id=S, goal="x" * 70000), "longer"),
    ("UpdateFluid", pb.UpdateFluidRequest(session_id=S, progress=float("nan")), "finite"),
    ("UpdateFluid", pb.UpdateFluidRequest(session_id=S, step_count=-1), "step_count"),
    (
        "UpdateFluid",
        pb.UpdateFluidRequest(session_id=S, update_mask=field_mask_pb2.FieldMask(paths=["mood"])),
        "update_mask",
    ),
    ("RecordDecision", pb.RecordDecisionRequest(session_id=S, step=1), "decision is required"),
    ("RecordDecision", pb.RecordDecisionRequest(session_id=S, step=-1, decision="d"), "step"),
    ("RecordError", pb.RecordErrorRequest(session_id=S, step=1), "error is required"),
    ("ResolveError", pb.ResolveErrorRequest(session_id=S, step=1), "resolution is required"),
    ("AddLearnedConstraint", pb.AddLearnedConstraintRequest(session_id=S), "constraint"),
    (
        "AddEntityRelationship",
        pb.AddEntityRelationshipRequest(session_id=S, entity_a="a", entity_b="b"),
        "relation",
    ),
    (
        "AddPatternObservation",
        pb.AddPatternObservationRequest(session_id=S, pattern=" "),
        "pattern",
    ),
    ("BuildContext", pb.BuildContextRequest(session_id=S, max_tokens=-5), "max_tokens"),
]


@pytest.mark.parametrize(("name", "request_", "words"), BAD_REQUESTS)
def test_bad_input_is_invalid_argument_and_changes_nothing(
    api: Api, cog: Cog, name: str, request_: Any, words: str
) -> None:
    if name != "Initialize":
        initialize(cog)
    api.fails(cog.method(name), request_, INVALID, words, keeps=S)


def test_expected_version_conflicts_are_aborted(api: Api, cog: Cog) -> None:
    initialize(cog)
    request = pb.RecordDecisionRequest(session_id=S, step=1, decision="d", expected_version=9)
    api.fails(cog.method("RecordDecision"), request, grpc.StatusCode.ABORTED, "version", keeps=S)
    request.expected_version = 2
    assert cog.RecordDecision(request).version == 3


# -- the layers ------------------------------------------------------------------------------


def test_update_fluid_presence_and_update_mask(cog: Cog) -> None:
    initialize(cog)
    fluid = cog.UpdateFluid(
        pb.UpdateFluidRequest(
            session_id=S,
            progress=1.7,
            sub_goals=[pb.SubGoal(goal="model", status="done")],
            entities={"User": "Main entity"},
            questions=["which db?"],
            step_count=3,
        )
    ).fluid
    assert fluid.progress == 1.0 and fluid.step_count == 3
    fluid.brain_state_digest.update({"focus": "api"})
    # progress 0.0 is a value (proto3 optional): it is applied, the rest is kept
    request = pb.UpdateFluidRequest(session_id=S, progress=0.0)
    request.brain_digest.update({"focus": "api"})
    after = cog.UpdateFluid(request).fluid
    assert after.progress == 0.0
    assert list(after.open_questions) == ["which db?"]
    assert dict(after.active_entities) == {"User": "Main entity"}
    assert after.brain_state_digest == fluid.brain_state_digest
    assert after.last_updated.ToNanoseconds() >= fluid.last_updated.ToNanoseconds()
    # an empty list only changes when the mask names it
    cleared = cog.UpdateFluid(
        pb.UpdateFluidRequest(
            session_id=S, update_mask=field_mask_pb2.FieldMask(paths=["questions", "entities"])
        )
    ).fluid
    assert list(cleared.open_questions) == [] and dict(cleared.active_entities) == {}
    assert [g.goal for g in cleared.sub_goals] == ["model"]


def test_insights_round_trip_and_dedup(api: Api, cog: Cog) -> None:
    seed_state(cog)
    cog.RecordError(pb.RecordErrorRequest(session_id=S, step=7, error="again", pattern="conn"))
    resolved = cog.ResolveError(pb.ResolveErrorRequest(session_id=S, step=7, resolution="restart"))
    assert resolved.resolved
    before = api.get(S).version
    nothing = cog.ResolveError(pb.ResolveErrorRequest(session_id=S, step=99, resolution="x"))
    assert (nothing.resolved, nothing.version) == (False, before)
    add = pb.AddLearnedConstraintRequest(session_id=S, constraint="No ORM")
    assert cog.AddLearnedConstraint(add).added
    assert not cog.AddLearnedConstraint(add).added
    rel = pb.AddEntityRelationshipRequest(
        session_id=S, entity_a="User", relation="in", entity_b="DB"
    )
    assert cog.AddEntityRelationship(rel).added
    assert not cog.AddEntityRelationship(rel).added
    pat = pb.AddPatternObservationRequest(session_id=S, pattern="p")
    assert cog.AddPatternObservation(pat).added
    assert not cog.AddPatternObservation(pat).added
    assert api.get(S).version == before + 3
    insights = cog.GetCognitiveState(pb.GetCognitiveStateRequest(session_id=S)).state.insights
    assert [(d.step, d.decision, d.rationale) for d in insights.decision_log] == [
        (3, "Chose FastAPI", "lightweight, async support")
    ]
    assert insights.decision_log[0].timestamp.seconds > 0
    assert [
        (e.step, e.error, e.status, e.resolution, e.pattern) for e in insights.error_journal
    ] == [
        (7, "Connection refused on port 5432", pb.ERROR_STATUS_OPEN, "", ""),
        (7, "again", pb.ERROR_STATUS_RESOLVED, "restart", "conn"),
    ]
    assert list(insights.learned_constraints) == ["No ORM"]
    assert [(r.entity_a, r.relation, r.entity_b) for r in insights.entity_relationships] == [
        ("User", "in", "DB")
    ]
    assert list(insights.pattern_observations) == ["p"]


def test_build_context_and_stats(cog: Cog) -> None:
    seed_state(cog)
    built = cog.BuildContext(pb.BuildContextRequest(session_id=S))
    assert built.context == SEED_CONTEXT
    assert (built.truncated, built.omitted_items) == (False, 0)
    assert built.estimated_tokens == (len(SEED_CONTEXT) + 3) // 4
    small = cog.BuildContext(pb.BuildContextRequest(session_id=S, max_tokens=20))
    assert small.truncated and small.estimated_tokens <= 20 and small.omitted_items > 0
    assert small.context.startswith("## Goal\nBuild a REST API")
    stats = cog.GetCognitiveStats(pb.GetCognitiveStatsRequest(session_id=S))
    assert stats == pb.GetCognitiveStatsResponse(
        initialized=True, tenant_id="default", session_id=S, progress=0.45, decisions_count=1,
        errors_total=1, errors_open=1,
    )  # fmt: skip


# -- events and checkpoints ------------------------------------------------------------------


def test_watch_session_reports_cognitive_mutations(api: Api, cog: Cog) -> None:
    initialize(cog)
    cog.RecordDecision(pb.RecordDecisionRequest(session_id=S, step=1, decision="d"))
    request = session_pb2.WatchSessionRequest(session_id=S, from_version=1)
    stream = api.sessions.WatchSession(request, timeout=10, metadata=api.metadata)
    got = []
    for response in stream:
        got.append((response.event.version, response.event.kind))
        if len(got) == 2:  # replayed; the watch is live from here on
            cog.UpdateFluid(pb.UpdateFluidRequest(session_id=S, progress=0.1))
        if len(got) == 3:
            break
    stream.cancel()
    assert got == [(2, "cognitive.init"), (3, "cognitive.decision"), (4, "cognitive.fluid")]


def test_checkpoints_capture_and_restore_cognitive_state(api: Api, cog: Cog) -> None:
    seed_state(cog)
    saved = api.save(S, b"opaque agent state")
    named = api.call(
        api.checkpoints.CreateCheckpoint,
        checkpoint_pb2.CreateCheckpointRequest(session_id=S, name="before-refactor"),
    ).checkpoint
    cog.RecordDecision(pb.RecordDecisionRequest(session_id=S, step=9, decision="later"))
    cog.UpdateFluid(pb.UpdateFluidRequest(session_id=S, progress=0.9))
    restore = checkpoint_pb2.RestoreCheckpointRequest(
        checkpoint_id=saved.checkpoint_id, make_current=True
    )
    assert api.call(api.checkpoints.RestoreCheckpoint, restore).state.data == b"opaque agent state"
    assert cog.BuildContext(pb.BuildContextRequest(session_id=S)).context == SEED_CONTEXT
    fork = api.call(
        api.checkpoints.ForkSession,
        checkpoint_pb2.ForkSessionRequest(checkpoint_id=named.checkpoint_id, new_session_id="fork"),
    ).session
    assert cog.BuildContext(pb.BuildContextRequest(session_id=fork.session_id)).context == (
        SEED_CONTEXT
    )
