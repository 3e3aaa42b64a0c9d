"""Content-addressed, immutable objects of one tenant, stored in pack files.

`<tenant>/objects/packs/NNNNNNNN.pack` files hold the objects one after the
other, each as a 44-byte entry header (magic, frame length, BLAKE3 digest,
CRC-32 of the header) followed by its frame (see docs/native.md): magic,
sizes, the digest of the uncompressed content and the zstd payload. Packs are
append-only; a new one starts when the active one passes `PACK_BYTES`. A
save therefore creates no file, and the disk space used tracks the bytes
stored (one file per object costs a whole 4 KiB block, however small). The
in-memory index (digest -> pack, offset, size) is rebuilt at start-up by
reading the entry headers. Objects of the earlier layout, one file per object
under `<tenant>/objects/ab/<rest of hex digest>`, are still read and
collected; new objects always go to packs (docs/storage.md, "Migration").

Durability without file work on the save path: every object a mutation adds
is carried inline in that mutation's journal record, and the journal record is
what gets fsynced before the acknowledgement. The object itself is kept in
memory ("pending") and appended to the active pack by the background syncer,
which then fdatasyncs the packs it wrote; a journal compaction (which drops
the inline copies) syncs first. After a crash, recovery rewrites any object
that is missing or damaged from the journal's copy, so the pair (journal,
objects) never loses an acknowledged byte. A torn entry at the end of a pack
(a crash mid-append) is cut off at start-up.

Garbage collection removes objects from the index; the space of a pack whose
entries are at least half garbage is reclaimed by copying its live entries to
the active pack and deleting it (`compact`). Until then a restart brings the
garbage back into the index, where the next collection finds it again.

With encryption at rest, each entry holds the frame sealed with the tenant's
data key (store/crypto.py: magic, nonce, ciphertext, tag; the digest is the
associated data), and the entry header's length is the sealed length. In
memory (pending objects, journal records' inline copies, reads) objects are
plain frames. Sealing is bound to the digest, not to the position, so pack
compaction copies sealed entries as they are.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from stratad import native, tracing
from stratad.errors import CorruptObjectError, DataLossError
from stratad.store.crypto import SEAL_OVERHEAD, TenantCipher
from stratad.store.failstop import FailStop
from stratad.store.fsync import FILE_MODE, fsync_dir, make_dirs
from stratad.store.journal import storage_error

log = logging.getLogger(__name__)

_TMP_SUFFIX = ".tmp"
#: Verification decodes whatever size the (checked) header declares; this is a
#: sanity bound, not a quota: quotas are enforced when data comes in.
NO_SIZE_LIMIT = 1 << 40
#: Carrier of an unsynced object that no journal record carries (see orphan).
_NO_CARRIER = ""
#: Pending (not yet written) object bytes above which writers flush themselves.
MAX_PENDING_BYTES = 64 << 20
#: A pack at least this large takes no more objects; the next write starts a new one.
PACK_BYTES = 32 << 20
#: The start of a frame that says whether it is a delta and on what (header,
#: base digest, depth).
_DELTA_HEAD = native.FRAME_HEADER_SIZE + 33
#: Bytes of recent object contents a store keeps (see RecentContents), for all
#: its tenants together.
RECENT_BYTES = 16 << 20
#: A pack whose garbage reaches this share of its bytes is compacted after a GC.
COMPACT_GARBAGE_SHARE = 0.5
PACKS_DIR = "packs"
PACK_SUFFIX = ".pack"
#: Beside a pack, the frame offsets (u64 each) of its entries GC removed.
DEAD_SUFFIX = ".dead"
_DEAD = struct.Struct("<Q")
#: Entry header: magic, frame length, raw digest, CRC-32 of the preceding 40 bytes.
ENTRY = struct.Struct("<4sI32sI")
ENTRY_MAGIC = b"SPK1"
_CHECKED = struct.Struct("<4sI32s")
#: os.pwritev takes at most IOV_MAX (1024 on Linux) buffers per call.
_MAX_IOV = 1024

# Index values pack (pack number, offset of the frame, frame size) into one int,
# which costs less memory than a tuple per object. Pack 0 = a loose file of the
# earlier layout (or an object not yet written: those are read from `_pending`).
_SIZE_BITS = 40
_OFFSET_BITS = 48


def _location(pack: int, offset: int, size: int) -> int:
    return (pack << (_SIZE_BITS + _OFFSET_BITS)) | (offset << _SIZE_BITS) | size


def _unpack_location(value: int) -> tuple[int, int, int]:
    size = value & ((1 << _SIZE_BITS) - 1)
    offset = (value >> _SIZE_BITS) & ((1 << _OFFSET_BITS) - 1)
    return value >> (_SIZE_BITS + _OFFSET_BITS), offset, size


def entry_header(digest: str, frame_len: int) -> bytes:
    checked = _CHECKED.pack(ENTRY_MAGIC, frame_len, bytes.fromhex(digest))
    return checked + struct.pack("<I", zlib.crc32(checked))


def parse_entry_header(raw: bytes) -> tuple[str, int] | None:
    """(digest, frame length) of a sound entry header, None if it is damaged."""
    if len(raw) != ENTRY.size:
        return None
    magic, length, digest, crc = ENTRY.unpack(raw)
    if magic != ENTRY_MAGIC or crc != zlib.crc32(raw[: _CHECKED.size]):
        return None
    return digest.hex(), length


def read_tombstones(path: Path) -> set[int]:
    """Frame offsets a pack's .dead file lists (a torn last one is ignored)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return set()
    usable = len(raw) - len(raw) % _DEAD.size
    return {offset for (offset,) in _DEAD.iter_unpack(raw[:usable])}


def pack_entries(packs_root: Path) -> Iterator[tuple[Path, int, str, int]]:
    """(pack file, frame offset, digest, frame length) of every live entry, read-only.

    For tools and tests (a daemon indexes its packs itself); skips entries GC
    removed and stops reading a pack at its first damaged entry.
    """
    for path in sorted(packs_root.glob(f"*{PACK_SUFFIX}")):
        dead = read_tombstones(path.with_suffix(DEAD_SUFFIX))
        with open(path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            offset = 0
            while offset < end:
                f.seek(offset)
                parsed = parse_entry_header(f.read(ENTRY.size))
                if parsed is None or offset + ENTRY.size + parsed[1] > end:
                    break
                if offset + ENTRY.size not in dead:
                    yield path, offset + ENTRY.size, parsed[0], parsed[1]
                offset += ENTRY.size + parsed[1]


def find_on_disk(objects_root: Path, digest: str) -> tuple[Path, int, int] | None:
    """Where an object's frame is on disk: (file, offset, length), or None; read-only."""
    loose = objects_root / digest[:2] / digest[2:]
    where = (loose, 0, loose.stat().st_size) if loose.is_file() else None
    for path, offset, found, length in pack_entries(objects_root / PACKS_DIR):
        if found == digest:
            where = path, offset, length  # the last copy is the one read
    return where


class _Pack:
    """One pack file, open for reading (and appending, if it is the active one).

    Index entries refer to packs by number; a reader takes the `_Pack` under the
    store's lock and reads after releasing it, so a pack deleted by compaction
    meanwhile is still readable through its open descriptor, which closes once
    nobody holds the object.
    """

    def __init__(self, number: int, path: Path, fd: int, size: int) -> None:
        self.number = number
        self.path = path
        self.fd = fd
        self.size = size  # bytes written (the next entry's offset)
        self.garbage = 0  # bytes of entries no longer in the index
        self.dead_path = path.with_suffix(DEAD_SUFFIX)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def read(self, offset: int, size: int) -> bytes:
        data = os.pread(self.fd, size, offset)
        if len(data) != size:
            raise DataLossError(f"pack {self.path} is shorter than its index says")
        return data


class RecentContents:
    """Contents of objects recently written or decoded: a bounded LRU cache.

    A save frames its new last chunk as a delta on the chunk it replaces,
    which the previous save of the session has just written: remembering what
    was written saves reading it back (and decoding its chain) to compress.
    Decoded delta objects are kept too, so that loading a recent state again
    does not decode its chains again. Every content here passed its digest
    check. One cache serves all tenants of a daemon (contents are named by
    their digest, and a tenant only asks for objects its own index holds), so
    memory is bounded per daemon, not per tenant.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # digest -> (content, delta depth), least recently used first.
        self._items: collections.OrderedDict[str, tuple[bytes, int]] = collections.OrderedDict()
        self._bytes = 0

    def remember(self, digest: str, content: bytes, depth: int) -> None:
        if len(content) > self.max_bytes // 4:
            return
        with self._lock:
            self._drop(digest)
            self._items[digest] = (content, depth)
            self._bytes += len(content)
            while self._bytes > self.max_bytes:
                _, (dropped, _) = self._items.popitem(last=False)
                self._bytes -= len(dropped)

    def get(self, digest: str) -> tuple[bytes, int] | None:
        with self._lock:
            hit = self._items.get(digest)
            if hit is not None:
                self._items.move_to_end(digest)
            return hit

    def drop(self, digest: str) -> None:
        with self._lock:
            self._drop(digest)

    def _drop(self, digest: str) -> None:
        old = self._items.pop(digest, None)
        if old is not None:
            self._bytes -= len(old[0])


class ObjectStore:
    """The objects of one tenant: pack files plus an in-memory digest index."""

    def __init__(
        self,
        root: Path,
        fail_stop: FailStop | None = None,
        cipher: TenantCipher | None = None,
        recent: RecentContents | None = None,
    ) -> None:
        self.root = root
        #: Seals what goes to disk (encryption at rest); None: entries hold plain frames.
        self.cipher = cipher
        self.packs_root = root / PACKS_DIR
        self._fail_stop = fail_stop or FailStop()
        make_dirs(self.packs_root)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        #: digest -> `_location(pack, offset, size)` of its frame.
        self._index: dict[str, int] = {}
        # sum of the frame sizes, kept as it changes: quotas read it on every save.
        self._stored = 0
        self._packs: dict[int, _Pack] = {}
        self._active: _Pack | None = None
        # A pack created since the last sync: its directory entry must be
        # made durable with the objects in it.
        self._new_pack = False
        #: Packs whose entry headers showed damage at start-up (for Verify).
        self.damaged_packs: list[str] = []
        # pack number -> frame offsets of its entries removed from the index,
        # not yet written to its .dead file (see `write_tombstones`).
        self._dead: dict[int, list[int]] = {}
        # digest -> frame, for objects not yet written to a pack.
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        # digest -> session key of the journal that carries it inline, until
        # the pack holding it is fsynced (see needs_inline).
        self._unsynced: dict[str, str] = {}
        # digest -> time it was written by this process, recorded only while
        # a collection runs (`collecting`): GC never removes an object written
        # after its mark phase started. Outside collections nothing is kept,
        # so the map does not grow with every object ever written.
        self._written_at: dict[str, float] = {}
        self._collections = 0
        self._recent = recent if recent is not None else RecentContents(RECENT_BYTES)
        #: Called with the digest of every object added (replication ships them).
        self.on_new: Callable[[str], None] | None = None
        self._scan_loose()
        self._scan_packs()

    # -- index ---------------------------------------------------------------

    def _add_to_index(self, digest: str, location: int) -> None:
        """Index an object found at start-up.

        A later copy wins: copies are written by compaction (identical) and by
        recovery, which rewrites an object only when the earlier copy is bad.
        """
        replaced = self._index.get(digest)
        self._index[digest] = location
        self._stored += _unpack_location(location)[2]
        if replaced is not None:
            number, _, size = _unpack_location(replaced)
            self._stored -= size
            if number:
                self._packs[number].garbage += ENTRY.size + size

    def _bury(self, number: int, offset: int, size: int) -> None:
        """An entry left the index: count its bytes as garbage, owe its tombstone.

        Call with `_lock` held.
        """
        self._packs[number].garbage += ENTRY.size + size
        self._dead.setdefault(number, []).append(offset)

    def _scan_loose(self) -> None:
        """Index objects of the one-file-per-object layout; remove crash leftovers."""
        for sub in self.root.iterdir():
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for entry in os.scandir(sub):
                if entry.name.endswith(_TMP_SUFFIX):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                    continue
                self._add_to_index(sub.name + entry.name, _location(0, 0, entry.stat().st_size))

    def _scan_packs(self) -> None:
        numbers = sorted(
            int(p.name[: -len(PACK_SUFFIX)])
            for p in self.packs_root.iterdir()
            if p.name.endswith(PACK_SUFFIX) and p.name[: -len(PACK_SUFFIX)].isdigit()
        )
        for number in numbers:
            pack = self._open_pack(number, create=False)
            self._packs[number] = pack
            self._scan_pack(pack)
        if numbers and self._packs[numbers[-1]].size < PACK_BYTES:
            self._active = self._packs[numbers[-1]]

    def _scan_pack(self, pack: _Pack) -> None:
        """Index a pack's entries but its dead ones; cut a torn tail, skip over damage."""
        end = os.fstat(pack.fd).st_size
        dead = read_tombstones(pack.dead_path)
        offset = 0
        with open(pack.fd, "rb", closefd=False) as f:
            while offset < end:
                f.seek(offset)
                parsed = parse_entry_header(f.read(ENTRY.size))
                if parsed is not None and offset + ENTRY.size + parsed[1] <= end:
                    digest, length = parsed
                    if offset + ENTRY.size in dead:
                        pack.garbage += ENTRY.size + length
                    else:
                        location = _location(pack.number, offset + ENTRY.size, length)
                        self._add_to_index(digest, location)
                    offset += ENTRY.size + length
                    continue
                resume = self._next_entry(f, offset + 1, end)
                if resume is None:  # a torn last entry: a crash mid-append
                    self._cut(pack, offset, end)
                    end = offset
                    break
                log.error("pack %s: damaged entry at offset %d, skipped", pack.path, offset)
                self.damaged_packs.append(f"{pack.path} (damaged at offset {offset})")
                pack.garbage += resume - offset
                offset = resume
        pack.size = end

    @staticmethod
    def _next_entry(f: BinaryIO, start: int, end: int) -> int | None:
        """Offset of the next sound entry header after damage, None if there is none."""
        f.seek(start)
        data = f.read(end - start)
        at = data.find(ENTRY_MAGIC)
        while at >= 0:
            parsed = parse_entry_header(data[at : at + ENTRY.size])
            if parsed is not None and start + at + ENTRY.size + parsed[1] <= end:
                return start + at
            at = data.find(ENTRY_MAGIC, at + 1)
        return None

    def _cut(self, pack: _Pack, offset: int, end: int) -> None:
        log.warning(
            "pack %s: cut %d bytes of a torn entry at its end (written, never synced)",
            pack.path, end - offset,
        )  # fmt: skip
        try:
            os.ftruncate(pack.fd, offset)
            os.fsync(pack.fd)
        except OSError as exc:
            raise storage_error(exc, f"repair of {pack.path}") from exc

    def has(self, digest: str) -> bool:
        return digest in self._index

    def size_of(self, digest: str) -> int:
        """The stored (framed) size of an object; 0 if absent."""
        location = self._index.get(digest)
        return 0 if location is None else _unpack_location(location)[2]

    def digests(self) -> list[str]:
        with self._lock:
            return list(self._index)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def stored_bytes(self) -> int:
        return self._stored

    def locate(self, digest: str) -> tuple[Path, int, int]:
        """(file, offset, length) of an object's frame on disk: for tools and tests."""
        with self._lock:
            location = self._index.get(digest)
        if location is None or digest in self._pending:
            raise KeyError(f"object {digest} is not on disk")
        number, offset, size = _unpack_location(location)
        if number == 0:
            return self._loose_path(digest), 0, size
        return self._packs[number].path, offset, size

    def _loose_path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest[2:]

    def file_size(self, frame_bytes: int) -> int:
        """The bytes a frame of `frame_bytes` takes on disk (sealing adds a little)."""
        return frame_bytes + (SEAL_OVERHEAD if self.cipher is not None else 0)

    def _to_disk(self, digest: str, frame: bytes) -> bytes:
        return frame if self.cipher is None else self.cipher.seal_object(digest, frame)

    def _from_disk(self, digest: str, stored: bytes) -> bytes:
        # Bytes that fail authentication are CORRUPT_OBJECT, like a bad checksum.
        return stored if self.cipher is None else self.cipher.open_object(digest, stored)

    # -- write ---------------------------------------------------------------

    def needs_inline(self, digest: str, owner: str) -> bool:
        """Must a journal record of `owner` carry this existing object inline?

        An object whose pack is not yet fsynced is durable only through the
        journal record that carried it. A later record of the *same* session
        is covered by that record (same journal, earlier offset); a record of
        another session is not, so it carries its own copy.
        """
        carrier = self._unsynced.get(digest)
        return carrier is not None and carrier != owner

    def orphan(self, digests: Iterable[str]) -> None:
        """The journal record meant to carry these objects was never written.

        They stay (a concurrent save of another session may already point at
        them, with its own inline copy), but until their pack is synced every
        record that references them must carry its own copy.
        """
        with self._lock:
            for digest in digests:
                if digest in self._unsynced:
                    self._unsynced[digest] = _NO_CARRIER

    def put(self, digest: str, frame: bytes, owner: str) -> int:
        """Store a framed object unless present; return the bytes added.

        The caller has verified that `frame` decodes to content with `digest`
        and carries it inline in `owner`'s next journal record. The object
        stays in memory until `flush` writes it (see the module docstring).
        """
        with self._lock:
            if digest in self._index:
                return 0
            size = self.file_size(len(frame))
            self._index[digest] = _location(0, 0, size)
            self._stored += size
            self._pending[digest] = frame
            self._pending_bytes += len(frame)
            self._unsynced[digest] = owner
            if self._collections:
                self._written_at[digest] = time.time()
            backlog = self._pending_bytes > MAX_PENDING_BYTES
        if self.on_new is not None:
            self.on_new(digest)
        if backlog:  # writers outpace the background syncer: help it
            self.flush()
        return size

    def restore(self, digest: str, frame: bytes, owner: str) -> bool:
        """Recovery: rewrite an object from its inline journal copy if needed."""
        if digest in self._index:
            if self.verify(digest) is None:
                return False
            self._forget(digest)
        self.put(digest, frame, owner)
        return True

    def flush(self) -> list[str]:
        """Append pending objects to the active pack (not fsynced); return their digests."""
        with self._flush_lock:
            with self._lock:
                batch = list(self._pending.items())
            if not batch:
                return []
            with tracing.span("stratad.objects.write", {"stratad.objects": len(batch)}):
                placed = self._append([(d, self._to_disk(d, f)) for d, f in batch])
            with self._lock:
                for (digest, frame), location in zip(batch, placed, strict=True):
                    if self._pending.get(digest) is not frame:
                        # Collected (or collected and put again) meanwhile.
                        self._bury(*_unpack_location(location))
                        continue
                    del self._pending[digest]
                    self._pending_bytes -= len(frame)
                    self._index[digest] = location
            return [digest for digest, _ in batch]

    def _append(self, batch: list[tuple[str, bytes]]) -> list[int]:
        """Write entries (as stored: sealed, with encryption) to the active pack; their
        locations. All or nothing."""
        pack = self._writable_pack()
        start = offset = pack.size
        pieces: list[bytes] = []
        locations = []
        for digest, frame in batch:
            pieces += (entry_header(digest, len(frame)), frame)
            locations.append(_location(pack.number, offset + ENTRY.size, len(frame)))
            offset += ENTRY.size + len(frame)
        try:
            self._write_all(pack.fd, pieces, start)
        except OSError as exc:
            self._roll_back(pack, start, exc)
            raise storage_error(exc, "object write") from exc
        pack.size = offset
        return locations

    @staticmethod
    def _write_all(fd: int, pieces: list[bytes], offset: int) -> None:
        views = [memoryview(p) for p in pieces]
        while views:
            written = os.pwritev(fd, views[:_MAX_IOV], offset)
            offset += written
            while views and written >= len(views[0]):
                written -= len(views[0])
                views.pop(0)
            if views and written:
                views[0] = views[0][written:]

    def _roll_back(self, pack: _Pack, size: int, exc: OSError) -> None:
        """Cut a failed append off, so later entries follow a sound one."""
        try:
            os.ftruncate(pack.fd, size)
        except OSError as again:
            raise self._fail_stop.trip(f"roll back of {pack.path}", again) from exc

    def _writable_pack(self) -> _Pack:
        if self._active is None or self._active.size >= PACK_BYTES:
            number = max(self._packs, default=0) + 1
            self._active = self._open_pack(number, create=True)
            with self._lock:
                self._packs[number] = self._active
            self._new_pack = True
        return self._active

    def _open_pack(self, number: int, *, create: bool) -> _Pack:
        path = self.packs_root / f"{number:08d}{PACK_SUFFIX}"
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, FILE_MODE)
        except OSError as exc:
            raise storage_error(exc, "object write") from exc
        return _Pack(number, path, fd, 0)

    def write_pending(self) -> int:
        """Durability `none`: write pending objects to the pack, without fsync.

        Written, an object is as durable as anything is in that mode (the OS
        decides when journals reach the disk too), so no journal record needs
        to carry it any more. Were it kept unsynced, every save of another
        session sharing it would carry a copy inline for ever, and sessions
        that share their chunks (forks, copies, repeated states) would grow
        their journals and slow down the longer the daemon ran.
        """
        self.flush()
        with self._lock:
            written = [d for d in self._unsynced if d not in self._pending]
            for digest in written:
                self._unsynced.pop(digest, None)
        return len(written)

    def sync_pending(self) -> int:
        """Write pending objects, then make every unsynced object durable."""
        self.flush()
        with self._lock:
            # Not pending = already written: its pack's fdatasync below covers it.
            unsynced = [d for d in self._unsynced if d not in self._pending]
            packs = {self._packs[n] for n in self._packs_of(unsynced)}
            new_pack, self._new_pack = self._new_pack, False
        if unsynced:
            try:
                with tracing.span("stratad.objects.fsync", {"stratad.objects": len(unsynced)}):
                    for pack in packs:
                        os.fdatasync(pack.fd)
                    if new_pack:
                        fsync_dir(self.packs_root)
            except OSError as exc:
                raise self._fail_stop.trip(f"fsync of objects in {self.root}", exc) from exc
        elif new_pack:
            self._new_pack = True  # nothing synced: keep the directory sync owed
        with self._lock:
            for digest in unsynced:
                self._unsynced.pop(digest, None)
        return len(unsynced)

    def _packs_of(self, digests: Iterable[str]) -> set[int]:
        numbers = set()
        for digest in digests:
            location = self._index.get(digest)
            if location is not None:
                numbers.add(_unpack_location(location)[0])
        numbers.discard(0)
        return numbers

    # -- read ----------------------------------------------------------------

    def read_frame(self, digest: str) -> bytes:
        with self._lock:
            pending = self._pending.get(digest)
            location = self._index.get(digest)
            number, offset, size = _unpack_location(location or 0)
            pack = self._packs.get(number) if number else None
        if pending is not None:
            return pending
        if location is None:
            # Whoever asks for an object has a reference to it: its absence is
            # damage to the store, never "not found".
            raise DataLossError(f"object {digest} is missing from the store")
        if pack is not None:
            try:
                return self._from_disk(digest, pack.read(offset, size))
            except OSError as exc:
                raise DataLossError(f"object {digest} is unreadable: {exc.strerror}") from exc
        try:
            stored = self._loose_path(digest).read_bytes()
        except FileNotFoundError:
            raise DataLossError(f"object {digest} is missing from the store") from None
        return self._from_disk(digest, stored)

    def get(self, digest: str, max_size: int) -> bytes:
        """Read, verify and decompress an object; damage is DATA_LOSS, never data.

        A delta object whose content was verified recently is served from the
        cache of recent contents: decoding its chain again would cost up to
        16 decodes. Plain objects are always read and checked.
        """
        cached = self.recent(digest) if digest in self._index else None
        if cached is not None and cached[1] and len(cached[0]) <= max_size:
            return cached[0]
        content, depth = self._get(digest, max_size, native.MAX_DELTA_DEPTH)
        if depth:
            self.remember(digest, content, depth)
        return content

    def content(self, digest: str, max_size: int) -> bytes:
        """An object's content, from the cache of recent contents when it is there.

        For work inside the daemon that needs content known to be right but
        not a fresh check of the disk (a delta base, the digest check of an
        upload); reads for clients use `get`.
        """
        return self.content_and_depth(digest, max_size)[0]

    def content_and_depth(self, digest: str, max_size: int) -> tuple[bytes, int]:
        """`content`, and the object's delta depth (0: a plain frame)."""
        cached = self.recent(digest)
        if cached is not None and len(cached[0]) <= max_size:
            return cached
        content, depth = self._get(digest, max_size, native.MAX_DELTA_DEPTH)
        self.remember(digest, content, depth)
        return content, depth

    def _get(self, digest: str, max_size: int, chain_left: int) -> tuple[bytes, int]:
        """(content, delta depth) of an object, read from disk and verified."""
        frame = self.read_frame(digest)
        try:
            # decode_frame checks the content against the header's digest; the
            # header's digest must also be the object's name (a swapped file).
            if native.frame_digest_hex(frame) != digest:
                raise CorruptObjectError("it holds another object's content")
            base = native.frame_delta_base(frame)
            if base is None:
                return native.decode_frame(frame, max_size), 0
            if chain_left <= 0:
                raise CorruptObjectError("its chain of delta frames is too long")
            base_content = self._base_content(base[0], chain_left - 1)
            return native.decode_delta_frame(frame, base_content, max_size), base[1]
        except CorruptObjectError as exc:
            raise CorruptObjectError(f"object {digest} is corrupt: {exc}") from exc

    def _base_content(self, digest: str, chain_left: int) -> bytes:
        """The content of a delta frame's base (from the cache of recent contents).

        Not remembered when decoded here: a read of a whole state walks one
        chain per chunk, and caching every intermediate version would push
        out the contents worth keeping (the chunks themselves, the bases the
        next save needs).
        """
        cached = self.recent(digest)
        if cached is not None:
            return cached[0]
        return self._get(digest, NO_SIZE_LIMIT, chain_left)[0]

    def remember(self, digest: str, content: bytes, depth: int) -> None:
        """Keep a verified object's content at hand (see `RecentContents`)."""
        self._recent.remember(digest, content, depth)

    def recent(self, digest: str) -> tuple[bytes, int] | None:
        """(content, delta depth) of a remembered object, or None."""
        return self._recent.get(digest)

    def delta_depth(self, digest: str) -> int:
        """How many delta frames reading this object decodes (0: a plain frame)."""
        base = self.delta_base(digest)
        return 0 if base is None else base[1]

    def delta_base(self, digest: str) -> tuple[str, int] | None:
        """(base digest, depth) if the object is stored as a delta frame, else None.

        Reads only the frame's start when it can (an unencrypted entry in a pack):
        GC asks this of every live object.
        """
        with self._lock:
            location = self._index.get(digest)
            number, offset, size = _unpack_location(location or 0)
            pack = self._packs.get(number) if number and digest not in self._pending else None
        if pack is None or self.cipher is not None:
            return native.frame_delta_base(self.read_frame(digest))
        try:
            head = pack.read(offset, min(size, _DELTA_HEAD))
        except OSError as exc:
            raise DataLossError(f"object {digest} is unreadable: {exc.strerror}") from exc
        return native.frame_delta_base(head)

    def read_plain_frame(self, digest: str) -> bytes:
        """The object as a self-contained frame (a delta frame is re-encoded whole).

        For copies that leave this store or may outlive the base: replication,
        and journal records of other sessions.
        """
        frame = self.read_frame(digest)
        if native.frame_delta_base(frame) is None:
            return frame
        return native.encode_frame(self.get(digest, NO_SIZE_LIMIT))

    def with_bases(self, digests: Iterable[str]) -> set[str]:
        """`digests` plus the bases their delta frames need, transitively (for GC).

        An object that cannot be read is left as it is: verification reports it.
        """
        found = set(digests)
        todo = list(found)
        while todo:
            digest = todo.pop()
            try:
                base = self.delta_base(digest)
            except (CorruptObjectError, DataLossError):
                continue
            if base is not None and base[0] not in found:
                found.add(base[0])
                todo.append(base[0])
        return found

    def verify(self, digest: str) -> str | None:
        """Re-hash one object; return a problem description or None if sound."""
        try:
            frame = self.read_frame(digest)
            if native.frame_delta_base(frame) is not None:
                # Decoded from disk (not the cache), checked against its digest.
                self._get(digest, NO_SIZE_LIMIT, native.MAX_DELTA_DEPTH)
                return None
            found = native.verify_frame(frame, NO_SIZE_LIMIT)
        except (CorruptObjectError, DataLossError) as exc:
            return str(exc)
        return None if found == digest else f"holds content with digest {found}"

    # -- garbage collection ----------------------------------------------------

    @contextlib.contextmanager
    def collecting(self) -> Iterator[float]:
        """Record write times while a collection runs; yields its start time.

        Recording starts before the start time is taken, so every object
        written at or after it is recorded.
        """
        with self._lock:
            self._collections += 1
        try:
            yield time.time()
        finally:
            with self._lock:
                self._collections -= 1
                if not self._collections:
                    self._written_at.clear()

    def written_after(self, digest: str, started: float) -> bool:
        """Was this object (re)written by this process at or after `started`?"""
        return self._written_at.get(digest, 0.0) >= started

    def delete(self, digest: str) -> int:
        """Remove an object (GC); return its stored size. Its pack space is
        reclaimed by `compact`; a loose file is removed at once."""
        with self._lock:
            location = self._forget_locked(digest)
        if location is None:
            return 0
        # A file of the one-file-per-object layout may hold it (or an older,
        # damaged copy that recovery replaced with a packed one).
        with contextlib.suppress(FileNotFoundError):
            self._loose_path(digest).unlink()
        return _unpack_location(location)[2]

    def _forget(self, digest: str) -> None:
        with self._lock:
            self._forget_locked(digest)

    def _forget_locked(self, digest: str) -> int | None:
        location: int | None = self._index.pop(digest, None)
        if location is None:
            return None
        number, offset, size = _unpack_location(location)
        self._stored -= size
        frame = self._pending.pop(digest, None)
        if frame is not None:
            self._pending_bytes -= len(frame)
        elif number:
            self._bury(number, offset, size)
        self._unsynced.pop(digest, None)
        self._written_at.pop(digest, None)
        self._recent.drop(digest)
        return location

    def write_tombstones(self) -> None:
        """Make the removals of a collection durable, so a restart does not
        bring the removed objects back (they would count against quotas until
        the next collection)."""
        with self._lock:
            dead, self._dead = self._dead, {}
            packs = {number: self._packs.get(number) for number in dead}
        try:
            for number, offsets in dead.items():
                pack = packs[number]
                if pack is None:  # compacted meanwhile
                    continue
                new = not pack.dead_path.exists()
                fd = os.open(pack.dead_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
                try:
                    os.write(fd, b"".join(_DEAD.pack(o) for o in offsets))
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                if new:
                    fsync_dir(self.packs_root)
        except OSError as exc:
            # Not fatal: the objects are gone from the index; a restart before
            # the next collection would only find them again as garbage.
            log.warning("tombstones of %s not written: %s", self.root, exc)

    def compact(self) -> tuple[int, int]:
        """Rewrite packs that are mostly garbage; return (packs removed, bytes freed).

        The live entries of such a pack are appended to the active pack and
        made durable before the old pack is deleted, so a crash in between
        leaves two copies (the scan indexes one), never none. Call it with no
        collection of this tenant running (it runs at the end of one).
        """
        removed = freed = 0
        for pack in self._packs_to_compact():
            self._move_live_entries(pack)
            with self._lock:
                self._packs.pop(pack.number, None)
            try:
                pack.path.unlink()
                with contextlib.suppress(FileNotFoundError):
                    pack.dead_path.unlink()
                fsync_dir(self.packs_root)
            except OSError as exc:
                raise self._fail_stop.trip(f"removal of {pack.path}", exc) from exc
            removed += 1
            freed += pack.size
        return removed, freed

    def _packs_to_compact(self) -> list[_Pack]:
        with self._lock:
            return [
                p
                for p in self._packs.values()
                if p is not self._active and p.garbage >= p.size * COMPACT_GARBAGE_SHARE
            ]

    def _move_live_entries(self, pack: _Pack) -> None:
        with self._lock:
            live = [
                (digest, location)
                for digest, location in self._index.items()
                if location >> (_SIZE_BITS + _OFFSET_BITS) == pack.number
            ]
        batch = []
        for digest, location in live:
            _, offset, size = _unpack_location(location)
            batch.append((digest, pack.read(offset, size)))
        with self._flush_lock:
            placed = self._append(batch) if batch else []
            try:
                for number in {_unpack_location(loc)[0] for loc in placed}:
                    os.fdatasync(self._packs[number].fd)
                if self._new_pack:
                    fsync_dir(self.packs_root)
                    self._new_pack = False
            except OSError as exc:
                raise self._fail_stop.trip(f"fsync of objects in {self.root}", exc) from exc
        with self._lock:
            for (digest, old), new in zip(live, placed, strict=True):
                if self._index.get(digest) == old:
                    self._index[digest] = new
