"""Writing checkpoints in the stored layout (layout.py), serializing only what changed.

Owns `encode_layout` and `_Encoder`, which reuses the pieces earlier puts of
the same thread serialized (`_ListMemo`: a list channel's last value), so a
growing message history costs a step's new messages, not the history again.
"""

from __future__ import annotations

import collections
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.serde.base import SerializerProtocol

from stratad.integrations.langgraph.layout import (
    _TRAILER_LEN,
    LAYOUT_MAGIC,
    _Table,
    encode_piece,
)


def encode_layout(
    serde: SerializerProtocol,
    checkpoint: Checkpoint,
    metadata: Any,
    parent_checkpoint_id: str | None,
) -> tuple[str, bytes]:
    """(serde type, bytes) of a checkpoint in the stored layout, every value
    serialized now (the saver reuses what earlier puts serialized: `_Encoder`)."""
    return _Encoder(serde, 0).encode(("", ""), checkpoint, metadata, parent_checkpoint_id)


class _ListMemo:
    """A list channel's last value: its elements, their pieces, and where each is."""

    __slots__ = ("nbytes", "objects", "pieces", "positions", "version")

    def __init__(
        self,
        version: Any,
        objects: list[Any],
        pieces: list[bytes],
        nbytes: int | None = None,
        positions: dict[int, int] | None = None,
    ) -> None:
        self.version = version
        self.objects = objects
        self.pieces = pieces
        self.nbytes = sum(map(len, pieces)) if nbytes is None else nbytes
        #: id(element) -> index (the elements are kept alive, so IDs are unique).
        self.positions = (
            {id(o): i for i, o in enumerate(objects)} if positions is None else positions
        )

    def shared_prefix(self, value: list[Any], dirty: set[int]) -> int:
        """How many leading elements of `value` are this list's (the same objects),
        up to the first one a task wrote since."""
        objects = self.objects
        limit = min(len(value), len(objects))
        if limit and all(map(operator.is_, value[:limit], objects[:limit])):
            keep = limit  # the usual case (appends only), compared at C speed
        else:
            pairs = enumerate(zip(value, objects, strict=False))
            keep = next((i for i, (a, b) in pairs if a is not b), limit)
        if dirty:
            changed = [i for i in map(self.positions.get, dirty) if i is not None and i < keep]
            keep = min(changed, default=keep)
        return keep


class _Encoder:
    """Serializes checkpoints into the layout, reusing the pieces of earlier puts
    of the same (thread, namespace, channel): a value whose channel version is
    the same (LangGraph changes a channel's version whenever its value changes),
    and the leading elements of a list that are the same objects as in the
    earlier put (LangGraph's reducers, `add_messages` included, build a new list
    and replace elements rather than change them). Elements a task wrote
    (put_writes) since are serialized again. LRU, bounded in bytes; max_bytes 0:
    no memory."""

    def __init__(self, serde: SerializerProtocol, max_bytes: int) -> None:
        self.serde = serde
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._lists: collections.OrderedDict[tuple[str, str, str], _ListMemo] = (
            collections.OrderedDict()
        )
        self._values: collections.OrderedDict[tuple[str, str, str], tuple[Any, bytes]] = (
            collections.OrderedDict()
        )
        self._bytes = 0
        #: IDs of objects tasks wrote, by (thread, namespace): serialized again.
        self._written: dict[tuple[str, str], set[int]] = {}
        #: Called with (piece, object) for each list element serialized.
        self.on_piece: Callable[[bytes, Any], None] | None = None

    def written(self, scope: tuple[str, str], writes: Sequence[tuple[str, Any]]) -> None:
        if not self.max_bytes:
            return
        ids: set[int] = set()
        for _, value in writes:
            ids.add(id(value))
            if isinstance(value, list | tuple):
                ids.update(map(id, value))
        with self._lock:
            self._written.setdefault(scope, set()).update(ids)

    def encode(
        self,
        scope: tuple[str, str],
        checkpoint: Checkpoint,
        metadata: Any,
        parent_checkpoint_id: str | None,
    ) -> tuple[str, bytes]:
        """(serde type of the trailer, the state)."""
        values = checkpoint["channel_values"]
        versions = checkpoint.get("channel_versions") or {}
        lists = sorted(k for k, v in values.items() if type(v) is list)
        others = sorted(k for k in values if type(values[k]) is not list)
        with self._lock:
            dirty = self._written.pop(scope, set()) if self.max_bytes else set()
        parts = [LAYOUT_MAGIC]
        channels: list[list[Any]] = []
        for name in lists:
            pieces = self._list(scope, name, values[name], versions.get(name), dirty)
            parts += pieces
            channels.append([name, len(pieces)])
        for name in others:
            parts.append(self._value(scope, name, values[name], versions.get(name)))
            channels.append([name, -1])
        header = {
            "checkpoint": {k: v for k, v in checkpoint.items() if k != "channel_values"},
            "metadata": metadata,
            "parent_checkpoint_id": parent_checkpoint_id,
            "channels": channels,
        }
        type_, data = self.serde.dumps_typed(header)
        trailer = encode_piece(type_, data)
        parts.append(trailer)
        parts.append(_TRAILER_LEN.pack(len(trailer)))
        return type_, b"".join(parts)

    def _list(
        self, scope: tuple[str, str], name: str, value: list[Any], version: Any, dirty: set[int]
    ) -> list[bytes]:
        key = (*scope, name)
        with self._lock:
            memo = self._lists.get(key) if self.max_bytes else None
        keep = memo.shared_prefix(value, dirty) if memo is not None else 0
        pieces = memo.pieces[:keep] if memo is not None else []
        added = 0
        for item in value[keep:]:
            piece = encode_piece(*self.serde.dumps_typed(item))
            pieces.append(piece)
            added += len(piece)
            if self.on_piece is not None:
                self.on_piece(piece, item)
        if self.max_bytes:
            if memo is not None and keep == len(memo.objects):
                # Appends only: extend what the previous memo knew (it is replaced).
                positions = memo.positions
                positions.update((id(o), i) for i, o in enumerate(value[keep:], keep))
                entry = _ListMemo(version, list(value), pieces, memo.nbytes + added, positions)
            else:
                entry = _ListMemo(version, list(value), pieces)
            self._remember(self._lists, key, entry)
        return pieces

    def _value(self, scope: tuple[str, str], name: str, value: Any, version: Any) -> bytes:
        key = (*scope, name)
        with self._lock:
            known = self._values.get(key) if self.max_bytes else None
        if known is not None and version is not None and known[0] == version:
            return known[1]
        piece = encode_piece(*self.serde.dumps_typed(value))
        if self.max_bytes:
            self._remember(self._values, key, (version, piece))
        return piece

    def _remember(self, table: Any, key: tuple[str, str, str], entry: Any) -> None:
        size = entry.nbytes if isinstance(entry, _ListMemo) else len(entry[1])
        with self._lock:
            old = table.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes if isinstance(old, _ListMemo) else len(old[1])
            if size > self.max_bytes:
                return
            table[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                biggest = self._lists if self._lists else self._values
                _, gone = biggest.popitem(last=False)
                self._bytes -= gone.nbytes if isinstance(gone, _ListMemo) else len(gone[1])

    def seed(
        self, scope: tuple[str, str], checkpoint: Checkpoint, data: bytes, table: _Table
    ) -> None:
        """Remember the pieces of a loaded checkpoint, as `_decode` found them (a
        resumed thread's next put then serializes only what it adds)."""
        if not self.max_bytes:
            return
        values = checkpoint["channel_values"]
        versions = checkpoint.get("channel_versions") or {}
        for name, count, items in table:
            pieces = [data[p[0] : p[2]] for p in items]
            if count < 0:
                self._remember(self._values, (*scope, name), (versions.get(name), pieces[0]))
            else:
                memo = _ListMemo(versions.get(name), list(values[name]), pieces)
                self._remember(self._lists, (*scope, name), memo)
