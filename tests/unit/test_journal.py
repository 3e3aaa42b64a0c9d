"""Journal replay: what counts as a torn tail (cut) and what as damage (reported)."""

from __future__ import annotations

from pathlib import Path

from stratad.store.journal import Record, read_records


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
