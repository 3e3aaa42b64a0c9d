"""User profiles (Cogency's situated memory): per tenant and user, not per session.

Every session of a user shares the profile, so profiles live beside the
sessions, one journal per tenant: ``<data>/tenants/<tenant>/profiles/journal``
(the same record format as session journals, store/journal.py). A record
carries the user's whole profile after the update (``profile.put``) or its
deletion (``profile.delete``), so replay is plain assignment; a journal that
outgrows its threshold is rewritten as one ``snapshot`` record holding every
profile. Each update is appended under the tenant's profile lock and fsynced
outside it (group commit), and acknowledged only after that.

A profile is Cogency's UserProfile: preferences, goals (10 newest),
expertise_areas (15 newest), communication_style, projects (10 most recently
added), interests, constraints, success/failure patterns (5 newest each),
created_at, last_updated, interaction_count, synthesis_version (from 1): the
TypedDict `Profile`, which `parse` checks a profile from outside against.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from stratad.domain import structured as st
from stratad.domain.stamps import LEGACY, Key, is_legacy, legacy_key
from stratad.errors import DataLossError, InvalidArgumentError, NotFoundError, StratadError
from stratad.ids import validate_id
from stratad.store.journal import Record
from stratad.store.log import Log, Ticket
from stratad.store.store import Store

if TYPE_CHECKING:
    from stratad.domain.stamps import LibraryReplica

log = logging.getLogger(__name__)

DIRECTORY = "profiles"
JOURNAL = "journal"
MAX_GOALS = 10
MAX_EXPERTISE = 15
MAX_PROJECTS = 10
MAX_PATTERNS = 5
#: stratad's bounds for what Cogency leaves unbounded.
MAX_INTERESTS = 15
MAX_CONSTRAINTS = 10
MAX_PREFERENCES = 100
#: CompressProfile's default (Cogency's max_tokens, applied to characters).
DEFAULT_COMPRESS_CHARS = 800
#: Longest profile text (a goal, a style, a pattern, ...).
MAX_PROFILE_TEXT = st.MAX_KEY * 16


class Profile(TypedDict):
    """A user's profile: what a profile.put record and GetProfile carry."""

    user_id: str
    preferences: st.JsonObject  # in the order they were set
    goals: list[str]
    expertise_areas: list[str]
    communication_style: str
    projects: dict[str, str]  # name -> description, in the order they were added
    interests: list[str]
    constraints: list[str]
    success_patterns: list[str]
    failure_patterns: list[str]
    created_at: float
    last_updated: float
    interaction_count: int
    synthesis_version: int


class Insights(TypedDict, total=False):
    """An UpdateProfile: Cogency's interaction_insights keys (only those given)."""

    preferences: st.JsonObject
    goals: list[str]
    expertise: list[str]
    communication_style: str
    project_context: dict[str, str]
    success_pattern: str
    failure_pattern: str
    interests: list[str]
    constraints: list[str]


def parse(raw: object) -> Profile:
    """`raw` as a profile, or INVALID_ARGUMENT naming the first field that is not.

    Accepts what UpdateProfile stores (its bounds included), so a profile that
    parses is one GetProfile and CompressProfile serve.
    """
    path = "profile"
    p = st.want_object(raw, path, tuple(Profile.__annotations__))
    st.want_id(p["user_id"], f"{path}.user_id")
    prefs = st.want_map(p["preferences"], f"{path}.preferences", max_items=MAX_PREFERENCES)
    for key, value in prefs.items():
        st.want_json(value, f"{path}.preferences[{key!r}]")
    for name, bound in (
        ("goals", MAX_GOALS),
        ("expertise_areas", MAX_EXPERTISE),
        ("interests", MAX_INTERESTS),
        ("constraints", MAX_CONSTRAINTS),
        ("success_patterns", MAX_PATTERNS),
        ("failure_patterns", MAX_PATTERNS),
    ):
        st.want_texts(p[name], f"{path}.{name}", limit=MAX_PROFILE_TEXT, max_items=bound)
    st.want_text(p["communication_style"], f"{path}.communication_style", limit=MAX_PROFILE_TEXT)
    st.want_string_map(p["projects"], f"{path}.projects", max_items=MAX_PROJECTS)
    st.want_time(p["created_at"], f"{path}.created_at")
    st.want_time(p["last_updated"], f"{path}.last_updated")
    st.want_int(p["interaction_count"], f"{path}.interaction_count")
    st.want_int(p["synthesis_version"], f"{path}.synthesis_version", 1)
    return cast(Profile, p)


def new_profile(user_id: str, at: float) -> Profile:
    return {
        "user_id": user_id,
        "preferences": {},
        "goals": [],
        "expertise_areas": [],
        "communication_style": "",
        "projects": {},
        "interests": [],
        "constraints": [],
        "success_patterns": [],
        "failure_patterns": [],
        "created_at": at,
        "last_updated": at,
        "interaction_count": 0,
        "synthesis_version": 1,
    }


def _add_new(items: list[str], new: list[str], keep: int) -> list[str]:
    items = list(items)
    for item in new:
        if item not in items:
            items.append(item)
    return items[-keep:] if len(items) > keep else items


def _add_pattern(items: list[str], pattern: str | None) -> list[str]:
    if pattern and pattern not in items:
        items = [*items, pattern]
        if len(items) > MAX_PATTERNS:
            items = items[-MAX_PATTERNS:]
    return items


def update_from_interaction(
    profile: Profile, insights: Insights, at: float, *, synthesized: bool = False
) -> Profile:
    """UserProfile.update_from_interaction on a copy (plus interests, constraints, synthesis)."""
    p = profile.copy()
    p["interaction_count"] += 1
    p["last_updated"] = at
    if "preferences" in insights:
        prefs = {**p["preferences"], **insights["preferences"]}
        if len(prefs) > MAX_PREFERENCES:
            prefs = dict(list(prefs.items())[-MAX_PREFERENCES:])
        p["preferences"] = prefs
    if "goals" in insights:
        p["goals"] = _add_new(p["goals"], insights["goals"], MAX_GOALS)
    if "expertise" in insights:
        p["expertise_areas"] = _add_new(p["expertise_areas"], insights["expertise"], MAX_EXPERTISE)
    if "communication_style" in insights:
        p["communication_style"] = insights["communication_style"]
    if "project_context" in insights:
        projects = {**p["projects"], **insights["project_context"]}
        if len(projects) > MAX_PROJECTS:
            projects = dict(list(projects.items())[-MAX_PROJECTS:])
        p["projects"] = projects
    if "success_pattern" in insights:
        p["success_patterns"] = _add_pattern(p["success_patterns"], insights["success_pattern"])
    if "failure_pattern" in insights:
        p["failure_patterns"] = _add_pattern(p["failure_patterns"], insights["failure_pattern"])
    if "interests" in insights:
        p["interests"] = _add_new(p["interests"], insights["interests"], MAX_INTERESTS)
    if "constraints" in insights:
        p["constraints"] = _add_new(p["constraints"], insights["constraints"], MAX_CONSTRAINTS)
    if synthesized:
        p["synthesis_version"] += 1
    return p


def compress(profile: Profile, max_tokens: int = DEFAULT_COMPRESS_CHARS) -> str:
    """Cogency's compress(profile): its sections, cut to max_tokens characters."""
    sections = []
    if profile["communication_style"]:
        sections.append(f"COMMUNICATION: {profile['communication_style']}")
    if profile["goals"]:
        goals_str = "; ".join(profile["goals"][-3:])
        sections.append(f"CURRENT GOALS: {goals_str}")
    if profile["preferences"]:
        prefs_items = list(profile["preferences"].items())[-5:]
        prefs_str = ", ".join(f"{k}: {v}" for k, v in prefs_items)
        sections.append(f"PREFERENCES: {prefs_str}")
    if profile["projects"]:
        projects_items = list(profile["projects"].items())[-3:]
        projects_str = "; ".join(f"{k}: {v}" for k, v in projects_items)
        sections.append(f"ACTIVE PROJECTS: {projects_str}")
    if profile["expertise_areas"]:
        expertise_str = ", ".join(profile["expertise_areas"][-5:])
        sections.append(f"EXPERTISE: {expertise_str}")
    if profile["constraints"]:
        constraints_str = "; ".join(profile["constraints"][-3:])
        sections.append(f"CONSTRAINTS: {constraints_str}")
    result = "\n".join(sections)
    return result[:max_tokens] if len(result) > max_tokens else result


def validate_insights(insights: Insights) -> Insights:
    """Check an UpdateProfile's interaction insights (Cogency's dict keys)."""
    unknown = set(insights) - set(Insights.__annotations__)
    if unknown:
        raise InvalidArgumentError(f"unknown profile insight {sorted(unknown)[0]!r}")
    for name in ("goals", "expertise", "interests", "constraints"):
        if name in insights:
            st.texts(insights[name], name, limit=MAX_PROFILE_TEXT)
    for text_name in ("communication_style", "success_pattern", "failure_pattern"):
        if text_name in insights:
            st.text(insights[text_name], text_name, limit=MAX_PROFILE_TEXT)
    if "preferences" in insights:
        prefs = insights["preferences"]
        if len(prefs) > MAX_PREFERENCES:
            raise InvalidArgumentError(f"more than {MAX_PREFERENCES} preferences")
        for k in prefs:
            st.key(k, "a preference key")
        st.json_value(prefs, "preferences", limit=st.MAX_JSON_BYTES // 4)
    if "project_context" in insights:
        st.string_map(insights["project_context"], "project_context")
    return insights


@dataclass
class _TenantProfiles:
    root: Path
    log: Log
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: user ID -> profile: written by `update_from_interaction` (here or, for
    #: replicated records, on another daemon) and replayed from the journal.
    profiles: dict[str, Profile] = field(default_factory=dict)
    snapshot_bytes: int = 0
    damaged: str = ""
    #: Replication (docs/replication.md): the stamp of each profile's last
    #: write, and of each deletion not overwritten since (last writer wins).
    stamps: dict[str, Key] = field(default_factory=dict)
    tombstones: dict[str, Key] = field(default_factory=dict)

    @property
    def held_for_io(self) -> bool:
        """The lock is about to be, or is, held across a compaction's fsyncs
        (Log.compact_guarded): reads must not wait for it on the event loop."""
        return self.log.held_for_io

    @held_for_io.setter
    def held_for_io(self, held: bool) -> None:
        self.log.held_for_io = held

    def current(self, user_id: str) -> Key:
        """The stamp a write of `user_id` must exceed to win."""
        return max(self.stamps.get(user_id, LEGACY), self.tombstones.get(user_id, LEGACY))


class Profiles:
    def __init__(self, store: Store, *, compact_min_bytes: int = 4 << 20) -> None:
        self.store = store
        self.compact_min_bytes = compact_min_bytes
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantProfiles] = {}
        #: Set when tenant libraries replicate to object storage (domain/library_replication.py).
        self.replica: LibraryReplica | None = None
        #: As SessionManager.loop_barrier (the daemon sets both).
        self.loop_barrier: Callable[[], None] = lambda: None

    # -- recovery ----------------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """Replay every tenant's profile journal (cutting a torn tail)."""
        report = collections.Counter[str]()
        for name in self.store.existing_tenant_names():
            tp = self._new_tenant(self.store.tenants_root / name / DIRECTORY)
            if not tp.log.exists():
                continue

            def apply(record: Record, start: int, end: int, tp: _TenantProfiles = tp) -> None:
                self._observe(record)
                _apply(tp, record)

            found = tp.log.recover(apply)
            if found.zero_tail:  # the preallocated space of a journal left open
                report["zero_tails_cut"] += 1
            elif found.torn:
                report["torn_tails_cut"] += 1
                log.warning("cut a torn profile journal tail of %d bytes", found.cut_bytes)
            if found.damaged_at is not None:
                tp.damaged = (
                    f"the profile journal of tenant {name!r} is damaged at byte {found.damaged_at}"
                )
                report["damaged_profile_journals"] += 1
                log.error(tp.damaged)
            with self._lock:
                self._tenants[name] = tp
            report["profiles"] += len(tp.profiles)
        return dict(report)

    def _new_tenant(self, root: Path) -> _TenantProfiles:
        return _TenantProfiles(root, Log(self.store, root / JOURNAL))

    def _tenant(self, tenant: str, *, create: bool) -> _TenantProfiles | None:
        with self._lock:
            tp = self._tenants.get(tenant)
            if tp is None and create:
                tp = self._new_tenant(self.store.tenant(tenant).root / DIRECTORY)
                self._tenants[tenant] = tp
        return tp

    # -- operations ----------------------------------------------------------------

    def get(self, tenant: str, user_id: str) -> Profile:
        validate_id(user_id, "user_id")
        tp = self._tenant(tenant, create=False)
        if tp is not None:
            with tp.lock:
                _check(tp)
                profile = tp.profiles.get(user_id)
                if profile is not None:
                    return profile
        raise NotFoundError(f"user {user_id!r} has no profile")

    def update(
        self, tenant: str, user_id: str, insights: Insights, *, synthesized: bool = False
    ) -> tuple[Profile, bool]:
        """update_from_interaction, atomically; (the new profile, whether it was created)."""
        validate_id(user_id, "user_id")
        validate_insights(insights)
        tp = self._tenant(tenant, create=True)
        assert tp is not None
        with tp.lock:
            _check(tp)
            at = time.time()
            old = tp.profiles.get(user_id)
            profile = update_from_interaction(
                old or new_profile(user_id, at), insights, at, synthesized=synthesized
            )
            record = Record("profile.put", self._stamped({"at": at, "user_id": user_id}))
            record.body["profile"] = profile
            durable, ticket = self._append(tp, tenant, record)
            _apply(tp, record)
        durable.wait()
        self._acknowledge(tenant, ticket)
        self._compact_if_outgrown(tp)
        return profile, old is None

    def delete(self, tenant: str, user_id: str) -> None:
        validate_id(user_id, "user_id")
        tp = self._tenant(tenant, create=False)
        if tp is None:
            raise NotFoundError(f"user {user_id!r} has no profile")
        with tp.lock:
            _check(tp)
            if user_id not in tp.profiles:
                raise NotFoundError(f"user {user_id!r} has no profile")
            record = Record(
                "profile.delete", self._stamped({"at": time.time(), "user_id": user_id})
            )
            durable, ticket = self._append(tp, tenant, record)
            _apply(tp, record)
        durable.wait()
        self._acknowledge(tenant, ticket)
        self._compact_if_outgrown(tp)

    def compress(self, tenant: str, user_id: str, max_tokens: int = 0) -> tuple[str, bool]:
        if max_tokens < 0:
            raise InvalidArgumentError("max_tokens must not be negative")
        limit = max_tokens or DEFAULT_COMPRESS_CHARS
        profile = self.get(tenant, user_id)
        full = compress(profile, 1 << 62)
        return full[:limit], len(full) > limit

    # -- replication (domain/library_replication.py) -----------------------------------

    def _stamped(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.replica is None:
            return body
        return {**body, "stamp": self.replica.clock.now(), "node": self.replica.node_id}

    def _observe(self, record: Record) -> None:
        if self.replica is not None:
            self.replica.clock.observe(int(record.body.get("stamp", 0)))

    def _append(self, tp: _TenantProfiles, tenant: str, record: Record) -> tuple[Ticket, int]:
        """Journal a record this daemon wrote (lock held); (its durability, its replica ticket)."""
        tp.log.create()
        data = record.encode()  # plaintext to the replica: its segments are sealed whole
        durable = tp.log.append_plain(data)
        ticket = self.replica.published(tenant, data) if self.replica is not None else 0
        return durable, ticket

    def _acknowledge(self, tenant: str, ticket: int) -> None:
        if self.replica is not None and ticket:
            self.replica.acknowledge(tenant, ticket)

    def apply_remote(self, tenant: str, records: list[tuple[Record, bytes]]) -> int:
        """Merge profile records another daemon wrote; how many changed (last writer wins).

        A record that wins is journaled here byte for byte, then applied; an
        older one (or a repeat) is dropped.
        """
        tp = self._tenant(tenant, create=True)
        assert tp is not None
        changed, durable = 0, None
        with tp.lock:
            _check(tp)
            for record, data in records:
                self._observe(record)
                if _key(record) <= tp.current(record.body["user_id"]):
                    continue
                tp.log.create()
                durable = tp.log.append_plain(data)
                _apply(tp, record)
                changed += 1
        if durable is not None:
            durable.wait()
            self._compact_if_outgrown(tp)
        return changed

    def export_origin(self, tenant: str, nodes: Collection[str]) -> list[bytes]:
        """A stream base: the profiles the daemons `nodes` wrote last, their deletions.

        Profiles written before replication (no daemon named) are published
        by every daemon that holds them (harmless: merging is idempotent).
        """
        tp = self._tenant(tenant, create=False)
        if tp is None:
            return []
        out: list[bytes] = []
        with tp.lock:
            for user_id, profile in tp.profiles.items():
                key = tp.stamps.get(user_id, LEGACY)
                if key == LEGACY:  # written before replication
                    key = tp.stamps[user_id] = legacy_key(profile)
                if key[1] in nodes or is_legacy(key[1]):
                    body = {"at": profile["last_updated"], "user_id": user_id, "profile": profile}
                    origin = {"stamp": key[0], "node": key[1]}
                    out.append(Record("profile.put", {**body, **origin}).encode())
            for user_id, (stamp, writer) in tp.tombstones.items():
                if writer in nodes:
                    body = {"at": 0.0, "user_id": user_id, "stamp": stamp, "node": writer}
                    out.append(Record("profile.delete", body).encode())
        return out

    def tenants(self) -> list[str]:
        with self._lock:
            return sorted(self._tenants)

    # -- journal -----------------------------------------------------------------------

    def held_for_io(self, tenant: str) -> bool:
        """Is the tenant's profile lock held across a compaction's fsyncs (or
        about to be)? The servicer then reads on a worker thread, not on the
        event loop: waiting there would hold up every other call."""
        tp = self._tenants.get(tenant)
        return tp is not None and tp.held_for_io

    def _outgrown(self, tp: _TenantProfiles) -> bool:
        return tp.log.journal is not None and tp.log.size > max(
            self.compact_min_bytes, 4 * tp.snapshot_bytes
        )

    def _compact_if_outgrown(self, tp: _TenantProfiles) -> None:
        """Rewrite the journal as one snapshot once it outgrows its threshold.

        The lock is held across the compaction's fsyncs, so the tenant is
        marked `held_for_io` first and the lock taken once the event loop has
        finished what it was running (`loop_barrier`): reads it starts from
        then on run on worker threads (Log.compact_guarded; SessionManager.
        _exclusively does the same for sessions)."""
        if not self._outgrown(tp):
            return
        try:
            tp.log.compact_guarded(
                tp.lock,
                self.loop_barrier,
                lambda: self._outgrown(tp) and not tp.damaged,
                lambda _reader: [_snapshot(tp)],
                lambda: setattr(tp, "snapshot_bytes", tp.log.size),
            )
        except (OSError, StratadError):
            # The mutation that got here is durable: it must not fail. The old
            # journal stays in use; the next mutation tries again.
            log.exception("compacting the profile journal of %s failed", tp.root)


def _snapshot(tp: _TenantProfiles) -> Record:
    """The one record of a compacted journal: every profile (lock held)."""
    body: dict[str, Any] = {"at": time.time(), "profiles": tp.profiles}
    if tp.stamps or tp.tombstones:  # replicated: what later merges compare against
        body["stamps"] = {u: list(k) for u, k in tp.stamps.items()}
        body["tombstones"] = {u: list(k) for u, k in tp.tombstones.items()}
    return Record("snapshot", body)


def _key(record: Record) -> Key:
    body = record.body
    return (int(body["stamp"]), str(body["node"])) if "stamp" in body else LEGACY


def _apply(tp: _TenantProfiles, record: Record) -> None:
    """Apply a record in journal order (the merge decisions were made before journaling)."""
    body = record.body
    if record.kind == "snapshot":
        tp.profiles.clear()
        tp.profiles.update(body["profiles"])
        tp.stamps = {u: (int(k[0]), str(k[1])) for u, k in body.get("stamps", {}).items()}
        tp.tombstones = {u: (int(k[0]), str(k[1])) for u, k in body.get("tombstones", {}).items()}
    elif record.kind == "profile.put":
        user_id = body["user_id"]
        tp.profiles[user_id] = body["profile"]
        if "stamp" in body:
            tp.stamps[user_id] = _key(record)
        else:
            tp.stamps.pop(user_id, None)
        tp.tombstones.pop(user_id, None)
    elif record.kind == "profile.delete":
        user_id = body["user_id"]
        tp.profiles.pop(user_id, None)
        tp.stamps.pop(user_id, None)
        if "stamp" in body:
            tp.tombstones[user_id] = _key(record)
    else:
        raise DataLossError(f"profile journal record of unknown kind {record.kind!r}")


def _check(tp: _TenantProfiles) -> None:
    if tp.damaged:
        raise DataLossError(tp.damaged)
