"""User profiles in-process on `Engine`: the bounded merge, compress(), persistence."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stratad.domain.engine import Engine
from stratad.domain.profiles import compress, new_profile, update_from_interaction
from stratad.errors import InvalidArgumentError, NotFoundError, ResourceExhaustedError
from stratad.store import journal as journal_mod

T = "acme"


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
        yield engine


def test_update_creates_then_merges_with_the_seed_bounds(engine: Engine) -> None:
    p = engine.profiles
    profile, created = p.update(T, "alice", {"goals": ["g0"], "communication_style": "terse"})
    assert created and profile["interaction_count"] == 1 and profile["synthesis_version"] == 1
    for n in range(1, 13):
        profile, created = p.update(T, "alice", {"goals": [f"g{n}", f"g{n}"]})
    assert not created
    assert profile["goals"] == [f"g{n}" for n in range(3, 13)]  # <= 10, newest
    profile, _ = p.update(T, "alice", {"expertise": [f"e{n}" for n in range(20)]})
    assert profile["expertise_areas"] == [f"e{n}" for n in range(5, 20)]  # <= 15
    profile, _ = p.update(T, "alice", {"project_context": {f"p{n}": "d" for n in range(12)}})
    assert list(profile["projects"]) == [f"p{n}" for n in range(2, 12)]
    for n in range(7):
        profile, _ = p.update(T, "alice", {"success_pattern": f"s{n}", "failure_pattern": "f"})
    assert profile["success_patterns"] == [f"s{n}" for n in range(2, 7)]
    assert profile["failure_patterns"] == ["f"]
    profile, _ = p.update(T, "alice", {"preferences": {"lang": "py"}}, synthesized=True)
    assert profile["synthesis_version"] == 2 and profile["preferences"] == {"lang": "py"}
    assert profile["communication_style"] == "terse"
    assert profile["interaction_count"] == 1 + 12 + 1 + 1 + 7 + 1
    assert p.get(T, "alice") == profile


def test_profiles_are_per_tenant_and_user(engine: Engine) -> None:
    engine.profiles.update(T, "alice", {"goals": ["a"]})
    with pytest.raises(NotFoundError):
        engine.profiles.get("other", "alice")
    with pytest.raises(NotFoundError):
        engine.profiles.get(T, "bob")
    engine.profiles.delete(T, "alice")
    with pytest.raises(NotFoundError):
        engine.profiles.get(T, "alice")
    with pytest.raises(NotFoundError):
        engine.profiles.delete(T, "alice")
    with pytest.raises(NotFoundError):
        engine.profiles.delete("nobody-here", "alice")


@pytest.mark.parametrize(
    ("user_id", "insights", "words"),
    [
        ("a/b", {}, "user_id"),
        ("alice", {"hobbies": ["x"]}, "unknown profile insight"),
        ("alice", {"goals": ["x" * 5000]}, "longer"),
        ("alice", {"preferences": {"": 1}}, "preference key"),
        ("alice", {"preferences": {"x": float("nan")}}, "not a JSON value"),
    ],
)
def test_update_bad_input(
    engine: Engine, user_id: str, insights: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        engine.profiles.update(T, user_id, insights)


def test_compress_is_the_seed_function() -> None:
    profile = update_from_interaction(
        new_profile("u", 0.0),
        {
            "communication_style": "direct",
            "goals": ["g1", "g2", "g3", "g4"],
            "preferences": {f"k{n}": n for n in range(6)},
            "project_context": {"a": "1", "b": "2", "c": "3", "d": "4"},
            "expertise": [f"e{n}" for n in range(6)],
            "constraints": ["c1"],
        },
        1.0,
    )
    text = compress(profile)
    assert text == (
        "COMMUNICATION: direct\nCURRENT GOALS: g2; g3; g4\n"
        "PREFERENCES: k1: 1, k2: 2, k3: 3, k4: 4, k5: 5\n"
        "ACTIVE PROJECTS: b: 2; c: 3; d: 4\nEXPERTISE: e1, e2, e3, e4, e5\nCONSTRAINTS: c1"
    )
    assert compress(profile, 10) == text[:10]


def test_compress_profile_reports_truncation(engine: Engine) -> None:
    engine.profiles.update(T, "alice", {"communication_style": "terse"})
    assert engine.profiles.compress(T, "alice") == ("COMMUNICATION: terse", False)
    assert engine.profiles.compress(T, "alice", 5) == ("COMMU", True)
    with pytest.raises(InvalidArgumentError):
        engine.profiles.compress(T, "alice", -1)


def test_an_update_stands_when_the_compaction_after_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction an update triggers runs after the update is durable: a
    full disk during it fails the compaction (the old journal stays), not the
    update; the next update compacts."""
    jpath = tmp_path / "tenants" / T / "profiles" / "journal"
    with open_engine(tmp_path, compact_min_bytes=2048) as engine:
        real_rewrite = journal_mod.rewrite

        def disk_full(*args: Any, **kwargs: Any) -> None:
            raise ResourceExhaustedError("disk full during journal compaction")

        monkeypatch.setattr(journal_mod, "rewrite", disk_full)
        for n in range(40):  # well past the threshold: every update tries
            engine.profiles.update(T, "ada", {"goals": [f"goal {n}"]})
        assert journal_mod.read_records(jpath).records[0].kind != "snapshot"
        monkeypatch.setattr(journal_mod, "rewrite", real_rewrite)
        engine.profiles.update(T, "ada", {"goals": ["after the disk had room"]})
        assert journal_mod.read_records(jpath).records[0].kind == "snapshot"
        expected = engine.profiles.get(T, "ada")
    assert expected["goals"][-1] == "after the disk had room"
    with open_engine(tmp_path) as engine:
        assert engine.profiles.get(T, "ada") == expected


def test_profiles_survive_a_restart_and_compaction(tmp_path: Path) -> None:
    with open_engine(tmp_path, compact_min_bytes=2048) as engine:
        for n in range(60):
            engine.profiles.update(T, f"user{n % 5}", {"goals": [f"goal {n}"]})
        engine.profiles.delete(T, "user4")
        expected = {f"user{n}": engine.profiles.get(T, f"user{n}") for n in range(4)}
    jpath = tmp_path / "tenants" / T / "profiles" / "journal"
    records = journal_mod.read_records(jpath).records
    assert records[0].kind == "snapshot"  # compacted
    assert jpath.stat().st_size < 16 << 10
    with open_engine(tmp_path) as engine:
        assert {f"user{n}": engine.profiles.get(T, f"user{n}") for n in range(4)} == expected
        with pytest.raises(NotFoundError):
            engine.profiles.get(T, "user4")


def test_a_torn_profile_journal_tail_is_cut(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.profiles.update(T, "alice", {"goals": ["kept"]})
    jpath = tmp_path / "tenants" / T / "profiles" / "journal"
    with jpath.open("ab") as f:
        f.write(b"\x50\x00\x00\x00garbage")  # a record header running past the end
    with open_engine(tmp_path) as engine:
        assert engine.profiles.get(T, "alice")["goals"] == ["kept"]
        engine.profiles.update(T, "alice", {"goals": ["after"]})
    with open_engine(tmp_path) as engine:
        assert engine.profiles.get(T, "alice")["goals"] == ["kept", "after"]
