"""The data directory as a whole: tenants, journals and background syncing.

Durability modes (see docs/storage.md):
- `fsync`: every acknowledged mutation is covered by an fsync of its journal
  (group commit: concurrent writers share fsyncs);
- `interval`: journals are fsynced by a background thread every
  `fsync_interval`; a crash loses at most that window;
- `none`: the OS decides; a crash of the machine (not of the daemon) may lose
  recent writes.
Objects are appended to their tenant's pack by the same background thread and
fsynced (unless `none`) before a journal compaction drops the journal's inline
copies of them, when a session is deleted, and at shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path

from stratad.errors import ResourceExhaustedError
from stratad.ids import validate_id
from stratad.store import journal as journal_mod
from stratad.store.crypto import (
    TENANT_KEY_NAME,
    EncryptionKeyError,
    Keyring,
    RecordCipher,
    SharedKeys,
    key_file_id,
)
from stratad.store.failstop import FailStop, ReadOnlyError
from stratad.store.fsync import make_dirs
from stratad.store.journal import Journal, Record, ReplayResult, SizeTally, storage_error
from stratad.store.objects import RECENT_BYTES, RecentContents
from stratad.store.tenant import TenantStore

log = logging.getLogger(__name__)

DURABILITY_MODES = ("fsync", "interval", "none")


class Store:
    def __init__(
        self,
        data_dir: Path,
        *,
        durability: str = "fsync",
        fsync_interval: float = 0.1,
        max_object_bytes: int = 64 << 20,
        keyring: Keyring | None = None,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"unknown durability mode {durability!r}")
        self.data_dir = data_dir
        self.durability = durability
        self.fsync_interval = fsync_interval
        self.max_object_bytes = max_object_bytes
        #: Tripped by the first failed fsync: see store/failstop.py.
        self.fail_stop = FailStop()
        self.tenants_root = data_dir / "tenants"
        self.make_dirs(self.tenants_root)
        #: Encryption at rest: the master key that unwraps tenants' data keys (None: off).
        self.keyring = keyring
        #: Object storage holding tenants' wrapped data keys (replication), or None.
        self.shared_keys: SharedKeys | None = None
        self._check_encryption()
        self._tenants: dict[str, TenantStore] = {}
        #: Recently written and decoded object contents, for all tenants (bounded).
        self.recent_contents = RecentContents(RECENT_BYTES)
        self._lock = threading.Lock()
        self._journals: weakref.WeakSet[Journal] = weakref.WeakSet()
        self._stop = threading.Event()
        self._hooks: list[Callable[[], None]] = []
        self._syncer: threading.Thread | None = None
        self._writable_listeners: list[Callable[[bool], None]] = []
        self._object_listeners: list[Callable[[str, str], None]] = []

    # -- tenants -------------------------------------------------------------

    def tenant(self, name: str) -> TenantStore:
        """The tenant's store, created (directories and all) on first use: for writes."""
        with self._lock:
            existing = self._tenants.get(name)
            if existing is not None:
                return existing
            validate_id(name, "tenant")
            root = self.tenants_root / name
            self.make_dirs(root)
            # The data key exists before anything of the tenant is written.
            cipher = (
                self.keyring.open_tenant(root, name, self.shared_keys) if self.keyring else None
            )
            tenant = TenantStore(
                root,
                name,
                max_object_bytes=self.max_object_bytes,
                fail_stop=self.fail_stop,
                cipher=cipher,
                recent=self.recent_contents,
            )
            self._tenants[name] = tenant
            self._watch_objects(tenant)
            return tenant

    def find_tenant(self, name: str) -> TenantStore | None:
        """A tenant that exists, or None; unlike `tenant`, never creates one.

        Every tenant on disk is loaded at start-up (recovery), and every one
        created since is loaded: reads use this, so that asking about a tenant
        that does not exist leaves no directory behind.
        """
        with self._lock:
            return self._tenants.get(name)

    def on_new_object(self, listener: Callable[[str, str], None]) -> None:
        """Call `listener(tenant, digest)` for every object added to any tenant."""
        self._object_listeners.append(listener)
        for tenant in self.loaded_tenants():
            self._watch_objects(tenant)

    def _watch_objects(self, tenant: TenantStore) -> None:
        if not self._object_listeners:
            return
        listeners, name = list(self._object_listeners), tenant.name

        def added(digest: str) -> None:
            for listener in listeners:
                listener(name, digest)

        tenant.objects.on_new = added

    def existing_tenant_names(self) -> list[str]:
        return sorted(p.name for p in self.tenants_root.iterdir() if p.is_dir())

    def loaded_tenants(self) -> list[TenantStore]:
        with self._lock:
            return list(self._tenants.values())

    # -- encryption at rest ----------------------------------------------------

    def _check_encryption(self) -> None:
        """Refuse a data directory the configured encryption cannot serve as a whole.

        Encryption off: no tenant may have a data key (its data is unreadable
        without one). Encryption on: every tenant holding data must have one;
        a data directory with plaintext data is refused rather than mixed
        (docs/security.md says how to migrate).
        """
        for name in self.existing_tenant_names():
            root = self.tenants_root / name
            has_key = (root / TENANT_KEY_NAME).exists()
            if self.keyring is None and has_key:
                raise EncryptionKeyError(
                    f"the data directory {self.data_dir} is encrypted (tenant {name!r} has a "
                    f"data key wrapped by master key {key_file_id(root / TENANT_KEY_NAME)}): "
                    "start with encryption = on and that key (encryption_key_file)"
                )
            if self.keyring is not None and not has_key and _holds_files(root):
                raise EncryptionKeyError(
                    f"encryption = on, but tenant {name!r} in {self.data_dir} holds data "
                    "written without encryption; stratad does not mix plaintext and encrypted "
                    "data: export the sessions, start on an empty data directory with "
                    "encryption on and import them (docs/security.md)"
                )

    def journal_cipher(self, path: Path) -> RecordCipher | None:
        """The cipher of the journal at `path` (under a tenant's directory); None when off.

        The journal is named by its path below the tenants directory
        ("<tenant>/sessions/<id>/journal"): a record moved to another journal
        does not open there. Journals outside the tenants directory hold no
        tenant's data (the library replicator's list of node IDs) and stay plain.
        """
        if self.keyring is None or not path.is_relative_to(self.tenants_root):
            return None
        relative = path.relative_to(self.tenants_root)
        return self.tenant(relative.parts[0]).cipher_for_journal(relative.as_posix())

    def read_journal(self, path: Path) -> ReplayResult:
        """Every valid record of a journal (see journal.read_records)."""
        return journal_mod.read_records(path, self.journal_cipher(path))

    # -- files and directories -------------------------------------------------

    def make_dirs(self, path: Path) -> None:
        """Create `path` (and parents) durably with private permissions."""
        self.fail_stop.check()
        try:
            make_dirs(path, self.fsync_dir)
        except OSError as exc:
            raise storage_error(exc, f"creating {path}") from exc

    def fsync_dir(self, path: Path) -> None:
        """Make a directory's entries durable; a failure trips the fail-stop latch."""
        journal_mod.fsync_dir_or_trip(path, self.fail_stop)

    def rewrite_journal(self, path: Path, records: Iterable[Record]) -> None:
        """Atomically replace a journal (compaction); see journal.rewrite."""
        self.fail_stop.check()
        journal_mod.rewrite(path, iter(records), self.fail_stop, self.journal_cipher(path))

    # -- journals ------------------------------------------------------------

    def open_journal(self, path: Path, tally: SizeTally | None = None) -> Journal:
        self.fail_stop.check()
        journal = Journal(
            path,
            durable=self.durability == "fsync",
            fail_stop=self.fail_stop,
            tally=tally,
            cipher=self.journal_cipher(path),
            preallocate=True,
        )
        self._journals.add(journal)
        return journal

    def persist_objects(self, tenant: TenantStore) -> None:
        """Append a tenant's pending objects to its pack; fsync it unless `none`."""
        if self.durability == "none":
            tenant.objects.write_pending()
        else:
            tenant.objects.sync_pending()

    def sync_objects(self) -> None:
        for tenant in self.loaded_tenants():
            self.persist_objects(tenant)

    # -- read-only mode (a start on a full disk) ---------------------------------

    @property
    def read_only(self) -> bool:
        return self.fail_stop.read_only is not None

    def enter_read_only(self, cause: ResourceExhaustedError) -> None:
        """Serve reads only: objects recovered from journals could not be written."""
        self.fail_stop.read_only = ReadOnlyError(
            f"stratad is read-only: {cause.message}; free space on the data directory's "
            "disk and writes resume by themselves",
            metadata={"cause": cause.reason},
        )
        log.error("%s", self.fail_stop.read_only.message)
        self._notify_writable(False)

    def retry_read_only(self) -> bool:
        """Try to write what recovery could not; leave read-only mode on success."""
        if not self.read_only:
            return True
        try:
            self.sync_objects()
        except ResourceExhaustedError:
            return False
        self.fail_stop.read_only = None
        log.warning("disk space is back: stratad accepts writes again")
        self._notify_writable(True)
        return True

    def on_writable_change(self, listener: Callable[[bool], None]) -> None:
        """Call `listener(writable)` whenever read-only mode begins or ends."""
        self._writable_listeners.append(listener)

    def _notify_writable(self, writable: bool) -> None:
        for listener in list(self._writable_listeners):
            listener(writable)

    # -- background syncing --------------------------------------------------

    def start(self) -> None:
        if self._syncer is not None:
            return
        self._syncer = threading.Thread(target=self._sync_loop, name="stratad-sync", daemon=True)
        self._syncer.start()

    def _sync_loop(self) -> None:
        while not self._stop.wait(self.fsync_interval):
            if self.fail_stop.error is not None:
                return  # nothing may be made durable any more (failstop.py)
            try:
                self._sync_once()
            except Exception:  # keep syncing; a failing disk is reported by writes
                log.exception("background sync failed")

    def on_tick(self, hook: Callable[[], None]) -> None:
        """Run `hook` on the background thread at every tick (e.g. compactions)."""
        self._hooks.append(hook)

    def _sync_once(self) -> None:
        if not self.retry_read_only():
            return  # still full: no compaction may drop the journals' object copies
        if self.durability == "interval":
            for journal in list(self._journals):
                if journal.dirty:
                    journal.sync_now()
        # Append pending objects to the packs and make them durable in one
        # batch: until then the journal's copy covers them.
        # Nothing of this is on the save path.
        self.sync_objects()
        for hook in self._hooks:
            hook()

    def close(self) -> None:
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join(timeout=10)
        failed = self.fail_stop.error is not None
        if not failed:  # after a failed fsync, what is in memory must not reach the disk
            with contextlib.suppress(Exception):
                self._sync_once()
        for journal in list(self._journals):
            if not failed and journal.dirty and self.durability != "none":
                with contextlib.suppress(Exception):
                    journal.sync_now()
            journal.close()


def _holds_files(root: Path) -> bool:
    """Whether a tenant directory holds any file (empty directories do not count, nor
    the temporary file of a KEY whose first write a crash interrupted)."""
    leftover = TENANT_KEY_NAME + ".tmp"
    return any(
        name != leftover or directory != str(root)
        for directory, _, files in os.walk(root)
        for name in files
    )
