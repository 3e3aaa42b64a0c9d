"""The remote tier: a session's history and a tenant's objects in object storage.

Layout under the configured URL (``s3://bucket/prefix``, ``gs://``, ``az://``,
``file:///`` ... anything obstore opens), see docs/replication.md::

    tenants/<t>/packs/<id>.pack           framed objects, concatenated
    tenants/<t>/packs/<id>.idx            JSON {"objects": {digest: [offset, length]}}
    tenants/<t>/sessions/<s>/HEAD         JSON: owner, epoch, lease, segment list
    tenants/<t>/sessions/<s>/seg/<epoch>-<seq>   journal bytes (records as on disk)
    tenants/<t>/library/<node>/<seq>.seg  crystal and profile records one daemon wrote
    tenants/<t>/library/<node>/<seq>.base that daemon's whole share of the library
    tenants/<t>/library/<node>/<seq>.snap the same, restating its earlier segments
    nodes/<node>                          JSON: that daemon's heartbeat and stream ends
    nodes/<node>.adopted-<last seen>      JSON: which daemon took over its streams
    tenants/<t>/KEY                       the tenant's wrapped data key (encryption at rest)

With encryption at rest, each object in a pack is sealed with the tenant's
data key (as in its local file) and segments are journal bytes, whose records
are sealed already; every daemon sharing the bucket needs the same master key.

Objects are content-addressed and uploaded in packs (one PUT per shipping
round, not one per chunk); a pack's index is written after the pack, so an
index never names bytes that are not there. A session's history is its local
journal, shipped as immutable segments; the HEAD names, in order, the
segments that make it up, and is only ever replaced with a conditional PUT
(If-Match on its e-tag, If-None-Match when it is created): that is the
ownership lease, and what stops two daemons from forking a history.

``file://`` (obstore's LocalStore) creates conditionally (a hard link, which
fails if the name exists) but has no conditional replace (obstore raises
"PutMode::Update not yet implemented by LocalFileSystem"). There a conditional
replace is done under an exclusive POSIX lock on a lock file next to the
object (``HEAD.lock``): read the object, compare it with the version the
caller read, write the new one (LocalStore writes a temporary file and renames
it over the object, so readers see the old or the new bytes, never a mix).
See `RemoteTier._put_if`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError as RemoteExistsError
from obstore.exceptions import NotFoundError as RemoteNotFoundError
from obstore.exceptions import PreconditionError as RemotePreconditionError
from obstore.store import LocalStore

from stratad import native
from stratad.errors import (
    CorruptObjectError,
    DataLossError,
    FailedPreconditionError,
    UnavailableError,
)
from stratad.store.crypto import SealError, TenantCipher
from stratad.store.objects import NO_SIZE_LIMIT

HEAD_FORMAT = 1
#: How often (seconds) uploaders re-read the list of condemned packs. A pack is
#: deleted only a grace period after it was condemned, so this must be well
#: below the shortest grace period in use (docs/replication.md).
CONDEMNED_REFRESH = 60.0
#: file://: seconds a conditional replace waits for another writer's lock on
#: the object before it gives up (UNAVAILABLE); a lock is held for one small
#: read and one small write.
LOCAL_LOCK_TIMEOUT = 10.0
#: Suffix of the lock files next to conditionally replaced objects (file://).
LOCK_SUFFIX = ".lock"
#: Seconds between two reports of a replication failure that persists.
REPORT_EVERY = 60.0


class LeaseLostError(FailedPreconditionError):
    """Another daemon owns the session now (or its HEAD changed under us)."""

    default_reason = "LEASE_LOST"


class LeaseHeldError(FailedPreconditionError):
    """Another daemon holds the session's lease; this one may only read it."""

    default_reason = "LEASE_HELD"


class RemoteUnavailableError(UnavailableError):
    """Object storage could not be reached or refused a request."""

    default_reason = "REMOTE_UNAVAILABLE"


@dataclass
class _Failing:
    since: float
    reported: float
    attempts: int = 1


class FailureLog:
    """Reports replication failures that persist once, then every `every` seconds.

    A round that fails again with object storage still unreachable (or
    refusing) would otherwise log a warning every `replication_lag_ms`, forever.
    `failed(key, ...)` logs the first failure of `key` as a warning, and
    while it keeps failing at most one warning per `every` seconds, with how
    long and how often it failed meanwhile; `recovered(key)` logs once that it
    works again.
    """

    def __init__(self, logger: logging.Logger, every: float = REPORT_EVERY) -> None:
        self.log = logger
        self.every = every
        self._lock = threading.Lock()
        self._failing: dict[str, _Failing] = {}

    def failed(self, key: str, message: str, *, exc_info: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            entry = self._failing.get(key)
            if entry is None:
                self._failing[key] = _Failing(since=now, reported=now)
                first = True
            else:
                entry.attempts += 1
                if now - entry.reported < self.every:
                    return
                entry.reported, first = now, False
                since, attempts = now - entry.since, entry.attempts
        if first:
            self.log.warning(
                "%s failed: %s (while this lasts, reported again every %.0fs)",
                key, message, self.every, exc_info=exc_info,
            )  # fmt: skip
        else:
            self.log.warning(
                "%s still failing after %.0fs (%d attempts): %s",
                key, since, attempts, message,
            )  # fmt: skip

    def recovered(self, key: str) -> None:
        with self._lock:
            entry = self._failing.pop(key, None) if self._failing else None
        if entry is not None:
            self.log.info(
                "%s works again after %.0fs (%d failed attempts)",
                key, time.monotonic() - entry.since, entry.attempts,
            )  # fmt: skip

    def failing(self) -> list[str]:
        """The keys failing now."""
        with self._lock:
            return sorted(self._failing)


@dataclass
class Head:
    """A session's HEAD: who may write it, and which segments make up its history."""

    owner: str
    epoch: int
    lease_until: float
    segments: list[str] = field(default_factory=list)
    next_seq: int = 0
    #: The session was deleted (a tombstone, so no daemon hydrates it back).
    deleted: bool = False

    def to_bytes(self) -> bytes:
        body = {
            "format": HEAD_FORMAT, "owner": self.owner, "epoch": self.epoch,
            "lease_until": self.lease_until, "segments": self.segments,
            "next_seq": self.next_seq, "deleted": self.deleted,
        }  # fmt: skip
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Head:
        try:
            body = json.loads(raw)
            if body.get("format") != HEAD_FORMAT:
                raise ValueError(f"unknown HEAD format {body.get('format')!r}")
            return cls(
                str(body["owner"]), int(body["epoch"]), float(body["lease_until"]),
                [str(s) for s in body["segments"]], int(body["next_seq"]),
                bool(body.get("deleted", False)),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise DataLossError(f"a remote session HEAD is damaged: {exc}") from exc


@dataclass(frozen=True)
class NodeBeat:
    """A daemon's heartbeat as listed: when it was written, and its version."""

    #: Seconds since the epoch, by object storage's clock.
    seen: float
    #: Changes with every heartbeat (e-tag): read it again only then.
    version: str


@dataclass(frozen=True)
class VersionedHead:
    head: Head
    #: The store's version of the HEAD object (e-tag), for the next conditional PUT.
    version: dict[str, Any]


class RemoteTier:
    """Object-storage operations of the replication layer (no domain knowledge)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lock = threading.Lock()
        # tenant -> digest -> (pack path, offset, length)
        # tenant -> digest -> every (pack, offset, length) holding it: an object
        # a collection condemned may have been uploaded again into a new pack.
        self._index: dict[str, dict[str, list[tuple[str, int, int]]]] = {}
        self._seen_indexes: dict[str, set[str]] = {}
        # tenant -> packs a collection condemned, and when that list was read.
        self._condemned: dict[str, set[str]] = {}
        self._condemned_read: dict[str, float] = {}
        #: tenant -> the cipher sealing its objects (encryption at rest; set by the
        #: engine); None: packs hold plain frames.
        self.cipher_of: Callable[[str], TenantCipher | None] = lambda tenant: None
        #: file://: the directory, whose conditional replaces go under lock files.
        self.local_root: Path | None = None
        if isinstance(store, LocalStore):
            self.local_root = Path(store.prefix) if store.prefix is not None else Path("/")

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RemoteTier:
        """Open `url` with obstore (credentials from the standard environment variables)."""
        try:
            return cls(obstore.store.from_url(url, **options))
        except Exception as exc:  # obstore raises its own and ValueError
            hint = " (file:// needs an existing directory)" if url.startswith("file:") else ""
            raise RemoteUnavailableError(f"cannot open remote {url!r}{hint}: {exc}") from exc

    # -- objects ---------------------------------------------------------------

    def upload_pack(self, tenant: str, objects: Iterable[tuple[str, bytes]]) -> int:
        """Upload objects the remote lacks as one pack (then its index); bytes sent."""
        known = self.known_objects(tenant, refresh=False)
        todo = {d: f for d, f in objects if d not in known}
        if not todo:
            return 0
        name = f"tenants/{tenant}/packs/{uuid.uuid4().hex}"
        cipher = self.cipher_of(tenant)
        offsets: dict[str, list[int]] = {}
        parts, pos = [], 0
        for digest, frame in todo.items():
            data = frame if cipher is None else cipher.seal_object(digest, frame)
            offsets[digest] = [pos, len(data)]
            parts.append(data)
            pos += len(data)
        self._put(f"{name}.pack", b"".join(parts))
        self._put(f"{name}.idx", json.dumps({"objects": offsets}).encode())
        with self._lock:
            self._add_locations(tenant, f"{name}.pack", offsets)
            self._seen_indexes.setdefault(tenant, set()).add(f"{name}.idx")
        return pos

    def _add_locations(self, tenant: str, pack: str, entries: dict[str, Any]) -> None:
        """Record where a pack holds its objects (lock held)."""
        index = self._index.setdefault(tenant, {})
        for digest, (offset, length) in entries.items():
            index.setdefault(digest, []).append((pack, int(offset), int(length)))

    def _where(self, tenant: str, digest: str) -> tuple[str, int, int] | None:
        """Where to read an object: a pack that is not condemned if there is one (lock held)."""
        places = self._index.get(tenant, {}).get(digest, [])
        condemned = self._condemned.get(tenant, set())
        live = [p for p in places if p[0] not in condemned]
        chosen = live or places
        return chosen[0] if chosen else None

    def known_objects(self, tenant: str, *, refresh: bool = True) -> set[str]:
        """Digests an upload may dedup against: in object storage and not condemned.

        An object in a pack a collection condemned is treated as absent (a save
        uploads its own copy), so that deleting the pack after the grace period
        cannot take away what a new save references. The condemned list is
        re-read at least every CONDEMNED_REFRESH seconds.
        """
        if refresh or tenant not in self._index:
            self._load_indexes(tenant)
        if time.monotonic() - self._condemned_read.get(tenant, -CONDEMNED_REFRESH) >= (
            CONDEMNED_REFRESH
        ):
            condemned, _ = self.read_condemned(tenant)
            with self._lock:
                self._condemned[tenant] = set(condemned)
                self._condemned_read[tenant] = time.monotonic()
        with self._lock:
            skip = self._condemned.get(tenant, set())
            return {
                digest
                for digest, places in self._index.get(tenant, {}).items()
                if any(pack not in skip for pack, _, _ in places)
            }

    def _load_indexes(self, tenant: str) -> None:
        seen = self._seen_indexes.setdefault(tenant, set())
        new = [p for p in self._list(f"tenants/{tenant}/packs/") if p.endswith(".idx")]
        for path in new:
            if path in seen:
                continue
            try:
                entries = json.loads(self._get(path))["objects"]
            except (ValueError, KeyError, TypeError) as exc:
                raise DataLossError(f"remote pack index {path} is damaged: {exc}") from exc
            pack = path[: -len(".idx")] + ".pack"
            with self._lock:
                self._add_locations(tenant, pack, entries)
                seen.add(path)
        with self._lock:
            self._index.setdefault(tenant, {})

    def fetch_objects(self, tenant: str, digests: Iterable[str]) -> dict[str, bytes]:
        """Frames of `digests` from their packs; a digest the remote lacks is DATA_LOSS."""
        wanted = list(dict.fromkeys(digests))
        with self._lock:
            index = self._index.get(tenant, {})
            unknown = [d for d in wanted if d not in index]
        if unknown:
            self._load_indexes(tenant)
        found: dict[str, bytes] = {}
        by_pack: dict[str, list[tuple[str, int, int]]] = {}
        with self._lock:
            for digest in wanted:
                where = self._where(tenant, digest)
                if where is None:
                    raise DataLossError(
                        f"object {digest} is in neither the local nor the remote store"
                    )
                by_pack.setdefault(where[0], []).append((digest, where[1], where[2]))
        for pack, items in by_pack.items():
            starts = [offset for _, offset, _ in items]
            ends = [offset + length for _, offset, length in items]
            try:
                ranges = obstore.get_ranges(self.store, pack, starts=starts, ends=ends)
            except Exception as exc:
                raise _unavailable(f"reading {pack}", exc) from exc
            cipher = self.cipher_of(tenant)
            for (digest, _, _), data in zip(items, ranges, strict=True):
                found[digest] = verified_frame(digest, bytes(data), pack, cipher)
        return found

    def packs(self, tenant: str) -> dict[str, list[tuple[str, int, int]]]:
        """pack path -> its objects (digest, offset, length), from every index."""
        self._load_indexes(tenant)
        by_pack: dict[str, list[tuple[str, int, int]]] = {}
        with self._lock:
            for digest, places in self._index.get(tenant, {}).items():
                for pack, offset, length in places:
                    by_pack.setdefault(pack, []).append((digest, offset, length))
        return by_pack

    def read_pack(self, pack: str) -> bytes:
        try:
            return self._get(pack)
        except (RemoteNotFoundError, FileNotFoundError):
            raise DataLossError(f"remote pack {pack} is missing") from None

    # -- garbage collection of packs ---------------------------------------------

    @staticmethod
    def condemned_path(tenant: str) -> str:
        return f"tenants/{tenant}/packs/CONDEMNED"

    def read_condemned(self, tenant: str) -> tuple[dict[str, float], dict[str, Any] | None]:
        """pack -> when a collection condemned it, and the version for a conditional write."""
        path = self.condemned_path(tenant)
        try:
            result = obstore.get(self.store, path)
            raw = bytes(result.bytes())
        except (RemoteNotFoundError, FileNotFoundError):
            return {}, None
        except Exception as exc:
            raise _unavailable(f"reading {path}", exc) from exc
        try:
            condemned = {str(k): float(v) for k, v in json.loads(raw)["packs"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataLossError(f"{path} is damaged: {exc}") from exc
        return condemned, self._version_of(result.meta, raw)

    def write_condemned(
        self, tenant: str, condemned: dict[str, float], version: dict[str, Any] | None
    ) -> None:
        """Replace the condemned list iff nobody else did since `version` (else LeaseLost)."""
        path = self.condemned_path(tenant)
        body = json.dumps({"packs": condemned}, separators=(",", ":")).encode()
        try:
            self._put_if(path, body, version)
        except (RemotePreconditionError, RemoteExistsError) as exc:
            raise LeaseLostError(
                f"another collection of tenant {tenant!r} ran at the same time; try again"
            ) from exc
        except RemoteUnavailableError:
            raise
        except Exception as exc:
            raise _unavailable(f"writing {path}", exc) from exc
        with self._lock:
            self._condemned[tenant] = set(condemned)

    def pack_ages(self, tenant: str) -> dict[str, float]:
        """pack path -> seconds since its index was written (packs whose index exists)."""
        prefix = f"tenants/{tenant}/packs/"
        try:
            metas = [m for batch in obstore.list(self.store, prefix) for m in batch]
        except Exception as exc:
            raise _unavailable(f"listing {prefix}", exc) from exc
        now = time.time()
        return {
            m["path"][: -len(".idx")] + ".pack": now - m["last_modified"].timestamp()
            for m in metas
            if m["path"].endswith(".idx")
        }

    def delete_pack(self, tenant: str, pack: str) -> None:
        """Delete a pack: its index first, so that no reader finds objects without bytes."""
        index = pack[: -len(".pack")] + ".idx"
        for path in (index, pack):
            try:
                obstore.delete(self.store, path)
            except (RemoteNotFoundError, FileNotFoundError):
                pass
            except Exception as exc:
                raise _unavailable(f"deleting {path}", exc) from exc
        with self._lock:
            index_of = self._index.get(tenant, {})
            for digest, places in list(index_of.items()):
                kept = [p for p in places if p[0] != pack]
                if kept:
                    index_of[digest] = kept
                else:
                    del index_of[digest]
            self._seen_indexes.get(tenant, set()).discard(index)
            self._condemned.get(tenant, set()).discard(pack)

    # -- sessions ----------------------------------------------------------------

    @staticmethod
    def session_path(tenant: str, session_id: str) -> str:
        return f"tenants/{tenant}/sessions/{session_id}"

    def read_head(self, path: str) -> VersionedHead | None:
        try:
            result = obstore.get(self.store, f"{path}/HEAD")
            raw = bytes(result.bytes())
        except (RemoteNotFoundError, FileNotFoundError):
            return None
        except Exception as exc:
            raise _unavailable(f"reading {path}/HEAD", exc) from exc
        return VersionedHead(Head.from_bytes(raw), self._version_of(result.meta, raw))

    def write_head(self, path: str, head: Head, version: dict[str, Any] | None) -> dict[str, Any]:
        """Create (version None) or replace the HEAD iff it is still at `version`."""
        try:
            return self._put_if(f"{path}/HEAD", head.to_bytes(), version)
        except (RemotePreconditionError, RemoteExistsError) as exc:
            raise LeaseLostError(
                f"session {path.rsplit('/', 1)[-1]!r} was changed by another daemon"
            ) from exc
        except RemoteUnavailableError:
            raise
        except Exception as exc:
            raise _unavailable(f"writing {path}/HEAD", exc) from exc

    def put_segment(self, path: str, name: str, data: bytes) -> None:
        self._put(f"{path}/seg/{name}", data)

    def get_segment(self, path: str, name: str) -> bytes:
        try:
            return self._get(f"{path}/seg/{name}")
        except (RemoteNotFoundError, FileNotFoundError):
            raise DataLossError(f"remote segment {path}/seg/{name} is missing") from None

    def delete_segment(self, path: str, name: str) -> None:
        try:
            obstore.delete(self.store, f"{path}/seg/{name}")
        except (RemoteNotFoundError, FileNotFoundError):
            pass
        except Exception as exc:
            raise _unavailable(f"deleting {path}/seg/{name}", exc) from exc

    def list_sessions(self, tenant: str) -> list[str]:
        """IDs of the tenant's sessions in object storage (tombstoned ones included)."""
        prefix = f"tenants/{tenant}/sessions/"
        try:
            found = obstore.list_with_delimiter(self.store, prefix)
        except Exception as exc:
            raise _unavailable(f"listing {prefix}", exc) from exc
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"])

    # -- tenants' data keys (store/crypto.py SharedKeys) ---------------------------

    @staticmethod
    def tenant_key_path(tenant: str) -> str:
        return f"tenants/{tenant}/KEY"

    def read_tenant_key(self, tenant: str) -> bytes | None:
        try:
            return self._get(self.tenant_key_path(tenant))
        except (RemoteNotFoundError, FileNotFoundError):
            return None

    def create_tenant_key(self, tenant: str, raw: bytes) -> bytes:
        """Store `raw` as the tenant's key unless one is there; return the one stored."""
        path = self.tenant_key_path(tenant)
        try:
            obstore.put(self.store, path, raw, mode="create")
        except (RemotePreconditionError, RemoteExistsError):
            existing = self.read_tenant_key(tenant)
            if existing is None:
                raise RemoteUnavailableError(f"{path} exists and vanished; retry") from None
            return existing
        except Exception as exc:
            raise _unavailable(f"writing {path}", exc) from exc
        return raw

    def put_tenant_key(self, tenant: str, raw: bytes) -> None:
        """Replace the tenant's key (the same data key, re-wrapped by a rotation)."""
        self._put(self.tenant_key_path(tenant), raw)

    # -- tenant libraries (crystals, profiles): one stream per daemon ----------------

    @staticmethod
    def library_path(tenant: str, node: str) -> str:
        return f"tenants/{tenant}/library/{urllib.parse.quote(node, safe='')}"

    def list_tenants(self) -> list[str]:
        """Names of the tenants with anything in object storage."""
        try:
            found = obstore.list_with_delimiter(self.store, "tenants/")
        except Exception as exc:
            raise _unavailable("listing tenants/", exc) from exc
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"])

    def list_library(self, tenant: str) -> dict[str, list[tuple[int, str]]]:
        """node ID -> its stream's segments as (sequence number, kind), in order.

        Kinds (domain/library_replication.py): "seg", "base", "snap".
        """
        prefix = f"tenants/{tenant}/library/"
        streams: dict[str, list[tuple[int, str]]] = {}
        for path in self._list(prefix):
            node, _, name = path[len(prefix) :].partition("/")
            seq, _, kind = name.partition(".")
            if kind in ("seg", "base", "snap") and seq.isdigit():
                streams.setdefault(urllib.parse.unquote(node), []).append((int(seq), kind))
        return {node: sorted(segments) for node, segments in streams.items()}

    def put_library_segment(self, tenant: str, node: str, seq: int, kind: str, data: bytes) -> None:
        """Create a segment of `node`'s stream; it must not exist (one writer per node ID)."""
        path = f"{self.library_path(tenant, node)}/{seq:012d}.{kind}"
        cipher = self.cipher_of(tenant)
        if cipher is not None:  # encryption at rest: the segment is sealed whole
            data = cipher.records(path).seal(data)
        try:
            obstore.put(self.store, path, data, mode="create", use_multipart=False)
        except (RemotePreconditionError, RemoteExistsError) as exc:
            raise LeaseLostError(
                f"{path} exists: another daemon runs with node_id {node!r}; "
                "every daemon needs its own node_id"
            ) from exc
        except Exception as exc:
            raise _unavailable(f"writing {path}", exc) from exc

    def get_library_segment(self, tenant: str, node: str, seq: int, kind: str) -> bytes | None:
        """A segment's bytes; None when it is gone (its writer compacted its stream).

        With encryption at rest a segment that does not open is damage: ValueError,
        as for one whose records fail their checksums.
        """
        path = f"{self.library_path(tenant, node)}/{seq:012d}.{kind}"
        try:
            data = self._get(path)
        except (RemoteNotFoundError, FileNotFoundError):
            return None
        cipher = self.cipher_of(tenant)
        if cipher is None:
            return data
        try:
            return cipher.records(path).open(data)
        except SealError as exc:
            raise ValueError(f"sealed segment does not open: {exc.message}") from None

    def delete_library_segment(self, tenant: str, node: str, seq: int, kind: str) -> None:
        path = f"{self.library_path(tenant, node)}/{seq:012d}.{kind}"
        try:
            obstore.delete(self.store, path)
        except (RemoteNotFoundError, FileNotFoundError):
            pass
        except Exception as exc:
            raise _unavailable(f"deleting {path}", exc) from exc

    # -- daemons alive (for the adoption of library streams) ---------------------------

    def write_heartbeat(self, node: str, streams: dict[str, int]) -> None:
        """Say `node` is alive, and how far its library streams go (tenant -> next segment)."""
        body = json.dumps({"node": node, "at": time.time(), "streams": streams}).encode()
        self._put(f"nodes/{urllib.parse.quote(node, safe='')}", body)

    def heartbeats(self) -> dict[str, NodeBeat]:
        """node ID -> when object storage last got its heartbeat (one LIST, no GET)."""
        try:
            metas = [m for batch in obstore.list(self.store, "nodes/") for m in batch]
        except Exception as exc:
            raise _unavailable("listing nodes/", exc) from exc
        found: dict[str, NodeBeat] = {}
        for meta in metas:
            name = meta["path"][len("nodes/") :]
            if "." in name:
                continue  # a claim (below)
            seen = meta["last_modified"].timestamp()
            version = str(meta.get("e_tag") or meta.get("version") or seen)
            found[urllib.parse.unquote(name)] = NodeBeat(seen, version)
        return found

    def read_heartbeat(self, node: str) -> dict[str, int] | None:
        """A daemon's streams (tenant -> next segment); None if it was adopted meanwhile."""
        path = f"nodes/{urllib.parse.quote(node, safe='')}"
        try:
            body = json.loads(self._get(path))
            return {str(t): int(n) for t, n in body.get("streams", {}).items()}
        except (RemoteNotFoundError, FileNotFoundError):
            return None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataLossError(f"heartbeat {path} is damaged: {exc}") from exc

    def claim_node(self, node: str, last_seen: float, by: str) -> bool:
        """Claim the library streams of a daemon that is gone; False if another did first.

        The claim names the heartbeat it judged by: a daemon that comes back
        under the same ID and goes silent again can be adopted again.
        """
        name = urllib.parse.quote(node, safe="")
        claim = f"nodes/{name}.adopted-{last_seen:.3f}"
        try:
            obstore.put(self.store, claim, json.dumps({"by": by}).encode(), mode="create")
        except (RemotePreconditionError, RemoteExistsError):
            return False
        except Exception as exc:
            raise _unavailable(f"writing {claim}", exc) from exc
        try:
            obstore.delete(self.store, f"nodes/{name}")
        except (RemoteNotFoundError, FileNotFoundError):
            pass
        except Exception as exc:
            raise _unavailable(f"deleting nodes/{name}", exc) from exc
        return True

    # -- plumbing ------------------------------------------------------------------

    def _put_if(self, path: str, data: bytes, version: dict[str, Any] | None) -> dict[str, Any]:
        """Create `path` (version None) or replace it iff it is still at `version`.

        Returns the new version. Raises obstore's AlreadyExistsError (it exists)
        or PreconditionError (it changed, or is gone) when the condition fails.

        Object stores (S3, GCS, Azure, MinIO, memory) do both natively:
        If-None-Match: * and If-Match: <e-tag>. obstore's LocalStore (file://)
        only creates conditionally (a hard link of a temporary file, which
        fails if the name exists, atomic on any POSIX filesystem): a replace
        conditional on a version is "not yet implemented" there. For a
        directory the replace is therefore done here, under an exclusive
        POSIX record lock (fcntl) on a lock file next to the object that every
        conditional replace of it takes: read the object, compare its content
        with the version the caller read, and only then write the new bytes
        (LocalStore's plain put writes a temporary file and renames it over the
        object: atomic, readers never see a torn HEAD). Creates need no lock:
        the hard link settles them, and these objects are never deleted, so a
        replace (which needs the object) never races a create.

        The version of a file:// object is the digest of its content, not
        LocalStore's e-tag (inode, mtime, size): an inode reused within the
        mtime granularity could give a replaced HEAD of the same size its old
        e-tag back. A HEAD's content changes with every write (epoch, lease,
        next segment), so comparing contents is the same check as S3's
        If-Match on the MD5 e-tag of a single-part PUT.

        fcntl locks are released by the kernel when their process dies (a
        SIGKILLed daemon never leaves a HEAD locked) and work across hosts on
        NFSv4 (or v3 with lockd); a directory without POSIX locks fails here
        with UNAVAILABLE rather than losing the one-writer guarantee.
        """
        if self.local_root is None or version is None:
            mode: Any = "create" if version is None else version
            result = obstore.put(self.store, path, data, mode=mode, use_multipart=False)
            if self.local_root is not None:
                return _content_version(data)
            return _version(result.get("e_tag"), result.get("version"))
        with _locked(self.local_root / (path + LOCK_SUFFIX), LOCAL_LOCK_TIMEOUT):
            try:
                current = self._get(path)
            except (RemoteNotFoundError, FileNotFoundError):
                raise RemotePreconditionError(f"{path} is gone") from None
            if _content_version(current) != version:
                raise RemotePreconditionError(f"{path} changed since it was read")
            self._put(path, data)
        return _content_version(data)

    def _version_of(self, meta: Any, raw: bytes) -> dict[str, Any]:
        """The version of an object just read, for a conditional replace (`_put_if`)."""
        if self.local_root is not None:
            return _content_version(raw)
        return _version(meta.get("e_tag"), meta.get("version"))

    def _put(self, path: str, data: bytes) -> None:
        try:
            obstore.put(self.store, path, data, use_multipart=False)
        except Exception as exc:
            raise _unavailable(f"writing {path}", exc) from exc

    def _get(self, path: str) -> bytes:
        try:
            return bytes(obstore.get(self.store, path).bytes())
        except (RemoteNotFoundError, FileNotFoundError):
            raise
        except Exception as exc:
            raise _unavailable(f"reading {path}", exc) from exc

    def _list(self, prefix: str) -> list[str]:
        try:
            return [meta["path"] for batch in obstore.list(self.store, prefix) for meta in batch]
        except Exception as exc:
            raise _unavailable(f"listing {prefix}", exc) from exc


def _unavailable(what: str, exc: BaseException) -> RemoteUnavailableError:
    return RemoteUnavailableError(f"object storage failed while {what}: {exc}")


def _version(e_tag: str | None, version: str | None) -> dict[str, Any]:
    """An obstore UpdateVersion: only the fields the store gave (None is refused)."""
    found = {"e_tag": e_tag, "version": version}
    return {k: v for k, v in found.items() if v is not None}


def _content_version(data: bytes) -> dict[str, Any]:
    """The version of a file:// object: its content's digest (see `RemoteTier._put_if`)."""
    return {"content": native.digest_hex(data)}


@dataclass
class _ThreadLock:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Threads holding or waiting for it (the entry goes when none is left).
    users: int = 0


#: file://: lock file path -> the lock of the threads of this process. fcntl
#: locks belong to the process (a second thread would "acquire" it too, and
#: closing any descriptor of the file releases it), so threads queue here first.
_THREAD_LOCKS: dict[str, _ThreadLock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    """Hold `path` (created if need be, never deleted) exclusively against every
    thread and process; UNAVAILABLE after `timeout` seconds of waiting."""
    key = str(path)
    with _THREAD_LOCKS_GUARD:
        entry = _THREAD_LOCKS.setdefault(key, _ThreadLock())
        entry.users += 1
    try:
        if not entry.lock.acquire(timeout=timeout):
            raise RemoteUnavailableError(f"{path} stayed locked for {timeout:.0f}s")
        try:
            with _process_locked(path, timeout):
                yield
        finally:
            entry.lock.release()
    finally:
        with _THREAD_LOCKS_GUARD:
            entry.users -= 1
            if not entry.users:
                del _THREAD_LOCKS[key]


@contextlib.contextmanager
def _process_locked(path: Path, timeout: float) -> Iterator[None]:
    """Hold the POSIX lock of `path` (one thread of this process at a time, see
    `_locked`)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise _unavailable(f"opening the lock file {path}", exc) from exc
    try:
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise RemoteUnavailableError(
                        f"cannot lock {path} (the directory must support POSIX "
                        f"locks, e.g. a local filesystem or NFSv4): {exc}"
                    ) from exc
            if time.monotonic() >= deadline:  # another daemon holds it
                raise RemoteUnavailableError(f"{path} stayed locked for {timeout:.0f}s")
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        try:
            yield
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def verified_frame(
    digest: str, frame: bytes, pack: str, cipher: TenantCipher | None = None
) -> bytes:
    """A frame from object storage, opened (when sealed with `cipher`) and re-hashed:
    a damaged remote copy is never taken in."""
    try:
        if cipher is not None:
            frame = cipher.open_object(digest, frame)
        found = native.verify_frame(frame, NO_SIZE_LIMIT)
    except CorruptObjectError as exc:
        raise DataLossError(f"the copy of object {digest} in {pack} is corrupt: {exc}") from exc
    if found != digest:
        raise DataLossError(f"{pack} holds other content where object {digest} should be")
    return frame
