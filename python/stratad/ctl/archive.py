"""The portable session archive of ``stratad ctl export`` / ``import``.

An archive is a plain (uncompressed) tar file holding:

    MANIFEST.json          the session, its checkpoints oldest first, and every entry
    MANIFEST.json.blake3   lowercase hex BLAKE3 of MANIFEST.json
    chunks/<blake3>.zst    one content-defined chunk of state, zstd-compressed

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
from stratad.errors import DataLossError

FORMAT = "stratad-session-archive"
FORMAT_VERSION = 1
MANIFEST = "MANIFEST.json"
MANIFEST_DIGEST = "MANIFEST.json.blake3"
CHUNK_DIR = "chunks/"
#: No chunk of an archive decompresses to more than this (FastCDC's maximum is 32 KiB).
MAX_CHUNK_BYTES = 4 << 20
#: A manifest larger than this is not one stratad wrote.
MAX_MANIFEST_BYTES = 1 << 30
#: Decompressed chunks kept in memory while reassembling states.
CHUNK_CACHE_BYTES = 256 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CHUNK_NAME = re.compile(r"chunks/([0-9a-f]{64})\.zst")


class ArchiveError(DataLossError):
    """The archive is damaged, incomplete or not a stratad session archive."""


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

    def to_json(self) -> dict[str, Any]:
        return {
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

    def to_json(self) -> dict[str, Any]:
        return {
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
        """Store ``data`` (the checkpoint's state) as chunks the archive lacks."""
        if native.digest_hex(data) != checkpoint.digest or len(data) != checkpoint.size:
            raise DataLossError(
                f"checkpoint {checkpoint.checkpoint_id}: the state read does not match "
                "its recorded digest"
            )
        chunks = []
        for offset, length in native.chunk_boundaries(data) if data else []:
            piece = data[offset : offset + length]
            digest = native.digest_hex(piece)
            chunks.append(digest)
            name = chunk_entry(digest)
            if name not in self.manifest.entries:
                self._add(name, native.compress(piece))
        checkpoint.chunks = chunks
        self.manifest.checkpoints.append(checkpoint)

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
    """An archive opened for import; `verify` must pass before `states` is used."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._tar = tarfile.open(path, mode="r:")  # noqa: SIM115 (closed by close())
            self._members = {m.name: m for m in self._tar.getmembers()}
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise ArchiveError(f"{path} is not a readable tar archive: {exc}") from None
        self.manifest = self._read_manifest()
        self._cache: dict[str, bytes] = {}
        self._cache_bytes = 0

    def close(self) -> None:
        self._tar.close()

    def __enter__(self) -> ArchiveReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _member_bytes(self, name: str, limit: int) -> bytes:
        member = self._members.get(name)
        if member is None:
            raise ArchiveError(f"the archive has no {name}")
        if not member.isreg():
            raise ArchiveError(f"{name} is not a regular file")
        if member.size > limit:
            raise ArchiveError(f"{name} is larger than {limit} bytes")
        try:
            f = self._tar.extractfile(member)
            assert f is not None
            data = f.read()
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

        ``progress``, if given, is called as ``progress(done, total)`` per entry.
        """
        listed = self.manifest.entries
        expected = set(listed) | {MANIFEST, MANIFEST_DIGEST}
        for name, member in self._members.items():
            if name not in expected:
                raise ArchiveError(f"unexpected entry {name!r} in the archive")
            if not member.isreg():
                raise ArchiveError(f"{name} is not a regular file")
        total = len(listed) + len(self.manifest.checkpoints)
        done = 0
        for name, (size, digest) in sorted(listed.items()):
            match = _CHUNK_NAME.fullmatch(name)
            if match is None:
                raise ArchiveError(f"unexpected entry {name!r} in the manifest")
            stored = self._member_bytes(name, size)
            if len(stored) != size:
                raise ArchiveError(f"{name}: {len(stored)} bytes, the manifest says {size}")
            if native.digest_hex(stored) != digest:
                raise ArchiveError(f"{name} does not match its BLAKE3 digest")
            self._decode_chunk(match.group(1), stored)
            done += 1
            if progress is not None:
                progress(done, total)
        for cp in self.manifest.checkpoints:
            for digest in cp.chunks:
                if chunk_entry(digest) not in listed:
                    raise ArchiveError(f"checkpoint {cp.checkpoint_id}: chunk {digest} is missing")
            self.state(cp)
            done += 1
            if progress is not None:
                progress(done, total)

    def _decode_chunk(self, digest: str, stored: bytes) -> bytes:
        try:
            data = native.decompress(stored, MAX_CHUNK_BYTES)
        except Exception as exc:
            raise ArchiveError(f"chunk {digest} does not decompress: {exc}") from None
        if native.digest_hex(data) != digest:
            raise ArchiveError(f"chunk {digest} does not match its BLAKE3 digest")
        return data

    def _chunk(self, digest: str) -> bytes:
        data = self._cache.get(digest)
        if data is None:
            name = chunk_entry(digest)
            size, _ = self.manifest.entries[name]
            data = self._decode_chunk(digest, self._member_bytes(name, size))
            if self._cache_bytes + len(data) > CHUNK_CACHE_BYTES:
                self._cache.clear()
                self._cache_bytes = 0
            self._cache[digest] = data
            self._cache_bytes += len(data)
        return data

    def state(self, cp: ArchivedCheckpoint) -> bytes:
        """The checkpoint's state, reassembled and checked against its size and digest."""
        data = b"".join(self._chunk(d) for d in cp.chunks)
        if len(data) != cp.size or native.digest_hex(data) != cp.digest:
            raise ArchiveError(
                f"checkpoint {cp.checkpoint_id}: the reassembled state does not match its digest"
            )
        return data

    def states(self) -> Iterator[tuple[ArchivedCheckpoint, bytes]]:
        for cp in self.manifest.checkpoints:
            yield cp, self.state(cp)


def _parse_manifest(raw: Any) -> Manifest:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"format is not {FORMAT!r}")
    if raw.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"format_version {raw.get('format_version')!r} is not supported "
            f"(this stratad reads version {FORMAT_VERSION})"
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
        )
        if cp.checkpoint_id in seen:
            raise ValueError(f"checkpoint {cp.checkpoint_id} is listed twice")
        seen.add(cp.checkpoint_id)
        if not _HEX64.fullmatch(cp.digest) or not all(_HEX64.fullmatch(d) for d in cp.chunks):
            raise ValueError(f"checkpoint {cp.checkpoint_id}: a digest is malformed")
        checkpoints.append(cp)
    source = {_str(k): _str(v) for k, v in _dict(raw.get("source", {})).items()}
    return Manifest(
        session=session,
        checkpoints=checkpoints,
        entries=entries,
        created_at=_str(raw.get("created_at", "")),
        stratad_version=_str(raw.get("stratad_version", "")),
        source=source,
    )


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
    "FORMAT",
    "FORMAT_VERSION",
    "ArchiveError",
    "ArchiveReader",
    "ArchiveWriter",
    "ArchivedCheckpoint",
    "ArchivedSession",
    "Manifest",
]
