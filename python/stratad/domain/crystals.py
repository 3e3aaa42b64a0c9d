"""Crystal memory (seed 001, corteX ``MemoryCrystallizer``): reusable patterns
extracted from successful runs, one library per tenant. User guide: docs/crystals.md.

Behaviour (the seed's, with stratad's precise definitions):

- **Crystallize** stores nothing when ``success_score < min_success_score``
  (default 0.7). Otherwise it extracts a crystal: ``goal_template`` is
  ``native.generalize_goal(goal)``; ``decision_chain`` the first 20 non-empty
  decisions; ``tool_sequence`` the first 15 distinct non-empty tools in order of
  first use; ``error_patterns`` the first 10 steps with a non-empty error, with
  their resolution ("" if none); ``entity_types`` ``native.detect_entity_types(goal)``.
- **Novelty**: the new crystal is rejected when an existing one has tool-sequence
  Jaccard > 0.8 *and* goal-template word overlap > 0.7 (both strictly). Tool
  Jaccard is over the *sets* of tool names (exact strings); word overlap is the
  Jaccard of the sets of ``native.tokenize(goal_template)``. Two empty sets have
  Jaccard 0. Of several similar crystals, the one named is the most similar
  (highest word overlap, then tool Jaccard, then oldest).
- **Effectiveness** starts at ``success_score``, which counts as the first
  observation; each ``RecordReuse`` adds one (1.0 for success, 0.0 for failure):
  ``effectiveness = (e * (n + 1) + outcome) / (n + 2)`` with ``n`` the reuse
  count before, i.e. ``(success_score + successes) / (1 + reuse_count)``.
- **Query** generalizes and tokenizes the goal and ranks crystals sharing at least
  one token by ``score = similarity * (0.5 + 0.5 * effectiveness)``, where
  ``similarity`` is the Jaccard of the token sets; ties go to the older crystal.
- **Eviction**: over ``max_crystals`` (default 200), the least effective crystal
  goes; ties: fewer reuses first, then the oldest. The crystal being created is
  never the one evicted.
- **IDs**: ``crystal_{session_id}_{milliseconds since the epoch}`` (the session ID
  cut to 96 characters so the ID stays within 128); if that ID is taken in the
  library (two crystals of one session in the same millisecond), ``-2``, ``-3``, ...
  is appended.

Scale: everything searched lives in a native ``CrystalIndex`` (goal-token inverted
index, tool sets, effectiveness, eviction order; docs/native.md); this module
keeps only compact per-slot arrays (IDs, sequence numbers, effectiveness, reuse
counts, where each crystal's record is in the journal). A crystal's contents are
read back from its journal record when it is returned, so memory does not grow
with decision chains and error texts, and a million crystals take a few hundred
bytes each.

Persistence: ``<data>/tenants/<tenant>/crystals/journal``, records in the
store/journal.py format: ``config`` (limits and the next sequence number),
``crystal`` (an immutable crystal as created), ``reuse`` (effectiveness and reuse
count after a reuse) and ``delete`` (deleted or evicted). Each mutation is
appended under the library lock and fsynced outside it (group commit), and
acknowledged only after that. When the journal is more than twice what the live
crystals need (and over ``compact_min_bytes``), it is rewritten: a ``config``
record, the live ``crystal`` records copied byte for byte in creation order, and
one ``reuse`` record per crystal reused so far. Replay at start streams the file
(memory-mapped), cuts a torn tail, and refuses writes to a library whose journal
is damaged in the middle (reads keep working).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import builtins
import collections
import contextlib
import dataclasses
import enum
import logging
import math
import mmap
import os
import re
import struct
import sys
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from stratad import native
from stratad.domain.ids import validate_id
from stratad.domain.stamps import LEGACY, Key, is_legacy, legacy_key
from stratad.errors import DataLossError, InvalidArgumentError, NotFoundError, StratadError
from stratad.store import journal as journal_mod
from stratad.store.crypto import RecordCipher
from stratad.store.journal import Journal, Record
from stratad.store.store import Store

if TYPE_CHECKING:
    from stratad.domain.stamps import LibraryReplica

log = logging.getLogger(__name__)

DIRECTORY = "crystals"
JOURNAL = "journal"

DEFAULT_MAX_CRYSTALS = 200
#: The largest max_crystals a tenant may configure.
MAX_CRYSTALS_LIMIT = 10_000_000
DEFAULT_MIN_SUCCESS_SCORE = 0.7
#: Novelty: a crystal is redundant when an existing one is above both (strictly).
TOOL_SIMILARITY_THRESHOLD = 0.8
GOAL_SIMILARITY_THRESHOLD = 0.7
MAX_DECISIONS = 20
MAX_TOOLS = 15
MAX_ERROR_PATTERNS = 10
#: GetCrystalStats counts crystals at least this effective as effective.
EFFECTIVE_THRESHOLD = 0.5
DEFAULT_TOP_K = 3
MAX_TOP_K = 1000
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
#: stratad's bounds for what the seed leaves unbounded.
MAX_TEXT_CHARS = 8192
MAX_TRACE_STEPS = 10_000
_MAX_SESSION_IN_ID = 96

_HEADER = struct.Struct("<II")  # the journal's record header: length, CRC-32
_TOKEN_RE = re.compile(r"c(0|[1-9][0-9]{0,18})")


# -- the crystal ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceStep:
    """One step of an execution trace (the seed's dict; "" is an absent key)."""

    decision: str = ""
    tool: str = ""
    error: str = ""
    resolution: str = ""


@dataclass(frozen=True, slots=True)
class ErrorPattern:
    error: str
    resolution: str = ""


@dataclass(frozen=True, slots=True)
class Crystal:
    crystal_id: str
    goal_template: str
    decision_chain: tuple[str, ...]
    tool_sequence: tuple[str, ...]
    error_patterns: tuple[ErrorPattern, ...]
    success_score: float
    reuse_count: int
    effectiveness: float
    entity_types: tuple[str, ...]
    created_from: str
    created_at: float


class Outcome(enum.Enum):
    CREATED = "created"
    BELOW_THRESHOLD = "below_threshold"
    NOT_NOVEL = "not_novel"


@dataclass(frozen=True, slots=True)
class CrystallizeResult:
    outcome: Outcome
    min_success_score: float
    crystal: Crystal | None = None
    #: NOT_NOVEL: the existing crystal and how similar it is.
    similar_crystal_id: str = ""
    goal_similarity: float = 0.0
    tool_similarity: float = 0.0
    #: CREATED: crystals evicted to make room, least effective first.
    evicted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Match:
    crystal: Crystal
    similarity: float
    score: float


@dataclass(frozen=True, slots=True)
class LibraryConfig:
    max_crystals: int = DEFAULT_MAX_CRYSTALS
    min_success_score: float = DEFAULT_MIN_SUCCESS_SCORE


@dataclass(frozen=True, slots=True)
class Stats:
    total_crystals: int
    effective_crystals: int
    total_reuses: int
    avg_effectiveness: float
    max_crystals: int
    memory_bytes: int
    journal_bytes: int


# -- pure functions (the seed's logic) ---------------------------------------------


def _text(value: object, what: str, *, limit: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a string")
    if len(value) > limit:
        raise InvalidArgumentError(f"{what} is longer than {limit} characters")
    return value


def _unit(value: object, what: str) -> float:
    """A float in [0, 1] (NaN and infinities refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgumentError(f"{what} must be a number")
    number = float(value)
    if not (math.isfinite(number) and 0.0 <= number <= 1.0):
        raise InvalidArgumentError(f"{what} must be between 0 and 1, got {value!r}")
    return number + 0.0  # -0.0 -> 0.0


def validate_trace(trace: Sequence[TraceStep]) -> None:
    if len(trace) > MAX_TRACE_STEPS:
        raise InvalidArgumentError(f"execution_trace has more than {MAX_TRACE_STEPS} steps")
    for i, step in enumerate(trace):
        for name in ("decision", "tool", "error", "resolution"):
            _text(getattr(step, name), f"execution_trace[{i}].{name}")


def extract(
    goal: str,
    trace: Sequence[TraceStep],
    success_score: float,
    *,
    crystal_id: str,
    session_id: str,
    created_at: float,
) -> Crystal:
    """The crystal of one execution (inputs already validated)."""
    decisions = [s.decision for s in trace if s.decision][:MAX_DECISIONS]
    tools = list(dict.fromkeys(s.tool for s in trace if s.tool))[:MAX_TOOLS]
    errors = [ErrorPattern(s.error, s.resolution) for s in trace if s.error]
    return Crystal(
        crystal_id=crystal_id,
        goal_template=native.generalize_goal(goal),
        decision_chain=tuple(decisions),
        tool_sequence=tuple(tools),
        error_patterns=tuple(errors[:MAX_ERROR_PATTERNS]),
        success_score=success_score,
        reuse_count=0,
        effectiveness=success_score,
        entity_types=tuple(native.detect_entity_types(goal)),
        created_from=session_id,
        created_at=created_at,
    )


def running_average(effectiveness: float, reuse_count: int, success: bool) -> float:
    """Effectiveness after one more reuse (the original run counts as the first)."""
    value = (effectiveness * (reuse_count + 1) + (1.0 if success else 0.0)) / (reuse_count + 2)
    return min(1.0, max(0.0, value))


def format_prompt(crystal: Crystal) -> str:
    """The seed's ``apply`` output: a few-shot prompt in markdown.

    Lines whose list is empty (Approach, Tools used, Known pitfalls) are left out;
    a pitfall without a resolution is shown without the ``: resolution`` part.
    """
    lines = [
        f"## Similar Past Success ({crystal.effectiveness:.0%} effective, "
        f"used {crystal.reuse_count}x)",
        f"Goal pattern: {crystal.goal_template}",
    ]
    if crystal.decision_chain:
        lines.append(f"Approach: {' -> '.join(crystal.decision_chain)}")
    if crystal.tool_sequence:
        lines.append(f"Tools used: {', '.join(crystal.tool_sequence)}")
    if crystal.error_patterns:
        lines.append("Known pitfalls:")
        for pattern in crystal.error_patterns:
            suffix = f": {pattern.resolution}" if pattern.resolution else ""
            lines.append(f"  - {pattern.error}{suffix}")
    return "\n".join(lines)


def crystal_id_base(session_id: str, created_at: float) -> str:
    return f"crystal_{session_id[:_MAX_SESSION_IN_ID]}_{int(created_at * 1000)}"


def encode_page_token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"c{seq}".encode()).decode()


def decode_page_token(token: str) -> int:
    """The sequence number a page token carries (-1 for none)."""
    if not token:
        return -1
    try:
        text = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError, binascii.Error):
        text = ""
    found = _TOKEN_RE.fullmatch(text)
    if found is None:
        raise InvalidArgumentError("page_token is not a token this server issued")
    return int(found.group(1))


# -- records ---------------------------------------------------------------------------


class _Encoded(Record):
    """A record encoded once, so that its size is known when it is appended and
    compaction can copy it byte for byte."""

    def __init__(self, data: bytes) -> None:
        super().__init__("")
        self.data = data

    def encode(self, cipher: RecordCipher | None = None) -> bytes:
        return self.data  # encoded (and sealed, if at all) when it was made

    def pieces(
        self, cipher: RecordCipher | None = None
    ) -> list[bytes]:  # what Journal.append writes
        return [self.data]


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


# -- one tenant's library ----------------------------------------------------------------


@dataclass(eq=False)
class _Library:
    """One tenant's crystals. Every field is guarded by `lock`.

    Slots are allocated by the native index; the arrays below are indexed by slot.
    """

    tenant: str
    root: Path
    config: LibraryConfig = field(default_factory=LibraryConfig)
    lock: threading.Lock = field(default_factory=threading.Lock)
    journal: Journal | None = None
    #: Seals the journal's records (encryption at rest); None: plaintext.
    cipher: RecordCipher | None = None
    read_fd: int = -1
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
    #: The replication ticket of the last record this daemon appended (see _append).
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

    def slot_of(self, crystal_id: str) -> int:
        slot = self.ids.get(crystal_id)
        if slot is None:
            raise NotFoundError(f"crystal {crystal_id!r} not found")
        return slot

    def read(self, slot: int) -> Crystal:
        """The crystal in `slot`, its contents read back from the journal."""
        offset, size = self.offset_at[slot], self.size_at[slot]
        try:
            data = os.pread(self.read_fd, size, offset)
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


# -- all tenants --------------------------------------------------------------------------


class CrystalLibraries:
    """Every tenant's crystal library over one store (the domain of CrystalService)."""

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
            root = self.store.tenants_root / name / DIRECTORY
            with contextlib.suppress(FileNotFoundError):
                (root / (JOURNAL + ".tmp")).unlink()  # an interrupted compaction
            if not (root / JOURNAL).exists():
                continue
            lib = _Library(name, root)
            self._replay(lib, report)
            with self._lock:
                self._libraries[name] = lib
            report["crystals"] += len(lib)
        return dict(report)

    def _replay(self, lib: _Library, report: collections.Counter[str]) -> None:
        path = lib.root / JOURNAL
        lib.cipher = self.store.journal_cipher(path)
        end = 0
        torn = zeros = False
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    data = cast(bytes, mapped)
                    released = 0
                    try:
                        for record, start, stop in _records(data, lib.cipher):
                            self._apply(lib, record, start, stop - start)
                            end = stop
                            released = _release(mapped, released, end)
                    except (KeyError, TypeError, ValueError, DataLossError) as exc:
                        log.error("bad crystal journal record at byte %d: %s", end, exc)
                    else:
                        torn = end < size and journal_mod._is_torn_tail(data, end, lib.cipher)
                        zeros = torn and mapped[end:] == bytes(size - end)
        if end < size:
            if torn:
                journal_mod.truncate(path, end)
                if zeros:  # the preallocated space of a journal left open
                    report["crystal_zero_tails_cut"] += 1
                else:
                    report["crystal_torn_tails_cut"] += 1
                    log.warning("cut a torn crystal journal tail of %d bytes", size - end)
            else:
                lib.damaged = (
                    f"the crystal journal of tenant {lib.tenant!r} is damaged at byte {end}; "
                    "its crystals can be read but not changed"
                )
                report["damaged_crystal_journals"] += 1
                log.error(lib.damaged)
        lib.journal = self.store.open_journal(path)
        lib.read_fd = os.open(path, os.O_RDONLY)

    def _apply(self, lib: _Library, record: Record, offset: int, size: int) -> None:
        """Apply one journal record (replay, or a record another daemon wrote).

        Records with a stamp (written while the library replicates) merge by
        the rules of docs/replication.md: last writer wins per crystal ID and
        for the config, deletions are tombstones, reuse counters add up per
        daemon. Records without one (before replication) apply in order.
        """
        body = record.body
        if self.replica is not None:
            self.replica.clock.observe(_stamp_of(record))
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
                self._apply_counters(lib, body, slot)
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

    @staticmethod
    def _apply_counters(lib: _Library, body: dict[str, Any], slot: int | None) -> None:
        node, seq = body["node"], body["seq"]
        reuses, successes = body["reuses"], body["successes"]
        if slot is not None and lib.seq_at[slot] == seq:
            lib.add_reuses(slot, node, reuses, successes)
        elif slot is None and body["id"] not in lib.tombstones:
            waiting = lib.pending.setdefault(body["id"], {})
            if reuses > waiting.get(node, (0, 0, 0))[1]:
                waiting[node] = (seq, reuses, successes)

    @staticmethod
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

    def close(self) -> None:
        """Stop compacting and release read handles (the store closes the journals)."""
        with self._lock:
            self._closed = True
            libraries = list(self._libraries.values())
        for lib in libraries:
            with lib.lock:
                if lib.read_fd >= 0:
                    os.close(lib.read_fd)
                    lib.read_fd = -1

    # -- libraries ---------------------------------------------------------------

    def _library(self, tenant: str, *, create: bool) -> _Library | None:
        with self._lock:
            lib = self._libraries.get(tenant)
            if lib is None and create:
                validate_id(tenant, "tenant")
                lib = _Library(tenant, self.store.tenants_root / tenant / DIRECTORY)
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
        if lib.journal is None:
            self.store.make_dirs(lib.root)
            path = lib.root / JOURNAL
            lib.journal = self.store.open_journal(path)
            lib.cipher = lib.journal.cipher
            lib.read_fd = os.open(path, os.O_RDONLY)
            self.store.fsync_dir(lib.root)
        return lib.journal

    def _append(self, lib: _Library, record: Record) -> tuple[int, int]:
        """Append `record` this daemon wrote (lock held); return its offset and size.

        With replication, the record is also queued for this daemon's library
        stream in object storage (`lib.ticket` says when it is shipped), in
        plaintext: the stream's segments are sealed as a whole (store/remote.py).
        """
        journal = self._journal(lib)
        plain = record.encode()
        data = journal_mod.seal_record(plain, journal.cipher)
        end = journal.append(_Encoded(data))
        if self.replica is not None:
            lib.ticket = self.replica.published(lib.tenant, plain)
        return end - len(data), len(data)

    def _acknowledge(self, tenant: str, ticket: int) -> None:
        """After the local fsync: `sync` replication waits here for object storage."""
        if self.replica is not None and ticket:
            self.replica.acknowledge(tenant, ticket)

    def _id_tag(self) -> str:
        """With replication, IDs end in the daemon's tag: two daemons crystallizing for
        one session in the same millisecond must not make the same ID."""
        return "" if self.replica is None else f"_{self.replica.clock.tag:04x}"

    def _stamped(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with a stamp and this daemon's node ID, when the library replicates."""
        if self.replica is None:
            return body
        return {**body, "stamp": self.replica.clock.now(), "node": self.replica.node_id}

    def _delete_record(self, crystal_id: str, why: str) -> Record:
        return Record("delete", self._stamped({"id": crystal_id, "why": why}))

    # -- Crystallize -------------------------------------------------------------

    def crystallize(
        self,
        tenant: str,
        goal: str,
        execution_trace: Sequence[TraceStep],
        success_score: float,
        session_id: str = "",
        *,
        min_success_score: float | None = None,
    ) -> CrystallizeResult:
        goal = _text(goal, "goal")
        if not goal.strip():
            raise InvalidArgumentError("goal must not be empty")
        success_score = _unit(success_score, "success_score")
        if session_id:
            validate_id(session_id, "session_id")
        validate_trace(execution_trace)
        if min_success_score is not None:
            min_success_score = _unit(min_success_score, "min_success_score")
        lib = self._writable(tenant)
        threshold = lib.config.min_success_score if min_success_score is None else min_success_score
        if success_score < threshold:
            return CrystallizeResult(Outcome.BELOW_THRESHOLD, threshold)
        draft = extract(
            goal, execution_trace, success_score, crystal_id="", session_id=session_id,
            created_at=0.0,
        )  # fmt: skip
        goal_tokens = native.tokenize(draft.goal_template)
        with lib.lock:
            self._check_writable(lib)
            similar = lib.index.find_similar(
                goal_tokens,
                list(draft.tool_sequence),
                GOAL_SIMILARITY_THRESHOLD,
                TOOL_SIMILARITY_THRESHOLD,
            )
            if similar is None:
                crystal, evicted, end = self._create(lib, draft, session_id)
            journal, ticket = lib.journal, lib.ticket
            if similar is None:
                self._maybe_compact(lib)
        if similar is not None:
            slot, goal_similarity, tool_similarity = similar
            similar_id = lib.id_at[slot]
            assert similar_id is not None
            # The crystal named may be another call's, not durable yet: never
            # answer ahead of it (locally, and in object storage in `sync` mode).
            if journal is not None:
                journal.sync()
            self._acknowledge(tenant, ticket)
            return CrystallizeResult(
                Outcome.NOT_NOVEL,
                threshold,
                similar_crystal_id=similar_id,
                goal_similarity=goal_similarity,
                tool_similarity=tool_similarity,
            )
        assert journal is not None
        journal.sync(end)  # after a compaction: at once (it synced this journal)
        self._acknowledge(tenant, ticket)
        return CrystallizeResult(Outcome.CREATED, threshold, crystal=crystal, evicted=evicted)

    def _create(
        self, lib: _Library, draft: Crystal, session_id: str
    ) -> tuple[Crystal, tuple[str, ...], int]:
        """Store a novel crystal (lock held); (it, the crystals evicted, the journal end)."""
        created_at = self.clock()
        crystal_id = base = crystal_id_base(session_id, created_at) + self._id_tag()
        suffix = 2
        while crystal_id in lib.ids:
            crystal_id, suffix = f"{base}-{suffix}", suffix + 1
        crystal = dataclasses.replace(draft, crystal_id=crystal_id, created_at=created_at)
        if self.replica is None:
            body = _crystal_body(crystal, lib.next_seq)
        else:  # the stamp orders crystals alike on every daemon
            body = _crystal_body(crystal, self.replica.clock.now(), self.replica.node_id)
        offset, size = self._append(lib, Record("crystal", body))
        slot = lib.insert(body, offset, size)
        evicted, end = self._evict(lib, lib.config.max_crystals, keep=slot)
        return crystal, evicted, max(end, offset + size)

    def _evict(
        self, lib: _Library, limit: int, *, keep: int | None = None
    ) -> tuple[tuple[str, ...], int]:
        """Evict the least effective crystals (lock held) until at most `limit` remain."""
        evicted: list[str] = []
        end = 0
        while len(lib) > limit:
            slot = lib.index.least_effective(keep)
            if slot is None:
                break
            crystal_id = lib.id_at[slot]
            assert crystal_id is not None
            record = self._delete_record(crystal_id, "evict")
            offset, size = self._append(lib, record)
            end = offset + size
            if "stamp" in record.body:
                lib.bury(crystal_id, (record.body["stamp"], record.body["node"]))
            else:
                lib.discard(crystal_id)
            evicted.append(crystal_id)
        return tuple(evicted), end

    # -- reads --------------------------------------------------------------------

    def query(
        self, tenant: str, goal_text: str, top_k: int = DEFAULT_TOP_K
    ) -> tuple[str, list[Match]]:
        """(the generalized goal, the best matches, best first)."""
        goal_text = _text(goal_text, "goal_text")
        if top_k < 0 or top_k > MAX_TOP_K:
            raise InvalidArgumentError(f"top_k must be between 1 and {MAX_TOP_K}")
        top_k = top_k or DEFAULT_TOP_K
        template = native.generalize_goal(goal_text)
        tokens = native.tokenize(template)
        lib = self._library(tenant, create=False)
        if lib is None or not tokens:
            return template, []
        removals = lib.removals
        hits = lib.index.top_k(tokens, top_k)  # without the lock: searches run in parallel
        with lib.lock:
            if lib.removals != removals:  # a slot may now hold another crystal
                hits = lib.index.top_k(tokens, top_k)
            crystals = [lib.read(slot) for slot, _, _ in hits]
        return template, [
            Match(crystal, similarity, score)
            for crystal, (_, score, similarity) in zip(crystals, hits, strict=True)
        ]

    def get(self, tenant: str, crystal_id: str) -> Crystal:
        validate_id(crystal_id, "crystal_id")
        lib = self._library(tenant, create=False)
        if lib is None:
            raise NotFoundError(f"crystal {crystal_id!r} not found")
        with lib.lock:
            return lib.read(lib.slot_of(crystal_id))

    def apply(self, tenant: str, crystal_id: str, context: str = "") -> str:
        """The crystal as a few-shot prompt (the seed's format); `context` is not used."""
        _text(context, "context", limit=1 << 20)
        return format_prompt(self.get(tenant, crystal_id))

    def list(
        self, tenant: str, *, page_size: int = DEFAULT_PAGE_SIZE, page_token: str = ""
    ) -> tuple[list[Crystal], str]:
        """Crystals oldest first; the token carries the last one's sequence number."""
        if page_size < 0:
            raise InvalidArgumentError("page_size must not be negative")
        page_size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        after = decode_page_token(page_token)
        lib = self._library(tenant, create=False)
        if lib is None:
            return [], ""
        page: list[Crystal] = []
        with lib.lock:
            i = bisect.bisect_right(lib.listed_seq, after)
            last = after
            while i < len(lib.listed_seq):
                seq, slot = lib.listed_seq[i], lib.listed_slot[i]
                i += 1
                if lib.seq_at[slot] != seq:
                    continue  # removed
                if len(page) == page_size:
                    return page, encode_page_token(last)
                page.append(lib.read(slot))
                last = seq
        return page, ""

    def stats(self, tenant: str) -> Stats:
        lib = self._library(tenant, create=False)
        if lib is None:
            return Stats(0, 0, 0, 0.0, DEFAULT_MAX_CRYSTALS, 0, 0)
        with lib.lock:
            count, effective, reuses, total = lib.index.stats(EFFECTIVE_THRESHOLD)
            return Stats(
                total_crystals=count,
                effective_crystals=effective,
                total_reuses=reuses,
                avg_effectiveness=total / count if count else 0.0,
                max_crystals=lib.config.max_crystals,
                memory_bytes=lib.memory_bytes(),
                journal_bytes=lib.journal.size if lib.journal is not None else 0,
            )

    def config(self, tenant: str) -> LibraryConfig:
        lib = self._library(tenant, create=False)
        return lib.config if lib is not None else LibraryConfig()

    # -- writes ---------------------------------------------------------------------

    def record_reuse(self, tenant: str, crystal_id: str, success: bool) -> Crystal:
        validate_id(crystal_id, "crystal_id")
        lib = self._library(tenant, create=False)
        if lib is None:
            raise NotFoundError(f"crystal {crystal_id!r} not found")
        with lib.lock:
            slot = lib.slot_of(crystal_id)
            self._check_writable(lib)
            if self.replica is not None:
                offset, size = self._record_counted_reuse(lib, slot, success)
            else:
                reuse_count = lib.reuses_at[slot] + 1
                effectiveness = running_average(
                    lib.effectiveness_at[slot], lib.reuses_at[slot], success
                )
                record = Record(
                    "reuse",
                    {
                        "id": crystal_id,
                        "success": bool(success),
                        "effectiveness": effectiveness,
                        "reuse_count": reuse_count,
                    },
                )
                offset, size = self._append(lib, record)
                lib.set_reuse(slot, effectiveness, reuse_count)
            crystal = lib.read(slot)
            journal, ticket = lib.journal, lib.ticket
            self._maybe_compact(lib)
        assert journal is not None
        journal.sync(offset + size)
        self._acknowledge(tenant, ticket)
        return crystal

    def _record_counted_reuse(self, lib: _Library, slot: int, success: bool) -> tuple[int, int]:
        """A reuse in a replicated library: this daemon's counters, cumulative (lock held).

        Each daemon journals its own totals for the crystal, so that reuses
        recorded on several daemons at once add up wherever they are merged.
        """
        assert self.replica is not None
        node = self.replica.node_id
        reuses, successes = lib.contributions(slot).get(node, (0, 0))
        reuses, successes = reuses + 1, successes + int(bool(success))
        body = {
            "id": lib.id_at[slot], "seq": lib.seq_at[slot], "node": node,
            "reuses": reuses, "successes": successes,
        }  # fmt: skip
        offset, size = self._append(lib, Record("reuse", body))
        lib.add_reuses(slot, node, reuses, successes)
        return offset, size

    def delete(self, tenant: str, crystal_id: str) -> None:
        validate_id(crystal_id, "crystal_id")
        lib = self._library(tenant, create=False)
        if lib is None:
            raise NotFoundError(f"crystal {crystal_id!r} not found")
        with lib.lock:
            lib.slot_of(crystal_id)
            self._check_writable(lib)
            record = self._delete_record(crystal_id, "delete")
            offset, size = self._append(lib, record)
            if "stamp" in record.body:
                lib.bury(crystal_id, (record.body["stamp"], record.body["node"]))
            else:
                lib.discard(crystal_id)
            journal, ticket = lib.journal, lib.ticket
            self._maybe_compact(lib)
        assert journal is not None
        journal.sync(offset + size)
        self._acknowledge(tenant, ticket)

    def set_config(
        self,
        tenant: str,
        *,
        max_crystals: int | None = None,
        min_success_score: float | None = None,
    ) -> tuple[LibraryConfig, int]:
        """Change the library's limits; (the new config, how many crystals were evicted)."""
        if max_crystals is not None and not 1 <= max_crystals <= MAX_CRYSTALS_LIMIT:
            raise InvalidArgumentError(
                f"max_crystals must be between 1 and {MAX_CRYSTALS_LIMIT}, got {max_crystals}"
            )
        if min_success_score is not None:
            min_success_score = _unit(min_success_score, "min_success_score")
        lib = self._writable(tenant)
        with lib.lock:
            self._check_writable(lib)
            old = lib.config
            config = LibraryConfig(
                old.max_crystals if max_crystals is None else max_crystals,
                old.min_success_score if min_success_score is None else min_success_score,
            )
            record = self._config_record(lib, config, self._stamped({}))
            offset, size = self._append(lib, record)
            lib.config = config
            if "stamp" in record.body:
                lib.config_key = (record.body["stamp"], record.body["node"])
            evicted, end = self._evict(lib, config.max_crystals)
            journal, ticket = lib.journal, lib.ticket
            end = max(end, offset + size)
            self._maybe_compact(lib)
        assert journal is not None
        journal.sync(end)
        self._acknowledge(tenant, ticket)
        return config, len(evicted)

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
        old = lib.journal
        assert old is not None
        old.sync_now()  # writers still waiting on `old` find their records synced
        path = lib.root / JOURNAL
        new_offsets = array("q", lib.offset_at)
        with mmap.mmap(lib.read_fd, 0, access=mmap.ACCESS_READ) as mapped:
            self.store.rewrite_journal(path, self._live_records(lib, mapped, new_offsets))
        lib.offset_at = new_offsets
        lib.journal = self.store.open_journal(path)
        old_fd, lib.read_fd = lib.read_fd, os.open(path, os.O_RDONLY)
        os.close(old_fd)
        old.close(trim=False)
        if lib.listed_holes:
            lib._trim_listing()
        log.info(
            "compacted the crystal journal of tenant %r: %d crystals, %d bytes",
            lib.tenant,
            len(lib),
            lib.journal.size,
        )

    def _live_records(
        self, lib: _Library, mapped: mmap.mmap, new_offsets: array[int]
    ) -> Iterator[Record]:
        """The compacted journal's records; fills `new_offsets` as it goes."""
        pos = 0
        header = _Encoded(self._config_record(lib, lib.config).encode(lib.cipher))
        pos += len(header.data)
        yield header
        live = [
            (seq, slot)
            for seq, slot in zip(lib.listed_seq, lib.listed_slot, strict=True)
            if lib.seq_at[slot] == seq
        ]
        released = 0
        for _, slot in live:
            offset, size = lib.offset_at[slot], lib.size_at[slot]
            data = mapped[offset : offset + size]
            new_offsets[slot] = pos
            pos += size
            released = _release(mapped, released, offset)
            yield _Encoded(data)
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

    # -- replication (domain/library_replication.py) ----------------------------------

    def apply_remote(self, tenant: str, records: Sequence[tuple[Record, bytes]]) -> int:
        """Merge records another daemon wrote (from its stream); how many changed.

        A record that changes the library is appended to the local journal
        byte for byte (a crystal's contents are read back from there, the same
        bytes on every daemon), then applied; the rest are dropped. Applying a
        segment twice changes nothing the second time.
        """
        lib = self._writable(tenant)
        changed, end = 0, 0
        with lib.lock:
            self._check_writable(lib)
            for record, data in records:
                if self.replica is not None:
                    self.replica.clock.observe(_stamp_of(record))
                if not self._changes(lib, record):
                    if record.kind == "reuse" and "node" in record.body:
                        self._apply_counters(lib, record.body, lib.ids.get(record.body["id"]))
                    continue
                target = self._journal(lib)
                sealed = journal_mod.seal_record(data, target.cipher)
                end = target.append(_Encoded(sealed))
                self._apply(lib, record, end - len(sealed), len(sealed))
                changed += 1
            journal = lib.journal
            if changed:
                self._maybe_compact(lib)
        if changed and journal is not None:
            journal.sync(end)
        return changed

    def export_origin(self, tenant: str, nodes: Collection[str]) -> builtins.list[bytes]:
        """A stream base: what of the library the daemons `nodes` wrote and still holds.

        Their live crystals (the records byte for byte), their reuse counters,
        their tombstones, the config if they set it last; and what was written
        before replication (no daemon named), which every daemon publishes.
        """
        lib = self._library(tenant, create=False)
        if lib is None:
            return []
        ours = {*nodes, ""}
        out: builtins.list[bytes] = []
        with lib.lock:
            if lib.config_key == LEGACY and lib.config != LibraryConfig():
                lib.config_key = legacy_key(dataclasses.astuple(lib.config))  # set before
            if lib.config_key != LEGACY and (
                lib.config_key[1] in nodes or is_legacy(lib.config_key[1])
            ):
                out.append(self._config_record(lib, lib.config).encode())
            live = [
                slot
                for seq, slot in zip(lib.listed_seq, lib.listed_slot, strict=True)
                if lib.seq_at[slot] == seq
            ]
            for slot in live:
                if lib.node_at[slot] in ours:
                    stored = os.pread(lib.read_fd, lib.size_at[slot], lib.offset_at[slot])
                    out.append(journal_mod.open_record(stored, lib.cipher))
            for slot in live:
                if lib.reuses_at[slot]:
                    lib.contributions(slot)
                    out.extend(r.encode() for r in _counter_records(lib, slot, ours.__contains__))
            for crystal_id, key in lib.tombstones.items():
                if key[1] in nodes:
                    body = {"id": crystal_id, "why": "delete", "stamp": key[0], "node": key[1]}
                    out.append(Record("delete", body).encode())
        return out

    def tenants(self) -> builtins.list[str]:
        """Tenants with a crystal library here."""
        with self._lock:
            return sorted(self._libraries)


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


#: While streaming through a mapped journal, the pages already read are released
#: (they stay in the page cache) every this many bytes, so that replaying or
#: compacting a large journal does not hold all of it in the daemon's memory.
_RELEASE_BYTES = 64 << 20


def _release(mapped: mmap.mmap, released: int, upto: int) -> int:
    """Drop the mapped pages in [released, upto) once there are enough; return the new mark."""
    if upto - released < _RELEASE_BYTES:
        return released
    end = upto - upto % mmap.PAGESIZE
    with contextlib.suppress(OSError, ValueError):
        mapped.madvise(mmap.MADV_DONTNEED, released, end - released)
    return end


def _records(data: bytes, cipher: RecordCipher | None) -> Iterator[tuple[Record, int, int]]:
    """(record, start, end) of every valid record from the start of `data`.

    A record that is framed correctly but does not open with `cipher` raises
    (a DataLossError): damage, not a torn tail.
    """
    pos = 0
    while pos < len(data):
        found = journal_mod._read_record(data, pos, cipher)
        if found is None:
            return
        record, end = found
        yield record, pos, end
        pos = end


__all__ = [
    "DEFAULT_MAX_CRYSTALS",
    "DEFAULT_MIN_SUCCESS_SCORE",
    "GOAL_SIMILARITY_THRESHOLD",
    "MAX_CRYSTALS_LIMIT",
    "TOOL_SIMILARITY_THRESHOLD",
    "Crystal",
    "CrystalLibraries",
    "CrystallizeResult",
    "ErrorPattern",
    "LibraryConfig",
    "Match",
    "Outcome",
    "Stats",
    "TraceStep",
    "extract",
    "format_prompt",
    "running_average",
]
