"""The typed structured facets: each facet's `parse`, and ReplaceStructuredState's check.

- What the domain API writes (every record kind, at its bounds: clamped progress,
  the 10 insights, 5 thoughts, 20 facts and 100 completed calls Cogency keeps,
  a global list one level deeper than a request's value) parses, as the live
  state holds it and as GetStructuredState returns it; parse returns it as is.
- A wrong type, a missing or unknown key, an out-of-range value is refused with
  INVALID_ARGUMENT whose message starts with the field path, also given as
  ``metadata["field"]``.
- `check_servable` names the facet and the field; a state that passes it is one
  every reader serves and every facet update applies to (the old check ran the
  readers only, so a replaced ``learned_constraints: "abc"`` passed and broke
  the next AddLearnedConstraint after journaling it).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stratad.domain import agent, cognitive, profiles, tasks
from stratad.domain import structured as st
from stratad.domain.engine import Engine
from stratad.domain.tasks import GlobalMode, TaskStatus
from stratad.errors import InvalidArgumentError
from stratad.server.servicers import agent as agent_servicer
from stratad.server.servicers import cognitive as cognitive_servicer
from stratad.server.servicers import profile as profile_servicer
from stratad.server.servicers import task as task_servicer
from stratad.server.servicers.structured import PARSERS, check_servable

T = "default"
S = "full"
DELETE = object()


@contextlib.contextmanager
def open_engine(data_dir: Path) -> Iterator[Engine]:
    engine = Engine(data_dir, durability="none")
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


def deep(levels: int) -> Any:
    """An object nested `levels` levels deep."""
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def fill(engine: Engine, session_id: str = S) -> None:
    """Every record kind of the three session facets, at their bounds."""
    engine.sessions.create(T, session_id)
    c = engine.cognitive
    c.initialize(
        T, session_id, goal="Build a REST API", constraints=["PostgreSQL"],
        success_criteria=["JSON"], user_identity={"name": "Ada"}, project_context="p",
    )  # fmt: skip
    c.update_fluid(
        T, session_id,
        {"progress": 7, "current_sub_goal": "users", "sub_goals": [{"goal": "g", "status": "s"}],
         "entities": {"User": "an entity"}, "questions": ["why?"], "brain_digest": deep(32),
         "step_count": 3},
    )  # fmt: skip
    c.update_fluid(T, session_id, {"progress": -1.0})  # clamped to 0
    c.record_decision(T, session_id, step=0, decision="Chose FastAPI")
    c.record_decision(T, session_id, step=2**62, decision="é ✓ 漢字", rationale="async")
    c.record_error(T, session_id, step=1, error="refused")
    c.record_error(T, session_id, step=2, error="slow", resolution="cache", pattern="perf")
    c.resolve_error(T, session_id, step=1, resolution="started it")
    c.add_learned_constraint(T, session_id, "port 5432 needs the service")
    c.add_entity_relationship(T, session_id, "User", "stored_in", "PostgreSQL")
    c.add_pattern_observation(T, session_id, "errors precede startup")

    t = engine.tasks
    t.update_status(T, session_id, "t1", TaskStatus.IN_PROGRESS)
    t.store_result(T, session_id, "t1", {"rows": 1200, "file": "out/a.csv"})
    t.update_status(T, session_id, "t1", TaskStatus.COMPLETED)
    t.store_result(T, session_id, "t2", deep(32))  # created by its result: no status
    t.update_global(T, session_id, "paths", deep(32), mode=GlobalMode.APPEND)
    t.update_global(T, session_id, "paths", "b.csv", mode=GlobalMode.APPEND)
    t.update_global(T, session_id, "ctx", {"model": "x"}, mode=GlobalMode.MERGE)
    t.update_global(T, session_id, "none", None)

    a = engine.agents
    a.start(
        T, session_id, query="Q3 revenue?", user_id="alice",
        max_iterations=agent.MAX_ITERATIONS_LIMIT, mode="fast",
    )  # fmt: skip
    a.apply_reasoning(
        T, session_id, thinking="look it up", goal="revenue", strategy="search",
        tool_calls=[{"name": "search", "args": {"q": deep(30)}, "id": "c1"}, {"name": "calc"}],
        insights=[f"i{n}" for n in range(12)], facts=[(f"k{n}", {"v": n}) for n in range(22)],
    )  # fmt: skip
    for n in range(6):
        a.apply_reasoning(
            T, session_id, thinking=f"thought {n}", record_only=True,
            tool_calls=[{"name": "plan", "args": {"n": n}}],
        )  # fmt: skip
    a.record_tool_results(T, session_id, [{"n": n} for n in range(101)])
    a.advance_iteration(T, session_id)
    long_name = "x" * 70_000  # a tool's name is bounded only by the request's 1 MiB
    a.apply_reasoning(T, session_id, tool_calls=[{"name": long_name, "id": 7}], response="")
    a.stop(T, session_id, "enough")


def exported(engine: Engine, session_id: str = S) -> dict[str, Any]:
    """GetStructuredState's JSON, decoded."""
    document: dict[str, Any] = json.loads(st.current_json(engine.sessions, T, session_id).result)
    return document


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with open_engine(tmp_path) as engine:
        fill(engine)
        yield engine


# -- what the facets' own RPCs write parses ----------------------------------------------


def test_the_domain_api_writes_facets_that_parse_unchanged(engine: Engine) -> None:
    live = engine.sessions.live(T, S).state.structured
    document = exported(engine)
    assert set(document) == set(PARSERS) == set(st.FACETS)
    for facet, parse in PARSERS.items():
        assert parse(live[facet]) is live[facet]  # checked in place, not rebuilt
        before = copy.deepcopy(document[facet])
        assert parse(document[facet]) == before
    # The bounds the facets keep are reached, and still parse.
    reasoning = live["agent"]["reasoning"]
    assert len(reasoning["insights"]) == agent.MAX_INSIGHTS
    assert len(reasoning["thoughts"]) == agent.MAX_THOUGHTS
    assert len(reasoning["facts"]) == agent.MAX_FACTS
    assert len(live["agent"]["execution"]["completed_calls"]) == agent.MAX_COMPLETED_CALLS
    assert live["cognitive"]["fluid"]["progress"] == 0.0
    check_servable(S, document)


def test_a_reopened_engine_replays_facets_that_parse(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        fill(engine)
        before = exported(engine)
    with open_engine(tmp_path) as engine:
        after = exported(engine)
        assert after == before
        for facet, parse in PARSERS.items():
            parse(engine.sessions.live(T, S).state.structured[facet])


def test_a_replaced_state_that_parses_is_served_and_updated(engine: Engine) -> None:
    """Through ReplaceStructuredState's path: parse, replace, then every reader and
    every facet update on the copy."""
    document = exported(engine)
    check_servable("copy", document)
    engine.sessions.create(T, "copy")
    st.replace_whole(engine.sessions, T, "copy", document)
    assert exported(engine, "copy") == exported(engine)

    cog = engine.cognitive.state(T, "copy").result
    cognitive_servicer.state_to_pb(cog)
    assert engine.cognitive.stats(T, "copy").result["decisions_count"] == 2
    assert "## Goal\nBuild a REST API" in engine.cognitive.build_context(T, "copy").result.text
    for task_id, task in engine.tasks.list_tasks(T, "copy").result:
        task_servicer.task_to_pb(task_id, task, with_result=True)
    assert engine.tasks.get_global(T, "copy", "paths").result[1] == "b.csv"
    agent_servicer.state_to_pb(engine.agents.state(T, "copy").result)
    assert engine.agents.compress(T, "copy").result[0].startswith("GOAL: revenue")

    engine.cognitive.record_decision(T, "copy", step=9, decision="more")
    assert engine.cognitive.add_learned_constraint(T, "copy", "another").result
    engine.cognitive.update_fluid(T, "copy", {"progress": 0.5})
    engine.tasks.update_status(T, "copy", "t3", TaskStatus.PENDING)
    engine.tasks.update_global(T, "copy", "paths", "c.csv", mode=GlobalMode.APPEND)
    engine.agents.apply_reasoning(T, "copy", thinking="again", facts=[("k99", 1)])
    for facet, parse in PARSERS.items():
        parse(exported(engine, "copy")[facet])


def test_profiles_the_domain_writes_parse(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        p = engine.profiles
        for n in range(12):  # past every bound
            profile, _ = p.update(
                T, "alice",
                {"preferences": {f"p{n}": {"deep": deep(30)}}, "goals": [f"g{n}"],
                 "expertise": [f"e{n}", f"e{n}b"], "communication_style": "terse",
                 "project_context": {f"proj{n}": "about it"}, "success_pattern": f"s{n}",
                 "failure_pattern": f"f{n}", "interests": [f"i{n}", f"j{n}"],
                 "constraints": [f"c{n}"]},
                synthesized=n % 2 == 0,
            )  # fmt: skip
        assert profiles.parse(profile) is profile
        assert profiles.parse(json.loads(json.dumps(profile))) == profile
        profile_servicer.profile_to_pb(profile)
        assert len(profile["goals"]) == profiles.MAX_GOALS
    with open_engine(tmp_path) as engine:
        replayed = engine.profiles.get(T, "alice")
        assert profiles.parse(replayed) == profile


# -- what does not parse, and the field path that says why ---------------------------------


def changed(document: Any, keys: tuple[Any, ...], value: Any) -> Any:
    """A copy of `document` with the value at `keys` replaced (or deleted: DELETE)."""
    if not keys:
        return value
    out = copy.deepcopy(document)
    target = out
    for k in keys[:-1]:
        target = target[k]
    if value is DELETE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return out


def case(keys: tuple[Any, ...], value: Any, field: str, problem: str) -> Any:
    """The valid document with `value` at `keys`: refused as `field`, the message
    ``<field>: <problem>`` (`problem` may be the start of it)."""
    return pytest.param(keys, value, field, problem, id=f"{field}={problem[:30]}")


A_TASK = {"status": "pending", "created_at": 1.0, "updated_at": 1.0}
COGNITIVE = [
    case(
        ("fluid", "progress"),
        "x",
        "cognitive.fluid.progress",
        "expected a number between 0 and 1, got 'x'",
    ),
    case(
        ("fluid", "progress"),
        1.5,
        "cognitive.fluid.progress",
        "expected a number between 0 and 1, got 1.5",
    ),
    case(
        ("fluid", "progress"),
        True,
        "cognitive.fluid.progress",
        "expected a number between 0 and 1, got true",
    ),
    case(
        ("fluid", "progress"),
        float("nan"),
        "cognitive.fluid.progress",
        "expected a number between 0 and 1, got nan",
    ),
    case(("crystallized", "goal"), DELETE, "cognitive.crystallized.goal", "required but missing"),
    case(("fluid", "bogus"), 1, "cognitive.fluid", "unknown key 'bogus'"),
    case((), [], "cognitive", "expected an object, got a list"),
    case(("insights",), DELETE, "cognitive.insights", "required but missing"),
    case(
        ("insights", "decision_log", 0, "step"),
        -1,
        "cognitive.insights.decision_log[0].step",
        "expected an integer of at least 0, got -1",
    ),
    case(
        ("insights", "decision_log", 0, "step"),
        1.0,
        "cognitive.insights.decision_log[0].step",
        "expected an integer of at least 0, got 1.0",
    ),
    case(
        ("insights", "decision_log", 1, "step"),
        2**63,
        "cognitive.insights.decision_log[1].step",
        "expected an integer of at least 0, got 9223372036854775808",
    ),
    case(
        ("insights", "decision_log"),
        {},
        "cognitive.insights.decision_log",
        "expected a list, got an object",
    ),
    case(
        ("insights", "decision_log", 0, "decision"),
        "\ud800",
        "cognitive.insights.decision_log[0].decision",
        "expected a string, got '\\ud800'",
    ),
    case(
        ("insights", "decision_log", 0, "decision"),
        "x" * 70_000,
        "cognitive.insights.decision_log[0].decision",
        "longer than 65536 characters",
    ),
    case(
        ("insights", "error_journal", 0, "status"),
        "closed",
        "cognitive.insights.error_journal[0].status",
        "expected one of 'open', 'resolved', got 'closed'",
    ),
    case(
        ("insights", "learned_constraints"),
        "abc",
        "cognitive.insights.learned_constraints",
        "expected a list, got 'abc'",
    ),
    case(
        ("insights", "entity_relationships", 0, "to"),
        DELETE,
        "cognitive.insights.entity_relationships[0].to",
        "required but missing",
    ),
    case(
        ("crystallized", "created_at"),
        1e20,
        "cognitive.crystallized.created_at",
        "expected a time (seconds since 1970, 0-253402300799), got 1e+20",
    ),
    case(
        ("crystallized", "constraints"),
        "abc",
        "cognitive.crystallized.constraints",
        "expected a list, got 'abc'",
    ),
    case(
        ("crystallized", "user_identity"),
        {"": "x"},
        "cognitive.crystallized.user_identity",
        "key '' is not 1-256 printable characters",
    ),
    case(
        ("crystallized", "user_identity"),
        {"k": 1},
        "cognitive.crystallized.user_identity['k']",
        "expected a string, got 1",
    ),
    case(
        ("fluid", "sub_goals", 0, "done"),
        True,
        "cognitive.fluid.sub_goals[0]",
        "unknown key 'done'",
    ),
    case(
        ("fluid", "sub_goals"),
        [{"goal": "g", "status": "s"}] * 1001,
        "cognitive.fluid.sub_goals",
        "more than 1000 items",
    ),
    case(
        ("fluid", "step_count"),
        None,
        "cognitive.fluid.step_count",
        "expected an integer of at least 0, got null",
    ),
    case(
        ("fluid", "brain_state_digest"),
        [1],
        "cognitive.fluid.brain_state_digest",
        "expected an object, got a list",
    ),
    case(
        ("fluid", "brain_state_digest"),
        {"x": float("inf")},
        "cognitive.fluid.brain_state_digest['x']",
        "expected a finite number, got inf",
    ),
    case(
        ("fluid", "brain_state_digest"),
        {"n": 10**400},
        "cognitive.fluid.brain_state_digest['n']",
        "expected a number a double holds",
    ),
    case(
        ("fluid", "brain_state_digest"),
        {"s": {1}},
        "cognitive.fluid.brain_state_digest['s']",
        "expected a JSON value, got {1}",
    ),
    case(
        ("fluid", "brain_state_digest"),
        deep(34),
        "cognitive.fluid.brain_state_digest",
        "nested deeper than 33 levels of objects and lists",
    ),
]
TASKS = [
    case(
        ("tasks", "t1", "status"),
        7,
        "tasks.tasks['t1'].status",
        "expected one of 'pending', 'in-progress', 'completed', 'failed', got 7",
    ),
    case(
        ("tasks", "t1", "created_at"),
        DELETE,
        "tasks.tasks['t1'].created_at",
        "required but missing",
    ),
    case(("tasks", "t1", "owner"), "x", "tasks.tasks['t1']", "unknown key 'owner'"),
    case(("tasks", "a b"), A_TASK, "tasks.tasks['a b']", "invalid ID 'a b'"),
    case(
        ("tasks", "t1", "result"),
        {"x": float("-inf")},
        "tasks.tasks['t1'].result['x']",
        "expected a finite number, got -inf",
    ),
    case(
        ("tasks", "t1", "result"),
        "x" * (1 << 20),
        "tasks.tasks['t1'].result",
        "1048578 bytes of JSON; the limit is 1048576",
    ),
    case(("tasks",), [], "tasks.tasks", "expected an object, got a list"),
    case(("global_state",), DELETE, "tasks.global_state", "required but missing"),
    case(("global_state",), [], "tasks.global_state", "expected an object, got a list"),
    case(("global_state", ""), 1, "tasks.global_state", "key '' is not 1-256 printable characters"),
    case(
        ("global_state", "paths"),
        [deep(33)],
        "tasks.global_state['paths']",
        "nested deeper than 33 levels",
    ),
    case(("extra",), 1, "tasks", "unknown key 'extra'"),
]
AGENT = [
    case(
        ("execution", "iteration"),
        -1,
        "agent.execution.iteration",
        "expected an integer from 0 to 2147483647, got -1",
    ),
    case(
        ("execution", "iteration"),
        2**31,
        "agent.execution.iteration",
        "expected an integer from 0 to 2147483647, got 2147483648",
    ),
    case(
        ("execution", "max_iterations"),
        0,
        "agent.execution.max_iterations",
        "expected an integer from 1 to 1000000, got 0",
    ),
    case(("execution", "user_id"), "a b", "agent.execution.user_id", "invalid ID 'a b'"),
    case(("execution", "query"), None, "agent.execution.query", "expected a string, got null"),
    case(("execution", "mode"), "m" * 65, "agent.execution.mode", "longer than 64 characters"),
    case(
        ("execution", "pending_calls", 0, "args"),
        DELETE,
        "agent.execution.pending_calls[0].args",
        "required but missing",
    ),
    case(
        ("execution", "pending_calls", 0, "name"),
        3,
        "agent.execution.pending_calls[0].name",
        "expected a string, got 3",
    ),
    case(
        ("execution", "pending_calls", 0, "extra"),
        1,
        "agent.execution.pending_calls[0]",
        "unknown key 'extra'",
    ),
    case(
        ("execution", "completed_calls", 0),
        "ok",
        "agent.execution.completed_calls[0]",
        "expected an object, got 'ok'",
    ),
    case(
        ("execution", "completed_calls"),
        [{}] * 101,
        "agent.execution.completed_calls",
        "more than 100 items",
    ),
    case(("reasoning",), DELETE, "agent.reasoning", "required but missing"),
    case(
        ("reasoning", "insights"),
        [f"i{n}" for n in range(11)],
        "agent.reasoning.insights",
        "more than 10 items",
    ),
    case(
        ("reasoning", "facts"),
        {f"k{n}": n for n in range(21)},
        "agent.reasoning.facts",
        "more than 20 entries",
    ),
    case(
        ("reasoning", "facts", "k2"),
        float("nan"),
        "agent.reasoning.facts['k2']",
        "expected a finite number, got nan",
    ),
    case(
        ("reasoning", "thoughts", 0, "timestamp"),
        5,
        "agent.reasoning.thoughts[0].timestamp",
        "expected a string, got 5",
    ),
    case(
        ("reasoning", "thoughts", 0, "tool_calls", 0, "args"),
        [],
        "agent.reasoning.thoughts[0].tool_calls[0].args",
        "expected an object, got a list",
    ),
]
PROFILE = [
    case(
        ("synthesis_version",),
        0,
        "profile.synthesis_version",
        "expected an integer of at least 1, got 0",
    ),
    case(
        ("interaction_count",),
        "1",
        "profile.interaction_count",
        "expected an integer of at least 0, got '1'",
    ),
    case(("goals",), [f"g{n}" for n in range(11)], "profile.goals", "more than 10 items"),
    case(("goals", 0), "x" * 5000, "profile.goals[0]", "longer than 4096 characters"),
    case(("preferences", ""), 1, "profile.preferences", "key '' is not 1-256 printable characters"),
    case(("projects", "p"), 3, "profile.projects['p']", "expected a string, got 3"),
    case(("user_id",), DELETE, "profile.user_id", "required but missing"),
    case(("age",), 3, "profile", "unknown key 'age'"),
    case(
        ("last_updated",),
        -1,
        "profile.last_updated",
        "expected a time (seconds since 1970, 0-253402300799), got -1",
    ),
]


def refused(parse: Callable[[object], object], raw: object, field: str, problem: str) -> None:
    with pytest.raises(InvalidArgumentError) as excinfo:
        parse(raw)
    error = excinfo.value
    assert error.grpc_status == "INVALID_ARGUMENT"
    assert error.message.startswith(f"{field}: {problem}"), error.message
    assert error.metadata["field"] == field


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The exported state of `fill`, and a profile: the valid starting points."""
    with open_engine(tmp_path_factory.mktemp("data")) as engine:
        fill(engine)
        out = exported(engine)
        out["profile"], _ = engine.profiles.update(T, "alice", {"goals": ["g"]})
    return copy.deepcopy(out)


@pytest.mark.parametrize(
    ("keys", "value", "field", "problem"), [*COGNITIVE, *TASKS, *AGENT, *PROFILE]
)
def test_a_facet_that_does_not_parse_is_refused_naming_the_field(
    document: dict[str, Any], keys: tuple[Any, ...], value: Any, field: str, problem: str
) -> None:
    facet = field.split(".")[0].split("[")[0]  # each path starts with its facet
    parse = {**PARSERS, "profile": profiles.parse}[facet]
    parse(document[facet])  # the starting point parses
    refused(parse, changed(document[facet], keys, value), field, problem)


# -- check_servable (ReplaceStructuredState) ---------------------------------------------------


def test_check_servable_names_the_facet_and_the_field(document: dict[str, Any]) -> None:
    whole = {f: document[f] for f in st.FACETS}
    check_servable(S, whole)
    check_servable(S, {})
    bad = changed(whole, ("tasks", "tasks", "t1", "status"), "done")
    with pytest.raises(InvalidArgumentError) as excinfo:
        check_servable(S, bad)
    assert excinfo.value.message == (
        "structured_json: the 'tasks' facet is not one stratad can serve: "
        "tasks.tasks['t1'].status: expected one of 'pending', 'in-progress', 'completed', "
        "'failed', got 'done'"
    )
    assert excinfo.value.metadata == {"facet": "tasks", "field": "tasks.tasks['t1'].status"}
    with pytest.raises(
        InvalidArgumentError, match=r"the 'agent' facet .*agent.execution: required"
    ):
        check_servable(S, {"agent": {"reasoning": document["agent"]["reasoning"]}})


def test_what_the_old_check_let_through_is_refused(document: dict[str, Any]) -> None:
    """Values every reader served but the facet's next update broke on (after journaling
    the update), or that escaped as INTERNAL: refused now."""
    cog = document["cognitive"]
    for bad, field in [
        ({"cognitive": changed(cog, ("insights", "learned_constraints"), "abc")},
         "cognitive.insights.learned_constraints"),
        ({"cognitive": changed(cog, ("insights", "decision_log"), {})},
         "cognitive.insights.decision_log"),
        ({"cognitive": changed(cog, ("fluid", "progress"), 7)}, "cognitive.fluid.progress"),
        ({"cognitive": changed(cog, ("crystallized", "created_at"), 1e300)},
         "cognitive.crystallized.created_at"),
        ({"tasks": {"global_state": {}}}, "tasks.tasks"),
        ({"tasks": {"tasks": {}, "global_state": []}}, "tasks.global_state"),
    ]:  # fmt: skip
        with pytest.raises(InvalidArgumentError) as excinfo:
            check_servable(S, bad)
        assert excinfo.value.metadata["field"] == field, excinfo.value.message


def test_tasks_parse_accepts_what_the_reducers_make_of_a_new_session(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.sessions.create(T, "s")
        engine.tasks.store_result(T, "s", "only-result", [1, "two", None, True, 2.5])
        facet = exported(engine, "s")["tasks"]
        assert tasks.parse(facet)["tasks"]["only-result"]["result"] == [1, "two", None, True, 2.5]
        assert "status" not in facet["tasks"]["only-result"]
        assert cognitive.FACET not in exported(engine, "s")
