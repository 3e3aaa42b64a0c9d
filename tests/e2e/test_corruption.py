"""Damage on disk, found at start-up or on read (docs/storage.md is the contract).

Each test saves states through a ``stratad serve`` subprocess, stops it,
damages the data directory the way a bad disk or a crash would, restarts the
daemon on it and checks what clients see:

- a damaged or truncated object is DATA_LOSS for the checkpoints that use it
  (never data), other checkpoints and sessions load, and Verify names the
  object and the sessions it affects; while a journal still carries the
  object's copy, start-up recovery rewrites it instead;
- a torn journal tail (what an interrupted append leaves) is cut at start and
  every acknowledged checkpoint is served; damage in the middle of a journal
  makes that session DATA_LOSS, leaves the others alone, and Verify lists it;
- leftover temporary files are removed at start.

Every test runs twice: on a plaintext data directory and with encryption at
rest on (docs/security.md), where object files and journal payloads are
sealed with AES-256-GCM and the helpers below open them with the test's key.

The tests know where things are from the documented layout alone: objects are
``<data>/tenants/<tenant>/objects/<2 hex>/<62 hex>`` named by the BLAKE3 of
their content, and states are cut into chunks by FastCDC with the defaults
(`stratad.native.chunk_boundaries`); random bytes do not compress, so their
objects are stored raw and any flipped payload byte changes their content.
"""

from __future__ import annotations

import json
import random
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import zstandard

import stratad
from stratad import native
from stratad.errors import DataLossError
from stratad.store import crypto
from stratad.store.objects import ENTRY, find_on_disk, pack_entries

DEFAULT_TENANT = "default"
#: Object frame header (docs/native.md): magic, version, codec, flags, length,
#: digest, header check.
FRAME_HEADER_BYTES = 52
#: A journal larger than this is compacted after the save that grows it past
#: it (docs/storage.md), dropping the inline copies of the objects.
COMPACTION_THRESHOLD = 128 << 10
COMPACTION_TIMEOUT = 60.0

_RECORD_HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a compressed record body starts with it
_U32 = struct.Struct("<I")


class Daemon(Protocol):
    """What these tests use of the e2e conftest's ``Daemon``."""

    target: str
    data_dir: Path

    def stop(self, timeout: float = 30.0) -> int: ...
    def output(self) -> str: ...


StartDaemon = Callable[..., Daemon]

#: The master key of the encrypted runs (64 hex digits).
ENCRYPTION_KEY = "c3" * 32


@pytest.fixture(params=["plaintext", "encrypted"])
def start_daemon(request: pytest.FixtureRequest, start_daemon: StartDaemon) -> StartDaemon:
    """The e2e `start_daemon`, with encryption at rest on in the encrypted runs."""
    if request.param == "plaintext":
        return start_daemon
    env = {"STRATAD_ENCRYPTION": "on", "STRATAD_ENCRYPTION_KEY": ENCRYPTION_KEY}

    def start(*args: str, **options: Any) -> Daemon:
        return start_daemon(*args, env=env, **options)

    return start


def tenant_cipher(tenant_root: Path) -> crypto.TenantCipher:
    keyring = crypto.Keyring(crypto.parse_master_key(ENCRYPTION_KEY.encode(), "test"))
    return keyring.open_tenant(tenant_root, tenant_root.name)


def open_payload(path: Path, payload: bytes) -> bytes:
    """A journal record's payload, opened if it is sealed (encrypted runs)."""
    if payload[:4] != crypto.RECORD_MAGIC:
        return payload
    tenants = path.parents[3]
    cipher = tenant_cipher(path.parents[2]).records(path.relative_to(tenants).as_posix())
    return cipher.open(payload)


def object_frame(data_dir: Path, digest: str, tenant: str = DEFAULT_TENANT) -> bytes:
    """An object's frame as stored, opened if it is sealed (encrypted runs)."""
    stored = stored_object(data_dir, digest, tenant).read()
    if stored[:4] != crypto.OBJECT_MAGIC:
        return stored
    return tenant_cipher(data_dir / "tenants" / tenant).open_object(digest, stored)


# -- the documented on-disk layout ----------------------------------------------


def objects_root(data_dir: Path, tenant: str = DEFAULT_TENANT) -> Path:
    return data_dir / "tenants" / tenant / "objects"


@dataclass(frozen=True)
class StoredObject:
    """An object's frame on disk: `length` bytes at `offset` of a pack file."""

    path: Path
    offset: int
    length: int

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return f.read(self.length)

    def overwrite(self, at: int, data: bytes) -> None:
        """Write `data` at `at` bytes from the frame's start (negative: before it)."""
        with open(self.path, "r+b") as f:
            f.seek(self.offset + at)
            f.write(data)

    def flip(self, at: int) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset + at)
            byte = f.read(1)[0]
        self.overwrite(at, bytes([byte ^ 0xFF]))


def stored_object(data_dir: Path, digest: str, tenant: str = DEFAULT_TENANT) -> StoredObject:
    found = find_on_disk(objects_root(data_dir, tenant), digest)
    assert found is not None, f"object {digest} is not on disk"
    return StoredObject(*found)


def journal_path(data_dir: Path, session_id: str, tenant: str = DEFAULT_TENANT) -> Path:
    return data_dir / "tenants" / tenant / "sessions" / session_id / "journal"


def chunk_digests(data: bytes) -> list[str]:
    return [native.digest_hex(data[o : o + n]) for o, n in native.chunk_boundaries(data)]


@dataclass(frozen=True)
class JournalRecord:
    offset: int
    end: int
    kind: str


def read_journal(path: Path) -> list[JournalRecord]:
    """The valid records of a journal, up to the first invalid one."""
    data = path.read_bytes()
    records: list[JournalRecord] = []
    pos = 0
    while len(data) - pos >= _RECORD_HEADER.size:
        length, crc = _RECORD_HEADER.unpack_from(data, pos)
        end = pos + _RECORD_HEADER.size + length
        payload = data[pos + _RECORD_HEADER.size : end]
        if end > len(data) or length < _U32.size or zlib.crc32(payload) != crc:
            break
        payload = open_payload(path, payload)
        (body_length,) = _U32.unpack_from(payload)
        body = json.loads(record_body(payload[_U32.size : _U32.size + body_length]))
        records.append(JournalRecord(pos, end, str(body["k"])))
        pos = end
    return records


def record_body(stored: bytes) -> bytes:
    """A record body's JSON: stored as is, or as one zstd frame (docs/storage.md)."""
    if stored[:4] == ZSTD_MAGIC:
        return zstandard.ZstdDecompressor().decompress(stored)
    return stored


def encode_record(body: dict[str, Any], blobs: tuple[bytes, ...] = ()) -> bytes:
    """A journal record as docs/storage.md lays it out."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    payload = _U32.pack(len(raw)) + raw + b"".join(_U32.pack(len(b)) + b for b in blobs)
    return _RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def wait_for_compaction(path: Path, timeout: float = COMPACTION_TIMEOUT) -> None:
    """Wait (bounded) until the journal starts with a snapshot record."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_journal(path)
        if records and records[0].kind == "snapshot":
            return
        time.sleep(0.02)
    pytest.fail(f"{path} was not compacted within {timeout}s: {read_journal(path)[:3]}")


# -- saved states ---------------------------------------------------------------


@dataclass(frozen=True)
class Saved:
    session_id: str
    checkpoint_id: str
    data: bytes

    @property
    def digest(self) -> str:
        return native.digest_hex(self.data)


def save(client: stratad.Client, session_id: str, data: bytes) -> Saved:
    response = client.save_state(session_id, data)
    assert response.digest == native.digest_hex(data)
    return Saved(session_id, response.checkpoint_id, data)


def assert_loads(client: stratad.Client, saved: Saved) -> None:
    loaded = client.load_state(saved.session_id, checkpoint_id=saved.checkpoint_id)
    assert loaded.digest == saved.digest
    assert loaded.data == saved.data, f"{saved.checkpoint_id} came back different"


def assert_data_loss(client: stratad.Client, saved: Saved) -> None:
    with pytest.raises(DataLossError):
        response = client.load_state(saved.session_id, checkpoint_id=saved.checkpoint_id)
        pytest.fail(f"{saved.checkpoint_id} returned {len(response.data)} bytes, not DATA_LOSS")


def session_states(rng: random.Random, session_id: str) -> list[bytes]:
    """A small state (one chunk) and a multi-chunk one, random so stored raw.

    Together below COMPACTION_THRESHOLD: the journal keeps carrying them.
    """
    small, multi = rng.randbytes(1500), rng.randbytes(80_000)
    assert len(small) + len(multi) < COMPACTION_THRESHOLD * 3 // 4
    assert len(chunk_digests(small)) == 1 and len(chunk_digests(multi)) > 5
    return [small, multi]


@dataclass
class TwoSessions:
    """`victim` (whose data the test damages) and `bystander` (sharing no chunk)."""

    daemon: Daemon
    victim: list[Saved]
    bystander: list[Saved]


def save_two_sessions(start_daemon: StartDaemon, *, compact_victim: bool) -> TwoSessions:
    """Save small and multi-chunk states in two sessions, then stop the daemon.

    With `compact_victim`, a final large save makes the victim's journal
    compact, so that it no longer carries copies of the victim's objects.
    """
    rng = random.Random(20240611)
    daemon = start_daemon()
    saved: dict[str, list[Saved]] = {}
    with stratad.Client(daemon.target) as client:
        for session_id in ("victim", "bystander"):
            client.create_session(session_id)
            saved[session_id] = [
                save(client, session_id, d) for d in session_states(rng, session_id)
            ]
        if compact_victim:
            ballast = rng.randbytes(COMPACTION_THRESHOLD + (1 << 20))
            saved["victim"].append(save(client, "victim", ballast))
            wait_for_compaction(journal_path(daemon.data_dir, "victim"))
    assert daemon.stop() == 0, daemon.output()
    return TwoSessions(daemon, saved["victim"], saved["bystander"])


def restart(start_daemon: StartDaemon, stopped: Daemon) -> Daemon:
    return start_daemon(data_dir=stopped.data_dir)


# -- damaged objects ---------------------------------------------------------------

ObjectDamage = Callable[[StoredObject], None]


def flip_payload_byte(obj: StoredObject) -> None:
    obj.flip(FRAME_HEADER_BYTES + (obj.length - FRAME_HEADER_BYTES) // 2)


def flip_header_byte(obj: StoredObject) -> None:
    obj.flip(20)  # inside the frame header's digest field


def zero_second_half(obj: StoredObject) -> None:
    """Lost sectors: the frame's second half reads back as zeros."""
    obj.overwrite(obj.length // 2, bytes(obj.length - obj.length // 2))


def erase_entry_header(obj: StoredObject) -> None:
    """The pack entry's own header is destroyed: the object is gone from the index."""
    obj.overwrite(-ENTRY.size, bytes(ENTRY.size))


OBJECT_DAMAGE: dict[str, ObjectDamage] = {
    "flip-payload": flip_payload_byte,
    "flip-header": flip_header_byte,
    "zero-tail": zero_second_half,
    "erase-entry": erase_entry_header,
}


@pytest.mark.parametrize("damage", list(OBJECT_DAMAGE))
def test_damaged_object_is_data_loss_and_named_by_verify(
    start_daemon: StartDaemon, damage: str
) -> None:
    saved = save_two_sessions(start_daemon, compact_victim=True)
    small, multi, ballast = saved.victim
    data_dir = saved.daemon.data_dir
    multi_chunks = chunk_digests(multi.data)
    damaged = {small.digest, multi_chunks[len(multi_chunks) // 2]}
    # Find them all first: after an erased entry header, reading stops there.
    for obj in [stored_object(data_dir, digest) for digest in damaged]:
        OBJECT_DAMAGE[damage](obj)

    daemon = restart(start_daemon, saved.daemon)
    with stratad.Client(daemon.target) as client:
        assert_data_loss(client, small)
        assert_data_loss(client, multi)
        assert_loads(client, ballast)  # same session, no damaged object
        for unaffected in saved.bystander:
            assert_loads(client, unaffected)

        report = client.verify()
        assert not report.ok
        named = {c.digest: c for c in report.corrupt_objects}
        assert damaged <= named.keys(), f"Verify missed damaged objects: {report}"
        for digest in damaged:
            assert list(named[digest].session_ids) == ["victim"], named[digest]
            assert named[digest].problem
        assert not report.damaged_sessions

        # The session itself is sound: it takes new saves.
        assert_loads(client, save(client, "victim", b"a new state after the damage"))


def test_every_damaged_object_of_a_tenant_is_reported(start_daemon: StartDaemon) -> None:
    rng = random.Random(7)
    daemon = start_daemon()
    with (
        stratad.Client(daemon.target, tenant="damaged") as damaged_client,
        stratad.Client(daemon.target) as default_client,
    ):
        damaged_client.create_session("agent")
        default_client.create_session("agent")  # same ID, other tenant: no shared objects
        victim = [save(damaged_client, "agent", d) for d in session_states(rng, "agent")]
        victim.append(save(damaged_client, "agent", rng.randbytes(COMPACTION_THRESHOLD + 4096)))
        bystander = [save(default_client, "agent", d) for d in session_states(rng, "agent")]
        wait_for_compaction(journal_path(daemon.data_dir, "agent", tenant="damaged"))
    assert daemon.stop() == 0, daemon.output()

    packs = objects_root(daemon.data_dir, "damaged") / "packs"
    entries = list(pack_entries(packs))
    assert len(entries) > 10
    for path, offset, _, length in entries:
        flip_payload_byte(StoredObject(path, offset, length))
    damaged = {digest for _, _, digest, _ in entries}

    daemon = restart(start_daemon, daemon)
    with (
        stratad.Client(daemon.target, tenant="damaged") as damaged_client,
        stratad.Client(daemon.target) as default_client,
    ):
        for saved in victim:
            assert_data_loss(damaged_client, saved)
        for saved in bystander:
            assert_loads(default_client, saved)
        assert default_client.verify().ok

        report = damaged_client.verify()
        assert not report.ok
        assert report.objects_checked == len(damaged)
        assert {c.digest for c in report.corrupt_objects} == damaged
        # Each checkpoint's root (its chunk or manifest) names the session. A
        # chunk listed only by a damaged manifest cannot be traced to a
        # session, but it is never attributed to another one.
        named = {tuple(c.session_ids) for c in report.corrupt_objects}
        assert named <= {("agent",), ()}, named
        roots = [c for c in report.corrupt_objects if list(c.session_ids) == ["agent"]]
        assert len(roots) >= len(victim), report


def test_damaged_object_still_in_the_journal_is_repaired_at_start(
    start_daemon: StartDaemon,
) -> None:
    saved = save_two_sessions(start_daemon, compact_victim=False)
    small, multi = saved.victim
    data_dir = saved.daemon.data_dir
    targets = [small.digest, chunk_digests(multi.data)[1]]
    originals = {d: object_frame(data_dir, d) for d in targets}
    flip_payload_byte(stored_object(data_dir, targets[0]))
    zero_second_half(stored_object(data_dir, targets[1]))

    daemon = restart(start_daemon, saved.daemon)
    with stratad.Client(daemon.target) as client:
        for checkpoint in saved.victim + saved.bystander:
            assert_loads(client, checkpoint)
        report = client.verify()
        assert report.ok, report
    for digest, original in originals.items():
        assert object_frame(data_dir, digest) == original


# -- journals ----------------------------------------------------------------------


def partial_record(rng: random.Random) -> bytes:
    record = encode_record({"k": "save", "v": 99, "at": 0.0}, (rng.randbytes(4096),))
    return record[: len(record) * 2 // 3]


def unwritten_payload(rng: random.Random) -> bytes:
    """The header of a full-length append whose payload never reached the disk."""
    record = encode_record({"k": "save", "v": 99, "at": 0.0}, (rng.randbytes(4096),))
    return record[: _RECORD_HEADER.size] + bytes(len(record) - _RECORD_HEADER.size)


def short_header(rng: random.Random) -> bytes:
    return rng.randbytes(5)


def garbage_running_past_the_end(rng: random.Random) -> bytes:
    return _U32.pack(1 << 20) + rng.randbytes(200)


def garbage(rng: random.Random) -> bytes:
    """Random bytes whose would-be length field is larger than any record."""
    return bytes([0xA7, 0x3C, 0x91, 0xE2]) + rng.randbytes(200)


def zero_filled(rng: random.Random) -> bytes:
    """The file grew but none of the append's blocks were written."""
    return bytes(4096)


TORN_TAILS: dict[str, Callable[[random.Random], bytes]] = {
    "partial-record": partial_record,
    "unwritten-payload": unwritten_payload,
    "short-header": short_header,
    "garbage-running-past-the-end": garbage_running_past_the_end,
    "garbage": garbage,
    "zero-filled": zero_filled,
}


@pytest.mark.parametrize("tail", list(TORN_TAILS))
def test_torn_journal_tail_is_cut_and_acknowledged_saves_served(
    start_daemon: StartDaemon, tail: str
) -> None:
    saved = save_two_sessions(start_daemon, compact_victim=False)
    path = journal_path(saved.daemon.data_dir, "victim")
    good_size = path.stat().st_size
    with path.open("ab") as journal:
        journal.write(TORN_TAILS[tail](random.Random(tail)))

    daemon = restart(start_daemon, saved.daemon)
    assert path.stat().st_size == good_size, f"the torn tail was not cut back to {good_size} bytes"
    with stratad.Client(daemon.target) as client:
        for checkpoint in saved.victim + saved.bystander:
            assert_loads(client, checkpoint)
        report = client.verify()
        assert report.ok, report
        # Appends follow the last good record and survive another restart.
        after = save(client, "victim", b"saved after the tail was cut")
    assert daemon.stop() == 0, daemon.output()

    daemon = restart(start_daemon, daemon)
    with stratad.Client(daemon.target) as client:
        for checkpoint in [*saved.victim, after]:
            assert_loads(client, checkpoint)
        assert client.get_session("victim").version == len(saved.victim) + 2


def journal_damage_in_payload(path: Path, record: JournalRecord) -> None:
    flip_byte(path, (record.offset + _RECORD_HEADER.size + record.end) // 2)


def journal_damage_in_length(path: Path, record: JournalRecord) -> None:
    # One bit of the length's high byte: the record now claims 16 MiB more
    # than the file holds (still below any sanity limit on record sizes).
    data = bytearray(path.read_bytes())
    data[record.offset + 3] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["payload", "length"])
def test_journal_damaged_in_the_middle_is_data_loss_for_its_session(
    start_daemon: StartDaemon, where: str
) -> None:
    saved = save_two_sessions(start_daemon, compact_victim=False)
    path = journal_path(saved.daemon.data_dir, "victim")
    records = read_journal(path)
    size = path.stat().st_size
    assert [r.kind for r in records] == ["create", "save", "save"]
    damage = {"payload": journal_damage_in_payload, "length": journal_damage_in_length}[where]
    damage(path, records[1])  # the first save; the second follows it

    daemon = restart(start_daemon, saved.daemon)
    with stratad.Client(daemon.target) as client:
        for checkpoint in saved.bystander:
            assert_loads(client, checkpoint)
        for checkpoint in saved.victim:
            assert_data_loss(client, checkpoint)
        with pytest.raises(DataLossError):
            client.save_state("victim", b"not on top of damaged history")
        with pytest.raises(DataLossError):
            client.get_session("victim")
        bystander_after = save(client, "bystander", b"the other sessions work")
        assert_loads(client, bystander_after)

        report = client.verify()
        assert not report.ok
        assert [s.rsplit("/", 1)[-1] for s in report.damaged_sessions] == ["victim"], report
    assert path.stat().st_size == size, "a damaged journal must be kept as it is"


# -- leftovers ---------------------------------------------------------------------


def test_leftover_temporary_files_are_removed_at_start(start_daemon: StartDaemon) -> None:
    saved = save_two_sessions(start_daemon, compact_victim=False)
    data_dir = saved.daemon.data_dir
    objects_dir = objects_root(data_dir)
    a_digest = saved.victim[0].digest
    leftovers = [  # of the one-file-per-object layout, which is still read
        objects_dir / a_digest[:2] / (a_digest[2:] + ".tmp"),
        objects_dir / a_digest[:2] / (a_digest[2:] + ".12345.tmp"),
        objects_dir / "ff" / ("0" * 62 + ".tmp"),
        journal_path(data_dir, "victim").with_name("journal.tmp"),  # an interrupted compaction
    ]
    for path in leftovers:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"half-written")

    daemon = restart(start_daemon, saved.daemon)
    remaining = [str(p.relative_to(data_dir)) for p in leftovers if p.exists()]
    assert not remaining, f"left over after start: {remaining}"
    assert not list(objects_dir.glob("**/*.tmp"))
    with stratad.Client(daemon.target) as client:
        for checkpoint in saved.victim + saved.bystander:
            assert_loads(client, checkpoint)
        assert client.verify().ok
