"""Content-addressed, immutable objects of one tenant.

`<tenant>/objects/ab/<rest of hex digest>` holds one framed object (see
docs/native.md): magic, sizes, the BLAKE3 digest of the uncompressed content
and the zstd payload. Objects are written once and never modified.

Durability without file work on the save path: every object a mutation adds
is carried inline in that mutation's journal record, and the journal record is
what gets fsynced before the acknowledgement. The object itself is kept in
memory ("pending") and written to its file by the background syncer, which
then fsyncs the files and their directories in batches; a journal compaction
(which drops the inline copies) syncs first. After a crash, recovery rewrites
any object whose file is missing or damaged from the journal's copy, so the
pair (journal, objects) never loses an acknowledged byte. Creating a file
costs more than the rest of a save together, hence this design.

With encryption at rest, an object *file* holds the frame sealed with the
tenant's data key (store/crypto.py); in memory (pending objects, journal
records' inline copies, reads) it is the plain frame. The file's name stays
the digest of the plaintext, so dedup within the tenant is unchanged.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from stratad import native
from stratad.errors import CorruptObjectError, DataLossError
from stratad.store.crypto import SEAL_OVERHEAD, TenantCipher
from stratad.store.failstop import FailStop
from stratad.store.fsync import DIR_MODE, FILE_MODE, fsync_dir, make_dirs, sync_files
from stratad.store.journal import storage_error

_TMP_SUFFIX = ".tmp"
#: Verification decodes whatever size the (checked) header declares; this is a
#: sanity bound, not a quota: quotas are enforced when data comes in.
NO_SIZE_LIMIT = 1 << 40
#: Carrier of an unsynced object that no journal record carries (see orphan).
_NO_CARRIER = ""
#: Pending (not yet written) object bytes above which writers flush themselves.
MAX_PENDING_BYTES = 64 << 20


def find_on_disk(objects_root: Path, digest: str) -> tuple[Path, int, int] | None:
    """Where an object's stored bytes are on disk: (file, offset, length), or None; read-only."""
    path = objects_root / digest[:2] / digest[2:]
    return (path, 0, path.stat().st_size) if path.is_file() else None


class ObjectStore:
    """The objects directory of one tenant, with an in-memory digest index."""

    def __init__(
        self, root: Path, fail_stop: FailStop | None = None, cipher: TenantCipher | None = None
    ) -> None:
        self.root = root
        #: Seals object files (encryption at rest); None: files hold plain frames.
        self.cipher = cipher
        self._fail_stop = fail_stop or FailStop()
        make_dirs(root)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        # sum(_sizes.values()), kept as it changes: quotas read it on every save.
        self._stored = 0
        # digest -> frame, for objects not yet written to their file.
        self._pending: dict[str, bytes] = {}
        self._pending_bytes = 0
        # digest -> session key of the journal that carries it inline, until
        # the object file itself is fsynced (see needs_inline).
        self._unsynced: dict[str, str] = {}
        # digest -> time it was written by this process; GC never removes
        # an object written after its mark phase started.
        self._written_at: dict[str, float] = {}
        self._dirs: set[str] = set()
        #: Called with the digest of every object added (replication ships them).
        self.on_new: Callable[[str], None] | None = None
        # Fan-out directories created since the last sync: their entries in
        # `root` must be made durable with the objects in them.
        self._new_dirs = False
        self._scan()

    # -- index ---------------------------------------------------------------

    def _scan(self) -> None:
        """Index existing objects; remove temp files a crash left behind."""
        for sub in self.root.iterdir():
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            self._dirs.add(sub.name)
            for entry in os.scandir(sub):
                if entry.name.endswith(_TMP_SUFFIX):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                    continue
                size = entry.stat().st_size
                self._sizes[sub.name + entry.name] = size
                self._stored += size

    def has(self, digest: str) -> bool:
        return digest in self._sizes

    def size_of(self, digest: str) -> int:
        """The stored (framed) size of an object; 0 if absent."""
        return self._sizes.get(digest, 0)

    def digests(self) -> list[str]:
        with self._lock:
            return list(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def stored_bytes(self) -> int:
        return self._stored

    def path_of(self, digest: str) -> Path:
        return self.root / digest[:2] / digest[2:]

    def locate(self, digest: str) -> tuple[Path, int, int]:
        """(file, offset, length) of an object's stored bytes on disk: for tools and tests."""
        with self._lock:
            size = self._sizes.get(digest)
        if size is None or digest in self._pending:
            raise KeyError(f"object {digest} is not on disk")
        return self.path_of(digest), 0, size

    def file_size(self, frame_bytes: int) -> int:
        """The size of the file that holds a frame of `frame_bytes` (sealing adds a little)."""
        return frame_bytes + (SEAL_OVERHEAD if self.cipher is not None else 0)

    # -- write ---------------------------------------------------------------

    def needs_inline(self, digest: str, owner: str) -> bool:
        """Must a journal record of `owner` carry this existing object inline?

        An object whose file is not yet fsynced is durable only through the
        journal record that carried it. A later record of the *same* session
        is covered by that record (same journal, earlier offset); a record of
        another session is not, so it carries its own copy.
        """
        carrier = self._unsynced.get(digest)
        return carrier is not None and carrier != owner

    def orphan(self, digests: Iterable[str]) -> None:
        """The journal record meant to carry these objects was never written.

        They stay (a concurrent save of another session may already point at
        them, with its own inline copy), but until their files are synced every
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
            if digest in self._sizes:
                return 0
            size = self.file_size(len(frame))
            self._sizes[digest] = size
            self._stored += size
            self._pending[digest] = frame
            self._pending_bytes += len(frame)
            self._unsynced[digest] = owner
            self._written_at[digest] = time.time()
            backlog = self._pending_bytes > MAX_PENDING_BYTES
        if self.on_new is not None:
            self.on_new(digest)
        if backlog:  # writers outpace the background syncer: help it
            self.flush()
        return size

    def restore(self, digest: str, frame: bytes, owner: str) -> bool:
        """Recovery: rewrite an object from its inline journal copy if needed."""
        if digest in self._sizes:
            try:
                if native.verify_frame(self.read_frame(digest), NO_SIZE_LIMIT) == digest:
                    return False
            except (DataLossError, CorruptObjectError):
                pass
            with self._lock:
                self._stored -= self._sizes.pop(digest, 0)
        self.put(digest, frame, owner)
        return True

    def flush(self) -> list[str]:
        """Write pending objects to their files (not fsynced); return their digests."""
        with self._flush_lock:
            with self._lock:
                batch = list(self._pending.items())
            for digest, frame in batch:
                self._write_file(digest, frame)
            with self._lock:
                for digest, frame in batch:
                    if self._pending.get(digest) is frame:
                        del self._pending[digest]
                        self._pending_bytes -= len(frame)
            return [digest for digest, _ in batch]

    def _write_file(self, digest: str, frame: bytes) -> None:
        path = self.path_of(digest)
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        try:
            if digest[:2] not in self._dirs:
                path.parent.mkdir(mode=DIR_MODE, exist_ok=True)
                self._dirs.add(digest[:2])
                self._new_dirs = True
            data = frame if self.cipher is None else self.cipher.seal_object(digest, frame)
            with open(tmp, "wb", opener=_private) as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise storage_error(exc, "object write") from exc

    def sync_pending(self) -> int:
        """Write pending objects, then make every unsynced object file durable."""
        self.flush()
        with self._lock:
            unsynced = [d for d in self._unsynced if d not in self._pending]
        if unsynced:
            new_dirs, self._new_dirs = self._new_dirs, False
            try:
                sync_files(self.root, (self.path_of(d) for d in unsynced))
                if new_dirs:
                    fsync_dir(self.root)
            except OSError as exc:
                raise self._fail_stop.trip(f"fsync of objects in {self.root}", exc) from exc
        with self._lock:
            for digest in unsynced:
                self._unsynced.pop(digest, None)
        return len(unsynced)

    # -- read ----------------------------------------------------------------

    def read_frame(self, digest: str) -> bytes:
        pending = self._pending.get(digest)
        if pending is not None:
            return pending
        try:
            stored = self.path_of(digest).read_bytes()
        except FileNotFoundError:
            # Whoever asks for an object has a reference to it: its absence is
            # damage to the store, never "not found".
            raise DataLossError(f"object {digest} is missing from the store") from None
        # A file that fails authentication is CORRUPT_OBJECT, like a bad checksum.
        return stored if self.cipher is None else self.cipher.open_object(digest, stored)

    def get(self, digest: str, max_size: int) -> bytes:
        """Read, verify and decompress an object; damage is DATA_LOSS, never data."""
        frame = self.read_frame(digest)
        try:
            # decode_frame checks the content against the header's digest; the
            # header's digest must also be the object's name (a swapped file).
            if native.frame_digest_hex(frame) != digest:
                raise CorruptObjectError("it holds another object's content")
            return native.decode_frame(frame, max_size)
        except CorruptObjectError as exc:
            raise CorruptObjectError(f"object {digest} is corrupt: {exc}") from exc

    def verify(self, digest: str) -> str | None:
        """Re-hash one object; return a problem description or None if sound."""
        try:
            frame = self.read_frame(digest)
            found = native.verify_frame(frame, NO_SIZE_LIMIT)
        except (CorruptObjectError, DataLossError) as exc:
            return str(exc)
        return None if found == digest else f"holds content with digest {found}"

    # -- garbage collection ----------------------------------------------------

    def written_after(self, digest: str, started: float) -> bool:
        """Was this object (re)written by this process at or after `started`?"""
        return self._written_at.get(digest, 0.0) >= started

    def delete(self, digest: str) -> int:
        with self._lock:
            size = self._sizes.pop(digest, 0)
            self._stored -= size
            frame = self._pending.pop(digest, None)
            if frame is not None:
                self._pending_bytes -= len(frame)
            self._unsynced.pop(digest, None)
            self._written_at.pop(digest, None)
        with contextlib.suppress(FileNotFoundError):
            self.path_of(digest).unlink()
        return size


def _private(path: str, flags: int) -> int:
    """`open` opener: new object files are readable by the daemon's user only."""
    return os.open(path, flags, FILE_MODE)
