"""stratad.compat.cortex.MemoryCrystallizer against real daemons: corteX's
example verbatim, the facade's behaviour, and crystals surviving a restart and
a crash."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from stratad.compat.cortex import Crystal, MemoryCrystallizer

# corteX's MemoryCrystallizer example, verbatim apart from the import and the
# daemon's address.
SEED_EXAMPLE = textwrap.dedent(
    """
    from stratad.compat.cortex import MemoryCrystallizer

    crystallizer = MemoryCrystallizer(max_crystals=200, address=ADDRESS)

    # Extract a crystal from a successful task
    crystal = crystallizer.crystallize(
        goal="Deploy app.py to https://prod.example.com",
        execution_trace=[
            {"decision": "Read config", "tool": "file_read"},
            {"decision": "Validate schema", "tool": "code_interpreter"},
            {"decision": "Deploy", "tool": "shell",
             "error": "Timeout", "resolution": "Increased timeout to 60s"},
        ],
        success_score=0.9,
        session_id="sess_001",
    )

    # Query for matching crystals
    matches = crystallizer.query("Deploy server.py to staging")
    for match in matches:
        prompt = crystallizer.apply(match)
        print(prompt)

    # Record reuse outcome
    if crystal:
        crystallizer.record_reuse(crystal.crystal_id, success=True)
    """
)

EXPECTED_PROMPT = (
    "## Similar Past Success (90% effective, used 0x)\n"
    "Goal pattern: Deploy {file_path} to {url}\n"
    "Approach: Read config -> Validate schema -> Deploy\n"
    "Tools used: file_read, code_interpreter, shell\n"
    "Known pitfalls:\n"
    "  - Timeout: Increased timeout to 60s\n"
)


def run_seed_example(address: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"ADDRESS": address}
    exec(compile(SEED_EXAMPLE, "cortex_crystallizer_example", "exec"), namespace)
    namespace["crystallizer"].close()
    return namespace


def test_seed_example_and_restart(
    start_daemon: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = start_daemon()
    ns = run_seed_example(daemon.target)
    assert capsys.readouterr().out == EXPECTED_PROMPT
    crystal = ns["crystal"]
    assert isinstance(crystal, Crystal)
    assert crystal.crystal_id.startswith("crystal_sess_001_")
    assert crystal.error_patterns == [
        {"error": "Timeout", "resolution": "Increased timeout to 60s"}
    ]
    assert [m.crystal_id for m in ns["matches"]] == [crystal.crystal_id]

    assert daemon.stop() == 0
    again = start_daemon(data_dir=daemon.data_dir)
    with MemoryCrystallizer(address=again.target) as crystallizer:
        stored = crystallizer.get_crystal(crystal.crystal_id)
        assert stored is not None
        assert (stored.reuse_count, stored.effectiveness) == (1, pytest.approx(0.95))
        assert stored.goal_template == crystal.goal_template
        assert stored.created_at == pytest.approx(crystal.created_at, abs=1e-6)
        assert crystallizer.get_stats() == {
            "total_crystals": 1,
            "effective_crystals": 1,
            "total_reuses": 1,
            "avg_effectiveness": pytest.approx(0.95),
        }
        assert crystallizer.apply(stored).startswith(
            "## Similar Past Success (95% effective, used 1x)\n"
        )
        # corteX's example again: the same pattern is not novel now.
        assert (
            crystallizer.crystallize(
                "Deploy main.py to https://staging.example.com",
                [{"tool": "file_read"}, {"tool": "code_interpreter"}, {"tool": "shell"}],
                0.95,
            )
            is None
        )
        assert crystallizer.last_result is not None
        assert crystallizer.last_result.similar_crystal_id == crystal.crystal_id


def test_facade_behaviour(daemon: Any) -> None:
    with MemoryCrystallizer(max_crystals=3, min_success_score=0.8, address=daemon.target) as mc:
        assert mc.crystallize("Low score run", [{"tool": "a"}], 0.75) is None
        odd_trace = [
            {"decision": "Plan", "tool": None, "note": "ignored"},
            {"decision": 42, "tool": "calc"},
            {"error": "Boom"},
        ]
        c = mc.crystallize("Compute 17 things", odd_trace, 0.9, session_id="s1")
        assert c is not None
        assert c.goal_template == "Compute {N} things"
        assert c.decision_chain == ["Plan", "42"]
        assert c.tool_sequence == ["calc"]
        assert c.error_patterns == [{"error": "Boom", "resolution": ""}]
        assert c.entity_types == ["number"]
        made = [c]
        for i in range(3):
            crystal = mc.crystallize(f"other goal{i}", [{"tool": f"t{i}"}], 0.85 + 0.05 * i)
            assert crystal is not None
            made.append(crystal)
        # max_crystals=3: the least effective (0.85, "other goal0") went.
        assert mc.get_crystal(made[1].crystal_id) is None
        assert mc.get_stats()["total_crystals"] == 3
        assert [x.crystal_id for x in mc.query("other goal2 goal1", top_k=1)] == [
            made[3].crystal_id
        ]
        assert mc.query("nothing like it") == []
        assert mc.query("other", top_k=0) == []
        assert len(mc.query("other", top_k=10**6)) == 2  # capped at the daemon's 1,000
        mc.record_reuse("crystal_unknown", success=True)  # ignored, as in corteX
        mc.record_reuse("not a valid id", success=False)
        assert mc.get_crystal("not a valid id") is None
        user_made = Crystal("mine", "Do {N} things", ["a", "b"], ["t"], [{"error": "e"}], 1, 2, 0.5)
        assert mc.apply(user_made, context="anything") == (
            "## Similar Past Success (50% effective, used 2x)\n"
            "Goal pattern: Do {N} things\n"
            "Approach: a -> b\n"
            "Tools used: t\n"
            "Known pitfalls:\n"
            "  - e"
        )
    # Another tenant has its own library.
    with MemoryCrystallizer(address=daemon.target, tenant="other-team") as theirs:
        assert theirs.get_stats()["total_crystals"] == 0


def test_acknowledged_crystals_survive_a_crash(start_daemon: Callable[..., Any]) -> None:
    daemon = start_daemon()
    with MemoryCrystallizer(max_crystals=1000, address=daemon.target) as mc:
        ids = []
        for i in range(20):
            crystal = mc.crystallize(f"crash goal{i}", [{"tool": f"t{i}"}], 0.9)
            assert crystal is not None
            ids.append(crystal.crystal_id)
        for crystal_id in ids[::3]:
            mc.record_reuse(crystal_id, success=False)
    daemon.kill()  # SIGKILL: no shutdown, no final sync
    again = start_daemon(data_dir=daemon.data_dir)
    with MemoryCrystallizer(max_crystals=1000, address=again.target) as mc:
        for i, crystal_id in enumerate(ids):
            stored = mc.get_crystal(crystal_id)
            assert stored is not None
            assert stored.reuse_count == (1 if i % 3 == 0 else 0)
        assert mc.get_stats()["total_reuses"] == len(ids[::3])
