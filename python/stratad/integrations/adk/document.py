"""The stored form of an ADK session: one JSON document a stratad state.

Owns the document's format (`encode_document`, `decode_document`: the events,
one a line, then the session-scoped state and the session's times), `_Stored`,
a document as stored at one version (appending to it keeps every earlier byte;
it recognizes an event stored again), and `_Cache`, the documents last read or
written. Stored data depends on it: never change it.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stratad.integrations.adk.state import _dumps

#: The content type of the states this service saves.
CONTENT_TYPE = "application/vnd.google.adk.session+json"
#: An event equal to one of the stored events in this many bytes at the end of
#: the history is not stored again (a retried append, an event delivered twice).
DEDUP_WINDOW_BYTES = 256 << 10
_HEAD = b'{"adk_session":1,"events":['
_EVENTS_END = b'\n],"state":'


def encode_document(events: Sequence[bytes], state_json: bytes, meta: Mapping[str, Any]) -> bytes:
    """A session as one JSON object, one event a line:

        {"adk_session":1,"events":[
        {...event 0...},
        {...event 1...}
        ],"state":{...},"meta":{...}}

    The events come first, so appending one keeps every earlier byte. (JSON
    text holds no raw newline, so the lines are the events.)"""
    parts = [_HEAD]
    if events:
        parts += [b"\n", b",\n".join(events)]
    parts += [_EVENTS_END, state_json, b',"meta":', _dumps(meta), b"}"]
    return b"".join(parts)


def decode_document(data: bytes) -> tuple[list[bytes], bytes, dict[str, Any]]:
    """(event lines, state JSON, meta) of a document `encode_document` wrote."""
    stored = _Stored.parse(0, data)
    return stored.lines(), stored.state_json, stored.meta


@dataclass(frozen=True)
class _Stored:
    """A session document as stored at one version of its stratad session: its
    bytes (which the next append extends) and where its parts are."""

    version: int
    doc: bytes
    #: Offset of the newline that ends the events (before `],"state":`).
    events_end: int
    count: int
    state_json: bytes
    meta: dict[str, Any]

    @classmethod
    def parse(cls, version: int, doc: bytes) -> _Stored:
        end = doc.rfind(b"\n")
        if not doc.startswith(_HEAD + b"\n") or doc[end : end + len(_EVENTS_END)] != _EVENTS_END:
            raise ValueError("not a session document of StratadSessionService")
        tail = json.loads(b"{" + doc[end + 3 :])
        count = doc.count(b"\n", 0, end)
        return cls(version, doc, end, count, _dumps(tail["state"]), dict(tail["meta"]))

    def appended(self, line: bytes, state_json: bytes, meta: Mapping[str, Any]) -> _Stored:
        """This document with one more event, and the state and meta given (not saved yet)."""
        sep = b",\n" if self.count else b"\n"
        doc = b"".join([memoryview(self.doc)[: self.events_end], sep, line, _EVENTS_END,
                        state_json, b',"meta":', _dumps(meta), b"}"])  # fmt: skip
        end = self.events_end + len(sep) + len(line)
        return _Stored(self.version, doc, end, self.count + 1, state_json, dict(meta))

    def lines(self, last: int | None = None) -> list[bytes]:
        """The events' JSON (the `last` ones only, when given), in order."""
        if not self.count or last == 0:
            return []
        body = self.doc[len(_HEAD) + 1 : self.events_end]
        pieces = body.split(b"\n") if last is None else body.rsplit(b"\n", last)[-last:]
        return [piece.removesuffix(b",") for piece in pieces]

    def events_json(self, last: int | None = None) -> bytes:
        """The events (the `last` ones only, when given) as one JSON array."""
        if last is None:
            return self.doc[len(_HEAD) - 1 : self.events_end] + b"\n]"
        return b"[" + b",".join(self.lines(last)) + b"]"

    def holds(self, line: bytes) -> bool:
        """Whether `line` is one of the recent stored events (those in the last
        `DEDUP_WINDOW_BYTES` of them), byte for byte."""
        start = max(0, self.events_end - DEDUP_WINDOW_BYTES - len(line))
        stop = self.events_end + 1
        return (
            self.doc.find(b"\n" + line + b",\n", start, stop) >= 0
            or self.doc.find(b"\n" + line + b"\n", start, stop) >= 0
        )

    def last_is(self, line: bytes) -> bool:
        """Whether `line` is the last stored event."""
        start = self.events_end - len(line) - 1
        return self.count > 0 and self.doc[start : self.events_end] == b"\n" + line

    @property
    def size(self) -> int:
        return len(self.doc)

    @property
    def last_update_time(self) -> float:
        return float(self.meta.get("last_update_time") or 0.0)

    def last_event_id(self) -> str | None:
        if not self.count:
            return None
        start = self.doc.rfind(b"\n", 0, self.events_end) + 1
        return str(json.loads(self.doc[start : self.events_end].removesuffix(b",")).get("id"))


class _Cache:
    """The documents last read or written, by stratad session (LRU, bounded in bytes)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[str, _Stored] = collections.OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> _Stored | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: str, item: _Stored) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if item.size > self.max_bytes:
                return
            self._items[key] = item
            self._bytes += item.size
            while self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.size

    def drop(self, key: str) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.size
