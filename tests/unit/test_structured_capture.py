"""Checkpoints capture structured state by reference, stored like a state.

A session with a large cognitive state must not copy that state into every
checkpoint (journal and memory): each checkpoint stores it as deduplicated
objects, and restore/fork bring the exact state back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine

TENANT = "default"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path / "data", fsync_interval=3600.0)
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


def decisions(engine: Engine, session: str, start: int, count: int) -> None:
    for step in range(start, start + count):
        engine.cognitive.record_decision(
            TENANT, session, step=step, decision=f"decision {step} " * 8, rationale="because " * 8
        )


def journal_size(engine: Engine, session: str) -> int:
    return engine.sessions.live(TENANT, session).journal.size


def test_saves_do_not_copy_a_large_structured_state_into_the_journal(engine: Engine) -> None:
    engine.sessions.create(TENANT, "s")
    engine.cognitive.initialize(TENANT, "s", goal="big state")
    decisions(engine, "s", 0, 2000)  # ~300 KB of structured state
    engine.checkpoints.save_state(TENANT, "s", SaveInput(data=b"state 0"))
    before = journal_size(engine, "s")
    for i in range(1, 21):
        engine.checkpoints.save_state(TENANT, "s", SaveInput(data=f"state {i}".encode()))
    # Unchanged structured state: each save reuses the capture (a record of ~1 KB).
    assert journal_size(engine, "s") - before < 20 * 2_000
    decisions(engine, "s", 2000, 10)
    grown = journal_size(engine, "s")
    engine.checkpoints.save_state(TENANT, "s", SaveInput(data=b"state after growth"))
    # Grown by a few decisions: the capture adds new chunks and a delta, not 300 KB.
    assert journal_size(engine, "s") - grown < 40_000


def test_restore_and_fork_bring_back_the_captured_structured_state(engine: Engine) -> None:
    engine.sessions.create(TENANT, "s")
    engine.cognitive.initialize(TENANT, "s", goal="restore me")
    decisions(engine, "s", 0, 500)
    early = engine.checkpoints.save_state(TENANT, "s", SaveInput(data=b"early")).checkpoint
    captured = engine.cognitive.state(TENANT, "s").result
    decisions(engine, "s", 500, 50)
    assert engine.cognitive.state(TENANT, "s").result != captured

    forked = engine.checkpoints.fork_session(TENANT, early.checkpoint_id, new_session_id="f")
    assert engine.cognitive.state(TENANT, forked.session_id).result == captured
    engine.checkpoints.restore_checkpoint(TENANT, early.checkpoint_id, make_current=True)
    assert engine.cognitive.state(TENANT, "s").result == captured


def test_captured_structured_state_survives_gc_and_reopen(tmp_path: Path) -> None:
    with_engine = Engine(tmp_path / "data", fsync_interval=3600.0)
    with_engine.open()
    with_engine.sessions.create(TENANT, "s")
    with_engine.cognitive.initialize(TENANT, "s", goal="keep me")
    decisions(with_engine, "s", 0, 300)
    cp = with_engine.checkpoints.save_state(TENANT, "s", SaveInput(data=b"x")).checkpoint
    captured = with_engine.cognitive.state(TENANT, "s").result
    decisions(with_engine, "s", 300, 30)
    with_engine.admin.collect_garbage(TENANT)
    assert with_engine.admin.verify(TENANT).ok
    with_engine.close()

    reopened = Engine(tmp_path / "data", fsync_interval=3600.0)
    reopened.open()
    try:
        reopened.checkpoints.restore_checkpoint(TENANT, cp.checkpoint_id, make_current=True)
        assert reopened.cognitive.state(TENANT, "s").result == captured
    finally:
        reopened.close()
