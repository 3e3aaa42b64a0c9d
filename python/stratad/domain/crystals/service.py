"""CrystalService's domain: the operations server/servicers/crystal.py calls.

Crystallize, query, apply, reuse, list, stats, delete and the library config,
validated and made durable before they answer; and the two entry points of
library replication (domain/library_replication.py): `apply_remote` merges
another daemon's records, `export_origin` is what this daemon publishes as a
stream base. The rules are model.py's and merge.py's, the state library.py's,
the journals persistence.py's: this module only sequences them under the
library lock.
"""

from __future__ import annotations

import bisect
import builtins
import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from stratad import native
from stratad.domain.crystals.codec import _crystal_body
from stratad.domain.crystals.library import _Library
from stratad.domain.crystals.merge import _apply_counters, _changes, _counter_records, _stamp_of
from stratad.domain.crystals.model import (
    DEFAULT_MAX_CRYSTALS,
    DEFAULT_PAGE_SIZE,
    DEFAULT_TOP_K,
    EFFECTIVE_THRESHOLD,
    GOAL_SIMILARITY_THRESHOLD,
    MAX_CRYSTALS_LIMIT,
    MAX_PAGE_SIZE,
    MAX_TOP_K,
    TOOL_SIMILARITY_THRESHOLD,
    Crystal,
    CrystallizeResult,
    LibraryConfig,
    Match,
    Outcome,
    Stats,
    TraceStep,
    _text,
    _unit,
    crystal_id_base,
    decode_page_token,
    encode_page_token,
    extract,
    format_prompt,
    running_average,
    validate_trace,
)
from stratad.domain.crystals.persistence import _JournaledLibraries
from stratad.domain.stamps import LEGACY, is_legacy, legacy_key
from stratad.errors import InvalidArgumentError, NotFoundError
from stratad.ids import validate_id
from stratad.store import journal as journal_mod
from stratad.store.journal import Record


class CrystalLibraries(_JournaledLibraries):
    """Every tenant's crystal library over one store (the domain of CrystalService)."""

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
                crystal, evicted = self._create(lib, draft, session_id)
            # Everything appended so far: this call's records, or (not novel)
            # those of the call that stored the similar crystal.
            durable = lib.log.ticket() if lib.journal is not None else None
            ticket = lib.ticket
            if similar is None:
                self._maybe_compact(lib)
        if similar is not None:
            slot, goal_similarity, tool_similarity = similar
            similar_id = lib.id_at[slot]
            assert similar_id is not None
            # The crystal named may be another call's, not durable yet: never
            # answer ahead of it (locally, and in object storage in `sync` mode).
            if durable is not None:
                durable.wait()
            self._acknowledge(tenant, ticket)
            return CrystallizeResult(
                Outcome.NOT_NOVEL,
                threshold,
                similar_crystal_id=similar_id,
                goal_similarity=goal_similarity,
                tool_similarity=tool_similarity,
            )
        assert durable is not None
        durable.wait()  # after a compaction: at once (it synced this journal)
        self._acknowledge(tenant, ticket)
        return CrystallizeResult(Outcome.CREATED, threshold, crystal=crystal, evicted=evicted)

    def _create(
        self, lib: _Library, draft: Crystal, session_id: str
    ) -> tuple[Crystal, tuple[str, ...]]:
        """Store a novel crystal (lock held); (it, the crystals evicted)."""
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
        return crystal, self._evict(lib, lib.config.max_crystals, keep=slot)

    def _evict(self, lib: _Library, limit: int, *, keep: int | None = None) -> tuple[str, ...]:
        """Evict the least effective crystals (lock held) until at most `limit` remain."""
        evicted: list[str] = []
        while len(lib) > limit:
            slot = lib.index.least_effective(keep)
            if slot is None:
                break
            crystal_id = lib.id_at[slot]
            assert crystal_id is not None
            record = self._delete_record(crystal_id, "evict")
            self._append(lib, record)
            if "stamp" in record.body:
                lib.bury(crystal_id, (record.body["stamp"], record.body["node"]))
            else:
                lib.discard(crystal_id)
            evicted.append(crystal_id)
        return tuple(evicted)

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
        """The crystal as a few-shot prompt (corteX's format); `context` is not used."""
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
                self._record_counted_reuse(lib, slot, success)
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
                self._append(lib, record)
                lib.set_reuse(slot, effectiveness, reuse_count)
            crystal = lib.read(slot)
            durable, ticket = lib.log.ticket(), lib.ticket
            self._maybe_compact(lib)
        durable.wait()
        self._acknowledge(tenant, ticket)
        return crystal

    def _record_counted_reuse(self, lib: _Library, slot: int, success: bool) -> None:
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
        self._append(lib, Record("reuse", body))
        lib.add_reuses(slot, node, reuses, successes)

    def delete(self, tenant: str, crystal_id: str) -> None:
        validate_id(crystal_id, "crystal_id")
        lib = self._library(tenant, create=False)
        if lib is None:
            raise NotFoundError(f"crystal {crystal_id!r} not found")
        with lib.lock:
            lib.slot_of(crystal_id)
            self._check_writable(lib)
            record = self._delete_record(crystal_id, "delete")
            self._append(lib, record)
            if "stamp" in record.body:
                lib.bury(crystal_id, (record.body["stamp"], record.body["node"]))
            else:
                lib.discard(crystal_id)
            durable, ticket = lib.log.ticket(), lib.ticket
            self._maybe_compact(lib)
        durable.wait()
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
            self._append(lib, record)
            lib.config = config
            if "stamp" in record.body:
                lib.config_key = (record.body["stamp"], record.body["node"])
            evicted = self._evict(lib, config.max_crystals)
            durable, ticket = lib.log.ticket(), lib.ticket
            self._maybe_compact(lib)
        durable.wait()
        self._acknowledge(tenant, ticket)
        return config, len(evicted)

    # -- replication (domain/library_replication.py) ----------------------------------

    def apply_remote(self, tenant: str, records: Sequence[tuple[Record, bytes]]) -> int:
        """Merge records another daemon wrote (from its stream); how many changed.

        A record that changes the library is appended to the local journal
        byte for byte (a crystal's contents are read back from there, the same
        bytes on every daemon), then applied; the rest are dropped. Applying a
        segment twice changes nothing the second time.
        """
        lib = self._writable(tenant)
        changed = 0
        with lib.lock:
            self._check_writable(lib)
            for record, data in records:
                if self.replica is not None:
                    self.replica.clock.observe(_stamp_of(record))
                if not _changes(lib, record):
                    if record.kind == "reuse" and "node" in record.body:
                        _apply_counters(lib, record.body, lib.ids.get(record.body["id"]))
                    continue
                self._journal(lib)
                appended = lib.log.append_plain(data)
                self._apply(lib, record, appended.start, appended.end - appended.start)
                changed += 1
            durable = lib.log.ticket() if changed else None
            if changed:
                self._maybe_compact(lib)
        if durable is not None:
            durable.wait()
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
                    stored = lib.log.read_at(lib.offset_at[slot], lib.size_at[slot])
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
