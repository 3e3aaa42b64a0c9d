"""Where a crystal library lives on disk: appends, replay at start, compaction.

``<data>/tenants/<tenant>/crystals/journal`` holds the records of codec.py.
Each mutation is appended under the library lock and fsynced outside it (group
commit), and acknowledged only after that. When the journal is more than twice
what the live crystals need (and over ``compact_min_bytes``), it is rewritten: a
``config`` record, the live ``crystal`` records copied byte for byte in creation
order, one ``reuse`` record per crystal reused so far (with replication, one per
daemon's counters) and the deletion tombstones. The files are the log engine's
(store/log.py): replay at start streams the file (memory-mapped), cuts a torn
tail, and this module refuses writes to a library whose journal is damaged in the
middle (reads keep working).

`_JournaledLibraries` is the base of `CrystalLibraries` (service.py): the
tenants' libraries and their journals, without the operations of the service.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from stratad.domain.crystals.library import _Library
from stratad.domain.crystals.merge import _apply_record, _counter_records, _stamp_of
from stratad.domain.crystals.model import LibraryConfig
from stratad.domain.stamps import LEGACY
from stratad.errors import DataLossError, StratadError
from stratad.ids import validate_id
from stratad.store.journal import Journal, Record
from stratad.store.log import RELEASE_BYTES, Encoded, Log, Reader
from stratad.store.store import Store

if TYPE_CHECKING:
    from stratad.domain.stamps import LibraryReplica

log = logging.getLogger(__name__)

DIRECTORY = "crystals"
JOURNAL = "journal"

#: Replay and compaction release the pages of the journal they have read
#: every this many bytes (store/log.py).
_RELEASE_BYTES = RELEASE_BYTES


class _JournaledLibraries:
    """Every tenant's crystal library over one store, and the journals behind them."""

    def __init__(
        self,
        store: Store,
        *,
        compact_min_bytes: int = 4 << 20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.compact_min_bytes = compact_min_bytes
        self.clock = clock
        self._lock = threading.Lock()
        self._libraries: dict[str, _Library] = {}
        self._closed = False
        #: Set when tenant libraries replicate to object storage (domain/library_replication.py).
        self.replica: LibraryReplica | None = None

    # -- recovery ----------------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """Replay every tenant's crystal journal (cutting a torn tail)."""
        report = collections.Counter[str]()
        for name in self.store.existing_tenant_names():
            lib = self._new_library(name)
            if not lib.log.exists():
                continue
            self._replay(lib, report)
            with self._lock:
                self._libraries[name] = lib
            report["crystals"] += len(lib)
        return dict(report)

    def _new_library(self, tenant: str) -> _Library:
        root = self.store.tenants_root / tenant / DIRECTORY
        return _Library(tenant, root, Log(self.store, root / JOURNAL))

    def _replay(self, lib: _Library, report: collections.Counter[str]) -> None:
        found = lib.log.recover(
            lambda record, start, stop: self._apply(lib, record, start, stop - start),
            refused=(KeyError, TypeError, ValueError, DataLossError),
            release_bytes=_RELEASE_BYTES,
            reads=True,
        )
        if found.error:
            log.error("bad crystal journal record at byte %d: %s", found.valid_bytes, found.error)
        if found.zero_tail:  # the preallocated space of a journal left open
            report["crystal_zero_tails_cut"] += 1
        elif found.torn:
            report["crystal_torn_tails_cut"] += 1
            log.warning("cut a torn crystal journal tail of %d bytes", found.cut_bytes)
        if found.damaged_at is not None:
            lib.damaged = (
                f"the crystal journal of tenant {lib.tenant!r} is damaged at byte "
                f"{found.damaged_at}; its crystals can be read but not changed"
            )
            report["damaged_crystal_journals"] += 1
            log.error(lib.damaged)

    def _apply(self, lib: _Library, record: Record, offset: int, size: int) -> None:
        """Apply one journal record (replay, or a record another daemon wrote) by the
        merge rules of merge.py, after the hybrid clock has seen its stamp."""
        if self.replica is not None:
            self.replica.clock.observe(_stamp_of(record))
        _apply_record(lib, record, offset, size)

    def close(self) -> None:
        """Stop compacting and release read handles (the store closes the journals)."""
        with self._lock:
            self._closed = True
            libraries = list(self._libraries.values())
        for lib in libraries:
            with lib.lock:
                lib.log.close()

    # -- libraries ---------------------------------------------------------------

    def _library(self, tenant: str, *, create: bool) -> _Library | None:
        with self._lock:
            lib = self._libraries.get(tenant)
            if lib is None and create:
                validate_id(tenant, "tenant")
                lib = self._new_library(tenant)
                self._libraries[tenant] = lib
        return lib

    def _writable(self, tenant: str) -> _Library:
        lib = self._library(tenant, create=True)
        assert lib is not None
        return lib

    @staticmethod
    def _check_writable(lib: _Library) -> None:
        if lib.damaged:
            raise DataLossError(lib.damaged)

    def _journal(self, lib: _Library) -> Journal:
        lib.log.create(reads=True)
        assert lib.journal is not None
        return lib.journal

    def _append(self, lib: _Library, record: Record) -> tuple[int, int]:
        """Append `record` this daemon wrote (lock held); return its offset and size.

        With replication, the record is also queued for this daemon's library
        stream in object storage (`lib.ticket` says when it is shipped), in
        plaintext: the stream's segments are sealed as a whole (store/remote.py).
        """
        self._journal(lib)
        plain = record.encode()
        appended = lib.log.append_plain(plain)
        if self.replica is not None:
            lib.ticket = self.replica.published(lib.tenant, plain)
        return appended.start, appended.end - appended.start

    def _acknowledge(self, tenant: str, ticket: int) -> None:
        """After the local fsync: `sync` replication waits here for object storage."""
        if self.replica is not None and ticket:
            self.replica.acknowledge(tenant, ticket)

    @staticmethod
    def _config_record(
        lib: _Library, config: LibraryConfig, stamp: dict[str, Any] | None = None
    ) -> Record:
        """A `config` record; `stamp` ({"stamp", "node"}) when the library replicates."""
        if stamp is None and lib.config_key != LEGACY:
            stamp = {"stamp": lib.config_key[0], "node": lib.config_key[1]}
        return Record(
            "config",
            {
                "max_crystals": config.max_crystals,
                "min_success_score": config.min_success_score,
                "next_seq": lib.next_seq,
                **(stamp or {}),
            },
        )

    # -- compaction ------------------------------------------------------------------

    def _maybe_compact(self, lib: _Library) -> None:
        """Rewrite the journal once it is twice what the live crystals need (lock held)."""
        journal = lib.journal
        if journal is None or self._closed:
            return
        needed = lib.live_bytes + 128 * (lib.reused + lib.contrib_entries + len(lib.tombstones))
        needed += 256
        if journal.size <= max(self.compact_min_bytes, 2 * needed):
            return
        try:
            self.compact(lib)
        except (OSError, StratadError):
            # The mutation that got here is journaled: it must not fail. The
            # old journal stays in use; the next mutation tries again.
            log.exception("compacting the crystal journal of tenant %r failed", lib.tenant)

    def compact(self, lib: _Library) -> None:
        """Rewrite `lib`'s journal with only what its live crystals need (lock held)."""
        new_offsets = array("q", lib.offset_at)
        lib.log.compact(
            lambda reader: self._live_records(lib, reader, new_offsets),
            release_bytes=_RELEASE_BYTES,
        )
        lib.offset_at = new_offsets
        if lib.listed_holes:
            lib._trim_listing()
        log.info(
            "compacted the crystal journal of tenant %r: %d crystals, %d bytes",
            lib.tenant,
            len(lib),
            lib.log.size,
        )

    def _live_records(
        self, lib: _Library, reader: Reader, new_offsets: array[int]
    ) -> Iterator[Record]:
        """The compacted journal's records; fills `new_offsets` as it goes."""
        pos = 0
        header = Encoded(self._config_record(lib, lib.config).encode(lib.cipher))
        pos += len(header.data)
        yield header
        live = [
            (seq, slot)
            for seq, slot in zip(lib.listed_seq, lib.listed_slot, strict=True)
            if lib.seq_at[slot] == seq
        ]
        for _, slot in live:
            offset, size = lib.offset_at[slot], lib.size_at[slot]
            data = reader.read(offset, size)
            new_offsets[slot] = pos
            pos += size
            yield Encoded(data)
        for _, slot in live:
            if slot in lib.contrib:  # replicated: every daemon's counters
                yield from _counter_records(lib, slot, lambda node: True)
            elif lib.reuses_at[slot]:
                body = {
                    "id": lib.id_at[slot],
                    "effectiveness": lib.effectiveness_at[slot],
                    "reuse_count": lib.reuses_at[slot],
                }
                yield Record("reuse", body)
        for crystal_id, (stamp, node) in lib.tombstones.items():
            yield Record(
                "delete", {"id": crystal_id, "why": "delete", "stamp": stamp, "node": node}
            )
