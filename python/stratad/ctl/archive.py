"""The portable session archive of ``stratad ctl export`` / ``import``.

An archive is a plain (uncompressed) tar file holding:

    MANIFEST.json          the session, its checkpoints oldest first, and every entry
    MANIFEST.json.blake3   lowercase hex BLAKE3 of MANIFEST.json
    chunks/<blake3>.zst    one content-defined chunk of state, zstd-compressed

Besides each checkpoint's state, format version 2 carries everything else a
client can read back: each checkpoint's pending writes (LangGraph's
put_writes: task, path, index, channel, type and value) and the structured
state it captured (cognitive state, tasks, agent state, as JSON), and the
session's current structured state. Each of these values is a *blob*: its
size, BLAKE3 and chunk list, stored in ``chunks/`` like a state (a decision
log that grows from checkpoint to checkpoint shares its chunks). Version 1
archives (states only) still import.

States are cut into chunks with stratad's FastCDC parameters, so that the
successive checkpoints of a growing state share chunks in the archive as they
do in the store: each chunk is stored once, named by the BLAKE3 of its
uncompressed bytes. Every checkpoint lists its chunks; MANIFEST.json lists
every entry with its size and the BLAKE3 of its stored (compressed) bytes.

`ArchiveReader` refuses an archive unless all of this checks out, before the
importer sends anything to a daemon: the manifest's own digest, its schema,
every entry's size and digest, no entry unlisted (and nothing but regular
files with expected names), every chunk's decompressed digest, and every
checkpoint's reassembled size and digest.

An archive is untrusted input, and a small one can claim a lot: a tar header
or manifest entry can declare gigabytes, a zstd chunk of zeros expands
thousandfold, and a checkpoint can list one chunk thousands of times. So every
size is checked against a fixed limit before anything is read or decompressed:
a member against the size its kind allows, a checkpoint's declared size
against the daemon's maximum state size, and while a state is reassembled its
running total against its declared size (decompression stops at the first
byte over). Reading holds at most one checkpoint's state, one chunk, and a
cache of chunks no larger than CHUNK_CACHE_BYTES or the state limit.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratad import __version__, native
from stratad.errors import DataLossError, DecompressionLimitError, ResourceExhaustedError

FORMAT = "stratad-session-archive"
FORMAT_VERSION = 2
#: Versions `ArchiveReader` reads: 1 (states only) and 2 (+ pending writes, structured state).
READABLE_VERSIONS = (1, 2)
MANIFEST = "MANIFEST.json"
MANIFEST_DIGEST = "MANIFEST.json.blake3"
CHUNK_DIR = "chunks/"
#: No chunk of an archive decompresses to more than this (FastCDC's maximum is 32 KiB).
MAX_CHUNK_BYTES = 4 << 20
#: No stored chunk is larger: zstd's worst case for MAX_CHUNK_BYTES is +1/256 and a header.
MAX_STORED_CHUNK_BYTES = MAX_CHUNK_BYTES + (64 << 10)
#: A manifest larger than this is not one stratad wrote. It takes ~70 bytes per chunk
#: reference (~8 KiB of state): ~7 GiB of states in all, a thousand of 7 MiB.
MAX_MANIFEST_BYTES = 64 << 20
#: The daemon's default maximum state size; `ArchiveReader` refuses a larger checkpoint.
DEFAULT_MAX_STATE_BYTES = 64 << 20
#: Decompressed chunks kept while reassembling states (successive checkpoints share
#: most of theirs, and decoding them again costs ~8x); never more than the state limit.
CHUNK_CACHE_BYTES = 16 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK_NAME = re.compile(r"chunks/([0-9a-f]{64})\.zst")


class ArchiveError(DataLossError):
    """The archive is damaged, incomplete or not a stratad session archive."""


@dataclass
class ArchivedBlob:
    """A value stored as chunks: a pending write's value, a structured state."""

    size: int
    digest: str
    chunks: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "digest": self.digest, "chunks": self.chunks}


@dataclass
class ArchivedWrite:
    """One pending write of a checkpoint (PutWrites)."""

    task_id: str
    task_path: str
    idx: int
    channel: str
    type: str
    value: ArchivedBlob

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "task_path": self.task_path,
            "idx": self.idx,
            "channel": self.channel,
            "type": self.type,
            **self.value.to_json(),
        }


@dataclass
class ArchivedCheckpoint:
    checkpoint_id: str
    parent_checkpoint_id: str
    namespace: str
    name: str
    content_type: str
    metadata: dict[str, Any]
    created_at: str
    version: int
    size: int
    digest: str
    chunks: list[str]
    pending_writes: list[ArchivedWrite] = field(default_factory=list)
    #: The structured state captured with it (None: none).
    structured: ArchivedBlob | None = None

    @property
    def state_blob(self) -> ArchivedBlob:
        return ArchivedBlob(self.size, self.digest, self.chunks)

    def blobs(self) -> Iterator[tuple[str, ArchivedBlob]]:
        """Every blob of the checkpoint with a label for messages: state, structured, writes."""
        yield f"checkpoint {self.checkpoint_id}", self.state_blob
        if self.structured is not None:
            yield f"the structured state of checkpoint {self.checkpoint_id}", self.structured
        for w in self.pending_writes:
            yield f"pending write {w.task_id}/{w.idx} of checkpoint {self.checkpoint_id}", w.value

    def to_json(self) -> dict[str, Any]:
        extras: dict[str, Any] = {"pending_writes": [w.to_json() for w in self.pending_writes]}
        if self.structured is not None:
            extras["structured"] = self.structured.to_json()
        return {
            **extras,
            "checkpoint_id": self.checkpoint_id,
            "parent_checkpoint_id": self.parent_checkpoint_id,
            "namespace": self.namespace,
            "name": self.name,
            "content_type": self.content_type,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "version": self.version,
            "size": self.size,
            "digest": self.digest,
            "chunks": self.chunks,
        }


@dataclass
class ArchivedSession:
    session_id: str
    status: str
    labels: dict[str, str]
    keep_last: int
    max_age_seconds: float
    head_checkpoint_id: str
    forked_from_checkpoint_id: str = ""
    created_at: str = ""
    version: int = 0
    #: Its structured state when exported (None: none).
    structured: ArchivedBlob | None = None

    def to_json(self) -> dict[str, Any]:
        extras = {"structured": self.structured.to_json()} if self.structured is not None else {}
        return {
            **extras,
            "session_id": self.session_id,
            "status": self.status,
            "labels": self.labels,
            "retention": {"keep_last": self.keep_last, "max_age_seconds": self.max_age_seconds},
            "head_checkpoint_id": self.head_checkpoint_id,
            "forked_from_checkpoint_id": self.forked_from_checkpoint_id,
            "created_at": self.created_at,
            "version": self.version,
        }


@dataclass
class Manifest:
    session: ArchivedSession
    checkpoints: list[ArchivedCheckpoint] = field(default_factory=list)
    #: entry name -> (size, blake3 hex of the stored bytes)
    entries: dict[str, tuple[int, str]] = field(default_factory=dict)
    created_at: str = ""
    stratad_version: str = __version__
    source: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "stratad_version": self.stratad_version,
            "created_at": self.created_at,
            "source": self.source,
            "chunking": {
                "algorithm": "fastcdc-2020",
                "min": native.DEFAULT_MIN_CHUNK,
                "avg": native.DEFAULT_AVG_CHUNK,
                "max": native.DEFAULT_MAX_CHUNK,
                "compression": "zstd",
            },
            "session": self.session.to_json(),
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "entries": {
                name: {"size": size, "blake3": digest}
                for name, (size, digest) in sorted(self.entries.items())
            },
        }


def chunk_entry(digest: str) -> str:
    return f"{CHUNK_DIR}{digest}.zst"


# --- writing ------------------------------------------------------------------------


class ArchiveWriter:
    """Write an archive to ``path`` atomically (a temp file renamed at `close`).

    Add checkpoints oldest first with `add_checkpoint`; `close` writes the
    manifest. Nothing is left at ``path`` if the writer is discarded.
    """

    def __init__(self, path: Path, session: ArchivedSession, source: dict[str, str]) -> None:
        self.path = path
        self.manifest = Manifest(
            session=session,
            created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            source=source,
        )
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
        self._tmp = Path(tmp)
        self._file = os.fdopen(fd, "wb")
        self._tar = tarfile.open(  # noqa: SIM115 (closed by close() or discard())
            fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT
        )
        self._mtime = int(time.time())
        self.bytes_written = 0

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()

    def add_checkpoint(self, checkpoint: ArchivedCheckpoint, data: bytes) -> None:
        """Store ``data`` (the checkpoint's state) as chunks the archive lacks.

        Its pending writes and structured state are blobs already added (`add_blob`).
        """
        if native.digest_hex(data) != checkpoint.digest or len(data) != checkpoint.size:
            raise DataLossError(
                f"checkpoint {checkpoint.checkpoint_id}: the state read does not match "
                "its recorded digest"
            )
        checkpoint.chunks = self.add_blob(data).chunks
        self.manifest.checkpoints.append(checkpoint)

    def add_blob(self, data: bytes) -> ArchivedBlob:
        """Store ``data`` as chunks the archive lacks; its reference for the manifest."""
        chunks = []
        for offset, length in native.chunk_boundaries(data) if data else []:
            piece = data[offset : offset + length]
            digest = native.digest_hex(piece)
            chunks.append(digest)
            name = chunk_entry(digest)
            if name not in self.manifest.entries:
                self._add(name, native.compress(piece))
        return ArchivedBlob(len(data), native.digest_hex(data), chunks)

    def _add(self, name: str, payload: bytes, *, listed: bool = True) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        info.mtime = self._mtime
        info.mode = 0o644
        self._tar.addfile(info, io.BytesIO(payload))
        self.bytes_written += len(payload)
        if listed:
            self.manifest.entries[name] = (len(payload), native.digest_hex(payload))

    def close(self) -> None:
        document = json.dumps(self.manifest.to_json(), indent=1, sort_keys=True).encode()
        if len(document) > MAX_MANIFEST_BYTES:
            # Refuse now rather than write an archive that no import accepts.
            self.discard()
            raise ResourceExhaustedError(
                f"the archive's manifest would be {len(document)} bytes, more than an import "
                f"accepts ({MAX_MANIFEST_BYTES}): export fewer checkpoints"
            )
        self._add(MANIFEST, document, listed=False)
        self._add(MANIFEST_DIGEST, (native.digest_hex(document) + "\n").encode(), listed=False)
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self._tar.close()
        with contextlib.suppress(Exception):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self._tmp.unlink()


# --- reading --------------------------------------------------------------------------


class ArchiveReader:
    """An archive opened for import; `verify` must pass before `states` is used.

    A checkpoint declaring more than ``max_state_bytes`` is refused: the daemon
    would refuse its state anyway, and it bounds what reading one costs.
    """

    def __init__(self, path: Path, *, max_state_bytes: int = DEFAULT_MAX_STATE_BYTES) -> None:
        self.path = path
        self.max_state_bytes = max_state_bytes
        try:
            self._file = _ClampedFile(path)
        except OSError as exc:
            raise ArchiveError(f"{path} is not a readable tar archive: {exc}") from None
        try:
            self._tar = tarfile.open(fileobj=self._file, mode="r:")  # noqa: SIM115 (closed by close())
            self._members = {m.name: m for m in self._tar.getmembers()}
        except (OSError, tarfile.TarError, EOFError) as exc:
            self._file.close()
            raise ArchiveError(f"{path} is not a readable tar archive: {exc}") from None
        #: chunk digest -> decompressed length, learned by `verify`
        self._lengths: dict[str, int] = {}
        self._cache: dict[str, bytes] = {}
        self._cache_bytes = 0
        self._cache_limit = min(CHUNK_CACHE_BYTES, max_state_bytes)
        try:
            self.manifest = self._read_manifest()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._tar.close()
        self._file.close()

    def __enter__(self) -> ArchiveReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _member(self, name: str, limit: int) -> tarfile.TarInfo:
        """The member ``name``, checked to be a plain file of at most ``limit`` bytes."""
        member = self._members.get(name)
        if member is None:
            raise ArchiveError(f"the archive has no {name}")
        _check_plain(name, member)
        if member.size > limit:
            raise ArchiveError(f"{name} is larger than {limit} bytes ({member.size})")
        return member

    def _member_bytes(self, name: str, limit: int) -> bytes:
        member = self._member(name, limit)
        try:
            f = self._tar.extractfile(member)
            assert f is not None
            data = f.read(member.size)
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise ArchiveError(f"cannot read {name}: {exc}") from None
        if len(data) != member.size:
            raise ArchiveError(f"{name} is truncated")
        return data

    def _read_manifest(self) -> Manifest:
        document = self._member_bytes(MANIFEST, MAX_MANIFEST_BYTES)
        recorded = self._member_bytes(MANIFEST_DIGEST, 1024).decode("ascii", "replace").strip()
        if native.digest_hex(document) != recorded:
            raise ArchiveError("MANIFEST.json does not match its BLAKE3 digest")
        try:
            raw = json.loads(document)
        except ValueError as exc:
            raise ArchiveError(f"MANIFEST.json is not JSON: {exc}") from None
        try:
            return _parse_manifest(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveError(f"MANIFEST.json is not a valid manifest: {exc!r}") from None

    def verify(self, progress: Any = None) -> None:
        """Check every entry and every checkpoint; raise `ArchiveError` at the first problem.

        Every declared size is checked before anything is decompressed.
        ``progress``, if given, is called as ``progress(done, total)`` per entry.
        """
        self._check_members()
        blobs = list(self._blobs())
        for label, blob in blobs:
            self._check_blob_size(label, blob)
        total = len(self.manifest.entries) + len(blobs)
        done = 0
        for name, (_, digest) in sorted(self.manifest.entries.items()):
            stored = self._stored_chunk(name)
            if native.digest_hex(stored) != digest:
                raise ArchiveError(f"{name} does not match its BLAKE3 digest")
            chunk = name[len(CHUNK_DIR) : -len(".zst")]
            self._lengths[chunk] = len(self._decode_chunk(chunk, stored, MAX_CHUNK_BYTES))
            done += 1
            if progress is not None:
                progress(done, total)
        for label, blob in blobs:
            self._check_chunk_total(label, blob)
            self.blob(label, blob)
            done += 1
            if progress is not None:
                progress(done, total)

    def _blobs(self) -> Iterator[tuple[str, ArchivedBlob]]:
        for cp in self.manifest.checkpoints:
            yield from cp.blobs()
        if self.manifest.session.structured is not None:
            yield "the session's structured state", self.manifest.session.structured

    def _check_members(self) -> None:
        """Exactly the listed regular files, each of the size the manifest gives."""
        listed = self.manifest.entries
        expected = set(listed) | {MANIFEST, MANIFEST_DIGEST}
        for name, member in self._members.items():
            if name not in expected:
                raise ArchiveError(f"unexpected entry {name!r} in the archive")
            _check_plain(name, member)
        for name, (size, _) in listed.items():
            if _CHUNK_NAME.fullmatch(name) is None:
                raise ArchiveError(f"unexpected entry {name!r} in the manifest")
            if size > MAX_STORED_CHUNK_BYTES:
                raise ArchiveError(
                    f"{name}: the manifest says {size} bytes, more than a chunk can be "
                    f"({MAX_STORED_CHUNK_BYTES})"
                )
            member = self._member(name, MAX_STORED_CHUNK_BYTES)
            if member.size != size:
                raise ArchiveError(f"{name}: {member.size} bytes, the manifest says {size}")

    def _check_blob_size(self, label: str, blob: ArchivedBlob) -> None:
        if blob.size > self.max_state_bytes:
            raise ArchiveError(
                f"{label} declares a state of {blob.size} bytes, more than the maximum state size "
                f"of {self.max_state_bytes} bytes (--max-state-bytes)"
            )

    def _check_chunk_total(self, label: str, blob: ArchivedBlob) -> None:
        """Its chunks (lengths known from `verify`) add up to its declared size."""
        total = 0
        for digest in blob.chunks:
            if chunk_entry(digest) not in self.manifest.entries:
                raise ArchiveError(f"{label}: chunk {digest} is missing")
            total += self._lengths[digest]
            if total > blob.size:
                raise self._overrun(label, blob)
        if total != blob.size:
            raise ArchiveError(
                f"{label}: its chunks add up to {total} bytes, it declares {blob.size}"
            )

    def _overrun(self, label: str, blob: ArchivedBlob) -> ArchiveError:
        return ArchiveError(
            f"{label}: its chunks add up to more than the {blob.size} bytes it declares"
        )

    def _stored_chunk(self, name: str) -> bytes:
        if name not in self.manifest.entries:
            raise ArchiveError(f"{name} is not listed in the manifest")
        size, _ = self.manifest.entries[name]
        return self._member_bytes(name, min(size, MAX_STORED_CHUNK_BYTES))

    def _decode_chunk(self, digest: str, stored: bytes, limit: int) -> bytes:
        """The chunk's bytes; `DecompressionLimitError` past ``limit`` bytes."""
        try:
            data = native.decompress(stored, limit)
        except DecompressionLimitError:
            raise
        except Exception as exc:
            raise ArchiveError(f"chunk {digest} does not decompress: {exc}") from None
        if native.digest_hex(data) != digest:
            raise ArchiveError(f"chunk {digest} does not match its BLAKE3 digest")
        return data

    def _piece(self, label: str, blob: ArchivedBlob, digest: str, room: int) -> bytes:
        """One chunk of a blob, of at most ``room`` bytes (what its size has left)."""
        data = self._cache.get(digest)
        if data is None:
            data = self._decode_piece(label, blob, digest, room)
            self._remember(digest, data)
        if len(data) > room:
            raise self._overrun(label, blob)
        return data

    def _remember(self, digest: str, data: bytes) -> None:
        if self._cache_bytes + len(data) > self._cache_limit:
            self._cache.clear()
            self._cache_bytes = 0
        if len(data) <= self._cache_limit:
            self._cache[digest] = data
            self._cache_bytes += len(data)

    def _decode_piece(self, label: str, blob: ArchivedBlob, digest: str, room: int) -> bytes:
        stored = self._stored_chunk(chunk_entry(digest))
        try:
            return self._decode_chunk(digest, stored, min(room, MAX_CHUNK_BYTES))
        except DecompressionLimitError:
            if room < MAX_CHUNK_BYTES:
                raise self._overrun(label, blob) from None
            raise ArchiveError(
                f"chunk {digest} decompresses to more than {MAX_CHUNK_BYTES} bytes"
            ) from None

    def state(self, cp: ArchivedCheckpoint) -> bytes:
        """The checkpoint's state, reassembled and checked against its size and digest."""
        return self.blob(f"checkpoint {cp.checkpoint_id}", cp.state_blob)

    def blob(self, label: str, blob: ArchivedBlob) -> bytes:
        """A blob's bytes, reassembled and checked against its size and digest."""
        self._check_blob_size(label, blob)
        # BytesIO grows in place and getvalue() hands over its buffer without a copy:
        # one state in memory, not the pieces plus their join.
        buffer = io.BytesIO()
        for digest in blob.chunks:
            buffer.write(self._piece(label, blob, digest, blob.size - buffer.tell()))
        if buffer.tell() != blob.size:
            raise ArchiveError(
                f"{label}: its chunks add up to {buffer.tell()} bytes, it declares {blob.size}"
            )
        data = buffer.getvalue()
        buffer.close()
        if native.digest_hex(data) != blob.digest:
            raise ArchiveError(f"{label}: the reassembled state does not match its digest")
        return data

    def states(self) -> Iterator[tuple[ArchivedCheckpoint, bytes]]:
        for cp in self.manifest.checkpoints:
            yield cp, self.state(cp)


def _check_plain(name: str, member: tarfile.TarInfo) -> None:
    if not member.isreg():
        raise ArchiveError(f"{name} is not a regular file")
    if member.issparse():
        # Its size is mostly holes: a few bytes on disk read as gigabytes of zeros.
        raise ArchiveError(f"{name} is a sparse file ({member.size} bytes)")


class _ClampedFile(io.FileIO):
    """A file opened for reading whose reads never ask for more than is left of it.

    tarfile reads a PAX or GNU long-name header with one ``read`` of the size
    the header claims, and Python allocates that size before reading: clamped,
    a forged header costs at most the archive's own size.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, "rb")
        self._size = os.fstat(self.fileno()).st_size

    def read(self, size: int | None = -1, /) -> bytes:
        left = max(0, self._size - self.tell())
        if size is None or size < 0 or size > left:
            size = left
        return super().read(size) or b""


def _parse_manifest(raw: Any) -> Manifest:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"format is not {FORMAT!r}")
    if raw.get("format_version") not in READABLE_VERSIONS:
        raise ValueError(
            f"format_version {raw.get('format_version')!r} is not supported "
            f"(this stratad reads versions {', '.join(map(str, READABLE_VERSIONS))})"
        )
    s = raw["session"]
    retention = s.get("retention") or {}
    session = ArchivedSession(
        session_id=_str(s["session_id"]),
        status=_str(s.get("status", "")),
        labels={_str(k): _str(v) for k, v in _dict(s.get("labels", {})).items()},
        keep_last=_int(retention.get("keep_last", 0)),
        max_age_seconds=float(retention.get("max_age_seconds", 0.0)),
        head_checkpoint_id=_str(s.get("head_checkpoint_id", "")),
        forked_from_checkpoint_id=_str(s.get("forked_from_checkpoint_id", "")),
        created_at=_str(s.get("created_at", "")),
        version=_int(s.get("version", 0)),
        structured=_blob_or_none(s.get("structured")),
    )
    entries = {}
    for name, entry in _dict(raw["entries"]).items():
        digest = _str(entry["blake3"])
        if not _HEX64.fullmatch(digest):
            raise ValueError(f"entry {name}: blake3 is not 64 lowercase hex characters")
        entries[_str(name)] = (_int(entry["size"]), digest)
    checkpoints = []
    seen = set()
    for c in raw["checkpoints"]:
        cp = ArchivedCheckpoint(
            checkpoint_id=_str(c["checkpoint_id"]),
            parent_checkpoint_id=_str(c.get("parent_checkpoint_id", "")),
            namespace=_str(c.get("namespace", "")),
            name=_str(c.get("name", "")),
            content_type=_str(c.get("content_type", "")),
            metadata=_dict(c.get("metadata", {})),
            created_at=_str(c.get("created_at", "")),
            version=_int(c.get("version", 0)),
            size=_int(c["size"]),
            digest=_str(c["digest"]),
            chunks=[_str(d) for d in c["chunks"]],
            pending_writes=[_write(w) for w in c.get("pending_writes", [])],
            structured=_blob_or_none(c.get("structured")),
        )
        if cp.checkpoint_id in seen:
            raise ValueError(f"checkpoint {cp.checkpoint_id} is listed twice")
        seen.add(cp.checkpoint_id)
        if not all(_well_formed(blob) for _, blob in cp.blobs()):
            raise ValueError(f"checkpoint {cp.checkpoint_id}: a digest is malformed")
        checkpoints.append(cp)
    if session.structured is not None and not _well_formed(session.structured):
        raise ValueError("the session's structured state: a digest is malformed")
    source = {_str(k): _str(v) for k, v in _dict(raw.get("source", {})).items()}
    return Manifest(
        session=session,
        checkpoints=checkpoints,
        entries=entries,
        created_at=_str(raw.get("created_at", "")),
        stratad_version=_str(raw.get("stratad_version", "")),
        source=source,
    )


def _blob(raw: Any) -> ArchivedBlob:
    raw = _dict(raw)
    return ArchivedBlob(
        size=_int(raw["size"]),
        digest=_str(raw["digest"]),
        chunks=[_str(d) for d in raw["chunks"]],
    )


def _blob_or_none(raw: Any) -> ArchivedBlob | None:
    return None if raw is None else _blob(raw)


def _write(raw: Any) -> ArchivedWrite:
    raw = _dict(raw)
    idx = raw["idx"]
    if isinstance(idx, bool) or not isinstance(idx, int) or not -(2**31) <= idx < 2**31:
        raise TypeError(f"expected a 32-bit integer idx, got {idx!r}")
    return ArchivedWrite(
        task_id=_str(raw["task_id"]),
        task_path=_str(raw.get("task_path", "")),
        idx=idx,
        channel=_str(raw["channel"]),
        type=_str(raw.get("type", "")),
        value=_blob(raw),
    )


def _well_formed(blob: ArchivedBlob) -> bool:
    return bool(_HEX64.fullmatch(blob.digest)) and all(_HEX64.fullmatch(d) for d in blob.chunks)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected a non-negative integer, got {value!r}")
    return value


def _dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {value!r}")
    return value


__all__ = [
    "DEFAULT_MAX_STATE_BYTES",
    "FORMAT",
    "FORMAT_VERSION",
    "MAX_MANIFEST_BYTES",
    "READABLE_VERSIONS",
    "ArchiveError",
    "ArchiveReader",
    "ArchiveWriter",
    "ArchivedBlob",
    "ArchivedCheckpoint",
    "ArchivedSession",
    "ArchivedWrite",
    "Manifest",
]
