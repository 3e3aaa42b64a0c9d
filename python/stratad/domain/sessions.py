"""Live sessions: recovery from journals, mutations, listing, deletion, events.

Each session is a directory `<tenant>/sessions/<id>/` holding one journal,
a `Log` of the store's log engine (store/log.py: recovery, appends, tickets,
compaction, the directory's installation and removal). The in-memory
`SessionState` is the journal replayed. A mutation runs under the session's
lock: build the record, append it, apply it; the fsync that makes it durable
happens after the lock is released (its ticket, group-committed), and the
caller is acknowledged only after it.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from stratad import native, tracing
from stratad.domain.events import EventHub, SessionEvent, Subscription
from stratad.domain.models import SessionState, SessionStatus, apply
from stratad.domain.quotas import Quotas
from stratad.errors import (
    AlreadyExistsError,
    CorruptObjectError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    VersionConflictError,
    checkpoint_not_found,
    session_not_found,
)
from stratad.ids import new_id, validate_id
from stratad.store.fsync import DIR_MODE
from stratad.store.journal import Journal, Record
from stratad.store.log import Log, Ticket, wait_all
from stratad.store.store import Store
from stratad.store.tenant import TenantStore

if TYPE_CHECKING:
    from stratad.store.remote import RemoteTier

log = logging.getLogger(__name__)

JOURNAL = "journal"
_TRASH_PREFIX = ".trash-"
#: Events kept in memory per session for WatchSession resumption.
EVENT_HISTORY = 4096
#: Labels of one session: every SessionInfo, listing and journal snapshot
#: carries them, so they stay small (64 x (128 + 256) characters at most).
MAX_LABELS = 64
MAX_LABEL_KEY = 128
MAX_LABEL_VALUE = 256
#: A session's journal is compacted (rewritten as one snapshot record, which
#: drops the inline copies of objects the packs hold by then) once it is
#: larger than both COMPACT_MIN_BYTES and COMPACT_FACTOR times its last
#: snapshot. The factor keeps the work proportional: a compaction rewrites the
#: snapshot, and at least as many bytes were appended since the last one. The
#: minimum spares small sessions the fsyncs of a compaction after every few
#: saves: the 500-step reference conversation (saves of ~2 KB, most of it
#: inline objects) compacts about every 60 saves, each a snapshot of at most
#: ~50 KB. (Profiles and crystal libraries, one journal per tenant, keep
#: their own thresholds.)
COMPACT_MIN_BYTES = 128 << 10
COMPACT_FACTOR = 2
#: A session not written for IDLE_COMPACT_SECONDS whose journal holds at least
#: IDLE_COMPACT_MIN_BYTES after its snapshot is compacted once, so a session
#: at rest keeps its snapshot and no tail of inline object copies (up to as
#: large again as the snapshot under the thresholds above). Not for sessions
#: replicated to object storage: by then another daemon may own the session.
IDLE_COMPACT_SECONDS = 60.0
IDLE_COMPACT_MIN_BYTES = 16 << 10


@dataclass
class LiveSession:
    tenant: TenantStore
    path: Path
    #: The session's journal (store/log.py): appends, tickets, compaction.
    log: Log
    state: SessionState
    lock: threading.Lock = field(default_factory=threading.Lock)
    history: collections.deque[SessionEvent] = field(
        default_factory=lambda: collections.deque(maxlen=EVENT_HISTORY)
    )
    damaged: str = ""
    deleted: bool = False
    snapshot_bytes: int = 0
    #: The last capture of the structured state into objects (see
    #: checkpoints.capture_structured), and whether it changed since.
    structured_ref: dict[str, Any] = field(default_factory=dict)
    structured_dirty: bool = True
    #: Client-given checkpoint IDs reserved by the mutation being built.
    claimed: set[str] = field(default_factory=set)
    #: Wall time of the last read of its state (or of its loading by this
    #: daemon): with `state.updated_at`, what the idle-session TTL measures
    #: (see domain/lifecycle.py). In memory only: a restart starts it afresh.
    accessed_at: float = field(default_factory=time.time)
    #: time.monotonic() of the last record appended (idle compaction).
    appended_at: float = field(default_factory=time.monotonic)
    #: For the last chunked uploads saved (at most DIGEST_RESUME_UPLOADS of
    #: domain/checkpoints.py), by checkpoint ID: by chunk index, digesters fed
    #: with the state's bytes before that chunk (an upload on that checkpoint
    #: resumes its digest check there; see Checkpoints._check_state_digest).
    digest_resume: dict[str, dict[int, Any]] = field(default_factory=dict)

    @property
    def journal(self) -> Journal:
        """The journal file open for appends (replaced by each compaction)."""
        assert self.log.journal is not None
        return self.log.journal

    @property
    def held_for_io(self) -> bool:
        """The lock is about to be, or is, held across fsyncs (a compaction, a
        deletion): calls for the session must not wait for it on the event
        loop (see SessionManager.held_for_io)."""
        return self.log.held_for_io

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant.name, self.state.session_id)

    @property
    def owner(self) -> str:
        """Identifies this session's journal to the object store."""
        return self.state.session_id


@dataclass(frozen=True)
class SessionInfo:
    """A consistent copy of a session's summary, safe to use outside its lock."""

    session_id: str
    status: SessionStatus
    version: int
    labels: dict[str, str]
    created_at: float
    updated_at: float
    checkpoint_count: int
    head: str
    keep_last: int
    max_age_seconds: float
    forked_from: str

    @classmethod
    def of(cls, s: SessionState) -> SessionInfo:
        return cls(
            s.session_id,
            s.status,
            s.version,
            dict(s.labels),
            s.created_at,
            s.updated_at,
            len(s.checkpoints),
            s.head,
            s.keep_last,
            s.max_age_seconds,
            s.forked_from,
        )


@dataclass
class Mutation:
    """What a mutation's builder returns: the record and the event to publish."""

    record: Record
    event: SessionEvent
    result: Any = None
    #: Undoes side effects of building the record if it cannot be journaled.
    on_abort: Callable[[], None] | None = None


Builder = Callable[[LiveSession, int, float], Mutation]


@dataclass(frozen=True)
class PendingCommit:
    """A journaled, applied mutation still to be made durable and announced."""

    ticket: Ticket
    key: tuple[str, str]
    event: SessionEvent


#: Mutations awaiting one shared `SessionManager.finish` (a module-level alias:
#: inside SessionManager, `list` is its method).
Commit = list[PendingCommit]


class SessionReplication(Protocol):
    """What sessions ask of replication (domain/replication.py's `Replicator`).

    A protocol, not an import: replication builds on sessions, so sessions
    name only the calls they make and the import points one way.
    """

    remote: RemoteTier

    def fresh(self, live: LiveSession) -> bool: ...
    def hydrate(self, tenant: str, session_id: str) -> bool: ...
    def session_created(self, live: LiveSession) -> None: ...
    def ensure_writable(self, live: LiveSession) -> None: ...
    def session_deleted(self, live: LiveSession) -> None: ...
    def replicate(self, keys: Iterable[tuple[str, str]]) -> None: ...
    def compacted(self, live: LiveSession) -> None: ...


class SessionWatch:
    """One watcher of a session's events (`SessionManager.watch`).

    Subscribed when made, so every event published from then on is queued on
    `subscription`; `kept` then copies the events the session keeps and its
    version under the session's lock. A writer appends its event to the
    history under that lock and publishes it after its fsync, outside the
    lock, so each event is in the copy or queued (or both: a watcher skips
    versions it has sent), never missing.
    """

    def __init__(self, hub: EventHub, live: LiveSession) -> None:
        self._hub = hub
        self._live = live
        self.subscription: Subscription = hub.subscribe(live.key)

    def kept(self) -> tuple[list[SessionEvent], int]:
        """The events the session keeps, oldest first, and its version (takes its lock)."""
        live = self._live
        with live.lock:
            return list(live.history), live.state.version

    def between(self, after: int, upto: int) -> list[SessionEvent]:
        """The kept events after version `after` up to `upto`, in order: writers
        publish after their fsync, outside the lock, so events may be queued out
        of order (takes the session's lock)."""
        live = self._live
        with live.lock:
            return [e for e in live.history if after < e.version <= upto]

    def close(self) -> None:
        self._hub.unsubscribe(self.subscription)


class SessionManager:
    def __init__(
        self,
        store: Store,
        hub: EventHub | None = None,
        *,
        compact_min_bytes: int = COMPACT_MIN_BYTES,
        compact_factor: int = COMPACT_FACTOR,
        quotas: Quotas | None = None,
    ) -> None:
        self.store = store
        self.hub = hub or EventHub()
        self.quotas = quotas or Quotas()
        self.compact_min_bytes = compact_min_bytes
        self.compact_factor = compact_factor
        self.idle_compact_seconds = IDLE_COMPACT_SECONDS
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], LiveSession] = {}
        #: tenant -> checkpoint_id -> session_id (checkpoint IDs are tenant-unique).
        self._checkpoints: dict[str, dict[str, str]] = collections.defaultdict(dict)
        #: Sessions whose journal outgrew its compaction threshold.
        self._to_compact: dict[tuple[str, str], LiveSession] = {}
        #: Sessions written since they were last looked at for idle compaction.
        self._written: dict[tuple[str, str], LiveSession] = {}
        store.on_tick(self.compact_requested)
        #: Returns once the event loop serving calls (if any) has finished the
        #: callback it is running; called by a thread about to hold a session's
        #: lock across fsyncs (`_exclusively`). The daemon sets it
        #: (server/runner.py, Runner.attach); in-process users have no loop.
        self.loop_barrier: Callable[[], None] = lambda: None
        #: Set by the engine when sessions replicate to object storage.
        self.replicator: SessionReplication | None = None

    # -- recovery --------------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """Open every session of every tenant; cut torn tails; restore objects."""
        report = collections.Counter[str]()
        for name in self.store.existing_tenant_names():
            tenant = self.store.tenant(name)
            for entry in sorted(tenant.sessions_root.iterdir()):
                if entry.name.startswith(_TRASH_PREFIX):
                    shutil.rmtree(entry, ignore_errors=True)
                    continue
                if entry.is_dir():
                    self._recover_session(tenant, entry, report)
            self._persist_recovered(tenant, report)
        return dict(report)

    def _persist_recovered(self, tenant: TenantStore, report: collections.Counter[str]) -> None:
        """Write the objects recovery restored; on a full disk, start read-only.

        Until they are written they are served from memory (and stay carried
        by their journals), so reads work; writes wait for space.
        """
        try:
            self.store.persist_objects(tenant)
        except ResourceExhaustedError as exc:
            report["read_only"] = 1
            self.store.enter_read_only(exc)

    def _recover_session(
        self, tenant: TenantStore, path: Path, report: collections.Counter[str]
    ) -> None:
        journal = Log(self.store, path / JOURNAL, tenant.journal_bytes)
        if not journal.exists():
            shutil.rmtree(path, ignore_errors=True)  # creation never acknowledged
            return
        replay = _Replay(tenant, path.name)
        found = journal.recover(replay.apply, open_for_appends=False)
        if found.cut_bytes:
            if found.zero_tail:  # the preallocated space of a journal left open
                report["zero_tails_cut"] += 1
                log.info("cut %d zero bytes after the last record of %s", found.cut_bytes, path)
            else:
                report["torn_tails_cut"] += 1
                log.warning("cut a torn journal tail of %d bytes in %s", found.cut_bytes, path)
        if replay.state is None:
            if found.damaged_at is not None:
                # The first record is damaged and valid ones follow: acknowledged
                # history that cannot be replayed. Never delete it; leave the
                # files for restoration from an export.
                report["damaged_sessions"] += 1
                log.error("journal of %s is damaged at byte 0; the session is not loaded", path)
                return
            shutil.rmtree(path, ignore_errors=True)  # creation never acknowledged
            return
        report["objects_restored"] += replay.restored
        journal.open()
        live = LiveSession(tenant, path, journal, replay.state)
        live.snapshot_bytes = replay.snapshot_bytes  # compaction's threshold counts from it
        live.history.extend(replay.history)
        if found.damaged_at is not None:
            live.damaged = (
                f"journal of session {replay.state.session_id} is damaged at byte "
                f"{found.damaged_at}; run Verify and restore from a checkpoint export"
            )
            report["damaged_sessions"] += 1
            log.error(live.damaged)
        self._register(live)
        report["sessions"] += 1

    def _register(self, live: LiveSession) -> None:
        with self._lock:
            self._sessions[live.key] = live
            index = self._checkpoints[live.tenant.name]
            for checkpoint_id in live.state.checkpoints:
                index[checkpoint_id] = live.state.session_id

    # -- lookup ------------------------------------------------------------------

    def live(self, tenant: str, session_id: str) -> LiveSession:
        # After a failed fsync the in-memory state may hold what the disk lost.
        self.store.fail_stop.check()
        validate_id(session_id, "session_id")
        with self._lock:
            live = self._sessions.get((tenant, session_id))
        replicator = self.replicator
        if live is not None and not live.deleted and replicator and not replicator.fresh(live):
            live = None  # another daemon moved it on: hydrate its current history
        missing = live is None or live.deleted
        # Not here: another daemon may have written it (resume anywhere).
        if missing and self.replicator and self.replicator.hydrate(tenant, session_id):
            with self._lock:
                live = self._sessions.get((tenant, session_id))
        if live is None or live.deleted:
            raise session_not_found(session_id)
        return live

    def is_loaded(self, tenant: str, session_id: str) -> bool:
        return self.loaded(tenant, session_id) is not None

    def loaded(self, tenant: str, session_id: str) -> LiveSession | None:
        """The session if this daemon has it (damaged or not), without any check."""
        validate_id(session_id, "session_id")
        with self._lock:
            live = self._sessions.get((tenant, session_id))
        return live if live is not None and not live.deleted else None

    def install(self, tenant: str, session_id: str, journal: bytes) -> LiveSession:
        """Make a session from a whole journal (hydration from object storage)."""
        store = self.store.tenant(tenant)
        path = store.sessions_root / session_id
        staging = store.sessions_root / f"{_TRASH_PREFIX}install-{session_id}-{time.time_ns()}"
        # Whole or absent after a crash (trash is removed at start).
        Log(self.store, path / JOURNAL).install(journal, staging)
        report = collections.Counter[str]()
        self._recover_session(store, path, report)
        with self._lock:
            live = self._sessions.get((tenant, session_id))
        if live is None:
            raise DataLossError(f"the replicated journal of session {session_id!r} is empty")
        return live

    def evict(self, live: LiveSession) -> None:
        """Forget a session here without deleting it anywhere else (replication)."""
        with live.lock:
            if live.deleted:
                return
            live.deleted = True
            trash = live.path.with_name(f"{_TRASH_PREFIX}{live.state.session_id}-{time.time_ns()}")
            with contextlib.suppress(OSError):
                live.log.retire(trash, durable=False)
            with self._lock:
                self._sessions.pop(live.key, None)
                index = self._checkpoints[live.tenant.name]
                for checkpoint_id in live.state.checkpoints:
                    index.pop(checkpoint_id, None)
        shutil.rmtree(trash, ignore_errors=True)
        self.hub.publish(live.key, None)

    def session_of_checkpoint(self, tenant: str, checkpoint_id: str) -> LiveSession:
        validate_id(checkpoint_id, "checkpoint_id")
        with self._lock:
            session_id = self._checkpoints[tenant].get(checkpoint_id)
        if session_id is None:
            raise checkpoint_not_found(checkpoint_id)
        return self.live(tenant, session_id)

    def checkpoint_exists(self, tenant: str, checkpoint_id: str) -> bool:
        with self._lock:
            return checkpoint_id in self._checkpoints[tenant]

    def sessions_of(self, tenant: str) -> list[LiveSession]:
        with self._lock:
            return [s for (t, _), s in self._sessions.items() if t == tenant and not s.deleted]

    def all_sessions(self) -> list[LiveSession]:
        with self._lock:
            return [s for s in self._sessions.values() if not s.deleted]

    def info(self, tenant: str, session_id: str) -> SessionInfo:
        live = self.live(tenant, session_id)
        with live.lock:
            check_usable(live)
            return SessionInfo.of(live.state)

    def list(
        self, tenant: str, *, prefix: str = "", page_size: int = 100, page_token: str = ""
    ) -> tuple[list[SessionInfo], str]:
        """Sessions ordered by ID; the token is the last ID of the previous page."""
        if page_size < 0:
            raise InvalidArgumentError("page_size must not be negative")
        page_size = min(page_size or 100, 1000)
        after = decode_token(page_token)
        known = {s.state.session_id for s in self.sessions_of(tenant)}
        if self.replicator is not None:  # sessions other daemons wrote are listed too
            known.update(self.replicator.remote.list_sessions(tenant))
        ids = sorted(i for i in known if i.startswith(prefix) and i > after)
        page = []
        for session_id in ids[:page_size]:
            with contextlib.suppress(NotFoundError, DataLossError):
                page.append(self.info(tenant, session_id))
        more = len(ids) > page_size
        return page, encode_token(ids[page_size - 1]) if more else ""

    # -- create / delete ---------------------------------------------------------

    def create(
        self,
        tenant: str,
        session_id: str = "",
        *,
        labels: dict[str, str] | None = None,
        keep_last: int = 0,
        max_age_seconds: float = 0.0,
        initial: Builder | None = None,
    ) -> SessionInfo:
        """Create a session; `initial` may add its first record (ForkSession)."""
        if keep_last < 0 or not max_age_seconds >= 0:  # `not >=` also refuses NaN
            raise InvalidArgumentError("keep_last and max_age_seconds must be non-negative numbers")
        session_id = validate_id(session_id, "session_id") if session_id else new_id("sess")
        validate_labels(labels or {})
        store = self.store.tenant(tenant)
        now = time.time()
        state = SessionState(
            session_id, SessionStatus.ACTIVE, 1, dict(labels or {}), now, now,
            keep_last=keep_last, max_age_seconds=max_age_seconds,
        )  # fmt: skip
        path = store.sessions_root / session_id
        with self._lock:
            if (tenant, session_id) in self._sessions:
                raise AlreadyExistsError(f"session {session_id!r} already exists")
            self._check_quotas(store)
            try:
                path.mkdir(mode=DIR_MODE)
            except FileExistsError:
                raise AlreadyExistsError(f"session {session_id!r} already exists") from None
            journal = Log(self.store, path / JOURNAL, store.journal_bytes)
            journal.open()
            live = LiveSession(store, path, journal, state)
            self._sessions[live.key] = live  # reserve the ID while we write
        try:
            with live.lock:
                create = Record("create", {"v": 1, "at": now, "state": state.to_record()})
                created = journal.append(create)
                journal.sync_new_directory()
                live.history.append(event_of(create))
        except Exception:
            with self._lock:
                self._sessions.pop(live.key, None)
            live.journal.close(trim=False)
            shutil.rmtree(path, ignore_errors=True)
            raise
        created.wait()
        if self.replicator is not None:
            try:
                self.replicator.session_created(live)
            except BaseException:
                self.evict(live)  # it exists elsewhere, or the remote is unreachable
                raise
        if initial is not None:
            self.mutate_live(live, 0, initial, check_quota=False)
        return self.info(tenant, session_id)

    def _check_quotas(self, store: TenantStore) -> None:
        """Room for one more session? (Under the manager's lock: creations are serialized.)"""
        self.quotas.check_stored_bytes(store)
        if self.quotas.tenant_sessions:
            # Creations are rare next to saves: counting here beats keeping
            # a per-tenant count in step with every path that adds or drops one.
            existing = sum(
                1 for (t, _), s in self._sessions.items() if t == store.name and not s.deleted
            )
            self.quotas.check_sessions(store.name, existing)

    def delete(
        self,
        tenant: str,
        session_id: str,
        expected_version: int = 0,
        *,
        only_if: Callable[[LiveSession], bool] | None = None,
    ) -> bool:
        """Delete a session; its objects become garbage for CollectGarbage.

        ``only_if`` (the idle-session sweep's test) is checked under the
        session's lock right before the deletion, so a write that took the
        lock first wins: the session is then kept and False returned. A
        replicated session's tombstone is written between a first check and
        the deletion; a write that lands in that window cannot win any more
        (the tombstone would make every later write fail): the deletion goes
        on, and says so in the log.
        """
        live = self.live(tenant, session_id)
        if only_if is not None:
            with live.lock:
                if live.deleted or not only_if(live):
                    return False
        tombstoned = self.replicator is not None
        if self.replicator is not None:
            self.replicator.ensure_writable(live)
            self.replicator.session_deleted(live)
        with self._exclusively(live):
            check_usable(live, allow_damaged=True)
            check_version(live, expected_version)
            if only_if is not None and not only_if(live):
                if not tombstoned:
                    return False
                log.warning(
                    "session %s/%s was written while its deletion's tombstone was being "
                    "written to object storage: deleting it anyway", tenant, session_id,
                )  # fmt: skip
            # Objects carried only by this journal must outlive it.
            self.store.persist_objects(live.tenant)
            trash = live.path.with_name(f"{_TRASH_PREFIX}{session_id}-{time.time_ns()}")
            live.log.retire(trash)
            live.deleted = True
            with self._lock:
                self._sessions.pop(live.key, None)
                index = self._checkpoints[tenant]
                for checkpoint_id in live.state.checkpoints:
                    index.pop(checkpoint_id, None)
        shutil.rmtree(trash, ignore_errors=True)
        self.hub.publish(live.key, None)
        return True

    # -- mutation ----------------------------------------------------------------

    def mutate(self, tenant: str, session_id: str, expected_version: int, build: Builder) -> Any:
        """Run one mutation: build its record under the lock, journal it, apply it."""
        live = self.live(tenant, session_id)
        return self.mutate_live(live, expected_version, build)

    def mutate_live(
        self,
        live: LiveSession,
        expected_version: int,
        build: Builder,
        *,
        commit: Commit | None = None,
        check_quota: bool = True,
    ) -> Any:
        """Journal, apply and (unless `commit` is given) make durable one mutation.

        With `commit`, the fsync and the event are left to `finish(commit)`, so
        a batch of mutations shares fsyncs (SaveStates); the caller must not
        acknowledge any of them before `finish` returns. A mutation is refused
        once the tenant is at its stored-bytes quota, unless `check_quota` is
        False: deletions (they make room), and the first record of a session
        whose creation was checked.
        """
        if self.replicator is not None:
            self.replicator.ensure_writable(live)
        with live.lock:
            check_usable(live)
            check_version(live, expected_version)
            if check_quota:
                self.quotas.check_stored_bytes(live.tenant)
            mutation = None
            try:
                mutation = build(live, live.state.version + 1, time.time())
                ticket = live.log.append(mutation.record)
            except BaseException:
                self._release_claims(live)
                if mutation is not None and mutation.on_abort is not None:
                    mutation.on_abort()
                raise
            live.claimed.clear()  # journaled: the claimed IDs stay in the index
            apply(live.state, mutation.record.kind, mutation.record.body)
            if mutation.record.kind != "save" or "structured" in mutation.record.body:
                live.structured_dirty = True  # conservative: only plain saves leave it
            self._reindex(live, mutation.record)
            live.history.append(mutation.event)
            live.appended_at = time.monotonic()
            outgrown = self._outgrown(live)
            with self._lock:
                self._written[live.key] = live
                if outgrown:
                    self._to_compact[live.key] = live
        pending = PendingCommit(ticket, live.key, mutation.event)
        if commit is None:
            self.finish([pending])
        else:
            commit.append(pending)
        return mutation.result

    def finish(self, commit: Commit) -> None:
        """Make a batch of mutations durable (one fsync per journal), then announce them."""
        with tracing.span("stratad.journal.fsync", {"stratad.batch.calls": 1}):
            wait_all(p.ticket for p in commit)
        self.replicate(commit)
        self.announce(commit)

    def replicate(self, commit: Commit) -> None:
        """`sync` replication: ship durable mutations before they are acknowledged."""
        if self.replicator is not None and commit:
            self.replicator.replicate(p.key for p in commit)

    def announce(self, commit: Commit) -> None:
        """Publish the events of durable mutations to their watchers."""
        for p in commit:
            self.hub.publish(p.key, p.event)

    def watch(self, tenant: str, session_id: str) -> SessionWatch:
        """Start watching a session: subscribed now, its kept events next
        (`SessionWatch.kept`). Call it on the event loop the events are to be
        delivered to; it takes no session lock."""
        live = self.live(tenant, session_id)
        return SessionWatch(self.hub, live)

    def claim_checkpoint_id(self, live: LiveSession, checkpoint_id: str) -> None:
        """Reserve a client-given checkpoint ID for the mutation `live` is building.

        Checkpoint IDs are unique within a tenant, and sessions mutate in
        parallel: the check and the reservation are one step under the
        manager's lock. A mutation that fails before it is journaled gives its
        reservations back.
        """
        with self._lock:
            index = self._checkpoints[live.tenant.name]
            if checkpoint_id in index:
                raise AlreadyExistsError(f"checkpoint {checkpoint_id!r} already exists")
            index[checkpoint_id] = live.state.session_id
        live.claimed.add(checkpoint_id)

    def _release_claims(self, live: LiveSession) -> None:
        if not live.claimed:
            return
        with self._lock:
            index = self._checkpoints[live.tenant.name]
            for checkpoint_id in live.claimed:
                index.pop(checkpoint_id, None)
        live.claimed.clear()

    def _reindex(self, live: LiveSession, record: Record) -> None:
        """Keep the tenant's checkpoint_id -> session index in step with a record."""
        body = record.body
        added = [body["checkpoint"]["checkpoint_id"]] if "checkpoint" in body else []
        removed = list(body.get("dropped", ()))
        if record.kind == "delete_checkpoint":
            removed.append(body["checkpoint_id"])
        if not added and not removed:
            return
        with self._lock:
            index = self._checkpoints[live.tenant.name]
            for gone in removed:
                index.pop(gone, None)
            for new in added:
                index[new] = live.state.session_id

    def _outgrown(self, live: LiveSession) -> bool:
        """Is the session's journal past its compaction threshold (see COMPACT_MIN_BYTES)?"""
        threshold = max(self.compact_min_bytes, self.compact_factor * live.snapshot_bytes)
        return live.log.size > threshold

    def compact_requested(self) -> None:
        """Background hook: compact the journals that outgrew their threshold, and
        those of sessions gone idle with a tail worth dropping (IDLE_COMPACT_SECONDS)."""
        with self._lock:
            todo, self._to_compact = self._to_compact, {}
            for live in self._idle_sessions():
                todo.setdefault(live.key, live)
        for live in todo.values():
            # The bulk of the object fsyncs happen here, without the lock, so
            # writers of the session are held up only by the final pass.
            self.store.persist_objects(live.tenant)
            with self._exclusively(live):
                if not live.deleted and not live.damaged:
                    self._compact(live)

    def _idle_sessions(self) -> Sequence[LiveSession]:
        """Written sessions idle long enough whose journal tail is worth a compaction
        (under the manager's lock). Each is looked at once per idle spell."""
        if self.replicator is not None:
            self._written.clear()
            return []
        deadline = time.monotonic() - self.idle_compact_seconds
        idle = [live for live in self._written.values() if live.appended_at <= deadline]
        for live in idle:
            del self._written[live.key]
        return [
            live for live in idle if live.log.size - live.snapshot_bytes >= IDLE_COMPACT_MIN_BYTES
        ]

    def _compact(self, live: LiveSession) -> None:
        """Replace the journal by one snapshot record (objects fsynced first)."""
        self.store.persist_objects(live.tenant)
        snapshot = Record(
            "snapshot",
            {"v": live.state.version, "at": time.time(), "state": live.state.to_record()},
        )
        live.log.compact(lambda _reader: [snapshot])
        live.snapshot_bytes = live.log.size
        if self.replicator is not None:
            self.replicator.compacted(live)
        log.debug("compacted %s/%s to %d bytes", *live.key, live.snapshot_bytes)

    def compact(self, tenant: str, session_id: str) -> None:
        live = self.live(tenant, session_id)
        with self._exclusively(live):
            check_usable(live)
            self._compact(live)

    def _exclusively(self, live: LiveSession) -> contextlib.AbstractContextManager[None]:
        """Hold the session's lock across fsyncs (a compaction, a deletion); see
        Log.exclusively: the event loop never waits for the disk meanwhile."""
        return live.log.exclusively(live.lock, self.loop_barrier)

    def held_for_io(self, tenant: str, session_ids: str | Iterable[str]) -> bool:
        """Is the lock of any of these sessions held across fsyncs (or about to
        be)? The call runner then runs calls for it on a worker thread, not
        on the event loop: waiting there would hold up every other call."""
        ids = (session_ids,) if isinstance(session_ids, str) else session_ids
        sessions = self._sessions
        for session_id in ids:
            live = sessions.get((tenant, session_id))
            if live is not None and live.held_for_io:
                return True
        return False


class _Replay:
    """A session's journal replayed record by record (Log.recover's reducer):
    its state, the events it keeps, its snapshot's size, the objects restored
    from the records' inline copies."""

    def __init__(self, tenant: TenantStore, owner: str) -> None:
        self.tenant = tenant
        self.owner = owner
        self.state: SessionState | None = None
        self.history: collections.deque[SessionEvent] = collections.deque(maxlen=EVENT_HISTORY)
        self.snapshot_bytes = 0
        self.restored = 0

    def apply(self, record: Record, start: int, end: int) -> None:
        if record.kind in ("create", "snapshot"):
            self.state = SessionState.from_json(record.body["state"])
            if start == 0 and record.kind == "snapshot":
                self.snapshot_bytes = end
        elif self.state is None:
            raise DataLossError(f"journal of {self.owner} does not start with its creation")
        else:
            apply(self.state, record.kind, record.body)
        for digest, frame in zip(inline_digests(record), record.blobs, strict=True):
            self.restored += self.tenant.objects.restore(digest, frame, self.owner)
        if record.kind != "snapshot":
            self.history.append(event_of(record))


def validate_labels(labels: dict[str, str]) -> None:
    if len(labels) > MAX_LABELS:
        raise _label_error(f"at most {MAX_LABELS} labels, got {len(labels)}", "count", MAX_LABELS)
    for key, value in labels.items():
        if not 0 < len(key) <= MAX_LABEL_KEY:
            raise _label_error(
                f"label keys must be 1 to {MAX_LABEL_KEY} characters, got {len(key)}",
                "key",
                MAX_LABEL_KEY,
            )
        if len(value) > MAX_LABEL_VALUE:
            raise _label_error(
                f"label {key!r}: values must be at most {MAX_LABEL_VALUE} characters, "
                f"got {len(value)}",
                "value",
                MAX_LABEL_VALUE,
            )


def _label_error(message: str, what: str, limit: int) -> InvalidArgumentError:
    return InvalidArgumentError(message, metadata={"field": "labels", what: str(limit)})


def check_usable(live: LiveSession, *, allow_damaged: bool = False) -> None:
    if live.deleted:
        raise session_not_found(live.state.session_id)
    if live.damaged and not allow_damaged:
        raise DataLossError(live.damaged)


def check_version(live: LiveSession, expected_version: int) -> None:
    if expected_version < 0:
        raise InvalidArgumentError("expected_version must not be negative")
    if expected_version and expected_version != live.state.version:
        raise VersionConflictError(
            f"session {live.state.session_id!r} is at version {live.state.version}, "
            f"not {expected_version}"
        )


def require_status(live: LiveSession, *allowed: SessionStatus) -> None:
    if live.state.status not in allowed:
        raise FailedPreconditionError(
            f"session {live.state.session_id!r} is {live.state.status.value}"
        )


def inline_digests(record: Record) -> list[str]:
    """The digests of the objects a record carries inline (its blobs), in order.

    A record lists them in `objects`, or (save records since journals went
    lean) leaves the list out when each is the digest its frame's header
    names; an undecodable header then is damage the CRC missed.
    """
    listed = record.body.get("objects")
    if listed is not None:
        return list(listed)
    try:
        return [native.frame_digest_hex(frame) for frame in record.blobs]
    except CorruptObjectError as exc:
        raise DataLossError(f"an object a journal record carries is damaged: {exc}") from None


def event_of(record: Record) -> SessionEvent:
    body = record.body
    checkpoint = body.get("checkpoint") or {}
    return SessionEvent(
        version=body["v"],
        kind=record.kind,
        at=body["at"],
        checkpoint_id=checkpoint.get("checkpoint_id", body.get("checkpoint_id", "")),
        status=body.get("status", ""),
        detail=body.get("detail", {}),
    )


def encode_token(last: str) -> str:
    return base64.urlsafe_b64encode(last.encode()).decode()


def decode_token(token: str) -> str:
    """The ID a page token carries; anything but a token `encode_token` made is refused."""
    if not token:
        return ""
    try:
        # validate=True: the lenient default skips foreign characters ("!!!!" -> "").
        last = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
        return validate_id(last, "page_token")
    except (ValueError, UnicodeDecodeError, InvalidArgumentError):
        raise InvalidArgumentError("page_token is not a token this server issued") from None
