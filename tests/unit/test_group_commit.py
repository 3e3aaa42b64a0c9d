"""The group committer's action on a durable commit (store/commit.py).

The native front door answers a save from the committer thread through
`wait(points, on_durable)`: the action must run only once the journal is
synced, before the waiting call resumes, and never when the fsync failed.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratad.store.commit import GroupCommitter
from stratad.store.failstop import StorageFailedError
from stratad.store.journal import Journal, Record


@dataclass(frozen=True)
class Point:
    journal: Journal
    offset: int


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    journal = Journal(tmp_path / "journal", durable=True, preallocate=True)
    try:
        yield journal
    finally:
        journal.close()


@pytest.fixture
def committer() -> Iterator[GroupCommitter]:
    committer = GroupCommitter()
    try:
        yield committer
    finally:
        committer.stop()


def test_the_action_runs_on_the_committer_thread_once_the_record_is_durable(
    journal: Journal, committer: GroupCommitter
) -> None:
    seen: list[tuple[str, bool]] = []
    order: list[str] = []
    offset = journal.append(Record("note", {"i": 1}, []))

    def on_durable() -> None:
        seen.append((threading.current_thread().name, journal.needs_sync(offset)))
        order.append("action")

    async def save() -> None:
        await committer.wait([Point(journal, offset)], on_durable)
        order.append("resumed")

    asyncio.run(save())
    assert seen == [("stratad-commit", False)]
    assert order == ["action", "resumed"]


def test_no_action_when_the_fsync_fails(
    journal: Journal, committer: GroupCommitter, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing)
    offset = journal.append(Record("note", {"i": 1}, []))
    called: list[bool] = []
    with pytest.raises(StorageFailedError):
        asyncio.run(committer.wait([Point(journal, offset)], lambda: called.append(True)))
    assert called == []


def test_a_failing_action_still_wakes_its_caller(
    journal: Journal, committer: GroupCommitter
) -> None:
    offset = journal.append(Record("note", {"i": 1}, []))

    def broken() -> None:
        raise RuntimeError("the answer could not be sent")

    asyncio.run(committer.wait([Point(journal, offset)], broken))
    assert not journal.needs_sync(offset)
