"""Replication merge: how a journal record changes a library, whoever wrote it.

Every daemon applies the same records by the same rules (docs/replication.md,
"Tenant libraries"), so that libraries that have seen the same records agree
whatever order the records arrived in: last writer wins per crystal ID and for
the config, deletions are tombstones, and reuse counters are kept per daemon and
add up. Records written before replication carry no stamp and apply in journal
order. Replay (persistence.py) and records pulled from other daemons
(service.py, `apply_remote`) both go through `_apply_record`, so these rules
live here once; the per-slot bookkeeping they use is library.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from stratad.domain.crystals.library import _Library
from stratad.domain.crystals.model import LibraryConfig
from stratad.domain.stamps import LEGACY
from stratad.errors import DataLossError
from stratad.store.journal import Record


def _apply_record(lib: _Library, record: Record, offset: int, size: int) -> None:
    """Apply one journal record (replay, or a record another daemon wrote; lock held).

    Records with a stamp (written while the library replicates) merge by
    the rules of docs/replication.md: last writer wins per crystal ID and
    for the config, deletions are tombstones, reuse counters add up per
    daemon. Records without one (before replication) apply in order.
    """
    body = record.body
    if record.kind == "crystal":
        crystal_id = body["id"]
        key = (body["seq"], body.get("node", ""))
        if lib.buried(crystal_id, key):
            return  # deleted after it was created
        slot = lib.ids.get(crystal_id)
        if slot is not None:
            if "node" not in body:  # never written twice; a repeat would be damage
                raise DataLossError(f"crystal {crystal_id!r} is created twice in its journal")
            if key <= lib.key_of(slot):
                return
            lib.discard(crystal_id)  # two daemons made this ID: the later one wins
        slot = lib.insert(body, offset, size)
        for node, (seq, reuses, successes) in lib.pending.pop(crystal_id, {}).items():
            if seq == body["seq"]:
                lib.add_reuses(slot, node, reuses, successes)
    elif record.kind == "reuse":
        slot = lib.ids.get(body["id"])
        if "node" in body:
            _apply_counters(lib, body, slot)
        elif slot is not None:
            lib.set_reuse(slot, body["effectiveness"], body["reuse_count"])
    elif record.kind == "delete":
        if "stamp" in body:
            lib.bury(body["id"], (body["stamp"], body["node"]))
        elif body["id"] in lib.ids:
            lib.discard(body["id"])
    elif record.kind == "config":
        key = (body["stamp"], body["node"]) if "stamp" in body else LEGACY
        if key == LEGACY or key > lib.config_key:
            lib.config = LibraryConfig(body["max_crystals"], body["min_success_score"])
            lib.config_key = key
        lib.next_seq = max(lib.next_seq, body["next_seq"])
    else:
        raise DataLossError(f"crystal journal record of unknown kind {record.kind!r}")


def _apply_counters(lib: _Library, body: dict[str, Any], slot: int | None) -> None:
    """A `reuse` record's counters of one daemon (lock held): taken if they count the
    crystal in `slot`; held until it arrives if there is none (and it is not deleted)."""
    node, seq = body["node"], body["seq"]
    reuses, successes = body["reuses"], body["successes"]
    if slot is not None and lib.seq_at[slot] == seq:
        lib.add_reuses(slot, node, reuses, successes)
    elif slot is None and body["id"] not in lib.tombstones:
        waiting = lib.pending.setdefault(body["id"], {})
        if reuses > waiting.get(node, (0, 0, 0))[1]:
            waiting[node] = (seq, reuses, successes)


def _changes(lib: _Library, record: Record) -> bool:
    """Would applying this record (another daemon's) change the library? (lock held)"""
    body = record.body
    kind = record.kind
    if kind == "crystal":
        key = (body["seq"], body.get("node", ""))
        slot = lib.ids.get(body["id"])
        if lib.buried(body["id"], key):
            return False
        return slot is None or (key > lib.key_of(slot) and "node" in body)
    if kind == "reuse":
        slot = lib.ids.get(body["id"])
        if "node" not in body or slot is None or lib.seq_at[slot] != body["seq"]:
            return False
        return bool(body["reuses"] > lib.contributions(slot).get(body["node"], (0, 0))[0])
    if kind == "delete":
        return "stamp" in body and (body["stamp"], body["node"]) > lib.tombstones.get(
            body["id"], LEGACY
        )
    if kind == "config":
        return "stamp" in body and (body["stamp"], body["node"]) > lib.config_key
    raise DataLossError(f"crystal record of unknown kind {kind!r}")


def _counter_records(lib: _Library, slot: int, wanted: Callable[[str], bool]) -> Iterator[Record]:
    """`reuse` records of a slot's per-daemon counters (lock held)."""
    for node, (reuses, successes) in sorted(lib.contrib.get(slot, {}).items()):
        if wanted(node):
            body = {
                "id": lib.id_at[slot], "seq": lib.seq_at[slot], "node": node,
                "reuses": reuses, "successes": successes,
            }  # fmt: skip
            yield Record("reuse", body)


def _stamp_of(record: Record) -> int:
    """The stamp a record carries (0: none), for the hybrid clock."""
    body = record.body
    if record.kind == "crystal":
        return int(body["seq"]) if "node" in body else 0
    return int(body.get("stamp", 0))
