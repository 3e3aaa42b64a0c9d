"""CrystalService over gRPC against the real in-process server: every RPC's good
and bad input, status codes, tenancy and paging (fixtures in tests/grpc/conftest.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest

from stratad.api.v1 import crystal_pb2 as pb
from stratad.api.v1 import crystal_pb2_grpc

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND

#: The execution trace of corteX's MemoryCrystallizer example.
SEED_TRACE = [
    pb.TraceStep(decision="Read config", tool="file_read"),
    pb.TraceStep(decision="Validate schema", tool="code_interpreter"),
    pb.TraceStep(
        decision="Deploy", tool="shell", error="Timeout", resolution="Increased timeout to 60s"
    ),
]


class Crystals:
    """The CrystalService stub of an `Api`, with shortcuts."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.stub = crystal_pb2_grpc.CrystalServiceStub(api.channel)

    def as_tenant(self, tenant: str) -> Crystals:
        return Crystals(self.api.as_tenant(tenant))

    def call(self, rpc: str, **fields: Any) -> Any:
        method = getattr(self.stub, rpc)
        request = getattr(pb, f"{rpc}Request")(**fields)
        return self.api.call(method, request)

    def fails(self, rpc: str, code: grpc.StatusCode, *words: str, **fields: Any) -> str:
        method = getattr(self.stub, rpc)
        request = getattr(pb, f"{rpc}Request")(**fields)
        return self.api.fails(method, request, code, *words)

    def crystallize(self, goal: str, tools: tuple[str, ...] = ("t",), **fields: Any) -> Any:
        trace = fields.pop("execution_trace", [pb.TraceStep(decision="d", tool=t) for t in tools])
        fields.setdefault("success_score", 0.9)
        return self.call("Crystallize", goal=goal, execution_trace=trace, **fields)


@pytest.fixture
def crystals(api: Api) -> Crystals:
    return Crystals(api)


def test_seed_flow(crystals: Crystals) -> None:
    created = crystals.call(
        "Crystallize",
        goal="Deploy app.py to https://prod.example.com",
        execution_trace=SEED_TRACE,
        success_score=0.9,
        session_id="sess_001",
    )
    assert created.outcome == pb.CRYSTALLIZE_OUTCOME_CREATED
    assert created.min_success_score == 0.7
    c = created.crystal
    assert c.crystal_id.startswith("crystal_sess_001_")
    assert c.goal_template == "Deploy {file_path} to {url}"
    assert list(c.decision_chain) == ["Read config", "Validate schema", "Deploy"]
    assert list(c.tool_sequence) == ["file_read", "code_interpreter", "shell"]
    assert [(p.error, p.resolution) for p in c.error_patterns] == [
        ("Timeout", "Increased timeout to 60s")
    ]
    assert list(c.entity_types) == ["python_file", "url"]
    assert (c.success_score, c.effectiveness, c.reuse_count) == (0.9, 0.9, 0)
    assert c.created_from == "sess_001" and c.created_at.seconds > 0

    found = crystals.call("QueryCrystals", goal_text="Deploy server.py to staging")
    assert found.goal_template == "Deploy {file_path} to staging"
    assert len(found.matches) == 1
    match = found.matches[0]
    assert match.crystal == c
    assert match.similarity == 0.6
    assert match.score == pytest.approx(0.6 * 0.95)

    prompt = crystals.call("ApplyCrystal", crystal_id=c.crystal_id, context="now").prompt
    assert prompt == (
        "## Similar Past Success (90% effective, used 0x)\n"
        "Goal pattern: Deploy {file_path} to {url}\n"
        "Approach: Read config -> Validate schema -> Deploy\n"
        "Tools used: file_read, code_interpreter, shell\n"
        "Known pitfalls:\n"
        "  - Timeout: Increased timeout to 60s"
    )
    reused = crystals.call("RecordReuse", crystal_id=c.crystal_id, success=True).crystal
    assert (reused.reuse_count, reused.effectiveness) == (1, pytest.approx(0.95))
    assert crystals.call("GetCrystal", crystal_id=c.crystal_id).crystal == reused

    stats = crystals.call("GetCrystalStats")
    assert (stats.total_crystals, stats.effective_crystals, stats.total_reuses) == (1, 1, 1)
    assert stats.avg_effectiveness == pytest.approx(0.95)
    assert stats.max_crystals == 200 and stats.memory_bytes > 0 and stats.journal_bytes > 0

    crystals.call("DeleteCrystal", crystal_id=c.crystal_id)
    crystals.fails("GetCrystal", NOT_FOUND, c.crystal_id, crystal_id=c.crystal_id)
    assert crystals.call("GetCrystalStats").total_crystals == 0


def test_outcomes(crystals: Crystals) -> None:
    low = crystals.crystallize("Deploy app.py", success_score=0.5)
    assert low.outcome == pb.CRYSTALLIZE_OUTCOME_BELOW_THRESHOLD
    assert not low.HasField("crystal")
    first = crystals.crystallize("Deploy app.py", ("shell", "file_read"))
    assert first.outcome == pb.CRYSTALLIZE_OUTCOME_CREATED
    again = crystals.crystallize("Deploy main.py", ("file_read", "shell"))
    assert again.outcome == pb.CRYSTALLIZE_OUTCOME_NOT_NOVEL
    assert again.similar_crystal_id == first.crystal.crystal_id
    assert (again.goal_similarity, again.tool_similarity) == (1.0, 1.0)
    # Per-call minimum (an explicit 0.0 is not "unset").
    zero = crystals.crystallize("Anything at all", success_score=0.0, min_success_score=0.0)
    assert zero.outcome == pb.CRYSTALLIZE_OUTCOME_CREATED
    assert zero.min_success_score == 0.0


def test_library_config_and_eviction(crystals: Crystals) -> None:
    assert crystals.call("GetCrystalLibraryConfig").config == pb.CrystalLibraryConfig(
        max_crystals=200, min_success_score=0.7
    )
    ids = [
        crystals.crystallize(
            f"goal number{i}", (f"t{i}",), success_score=0.7 + 0.05 * i
        ).crystal.crystal_id
        for i in range(4)
    ]
    changed = crystals.call("SetCrystalLibraryConfig", max_crystals=2)
    assert changed.config.max_crystals == 2 and changed.config.min_success_score == 0.7
    assert changed.evicted_count == 2
    listed = crystals.call("ListCrystals").crystals
    assert [c.crystal_id for c in listed] == ids[2:]
    made = crystals.crystallize("goal number9", ("t9",), success_score=0.99)
    assert list(made.evicted_crystal_ids) == [ids[2]]
    only_score = crystals.call("SetCrystalLibraryConfig", min_success_score=0.5)
    assert only_score.config == pb.CrystalLibraryConfig(max_crystals=2, min_success_score=0.5)


def test_query_ranking_and_top_k(crystals: Crystals) -> None:
    for i in range(6):
        crystals.crystallize(f"alpha beta w{i}", (f"t{i}",), success_score=0.7 + 0.05 * i)
    found = crystals.call("QueryCrystals", goal_text="alpha beta w0")
    assert len(found.matches) == 3  # default top_k
    scores = [m.score for m in found.matches]
    assert scores == sorted(scores, reverse=True)
    assert found.matches[0].crystal.goal_template == "alpha beta w0"
    for m in found.matches:
        assert m.score == pytest.approx(m.similarity * (0.5 + 0.5 * m.crystal.effectiveness))
    assert len(crystals.call("QueryCrystals", goal_text="alpha", top_k=10).matches) == 6
    assert crystals.call("QueryCrystals", goal_text="").matches == []


def test_paging(crystals: Crystals) -> None:
    ids = [crystals.crystallize(f"page goal{i}", (f"t{i}",)).crystal.crystal_id for i in range(5)]
    first = crystals.call("ListCrystals", page_size=2)
    assert [c.crystal_id for c in first.crystals] == ids[:2] and first.next_page_token
    second = crystals.call("ListCrystals", page_size=2, page_token=first.next_page_token)
    assert [c.crystal_id for c in second.crystals] == ids[2:4]
    third = crystals.call("ListCrystals", page_size=2, page_token=second.next_page_token)
    assert [c.crystal_id for c in third.crystals] == ids[4:] and third.next_page_token == ""


def test_tenants_are_isolated(crystals: Crystals) -> None:
    other = crystals.as_tenant("t2")
    c = crystals.crystallize("Private goal").crystal
    other.fails("GetCrystal", NOT_FOUND, crystal_id=c.crystal_id)
    other.fails("ApplyCrystal", NOT_FOUND, crystal_id=c.crystal_id)
    other.fails("RecordReuse", NOT_FOUND, crystal_id=c.crystal_id)
    other.fails("DeleteCrystal", NOT_FOUND, crystal_id=c.crystal_id)
    assert other.call("QueryCrystals", goal_text="Private goal").matches == []
    assert other.call("ListCrystals").crystals == []
    assert other.call("GetCrystalStats").total_crystals == 0
    other.call("SetCrystalLibraryConfig", max_crystals=7)
    assert crystals.call("GetCrystalLibraryConfig").config.max_crystals == 200
    crystals.as_tenant("bad tenant").fails("GetCrystalStats", INVALID, "tenant")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"goal": ""}, ("goal",)),
        ({"goal": "x" * 8193}, ("goal",)),
        ({"success_score": 1.5}, ("success_score",)),
        ({"success_score": -1.0}, ("success_score",)),
        ({"success_score": float("nan")}, ("success_score",)),
        ({"session_id": "no spaces"}, ("session_id",)),
        ({"min_success_score": 7.0}, ("min_success_score",)),
        ({"execution_trace": [pb.TraceStep(tool="t" * 8193)]}, ("tool",)),
    ],
)
def test_crystallize_bad_input(
    crystals: Crystals, fields: dict[str, Any], words: tuple[str, ...]
) -> None:
    request = {"goal": "ok goal", "success_score": 0.9, **fields}
    crystals.fails("Crystallize", INVALID, *words, **request)
    assert crystals.call("GetCrystalStats").total_crystals == 0


def test_bad_input_on_every_rpc(crystals: Crystals) -> None:
    crystals.crystallize("something stored")
    for bad_id in ("", "has space", "../etc", "x" * 200):
        for rpc in ("ApplyCrystal", "RecordReuse", "GetCrystal", "DeleteCrystal"):
            crystals.fails(rpc, INVALID, "crystal_id", crystal_id=bad_id)
    for rpc in ("ApplyCrystal", "RecordReuse", "GetCrystal", "DeleteCrystal"):
        crystals.fails(rpc, NOT_FOUND, "crystal_nope", crystal_id="crystal_nope")
    crystals.fails("QueryCrystals", INVALID, "top_k", goal_text="x", top_k=-1)
    crystals.fails("QueryCrystals", INVALID, "top_k", goal_text="x", top_k=5000)
    crystals.fails("QueryCrystals", INVALID, "goal_text", goal_text="x" * 9000)
    crystals.fails("ListCrystals", INVALID, "page_size", page_size=-5)
    crystals.fails("ListCrystals", INVALID, "page_token", page_token="forged")
    crystals.fails("SetCrystalLibraryConfig", INVALID, "max_crystals", max_crystals=0)
    crystals.fails("SetCrystalLibraryConfig", INVALID, "max_crystals", max_crystals=20_000_000)
    crystals.fails("SetCrystalLibraryConfig", INVALID, "min_success_score", min_success_score=-1)
    crystals.fails("ApplyCrystal", INVALID, "context", crystal_id="c", context="x" * (1 << 21))
    # Nothing changed, and the daemon still answers.
    assert crystals.call("GetCrystalStats").total_crystals == 1
    assert crystals.call("GetCrystalLibraryConfig").config.max_crystals == 200
