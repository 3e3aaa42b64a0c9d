"""stratad.compat.aiwhisperer's task and global-state helpers, on a dict and bound to a daemon."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stratad.compat import aiwhisperer
from stratad.compat.aiwhisperer import (
    BoundState,
    bind,
    get_global_state,
    get_task_result,
    load_state,
    save_state,
    store_task_result,
    update_global_state,
    update_task_status,
)


@pytest.fixture
def configured(daemon: Any) -> Iterator[Any]:
    aiwhisperer.configure(address=daemon.target)
    yield daemon
    aiwhisperer.close()


def test_on_a_plain_dict_the_helpers_are_the_seeds() -> None:
    state: dict[str, Any] = {}
    assert update_task_status(state, "t1", "pending") is state
    assert store_task_result(state, "t1", {"rows": 3}) is state
    store_task_result(state, "t2", [1])
    update_task_status(state, "t3", "whatever the caller says")  # AIWhisperer does not check
    assert update_global_state(state, "file_paths", ["a"]) is state
    assert state == {
        "tasks": {
            "t1": {"status": "pending", "result": {"rows": 3}},
            "t2": {"result": [1]},
            "t3": {"status": "whatever the caller says"},
        },
        "global_state": {"file_paths": ["a"]},
    }
    assert get_task_result(state, "t1") == {"rows": 3}
    assert get_task_result(state, "t3") is None and get_task_result(state, "nope") is None
    assert get_global_state(state, "file_paths") == ["a"]
    assert get_global_state({}, "file_paths") is None


def test_a_bound_state_updates_the_daemon(configured: Any, tmp_path: Path) -> None:
    path = tmp_path / "runner_state.json"
    state = bind(path)
    assert isinstance(state, BoundState) and state == {"tasks": {}, "global_state": {}}
    update_task_status(state, "t1", "IN_PROGRESS")
    store_task_result(state, "t1", {"rows": 3, "ratio": 0.5})
    update_global_state(state, "file_paths", ["out/a.md"])
    update_global_state(state, "other_context", {"model": "x"})
    assert state == {
        "tasks": {"t1": {"status": "in-progress", "result": {"rows": 3, "ratio": 0.5}}},
        "global_state": {"file_paths": ["out/a.md"], "other_context": {"model": "x"}},
    }
    other = bind(path)  # another process binding the same path sees it all
    assert other == state
    assert get_task_result(other, "t1") == {"rows": 3, "ratio": 0.5}
    assert get_task_result(other, "unknown") is None
    update_task_status(other, "t2", "pending")
    assert get_task_result(other, "t2") is None  # no result yet
    assert get_global_state(other, "other_context") == {"model": "x"}
    assert get_global_state(other, "missing") is None
    assert state.refresh()["tasks"]["t2"] == {"status": "pending"}
    with pytest.raises(ValueError, match="unknown task status"):
        update_task_status(state, "t1", "done")
    # save_state of the bound dict: a checkpoint of the same session
    save_state(state, path)
    assert load_state(path) == state


def test_bind_by_session_id(configured: Any) -> None:
    state = bind(session_id="runner-42")
    update_global_state(state, "k", 1)
    assert bind(session_id="runner-42")["global_state"] == {"k": 1}
    with pytest.raises(ValueError):
        bind()


def test_concurrent_writers_of_a_bound_session_lose_nothing(configured: Any) -> None:
    states = [bind(session_id="shared") for _ in range(4)]

    def work(n: int) -> None:
        for i in range(25):
            update_task_status(states[n], f"w{n}-{i}", "completed")
            update_global_state(states[n], f"w{n}-{i}", i)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = bind(session_id="shared")
    assert len(final["tasks"]) == 100 and len(final["global_state"]) == 100
    assert all(t == {"status": "completed"} for t in final["tasks"].values())
