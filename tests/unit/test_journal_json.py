"""Journal record JSON (store/journal.py): orjson first, the standard library for the rest.

Whatever a record body holds must read back equal after a restart, whichever
of the two encoders wrote it; journals written by earlier versions (standard
library JSON, ASCII-escaped) must stay readable.
"""

from __future__ import annotations

import json
import math

import pytest

from stratad.store.journal import Record, decode_body, dumps, encode_body, loads


@pytest.mark.parametrize(
    "fields",
    [
        {"k": "save", "id": "cp-1", "size": 8192, "at": 1764122000.123456},
        {"k": "save", "text": "héllo wörld ✓ 😀", "nested": {"a": [1, 2.5, None, True]}},
        {"k": "big", "n": 2**80, "m": -(2**70)},  # beyond 64 bits: the standard library
        {"k": "surrogate", "s": "\ud800 lone"},  # not valid UTF-8: the standard library
        {"k": "long", "digests": ["ab" * 32] * 500},  # long enough to be compressed
    ],
)
def test_bodies_read_back_equal(fields: dict[str, object]) -> None:
    assert decode_body(encode_body(fields)) == fields


def test_non_string_keys_are_written_as_the_standard_library_writes_them() -> None:
    assert loads(dumps({1: "a", "b": 2})) == json.loads(json.dumps({1: "a", "b": 2}))


def test_bodies_written_by_earlier_versions_read() -> None:
    old = json.dumps({"k": "save", "text": "héllo", "n": 2**80}, separators=(",", ":"))
    assert decode_body(old.encode()) == {"k": "save", "text": "héllo", "n": 2**80}
    # The standard library wrote NaN as a bare literal, which orjson refuses.
    assert math.isnan(loads(b'{"x": NaN}')["x"])


def test_records_round_trip_with_blobs() -> None:
    record = Record("save", {"cp": {"id": "x", "at": 1.5}}, [b"\x00frame", b""])
    decoded = Record.decode_payload(b"".join(record.pieces()[1:]))
    assert decoded == record


def test_garbage_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        decode_body(b"{not json")
