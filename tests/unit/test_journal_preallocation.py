"""Open journals keep zeros after their records (store/journal.py, "Preallocation").

What a user would notice if this went wrong: records lost or cut after a
crash (the zeros taken for damage, or a record written after them), a torn
append no longer told from the zeros, files at rest bigger than their
records, or disk use growing without bound.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.store.journal import (
    PREALLOCATE_BLOCK,
    PREALLOCATE_FRACTION,
    Journal,
    Record,
    read_records,
    truncate,
)

TENANT = "default"
AFTER = b"saved after the crash" * 100


def record(i: int, blob_bytes: int = 700) -> Record:
    return Record("note", {"i": i}, [os.urandom(blob_bytes)])


def test_records_are_written_into_zeros_kept_after_them(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal = Journal(path, durable=True, preallocate=True)
    try:
        for i in range(300):
            journal.sync(journal.append(record(i)))
            file_size = path.stat().st_size
            assert file_size >= journal.size
            # Bounded: 1/8 of the records ahead, rounded up to a block.
            ahead = journal.size // PREALLOCATE_FRACTION + PREALLOCATE_BLOCK
            assert file_size - journal.size <= ahead
        data = path.read_bytes()
        assert path.stat().st_size > journal.size, "no space was kept ahead"
        assert data[journal.size :] == bytes(len(data) - journal.size)
        replay = read_records(path)
        assert [r.body["i"] for r in replay.records] == list(range(300))
        assert replay.valid_bytes == journal.size
        assert replay.zero_tail and replay.corrupt_at is None
    finally:
        journal.close()


def test_closing_leaves_the_file_ending_with_its_last_record(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal = Journal(path, durable=True, preallocate=True)
    for i in range(50):
        journal.append(record(i))
    size = journal.size
    journal.close()
    assert path.stat().st_size == size
    replay = read_records(path)
    assert len(replay.records) == 50 and replay.torn_bytes == 0


def test_a_torn_append_into_the_zeros_is_still_a_torn_record(tmp_path: Path) -> None:
    """A crash mid-write leaves part of a record, then zeros: cut as a torn tail,
    never mistaken for preallocated space alone."""
    path = tmp_path / "journal"
    journal = Journal(path, durable=True, preallocate=True)
    for i in range(20):
        journal.append(record(i))
    good_end = journal.size
    torn = record(20).encode()
    data = bytearray(path.read_bytes())
    data[good_end : good_end + len(torn) // 2] = torn[: len(torn) // 2]
    journal.close()
    path.write_bytes(bytes(data) + bytes(4096))
    replay = read_records(path)
    assert len(replay.records) == 20 and replay.valid_bytes == good_end
    assert replay.torn_bytes and not replay.zero_tail


def save(engine: Engine, session_id: str, data: bytes) -> str:
    result = engine.checkpoints.save_state(TENANT, session_id, SaveInput(data=data))
    return result.checkpoint.checkpoint_id


def test_a_crash_leaves_zeros_that_recovery_cuts_keeping_every_save(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A copy of the data directory taken while the engine runs is what a SIGKILL
    leaves: the journal with its zeros. Every acknowledged save replays, the zeros
    are cut without a torn-tail warning, and records saved after the recovery
    follow the old ones (not the zeros) and replay too."""
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    engine = Engine(live, fsync_interval=3600.0)
    engine.open()
    try:
        engine.sessions.create(TENANT, "agent")
        saved = {save(engine, "agent", os.urandom(300) * (i + 1)): i for i in range(40)}
        journal = engine.sessions.live(TENANT, "agent").journal
        assert journal.path.stat().st_size > journal.size  # zeros on disk now
        shutil.copytree(live, crashed)
    finally:
        engine.close()

    def states(engine: Engine) -> dict[str, int]:
        return {
            cid: len(engine.checkpoints.load_state(TENANT, "agent", cid).data) // 300 - 1
            for cid in saved
        }

    engine = Engine(crashed, fsync_interval=3600.0)
    with caplog.at_level(logging.INFO, logger="stratad.domain.sessions"):
        report = engine.open()
    try:
        assert report.get("zero_tails_cut") == 1 and not report.get("torn_tails_cut")
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert states(engine) == saved
        later = save(engine, "agent", AFTER)
    finally:
        engine.close()
    engine = Engine(crashed, fsync_interval=3600.0)
    report = engine.open()
    try:
        assert not report.get("zero_tails_cut") and not report.get("torn_tails_cut")
        assert states(engine) == saved
        assert engine.checkpoints.load_state(TENANT, "agent", later).data == AFTER
        assert engine.admin.verify().ok
    finally:
        engine.close()


@st.composite
def crash_cases(draw: st.DrawFn) -> tuple[list[tuple[int, bool]], float, bool]:
    """Appends (blob size, fsync after it?), where in the unsynced bytes the
    crash falls (a fraction), and whether the bytes after it read as zeros
    (preallocated space already on disk) or are missing (the file ends)."""
    ops = draw(st.lists(st.tuples(st.integers(0, 9000), st.booleans()), min_size=1, max_size=40))
    return ops, draw(st.floats(0.0, 1.0)), draw(st.booleans())


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(crash_cases())
def test_a_crash_anywhere_keeps_every_synced_record_and_nothing_else(
    tmp_path_factory: pytest.TempPathFactory, case: tuple[list[tuple[int, bool]], float, bool]
) -> None:
    """What a crash can leave of a preallocated journal: every byte written up
    to some point at or after the last fdatasync, then zeros or nothing.
    Recovery must return exactly the records appended up to some point at or
    after the last synced one, never report damage, and take new records
    after them that replay in turn."""
    ops, where, zeros_after = case
    path = tmp_path_factory.mktemp("crash") / "journal"
    journal = Journal(path, durable=True, preallocate=True)
    ends, synced_count, synced_end = [], 0, 0
    for i, (blob_bytes, sync) in enumerate(ops):
        ends.append(journal.append(Record("note", {"i": i}, [bytes([i + 1]) * blob_bytes])))
        if sync:
            journal.sync(ends[-1])
            synced_count, synced_end = i + 1, ends[-1]
    written = path.read_bytes()  # records, then the preallocated zeros
    journal.close()
    cut = synced_end + int(where * (len(written) - synced_end))
    left = written[:cut] + (bytes(len(written) - cut) if zeros_after else b"")
    path.write_bytes(left)

    replay = read_records(path)
    kept = [r.body["i"] for r in replay.records]
    assert replay.corrupt_at is None
    assert kept == list(range(len(kept))) and len(kept) >= synced_count
    assert replay.valid_bytes == (ends[len(kept) - 1] if kept else 0)

    truncate(path, replay.valid_bytes)  # what recovery does before reopening
    again = Journal(path, durable=True, preallocate=True)
    again.sync(again.append(Record("note", {"i": "after"}, [b"new"])))
    again.close()
    assert [r.body["i"] for r in read_records(path).records] == [*kept, "after"]
