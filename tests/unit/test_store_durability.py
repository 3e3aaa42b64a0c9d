"""What makes a new file or directory durable and private.

- Every directory the store creates (tenant, sessions, session, objects and
  their fan-out directories, profile and crystal libraries) is fsynced into
  its parent: without that, a power loss can drop the directory, and every
  fsynced file in it, although the files' own fsyncs succeeded.
- Journals and object files are 0600, directories 0700: the data directory
  holds every tenant's state and is nobody else's business.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.store import fsync as fsync_module
from stratad.store.datadir import open_data_dir

TENANT = "acme"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(tmp_path / "data", fsync_interval=3600.0)
    engine.open()
    try:
        yield engine
    finally:
        engine.close()


def fill(engine: Engine) -> None:
    """A session with a multi-chunk state, a profile, a crystal, objects on disk."""
    engine.sessions.create(TENANT, "agent")
    engine.checkpoints.save_state(TENANT, "agent", SaveInput(data=os.urandom(300_000)))
    engine.profiles.update(TENANT, "user-1", {"preferences": {"tone": "brief"}})
    engine.store.sync_objects()


def test_files_are_private_to_the_daemon_user(tmp_path: Path, engine: Engine) -> None:
    with open_data_dir(tmp_path / "data"):
        pass
    fill(engine)
    found = {"files": 0, "dirs": 0}
    for root, dirs, files in os.walk(tmp_path / "data"):
        for name in dirs:
            mode = stat.S_IMODE(os.stat(Path(root) / name).st_mode)
            assert mode & 0o077 == 0, f"{root}/{name} is {oct(mode)}"
            found["dirs"] += 1
        for name in files:
            mode = stat.S_IMODE(os.stat(Path(root) / name).st_mode)
            assert mode & 0o077 == 0, f"{root}/{name} is {oct(mode)}"
            found["files"] += 1
    assert found["files"] >= 4 and found["dirs"] >= 6, found


def test_every_new_directory_is_fsynced_into_its_parent(
    tmp_path: Path, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Per-file fsyncs (no syncfs), so that each directory's fsync is visible.
    monkeypatch.setattr(fsync_module, "_SYNCFS", None)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fill(engine)
    tenants = tmp_path / "data" / "tenants"
    created = [p for p in tenants.rglob("*") if p.is_dir()]
    assert len(created) >= 5
    missing = [str(p) for p in created if str(p.parent) not in synced]
    assert not missing, f"directories whose entry was never fsynced: {missing}"
    journal_dirs = {p.parent for p in tenants.rglob("journal")}
    assert journal_dirs and all(str(d) in synced for d in journal_dirs)
