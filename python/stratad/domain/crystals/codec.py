"""How a crystal library's journal records are encoded and read back.

Separate from the store so that the byte format is in one place: a `crystal`
record is written once, when the crystal is created, and its bytes are never
re-encoded afterwards. Compaction copies them as they are, replication ships
them as they are, and the library reads a crystal's contents back from them
(library.py keeps only where each record is). The records are those of
store/journal.py: ``config`` (limits and the next sequence number), ``crystal``
(an immutable crystal as created), ``reuse`` (effectiveness and reuse count
after a reuse, or with replication one daemon's counters) and ``delete``
(deleted or evicted).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

from stratad.domain.crystals.model import Crystal, ErrorPattern
from stratad.errors import DataLossError
from stratad.store.crypto import RecordCipher
from stratad.store.journal import Record

_HEADER = struct.Struct("<II")  # the journal's record header: length, CRC-32


def _crystal_body(crystal: Crystal, seq: int, node: str | None = None) -> dict[str, Any]:
    """A `crystal` record's body; `node` (the writer) only when the library replicates."""
    origin = {} if node is None else {"node": node}
    return {
        **origin,
        "id": crystal.crystal_id,
        "seq": seq,
        "goal_template": crystal.goal_template,
        "decision_chain": list(crystal.decision_chain),
        "tool_sequence": list(crystal.tool_sequence),
        "error_patterns": [[p.error, p.resolution] for p in crystal.error_patterns],
        "entity_types": list(crystal.entity_types),
        "success_score": crystal.success_score,
        "created_from": crystal.created_from,
        "created_at": crystal.created_at,
    }


def _crystal_of(body: dict[str, Any], effectiveness: float, reuse_count: int) -> Crystal:
    return Crystal(
        crystal_id=body["id"],
        goal_template=body["goal_template"],
        decision_chain=tuple(body["decision_chain"]),
        tool_sequence=tuple(body["tool_sequence"]),
        error_patterns=tuple(ErrorPattern(e, r) for e, r in body["error_patterns"]),
        success_score=body["success_score"],
        reuse_count=reuse_count,
        effectiveness=effectiveness,
        entity_types=tuple(body["entity_types"]),
        created_from=body["created_from"],
        created_at=body["created_at"],
    )


def _decode(data: bytes, size: int, cipher: RecordCipher | None) -> dict[str, Any] | None:
    """The body of the `crystal` record `data`, or None if it fails its checks."""
    if len(data) != size or size < _HEADER.size:
        return None
    length, crc = _HEADER.unpack_from(data, 0)
    payload = data[_HEADER.size :]
    if length != len(payload) or zlib.crc32(payload) != crc:
        return None
    try:
        if cipher is not None:
            payload = cipher.open(payload)
        record = Record.decode_payload(payload)
    except (ValueError, KeyError, struct.error, DataLossError):
        return None
    return record.body if record.kind == "crystal" else None
