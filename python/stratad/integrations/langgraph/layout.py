"""The stored layout of a StratadSaver checkpoint ("SLG2"): reading and checking it.

Owns the format docs/langgraph.md "How a checkpoint is stored" specifies: the
content type, the magic, pieces and trailer, `is_layout` and `decode_layout`,
and the cache of decoded list elements (`_Decoded`) that makes a load decode
only what this saver has not seen. Writing a checkpoint in it is
encoder.py's. Stored data depends on it: never change it, add a layout.
"""

from __future__ import annotations

import collections
import struct as _struct
import threading
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

CONTENT_TYPE_PREFIX = "application/vnd.langgraph.checkpoint+"
#: The first bytes of a checkpoint in the layout of `encode_layout`. Its content
#: type stays CONTENT_TYPE_PREFIX + the serde type (of the trailer): checkpoints
#: of earlier versions hold one serde.dumps_typed payload, which never starts so
#: (a msgpack map, a JSON object).
LAYOUT_MAGIC = b"SLG2\n"

# -- the stored layout ------------------------------------------------------------------
#
# state = MAGIC | piece* | trailer piece | u32 LE length of the trailer piece
# piece = u8 length of the serde type | u32 LE length of the data | type | data
#
# The pieces are, in order: every element of each list channel (channels sorted
# by name), then one piece per other channel (sorted by name). The trailer is
# serde.dumps_typed({"checkpoint": the checkpoint without channel_values,
# "metadata", "parent_checkpoint_id", "channels": [[name, element count, or -1
# for a value], ...]}). A list that grows by appending grows the state just
# before the trailer: the bytes before stay the same, so the chunks that hold
# them are the previous checkpoint's.

_PIECE_HEAD = _struct.Struct("<BI")
_TRAILER_LEN = _struct.Struct("<I")


def encode_piece(type_: str, data: bytes) -> bytes:
    tag = type_.encode()
    return _PIECE_HEAD.pack(len(tag), len(data)) + tag + data


def _read_pieces(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """(offset, type length, end) of each piece in data[start:end]."""
    out = []
    unpack = _PIECE_HEAD.unpack_from
    head = _PIECE_HEAD.size
    offset = start
    while offset < end:
        if offset + head > end:
            raise ValueError("truncated StratadSaver checkpoint (piece header)")
        tag_len, data_len = unpack(data, offset)
        stop = offset + head + tag_len + data_len
        if stop > end:
            raise ValueError("truncated StratadSaver checkpoint (piece)")
        out.append((offset, tag_len, stop))
        offset = stop
    return out


def _typed(data: bytes, piece: tuple[int, int, int]) -> tuple[str, bytes]:
    offset, tag_len, stop = piece
    body = offset + _PIECE_HEAD.size
    return data[body : body + tag_len].decode(), data[body + tag_len : stop]


def is_layout(data: bytes) -> bool:
    """Whether a StratadSaver state is in the layout `encode_layout` writes (else
    it is one serde.dumps_typed payload, as StratadSaver wrote before)."""
    return data.startswith(LAYOUT_MAGIC)


def decode_layout(
    serde: SerializerProtocol, data: bytes, cache: _Decoded | None = None
) -> dict[str, Any]:
    """{"checkpoint", "metadata", "parent_checkpoint_id"} of a state in the layout.

    `cache`: decoded list elements by their serialized bytes (shared objects)."""
    return _decode(serde, data, cache)[0]


#: (channel, element count or -1, its pieces as (offset, type length, end)).
_Table = list[tuple[str, int, list[tuple[int, int, int]]]]


def _decode(
    serde: SerializerProtocol, data: bytes, cache: _Decoded | None
) -> tuple[dict[str, Any], _Table]:
    if not data.startswith(LAYOUT_MAGIC) or len(data) < len(LAYOUT_MAGIC) + 4:
        raise ValueError("not a StratadSaver checkpoint layout (bad magic)")
    (trailer_len,) = _TRAILER_LEN.unpack_from(data, len(data) - 4)
    trailer_start = len(data) - 4 - trailer_len
    if trailer_start < len(LAYOUT_MAGIC):
        raise ValueError("truncated StratadSaver checkpoint (trailer)")
    (trailer,) = _read_pieces(data, trailer_start, len(data) - 4)
    header = serde.loads_typed(_typed(data, trailer))
    pieces = _read_pieces(data, len(LAYOUT_MAGIC), trailer_start)
    values: dict[str, Any] = {}
    table: _Table = []
    at = 0
    for name, count in header.pop("channels"):
        n = 1 if count < 0 else count
        items = pieces[at : at + n]
        if len(items) != n:
            raise ValueError("truncated StratadSaver checkpoint (channel)")
        table.append((name, count, items))
        at += len(items)
        if count < 0:
            values[name] = serde.loads_typed(_typed(data, items[0]))
        elif cache is None:
            values[name] = [serde.loads_typed(_typed(data, p)) for p in items]
        else:
            values[name] = [cache.get(serde, data, p) for p in items]
    if at != len(pieces):
        raise ValueError("StratadSaver checkpoint has pieces its trailer does not name")
    checkpoint = header["checkpoint"]
    checkpoint["channel_values"] = values
    payload = {
        "checkpoint": checkpoint,
        "metadata": header["metadata"],
        "parent_checkpoint_id": header.get("parent_checkpoint_id"),
    }
    return payload, table


_MISSING = object()


class _Decoded:
    """Decoded list elements by their serialized piece (LRU, bounded in bytes).

    Loading a checkpoint decodes only the elements this saver has not decoded (or
    serialized) before; the objects are shared, as LangGraph shares them between
    the checkpoints of a running graph."""

    def __init__(self, max_bytes: int) -> None:
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[bytes, Any] = collections.OrderedDict()
        self._bytes = 0
        self.max_bytes = max_bytes

    def get(self, serde: SerializerProtocol, data: bytes, piece: tuple[int, int, int]) -> Any:
        whole = data[piece[0] : piece[2]]
        with self._lock:
            value = self._items.get(whole, _MISSING)
            if value is not _MISSING:
                self._items.move_to_end(whole)
                return value
        value = serde.loads_typed(_typed(data, piece))
        self.add(whole, value)
        return value

    def add(self, whole: bytes, value: Any) -> None:
        if len(whole) > self.max_bytes // 16:
            return
        with self._lock:
            if whole not in self._items:
                self._bytes += len(whole)
            self._items[whole] = value
            self._items.move_to_end(whole)
            while self._bytes > self.max_bytes:
                old, _ = self._items.popitem(last=False)
                self._bytes -= len(old)
