"""Replication of tenant libraries (crystals, user profiles) to object storage.

Sessions have one writer at a time (a lease, domain/replication.py); a
tenant's crystal library and user profiles do not: every daemon of a
horizontally scaled agent service writes them at once. So each daemon keeps
its *own stream* of the library records it writes, and merges everybody
else's (docs/replication.md, "Tenant libraries"):

- Every crystal/profile record this daemon journals is also queued for its
  stream; shipping uploads the queue as one immutable segment,
  ``tenants/<t>/library/<node>/<seq>.seg`` (a conditional create: two
  daemons with one node ID are refused). `sync`: the write is acknowledged
  once its segment is in object storage; `async`: every `lag` seconds.
- Every `lag` seconds a daemon reads which streams moved on from the other
  daemons' heartbeats (``nodes/<node>``: where each of its streams ends),
  lists those tenants' streams and merges the segments it has not applied
  yet (at start, and every FULL_SWEEP_SECONDS, every tenant's). Records
  carry hybrid-clock stamps (domain/stamps.py) and merge deterministically,
  whatever the order they arrive in: last writer wins per crystal ID, per
  user profile and for the library config; deletions are tombstones; reuse
  counters are per daemon and add up. Every daemon therefore converges to the same library.
- A stream is bounded: after COMPACT_EVERY segments (a ``.snap``), and once
  at start after catching up with its own stream (a ``.base``), a daemon
  writes everything of the library it wrote and that still holds, then
  deletes the segments before its previous base. A reader that keeps up
  reads segment after segment and skips compactions; one that fell behind
  starts again from the last base (merging is idempotent, so reading a
  record twice changes nothing).
- Streams do not pile up with restarts: the data directory remembers the
  node IDs it ran under (NODES_FILE). A daemon *adopts* the earlier ones
  (the default node ID changes with every restart): its base carries their
  share of the library too, names them (a ``library.nodes`` record, so that
  the adoption survives a lost data directory), and their streams are
  deleted. A daemon that is gone with its data directory (a pod replaced on
  an empty volume) stops writing its heartbeat (``nodes/<node>``); once it
  has been silent for `retire_after` seconds, a live daemon claims it
  (conditional create of ``nodes/<node>.adopted-*``: one adopter) and adopts
  its streams the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from stratad.domain.stamps import HybridClock
from stratad.errors import InvalidArgumentError, StratadError
from stratad.ids import validate_id
from stratad.store.journal import Record
from stratad.store.log import Log, read_record_file
from stratad.store.log import records as log_records
from stratad.store.remote import FailureLog, NodeBeat, RemoteTier

if TYPE_CHECKING:
    from stratad.domain.crystals import CrystalLibraries
    from stratad.domain.profiles import Profiles

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Segments a daemon ships after its last base before it writes a new one.
COMPACT_EVERY = 32
#: In the data directory: the node IDs it has run under (one journal record).
NODES_FILE = "library-nodes"
#: The first record of a base that carries adopted streams: {"nodes": [...]}.
NODES_KIND = "library.nodes"
#: Segment kinds: records shipped ("seg"); a base with everything of the
#: library its writer answers for ("base": at start, after an adoption or a
#: dropped queue); a compaction ("snap": restates the earlier segments only).
SNAPSHOT = "snap"
BASES = ("base", SNAPSHOT)
#: Seconds between a daemon's heartbeats (and its checks for daemons gone).
HEARTBEAT_SECONDS = 60.0
#: Seconds between rounds that list every tenant's streams, not only those
#: the heartbeats say changed (a safety net: e.g. a daemon that died between
#: shipping and its heartbeat).
FULL_SWEEP_SECONDS = 600.0
#: Records queued beyond this many bytes (object storage unreachable for long)
#: are dropped from memory: the next shipment is a base, which holds them all.
MAX_QUEUED_BYTES = 64 << 20
PROFILE_KINDS = ("profile.put", "profile.delete")
CRYSTAL_KINDS = ("crystal", "reuse", "delete", "config")


@dataclass
class _Stream:
    """This daemon's stream of one tenant's library."""

    #: Encoded records written here and not shipped yet, in journal order.
    queued: list[bytes] = field(default_factory=list)
    queued_bytes: int = 0
    #: The queue outgrew MAX_QUEUED_BYTES and was dropped: ship a base instead.
    rebase: bool = False
    #: Tickets: records published so far, and how many of them are shipped.
    published: int = 0
    shipped: int = 0
    #: When the oldest record not shipped yet was written (0: none).
    oldest: float = 0.0
    #: Next segment number, segments since the last base, segments in the
    #: bucket; None until the stream was read back at start (`_prepare`).
    next_seq: int | None = None
    since_base: int = 0
    segments: int = 0
    #: The last base written: the segments before it are deleted at the next
    #: base, so that a reader keeping up never has to download a base.
    last_base: int = -1
    #: Held while shipping (sync writers wait here for each other's uploads).
    lock: threading.Lock = field(default_factory=threading.Lock)


class LibraryReplicator:
    """Ships this daemon's library records; merges the other daemons' (see module doc)."""

    def __init__(
        self,
        remote: RemoteTier,
        crystals: CrystalLibraries,
        profiles: Profiles,
        *,
        mode: str,
        node_id: str,
        lag: float,
        retire_after: float = 3600.0,
    ) -> None:
        self.remote = remote
        self.crystals = crystals
        self.profiles = profiles
        self.mode = mode
        self.node_id = node_id
        self.lag = lag
        #: A daemon silent this long is gone: a live one adopts its streams.
        self.retire_after = retire_after
        self._heartbeat_at: float | None = None
        #: Where our streams ended at the last heartbeat (tenant -> next segment).
        self._announced: dict[str, int] = {}
        #: node -> version of its heartbeat last read; when every tenant was listed.
        self._beats_read: dict[str, str] = {}
        self._swept_at: float | None = None
        self.clock = HybridClock(node_id)
        #: Earlier node IDs whose share of every library this daemon publishes.
        self.adopted: set[str] = set()
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        #: (tenant, node) -> the last segment of that stream merged here.
        self._cursors: dict[tuple[str, str], int] = {}
        self._pull_locks: dict[str, threading.Lock] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: (tenant, node, seq) of segments found damaged (never merged; see status()).
        self._damaged: set[tuple[str, str, int]] = set()
        #: Failures of the background rounds: reported once, then rate-limited.
        self.failures = FailureLog(log)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Catch up with every tenant's library in object storage, then run in the background."""
        self._adopt(self._remembered_nodes())
        try:
            self.sync_all()
        except StratadError as exc:  # the loop tries again; local state is served meanwhile
            log.warning("catching up with the libraries in object storage failed: %s", exc)
        self._thread = threading.Thread(target=self._loop, name="stratad-library", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for tenant in self._tenants_with_queue():
            try:
                self.ship(tenant)
            except StratadError as exc:
                log.warning("shipping the library of %r at shutdown failed: %s", tenant, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.lag):
            try:
                self.sync_all()
            except Exception as exc:  # keep going; the next round retries
                self.failures.failed("library replication round", repr(exc), exc_info=True)
            else:
                self.failures.recovered("library replication round")

    def sync_all(self) -> None:
        """One round: ship what is queued, merge what other daemons shipped.

        Which tenants changed elsewhere is read from the other daemons'
        heartbeats (one LIST, and a GET of each heartbeat that changed), so a
        round costs a LIST per tenant only for the tenants that changed. Every
        FULL_SWEEP_SECONDS (and at start) every tenant in the bucket is
        listed anyway. The first round for a tenant also reads this daemon's
        own stream back and writes its base (`_prepare`).
        """
        now = time.monotonic()
        full = self._swept_at is None or now - self._swept_at >= FULL_SWEEP_SECONDS
        beats = self._try("listing heartbeats", self.remote.heartbeats) or {}
        due = self._heartbeat_at is None or now - self._heartbeat_at >= HEARTBEAT_SECONDS
        if due:  # before the tenants: their bases then carry what is adopted
            self._try("adopting the streams of daemons gone", self._adopt_gone, beats)
        tenants = self._all_tenants() if full else self._local_tenants()
        for tenant in tenants:
            self._try(f"replicating the library of {tenant!r}", self._sync_tenant, tenant, full)
        if full:
            self._swept_at = now
        else:
            self._pull_changed(beats)
        if due or self._ends() != self._announced:
            self._try("writing the heartbeat", self._announce)

    def _sync_tenant(self, tenant: str, pull: bool) -> bool:
        stream = self._stream(tenant)
        if stream.next_seq is None:
            with stream.lock:
                if stream.next_seq is None:
                    self._prepare(tenant, stream)
        if stream.queued or stream.rebase:
            self.ship(tenant)
        if pull:
            self.pull(tenant)
        return True

    def _pull_changed(self, beats: dict[str, NodeBeat]) -> None:
        """Merge the tenants whose streams other daemons' heartbeats say moved on."""
        for node, beat in beats.items():
            if node == self.node_id or self._beats_read.get(node) == beat.version:
                continue
            streams = self._try(
                f"reading the heartbeat of {node!r}", self.remote.read_heartbeat, node
            )
            behind = [
                tenant
                for tenant, next_seq in (streams or {}).items()
                if next_seq - 1 > self._cursors.get((tenant, node), -1)
            ]
            pulled = [self._try(f"merging the library of {t!r}", self.pull, t) for t in behind]
            if streams is not None and all(p is not None for p in pulled):
                self._beats_read[node] = beat.version  # else read it again next round

    def _try(self, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn(*args)`, or None after logging why (object storage refused, most likely).

        A failure that persists is logged once, then every REPORT_EVERY seconds
        (store/remote.py FailureLog), not every round.
        """
        try:
            result = fn(*args)
        except StratadError as exc:
            self.failures.failed(what, exc.message)
            return None
        self.failures.recovered(what)
        return result

    def _ends(self) -> dict[str, int]:
        with self._lock:
            return {t: s.next_seq for t, s in self._streams.items() if s.next_seq}

    # -- LibraryReplica (called by the crystal and profile domains) ----------------------

    def published(self, tenant: str, data: bytes) -> int:
        """Queue a record this daemon journaled (under the domain's lock); its ticket."""
        with self._lock:
            stream = self._streams.setdefault(tenant, _Stream())
            stream.published += 1
            stream.oldest = stream.oldest or time.time()
            if not stream.rebase:
                stream.queued.append(data)
                stream.queued_bytes += len(data)
            if stream.queued_bytes > MAX_QUEUED_BYTES:
                stream.queued, stream.queued_bytes, stream.rebase = [], 0, True
            return stream.published

    def acknowledge(self, tenant: str, ticket: int) -> None:
        """`sync`: return once the record with `ticket` is in object storage."""
        if self.mode == "sync":
            self.ship(tenant, upto=ticket)

    # -- shipping --------------------------------------------------------------------------

    def ship(self, tenant: str, *, upto: int | None = None) -> None:
        """Upload the queued records of `tenant` as one segment (all of them, not only `upto`)."""
        stream = self._stream(tenant)
        with stream.lock:
            if upto is not None and stream.shipped >= upto:
                return  # another writer's segment carried it
            if stream.next_seq is None:
                self._prepare(tenant, stream)
            with self._lock:
                records, end, rebase = stream.queued, stream.published, stream.rebase
                stream.queued, stream.queued_bytes, stream.rebase = [], 0, False
            if rebase:
                self._ship_base(tenant, stream, end)
                return
            if not records:
                return
            try:
                self._put(tenant, stream, "seg", b"".join(records))
            except BaseException:
                with self._lock:  # shipped by the next round
                    stream.queued = records + stream.queued
                    stream.queued_bytes += sum(len(r) for r in records)
                raise
            with self._lock:
                stream.shipped = end
                stream.oldest = time.time() if stream.queued else 0.0
            if stream.since_base >= COMPACT_EVERY:
                self._write_base(tenant, stream, kind=SNAPSHOT)

    def _ship_base(self, tenant: str, stream: _Stream, end: int) -> None:
        """Ship the records up to ticket `end` as a base (the queue was dropped; lock held).

        Every record with a ticket up to `end` was applied under its domain's
        lock before the export below can take that lock, so the base holds it.
        """
        try:
            self._write_base(tenant, stream)
        except BaseException:
            with self._lock:
                stream.rebase = True
            raise
        with self._lock:
            stream.shipped = max(stream.shipped, end)
            stream.oldest = time.time() if stream.published > end else 0.0

    def _prepare(self, tenant: str, stream: _Stream) -> None:
        """Before this daemon's first shipment for `tenant`: read its stream back.

        A daemon that lost its data directory but kept its node ID (a
        StatefulSet pod) finds its earlier records there: they are merged
        first, so that the base written next cannot leave any out.
        """
        streams = self.pull(tenant, own=True)
        segments = streams.get(self.node_id, [])
        stream.next_seq = max((seq for seq, _ in segments), default=-1) + 1
        stream.segments = len(segments)
        bases = [seq for seq, kind in segments if kind in BASES]
        stream.last_base = max(bases, default=-1)
        stream.since_base = sum(seq > stream.last_base for seq, _ in segments)
        retired = {node: streams[node] for node in self.adopted if node in streams}
        if segments or retired or self._export(tenant):
            self._write_base(tenant, stream)
        for node, old in retired.items():  # their share is in our base now
            for seq, kind in old:
                self.remote.delete_library_segment(tenant, node, seq, kind)
            log.info("adopted the library stream of %r (tenant %r)", node, tenant)

    def _write_base(self, tenant: str, stream: _Stream, *, kind: str = "base") -> None:
        """Replace this daemon's stream by one base segment (stream.lock held).

        `kind` SNAPSHOT: a compaction, which restates only what the stream's
        earlier segments hold (a reader that merged them all skips it).
        """
        base = stream.next_seq
        records = self._export(tenant)
        if self.adopted:
            records.insert(0, Record(NODES_KIND, {"nodes": sorted(self.adopted)}).encode())
        self._put(tenant, stream, kind, b"".join(records))
        for seq, old in self.remote.list_library(tenant).get(self.node_id, []):
            if seq < stream.last_base:  # the generation before the previous base
                self.remote.delete_library_segment(tenant, self.node_id, seq, old)
                stream.segments -= 1
        assert base is not None
        stream.last_base = base
        self._cursors[(tenant, self.node_id)] = base

    def _export(self, tenant: str) -> list[bytes]:
        nodes = {self.node_id, *self.adopted}
        return self.crystals.export_origin(tenant, nodes) + self.profiles.export_origin(
            tenant, nodes
        )

    def _remembered_nodes(self) -> list[str]:
        """The node IDs this data directory answers for: it ran under them, or adopted them."""
        path = self.crystals.store.data_dir / NODES_FILE
        earlier: list[str] = []
        for record in read_record_file(path):
            earlier = [str(node) for node in record.body["nodes"]]
        self._remember([self.node_id])
        return earlier

    def _announce(self) -> bool:
        """The heartbeat: this daemon is alive, and where its streams end (once a
        minute, and whenever a stream moved on)."""
        ends = self._ends()
        self.remote.write_heartbeat(self.node_id, ends)
        self._heartbeat_at, self._announced = time.monotonic(), ends
        return True

    def _adopt_gone(self, beats: dict[str, NodeBeat]) -> bool:
        """Claim the daemons silent for longer than `retire_after`; adopt their streams."""
        now = time.time()
        gone = [
            (node, beat.seen)
            for node, beat in beats.items()
            if now - beat.seen > self.retire_after and node != self.node_id
        ]
        claimed = [n for n, seen in gone if self.remote.claim_node(n, seen, self.node_id)]
        if claimed:
            self._adopt(claimed)
            self._remember(claimed)
            log.info("adopting the library streams of %s (silent for too long)", claimed)
            with self._lock:
                streams = list(self._streams.values())
            for stream in streams:  # bases written next carry their share
                with stream.lock:
                    stream.next_seq = None
        return True

    def _remember(self, nodes: list[str]) -> None:
        """Add `nodes` to the IDs this data directory answers for (NODES_FILE)."""
        path = self.crystals.store.data_dir / NODES_FILE
        known: list[str] = []
        for record in read_record_file(path):
            known = [str(node) for node in record.body["nodes"]]
        merged = [*known, *(n for n in nodes if n not in known)]
        if merged != known:
            Log(self.crystals.store, path).replace([Record(NODES_KIND, {"nodes": merged})])

    def _adopt(self, nodes: list[str]) -> None:
        """Publish the share of `nodes` (earlier incarnations of this daemon) from now on."""
        with self._lock:
            self.adopted.update(n for n in nodes if n != self.node_id)

    def _put(self, tenant: str, stream: _Stream, kind: str, data: bytes) -> None:
        assert stream.next_seq is not None
        self.remote.put_library_segment(tenant, self.node_id, stream.next_seq, kind, data)
        stream.next_seq += 1
        stream.segments += 1
        stream.since_base = 0 if kind in BASES else stream.since_base + 1

    # -- merging ----------------------------------------------------------------------------

    def pull(self, tenant: str, *, own: bool = False) -> dict[str, list[tuple[int, str]]]:
        """Merge the segments of other daemons (and with `own`, ours) not merged yet.

        Returns the tenant's streams as listed.
        """
        with self._lock:
            lock = self._pull_locks.setdefault(tenant, threading.Lock())
        with lock:
            streams = self.remote.list_library(tenant)
            for node, segments in sorted(streams.items()):
                if node != self.node_id or own:
                    self._pull_stream(tenant, node, segments)
            return streams

    def _pull_stream(self, tenant: str, node: str, segments: list[tuple[int, str]]) -> None:
        cursor = self._cursors.get((tenant, node), -1)
        bases = [seq for seq, kind in segments if kind in BASES]
        listed = {seq for seq, _ in segments}
        # Go on segment by segment while they are there (compactions are then
        # skipped); a newcomer, or a reader whose next segment is gone or
        # damaged, starts from the writer's last base.
        start = cursor + 1
        stuck = start not in listed or (tenant, node, start) in self._damaged
        if bases and bases[-1] > cursor and (cursor < 0 or stuck):
            start = bases[-1]
        for seq, kind in segments:
            if seq < start:
                continue
            if kind == SNAPSHOT and seq == self._cursors.get((tenant, node), -1) + 1:
                self._cursors[(tenant, node)] = seq  # restates what was merged already
                continue
            try:
                data = self.remote.get_library_segment(tenant, node, seq, kind)
                if data is None:
                    return  # compacted meanwhile: the next round starts from the new base
                records = parse_segment(data)
                if records is None:
                    raise ValueError("a record fails its checksum")
                self._merge(tenant, node, records)
            except (KeyError, TypeError, ValueError) as exc:
                # Immutable, so it stays damaged: the stream is merged again
                # from its writer's next base.
                if (tenant, node, seq) in self._damaged:
                    return
                self._damaged.add((tenant, node, seq))
                log.error(
                    "library segment %s/%012d.%s is damaged (%s); not merged",
                    RemoteTier.library_path(tenant, node), seq, kind, exc,
                )  # fmt: skip
                return
            self._cursors[(tenant, node)] = seq

    def _merge(self, tenant: str, node: str, records: list[tuple[Record, bytes]]) -> None:
        if node == self.node_id or node in self.adopted:
            # Our base (or an adopted one) names the streams we answer for: this
            # is how a daemon that lost its data directory learns them again.
            for record, _ in records:
                if record.kind == NODES_KIND:
                    self._adopt([str(n) for n in record.body["nodes"]])
        crystal = [(r, d) for r, d in records if r.kind in CRYSTAL_KINDS]
        profile = [(r, d) for r, d in records if r.kind in PROFILE_KINDS]
        if crystal:
            self.crystals.apply_remote(tenant, crystal)
        if profile:
            self.profiles.apply_remote(tenant, profile)

    # -- helpers ------------------------------------------------------------------------------

    def _stream(self, tenant: str) -> _Stream:
        with self._lock:
            return self._streams.setdefault(tenant, _Stream())

    def _local_tenants(self) -> list[str]:
        """Tenants this daemon has a stream or a library of."""
        with self._lock:
            names = set(self._streams)
        names.update(self.crystals.tenants(), self.profiles.tenants())
        return sorted(names)

    def _tenants_with_queue(self) -> list[str]:
        with self._lock:
            return [t for t, s in self._streams.items() if s.queued or s.rebase]

    def _all_tenants(self) -> list[str]:
        """Tenants in object storage and those this daemon holds a library of."""
        names = set(self.remote.list_tenants())
        names.update(self.crystals.tenants(), self.profiles.tenants())
        valid = []
        for name in sorted(names):
            try:
                valid.append(validate_id(name, "tenant"))
            except InvalidArgumentError:
                log.warning("ignoring %r in object storage: not a tenant name", name)
        return valid

    def status(self) -> dict[str, Any]:
        """The library part of `stratad ctl replication status` and the metrics."""
        with self._lock:
            streams = list(self._streams.values())
        behind = sum(s.published - s.shipped for s in streams)
        oldest = min((s.oldest for s in streams if s.oldest), default=0.0)
        return {
            "library_records_behind": behind,
            "library_lag_seconds": time.time() - oldest if oldest else 0.0,
            "library_segments": sum(s.segments for s in streams),
            "library_damaged_segments": len(self._damaged),
        }


def parse_segment(data: bytes) -> list[tuple[Record, bytes]] | None:
    """A segment's records with their bytes; None if any fails its checksum."""
    parsed = list(_records(data))
    end = parsed[-1][2] if parsed else 0
    if end != len(data):
        return None
    return [(record, data[start:stop]) for record, start, stop in parsed]


def _records(data: bytes) -> Iterator[tuple[Record, int, int]]:
    return log_records(data)
