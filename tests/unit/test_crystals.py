"""Crystal memory (corteX's MemoryCrystallizer), in process: extraction, novelty, query,
apply, reuse, eviction, paging, persistence, compaction and bad input
(stratad.domain.crystals)."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stratad import native
from stratad.domain.crystals import (
    JOURNAL,
    CrystalLibraries,
    ErrorPattern,
    Outcome,
    TraceStep,
    decode_page_token,
    encode_page_token,
    format_prompt,
    running_average,
)
from stratad.errors import DataLossError, InvalidArgumentError, NotFoundError
from stratad.store.store import Store

T = "tenant-a"
#: The execution trace of corteX's MemoryCrystallizer example.
SEED_TRACE = [
    TraceStep(decision="Read config", tool="file_read"),
    TraceStep(decision="Validate schema", tool="code_interpreter"),
    TraceStep(
        decision="Deploy", tool="shell", error="Timeout", resolution="Increased timeout to 60s"
    ),
]


class Clock:
    """An injectable clock: starts at a fixed time, moves when told."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


Open = Callable[..., CrystalLibraries]


@pytest.fixture
def clock() -> Clock:
    return Clock()


#: Libraries a test shut down itself (the fixture must not close them twice:
#: a journal's file descriptor may have been reused by then).
_SHUT: list[CrystalLibraries] = []


def shut(libs: CrystalLibraries) -> None:
    """Close `libs` and its store, as a daemon shutting down would."""
    libs.close()
    libs.store.close()
    _SHUT.append(libs)


@pytest.fixture
def open_libs(tmp_path: Path, clock: Clock) -> Iterator[Open]:
    """open_libs(**kw): CrystalLibraries over <tmp>/data, recovered; closed at the end."""
    opened: list[CrystalLibraries] = []

    def open_(*, durability: str = "none", **kw: object) -> CrystalLibraries:
        store = Store(tmp_path / "data", durability=durability)
        libs = CrystalLibraries(store, clock=clock, **kw)  # type: ignore[arg-type]
        libs.recover()
        opened.append(libs)
        return libs

    yield open_
    for libs in opened:
        if not any(libs is done for done in _SHUT):
            libs.close()
            libs.store.close()
    _SHUT.clear()


def reopen(libs: CrystalLibraries, open_libs: Open, **kw: object) -> CrystalLibraries:
    """Shut `libs` down and open the same data again."""
    shut(libs)
    return open_libs(**kw)


@pytest.fixture
def libs(open_libs: Open) -> CrystalLibraries:
    return open_libs()


def words_goal(*words: str) -> str:
    return " ".join(words)


def steps(*tools: str) -> list[TraceStep]:
    return [TraceStep(decision=f"use {t}", tool=t) for t in tools]


def create(libs: CrystalLibraries, goal: str, tools: tuple[str, ...] = ("t0",), **kw: object):  # type: ignore[no-untyped-def]
    result = libs.crystallize(T, goal, steps(*tools), kw.pop("score", 0.9), **kw)  # type: ignore[arg-type]
    assert result.outcome is Outcome.CREATED, result
    assert result.crystal is not None
    return result.crystal


# -- generalization (corteX's table and tricky cases) -----------------------------------

SEED_TABLE = [
    ("Deploy src/app.py", "Deploy {file_path}"),
    ("Process 150 records", "Process {N} records"),
    ("Call /api/users/list", "Call {api_endpoint}"),
    ("Visit https://example.com", "Visit {url}"),
    ('Set "production"', 'Set "{value}"'),
]
TRICKY = [
    (r"Open C:\Users\bob\report.txt now", "Open {file_path} now"),
    ("Copy D:\\data\\in.csv to E:\\out\\", "Copy {file_path} to {file_path}"),
    ("Fetch http://localhost:8080/api/v2?x=1&y=2#frag, then stop", "Fetch {url}, then stop"),
    ("Ping https://prod.example.com:443/health?verbose=1", "Ping {url}"),
    ("Use utf8 and py311 with v2 for 60s", "Use utf8 and py311 with v2 for 60s"),
    ("Retry 3 times after 2.5 s (max 1,000)", "Retry {N} times after {N} s (max {N})"),
    (
        'Copy 3 files from src/a.py to https://x.io:443/p?q=1 as "final"',
        'Copy {N} files from {file_path} to {url} as "{value}"',
    ),
    ("Call /v1/users then /api/x.json", "Call {api_endpoint} then {file_path}"),
    ("Deploy app.py to https://prod.example.com", "Deploy {file_path} to {url}"),
]


@pytest.mark.parametrize(("goal", "template"), SEED_TABLE + TRICKY)
def test_goal_generalization(libs: CrystalLibraries, goal: str, template: str) -> None:
    assert native.generalize_goal(goal) == template
    crystal = create(libs, goal)
    assert crystal.goal_template == template
    assert libs.get(T, crystal.crystal_id).goal_template == template


def test_entity_types_come_from_the_goal(libs: CrystalLibraries) -> None:
    crystal = create(libs, 'Copy src/a.py and data.csv to https://x.io as "v" 3 times')
    assert crystal.entity_types == ("python_file", "data_file", "url", "quoted_value", "number")


# -- extraction ---------------------------------------------------------------------------


def test_seed_example_crystal(libs: CrystalLibraries, clock: Clock) -> None:
    result = libs.crystallize(
        T, "Deploy app.py to https://prod.example.com", SEED_TRACE, 0.9, "sess_001"
    )
    assert result.outcome is Outcome.CREATED
    c = result.crystal
    assert c is not None
    assert c.crystal_id == f"crystal_sess_001_{int(clock.now * 1000)}"
    assert c.goal_template == "Deploy {file_path} to {url}"
    assert c.decision_chain == ("Read config", "Validate schema", "Deploy")
    assert c.tool_sequence == ("file_read", "code_interpreter", "shell")
    assert c.error_patterns == (ErrorPattern("Timeout", "Increased timeout to 60s"),)
    assert c.entity_types == ("python_file", "url")
    assert (c.success_score, c.effectiveness, c.reuse_count) == (0.9, 0.9, 0)
    assert (c.created_from, c.created_at) == ("sess_001", clock.now)
    assert libs.get(T, c.crystal_id) == c


def test_extraction_limits_and_order(libs: CrystalLibraries) -> None:
    trace = [
        TraceStep(
            decision=f"d{i}" if i % 7 else "",
            tool=f"tool{i % 20}" if i % 5 else "",
            error=f"e{i}" if i % 3 == 0 else "",
            resolution=f"r{i}" if i % 6 == 0 else "",
        )
        for i in range(60)
    ]
    c = libs.crystallize(T, "Big run", trace, 1.0).crystal
    assert c is not None
    want_decisions = [f"d{i}" for i in range(60) if i % 7][:20]
    assert list(c.decision_chain) == want_decisions
    tools = [f"tool{i % 20}" for i in range(60) if i % 5]
    assert list(c.tool_sequence) == list(dict.fromkeys(tools))[:15]
    assert len(c.tool_sequence) == 15
    errors = [ErrorPattern(f"e{i}", f"r{i}" if i % 6 == 0 else "") for i in range(0, 60, 3)]
    assert list(c.error_patterns) == errors[:10]


def test_empty_trace_and_session(libs: CrystalLibraries, clock: Clock) -> None:
    c = libs.crystallize(T, "Just think", [], 0.8).crystal
    assert c is not None
    assert c.crystal_id == f"crystal__{int(clock.now * 1000)}"
    assert (c.decision_chain, c.tool_sequence, c.error_patterns) == ((), (), ())
    assert c.created_from == ""


def test_ids_unique_within_one_millisecond(libs: CrystalLibraries, clock: Clock) -> None:
    ids = [
        create(libs, f"goal number{i}", (f"tool{i}",), session_id="s1").crystal_id for i in range(4)
    ]
    base = f"crystal_s1_{int(clock.now * 1000)}"
    assert ids == [base, f"{base}-2", f"{base}-3", f"{base}-4"]
    clock.tick(0.001)
    assert create(libs, "goal other", ("x",), session_id="s1").crystal_id == (
        f"crystal_s1_{int(clock.now * 1000)}"
    )


def test_long_session_ids_are_cut_in_the_crystal_id(libs: CrystalLibraries) -> None:
    session = "s" * 128
    c = create(libs, "a long one", session_id=session)
    assert len(c.crystal_id) <= 128
    assert c.crystal_id.startswith("crystal_" + "s" * 96 + "_")
    assert c.created_from == session


# -- minimum success score ------------------------------------------------------------


def test_below_threshold_stores_nothing(libs: CrystalLibraries) -> None:
    result = libs.crystallize(T, "Deploy app.py", SEED_TRACE, 0.69)
    assert result.outcome is Outcome.BELOW_THRESHOLD
    assert result.crystal is None and result.min_success_score == 0.7
    assert libs.stats(T).total_crystals == 0
    assert libs.crystallize(T, "Deploy app.py", SEED_TRACE, 0.7).outcome is Outcome.CREATED


def test_min_success_score_per_call_and_per_library(libs: CrystalLibraries) -> None:
    r = libs.crystallize(T, "goal one", steps("a"), 0.5, min_success_score=0.4)
    assert r.outcome is Outcome.CREATED and r.min_success_score == 0.4
    r = libs.crystallize(T, "goal two", steps("b"), 0.95, min_success_score=0.99)
    assert r.outcome is Outcome.BELOW_THRESHOLD
    libs.set_config(T, min_success_score=0.2)
    assert libs.crystallize(T, "goal three", steps("c"), 0.3).outcome is Outcome.CREATED
    assert libs.config(T).min_success_score == 0.2


# -- novelty ---------------------------------------------------------------------------

GOAL10 = [f"a{i}" for i in range(10)]
TOOLS5 = [f"t{i}" for i in range(5)]


@pytest.mark.parametrize(
    ("goal_words", "tools", "novel", "goal_sim", "tool_sim"),
    [
        # tool Jaccard exactly 0.8 (4/5), goal identical: novel (strictly greater needed)
        (GOAL10, TOOLS5[:4], True, 1.0, 0.8),
        # tool Jaccard 5/6 > 0.8, goal identical: not novel
        (GOAL10, [*TOOLS5, "t5"], False, 1.0, 5 / 6),
        # goal overlap exactly 0.7 (7/10), tools identical: novel
        (GOAL10[:7], TOOLS5, True, 0.7, 1.0),
        # goal overlap 0.8 (8/10), tools identical: not novel
        (GOAL10[:8], TOOLS5, False, 0.8, 1.0),
        # 7 shared words and 2 new ones: 7/12 = 0.58, novel
        ([*GOAL10[:7], "x1", "x2"], TOOLS5, True, 7 / 12, 1.0),
        # both just above: not novel
        ([*GOAL10[:9], "x1"], [*TOOLS5[:5], "t9"], False, 9 / 11, 5 / 6),
        # both exactly at the thresholds: novel
        (GOAL10[:7], TOOLS5[:4], True, 0.7, 0.8),
        # identical goal, no tools on either side: Jaccard of two empty sets is 0
        (GOAL10, [], True, 1.0, 0.0),
    ],
)
def test_novelty_thresholds(
    libs: CrystalLibraries,
    goal_words: list[str],
    tools: list[str],
    novel: bool,
    goal_sim: float,
    tool_sim: float,
) -> None:
    existing = create(libs, words_goal(*GOAL10), tuple(TOOLS5) if tools else ())
    assert len({*goal_words} & {*GOAL10}) / len({*goal_words, *GOAL10}) == pytest.approx(goal_sim)
    result = libs.crystallize(T, words_goal(*goal_words), steps(*tools), 0.9)
    if novel:
        assert result.outcome is Outcome.CREATED
        assert libs.stats(T).total_crystals == 2
    else:
        assert result.outcome is Outcome.NOT_NOVEL
        assert result.similar_crystal_id == existing.crystal_id
        assert result.goal_similarity == pytest.approx(goal_sim)
        assert result.tool_similarity == pytest.approx(tool_sim)
        assert libs.stats(T).total_crystals == 1


def test_novelty_uses_tool_sets_and_template_words(libs: CrystalLibraries) -> None:
    first = create(libs, "Deploy app.py to https://prod.example.com", ("shell", "file_read"))
    # Same template once generalized, same tool set in another order, repeats.
    again = libs.crystallize(
        T, "deploy MAIN.PY to http://staging:8080/x", steps("file_read", "shell", "shell"), 0.8
    )
    assert again.outcome is Outcome.NOT_NOVEL
    assert again.similar_crystal_id == first.crystal_id
    # Tool names are compared exactly.
    other = libs.crystallize(T, "Deploy x.py to https://a.b", steps("Shell", "file_read"), 0.8)
    assert other.outcome is Outcome.CREATED


def test_novelty_names_the_most_similar(libs: CrystalLibraries, clock: Clock) -> None:
    goal = GOAL10
    other_goal = [*GOAL10[:9], "x"]  # 9/11 = 0.82 to `goal`
    # Two crystals novel to each other (tool sets 4/6 = 0.67 alike) ...
    older = create(libs, words_goal(*goal), ("t1", "t2", "t3", "t4", "t5"))
    clock.tick()
    newer = create(libs, words_goal(*other_goal), ("t1", "t2", "t3", "t4", "t6"))
    # ... both similar to the probe (tools 5/6 each); the newer one shares the goal fully.
    probe = libs.crystallize(
        T, words_goal(*other_goal), steps("t1", "t2", "t3", "t4", "t5", "t6"), 0.9
    )
    assert probe.outcome is Outcome.NOT_NOVEL
    assert probe.similar_crystal_id == newer.crystal_id
    assert (probe.goal_similarity, probe.tool_similarity) == (1.0, 5 / 6)
    # With equal similarities, the older one is named.
    tie = libs.crystallize(T, words_goal(*goal[:9]), steps("t1", "t2", "t3", "t4", "t5", "t6"), 0.9)
    assert tie.outcome is Outcome.NOT_NOVEL
    assert (tie.goal_similarity, tie.tool_similarity) == (0.9, 5 / 6)
    assert tie.similar_crystal_id == older.crystal_id


# -- query --------------------------------------------------------------------------------


def test_query_seed_example(libs: CrystalLibraries) -> None:
    crystal = libs.crystallize(
        T, "Deploy app.py to https://prod.example.com", SEED_TRACE, 0.9, "sess_001"
    ).crystal
    assert crystal is not None
    template, matches = libs.query(T, "Deploy server.py to staging")
    assert template == "Deploy {file_path} to staging"
    assert [m.crystal.crystal_id for m in matches] == [crystal.crystal_id]
    # tokens {deploy, {file_path}, to, staging} vs {deploy, {file_path}, to, {url}}: 3/5
    assert matches[0].similarity == 0.6
    assert matches[0].score == pytest.approx(0.6 * (0.5 + 0.5 * 0.9))


def test_query_boost_ranks_and_top_k(libs: CrystalLibraries, clock: Clock) -> None:
    exact = create(libs, "alpha beta gamma delta", ("a",), score=0.7)
    clock.tick()
    close = create(libs, "alpha beta gamma", ("b",), score=1.0)
    clock.tick()
    far = create(libs, "alpha zeta", ("c",), score=1.0)
    for _ in range(5):  # drive `exact` to effectiveness 0.7 / 6 ~ 0.117
        libs.record_reuse(T, exact.crystal_id, False)
    _, matches = libs.query(T, "alpha beta gamma delta", top_k=10)
    ids = [m.crystal.crystal_id for m in matches]
    # exact: 1.0 * (0.5 + 0.5 * 0.7/6) = 0.558; close: 0.75 * 1.0 = 0.75; far: 0.2
    assert ids == [close.crystal_id, exact.crystal_id, far.crystal_id]
    for m in matches:
        assert m.score == pytest.approx(m.similarity * (0.5 + 0.5 * m.crystal.effectiveness))
    assert [m.crystal.crystal_id for m in libs.query(T, "alpha beta gamma delta")[1]] == ids
    assert len(libs.query(T, "alpha beta gamma delta", top_k=1)[1]) == 1
    assert len(libs.query(T, "alpha beta gamma delta", top_k=0)[1]) == 3  # default 3


def test_query_ties_go_to_the_older_crystal(libs: CrystalLibraries, clock: Clock) -> None:
    old = create(libs, "same words here", ("a",))
    clock.tick()
    new = create(libs, "same words here", ("b",))
    _, matches = libs.query(T, "same words here")
    assert [m.crystal.crystal_id for m in matches] == [old.crystal_id, new.crystal_id]


def test_query_without_matches(libs: CrystalLibraries) -> None:
    assert libs.query(T, "anything") == ("anything", [])  # no library yet
    create(libs, "alpha beta")
    assert libs.query(T, "gamma")[1] == []
    assert libs.query(T, "")[1] == []
    assert libs.query(T, "!!! ???")[1] == []


# -- apply ------------------------------------------------------------------------------


def test_apply_seed_format(libs: CrystalLibraries) -> None:
    c = libs.crystallize(
        T, "Deploy app.py to https://prod.example.com", SEED_TRACE, 0.85, "sess_001"
    ).crystal
    assert c is not None
    assert libs.apply(T, c.crystal_id, "ignored context") == (
        "## Similar Past Success (85% effective, used 0x)\n"
        "Goal pattern: Deploy {file_path} to {url}\n"
        "Approach: Read config -> Validate schema -> Deploy\n"
        "Tools used: file_read, code_interpreter, shell\n"
        "Known pitfalls:\n"
        "  - Timeout: Increased timeout to 60s"
    )
    for success in (True, True, False):
        libs.record_reuse(T, c.crystal_id, success)
    # (0.85 + 2) / 4 = 0.7125
    assert libs.apply(T, c.crystal_id).startswith(
        "## Similar Past Success (71% effective, used 3x)\n"
    )


def test_apply_leaves_out_empty_sections() -> None:
    from stratad.domain.crystals import Crystal

    bare = Crystal("c1", "Think {N} times", (), (), (), 1.0, 0, 1.0, (), "", 0.0)
    assert format_prompt(bare) == (
        "## Similar Past Success (100% effective, used 0x)\nGoal pattern: Think {N} times"
    )
    no_fix = Crystal("c2", "g", ("a",), ("t",), (ErrorPattern("Boom"),), 0.5, 2, 0.295, (), "", 0.0)
    assert format_prompt(no_fix).splitlines()[0] == (
        "## Similar Past Success (30% effective, used 2x)"
    )
    assert format_prompt(no_fix).endswith("Known pitfalls:\n  - Boom")


# -- reuse ------------------------------------------------------------------------------


def test_running_average(libs: CrystalLibraries) -> None:
    c = create(libs, "average me", score=0.9)
    outcomes = [True, False, True, True, False, False, True]
    for n, success in enumerate(outcomes, start=1):
        after = libs.record_reuse(T, c.crystal_id, success)
        successes = sum(outcomes[:n])
        assert after.reuse_count == n
        assert after.effectiveness == pytest.approx((0.9 + successes) / (1 + n))
    assert running_average(0.9, 0, True) == pytest.approx(0.95)
    assert running_average(0.95, 1, False) == pytest.approx(1.9 / 3)
    assert running_average(1.0, 7, True) == 1.0
    assert libs.get(T, c.crystal_id).reuse_count == len(outcomes)


# -- eviction ---------------------------------------------------------------------------


def test_eviction_order(libs: CrystalLibraries, clock: Clock) -> None:
    libs.set_config(T, max_crystals=3)
    a = create(libs, "goal aaa", ("a",), score=0.8)
    clock.tick()
    b = create(libs, "goal bbb", ("b",), score=0.8)
    clock.tick()
    c = create(libs, "goal ccc", ("c",), score=0.9)
    libs.record_reuse(T, a.crystal_id, True)  # a: (0.8 + 1) / 2 = 0.9, 1 reuse
    clock.tick()
    # Least effective: b (0.8). a and c tie at 0.9 afterwards.
    d = libs.crystallize(T, "goal ddd", steps("d"), 0.95)
    assert d.evicted == (b.crystal_id,)
    clock.tick()
    # Now a (0.9, 1 reuse), c (0.9, 0 reuses), d (0.95): c goes (fewer reuses).
    e = libs.crystallize(T, "goal eee", steps("e"), 0.99)
    assert e.evicted == (c.crystal_id,)
    clock.tick()
    # a (0.9), d (0.95), e (0.99); the new one is the least effective but stays.
    f = libs.crystallize(T, "goal fff", steps("f"), 0.71)
    assert f.evicted == (a.crystal_id,)
    remaining = {x.crystal_id for x in libs.list(T)[0]}
    assert remaining == {d.crystal.crystal_id, e.crystal.crystal_id, f.crystal.crystal_id}  # type: ignore[union-attr]
    with pytest.raises(NotFoundError):
        libs.get(T, b.crystal_id)


def test_eviction_ties_go_to_the_oldest(libs: CrystalLibraries, clock: Clock) -> None:
    libs.set_config(T, max_crystals=2)
    first = create(libs, "tie one", ("a",), score=0.8)
    clock.tick()
    create(libs, "tie two", ("b",), score=0.8)
    clock.tick()
    third = libs.crystallize(T, "tie three", steps("c"), 0.8)
    assert third.evicted == (first.crystal_id,)


def test_lowering_max_crystals_evicts_at_once(libs: CrystalLibraries, clock: Clock) -> None:
    made = []
    for i in range(6):
        made.append(create(libs, f"goal number{i}", (f"t{i}",), score=0.7 + i * 0.05))
        clock.tick()
    config, evicted = libs.set_config(T, max_crystals=2)
    assert (config.max_crystals, evicted) == (2, 4)
    assert {c.crystal_id for c in libs.list(T)[0]} == {made[4].crystal_id, made[5].crystal_id}
    assert libs.stats(T).max_crystals == 2


# -- list, delete, stats, tenants -------------------------------------------------------


def test_list_pages_in_creation_order(libs: CrystalLibraries, clock: Clock) -> None:
    made = []
    for i in range(7):
        made.append(create(libs, f"page goal{i}", (f"t{i}",)).crystal_id)
        clock.tick()
    page, token = libs.list(T, page_size=3)
    assert [c.crystal_id for c in page] == made[:3] and token
    libs.delete(T, made[3])
    page2, token2 = libs.list(T, page_size=3, page_token=token)
    assert [c.crystal_id for c in page2] == made[4:7]
    assert token2 == ""
    everything, last = libs.list(T)
    assert [c.crystal_id for c in everything] == made[:3] + made[4:] and last == ""
    assert libs.list("nobody") == ([], "")


def test_page_tokens() -> None:
    assert decode_page_token(encode_page_token(12345)) == 12345
    assert decode_page_token("") == -1
    for bad in ("!!!", "Yw==", "eDE=", encode_page_token(1) + "x", "c12"):
        with pytest.raises(InvalidArgumentError, match="page_token"):
            decode_page_token(bad)


def test_delete(libs: CrystalLibraries) -> None:
    c = create(libs, "delete me please")
    libs.delete(T, c.crystal_id)
    for call in (libs.get, libs.apply, libs.delete):
        with pytest.raises(NotFoundError, match=c.crystal_id):
            call(T, c.crystal_id)
    with pytest.raises(NotFoundError):
        libs.record_reuse(T, c.crystal_id, True)
    assert libs.query(T, "delete me please")[1] == []
    assert libs.stats(T).total_crystals == 0


def test_stats(libs: CrystalLibraries, clock: Clock) -> None:
    assert libs.stats(T).total_crystals == 0
    a = create(libs, "stat one", ("a",), score=0.8)
    create(libs, "stat two", ("b",), score=1.0)
    for _ in range(3):
        libs.record_reuse(T, a.crystal_id, False)  # 0.8 / 4 = 0.2
    s = libs.stats(T)
    assert (s.total_crystals, s.effective_crystals, s.total_reuses) == (2, 1, 3)
    assert s.avg_effectiveness == pytest.approx((0.2 + 1.0) / 2)
    assert s.max_crystals == 200
    assert s.memory_bytes > 0 and s.journal_bytes > 0


def test_tenants_are_isolated(libs: CrystalLibraries) -> None:
    c = create(libs, "private goal")
    assert libs.query("tenant-b", "private goal")[1] == []
    with pytest.raises(NotFoundError):
        libs.get("tenant-b", c.crystal_id)
    libs.set_config("tenant-b", max_crystals=5)
    assert libs.config(T).max_crystals == 200
    assert libs.stats("tenant-b").total_crystals == 0


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"goal": ""}, "goal"),
        ({"goal": "   "}, "goal"),
        ({"goal": "x" * 8193}, "goal"),
        ({"success_score": -0.1}, "success_score"),
        ({"success_score": 1.01}, "success_score"),
        ({"success_score": math.nan}, "success_score"),
        ({"success_score": math.inf}, "success_score"),
        ({"session_id": "bad id"}, "session_id"),
        ({"session_id": "../x"}, "session_id"),
        ({"min_success_score": 2.0}, "min_success_score"),
        ({"execution_trace": [TraceStep(decision="d" * 9000)]}, "decision"),
        ({"execution_trace": [TraceStep()] * 10_001}, "execution_trace"),
    ],
)
def test_crystallize_bad_input(
    libs: CrystalLibraries, kwargs: dict[str, object], words: str
) -> None:
    args: dict[str, object] = {
        "goal": "fine goal",
        "execution_trace": SEED_TRACE,
        "success_score": 0.9,
        "session_id": "",
    }
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=words):
        libs.crystallize(T, **args)  # type: ignore[arg-type]
    assert libs.stats(T).total_crystals == 0


def test_other_bad_input(libs: CrystalLibraries) -> None:
    create(libs, "some goal")
    for bad_id in ("", "bad id", "-x", "a" * 129):
        for call in (libs.get, libs.apply, libs.delete):
            with pytest.raises(InvalidArgumentError, match="crystal_id"):
                call(T, bad_id)
        with pytest.raises(InvalidArgumentError, match="crystal_id"):
            libs.record_reuse(T, bad_id, True)
    with pytest.raises(InvalidArgumentError, match="top_k"):
        libs.query(T, "x", top_k=-1)
    with pytest.raises(InvalidArgumentError, match="top_k"):
        libs.query(T, "x", top_k=1001)
    with pytest.raises(InvalidArgumentError, match="goal_text"):
        libs.query(T, "x" * 8193)
    with pytest.raises(InvalidArgumentError, match="page_size"):
        libs.list(T, page_size=-1)
    with pytest.raises(InvalidArgumentError, match="page_token"):
        libs.list(T, page_token="nope")
    for bad in (0, -1, 10_000_001):
        with pytest.raises(InvalidArgumentError, match="max_crystals"):
            libs.set_config(T, max_crystals=bad)
    with pytest.raises(InvalidArgumentError, match="min_success_score"):
        libs.set_config(T, min_success_score=-0.5)
    with pytest.raises(InvalidArgumentError, match="tenant"):
        libs.crystallize("bad tenant", "goal", [], 0.9)
    with pytest.raises(InvalidArgumentError, match="context"):
        libs.apply(T, "c1", "x" * ((1 << 20) + 1))


# -- persistence --------------------------------------------------------------------------


def test_state_survives_a_restart(libs: CrystalLibraries, open_libs: Open, clock: Clock) -> None:
    libs.set_config(T, max_crystals=3, min_success_score=0.6)
    made = []
    for i in range(4):
        made.append(create(libs, f"persist goal{i}", (f"t{i}",), score=0.65 + 0.1 * i))
        clock.tick()
    libs.record_reuse(T, made[3].crystal_id, False)
    libs.delete(T, made[2].crystal_id)
    before = libs.list(T)[0]
    stats = libs.stats(T)
    again = reopen(libs, open_libs)
    assert again.list(T)[0] == before
    assert again.config(T).max_crystals == 3 and again.config(T).min_success_score == 0.6
    after = again.stats(T)
    assert (after.total_crystals, after.total_reuses) == (stats.total_crystals, stats.total_reuses)
    assert after.avg_effectiveness == stats.avg_effectiveness
    # New crystals continue the sequence (listed after the old ones).
    clock.tick()
    new = create(again, "persist after restart", ("z",))
    assert again.list(T)[0][-1].crystal_id == new.crystal_id
    assert again.query(T, "persist goal3")[1][0].crystal.reuse_count == 1


def test_compaction_keeps_everything(open_libs: Open, clock: Clock) -> None:
    libs = open_libs(compact_min_bytes=2048)
    made = []
    for i in range(40):
        made.append(create(libs, f"compact goal{i} words{i % 5}", (f"t{i}",)))
        clock.tick()
    for i in range(0, 40, 2):
        libs.delete(T, made[i].crystal_id)
    for i in range(1, 40, 4):
        for success in (True, False, True):
            libs.record_reuse(T, made[i].crystal_id, success)
    path = libs.store.tenants_root / T / "crystals" / JOURNAL
    size = path.stat().st_size
    assert size < 40 * 400  # compacted at least once along the way
    before = libs.list(T)[0]
    assert [c.crystal_id for c in before] == [c.crystal_id for c in made[1::2]]
    assert libs.query(T, "compact goal5 words0")[1][0].crystal == libs.get(T, made[5].crystal_id)
    again = reopen(libs, open_libs, compact_min_bytes=2048)
    assert again.list(T)[0] == before


def test_streaming_replay_and_compaction_release_pages(
    open_libs: Open, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stratad.domain.crystals.persistence as dc

    monkeypatch.setattr(dc, "_RELEASE_BYTES", 4096)  # release after every page or so
    libs = open_libs(compact_min_bytes=4096)
    made = []
    for i in range(60):
        made.append(create(libs, f"stream goal{i}", (f"t{i}",)))
        clock.tick()
    for c in made[::2]:
        libs.delete(T, c.crystal_id)  # compactions stream through the old journal
    before = libs.list(T)[0]
    again = reopen(libs, open_libs, compact_min_bytes=4096)
    assert again.list(T)[0] == before
    assert [c.crystal_id for c in before] == [c.crystal_id for c in made[1::2]]


def test_torn_tail_is_cut(libs: CrystalLibraries, open_libs: Open) -> None:
    c = create(libs, "torn tail goal")
    path = libs.store.tenants_root / T / "crystals" / JOURNAL
    shut(libs)
    with path.open("ab") as f:
        f.write(b"\x40\x00\x00\x00\x01\x02")  # a header promising more than follows
    again = open_libs()
    assert again.get(T, c.crystal_id) == c
    assert again.stats(T).journal_bytes == path.stat().st_size
    create(again, "after the cut")
    assert len(reopen(again, open_libs).list(T)[0]) == 2


def test_zeros_a_crash_left_after_the_records_are_cut_quietly(
    libs: CrystalLibraries, open_libs: Open, caplog: pytest.LogCaptureFixture
) -> None:
    """An open journal keeps zeros after its records (store/journal.py); a crash
    leaves them. Recovery cuts them without a torn-tail warning, and crystals
    added afterwards follow the records, not the zeros."""
    c = create(libs, "zero tail goal")
    path = libs.store.tenants_root / T / "crystals" / JOURNAL
    shut(libs)
    records_end = path.stat().st_size
    with path.open("ab") as f:
        f.write(bytes(8192))  # what a SIGKILL leaves of the preallocated space
    with caplog.at_level(logging.INFO):
        again = open_libs()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert again.get(T, c.crystal_id) == c
    assert again.stats(T).journal_bytes == records_end
    create(again, "after the zeros")
    assert len(reopen(again, open_libs).list(T)[0]) == 2


def test_damaged_journal_is_read_only(libs: CrystalLibraries, open_libs: Open) -> None:
    first = create(libs, "damage one", ("a",))
    create(libs, "damage two", ("b",))
    create(libs, "damage three", ("c",))
    path = libs.store.tenants_root / T / "crystals" / JOURNAL
    shut(libs)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damage the middle record
    path.write_bytes(bytes(data))
    again = open_libs()
    assert again.get(T, first.crystal_id) == first  # before the damage: readable
    with pytest.raises(DataLossError, match="damaged"):
        again.crystallize(T, "damage four", steps("d"), 0.9)
    with pytest.raises(DataLossError, match="damaged"):
        again.record_reuse(T, first.crystal_id, True)


def test_fsync_durability_and_concurrency(open_libs: Open) -> None:
    libs = open_libs(durability="fsync")
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(15):
                r = libs.crystallize(T, f"thread{n} goal{i}", steps(f"t{n}{i}"), 0.9)
                assert r.crystal is not None
                libs.query(T, f"thread{n} goal{i}")
                libs.record_reuse(T, r.crystal.crystal_id, i % 2 == 0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = libs.stats(T)
    assert (stats.total_crystals, stats.total_reuses) == (60, 60)
    assert len({c.crystal_id for c in libs.list(T, page_size=1000)[0]}) == 60
