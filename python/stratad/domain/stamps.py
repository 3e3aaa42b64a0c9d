"""Hybrid logical clock stamps: the merge order of a tenant's replicated library.

A tenant's crystal library and user profiles may be written by several
daemons at once (docs/replication.md, "Tenant libraries"). Every replicated
record carries a *stamp*, an int that orders it against every other record of
the library, whoever wrote it:

    bits 63..22  milliseconds since 2020-01-01 (lasts until 2089)
    bits 21..16  a counter for stamps made in the same millisecond
    bits 15..0   a tag derived from the daemon's node ID

A stamp is made by `HybridClock.now()`: above the wall clock, above every
stamp this daemon made and above every stamp it has applied (`observe`). So a
record written after seeing another (a delete after the crystal's creation, a
profile update after the last one) always has the larger stamp, even when the
writers' clocks disagree; two concurrent records are ordered by their wall
clocks. Ties between two daemons whose tags collide are broken by the node ID
(records are compared as ``(stamp, node)``), so the order is total and every
daemon merges to the same result.

The crystal library also uses a crystal's stamp as its creation sequence
number (the listing order and the tie-break of searches), so the order of
crystals is the same on every daemon.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Protocol

#: 2020-01-01T00:00:00Z in milliseconds since the Unix epoch.
EPOCH_MS = 1_577_836_800_000
_PHYSICAL_SHIFT = 22
_COUNTER_SHIFT = 16
_TAG_MASK = (1 << _COUNTER_SHIFT) - 1

#: Compares two replicated records: (stamp, node ID). Records written before
#: replication was on carry none: ``LEGACY``, older than any other.
Key = tuple[int, str]
LEGACY: Key = (0, "")


def legacy_key(content: object) -> Key:
    """The key under which state written before replication is published.

    Above "never written" and below any stamped write; the writer is a hash
    of the content ("~" and 16 hex digits, never a node ID), so that two
    daemons publishing different old versions of one thing agree on one.
    """
    encoded = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    return (1, "~" + hashlib.blake2b(encoded, digest_size=8).hexdigest())


def is_legacy(node: str) -> bool:
    """Is `node` the writer of something written before replication (LEGACY or legacy_key)?"""
    return not node or node.startswith("~")


def node_tag(node_id: str) -> int:
    """The 16 low bits of a daemon's stamps."""
    return int.from_bytes(hashlib.blake2b(node_id.encode(), digest_size=2).digest(), "big")


class HybridClock:
    """Stamps that only grow, and exceed every stamp observed (thread-safe)."""

    def __init__(self, node_id: str, wall: Callable[[], float] = time.time) -> None:
        self.node_id = node_id
        self.tag = node_tag(node_id)
        self._wall = wall
        self._lock = threading.Lock()
        self._last = 0  # the last stamp made or observed, tag bits cleared

    def now(self) -> int:
        physical = (int(self._wall() * 1000) - EPOCH_MS) << _PHYSICAL_SHIFT
        with self._lock:
            # The counter's carry runs into the milliseconds: still a valid,
            # larger stamp (the clock runs a little ahead until the wall catches up).
            self._last = max(physical, self._last + (1 << _COUNTER_SHIFT))
            return self._last | self.tag

    def observe(self, stamp: int) -> None:
        with self._lock:
            self._last = max(self._last, stamp & ~_TAG_MASK)


def stamp_millis(stamp: int) -> float:
    """Seconds since the Unix epoch at which `stamp` was made (by its writer's clock)."""
    return ((stamp >> _PHYSICAL_SHIFT) + EPOCH_MS) / 1000


class LibraryReplica(Protocol):
    """What the crystal and profile domains see of the library replication.

    `published` is called under the domain's lock with every record this
    daemon writes (in journal order); `acknowledge`, after the local fsync
    and before the write is answered: in `sync` mode it returns once the
    record is in object storage.
    """

    node_id: str
    clock: HybridClock

    def published(self, tenant: str, data: bytes) -> int: ...

    def acknowledge(self, tenant: str, ticket: int) -> None: ...
