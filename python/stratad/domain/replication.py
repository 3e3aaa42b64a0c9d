"""Replication of sessions to object storage: shipping, leases, hydration.

See docs/replication.md for the model. In short:

- A session's remote history is its local journal, shipped as segments
  (store/remote.py). Everything a shipped record references is uploaded
  first (the tenant's new objects, in a pack), so a remote history never
  names an object the remote lacks.
- `async`: a background thread ships every `replication_lag` (a daemon loss
  loses at most that window of acknowledged writes). `sync`: a mutation is
  acknowledged only after its records are in object storage.
- One daemon writes a session at a time: it holds the lease in the session's
  HEAD (owner, epoch, expiry), renewed by every shipment. Every HEAD update is
  a conditional PUT on the version last seen, so a daemon that lost the lease
  cannot append to the history: its write fails FAILED_PRECONDITION and its
  local copy, which may hold what the remote never got, is dropped.
- A daemon asked for a session it does not have hydrates it: the segments
  become its local journal, the objects its checkpoints reach are fetched.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stratad import native, tracing
from stratad.domain.library_replication import parse_segment
from stratad.domain.models import SessionState, apply, roots
from stratad.errors import AlreadyExistsError, DataLossError, NotFoundError, StratadError
from stratad.store import manifest
from stratad.store.crypto import TENANT_KEY_NAME, EncryptionKeyError, RecordCipher
from stratad.store.log import parse_journal
from stratad.store.objects import NO_SIZE_LIMIT
from stratad.store.remote import (
    FailureLog,
    Head,
    LeaseHeldError,
    LeaseLostError,
    RemoteTier,
    VersionedHead,
    verified_frame,
)
from stratad.store.tenant import ROOT_CHUNK, ROOT_MANIFEST, TenantStore

if TYPE_CHECKING:
    from stratad.domain.library_replication import LibraryReplicator
    from stratad.domain.sessions import LiveSession, SessionManager

log = logging.getLogger(__name__)

REPLICATION_MODES = ("off", "async", "sync")
#: A HEAD listing more segments than this is rebased: the whole local journal
#: (at most the compaction threshold) becomes its one segment.
MAX_SEGMENTS = 256
#: Hydration retries when a segment vanished under it (a rebase removed it).
HYDRATE_ATTEMPTS = 3
#: The owner stops writing this fraction of the lease before it runs out, so
#: that a clock running slightly behind another daemon's cannot overlap it.
LEASE_MARGIN = 0.25


@dataclass
class RemoteVerifyReport:
    """What `Verify` found in object storage for one tenant."""

    objects_checked: int = 0
    #: (digest, problem) of every object whose remote copy fails re-hashing.
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    #: "<session>: problem" for every session whose remote history is damaged.
    damaged_sessions: list[str] = field(default_factory=list)
    #: "<node>/<segment>: problem" for every damaged tenant-library segment.
    damaged_library_segments: list[str] = field(default_factory=list)


@dataclass
class RemoteGcReport:
    """What a collection did in object storage for one tenant."""

    packs_deleted: int = 0
    bytes_freed: int = 0
    packs_condemned: int = 0
    packs_kept: int = 0


@dataclass
class _Shipping:
    """What this daemon knows of one session's remote side."""

    path: str
    head: Head | None = None
    version: dict[str, Any] | None = None
    #: Bytes of the local journal that the remote history holds.
    shipped: int = 0
    #: The local journal was compacted: ship it whole, as the new base.
    rebase: bool = False
    #: When the oldest write not yet shipped was made (0: all shipped).
    dirty_since: float = 0.0
    #: Segments a rebase replaced: deleted at the next rebase, so that a
    #: daemon hydrating from the older HEAD meanwhile still finds them.
    replaced: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Replicator:
    def __init__(
        self,
        sessions: SessionManager,
        remote: RemoteTier,
        *,
        mode: str,
        node_id: str,
        lag: float,
        lease: float,
        gc_grace: float = 3600.0,
    ) -> None:
        if mode not in ("async", "sync"):
            raise ValueError(f"replication mode {mode!r} needs no replicator")
        self.sessions = sessions
        self.remote = remote
        self.mode = mode
        self.node_id = node_id
        self.lag = lag
        self.lease = lease
        #: Seconds between condemning a remote pack and deleting it.
        self.gc_grace = gc_grace
        self._lock = threading.Lock()
        self._state: dict[tuple[str, str], _Shipping] = {}
        self._new_objects: dict[str, dict[str, None]] = {}
        self._tenant_locks: dict[str, threading.Lock] = {}
        self._hydrating: dict[tuple[str, str], threading.Lock] = {}
        #: Tenants whose wrapped data key is known to be in object storage.
        self._keys_published: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Seconds between a mutation and its shipment, as last measured (metrics).
        self.last_lag = 0.0
        #: The tenant libraries' replication (its figures join status()).
        self.library: LibraryReplicator | None = None
        #: Failures of the background rounds: reported once, then rate-limited.
        self.failures = FailureLog(log)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Queue the local objects the remote lacks; start shipping in the background."""
        for tenant in self.sessions.store.loaded_tenants():
            known = self.remote.known_objects(tenant.name)
            for digest in tenant.objects.digests():
                if digest not in known:
                    self.object_added(tenant.name, digest)
        self._thread = threading.Thread(target=self._loop, name="stratad-replication", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with contextlib.suppress(StratadError):
            self.ship_all()

    def _loop(self) -> None:
        while not self._stop.wait(self.lag):
            try:
                self.ship_all()
            except Exception as exc:  # keep shipping; each session's failure is logged
                self.failures.failed("replication round", repr(exc), exc_info=True)
            else:
                self.failures.recovered("replication round")

    # -- hooks from the session manager and the object store -------------------------

    def object_added(self, tenant: str, digest: str) -> None:
        with self._lock:
            self._new_objects.setdefault(tenant, {})[digest] = None

    def session_created(self, live: LiveSession) -> None:
        """Publish a new session: its first segment and a HEAD we own (If-None-Match)."""
        st = self._shipping(live)
        with st.lock:
            existing = self.remote.read_head(st.path)
            if existing is not None and not existing.head.deleted:
                raise AlreadyExistsError(
                    f"session {live.state.session_id!r} already exists (on another daemon)"
                )
            if existing is not None:  # a tombstone: take it over from its version
                st.head, st.version = existing.head, existing.version
            st.rebase = True
            self._ship_locked(live, st, claim=True)

    def session_deleted(self, live: LiveSession) -> None:
        """Leave a tombstone HEAD so that no daemon hydrates the session back."""
        st = self._shipping(live)
        with st.lock:
            if st.head is None:
                return
            gone = Head(self.node_id, st.head.epoch, 0.0, [], st.head.next_seq, deleted=True)
            self.remote.write_head(st.path, gone, st.version)
        with self._lock:
            self._state.pop(live.key, None)

    def compacted(self, live: LiveSession) -> None:
        """The local journal was rewritten: its remote history is rebased on it."""
        self._shipping(live).rebase = True

    def ensure_writable(self, live: LiveSession) -> None:
        """Hold the session's lease before a mutation (acquire it if it lapsed)."""
        st = self._shipping(live)
        with st.lock:
            st.dirty_since = st.dirty_since or time.time()
            if self._lease_valid(st):
                return
            current = self.remote.read_head(st.path)
            if current is None:  # a local session from before replication: publish it
                st.rebase = True
                self._ship_locked(live, st, claim=True)
                return
            head = current.head
            if head.owner != self.node_id and head.lease_until > time.time():
                if st.head is None or head.segments != st.head.segments:
                    self._drop_local(live)  # stale: the next read hydrates the current one
                raise LeaseHeldError(
                    f"session {live.state.session_id!r} is being written by daemon "
                    f"{head.owner!r} (lease for another {head.lease_until - time.time():.1f}s); "
                    "this daemon serves it read-only",
                    metadata={"owner": head.owner},
                )
            if st.head is None or head.segments != st.head.segments or head.deleted:
                # The history moved on elsewhere: our copy is stale; the next
                # call hydrates the current one.
                self._drop_local(live)
                raise LeaseLostError(
                    f"session {live.state.session_id!r} was changed by another daemon; "
                    "retry to continue from its latest state"
                )
            claimed = Head(
                self.node_id, head.epoch + 1, time.time() + self.lease, head.segments,
                head.next_seq,
            )  # fmt: skip
            st.version = self._write_head(live, st, claimed, current.version)
            st.head = claimed

    def fresh(self, live: LiveSession) -> bool:
        """Is our copy of the session current? (False: it was dropped; hydrate again.)

        A session whose lease we hold is current by construction; otherwise
        another daemon may have moved its history on, so its HEAD is checked.
        """
        st = self._shipping(live)
        if self._lease_valid(st):
            return True
        current = self.remote.read_head(st.path)
        if current is None:
            return True  # never published (a local session from before replication)
        head = current.head
        if not head.deleted and st.head is not None and head.segments == st.head.segments:
            return True
        self._drop_local(live)
        return False

    def replicate(self, keys: Iterable[tuple[str, str]]) -> None:
        """`sync` mode: ship the given sessions now (their writes wait for it)."""
        if self.mode != "sync":
            return
        for key in dict.fromkeys(keys):
            try:
                live = self.sessions.live(*key)
            except NotFoundError:
                continue
            st = self._shipping(live)
            with st.lock:
                self._ship_locked(live, st)

    # -- shipping ---------------------------------------------------------------------

    def ship_all(self) -> None:
        """Ship every session with unshipped writes of ours (the `async` round).

        Failures are reported as one: object storage down fails every session
        at once, and is reported once, then every REPORT_EVERY seconds while
        it lasts, not once per session and round.
        """
        failed: list[str] = []
        tried = 0
        for live in self.sessions.all_sessions():
            st = self._shipping(live)
            if not st.rebase and st.shipped >= live.log.size:
                continue
            if st.head is None or st.head.owner != self.node_id:
                continue  # never written here: nothing of ours to ship
            tried += 1
            try:
                with st.lock:
                    self._ship_locked(live, st)
            except StratadError as exc:
                failed.append(f"{live.key[0]}/{live.key[1]}: {exc.message}")
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            self.failures.failed(
                "shipping sessions to object storage",
                f"{len(failed)} of {tried} sessions not shipped; {failed[0]}{more}",
            )
        else:
            self.failures.recovered("shipping sessions to object storage")

    def _ship_locked(self, live: LiveSession, st: _Shipping, *, claim: bool = False) -> None:
        """Upload what the remote lacks of this session, then move its HEAD (st.lock held)."""
        tenant, session = live.key
        attributes = {"stratad.tenant": tenant, "stratad.session_id": session}
        with tracing.span("stratad.replication.ship", attributes):
            self._ship(live, st, claim=claim)

    def _ship(self, live: LiveSession, st: _Shipping, *, claim: bool) -> None:
        started = time.time()
        with live.lock:
            if live.deleted:
                return
            end = live.log.size
            rebase = st.rebase or (st.head is not None and len(st.head.segments) >= MAX_SEGMENTS)
            start = 0 if rebase else st.shipped
            st.rebase = False
            data = live.log.read(start, end)
        if not data and not claim:
            return
        tracing.annotate({"stratad.bytes": len(data), "stratad.replication.rebase": rebase})
        # Objects first: the records about to be shipped may reference any
        # object put before they were appended.
        self._upload_objects(live.tenant)
        head = st.head
        epoch = (head.epoch + 1) if claim and head is not None else (head.epoch if head else 1)
        seq = head.next_seq if head is not None else 0
        name = f"{epoch:08d}-{seq:012d}"
        self.remote.put_segment(st.path, name, data)
        segments = [name] if rebase or head is None else [*head.segments, name]
        new = Head(self.node_id, epoch, time.time() + self.lease, segments, seq + 1)
        st.version = self._write_head(live, st, new, st.version)
        if rebase and head is not None:
            self._delete_replaced(st, head.segments)
        st.head, st.shipped = new, end
        self.last_lag = time.time() - started
        with live.lock:
            if live.log.size <= end:
                st.dirty_since = 0.0

    def _delete_replaced(self, st: _Shipping, now_replaced: list[str]) -> None:
        """Delete the segments the previous rebase replaced; remember these for the next."""
        for name in st.replaced:
            try:
                self.remote.delete_segment(st.path, name)
            except StratadError as exc:  # garbage left behind, not data lost
                log.warning("could not delete replaced segment %s/%s: %s", st.path, name, exc)
        st.replaced = list(now_replaced)

    def _write_head(
        self, live: LiveSession, st: _Shipping, head: Head, version: dict[str, Any] | None
    ) -> dict[str, Any]:
        try:
            return self.remote.write_head(st.path, head, version)
        except LeaseLostError:
            self._drop_local(live)
            raise

    def _upload_objects(self, tenant: TenantStore) -> None:
        lock = self._tenant_lock(tenant.name)
        with lock:  # a pack another thread is uploading is complete when we get here
            self._publish_key(tenant)
            with self._lock:
                queued = self._new_objects.pop(tenant.name, {})
            frames = []
            for digest in queued:
                if tenant.objects.has(digest):
                    frames.append((digest, tenant.objects.read_plain_frame(digest)))
            try:
                with tracing.span(
                    "stratad.replication.upload_pack", {"stratad.objects": len(frames)}
                ):
                    self.remote.upload_pack(tenant.name, frames)
            except BaseException:
                with self._lock:  # try again next time
                    self._new_objects.setdefault(tenant.name, {}).update(queued)
                raise

    def _publish_key(self, tenant: TenantStore) -> None:
        """Make sure object storage holds the tenant's wrapped data key (encryption at rest).

        A daemon hydrating the tenant adopts it (store/crypto.py). A tenant
        whose key was made before replication was on publishes it here, once.
        Two daemons that each made a different key for the tenant cannot
        share its data: that is refused, never overwritten.
        """
        store = self.sessions.store
        keyring = store.keyring
        if keyring is None or tenant.name in self._keys_published:
            return
        local = (tenant.root / TENANT_KEY_NAME).read_bytes()
        stored = self.remote.create_tenant_key(tenant.name, local)
        if stored != local:
            if not keyring.same_data_key(tenant.name, local, stored):
                raise EncryptionKeyError(
                    f"tenant {tenant.name!r} has a different data key in object storage than "
                    "here: its data was written by another daemon with another key; move "
                    "this daemon's data away before replicating it"
                )
            self.remote.put_tenant_key(tenant.name, local)  # the current wrapping
        self._keys_published.add(tenant.name)

    def _journal_cipher(self, tenant: str, session_id: str) -> RecordCipher | None:
        """The cipher of a session's journal (its remote segments are its bytes)."""
        store = self.sessions.store
        if store.keyring is None:
            return None
        return store.journal_cipher(store.tenant(tenant).sessions_root / session_id / "journal")

    # -- hydration ------------------------------------------------------------------------

    def hydrate(self, tenant: str, session_id: str) -> bool:
        """Make a session that exists only remotely local; False if it is nowhere."""
        key = (tenant, session_id)
        with self._lock:
            lock = self._hydrating.setdefault(key, threading.Lock())
        with lock:
            if self.sessions.is_loaded(tenant, session_id):
                return True
            path = RemoteTier.session_path(tenant, session_id)
            found = self._read_history(path)
            if found is None:
                return False
            current, data = found
            live = self.sessions.install(tenant, session_id, data)
            self._fetch_objects(live)
            st = self._shipping(live)
            st.head, st.version, st.shipped = current.head, current.version, live.log.size
            log.info("hydrated %s/%s from object storage (%d bytes)", tenant, session_id, len(data))
            return True

    def restore(self, tenant: str, session_id: str) -> None:
        """Replace our copy of a session (missing, stale, damaged) by the remote history."""
        local = self.sessions.loaded(tenant, session_id)
        path = RemoteTier.session_path(tenant, session_id)
        if self._read_history(path) is None:
            raise NotFoundError(f"session {session_id!r} is not in object storage")
        if local is not None:
            self._drop_local(local)
        if not self.hydrate(tenant, session_id):
            raise NotFoundError(f"session {session_id!r} is not in object storage")
        restored = self.sessions.loaded(tenant, session_id)
        if restored is not None:  # objects damaged locally: rewrite them from the remote
            self._fetch_objects(restored, repair=True)

    # -- garbage collection ----------------------------------------------------------------

    def collect_remote(self, tenant: str) -> RemoteGcReport:
        """Delete packs no remote history references, in two steps a grace period apart.

        A pack whose objects no session's HEAD reaches is first *condemned*
        (listed in the tenant's CONDEMNED object, which uploaders read: they
        stop deduplicating against it and upload their own copies). A later
        collection deletes it if it is still unreferenced and was condemned at
        least `gc_grace` seconds before. Packs younger than the grace period
        are never touched: their segment and HEAD may still be on the way.
        """
        report = RemoteGcReport()
        condemned, version = self.remote.read_condemned(tenant)
        referenced = self._remote_references(tenant)
        ages = self.remote.pack_ages(tenant)
        now = time.time()
        keep_condemned: dict[str, float] = {}
        doomed: list[tuple[str, int]] = []
        for pack, items in self.remote.packs(tenant).items():
            if any(d in referenced for d, _, _ in items) or ages.get(pack, 0.0) < self.gc_grace:
                report.packs_kept += 1
                continue
            since = condemned.get(pack)
            if since is not None and now - since >= self.gc_grace:
                doomed.append((pack, sum(length for _, _, length in items)))
                continue
            keep_condemned[pack] = since or now
            report.packs_condemned += int(since is None)
            report.packs_kept += 1
        # The list first: a pack deleted but still listed would only be skipped.
        self.remote.write_condemned(tenant, keep_condemned, version)
        for pack, size in doomed:
            self.remote.delete_pack(tenant, pack)
            report.packs_deleted += 1
            report.bytes_freed += size
        return report

    def _remote_references(self, tenant: str) -> set[str]:
        """Every object a checkpoint of a remote history reaches (the mark phase)."""
        found: set[str] = set()
        for session_id in self.remote.list_sessions(tenant):
            history = self._read_history(RemoteTier.session_path(tenant, session_id))
            if history is None:
                continue  # deleted: its objects are garbage
            state = replay_state(history[1], self._journal_cipher(tenant, session_id))
            for cp in state.checkpoints.values() if state is not None else ():
                for root, kind in roots(cp):
                    found |= self._remote_closure(tenant, root, kind, found)
        return found

    def _remote_closure(self, tenant: str, root: str, kind: str, known: set[str]) -> set[str]:
        """The objects a root reaches, reading manifests from object storage."""
        reached: set[str] = set()
        todo = [(root, kind)]
        while todo:
            digest, kind = todo.pop()
            if digest in reached or digest in known:  # known: its closure is in `known` too
                continue
            reached.add(digest)
            if kind != ROOT_MANIFEST:
                continue
            frame = self.remote.fetch_objects(tenant, [digest])[digest]
            m = manifest.decode(native.decode_frame(frame, NO_SIZE_LIMIT))
            todo.extend((chunk, ROOT_CHUNK) for chunk, _ in manifest.iter_entries(m.added))
            if m.base:
                todo.append((m.base, ROOT_MANIFEST))
        return reached

    # -- verification --------------------------------------------------------------------

    def verify_remote(self, tenant: str) -> RemoteVerifyReport:
        """Re-hash every object of the tenant's packs; check every session's segments.

        A segment must be whole journal records (their checksums pass, nothing
        trails them): what a daemon hydrating the session would replay.
        """
        report = RemoteVerifyReport()
        for pack, items in sorted(self.remote.packs(tenant).items()):
            self._verify_pack(tenant, pack, items, report)
        for session_id in self.remote.list_sessions(tenant):
            problem = self._verify_history(
                RemoteTier.session_path(tenant, session_id),
                self._journal_cipher(tenant, session_id),
            )
            if problem:
                report.damaged_sessions.append(f"{session_id}: {problem}")
        for node, segments in sorted(self.remote.list_library(tenant).items()):
            for seq, kind in segments:
                data = self.remote.get_library_segment(tenant, node, seq, kind)
                if data is not None and parse_segment(data) is None:  # None: compacted away
                    report.damaged_library_segments.append(
                        f"{node}/{seq:012d}.{kind}: a record fails its checksum"
                    )
        return report

    def _verify_pack(
        self, tenant: str, pack: str, items: list[tuple[str, int, int]], report: RemoteVerifyReport
    ) -> None:
        report.objects_checked += len(items)
        try:
            data = self.remote.read_pack(pack)
        except DataLossError as exc:
            report.corrupt.extend((digest, str(exc)) for digest, _, _ in items)
            return
        for digest, offset, length in items:
            try:
                verified_frame(
                    digest, data[offset : offset + length], pack, self.remote.cipher_of(tenant)
                )
            except DataLossError as exc:
                report.corrupt.append((digest, exc.message))

    def _verify_history(self, path: str, cipher: RecordCipher | None = None) -> str:
        """The problem with the session's remote history ("" when it replays cleanly)."""
        current = self.remote.read_head(path)
        if current is None or current.head.deleted:
            return ""
        for name in current.head.segments:
            try:
                data = self.remote.get_segment(path, name)
            except DataLossError as exc:
                return exc.message
            parsed = parse_journal(data, cipher)
            if parsed.valid_bytes != len(data):
                return f"segment {name} is damaged at byte {parsed.valid_bytes}"
        return ""

    def _read_history(self, path: str) -> tuple[VersionedHead, bytes] | None:
        """A session's HEAD and its whole history (None: no such session, or deleted)."""
        for attempt in range(HYDRATE_ATTEMPTS):
            current = self.remote.read_head(path)
            if current is None or current.head.deleted:
                return None
            try:
                segments = [self.remote.get_segment(path, s) for s in current.head.segments]
            except DataLossError:  # a rebase replaced them meanwhile: read the HEAD again
                if attempt == HYDRATE_ATTEMPTS - 1:
                    raise
                continue
            return current, b"".join(segments)
        return None

    def _fetch_objects(self, live: LiveSession, *, repair: bool = False) -> None:
        """Fetch every object the session's checkpoints reach that is not local.

        With `repair`, also those present but damaged (they fail re-hashing).
        """
        store = live.tenant
        with live.lock:
            todo = [r for cp in live.state.checkpoints.values() for r in roots(cp)]
        seen: set[str] = set()
        while todo:
            wanted = [(d, k) for d, k in todo if d not in seen]
            seen.update(d for d, _ in wanted)
            missing = [
                d for d, _ in wanted
                if not store.objects.has(d) or (repair and store.objects.verify(d) is not None)
            ]  # fmt: skip
            fetched = self.remote.fetch_objects(store.name, missing) if missing else {}
            for digest, frame in fetched.items():
                store.objects.restore(digest, frame, live.owner)
            todo = []
            for digest, kind in wanted:
                if kind == ROOT_MANIFEST:  # its chunks, and the manifest it is a delta on
                    m = manifest.decode(store.read_object(digest))
                    todo.extend((chunk, ROOT_CHUNK) for chunk, _ in manifest.iter_entries(m.added))
                    if m.base:
                        todo.append((m.base, ROOT_MANIFEST))
        # Fetched objects are carried by no journal record: make them durable now.
        self.sessions.store.persist_objects(store)

    # -- helpers ------------------------------------------------------------------------------

    def _shipping(self, live: LiveSession) -> _Shipping:
        with self._lock:
            st = self._state.get(live.key)
            if st is None:
                st = self._state[live.key] = _Shipping(RemoteTier.session_path(*live.key))
            return st

    def _tenant_lock(self, tenant: str) -> threading.Lock:
        with self._lock:
            return self._tenant_locks.setdefault(tenant, threading.Lock())

    def _lease_valid(self, st: _Shipping) -> bool:
        head = st.head
        if head is None or head.owner != self.node_id or head.deleted:
            return False
        return time.time() < head.lease_until - LEASE_MARGIN * self.lease

    def _drop_local(self, live: LiveSession) -> None:
        """Forget our copy of a session another daemon took over (it may hold unshipped writes)."""
        with self._lock:
            self._state.pop(live.key, None)
        self.sessions.evict(live)
        log.warning("session %s/%s is owned by another daemon now; dropped our copy", *live.key)

    def status(self) -> dict[str, Any]:
        """For `stratad ctl replication status` and the metrics."""
        with self._lock:
            states = dict(self._state)
            queued = sum(len(q) for q in self._new_objects.values())
        owned = [k for k, st in states.items() if st.head and st.head.owner == self.node_id]
        loaded = {live.key: live for live in self.sessions.all_sessions()}
        behind, dirty = 0, []
        for key in owned:
            live = loaded.get(key)
            unshipped = live.log.size - states[key].shipped if live is not None else 0
            if unshipped > 0:
                behind += unshipped
                dirty.append(states[key].dirty_since or time.time())
        oldest = min(dirty, default=0.0)
        return {
            "mode": self.mode, "node_id": self.node_id, "sessions_owned": len(owned),
            "bytes_behind": behind, "objects_queued": queued,
            "lag_seconds": time.time() - oldest if oldest else 0.0,
            "last_shipment_seconds": self.last_lag,
            **(self.library.status() if self.library is not None else {}),
        }  # fmt: skip


def replay_state(journal: bytes, cipher: RecordCipher | None = None) -> SessionState | None:
    """The session state a journal's records make (None: no creation record)."""
    state: SessionState | None = None
    for record in parse_journal(journal, cipher).records:
        if record.kind in ("create", "snapshot"):
            state = SessionState.from_json(record.body["state"])
        elif state is not None:
            apply(state, record.kind, record.body)
    return state
