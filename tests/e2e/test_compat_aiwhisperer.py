"""stratad.compat.aiwhisperer against a real ``stratad serve`` subprocess.

AIWhisperer's runner saves its state dict as a JSON file; here the same two
calls keep it in the daemon, keyed by the path.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stratad
from stratad.compat import aiwhisperer
from stratad.compat.aiwhisperer import load_state, save_state
from stratad.errors import UnavailableError


def seed_state() -> dict[str, Any]:
    """AIWhisperer's state structure, filled in."""
    return {
        "tasks": {
            "task_1": {"status": "completed", "result": {"summary": "ok", "files": 2}},
            "task_2": {"status": "in-progress", "result": {}},
            "task_3": {"status": "pending", "result": {}},
        },
        "global_state": {
            "file_paths": ["out/report.md", "out/data.csv"],
            "other_context": {"model": "x", "attempt": 1, "notes": "ünïcode ✓"},
        },
    }


@pytest.fixture
def configured(daemon: Any) -> Iterator[Any]:
    aiwhisperer.configure(address=daemon.target)
    yield daemon
    aiwhisperer.close()


def test_save_load_round_trip(configured: Any, tmp_path: Path) -> None:
    state = seed_state()
    file_path = tmp_path / "runner_state.json"
    save_state(state, file_path)
    assert load_state(file_path) == state
    assert load_state(str(file_path)) == state
    assert not file_path.exists()  # the state is in the sidecar, not on disk

    state["tasks"]["task_2"]["status"] = "completed"
    save_state(state, file_path)
    assert load_state(file_path)["tasks"]["task_2"]["status"] == "completed"


def test_never_saved_path_is_file_not_found(configured: Any, tmp_path: Path) -> None:
    missing = tmp_path / "never_saved.json"
    with pytest.raises(FileNotFoundError) as caught:
        load_state(missing)
    assert caught.value.errno == errno.ENOENT
    assert caught.value.filename == str(missing)


def test_session_ids_for_paths(
    configured: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    sid = aiwhisperer.session_id_for("state.json")
    assert re.fullmatch(r"aiwhisperer:state\.json:[0-9a-f]{16}", sid)
    # Spellings of one path share a session; same names in two directories do not.
    assert aiwhisperer.session_id_for(tmp_path / "state.json") == sid
    assert aiwhisperer.session_id_for("sub/../state.json") == sid
    assert aiwhisperer.session_id_for("other/state.json") != sid
    odd = aiwhisperer.session_id_for("my run (1)/stätë file?.json")
    assert re.fullmatch(r"aiwhisperer:st_t__file_\.json:[0-9a-f]{16}", odd)
    long_name = aiwhisperer.session_id_for("x" * 300 + ".json")
    assert len(long_name) <= 128
    assert aiwhisperer.session_id_for("/").startswith("aiwhisperer:root:")

    save_state({"tasks": {}}, "state.json")
    save_state({"tasks": {"t": {"status": "failed", "result": {}}}}, "other/state.json")
    assert load_state(tmp_path / "state.json") == {"tasks": {}}
    with stratad.Client(configured.target) as client:
        session = client.get_session(sid)
    assert dict(session.labels) == {
        "stratad.compat": "aiwhisperer",
        "path": str(tmp_path / "state.json"),
    }
    save_state({"odd": True}, "my run (1)/stätë file?.json")
    assert load_state("my run (1)/stätë file?.json") == {"odd": True}


def test_non_json_state_is_type_error(configured: Any, tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        save_state({"tasks": {"t": {"result": {1, 2}}}}, tmp_path / "s.json")
    with pytest.raises(FileNotFoundError):
        load_state(tmp_path / "s.json")  # nothing half-written


def test_configuration_from_the_environment(
    daemon: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(aiwhisperer.ADDRESS_ENV, daemon.target)
    aiwhisperer.configure()
    try:
        save_state(seed_state(), tmp_path / "env.json")
        assert load_state(tmp_path / "env.json") == seed_state()
    finally:
        aiwhisperer.close()


def test_tenants_are_separate(daemon: Any, tmp_path: Path) -> None:
    path = tmp_path / "tenant.json"
    try:
        aiwhisperer.configure(daemon.target, tenant="acme")
        save_state({"who": "acme"}, path)
        aiwhisperer.configure(daemon.target, tenant="globex")
        with pytest.raises(FileNotFoundError):
            load_state(path)
        aiwhisperer.configure(daemon.target, tenant="acme")
        assert load_state(path) == {"who": "acme"}
    finally:
        aiwhisperer.close()


def test_keep_last_bounds_history(daemon: Any, tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    aiwhisperer.configure(daemon.target, keep_last=3)
    try:
        for step in range(6):
            save_state({"step": step}, path)
        assert load_state(path) == {"step": 5}
    finally:
        aiwhisperer.close()
    with stratad.Client(daemon.target) as client:
        checkpoints = list(client.list_checkpoints(aiwhisperer.session_id_for(path)))
    assert len(checkpoints) == 3
    assert {cp.content_type for cp in checkpoints} == {aiwhisperer.CONTENT_TYPE}


def test_state_survives_a_daemon_restart(start_daemon: Callable[..., Any], tmp_path: Path) -> None:
    first = start_daemon()
    path = tmp_path / "runner_state.json"
    aiwhisperer.configure(address=first.target)
    try:
        save_state(seed_state(), path)
        first.kill()  # SIGKILL: what was acknowledged must survive
        start_daemon(data_dir=first.data_dir, listen=first.target)
        # The module's connection reconnects to the restarted daemon.
        assert load_state(path) == seed_state()
    finally:
        aiwhisperer.close()


def test_unreachable_daemon_is_an_error(get_free_port: Callable[[], int], tmp_path: Path) -> None:
    aiwhisperer.configure(address=f"127.0.0.1:{get_free_port()}")
    try:
        with pytest.raises(UnavailableError):
            save_state({}, tmp_path / "s.json")
        with pytest.raises(UnavailableError):  # not FileNotFoundError: nothing is known
            load_state(tmp_path / "s.json")
    finally:
        aiwhisperer.close()
