"""stratad.compat.marsys against a real ``stratad serve`` subprocess.

The examples of MARSYS's state management documentation run here as written,
apart from the import and the daemon's address. pytest-asyncio is not a
dependency: each test drives its coroutine with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, TypeVar

import pytest

import stratad
from stratad.api.v1 import common_pb2
from stratad.compat.marsys import (
    SNAPSHOT_CONTENT_TYPE,
    SidecarStorageBackend,
    StateManager,
    StateSnapshot,
    StorageBackend,
)
from stratad.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)

T = TypeVar("T")


class StateError(Exception):
    """MARSYS's example raises this name; MARSYS defines it elsewhere."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def snapshot_at(session_id: str, step: int) -> StateSnapshot:
    """A snapshot whose content says which step made it."""
    return StateSnapshot(
        session_id=session_id,
        timestamp=1_700_000_000.0 + step,
        branches={f"branch_{step}": {"id": f"branch_{step}", "status": "running", "step": step}},
        active_branches={f"branch_{step}", "main"},
        completed_branches={f"branch_{i}" for i in range(step)},
        waiting_branches={"main": {f"branch_{step}"}},
        branch_results={"main": {"step": step}},
        parent_child_map={"main": [f"branch_{step}"]},
        child_parent_map={f"branch_{step}": "main"},
        metadata={"step": step},
    )


def session_status(address: str, session_id: str) -> int:
    with stratad.Client(address) as client:
        return int(client.get_session(session_id).status)


# -- MARSYS's examples --------------------------------------------------------------------


def test_seed_state_manager_example(daemon: Any) -> None:
    serialized_branches = {
        "branch_0": {"id": "branch_0", "status": "completed"},
        "branch_1": {"id": "branch_1", "status": "running"},
        "branch_2": {"id": "branch_2", "status": "pending"},
    }

    async def example() -> tuple[StateSnapshot, str, dict[str, Any] | None, list[dict[str, Any]]]:
        # MARSYS: storage = FileStorageBackend(Path("./state"))
        storage = SidecarStorageBackend(daemon.target)
        state_manager = StateManager(storage)

        # Save state
        snapshot = StateSnapshot(
            session_id="session_123",
            timestamp=time.time(),
            branches=serialized_branches,
            active_branches={"branch_1", "branch_2"},
            completed_branches={"branch_0"},
        )
        await state_manager.save_state("session_123", snapshot)

        # Create checkpoint
        checkpoint_id = await state_manager.create_checkpoint(
            "session_123", checkpoint_name="before_critical_section"
        )

        # Resume later
        state = await state_manager.resume_execution("session_123")
        checkpoints = await state_manager.list_checkpoints("session_123")
        await state_manager.close()
        return snapshot, checkpoint_id, state, checkpoints

    snapshot, checkpoint_id, state, checkpoints = run(example())
    assert snapshot.validate_checksum()  # save_state set it
    assert state == snapshot.to_dict()
    assert state["active_branches"] == ["branch_1", "branch_2"]
    assert state["branches"] == serialized_branches
    named = [cp for cp in checkpoints if cp["name"] == "before_critical_section"]
    assert [cp["id"] for cp in named] == [checkpoint_id]
    assert set(named[0]) >= {"id", "name", "created_at", "metadata", "size"}
    assert abs(named[0]["created_at"] - time.time()) < 60


def test_seed_checkpoint_examples(daemon: Any) -> None:
    async def example() -> tuple[str, StateSnapshot | None, list[str]]:
        state_manager = StateManager(address=daemon.target)
        await state_manager.save_state("session_123", snapshot_at("session_123", 1))

        # Manual checkpoint
        checkpoint_id = await state_manager.create_checkpoint(
            session_id="session_123",
            checkpoint_name="milestone_1",
            metadata={
                "progress": 0.5,
                "stage": "data_processing",
                "timestamp": datetime.now().isoformat(),
            },
        )
        printed = []
        # List available checkpoints
        checkpoints = await state_manager.list_checkpoints("session_123")
        for cp in checkpoints:
            printed.append(f"{cp['id']}: {cp['name']} - {cp['created_at']}")
        # Restore specific checkpoint
        state = await state_manager.restore_checkpoint(checkpoint_id)
        if state:
            printed.append(f"Restored from checkpoint: {state.session_id}")
        await state_manager.close()
        return checkpoint_id, state, printed

    checkpoint_id, state, printed = run(example())
    assert state is not None
    assert state == dataclasses.replace(snapshot_at("session_123", 1), checksum=state.checksum)
    assert printed[0].startswith(f"{checkpoint_id}: milestone_1 - ")
    assert printed[-1] == "Restored from checkpoint: session_123"


def test_seed_snapshot_example_checksum() -> None:
    snapshot = StateSnapshot(
        session_id="session_123",
        timestamp=time.time(),
        branches={
            "branch_1": {"id": "branch_1", "status": "running"},
            "branch_2": {"id": "branch_2", "status": "pending"},
        },
        active_branches={"branch_1"},
        completed_branches=set(),
        waiting_branches={},
        branch_results={},
        parent_child_map={},
        child_parent_map={},
    )

    # Calculate integrity checksum
    snapshot.checksum = snapshot.calculate_checksum()

    # Validate later
    if not snapshot.validate_checksum():
        raise StateError("State corruption detected")

    assert len(snapshot.checksum) == 64
    tampered = StateSnapshot.from_dict(snapshot.to_dict())
    assert tampered.validate_checksum()
    tampered.branches["branch_2"]["status"] = "completed"
    assert not tampered.validate_checksum()
    with pytest.raises(StateError):
        if not tampered.validate_checksum():
            raise StateError("State corruption detected")
    tampered = StateSnapshot.from_dict(snapshot.to_dict())
    tampered.active_branches.add("branch_2")
    assert not tampered.validate_checksum()
    assert not StateSnapshot("s", 1.0).validate_checksum()  # no checksum: nothing vouches


def test_snapshot_dict_round_trip_and_stable_checksum() -> None:
    snapshot = snapshot_at("s-1", 3)
    as_dict = snapshot.to_dict()
    assert as_dict["active_branches"] == ["branch_3", "main"]
    assert as_dict["waiting_branches"] == {"main": ["branch_3"]}
    assert json.loads(json.dumps(as_dict)) == as_dict
    back = StateSnapshot.from_dict(json.loads(json.dumps(as_dict)))
    assert back == snapshot
    assert back.calculate_checksum() == snapshot.calculate_checksum()
    assert StateSnapshot.from_dict({"session_id": "s", "timestamp": 2, "x": 1}).branches == {}


def test_checksum_ignores_key_order() -> None:
    one = StateSnapshot("s", 1.0, branches={"a": {"x": 1, "y": 2}, "b": {}})
    two = StateSnapshot("s", 1.0, branches={"b": {}, "a": {"y": 2, "x": 1}})
    assert one.calculate_checksum() == two.calculate_checksum()
    assert list(two.to_dict()["branches"]) == ["b", "a"]  # stored in the caller's order


def test_checksum_is_the_same_in_every_process() -> None:
    """Set order depends on the hash seed; the checksum must not."""
    code = (
        "from stratad.compat.marsys import StateSnapshot\n"
        "s = StateSnapshot('s', 1.5, active_branches={'a', 'b', 'c', 'd', 'e', 'f'},\n"
        "                  waiting_branches={'p': {'x', 'y', 'z'}})\n"
        "print(s.calculate_checksum())\n"
    )
    sums = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        sums.add(out.stdout.strip())
    assert len(sums) == 1


# -- StateManager behaviour -------------------------------------------------------------


def test_max_checkpoints_per_session(daemon: Any) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], list[str], StateSnapshot | None]:
        manager = StateManager(address=daemon.target, max_checkpoints_per_session=10)
        named = []
        for step in range(15):
            await manager.save_state("retained", snapshot_at("retained", step))
            if step in (2, 11):
                named.append(await manager.create_checkpoint("retained", f"named_{step}"))
        checkpoints = await manager.list_checkpoints("retained")
        early = await manager.restore_checkpoint(named[0])
        await manager.close()
        return checkpoints, named, early

    checkpoints, named, early = run(scenario())
    unnamed = [cp for cp in checkpoints if cp["name"] is None]
    assert len(unnamed) == 10
    assert sorted(cp["id"] for cp in checkpoints if cp["name"]) == sorted(named)
    assert len(checkpoints) == 12
    created = [cp["created_at"] for cp in checkpoints]
    assert created == sorted(created, reverse=True)  # newest first
    # The named checkpoint outlives the unnamed one it pinned.
    assert early is not None and early.metadata == {"step": 2}
    assert early.validate_checksum()


def test_pause_resume_round_trip(daemon: Any) -> None:
    current_state = {
        "branches": {"b1": {"id": "b1", "status": "waiting", "memory": {"agent": [{"x": 1}]}}},
        "active_branches": ["b1"],
        "waiting_branches": {"root": ["b1"]},
        "metadata": {"reason": "user_input"},
        "step": 7,
        "note": "ünïcode ✓",
    }

    async def scenario() -> tuple[
        dict[str, Any] | None, int, StateSnapshot | None, dict[str, Any] | None
    ]:
        manager = StateManager(address=daemon.target)
        await manager.pause_execution("session_p", current_state)
        paused = session_status(daemon.target, "session_p")
        view = await manager.load_state("session_p")
        state = await manager.resume_execution("session_p")
        again = await manager.resume_execution("session_p")  # not paused: still the state
        await manager.close()
        return state, paused, view, again

    state, paused, view, again = run(scenario())
    assert paused == common_pb2.SESSION_STATUS_PAUSED
    assert state == current_state
    assert state is not None and list(state) == list(current_state)  # key order kept
    assert again == current_state
    assert session_status(daemon.target, "session_p") == common_pb2.SESSION_STATUS_ACTIVE
    assert view is not None
    assert view.session_id == "session_p"
    assert view.active_branches == {"b1"}
    assert view.waiting_branches == {"root": {"b1"}}
    assert view.metadata == {"reason": "user_input"}
    assert view.validate_checksum()


def test_restore_checkpoint_returns_the_snapshot_as_it_was(daemon: Any) -> None:
    async def scenario() -> tuple[StateSnapshot | None, StateSnapshot | None, Any]:
        manager = StateManager(address=daemon.target)
        await manager.save_state("session_r", snapshot_at("session_r", 1))
        checkpoint_id = await manager.create_checkpoint("session_r", "v1", {"stage": "one"})
        await manager.save_state("session_r", snapshot_at("session_r", 2))
        restored = await manager.restore_checkpoint(checkpoint_id)
        latest = await manager.load_state("session_r")
        unknown = await manager.restore_checkpoint("checkpoint_abc123")
        listed = await manager.list_checkpoints("session_r")
        await manager.close()
        return restored, latest, (unknown, listed, checkpoint_id)

    restored, latest, (unknown, listed, checkpoint_id) = run(scenario())
    assert restored is not None and latest is not None
    assert restored.to_dict() == snapshot_at("session_r", 1).to_dict() | {
        "checksum": restored.checksum
    }
    assert restored.validate_checksum()
    assert latest.metadata == {"step": 2}  # restoring did not move the head
    assert unknown is None
    (named,) = [cp for cp in listed if cp["id"] == checkpoint_id]
    assert named["name"] == "v1"
    assert named["metadata"] == {"stage": "one"}
    assert named["size"] > 0


def test_large_growing_snapshots(daemon: Any) -> None:
    """States past the SDK's chunked-upload threshold, with retention dropping bases."""

    def big(step: int) -> StateSnapshot:
        snapshot = snapshot_at("big", step)
        snapshot.branches = {
            f"b{i}": {"id": f"b{i}", "memory": [f"message {i}.{j} " * 20 for j in range(8)]}
            for i in range(40 + 10 * step)
        }
        return snapshot

    async def scenario() -> list[tuple[StateSnapshot | None, StateSnapshot]]:
        manager = StateManager(address=daemon.target, max_checkpoints_per_session=3)
        pairs = []
        for step in range(8):
            await manager.save_state("big", big(step))
            checkpoint_id = await manager.create_checkpoint("big", f"step_{step}")
            pairs.append((checkpoint_id, big(step)))
        with stratad.Client(daemon.target) as other:  # deleted behind the manager's back
            other.delete_session("big")
        await manager.save_state("big", big(9))
        out = [(await manager.restore_checkpoint(cid), snap) for cid, snap in pairs[-1:]]
        out.append((await manager.load_state("big"), big(9)))
        await manager.close()
        return out

    results = run(scenario())
    assert len(json.dumps(big(0).to_dict())) > 64 << 10  # past the chunked-upload threshold
    assert results[0][0] is None  # its session was deleted
    loaded, expected = results[1]
    assert loaded is not None
    assert loaded == dataclasses.replace(expected, checksum=loaded.checksum)
    assert loaded.validate_checksum()


def test_list_and_delete_sessions(daemon: Any) -> None:
    async def scenario() -> dict[str, Any]:
        manager = StateManager(address=daemon.target)
        await manager.save_state("session_a", snapshot_at("session_a", 1))
        await manager.save_state("session_b", snapshot_at("session_b", 1))
        checkpoint_id = await manager.create_checkpoint("session_a", "keep")
        before = await manager.list_sessions()
        await manager.delete_session("session_a")
        await manager.delete_session("session_a")  # already gone: no error
        out = {
            "before": before,
            "after": await manager.list_sessions(),
            "load": await manager.load_state("session_a"),
            "resume": await manager.resume_execution("session_a"),
            "checkpoints": await manager.list_checkpoints("session_a"),
            "restore": await manager.restore_checkpoint(checkpoint_id),
        }
        await manager.close()
        return out

    out = run(scenario())
    assert out["before"] == ["session_a", "session_b"]
    assert out["after"] == ["session_b"]
    assert out["load"] is None
    assert out["resume"] is None
    assert out["checkpoints"] == []
    assert out["restore"] is None


def test_unknown_session(daemon: Any) -> None:
    async def scenario() -> None:
        manager = StateManager(address=daemon.target)
        assert await manager.load_state("never_saved") is None
        assert await manager.resume_execution("never_saved") is None
        assert await manager.list_checkpoints("never_saved") == []
        assert await manager.list_sessions() == []
        with pytest.raises(NotFoundError):
            await manager.create_checkpoint("never_saved", "nothing")
        with pytest.raises(InvalidArgumentError):
            await manager.save_state("not a valid/id", snapshot_at("x", 1))
        await manager.close()

    run(scenario())


def test_checkpoint_of_a_session_without_state(daemon: Any) -> None:
    with stratad.Client(daemon.target) as client:
        client.create_session("empty_session")

    async def scenario() -> None:
        manager = StateManager(address=daemon.target)
        assert await manager.load_state("empty_session") is None
        with pytest.raises(FailedPreconditionError):
            await manager.create_checkpoint("empty_session")
        await manager.close()

    run(scenario())


def test_checksum_mismatch_is_data_loss(daemon: Any) -> None:
    bad = snapshot_at("tampered", 1).to_dict() | {"checksum": "0" * 64}
    with stratad.Client(daemon.target) as client:
        client.create_session("tampered")
        client.save_state("tampered", json.dumps(bad).encode(), content_type=SNAPSHOT_CONTENT_TYPE)

    async def scenario() -> StateSnapshot | None:
        checked = StateManager(address=daemon.target)
        with pytest.raises(DataLossError, match="checksum"):
            await checked.load_state("tampered")
        with pytest.raises(DataLossError):
            await checked.resume_execution("tampered")
        await checked.close()
        unchecked = StateManager(address=daemon.target, enable_checksum=False)
        loaded = await unchecked.load_state("tampered")
        await unchecked.close()
        return loaded

    loaded = run(scenario())
    assert loaded is not None and loaded.checksum == "0" * 64


def test_save_without_checksum_leaves_it_unset(daemon: Any) -> None:
    async def scenario() -> StateSnapshot | None:
        manager = StateManager(address=daemon.target, enable_checksum=False)
        snapshot = snapshot_at("no_sum", 1)
        await manager.save_state("no_sum", snapshot)
        assert snapshot.checksum == ""
        await manager.close()
        checked = StateManager(address=daemon.target)
        loaded = await checked.load_state("no_sum")  # nothing to verify: loads
        await checked.close()
        return loaded

    loaded = run(scenario())
    assert loaded is not None and loaded.checksum == ""


def test_one_manager_across_event_loops(daemon: Any) -> None:
    """Created outside any loop, used from two asyncio.run calls (one channel each)."""
    manager = StateManager(address=daemon.target)
    run(manager.save_state("loops", snapshot_at("loops", 1)))
    loaded = run(manager.load_state("loops"))
    assert loaded is not None and loaded.metadata == {"step": 1}
    run(manager.close())


def test_constructor_arguments() -> None:
    class InMemoryBackend(StorageBackend):
        """MARSYS's custom-backend pattern."""

        def __init__(self) -> None:
            self.data: dict[str, dict[str, Any]] = {}

        async def save(self, key: str, data: dict[str, Any]) -> None:
            self.data[key] = data

        async def load(self, key: str) -> dict[str, Any] | None:
            return self.data.get(key)

        async def delete(self, key: str) -> None:
            self.data.pop(key, None)

        async def list_keys(self, prefix: str = "") -> list[str]:
            return [k for k in self.data if k.startswith(prefix)]

        async def exists(self, key: str) -> bool:
            return key in self.data

    with pytest.raises(TypeError, match="SidecarStorageBackend"):
        StateManager(InMemoryBackend())
    with pytest.raises(TypeError):
        StorageBackend()  # type: ignore[abstract]
    with pytest.raises(ValueError):
        StateManager(max_checkpoints_per_session=-1)
    manager = StateManager(enable_compression=False)  # accepted: stratad always compresses
    assert manager.enable_compression is False


# -- SidecarStorageBackend ------------------------------------------------------------------


def test_storage_backend_methods(daemon: Any) -> None:
    state_data = {"branches": {"b": {"status": "running"}}, "n": 1}

    async def scenario() -> None:
        storage = SidecarStorageBackend(daemon.target)
        assert not await storage.exists("session_123")
        assert await storage.load("session_123") is None

        # Save data
        await storage.save("session_123", state_data)
        await storage.save("session_456", {"n": 2})
        await storage.save("other_1", {"n": 3})

        # Load data
        data = await storage.load("session_123")
        assert data == state_data

        # List sessions
        sessions = await storage.list_keys(prefix="session_")
        assert sessions == ["session_123", "session_456"]
        assert await storage.list_keys() == ["other_1", "session_123", "session_456"]

        # Check existence
        printed = []
        if await storage.exists("session_123"):
            printed.append("Session exists")
        assert printed == ["Session exists"]

        await storage.save("session_123", {"n": 4})  # the newest value wins
        assert await storage.load("session_123") == {"n": 4}
        await storage.delete("session_123")
        await storage.delete("session_123")  # missing: no error
        assert not await storage.exists("session_123")
        assert await storage.load("session_123") is None
        assert await storage.list_keys(prefix="session_") == ["session_456"]

        # A StateManager on the backend shares its connection and its keys.
        manager = StateManager(storage)
        await manager.save_state("session_789", snapshot_at("session_789", 1))
        assert await storage.exists("session_789")
        assert "session_789" in await storage.list_keys(prefix="session_")
        await storage.close()

    run(scenario())


def test_storage_backend_with_a_given_client(daemon: Any) -> None:
    async def scenario() -> dict[str, Any] | None:
        async with stratad.AsyncClient(daemon.target, tenant="acme") as client:
            storage = SidecarStorageBackend(client=client)
            await storage.save("k1", {"v": 1})
            await storage.close()  # not ours: the client stays open
            loaded = await storage.load("k1")
        default_tenant = SidecarStorageBackend(daemon.target)
        assert await default_tenant.load("k1") is None  # tenants never see each other
        await default_tenant.close()
        return loaded

    assert run(scenario()) == {"v": 1}


# -- durability ----------------------------------------------------------------------------------


def test_state_survives_a_daemon_restart(start_daemon: Callable[..., Any]) -> None:
    first = start_daemon()
    manager = StateManager(address=first.target, max_checkpoints_per_session=3)

    async def before() -> str:
        for step in range(5):
            await manager.save_state("durable", snapshot_at("durable", step))
        checkpoint_id = await manager.create_checkpoint("durable", "before_restart")
        await manager.pause_execution("paused_one", {"step": 9, "active_branches": ["x"]})
        return checkpoint_id

    checkpoint_id = run(before())
    first.kill()  # SIGKILL: nothing but what was acknowledged survives
    start_daemon(data_dir=first.data_dir, listen=first.target)

    async def after() -> dict[str, Any]:
        out = {
            "latest": await manager.load_state("durable"),
            "restored": await manager.restore_checkpoint(checkpoint_id),
            "checkpoints": await manager.list_checkpoints("durable"),
            "sessions": await manager.list_sessions(),
            "resumed": await manager.resume_execution("paused_one"),
        }
        await manager.close()
        return out

    out = run(after())
    assert out["latest"] is not None and out["latest"].metadata == {"step": 4}
    assert out["latest"].validate_checksum()
    assert out["restored"] is not None and out["restored"].metadata == {"step": 4}
    assert len(out["checkpoints"]) == 4  # 3 unnamed (retention) + 1 named
    assert out["sessions"] == ["durable", "paused_one"]
    assert out["resumed"] == {"step": 9, "active_branches": ["x"]}
