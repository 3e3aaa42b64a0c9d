"""The domain layer assembled: one object the server (or a test) opens and closes."""

from __future__ import annotations

import collections
import logging
from pathlib import Path
from typing import Any

from stratad.domain.admin import Admin
from stratad.domain.agent import Agents
from stratad.domain.checkpoints import Checkpoints
from stratad.domain.cognitive import Cognitive
from stratad.domain.crystals import CrystalLibraries
from stratad.domain.events import EventHub
from stratad.domain.library_replication import LibraryReplicator
from stratad.domain.profiles import Profiles
from stratad.domain.quotas import Quotas
from stratad.domain.replication import Replicator
from stratad.domain.sessions import SessionManager
from stratad.domain.tasks import Tasks
from stratad.domain.writes import CheckpointExtras
from stratad.store.commit import GroupCommitter
from stratad.store.crypto import Keyring
from stratad.store.remote import RemoteTier
from stratad.store.store import Store

log = logging.getLogger(__name__)


class Engine:
    """Store + sessions + checkpoints + admin over one data directory."""

    def __init__(
        self,
        data_dir: Path,
        *,
        durability: str = "fsync",
        fsync_interval: float = 0.1,
        max_state_bytes: int = 64 << 20,
        compact_min_bytes: int | None = None,
        quotas: Quotas | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self.store = Store(
            data_dir,
            durability=durability,
            fsync_interval=fsync_interval,
            max_object_bytes=max_state_bytes,
            keyring=keyring,
        )
        self.events = EventHub()
        # Compaction thresholds: each journal kind has its own default (session
        # journals compact far earlier than the per-tenant profile and crystal
        # journals); a value given here applies to all three (tests).
        compact: dict[str, Any] = (
            {} if compact_min_bytes is None else {"compact_min_bytes": compact_min_bytes}
        )
        self.sessions = SessionManager(self.store, self.events, quotas=quotas, **compact)
        self.checkpoints = Checkpoints(self.sessions, max_state_bytes=max_state_bytes)
        self.admin = Admin(self.sessions)
        # Pending writes, CopySession, PruneCheckpoints, DeleteCheckpoints (and
        # their record reducers, which the journal replay needs).
        self.checkpoint_extras = CheckpointExtras(self.sessions)
        # Structured state: importing these modules registers their record
        # reducers, which the journal replay in open() needs.
        self.cognitive = Cognitive(self.sessions)
        self.tasks = Tasks(self.sessions)
        self.agents = Agents(self.sessions)
        self.profiles = Profiles(self.store, **compact)
        self.crystals = CrystalLibraries(self.store, **compact)
        self.committer = GroupCommitter()
        self.replicator: Replicator | None = None
        self.library_replicator: LibraryReplicator | None = None

    def replicate_to(
        self,
        remote: RemoteTier,
        *,
        mode: str,
        node_id: str,
        lag: float,
        lease: float,
        gc_grace: float = 3600.0,
    ) -> Replicator:
        """Replicate sessions to `remote` (call before `open`); see domain/replication.py."""
        self.replicator = Replicator(
            self.sessions, remote, mode=mode, node_id=node_id, lag=lag, lease=lease,
            gc_grace=gc_grace,
        )  # fmt: skip
        self.sessions.replicator = self.admin.replicator = self.replicator
        self.store.on_new_object(self.replicator.object_added)
        if self.store.keyring is not None:  # encryption at rest: packs sealed, keys shared
            store = self.store
            remote.cipher_of = lambda tenant: store.tenant(tenant).cipher
            store.shared_keys = remote
        # Crystal libraries and profiles: several writers, merged (docs/replication.md).
        library = LibraryReplicator(
            remote, self.crystals, self.profiles, mode=mode, node_id=node_id, lag=lag,
            retire_after=gc_grace,
        )  # fmt: skip
        self.crystals.replica = self.profiles.replica = library
        self.library_replicator = self.replicator.library = library
        return self.replicator

    def open(self) -> dict[str, int]:
        """Recover every session and profile journal, then start background syncing."""
        report = collections.Counter(self.sessions.recover())
        report.update(self.profiles.recover())
        report.update(self.crystals.recover())
        self.store.start()
        if self.replicator is not None:
            self.replicator.start()
        if self.library_replicator is not None:
            self.library_replicator.start()  # catches up with the bucket before serving
        log.info("recovered %s", dict(report) or "an empty store")
        return dict(report)

    def close(self) -> None:
        if self.library_replicator is not None:
            self.library_replicator.close()
        if self.replicator is not None:
            self.replicator.close()
        self.committer.stop()
        self.crystals.close()
        self.store.close()
