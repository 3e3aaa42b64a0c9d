"""One tenant's crystal library in memory: a columnar store over its journal.

Everything searched lives in a native ``CrystalIndex`` (goal-token inverted
index, tool sets, effectiveness, eviction order; docs/native.md); this module
keeps only compact per-slot arrays (IDs, sequence numbers, effectiveness, reuse
counts, where each crystal's record is in the journal). A crystal's contents are
read back from its journal record when it is returned, so memory does not grow
with decision chains and error texts, and a million crystals take a few hundred
bytes each.

Separate from the journal handling (persistence.py) and the service
(service.py): this is the state they change, and the only code that knows how
the columns, the listing order and the replication counters stay consistent.
"""

from __future__ import annotations

import bisect
import sys
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratad import native
from stratad.domain.crystals.codec import _crystal_of, _decode
from stratad.domain.crystals.model import Crystal, LibraryConfig
from stratad.domain.stamps import LEGACY, Key
from stratad.errors import DataLossError, NotFoundError
from stratad.store.crypto import RecordCipher
from stratad.store.journal import Journal
from stratad.store.log import Log


@dataclass(eq=False)
class _Library:
    """One tenant's crystals. Every field is guarded by `lock`.

    Slots are allocated by the native index; the arrays below are indexed by slot.
    """

    tenant: str
    root: Path
    #: The library's journal (store/log.py), opened with reads: crystals are
    #: read back from their records.
    log: Log
    config: LibraryConfig = field(default_factory=LibraryConfig)
    lock: threading.Lock = field(default_factory=threading.Lock)
    index: native.CrystalIndex = field(default_factory=native.CrystalIndex)
    ids: dict[str, int] = field(default_factory=dict)
    id_at: list[str | None] = field(default_factory=list)
    seq_at: array[int] = field(default_factory=lambda: array("q"))
    effectiveness_at: array[float] = field(default_factory=lambda: array("d"))
    reuses_at: array[int] = field(default_factory=lambda: array("q"))
    offset_at: array[int] = field(default_factory=lambda: array("q"))
    size_at: array[int] = field(default_factory=lambda: array("q"))
    #: Creation order for listing: sequence numbers (ascending) and their slots;
    #: entries of removed crystals stay until `_trim_listing`.
    listed_seq: array[int] = field(default_factory=lambda: array("q"))
    listed_slot: array[int] = field(default_factory=lambda: array("q"))
    listed_holes: int = 0
    next_seq: int = 0
    #: Bumped by every removal: a search made without the lock is still valid
    #: (its slots name the same crystals) while this has not changed.
    removals: int = 0
    #: Bytes of the live crystals' records, and crystals reused at least once
    #: (each needs a reuse record after compaction): what compaction would keep.
    live_bytes: int = 0
    reused: int = 0
    id_bytes: int = 0
    damaged: str = ""
    #: The replication ticket of the last record this daemon appended
    #: (see `_append` in persistence.py).
    ticket: int = 0
    # -- replication (docs/replication.md, "Tenant libraries") ---------------------
    #: The daemon that created each slot's crystal ("" before replication).
    node_at: list[str] = field(default_factory=list)
    #: Each slot's success score (effectiveness is recomputed from it and the counters).
    score_at: array[float] = field(default_factory=lambda: array("d"))
    #: slot -> daemon -> (reuses, successes) that daemon recorded: counters of
    #: several daemons add up, so concurrent RecordReuse calls all count.
    contrib: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    contrib_entries: int = 0
    #: crystal ID -> stamp of its deletion: a creation stamped before it stays dead.
    tombstones: dict[str, Key] = field(default_factory=dict)
    #: The stamp of the config in force (last writer wins).
    config_key: Key = LEGACY
    #: Counters that arrived before their crystal (crystal ID -> daemon -> (seq, reuses,
    #: successes)); applied when it arrives. Not journaled: a restart pulls them again.
    pending: dict[str, dict[str, tuple[int, int, int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    # -- in-memory state (lock held) ---------------------------------------------

    def insert(self, body: dict[str, Any], offset: int, size: int) -> int:
        crystal_id, seq = body["id"], body["seq"]
        score = body["success_score"]
        tokens = native.tokenize(body["goal_template"])
        slot = self.index.add(seq, tokens, body["tool_sequence"], score, 0)
        values = (crystal_id, seq, score, 0, offset, size)
        node = body.get("node", "")
        if slot == len(self.id_at):
            self.id_at.append(crystal_id)
            self.node_at.append(node)
            self.score_at.append(score)
            for column, value in zip(self._columns(), values[1:], strict=True):
                column.append(value)
        else:
            self.id_at[slot] = crystal_id
            self.node_at[slot] = node
            self.score_at[slot] = score
            for column, value in zip(self._columns(), values[1:], strict=True):
                column[slot] = value
        self.ids[crystal_id] = slot
        if not self.listed_seq or seq >= self.listed_seq[-1]:
            self.listed_seq.append(seq)
            self.listed_slot.append(slot)
        else:  # a crystal another daemon created earlier (replication) arrived late
            at = bisect.bisect_right(self.listed_seq, seq)
            self.listed_seq.insert(at, seq)
            self.listed_slot.insert(at, slot)
        self.next_seq = max(self.next_seq, seq + 1)
        self.live_bytes += size
        self.id_bytes += sys.getsizeof(crystal_id)
        return slot

    def _columns(self) -> tuple[array[Any], ...]:
        return (self.seq_at, self.effectiveness_at, self.reuses_at, self.offset_at, self.size_at)

    def set_reuse(self, slot: int, effectiveness: float, reuse_count: int) -> None:
        if self.reuses_at[slot] == 0 and reuse_count > 0:
            self.reused += 1
        self.effectiveness_at[slot] = effectiveness
        self.reuses_at[slot] = reuse_count
        self.index.update(slot, effectiveness, reuse_count)

    def discard(self, crystal_id: str) -> None:
        slot = self.ids.pop(crystal_id)
        self.index.remove(slot)
        self.contrib_entries -= len(self.contrib.pop(slot, {}))
        self.removals += 1
        self.live_bytes -= self.size_at[slot]
        if self.reuses_at[slot]:
            self.reused -= 1
        self.id_bytes -= sys.getsizeof(crystal_id)
        self.id_at[slot] = None
        self.seq_at[slot] = -1
        self.listed_holes += 1
        if self.listed_holes > max(1024, len(self.listed_seq) // 2):
            self._trim_listing()

    def _trim_listing(self) -> None:
        keep = [
            (seq, slot)
            for seq, slot in zip(self.listed_seq, self.listed_slot, strict=True)
            if self.seq_at[slot] == seq
        ]
        self.listed_seq = array("q", (seq for seq, _ in keep))
        self.listed_slot = array("q", (slot for _, slot in keep))
        self.listed_holes = 0

    # -- replication merges (lock held; docs/replication.md) ----------------------

    def key_of(self, slot: int) -> Key:
        return (self.seq_at[slot], self.node_at[slot])

    def contributions(self, slot: int) -> dict[str, tuple[int, int]]:
        """The slot's counters per daemon; reuses from before replication count as daemon ""."""
        found = self.contrib.get(slot)
        if found is None:
            found = {}
            reuses = self.reuses_at[slot]
            if reuses:
                total = self.effectiveness_at[slot] * (1 + reuses) - self.score_at[slot]
                found[""] = (reuses, max(0, min(reuses, round(total))))
            self.contrib[slot] = found
            self.contrib_entries += len(found)
        return found

    def add_reuses(self, slot: int, node: str, reuses: int, successes: int) -> bool:
        """Take daemon `node`'s counters (cumulative, so a repeat is a no-op); changed?"""
        mine = self.contributions(slot)
        if reuses <= mine.get(node, (0, 0))[0]:
            return False
        self.contrib_entries += node not in mine
        mine[node] = (reuses, successes)
        total = sum(r for r, _ in mine.values())
        won = sum(s for _, s in mine.values())
        # The running average of docs/crystals.md, computed from its sums, so
        # that the order in which daemons' counters arrive cannot change it.
        effectiveness = min(1.0, max(0.0, (self.score_at[slot] + won) / (1 + total)))
        self.set_reuse(slot, effectiveness, total)
        return True

    def buried(self, crystal_id: str, key: Key) -> bool:
        """Was the crystal created at `key` deleted afterwards?"""
        tomb = self.tombstones.get(crystal_id)
        return tomb is not None and key <= tomb

    def bury(self, crystal_id: str, key: Key) -> bool:
        """A deletion stamped `key`; changed? (It kills a creation stamped before it.)"""
        if key <= self.tombstones.get(crystal_id, LEGACY):
            return False
        self.tombstones[crystal_id] = key
        self.pending.pop(crystal_id, None)
        slot = self.ids.get(crystal_id)
        if slot is not None and self.key_of(slot) < key:
            self.discard(crystal_id)
        return True

    @property
    def journal(self) -> Journal | None:
        return self.log.journal

    @property
    def cipher(self) -> RecordCipher | None:
        """Seals the journal's records (encryption at rest); None: plaintext."""
        return self.log.cipher

    def slot_of(self, crystal_id: str) -> int:
        slot = self.ids.get(crystal_id)
        if slot is None:
            raise NotFoundError(f"crystal {crystal_id!r} not found")
        return slot

    def read(self, slot: int) -> Crystal:
        """The crystal in `slot`, its contents read back from the journal."""
        offset, size = self.offset_at[slot], self.size_at[slot]
        try:
            data = self.log.read_at(offset, size)
        except OSError as exc:
            raise DataLossError(f"cannot read crystal {self.id_at[slot]!r}: {exc}") from exc
        body = _decode(data, size, self.cipher)
        if body is None or body.get("id") != self.id_at[slot]:
            raise DataLossError(
                f"the journal record of crystal {self.id_at[slot]!r} fails its checksum"
            )
        return _crystal_of(body, self.effectiveness_at[slot], self.reuses_at[slot])

    def memory_bytes(self) -> int:
        arrays = (*self._columns(), self.listed_seq, self.listed_slot)
        return (
            self.index.memory_usage()
            + sys.getsizeof(self.ids)
            + sys.getsizeof(self.id_at)
            + self.id_bytes
            + sum(a.buffer_info()[1] * a.itemsize for a in arrays)
        )
