"""Tasks and global state in-process on `Engine` (AIWhisperer's), replay and checkpoints."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.domain.tasks import MAX_GLOBAL_KEYS, GlobalMode, TaskStatus
from stratad.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)

T = "default"
S = "runner"


@contextlib.contextmanager
def open_engine(data_dir: Path) -> Iterator[Engine]:
    engine = Engine(data_dir, durability="none")
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with open_engine(tmp_path) as engine:
        engine.sessions.create(T, S)
        yield engine


def test_status_and_result_create_the_task_as_the_seed_does(engine: Engine) -> None:
    tasks = engine.tasks
    task = tasks.update_status(T, S, "t1", TaskStatus.PENDING).result
    assert task["status"] == "pending" and task["created_at"] == task["updated_at"]
    tasks.store_result(T, S, "t2", {"rows": 3})  # created by its result: no status yet
    tasks.update_status(T, S, "t1", "in-progress")
    tasks.store_result(T, S, "t1", [1, "two", None, True, {"x": 1.5}])
    t1 = tasks.get_task(T, S, "t1").result
    assert t1["status"] == "in-progress"
    assert t1["result"] == [1, "two", None, True, {"x": 1.5}]
    assert "status" not in tasks.get_task(T, S, "t2").result
    listed = tasks.list_tasks(T, S).result
    assert [task_id for task_id, _ in listed] == ["t1", "t2"]
    assert [i for i, _ in tasks.list_tasks(T, S, TaskStatus.IN_PROGRESS).result] == ["t1"]
    assert tasks.list_tasks(T, S, "failed").result == []
    update = tasks.update_status(T, S, "t1", TaskStatus.COMPLETED).result
    assert "result" not in update  # the status answer leaves the result out


def test_task_bad_input(engine: Engine) -> None:
    tasks = engine.tasks
    with pytest.raises(InvalidArgumentError, match="task_id"):
        tasks.update_status(T, S, "../x", TaskStatus.PENDING)
    with pytest.raises(InvalidArgumentError, match="unknown task status"):
        tasks.update_status(T, S, "t", "done")
    with pytest.raises(InvalidArgumentError, match="not a JSON value"):
        tasks.store_result(T, S, "t", {"x": float("nan")})
    with pytest.raises(InvalidArgumentError, match="limit"):
        tasks.store_result(T, S, "t", "x" * (1 << 20))
    with pytest.raises(NotFoundError, match="task 't' not found"):
        tasks.get_task(T, S, "t")
    with pytest.raises(NotFoundError):
        tasks.update_status(T, "missing", "t", TaskStatus.PENDING)
    assert engine.sessions.info(T, S).version == 1


def test_global_state_set_append_merge(engine: Engine) -> None:
    tasks = engine.tasks
    assert tasks.get_global(T, S).result == {}
    tasks.update_global(T, S, "file_paths", [])
    tasks.update_global(T, S, "file_paths", "out/a.txt", mode=GlobalMode.APPEND)
    new = tasks.update_global(T, S, "file_paths", "out/b.txt", mode="append").result
    assert new == ["out/a.txt", "out/b.txt"]
    tasks.update_global(T, S, "other_context", {"lang": "py"}, mode=GlobalMode.MERGE)
    tasks.update_global(T, S, "other_context", {"model": "x"}, mode=GlobalMode.MERGE)
    tasks.update_global(T, S, "counter", 3)
    assert tasks.get_global(T, S, "other_context").result == {"lang": "py", "model": "x"}
    assert tasks.get_global(T, S).result == {
        "file_paths": ["out/a.txt", "out/b.txt"],
        "other_context": {"lang": "py", "model": "x"},
        "counter": 3,
    }
    with pytest.raises(NotFoundError, match="'nope' is not set"):
        tasks.get_global(T, S, "nope")
    with pytest.raises(FailedPreconditionError, match="list"):
        tasks.update_global(T, S, "counter", 1, mode=GlobalMode.APPEND)
    with pytest.raises(FailedPreconditionError, match="object"):
        tasks.update_global(T, S, "counter", {"a": 1}, mode=GlobalMode.MERGE)
    with pytest.raises(InvalidArgumentError, match="object value"):
        tasks.update_global(T, S, "other_context", [1], mode=GlobalMode.MERGE)
    with pytest.raises(InvalidArgumentError, match="key"):
        tasks.update_global(T, S, "", 1)
    with pytest.raises(InvalidArgumentError, match="key"):
        tasks.update_global(T, S, "a\x00b", 1)
    with pytest.raises(InvalidArgumentError, match="mode"):
        tasks.update_global(T, S, "k", 1, mode="replace")


def test_global_state_key_limit(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stratad.domain.tasks.MAX_GLOBAL_KEYS", 2)
    engine.tasks.update_global(T, S, "a", 1)
    engine.tasks.update_global(T, S, "b", 1)
    engine.tasks.update_global(T, S, "a", 2)  # an existing key is fine
    with pytest.raises(ResourceExhaustedError, match="2 global state keys"):
        engine.tasks.update_global(T, S, "c", 1)
    assert MAX_GLOBAL_KEYS == 10_000


def populate(engine: Engine) -> Any:
    engine.tasks.update_status(T, S, "t1", TaskStatus.FAILED)
    engine.tasks.store_result(T, S, "t1", {"error": "timeout"})
    engine.tasks.update_global(T, S, "file_paths", "x", mode=GlobalMode.APPEND)
    engine.tasks.update_global(T, S, "other_context", {"a": 1}, mode=GlobalMode.MERGE)
    return engine.tasks.list_tasks(T, S).result, engine.tasks.get_global(T, S).result


def test_a_reopened_engine_replays_the_tasks(tmp_path: Path) -> None:
    with open_engine(tmp_path) as engine:
        engine.sessions.create(T, S)
        expected = populate(engine)
    with open_engine(tmp_path) as engine:
        assert (engine.tasks.list_tasks(T, S).result, engine.tasks.get_global(T, S).result) == (
            expected
        )


def test_checkpoints_capture_and_restore_the_tasks(engine: Engine) -> None:
    expected = populate(engine)
    saved = engine.checkpoints.save_state(T, S, SaveInput(data=b"{}"))
    engine.tasks.update_status(T, S, "t1", TaskStatus.COMPLETED)
    engine.tasks.update_global(T, S, "file_paths", "y", mode=GlobalMode.APPEND)
    engine.checkpoints.restore_checkpoint(T, saved.checkpoint.checkpoint_id, make_current=True)
    assert (engine.tasks.list_tasks(T, S).result, engine.tasks.get_global(T, S).result) == expected
