"""Per-session append-only journal: the commit point of every mutation.

A mutation is acknowledged only after its record is in the journal (and, in
`fsync` durability mode, after an fsync that covers it). Records are
length-prefixed and checksummed so that a torn tail left by a crash is
detected and cut when the journal is reopened, while damage in the middle of
the file (bit rot, a bad disk) is reported rather than silently dropped.

Record layout on disk::

    u32 LE  payload length
    u32 LE  CRC-32 of the payload
    payload:
        u32 LE  body length
        body    UTF-8 JSON object (the record's fields; "k" is its kind), or
                that JSON as one zstd frame (it starts with the zstd magic
                28 B5 2F FD, which no JSON text does)
        blobs   repeated: u32 LE length, bytes  (e.g. framed objects carried inline)

A body of at least `COMPRESS_MIN_BYTES` is written compressed when that makes
it smaller (snapshots above all: a session's checkpoint list shrinks about
fivefold). Journals written before compression hold plain JSON bodies only;
they replay unchanged, and records of both kinds may follow each other.

With encryption at rest (store/crypto.py), the payload is sealed: b"STRJ",
a 96-bit nonce, then the AES-256-GCM ciphertext of the plaintext payload and
its tag. The length and CRC frame the sealed bytes, so torn tails and damage
are told apart exactly as without encryption.

Group commit: writers append under the session lock (cheap) and then call
`sync(offset)` outside it. One fsync covers every record appended before it
started, so concurrent writers share fsyncs instead of queueing one each.

Preallocation: an open journal keeps zero-filled space after its last record
and writes each record into it. An fdatasync that only overwrites blocks the
file already has needs no filesystem metadata commit (on ext4, no journal
transaction for the file's new size): append + fdatasync of a 700-byte
record took 124 µs instead of 186 on this project's test machine, of an 8 KB
one 127 µs instead of 261 (`bench/journal_fsync.py`). The space is cut
off when the journal is closed (unless its file was replaced or is being
removed); after a crash, recovery finds the zeros
where the records end and cuts them as it cuts a torn tail (see
`ReplayResult.zero_tail`), so a file with a zero tail never reaches an old or
new reader as data.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from stratad import native, tracing
from stratad.errors import DataLossError, ResourceExhaustedError, StratadError
from stratad.store.crypto import RECORD_MAGIC, RecordCipher, SealError
from stratad.store.failstop import FailStop
from stratad.store.fsync import FILE_MODE, fsync_dir

_HEADER = struct.Struct("<II")
_U32 = struct.Struct("<I")
#: A record larger than this is corruption, not data (the daemon's own
#: message-size limit is far below it).
MAX_RECORD_BYTES = 1 << 30
#: The first bytes of every zstd frame: a body starting with them is compressed.
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Bodies shorter than this stay plain JSON: zstd's frame header and the
#: compressor's start-up would eat what it saves on them.
COMPRESS_MIN_BYTES = 256
#: The largest body written compressed, and the cap on what a compressed body
#: may decompress to: a larger claim is corruption, never allocated. (Larger
#: bodies are written plain: MAX_RECORD_BYTES bounds them.)
MAX_COMPRESSED_BODY_BYTES = 256 << 20
#: zstd level of record bodies. Level 1 beats 3 on them (not only in speed):
#: they are mostly hex digests and IDs, where level 3's longer searches find
#: nothing more (a 2,000-checkpoint snapshot: 192 KB at level 1, 216 KB at 3).
COMPRESS_LEVEL = 1
#: Preallocation (module doc): the zero-filled space kept after the last
#: record grows by this fraction of the journal's size, at least to the end of
#: the filesystem block (which the file occupies anyway) and by at most
#: PREALLOCATE_MAX_BYTES. So a small journal keeps at most one block of zeros
#: and a large one at most 1/8 more; a 150 KB session journal extends about
#: once every 25 saves of the reference workload (~700-byte records).
PREALLOCATE_FRACTION = 8
PREALLOCATE_BLOCK = 4096
PREALLOCATE_MAX_BYTES = 1 << 20
#: Called as ``observer(journal_path, seconds)`` after every journal fsync
#: (the daemon's metrics register one).
FSYNC_OBSERVERS: list[Callable[[Path, float], None]] = []


@dataclass
class Record:
    """One journal record: a kind, a JSON body and optional binary blobs."""

    kind: str
    body: dict[str, Any] = field(default_factory=dict)
    blobs: list[bytes] = field(default_factory=list)

    def encode(self, cipher: RecordCipher | None = None) -> bytes:
        return b"".join(self.pieces(cipher))

    def pieces(self, cipher: RecordCipher | None = None) -> list[bytes]:
        """The encoded record as consecutive pieces: the header, then the payload's.

        A save's record carries its new chunks, up to the largest state:
        writing the pieces (pwritev) saves joining them into one more copy.
        `Journal.append` writes these: a subclass that overrides `encode`
        overrides this too. With a `cipher`, the payload is one sealed piece.
        """
        body = encode_body({"k": self.kind, **self.body})
        parts = [_U32.pack(len(body)), body]
        for blob in self.blobs:
            parts.append(_U32.pack(len(blob)))
            parts.append(blob)
        if cipher is not None:
            parts = [cipher.seal(b"".join(parts))]
        length, crc = 0, 0
        for part in parts:
            length += len(part)
            crc = zlib.crc32(part, crc)
        return [_HEADER.pack(length, crc), *parts]

    @classmethod
    def decode_payload(cls, payload: bytes) -> Record:
        (body_len,) = _U32.unpack_from(payload, 0)
        pos = 4 + body_len
        if pos > len(payload):
            raise ValueError("the body length overruns the payload")
        body = decode_body(payload[4:pos])
        blobs = []
        while pos < len(payload):
            (n,) = _U32.unpack_from(payload, pos)
            pos += 4
            blobs.append(payload[pos : pos + n])
            pos += n
        if pos != len(payload):
            raise ValueError("blob lengths overrun the payload")
        kind = body.pop("k")
        return cls(kind=kind, body=body, blobs=blobs)


#: The standard library's encoder, for what orjson does not take (below).
_BODY_JSON = json.JSONEncoder(separators=(",", ":"))


def dumps(fields: dict[str, Any]) -> bytes:
    """A body's JSON. orjson writes it ~15x faster than the standard library (a
    1,300-checkpoint session snapshot: 0.17 ms against 2.9 ms), which matters
    on every journaled call; what orjson refuses (integers beyond 64 bits,
    non-string keys, strings that are not valid UTF-8) goes to the standard
    library's encoder, which takes them. NaN and infinities never get here: the
    API refuses them (stratad/values.py)."""
    try:
        return orjson.dumps(fields)
    except orjson.JSONEncodeError:
        return _BODY_JSON.encode(fields).encode()


def loads(data: bytes) -> Any:
    """JSON that `dumps` wrote, or any earlier version (standard library
    output that orjson does not read, such as a lone surrogate escape, falls
    back to the standard library; a ValueError if neither reads it)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def encode_body(fields: dict[str, Any]) -> bytes:
    """A record's body as stored: its JSON, compressed when that pays (see the module doc)."""
    text = dumps(fields)
    if COMPRESS_MIN_BYTES <= len(text) <= MAX_COMPRESSED_BODY_BYTES:
        packed = native.compress(text, COMPRESS_LEVEL)
        if len(packed) < len(text):
            return packed
    return text


def decode_body(data: bytes) -> dict[str, Any]:
    """The fields of a stored body, plain JSON (every version) or compressed.

    Raises ValueError when it does not decode: bad JSON, a bad zstd frame, or
    one that claims more than MAX_COMPRESSED_BODY_BYTES.
    """
    if data[:4] == ZSTD_MAGIC:
        try:
            data = native.decompress(data, MAX_COMPRESSED_BODY_BYTES)
        except StratadError as exc:  # CorruptObjectError, DecompressionLimitError
            raise ValueError(f"a compressed record body does not decompress: {exc}") from None
    fields = loads(data)
    if not isinstance(fields, dict):
        raise ValueError("a record body is not a JSON object")
    return fields


def seal_record(data: bytes, cipher: RecordCipher | None) -> bytes:
    """An encoded plaintext record as a journal with `cipher` stores it (as is without one).

    Crystal and profile records travel between daemons in plaintext inside
    object-storage segments that are sealed as a whole (store/remote.py); each
    daemon seals them for its own journal.
    """
    if cipher is None:
        return data
    (length, _) = _HEADER.unpack_from(data, 0)
    sealed = cipher.seal(data[_HEADER.size : _HEADER.size + length])
    return _HEADER.pack(len(sealed), zlib.crc32(sealed)) + sealed


def open_record(data: bytes, cipher: RecordCipher | None) -> bytes:
    """The plaintext encoding of a record a journal with `cipher` stored (see seal_record)."""
    if cipher is None:
        return data
    (length, _) = _HEADER.unpack_from(data, 0)
    try:
        payload = cipher.open(data[_HEADER.size : _HEADER.size + length])
    except SealError as exc:
        raise RecordSealError(exc.message) from None
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class JournalCorruptError(DataLossError):
    """A record in the middle of a journal failed its checksum."""


class RecordSealError(DataLossError):
    """A record's checksum holds but it does not open with the journal's key (or is
    plaintext in an encrypted journal): damage or tampering, never a torn write."""


@dataclass
class ReplayResult:
    records: list[Record]
    valid_bytes: int
    torn_bytes: int
    corrupt_at: int | None = None
    #: Where the first record ends (its size on disk); 0 without records.
    first_end: int = 0
    #: The bytes after the last record are all zeros: preallocated space a
    #: crash left (or blocks a power loss left unwritten), not a torn record.
    zero_tail: bool = False


def read_records(path: Path, cipher: RecordCipher | None = None) -> ReplayResult:
    """Read every valid record; classify what follows the last one.

    A bad record that runs to the end of the file is a torn tail (a write the
    crash interrupted, never acknowledged). A bad record followed by more
    bytes is corruption of acknowledged data: `corrupt_at` is set and the
    records before it are returned. A record whose checksum holds but which
    does not open with `cipher` (encrypted journals) is corruption too.
    """
    return parse_records(path.read_bytes(), cipher)


def parse_records(data: bytes, cipher: RecordCipher | None = None) -> ReplayResult:
    """`read_records` of journal bytes held in memory (e.g. a replicated segment)."""
    records: list[Record] = []
    pos = first_end = 0
    while pos < len(data):
        try:
            found = _read_record(data, pos, cipher)
        except RecordSealError:
            return ReplayResult(records, pos, 0, corrupt_at=pos, first_end=first_end)
        if found is None:
            break
        record, pos = found
        records.append(record)
        first_end = first_end or pos
    rest = len(data) - pos
    if rest and not _is_torn_tail(data, pos, cipher):
        return ReplayResult(records, pos, 0, corrupt_at=pos, first_end=first_end)
    zero_tail = bool(rest) and _is_zeros(data, pos)
    return ReplayResult(records, pos, rest, first_end=first_end, zero_tail=zero_tail)


def _is_zeros(data: bytes, start: int) -> bool:
    """Whether every byte of `data` from `start` on is zero (at C speed)."""
    return data.count(0, start) == len(data) - start


def _read_record(
    data: bytes, pos: int, cipher: RecordCipher | None = None
) -> tuple[Record, int] | None:
    """The valid record starting at `pos` and the offset after it, or None.

    Raises RecordSealError when the record is framed correctly (length and
    CRC hold) but is not a record of this journal's kind: sealed for another
    journal or key, plaintext where records are encrypted, or the reverse.
    """
    if len(data) - pos < _HEADER.size:
        return None
    length, crc = _HEADER.unpack_from(data, pos)
    end: int = pos + _HEADER.size + length
    if length < 4 or length > MAX_RECORD_BYTES or end > len(data):
        return None
    payload = data[pos + _HEADER.size : end]
    if zlib.crc32(payload) != crc:
        return None
    if cipher is not None:
        try:
            payload = cipher.open(payload)
        except SealError as exc:
            raise RecordSealError(exc.message) from None
    elif payload[:4] == RECORD_MAGIC:
        raise RecordSealError("an encrypted record where records are plaintext (no key)")
    try:
        return Record.decode_payload(payload), end
    except (ValueError, KeyError, struct.error):
        if cipher is not None:  # authentic yet undecodable: not a torn write
            raise RecordSealError("an authentic record that does not decode") from None
        return None


#: Every record's body starts with one of these: its JSON starts with its
#: kind, a compressed one with the zstd magic. A record starts this many bytes
#: before them (header + body length). Used to find record starts.
_BODY_STARTS = (b'{"k":"', ZSTD_MAGIC)
_BODY_OFFSET = _HEADER.size + _U32.size


def _is_torn_tail(data: bytes, pos: int, cipher: RecordCipher | None = None) -> bool:
    """True when the invalid bytes at `pos` can only be an interrupted append.

    An append writes one record at the end; a crash can leave any prefix of
    it, or its length with unwritten (zero) or garbage content. What it cannot
    leave is valid records *after* the bad bytes: if they exist (running to
    the end of the file, or to a torn tail of their own), later writes follow
    the bad spot, so it is damage (a flipped bit in a length or a payload),
    reported rather than cut. One exception: bad bytes that are all zeros are
    blocks a power loss left unwritten; what follows them was never fsynced,
    so never acknowledged in `fsync` mode, and is cut with them.

    Candidate record starts are found with bytes.find (C speed) on what every
    record body starts with (the seal's magic in encrypted journals), so the
    cost grows with the tail's length, not with its square.
    """
    markers, offset = ((RECORD_MAGIC,), _HEADER.size) if cipher else (_BODY_STARTS, _BODY_OFFSET)
    for start in _candidate_starts(data, pos + 1 + offset, markers, offset):
        end = _valid_run_end(data, start, cipher)
        if end is not None and (end == len(data) or _is_torn_tail(data, end, cipher)):
            return not any(data[pos:start])
    return True


def _candidate_starts(
    data: bytes, search: int, markers: tuple[bytes, ...], offset: int
) -> Iterator[int]:
    """Where records may start, in order: `offset` bytes before each marker at or after `search`."""
    hits = {marker: data.find(marker, search) for marker in markers}
    while True:
        live = [(hit, marker) for marker, hit in hits.items() if hit >= 0]
        if not live:
            return
        hit, marker = min(live)
        yield hit - offset
        hits[marker] = data.find(marker, hit + 1)


def _valid_run_end(data: bytes, start: int, cipher: RecordCipher | None) -> int | None:
    """Where the run of valid records starting at `start` ends (None: not one).

    A record that is framed correctly but fails to open still counts: it is
    evidence of writes after the bad spot, which makes the spot damage.
    """
    end = None
    while True:
        try:
            found = _read_record(data, start, cipher)
        except RecordSealError:  # framed (length and CRC hold): skip over it
            start = end = start + _HEADER.size + _HEADER.unpack_from(data, start)[0]
            continue
        if found is None:
            return end
        start = end = found[1]


class SizeTally:
    """The total size of a set of open journals (a tenant's sessions), kept as it changes."""

    def __init__(self) -> None:
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(self, n: int) -> None:
        with self._lock:
            self._bytes += n


class Journal:
    """An open journal file; thread-safe appends and group-committed syncs.

    With a `SizeTally`, the journal counts in it while it is open: its size
    when opened, every append, minus its size when closed (a compaction
    opens the new file before closing the old one; a deletion closes it).

    With `preallocate`, records are written into zero-filled space kept after
    the last one (module doc). The file must end with its last record when
    opened: recovery cuts a crash's zero tail before any journal is opened,
    and a record appended after zeros would be cut with them by the next
    recovery.
    """

    def __init__(
        self,
        path: Path,
        *,
        durable: bool,
        fail_stop: FailStop | None = None,
        tally: SizeTally | None = None,
        cipher: RecordCipher | None = None,
        preallocate: bool = False,
    ) -> None:
        self.path = path
        #: Seals every record appended (encryption at rest); None: plaintext.
        self.cipher = cipher
        self._durable = durable
        # A failed fsync stops every journal of the data directory (failstop.py).
        self._fail_stop = fail_stop or FailStop()
        # Records go to explicit offsets (pwritev), not O_APPEND: with
        # preallocation the file's end is past the last record.
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
        self._size = os.fstat(self._fd).st_size
        #: The file's size: records end at `_size`, zeros fill the rest.
        self._allocated = self._size
        self._preallocate = preallocate
        self._synced = self._size
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._tally = tally
        if tally is not None:
            tally.add(self._size)

    @property
    def size(self) -> int:
        return self._size

    @property
    def fail_stop(self) -> FailStop:
        return self._fail_stop

    @property
    def dirty(self) -> bool:
        return self._synced < self._size

    def append(self, record: Record) -> int:
        """Append one record (not yet synced); return the offset after it."""
        pieces = record.pieces(self.cipher)
        size = sum(len(piece) for piece in pieces)
        self._fail_stop.check_writable()
        with tracing.span("stratad.journal.append", {"stratad.bytes": size}), self._append_lock:
            start = self._size
            padding = self._padding(start + size)
            try:
                if padding:
                    _write_pieces(self._fd, [*pieces, bytes(padding)], size + padding, start)
                    self._allocated = start + size + padding
                else:
                    _write_pieces(self._fd, pieces, size, start)
            except OSError as exc:
                # Never leave a partial record behind a later good one.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
                    self._allocated = start
                raise storage_error(exc, "journal append") from exc
            self._size = start + size
            if self._tally is not None:
                self._tally.add(size)
            return self._size

    def _padding(self, end: int) -> int:
        """Zeros to write after a record ending at `end`: none while it fits the
        preallocated space, else enough for the next ones (PREALLOCATE_*)."""
        if not self._preallocate or end <= self._allocated:
            return 0
        ahead = min(end // PREALLOCATE_FRACTION, PREALLOCATE_MAX_BYTES)
        block_end = -(-(end + ahead) // PREALLOCATE_BLOCK) * PREALLOCATE_BLOCK
        return block_end - end

    def sync(self, upto: int | None = None) -> None:
        """Make every record before `upto` durable, sharing fsyncs (group commit)."""
        if self._durable:
            self._fsync_upto(self._size if upto is None else upto)

    def needs_sync(self, upto: int) -> bool:
        return self._durable and self._synced < upto

    def mark_synced(self, upto: int) -> None:
        """Record that bytes before `upto` were made durable by other means (syncfs)."""
        with self._sync_lock:
            self._synced = max(self._synced, upto)

    def sync_now(self) -> None:
        """fsync whatever was appended, whatever the durability mode (interval syncer)."""
        self._fsync_upto(self._size)

    def _fsync_upto(self, target: int) -> None:
        if self._synced >= target:
            return
        with self._sync_lock:
            if self._synced >= target:
                return  # another writer's fsync covered us while we waited
            end = self._size
            started = time.perf_counter()
            self._fail_stop.check()  # never report durable what a failed fsync may have lost
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                raise self._fail_stop.trip(f"fsync of {self.path}", exc) from exc
            self._synced = max(self._synced, end)
            for observe in FSYNC_OBSERVERS:
                observe(self.path, time.perf_counter() - started)

    def close(self, *, trim: bool = True) -> None:
        """Close the file; with `trim`, cut its preallocated zeros first. A
        journal whose file was replaced (compaction) or is being removed is
        closed without: cutting it would be filesystem work for nothing."""
        with self._append_lock:
            tally, self._tally = self._tally, None  # counted out once, however often closed
            # Closed once too: a second os.close of the number would close
            # whatever file was opened under it since (another journal, a pack).
            fd, self._fd = self._fd, -1
        if tally is not None:
            tally.add(-self._size)
        if fd >= 0:
            with contextlib.suppress(OSError):
                if trim and self._allocated > self._size:  # it ends with its last record again
                    os.ftruncate(fd, self._size)
            with contextlib.suppress(OSError):
                os.close(fd)


def truncate(path: Path, size: int) -> None:
    """Cut a torn tail (durably) so later appends follow the last good record."""
    with open(path, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())


def rewrite(
    path: Path,
    records: Iterator[Record] | list[Record],
    fail_stop: FailStop | None = None,
    cipher: RecordCipher | None = None,
) -> None:
    """Atomically replace a journal with `records` (compaction).

    A write error (disk full) leaves the old journal in place; a failed fsync
    trips `fail_stop` (what the disk holds is unknown from then on).
    """
    tmp = path.with_name(path.name + ".tmp")
    fail_stop = fail_stop or FailStop()
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            for record in records:
                _write_all(fd, record.encode(cipher))
            fsync_or_trip(fd, tmp, fail_stop)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise storage_error(exc, "journal compaction") from exc
    fsync_dir_or_trip(path.parent, fail_stop)


def fsync_or_trip(fd: int, path: Path, fail_stop: FailStop) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise fail_stop.trip(f"fsync of {path}", exc) from exc


def fsync_dir_or_trip(path: Path, fail_stop: FailStop) -> None:
    """Make a directory's entries (new, renamed or removed files) durable."""
    try:
        fsync_dir(path)
    except OSError as exc:
        raise fail_stop.trip(f"fsync of directory {path}", exc) from exc


#: Buffers one pwritev may take (POSIX guarantees at least 16; Linux has 1024).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16


def _write_pieces(fd: int, pieces: list[bytes], size: int, offset: int) -> None:
    """Write the pieces (`size` bytes in all) in order at `offset` with pwritev."""
    # One pwritev of the pieces as they are almost always writes them all: the
    # views that resume after a short write are built only when one happens.
    written = os.pwritev(fd, pieces, offset) if len(pieces) <= _IOV_MAX else 0
    if written < size:
        _write_after(fd, pieces, written, offset)


def _write_after(fd: int, pieces: list[bytes], written: int, offset: int) -> None:
    """Write the pieces at `offset` but their first `written` bytes, resuming
    after short writes."""
    views = collections.deque(memoryview(piece) for piece in pieces if piece)
    position = offset + written
    while True:
        while written:
            if written >= len(views[0]):
                written -= len(views.popleft())
            else:
                views[0] = views[0][written:]
                written = 0
        if not views:
            return
        written = os.pwritev(fd, list(itertools.islice(views, _IOV_MAX)), position)
        position += written


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def storage_error(exc: OSError, what: str) -> StratadError:
    """Map an OS error during a write to the status a client should see."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhaustedError(f"disk full during {what}; nothing was written")
    return StratadError(f"storage error during {what}: {exc.strerror}")
