"""Journal replay: what counts as a torn tail (cut) and what as damage (reported)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest

from stratad.store import journal as journal_mod
from stratad.store.crypto import TenantCipher
from stratad.store.journal import Journal, Record, parse_records, read_records


def records(n: int) -> list[bytes]:
    return [Record("save", {"v": i, "at": 0.0}, [b"x" * 100]).encode() for i in range(n)]


def replay(tmp_path: Path, data: bytes) -> tuple[int, int, int | None]:
    path = tmp_path / "journal"
    path.write_bytes(data)
    result = read_records(path)
    return len(result.records), result.torn_bytes, result.corrupt_at


def test_a_partial_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    good = records(3)
    data = b"".join(good[:2]) + good[2][:50]
    assert replay(tmp_path, data) == (2, 50, None)


def test_a_flipped_payload_byte_before_valid_records_is_damage(tmp_path: Path) -> None:
    good = records(3)
    bad = bytearray(good[1])
    bad[40] ^= 0xFF
    data = good[0] + bytes(bad) + good[2]
    assert replay(tmp_path, data) == (1, 0, len(good[0]))


def test_a_flipped_length_that_runs_past_the_end_is_damage(tmp_path: Path) -> None:
    good = records(3)
    bad = bytearray(good[1])
    bad[3] = 0x7F  # the length's high byte: the record now "ends" beyond the file
    data = good[0] + bytes(bad) + good[2]
    assert replay(tmp_path, data) == (1, 0, len(good[0]))


def test_damage_followed_by_a_torn_tail_is_still_damage(tmp_path: Path) -> None:
    good = records(4)
    bad = bytearray(good[1])
    bad[40] ^= 0xFF
    data = good[0] + bytes(bad) + good[2] + good[3][:30]
    assert replay(tmp_path, data) == (1, 0, len(good[0]))


def test_an_unwritten_zero_gap_before_unsynced_records_is_cut(tmp_path: Path) -> None:
    good = records(3)
    data = good[0] + bytes(len(good[1])) + good[2]
    assert replay(tmp_path, data) == (1, len(good[1]) + len(good[2]), None)


def test_a_torn_append_carrying_journal_records_is_reported_not_cut(tmp_path: Path) -> None:
    """Conservative by design: valid records inside a torn append look like later writes.

    Cutting them could silently drop acknowledged records if they really were
    later writes; reporting costs an operator's look at a session whose state
    happened to contain stratad journal records.
    """
    inner = records(1)[0]
    torn = Record("save", {"v": 9, "at": 0.0}, [inner * 3]).encode()[:-10]
    data = records(1)[0] + torn
    assert replay(tmp_path, data) == (1, 0, len(inner))


# -- compressed bodies ---------------------------------------------------------------

#: Where a record's body starts: u32 length + u32 CRC, then the u32 body length.
BODY_AT = 12


def big_body(i: int) -> dict[str, object]:
    """A body well past COMPRESS_MIN_BYTES, as repetitive as a checkpoint's JSON."""
    return {"v": i, "at": 1.5, "checkpoint": {f"field_{n}": f"{n:064x}" for n in range(8)}}


def big_records(n: int) -> list[bytes]:
    return [Record("save", big_body(i), [b"x" * 100]).encode() for i in range(n)]


def old_format(kind: str, body: dict[str, object], blobs: list[bytes]) -> bytes:
    """A record exactly as stratad wrote it before bodies were compressed: plain JSON."""
    text = json.dumps({"k": kind, **body}, separators=(",", ":")).encode()
    payload = struct.pack("<I", len(text)) + text
    for blob in blobs:
        payload += struct.pack("<I", len(blob)) + blob
    return struct.pack("<II", len(payload), zlib.crc32(payload)) + payload


def test_a_large_body_is_stored_compressed_and_round_trips(tmp_path: Path) -> None:
    body = big_body(7)
    data = Record("save", body, [b"blob"]).encode()
    plain = json.dumps({"k": "save", **body}, separators=(",", ":")).encode()
    assert data[BODY_AT : BODY_AT + 4] == journal_mod.ZSTD_MAGIC
    assert len(data) < len(plain) // 2
    (path := tmp_path / "journal").write_bytes(data)
    [record] = read_records(path).records
    assert (record.kind, record.body, record.blobs) == ("save", body, [b"blob"])


def test_a_small_body_stays_plain_json() -> None:
    data = Record("status", {"v": 3, "at": 1.5, "status": "paused"}).encode()
    assert data[BODY_AT : BODY_AT + 6] == b'{"k":"'


def test_a_body_zstd_cannot_shrink_stays_plain() -> None:
    noise = os.urandom(400).hex()  # hex of random bytes: zstd saves little, JSON escapes none
    body = {"v": 1, "at": 0.0, "noise": noise}
    data = Record("save", body).encode()
    text = json.dumps({"k": "save", **body}, separators=(",", ":")).encode()
    # Either form is valid; the compressed one only when it is smaller.
    if data[BODY_AT : BODY_AT + 4] == journal_mod.ZSTD_MAGIC:
        assert len(data) < len(text) + 12
    else:
        assert data[BODY_AT:] == text


def test_a_journal_of_the_old_format_replays_and_takes_new_records(tmp_path: Path) -> None:
    """Migration: plain-JSON records (any size) written by older versions replay as they are,
    and records appended after them (compressed) follow in the same file."""
    old = [old_format("save", big_body(i), [b"y" * 50]) for i in range(3)]
    path = tmp_path / "journal"
    path.write_bytes(b"".join(old))
    assert all(r[BODY_AT : BODY_AT + 6] == b'{"k":"' for r in old)
    journal = Journal(path, durable=False)
    journal.append(Record("save", big_body(3), [b"z"]))
    journal.close()
    result = read_records(path)
    assert (result.torn_bytes, result.corrupt_at) == (0, None)
    assert [r.body for r in result.records] == [big_body(i) for i in range(4)]
    assert [r.blobs for r in result.records] == [[b"y" * 50]] * 3 + [[b"z"]]
    assert path.read_bytes()[: len(b"".join(old))] == b"".join(old)  # untouched


def test_a_torn_compressed_record_is_cut(tmp_path: Path) -> None:
    good = big_records(3)
    for cut in (5, BODY_AT + 2, len(good[2]) // 2, len(good[2]) - 1):
        data = good[0] + good[1] + good[2][:cut]
        assert replay(tmp_path, data) == (2, cut, None)


def test_a_flipped_byte_in_a_compressed_record_before_compressed_ones_is_damage(
    tmp_path: Path,
) -> None:
    """Records after the damage are found by the zstd magic their bodies start with
    (none of them starts with '{"k":"'), so the damage is reported, not cut."""
    good = big_records(4)
    for at in (BODY_AT + 1, BODY_AT + 20, len(good[1]) - 3):
        bad = bytearray(good[1])
        bad[at] ^= 0x01
        data = good[0] + bytes(bad) + good[2] + good[3]
        assert replay(tmp_path, data) == (1, 0, len(good[0]))
    # A flipped length running past the end: damage too.
    bad = bytearray(good[1])
    bad[3] = 0x7F
    assert replay(tmp_path, good[0] + bytes(bad) + good[2]) == (1, 0, len(good[0]))


def test_a_zero_gap_before_unsynced_compressed_records_is_cut(tmp_path: Path) -> None:
    good = big_records(3)
    data = good[0] + bytes(len(good[1])) + good[2]
    assert replay(tmp_path, data) == (1, len(good[1]) + len(good[2]), None)


def test_a_compressed_body_that_claims_too_much_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decompressed size is capped: a body claiming more is corruption, never allocated."""
    data = Record("save", big_body(1)).encode()
    payload = data[8:]
    assert Record.decode_payload(payload).body == big_body(1)
    monkeypatch.setattr(journal_mod, "MAX_COMPRESSED_BODY_BYTES", 100)
    with pytest.raises(ValueError, match="does not decompress"):
        Record.decode_payload(payload)


def test_a_checksummed_but_undecodable_compressed_body_is_not_a_record(tmp_path: Path) -> None:
    """CRC intact, zstd frame broken (a bug, or damage the CRC missed): treated like a
    record that fails its checksum: cut at the tail, damage before valid records."""
    good = big_records(3)
    text = journal_mod.ZSTD_MAGIC + b"\x00" * 40  # the magic, then no valid frame
    payload = struct.pack("<I", len(text)) + text
    broken = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    assert replay(tmp_path, good[0] + broken) == (1, len(broken), None)
    assert replay(tmp_path, good[0] + broken + good[2]) == (1, 0, len(good[0]))


def test_encrypted_journals_seal_the_compressed_payload(tmp_path: Path) -> None:
    cipher = TenantCipher("t", os.urandom(32)).records("t/sessions/s/journal")
    path = tmp_path / "journal"
    journal = Journal(path, durable=False, cipher=cipher)
    for i in range(4):
        journal.append(Record("save", big_body(i), [b"w" * 30]))
    journal.close()
    data = path.read_bytes()
    result = parse_records(data, cipher)
    assert [r.body for r in result.records] == [big_body(i) for i in range(4)]
    # Compressed before sealing: the sealed payload opens to a zstd body.
    length, _ = struct.unpack_from("<II", data, 0)
    plain = cipher.open(data[8 : 8 + length])
    assert plain[4:8] == journal_mod.ZSTD_MAGIC
    assert b"field_" not in data and b"field_" not in plain  # neither readable nor plain JSON
    # Torn tails and damage are told apart as in plain journals.
    ends = [0]
    while ends[-1] < len(data):
        ends.append(ends[-1] + 8 + struct.unpack_from("<I", data, ends[-1])[0])
    assert parse_records(data[: ends[3] + 20], cipher).torn_bytes == 20
    damaged = bytearray(data)
    damaged[ends[1] + 30] ^= 0x01
    assert parse_records(bytes(damaged), cipher).corrupt_at == ends[1]
