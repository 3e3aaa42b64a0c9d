"""The storage of one tenant: its objects, manifests and session directories.

Dedup never crosses tenants: each tenant has its own object directory. This
module turns states into objects (chunks + manifest) and back, and knows
which objects a state references (for garbage collection).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from stratad import native, tracing
from stratad.errors import CorruptObjectError, DataLossError
from stratad.store import manifest
from stratad.store.crypto import RecordCipher, TenantCipher
from stratad.store.failstop import FailStop
from stratad.store.fsync import make_dirs
from stratad.store.journal import SizeTally
from stratad.store.objects import ObjectStore, RecentContents

#: How a checkpoint's root object is to be read.
ROOT_EMPTY, ROOT_CHUNK, ROOT_MANIFEST = "empty", "chunk", "manifest"
_MANIFEST_CACHE_ENTRIES = 512
#: A new chunk is tried as a delta only if it starts with the same bytes as
#: the chunk it replaces.
_SAME_START = 64


@dataclass
class StoredState:
    """Where a state lives: its root object and the objects this write added."""

    root: str
    root_kind: str
    entries: bytes
    #: Framed objects this write may add (those already stored are skipped).
    new_objects: list[tuple[str, bytes]] = field(default_factory=list)
    #: The manifest this one is a delta on ("" if none).
    base: str = ""
    #: Objects the new delta frames are deltas on (they must stay stored).
    delta_bases: list[str] = field(default_factory=list)


class StaleBaseError(Exception):
    """An object the new state points at was collected meanwhile; prepare again."""


class TenantStore:
    def __init__(
        self,
        root: Path,
        name: str,
        *,
        max_object_bytes: int,
        fail_stop: FailStop | None = None,
        cipher: TenantCipher | None = None,
        recent: RecentContents | None = None,
    ) -> None:
        self.name = name
        self.root = root
        #: The tenant's data key (encryption at rest), or None.
        self.cipher = cipher
        self.sessions_root = root / "sessions"
        make_dirs(self.sessions_root)
        self.objects = ObjectStore(root / "objects", fail_stop, cipher, recent)
        #: The size of the tenant's open session journals (see `stored_bytes`).
        self.journal_bytes = SizeTally()
        self.max_object_bytes = max_object_bytes
        self._manifests: OrderedDict[str, tuple[bytes, int]] = OrderedDict()
        self._cache_lock = threading.Lock()
        # Garbage collection bookkeeping: while a collection runs, every object
        # a new checkpoint references is recorded here so the sweep spares it.
        self.gc_lock = threading.Lock()
        self.gc_touched: set[str] | None = None
        # One collection per tenant at a time: a second one would reset
        # `gc_touched` under the first, which would then sweep objects that a
        # save revived meanwhile. A second caller waits for the first.
        self.gc_running = threading.Lock()

    def cipher_for_journal(self, journal: str) -> RecordCipher | None:
        return self.cipher.records(journal) if self.cipher is not None else None

    @property
    def stored_bytes(self) -> int:
        """Object files and session journals: what GetStoreStats counts, without a walk."""
        return self.objects.stored_bytes + self.journal_bytes.bytes

    # -- write -------------------------------------------------------------

    def prepare(self, data: bytes, base: tuple[str, str] | None) -> StoredState:
        """Chunk and digest `data`; frame (compress) only the chunks not stored yet.

        Compression is the costly step, and successive states of a session
        share almost all their chunks: framing only the new ones keeps a save
        proportional to what changed rather than to the state's size.
        """
        chunks = []
        contents: dict[str, bytes] = {}
        for offset, length in native.chunk_boundaries(data):
            piece = data[offset : offset + length]
            digest = native.digest_hex(piece)
            chunks.append((digest, length))
            if not self.objects.has(digest):
                contents[digest] = piece
        entries = manifest.entries_blob(chunks)
        frames, delta_bases = self.frame_new_chunks(entries, contents, base)
        return self.prepare_entries(entries, frames, base, delta_bases)

    def frame_new_chunks(
        self,
        entries: bytes,
        contents: dict[str, bytes],
        base: tuple[str, str] | None,
        framed: dict[str, bytes] | None = None,
        *,
        first: int = 0,
    ) -> tuple[dict[str, bytes], list[str]]:
        """Frames of a state's new chunks (`contents`: digest -> content), and the
        objects those that are delta frames are deltas on.

        A new chunk is framed as a delta on the chunk at its place in the base
        state when that is smaller: a growing state rewrites its last chunk on
        every save, and as a delta that chunk costs about what was appended,
        not its whole compressed size again. `framed` holds plain frames the
        caller already has (uploaded ones), used when no delta pays; an
        uploaded delta frame is kept as it is. Entries before `first` are
        known not to be new (an upload's kept base entries).
        """
        replaced = self._base_entries(base)
        replaced_count = manifest.entry_count(replaced)
        frames: dict[str, bytes] = {}
        delta_bases: dict[str, None] = {}
        for index in range(first, manifest.entry_count(entries)):
            digest = manifest.entry_digest(entries, index)
            if digest not in contents or digest in frames:
                continue
            old = manifest.entry_digest(replaced, index) if index < replaced_count else ""
            piece = contents[digest]
            known = framed.get(digest) if framed is not None else None
            found = native.frame_delta_base(known) if known is not None else None
            if known is not None and found is not None:
                frame = known  # uploaded as a delta (checked by the caller): kept
            else:
                frame = self._try_delta(piece, old, known) or known or native.encode_frame(piece)
                found = native.frame_delta_base(frame)
            depth = 0 if found is None else found[1]
            if found is not None:
                delta_bases[found[0]] = None
            frames[digest] = frame
            self.objects.remember(digest, piece, depth)
        return frames, list(delta_bases)

    def _base_entries(self, base: tuple[str, str] | None) -> bytes:
        """The entries blob of the base state (b"" when it has none; a
        single-chunk base gives one entry, its length not filled in)."""
        if base is None or base[1] == ROOT_EMPTY:
            return b""
        if base[1] == ROOT_CHUNK:
            return manifest.entries_blob([(base[0], 0)])
        try:
            return self.resolve_manifest(base[0])[0]
        except (DataLossError, CorruptObjectError):
            return b""  # no deltas then; the save itself does not need the base

    def _try_delta(self, piece: bytes, old: str, plain: bytes | None = None) -> bytes | None:
        """The frame of a new chunk that may be a delta on `old`: the delta frame
        when it is smaller, else the plain frame it was compared with (`plain`,
        the chunk's verified frame when the caller has one, or made here); None
        when no delta was tried (no usable base)."""
        if not old or not self.objects.has(old):
            return None
        try:
            content, depth = self.objects.content_and_depth(old, self.max_object_bytes)
        except (DataLossError, CorruptObjectError):
            return None  # a damaged base: Verify reports it
        if content[:_SAME_START] != piece[:_SAME_START]:
            # Not a rewrite of `old` (a grown or edited chunk starts as it did):
            # trying a delta would only cost a second compression.
            return None
        return native.encode_delta_frame(piece, content, depth, plain=plain)

    def prepare_entries(
        self,
        entries: bytes,
        frames: dict[str, bytes],
        base: tuple[str, str] | None,
        delta_bases: list[str] | None = None,
    ) -> StoredState:
        """Build the root for a chunk list; `frames` holds verified new chunks,
        `delta_bases` the objects those that are delta frames need."""
        count = manifest.entry_count(entries)
        if count == 0:
            return StoredState("", ROOT_EMPTY, entries)
        new = [(d, frames[d]) for d, _ in manifest.iter_entries(entries) if d in frames]
        unique = dict(new)
        bases = list(delta_bases or ())
        if count == 1:
            root = next(manifest.iter_entries(entries))[0]
            return StoredState(root, ROOT_CHUNK, entries, list(unique.items()), "", bases)
        content = manifest.encode(entries, self._manifest_base(base))
        root, decoded = native.digest_hex(content), manifest.decode(content)
        unique[root] = native.encode_frame(content)
        self._cache_manifest(root, entries, decoded.depth)
        return StoredState(root, ROOT_MANIFEST, entries, list(unique.items()), decoded.base, bases)

    def _manifest_base(self, base: tuple[str, str] | None) -> tuple[str, bytes, int] | None:
        if base is None or base[1] != ROOT_MANIFEST:
            return None
        entries, depth = self.resolve_manifest(base[0])
        return base[0], entries, depth

    def commit_objects(self, state: StoredState, owner: str) -> list[tuple[str, bytes]]:
        """Write the state's new objects; return those the journal record must carry.

        That is every object this call added, plus existing objects that are
        durable only through another session's journal so far. Objects
        referenced while a garbage collection runs are recorded for it.
        """
        try:
            with tracing.span(
                "stratad.objects.commit", {"stratad.objects": len(state.new_objects)}
            ):
                return self._commit_objects(state, owner)
        except BaseException:
            # No journal record will carry what this call put (a backlog flush
            # hit a full disk, a base was collected...): a retry must carry
            # those objects itself, or it is acknowledged without them.
            self.objects.orphan(digest for digest, _ in state.new_objects)
            raise

    def _commit_objects(self, state: StoredState, owner: str) -> list[tuple[str, bytes]]:
        inline: list[tuple[str, bytes]] = []
        with self.gc_lock:
            for digest, frame in state.new_objects:
                if self.objects.put(digest, frame, owner) or self.objects.needs_inline(
                    digest, owner
                ):
                    inline.append((digest, frame))
            for digest in self._referenced_existing(state):
                if not self.objects.has(digest):
                    raise StaleBaseError(digest)
                if self.objects.needs_inline(digest, owner):
                    # Whole, not a delta: this record must not depend on
                    # objects another journal carries.
                    inline.append((digest, self.objects.read_plain_frame(digest)))
            if self.gc_touched is not None:
                closure = self.closure(state.root, state.root_kind, state.entries)
                self.gc_touched.update(self.objects.with_bases(closure))
        return inline

    def added_bytes(self, state: StoredState, owner: str) -> int:
        """What committing `state` for `owner` (and journaling it) adds to the store.

        A new object counts twice: its pack entry, and the copy its journal record
        carries; an existing one the record must carry (see needs_inline), once.
        """
        added = 0
        for digest, frame in state.new_objects:
            if not self.objects.has(digest):
                added += self.objects.file_size(len(frame)) + len(frame)
            elif self.objects.needs_inline(digest, owner):
                added += len(frame)
        for digest in self._referenced_existing(state):
            if self.objects.needs_inline(digest, owner):
                added += self.objects.size_of(digest)
        return added

    def _referenced_existing(self, state: StoredState) -> list[str]:
        """Objects the state points at without carrying them (chunks it dedups, its
        manifest's base, the bases of its delta frames)."""
        new = {d for d, _ in state.new_objects}
        refs = [d for d, _ in manifest.iter_entries(state.entries) if d not in new]
        if state.base:
            refs.append(state.base)
        refs += (d for d in state.delta_bases if d not in new)
        return refs

    def missing(self, digests: list[str]) -> list[str]:
        return [d for d in digests if not self.objects.has(d)]

    # -- read --------------------------------------------------------------

    def read_object(self, digest: str) -> bytes:
        """One object's verified content (damage is DATA_LOSS)."""
        return self.objects.get(digest, self.max_object_bytes)

    def resolve_manifest(self, digest: str) -> tuple[bytes, int]:
        """A manifest's full entries blob and delta depth (cached)."""
        with self._cache_lock:
            hit = self._manifests.get(digest)
            if hit is not None:
                self._manifests.move_to_end(digest)
                return hit
        m = manifest.decode(self.objects.get(digest, self.max_object_bytes))
        entries = m.added
        if m.kind == manifest.DELTA:
            base_entries, _ = self.resolve_manifest(m.base)
            if m.keep > manifest.entry_count(base_entries):
                raise DataLossError(f"manifest {digest} keeps more entries than its base has")
            entries = base_entries[: m.keep * manifest.ENTRY.size] + m.added
        self._cache_manifest(digest, entries, m.depth)
        return entries, m.depth

    def _cache_manifest(self, digest: str, entries: bytes, depth: int) -> None:
        with self._cache_lock:
            self._manifests[digest] = (entries, depth)
            self._manifests.move_to_end(digest)
            while len(self._manifests) > _MANIFEST_CACHE_ENTRIES:
                self._manifests.popitem(last=False)

    def entries_of(self, root: str, kind: str, size: int) -> bytes:
        """The chunk list of a stored state (a single chunk's length is the size)."""
        if kind == ROOT_EMPTY:
            return b""
        if kind == ROOT_CHUNK:
            return manifest.ENTRY.pack(bytes.fromhex(root), size)
        return self.resolve_manifest(root)[0]

    def read(self, root: str, kind: str, size: int, digest: str) -> bytes:
        """Reassemble a state and verify it; damage is DATA_LOSS, never data."""
        if kind == ROOT_EMPTY:
            data = b""
        elif kind == ROOT_CHUNK:
            data = self.objects.get(root, self.max_object_bytes)
        else:
            entries = self.resolve_manifest(root)[0]
            data = b"".join(
                self.objects.get(d, self.max_object_bytes)
                for d, _ in manifest.iter_entries(entries)
            )
        if len(data) != size or native.digest_hex(data) != digest:
            raise DataLossError(
                f"state {digest} failed verification after reassembly "
                f"({len(data)} bytes, expected {size})"
            )
        return data

    # -- references (GC, verify) ----------------------------------------------

    def closure(self, root: str, kind: str, entries: bytes | None = None) -> set[str]:
        """Every object a state depends on: root, manifest chain and chunks."""
        if kind == ROOT_EMPTY:
            return set()
        if kind == ROOT_CHUNK:
            return {root}
        found = {root}
        digest = root
        while digest:  # the delta chain
            m = manifest.decode(self.objects.get(digest, self.max_object_bytes))
            found.add(digest)
            digest = m.base
        if entries is None:
            entries = self.resolve_manifest(root)[0]
        found.update(d for d, _ in manifest.iter_entries(entries))
        return found
