"""Saving, loading, naming, restoring, forking and pruning checkpoints.

A save stores the state as content-addressed objects (see store/tenant.py)
and appends one `save` record naming the checkpoint's root object, carrying
the new objects inline (their durability until the object files are synced)
and listing the unnamed checkpoints retention drops at the same time.

States arrive either whole (`data`) and are chunked here, or already chunked
by the client (`ChunkUpload`): a chunk list relative to a base checkpoint plus
the framed chunks the daemon lacks. Each uploaded frame is verified against its
digest on arrival; the state digest is verified whenever the state is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stratad import native
from stratad.domain.events import SessionEvent
from stratad.domain.models import Checkpoint, SessionStatus
from stratad.domain.sessions import (
    LiveSession,
    Mutation,
    PendingCommit,
    SessionInfo,
    SessionManager,
    check_usable,
    decode_token,
    encode_token,
    require_status,
)
from stratad.errors import (
    CorruptObjectError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    StratadError,
    checkpoint_not_found,
)
from stratad.ids import new_id, validate_id
from stratad.store import manifest
from stratad.store.journal import Record
from stratad.store.tenant import StaleBaseError, StoredState

MAX_METADATA_BYTES = 1 << 20
#: Digesters kept at the starts of an upload's last chunks (`_check_state_digest`).
DIGEST_RESUME_POINTS = 2
#: Uploads per live session whose resume points are kept (~4 KB each).
DIGEST_RESUME_UPLOADS = 2
ENTRY_SIZE = manifest.ENTRY.size
MAX_CONTENT_TYPE = 256
MAX_NAME = 256


@dataclass
class ChunkUpload:
    """A state the client chunked itself (see the module docstring)."""

    size: int
    digest: str
    chunks: list[tuple[str, int]]  # appended after the kept base entries
    frames: list[bytes] = field(default_factory=list)
    base_checkpoint_id: str = ""
    keep: int = 0


@dataclass
class SaveInput:
    data: bytes | None = None
    upload: ChunkUpload | None = None
    content_type: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    expected_version: int = 0
    checkpoint_id: str = ""
    parent_checkpoint_id: str = ""  # "" = the latest checkpoint of the namespace
    namespace: str = ""
    no_parent: bool = False  # a new line: no parent even if the namespace has checkpoints


@dataclass(frozen=True)
class Prepared:
    """A save's verified state, ready to be journaled (see Checkpoints._prepare)."""

    stored: StoredState
    size: int
    digest: str
    #: Chunked uploads: digesters at the state's last chunks (`_check_state_digest`).
    resume_points: dict[int, native.Digester] = field(default_factory=dict)


@dataclass(frozen=True)
class SaveResult:
    checkpoint: Checkpoint
    version: int
    stored_bytes: int


@dataclass(frozen=True)
class LoadResult:
    data: bytes
    checkpoint: Checkpoint
    version: int
    #: With include_structured: the structured state the checkpoint captured (JSON).
    structured: bytes = b""


class Checkpoints:
    def __init__(self, sessions: SessionManager, *, max_state_bytes: int = 64 << 20) -> None:
        self.sessions = sessions
        self.max_state_bytes = max_state_bytes

    # -- save ------------------------------------------------------------------

    def save_state(
        self,
        tenant: str,
        session_id: str,
        inp: SaveInput,
        *,
        commit: list[PendingCommit] | None = None,
    ) -> SaveResult:
        """Save a state as the session's new head (see SessionManager.mutate_live for `commit`)."""
        self._validate_save(inp)
        live = self.sessions.live(tenant, session_id)
        for _ in range(3):  # a base collected by a concurrent GC: prepare again
            prepared = self._prepare(live, inp)
            build = functools.partial(self._save_mutation, inp=inp, prepared=prepared)
            try:
                result: SaveResult = self.sessions.mutate_live(
                    live, inp.expected_version, build, commit=commit
                )
            except StaleBaseError:
                continue
            if prepared.resume_points:
                _keep_resume_points(live, result.checkpoint.checkpoint_id, prepared.resume_points)
            return result
        raise FailedPreconditionError("the state's base kept changing; retry the save")

    def save_work(self, tenant: str, session_id: str, inp: SaveInput) -> int:
        """Bytes a save will hash, decode or compress: its cost, which decides
        whether it may run on the event loop (server/runner.py, SAVE_BYTES).

        A whole state is its size. An upload is judged by what it *declares*
        (100 KB of frames can decode to gigabytes): the lengths of the chunks
        it lists and of its frames, plus the bytes its digest check must hash
        before them, that is the whole state, unless the check resumes where
        one of the session's last uploads left off (`_resume_point`): then
        only the base's bytes after the resume point. A growing state saved step
        by step so costs its new bytes, however large it has become. Never
        raises: anything unusual is judged by the declared size.
        """
        if inp.upload is None:
            return len(inp.data or b"")
        up = inp.upload
        new = sum(length for _, length in up.chunks) + sum(len(f) for f in up.frames)
        try:
            return new + self._kept_bytes_to_hash(tenant, session_id, up)
        except StratadError:
            return up.size + new

    def save_many_work(self, tenant: str, items: list[tuple[str, SaveInput]]) -> int:
        """`save_work` of a `save_many` batch, which runs as one piece of work."""
        return sum(self.save_work(tenant, session_id, inp) for session_id, inp in items)

    def _kept_bytes_to_hash(self, tenant: str, session_id: str, up: ChunkUpload) -> int:
        """At most what the digest check hashes before the listed chunks: the
        base's bytes from the resume point on (the whole state without one)."""
        live = self.sessions.live(tenant, session_id)
        point, _ = _resume_point(live, up)
        base = live.state.checkpoints.get(up.base_checkpoint_id)
        if point is None or base is None:
            return up.size
        return max(base.size - point.count, 0)

    def save_many(
        self,
        tenant: str,
        items: list[tuple[str, SaveInput]],
        *,
        commit: list[PendingCommit] | None = None,
    ) -> list[SaveResult | StratadError]:
        """Save states in order; they share fsyncs (group commit). Errors are per item."""
        pending: list[PendingCommit] = [] if commit is None else commit
        results: list[SaveResult | StratadError] = []
        for session_id, inp in items:
            try:
                results.append(self.save_state(tenant, session_id, inp, commit=pending))
            except StratadError as exc:
                results.append(exc)
        if commit is None:
            self.sessions.finish(pending)
        return results

    def _validate_save(self, inp: SaveInput) -> None:
        if (inp.data is None) == (inp.upload is None):
            raise InvalidArgumentError("give either data or a chunk upload")
        size = len(inp.data) if inp.data is not None else inp.upload.size  # type: ignore[union-attr]
        if size > self.max_state_bytes:
            raise ResourceExhaustedError(
                f"state of {size} bytes exceeds the limit of {self.max_state_bytes} bytes "
                "(max_message_bytes)"
            )
        if inp.checkpoint_id:
            validate_id(inp.checkpoint_id, "checkpoint_id")
        if inp.parent_checkpoint_id:
            validate_id(inp.parent_checkpoint_id, "parent_checkpoint_id")
            if inp.no_parent:
                raise InvalidArgumentError("no_parent contradicts parent_checkpoint_id")
        validate_namespace(inp.namespace)
        if len(inp.content_type) > MAX_CONTENT_TYPE:
            raise InvalidArgumentError(f"content_type is longer than {MAX_CONTENT_TYPE} characters")
        validate_metadata(inp.metadata)

    def _prepare(self, live: LiveSession, inp: SaveInput) -> Prepared:
        """Chunk/verify outside the session lock: this is the CPU-heavy part."""
        with live.lock:
            check_usable(live)
            # no_parent: still delta against the namespace's latest (dedup only).
            base_cp = latest(live, inp.namespace) if inp.no_parent else self._parent(live, inp)
        base = (base_cp.root, base_cp.root_kind) if base_cp else None
        if inp.data is not None:
            stored = live.tenant.prepare(inp.data, base)
            return Prepared(stored, len(inp.data), native.digest_hex(inp.data))
        assert inp.upload is not None
        return self._prepare_upload(live, inp.upload, base)

    def _prepare_upload(
        self, live: LiveSession, up: ChunkUpload, base: tuple[str, str] | None
    ) -> Prepared:
        if not _is_digest(up.digest):
            raise InvalidArgumentError("digest must be 64 lowercase hex characters")
        kept = b""
        if up.keep:
            if not up.base_checkpoint_id:
                raise InvalidArgumentError("keep needs a base_checkpoint_id")
            base_live = self.sessions.session_of_checkpoint(live.tenant.name, up.base_checkpoint_id)
            if base_live.tenant is not live.tenant:
                raise checkpoint_not_found(up.base_checkpoint_id)
            with base_live.lock:
                cp = base_live.state.checkpoints.get(up.base_checkpoint_id)
            if cp is None:
                raise checkpoint_not_found(up.base_checkpoint_id)
            base_entries = live.tenant.entries_of(cp.root, cp.root_kind, cp.size)
            if up.keep > manifest.entry_count(base_entries):
                raise InvalidArgumentError("keep is larger than the base's chunk count")
            kept = base_entries[: up.keep * manifest.ENTRY.size]
        lengths = _listed_lengths(up.chunks)
        entries = kept + manifest.entries_blob(up.chunks)
        if manifest.total_length(entries) != up.size:
            raise InvalidArgumentError(
                f"chunk lengths add up to {manifest.total_length(entries)} bytes, "
                f"not to the state's size of {up.size}",
                reason="UPLOAD_MISMATCH",
            )
        decoded = self._verify_frames(live, up, lengths)
        missing = live.tenant.missing(sorted(lengths.keys() - decoded.keys()))
        if missing:
            raise FailedPreconditionError(
                f"{len(missing)} chunks are missing on the daemon (first: {missing[0]}); "
                "upload them (FindMissingChunks lists them)",
                reason="CHUNKS_MISSING",
            )
        points = self._check_state_digest(live, up, entries, decoded)
        frames, delta_bases = live.tenant.frame_new_chunks(
            entries,
            {digest: content for digest, (_, content) in decoded.items()},
            base,
            {digest: frame for digest, (frame, _) in decoded.items()},
            first=up.keep,
        )
        stored = live.tenant.prepare_entries(entries, frames, base, delta_bases)
        return Prepared(stored, up.size, up.digest, points)

    def _verify_frames(
        self, live: LiveSession, up: ChunkUpload, lengths: dict[str, int]
    ) -> dict[str, tuple[bytes, bytes]]:
        """Verified uploaded chunks the store lacks: digest -> (frame, content).

        Each frame's header is checked first (cheap): it must name a listed
        chunk and the length listed for it, so no frame decodes to more than
        the request declared. Each distinct chunk is decoded once; frames of
        chunks the store already holds are not decoded at all. A delta frame
        whose base the store lacks is left out: its chunk counts as missing,
        and the client sends it whole.
        """
        decoded: dict[str, tuple[bytes, bytes]] = {}
        for frame in up.frames:
            try:
                digest, length = native.frame_digest_hex(frame), native.frame_length(frame)
            except CorruptObjectError as exc:
                raise InvalidArgumentError(
                    f"an uploaded chunk is corrupt: {exc}", reason="UPLOAD_MISMATCH"
                ) from exc
            listed = lengths.get(digest)
            if listed is None:
                raise InvalidArgumentError(
                    f"uploaded chunk {digest} is not in the chunk list", reason="UPLOAD_MISMATCH"
                )
            if length != listed:
                raise InvalidArgumentError(
                    f"uploaded chunk {digest} holds {length} bytes but is listed with {listed}",
                    reason="UPLOAD_MISMATCH",
                )
            if digest in decoded or live.tenant.objects.has(digest):
                continue
            try:
                found = _decode_upload(live, frame, listed)
            except CorruptObjectError as exc:
                raise InvalidArgumentError(
                    f"uploaded chunk {digest} is corrupt: {exc}", reason="UPLOAD_MISMATCH"
                ) from exc
            if found is not None:
                decoded[digest] = found
        return decoded

    @staticmethod
    def _check_state_digest(
        live: LiveSession,
        up: ChunkUpload,
        entries: bytes,
        decoded: dict[str, tuple[bytes, bytes]],
    ) -> dict[int, native.Digester]:
        """The chunks, in order, must make up exactly the state the client named.

        Checked at save time so that a bad upload (a client bug, a wrong base)
        is refused with nothing stored, rather than found when loading it.
        Returns digesters fed up to each of the state's last chunks, kept for
        the next upload: when it keeps this state's chunks but the last few
        (a growing state does), its check hashes only the bytes after them.
        The chunks before the resume point are the base's own entries, which
        were checked when the base was saved.
        """
        count = manifest.entry_count(entries)
        digester, start = _resume_digest(live, up)
        first_point = max(count - DIGEST_RESUME_POINTS, start)
        points: dict[int, native.Digester] = {}
        for index in range(start, count):
            raw, length = manifest.ENTRY.unpack_from(entries, index * ENTRY_SIZE)
            digest = raw.hex()
            hit = decoded.get(digest)
            piece = (
                hit[1]
                if hit is not None
                else live.tenant.objects.content(digest, live.tenant.max_object_bytes)
            )
            if len(piece) != length:
                raise InvalidArgumentError(
                    f"chunk {digest} holds {len(piece)} bytes but is listed with {length}",
                    reason="UPLOAD_MISMATCH",
                )
            if index >= first_point:
                points[index] = digester.copy()
            digester.update(piece)
        found = digester.hexdigest()
        if found != up.digest:
            raise InvalidArgumentError(
                f"the uploaded chunks make up a state with digest {found}, not {up.digest}",
                reason="UPLOAD_MISMATCH",
            )
        return points

    def _parent(self, live: LiveSession, inp: SaveInput) -> Checkpoint | None:
        if inp.parent_checkpoint_id:
            cp = live.state.checkpoints.get(inp.parent_checkpoint_id)
            if cp is None:
                raise NotFoundError(
                    f"parent checkpoint {inp.parent_checkpoint_id!r} not found",
                    reason="CHECKPOINT_NOT_FOUND",
                )
            return cp
        if inp.no_parent:
            return None
        return latest(live, inp.namespace)

    def _save_mutation(
        self,
        live: LiveSession,
        version: int,
        at: float,
        *,
        inp: SaveInput,
        prepared: Prepared,
    ) -> Mutation:
        stored, size, digest = prepared.stored, prepared.size, prepared.digest
        require_status(live, SessionStatus.ACTIVE, SessionStatus.PAUSED)
        checkpoint_id = self._new_checkpoint_id(live, inp.checkpoint_id)
        parent = self._parent(live, inp)
        dropped = retention_drops(live, at, keep=checkpoint_id)
        self._check_quotas(live, stored, dropped)
        inline = live.tenant.commit_objects(stored, live.owner)
        try:
            structured, structured_inline = capture_structured(live)
        except BaseException:
            abandon_objects(live, inline)
            raise
        inline += structured_inline
        checkpoint = Checkpoint(
            checkpoint_id=checkpoint_id,
            session_id=live.state.session_id,
            version=version,
            parent_id=parent.checkpoint_id if parent else "",
            namespace=inp.namespace,
            name="",
            content_type=inp.content_type,
            metadata=inp.metadata,
            created_at=at,
            size=size,
            digest=digest,
            root=stored.root,
            root_kind=stored.root_kind,
            stored_bytes=sum(len(frame) for _, frame in inline),
            structured=structured,
        )
        mutation = save_mutation(live, checkpoint, version, at, inline, dropped)
        mutation.on_abort = functools.partial(abandon_objects, live, inline)
        return mutation

    def _check_quotas(self, live: LiveSession, stored: StoredState, dropped: list[str]) -> None:
        """Before the save stores anything: its checkpoint, and the bytes it adds."""
        quotas = self.sessions.quotas
        existing = len(live.state.checkpoints)
        quotas.check_checkpoints(live.state.session_id, existing, existing + 1 - len(dropped))
        if quotas.tenant_stored_bytes:
            quotas.check_stored_bytes(live.tenant, live.tenant.added_bytes(stored, live.owner))

    def _new_checkpoint_id(self, live: LiveSession, requested: str) -> str:
        if not requested:
            return new_id("ckpt")
        self.sessions.claim_checkpoint_id(live, requested)
        return requested

    # -- load ------------------------------------------------------------------

    def load_state(
        self,
        tenant: str,
        session_id: str,
        checkpoint_id: str = "",
        namespace: str = "",
        *,
        include_structured: bool = False,
        before_read: Callable[[int], None] | None = None,
    ) -> LoadResult:
        """The state of a checkpoint (the latest of ``namespace`` by default).
        ``before_read`` is called with the bytes about to be read (the state,
        and its structured capture if asked) before any is read: it may raise
        to refuse the load (the answer budget, server/front.py)."""
        live = self.sessions.live(tenant, session_id)
        with live.lock:
            check_usable(live)
            if checkpoint_id:
                validate_id(checkpoint_id, "checkpoint_id")
                cp = live.state.checkpoints.get(checkpoint_id)
                if cp is None:
                    raise checkpoint_not_found(checkpoint_id)
            else:
                validate_namespace(namespace)
                cp = latest(live, namespace)
                if cp is None:
                    raise NotFoundError(
                        f"session {session_id!r} has no saved state", reason="CHECKPOINT_NOT_FOUND"
                    )
            version = live.state.version
            live.accessed_at = time.time()  # a read keeps the session from expiring
        if before_read is not None:
            structured_size = cp.structured["size"] if include_structured and cp.structured else 0
            before_read(cp.size + structured_size)
        structured = self._read_structured(live, cp) if include_structured else b""
        return LoadResult(self._read(live, cp), cp, version, structured)

    def _read_structured(self, live: LiveSession, cp: Checkpoint) -> bytes:
        """The checkpoint's structured-state capture (canonical JSON), b"" if none."""
        ref = cp.structured
        if not ref:
            return b""
        return live.tenant.read(ref["root"], ref["root_kind"], ref["size"], ref["digest"])

    def _read(self, live: LiveSession, cp: Checkpoint) -> bytes:
        """A checkpoint's verified bytes (read outside the session lock)."""
        try:
            return live.tenant.read(cp.root, cp.root_kind, cp.size, cp.digest)
        except DataLossError:
            # Deleted (and collected) while we read it: that is "not found".
            with live.lock:
                gone = live.deleted or cp.checkpoint_id not in live.state.checkpoints
            if gone:
                raise checkpoint_not_found(cp.checkpoint_id) from None
            raise

    # -- pause / resume ----------------------------------------------------------

    def set_status(
        self,
        tenant: str,
        session_id: str,
        status: SessionStatus,
        *,
        expected_version: int = 0,
        allowed_from: tuple[SessionStatus, ...] = (),
    ) -> SessionInfo:
        def build(live: LiveSession, version: int, at: float) -> Mutation:
            if allowed_from and live.state.status not in allowed_from:
                not_paused = allowed_from == (SessionStatus.PAUSED,)
                raise FailedPreconditionError(
                    f"session {session_id!r} is {live.state.status.value}, "
                    f"not {' or '.join(s.value for s in allowed_from)}",
                    reason="SESSION_NOT_PAUSED" if not_paused else None,
                )
            body = {"v": version, "at": at, "status": status.value}
            record = Record("status", body)
            return Mutation(record, SessionEvent(version, "status", at, status=status.value))

        self.sessions.mutate(tenant, session_id, expected_version, build)
        return self.sessions.info(tenant, session_id)

    # -- named checkpoints, restore, delete, fork ----------------------------------

    def create_checkpoint(
        self,
        tenant: str,
        session_id: str,
        *,
        name: str = "",
        metadata: dict[str, Any] | None = None,
        checkpoint_id: str = "",
        expected_version: int = 0,
    ) -> Checkpoint:
        """Pin the session's current state under a name (no data is copied)."""
        if len(name) > MAX_NAME:
            raise InvalidArgumentError(f"name is longer than {MAX_NAME} characters")
        if checkpoint_id:
            validate_id(checkpoint_id, "checkpoint_id")
        validate_metadata(metadata or {})

        def build(live: LiveSession, version: int, at: float) -> Mutation:
            head = live.state.head_checkpoint
            if head is None:
                raise FailedPreconditionError(f"session {session_id!r} has no saved state yet")
            merged = {**head.metadata, **(metadata or {})}
            validate_metadata(merged)  # each part may be within the limit, not both
            existing = len(live.state.checkpoints)
            self.sessions.quotas.check_checkpoints(session_id, existing, existing + 1)
            structured, inline = capture_structured(live)
            try:
                cp = dataclasses.replace(
                    head,
                    checkpoint_id=self._new_checkpoint_id(live, checkpoint_id),
                    version=version,
                    parent_id=head.checkpoint_id,
                    name=name or f"checkpoint-{version}",
                    metadata=merged,
                    created_at=at,
                    stored_bytes=sum(len(frame) for _, frame in inline),
                    structured=structured,
                    writes=[],  # pending writes belong to the head, not to its pinned copy
                )
                touch_for_gc(live, cp)
            except BaseException:
                abandon_objects(live, inline)
                raise
            mutation = save_mutation(live, cp, version, at, inline, [])
            mutation.on_abort = functools.partial(abandon_objects, live, inline)
            return mutation

        result: SaveResult = self.sessions.mutate(tenant, session_id, expected_version, build)
        return result.checkpoint

    def restore_checkpoint(
        self, tenant: str, checkpoint_id: str, *, make_current: bool = False,
        expected_version: int = 0,
    ) -> LoadResult:  # fmt: skip
        live = self.sessions.session_of_checkpoint(tenant, checkpoint_id)
        with live.lock:
            cp = live.state.checkpoints.get(checkpoint_id)
        if cp is None:
            raise checkpoint_not_found(checkpoint_id)
        data = self._read(live, cp)  # verify before moving the head to it
        if make_current:
            structured = load_structured(live, cp)

            def build(live: LiveSession, version: int, at: float) -> Mutation:
                if checkpoint_id not in live.state.checkpoints:
                    raise checkpoint_not_found(checkpoint_id)
                body = {"v": version, "at": at, "checkpoint_id": checkpoint_id}
                body["structured"] = structured
                event = SessionEvent(version, "head", at, checkpoint_id=checkpoint_id)
                return Mutation(Record("head", body), event)

            self.sessions.mutate_live(live, expected_version, build)
        return LoadResult(data, cp, live.state.version)

    def delete_checkpoint(self, tenant: str, checkpoint_id: str, expected_version: int = 0) -> None:
        live = self.sessions.session_of_checkpoint(tenant, checkpoint_id)

        def build(live: LiveSession, version: int, at: float) -> Mutation:
            if checkpoint_id not in live.state.checkpoints:
                raise checkpoint_not_found(checkpoint_id)
            body: dict[str, Any] = {"v": version, "at": at, "checkpoint_id": checkpoint_id}
            if live.state.head == checkpoint_id:
                rest = [c for c in live.state.checkpoints if c != checkpoint_id]
                body["new_head"] = rest[-1] if rest else ""
            event = SessionEvent(version, "delete_checkpoint", at, checkpoint_id=checkpoint_id)
            return Mutation(Record("delete_checkpoint", body), event)

        self.sessions.mutate_live(live, expected_version, build, check_quota=False)

    def fork_session(
        self, tenant: str, checkpoint_id: str, *, new_session_id: str = "",
        labels: dict[str, str] | None = None,
    ) -> SessionInfo:  # fmt: skip
        """A new session whose first checkpoint shares the source's objects."""
        source = self.sessions.session_of_checkpoint(tenant, checkpoint_id)
        with source.lock:
            src = source.state.checkpoints.get(checkpoint_id)
            if src is None:
                raise checkpoint_not_found(checkpoint_id)
            keep_last, max_age = source.state.keep_last, source.state.max_age_seconds
        structured = load_structured(source, src)

        def initial(live: LiveSession, version: int, at: float) -> Mutation:
            cp = dataclasses.replace(
                src,
                checkpoint_id=new_id("ckpt"),
                session_id=live.state.session_id,
                version=version,
                parent_id="",
                created_at=at,
                stored_bytes=0,
                metadata={**src.metadata},
            )
            touch_for_gc(live, cp)
            mutation = save_mutation(live, cp, version, at, [], [], forked_from=checkpoint_id)
            mutation.record.body["structured"] = structured
            return mutation

        return self.sessions.create(
            tenant, new_session_id, labels=labels, keep_last=keep_last,
            max_age_seconds=max_age, initial=initial,
        )  # fmt: skip

    # -- listing ---------------------------------------------------------------------

    def list_checkpoints(
        self,
        tenant: str,
        session_id: str,
        *,
        namespace: str | None = None,
        metadata: dict[str, Any] | None = None,
        before: str = "",
        page_size: int = 100,
        page_token: str = "",
    ) -> tuple[list[Checkpoint], str]:
        """Newest first; filters by namespace, metadata subset and `before` a checkpoint."""
        if page_size < 0:
            raise InvalidArgumentError("page_size must not be negative")
        page_size = min(page_size or 100, 1000)
        validate_metadata(metadata or {})
        live = self.sessions.live(tenant, session_id)
        with live.lock:
            check_usable(live)
            newest_first = list(reversed(live.state.checkpoints.values()))
        if before:
            validate_id(before, "before")
            ids = [c.checkpoint_id for c in newest_first]
            if before not in ids:
                raise checkpoint_not_found(before)
            newest_first = newest_first[ids.index(before) + 1 :]
        matching = [
            c
            for c in newest_first
            if (namespace is None or c.namespace == namespace)
            and metadata_matches(c.metadata, metadata or {})
        ]
        if page_token:
            # The token is the creation version of the last checkpoint listed:
            # unlike its ID, it stays meaningful if that checkpoint is deleted.
            below = _page_version(decode_token(page_token))
            matching = [c for c in matching if c.version < below]
        page = matching[:page_size]
        more = len(matching) > page_size
        return page, encode_token(f"v{page[-1].version}") if more else ""

    def find_missing(self, tenant: str, digests: list[str]) -> list[str]:
        for d in digests:
            if not _is_digest(d):
                raise InvalidArgumentError(f"{d[:80]!r} is not a hex BLAKE3 digest")
        store = self.sessions.store.find_tenant(tenant)
        return store.missing(digests) if store is not None else list(digests)


def _page_version(token: str) -> int:
    if not (token.startswith("v") and token[1:].isdigit()):
        raise InvalidArgumentError("page_token is not a token this server issued")
    return int(token[1:])


def latest(live: LiveSession, namespace: str) -> Checkpoint | None:
    """The head if it is in `namespace`, else the newest checkpoint there."""
    head = live.state.head_checkpoint
    if head is not None and head.namespace == namespace:
        return head
    for cp in reversed(live.state.checkpoints.values()):
        if cp.namespace == namespace:
            return cp
    return None


def retention_drops(live: LiveSession, now: float, *, keep: str) -> list[str]:
    """Unnamed checkpoints beyond keep_last or older than max_age (never the head).

    `keep` is the checkpoint being saved, which becomes the head: the current
    head is about to stop being one and gets no protection.
    """
    state = live.state
    if not state.keep_last and not state.max_age_seconds:
        return []
    protected = {keep}
    unnamed = [c for c in state.checkpoints.values() if not c.pinned]
    dropped = []
    if state.keep_last:
        excess = len(unnamed) + 1 - state.keep_last  # +1: the checkpoint being saved
        dropped += [c.checkpoint_id for c in unnamed if c.checkpoint_id not in protected][
            : max(excess, 0)
        ]
    if state.max_age_seconds:
        cutoff = now - state.max_age_seconds
        dropped += [
            c.checkpoint_id
            for c in unnamed
            if c.created_at < cutoff and c.checkpoint_id not in protected
        ]
    return list(dict.fromkeys(dropped))


def save_mutation(
    live: LiveSession,
    cp: Checkpoint,
    version: int,
    at: float,
    inline: list[tuple[str, bytes]],
    dropped: list[str],
    **detail: str,
) -> Mutation:
    body: dict[str, Any] = {
        "v": version,
        "at": at,
        "checkpoint": cp.to_record(live.state.session_id, version, at),
    }
    if not all(_frame_names(frame, digest) for digest, frame in inline):
        body["objects"] = [d for d, _ in inline]  # else read from the frames (inline_digests)
    if dropped:
        body["dropped"] = dropped
    if detail:
        body["detail"] = detail
    event = SessionEvent(version, "save", at, checkpoint_id=cp.checkpoint_id, detail=detail)
    return Mutation(Record("save", body, [f for _, f in inline]), event, SaveResult(
        cp, version, cp.stored_bytes
    ))  # fmt: skip


def _frame_names(frame: bytes, digest: str) -> bool:
    """Does the frame's header name `digest` (so a record need not list it)?"""
    try:
        return native.frame_digest_hex(frame) == digest
    except CorruptObjectError:
        return False


def capture_structured(live: LiveSession) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """Store the session's structured state for a new checkpoint: (reference, new objects).

    The state is serialized canonically and stored like any state: chunked,
    deduplicated against the previous capture (a delta manifest), so a growing
    decision log costs its new entries, not its whole size, per checkpoint.
    Unchanged since the last capture (nothing but saves in between): reused.
    """
    if not live.state.structured:
        return {}, []
    if not live.structured_dirty and live.structured_ref:
        return dict(live.structured_ref), []
    data = json.dumps(live.state.structured, sort_keys=True, separators=(",", ":")).encode()
    digest = native.digest_hex(data)
    base = live.structured_ref
    if base.get("digest") == digest:
        ref: dict[str, Any] = dict(base)
        inline: list[tuple[str, bytes]] = []
    else:
        stored = live.tenant.prepare(data, (base["root"], base["root_kind"]) if base else None)
        inline = live.tenant.commit_objects(stored, live.owner)
        ref = {"root": stored.root, "root_kind": stored.root_kind, "size": len(data)}
        ref["digest"] = digest
    live.structured_ref, live.structured_dirty = ref, False
    return dict(ref), inline


def _decode_upload(live: LiveSession, frame: bytes, listed: int) -> tuple[bytes, bytes] | None:
    """(frame to store, content) of an uploaded frame whose header was checked;
    None for a delta frame on an object the store cannot give (its chunk is
    then missing). Raises CorruptObjectError for a frame that does not decode
    to the content its header names.

    A delta frame (the client compressed a rewritten chunk against the chunk
    it replaces) is decoded against its base and kept as it came, with the
    depth set from the base's own: the depth is the store's to know, and it
    bounds the chains a read decodes. A base at the limit gets a plain frame.
    """
    base = native.frame_delta_base(frame)
    if base is None:
        return frame, native.decode_frame(frame, listed)
    objects = live.tenant.objects
    if not objects.has(base[0]):
        return None
    try:
        content, depth = objects.content_and_depth(base[0], live.tenant.max_object_bytes)
    except (DataLossError, CorruptObjectError):
        return None  # a damaged base: Verify reports it; the chunk comes whole
    data = native.decode_delta_frame(frame, content, listed)
    if depth + 1 > native.MAX_DELTA_DEPTH:
        return native.encode_frame(data), data
    if base[1] != depth + 1:
        frame = native.with_delta_depth(frame, depth + 1)
    return frame, data


def _listed_lengths(chunks: list[tuple[str, int]]) -> dict[str, int]:
    """digest -> length of an upload's chunk list (a digest has one length)."""
    lengths: dict[str, int] = {}
    for digest, length in chunks:
        if length <= 0 or not _is_digest(digest):
            raise InvalidArgumentError(
                "a chunk reference is malformed (64 hex characters and a positive length)"
            )
        if lengths.setdefault(digest, length) != length:
            raise InvalidArgumentError(
                f"chunk {digest} is listed with two lengths", reason="UPLOAD_MISMATCH"
            )
    return lengths


def abandon_objects(live: LiveSession, inline: list[tuple[str, bytes]]) -> None:
    """The record meant to carry `inline` will not be journaled: undo what assumed it.

    Later records must carry those objects themselves (see ObjectStore.orphan),
    and the structured-state capture must not be reused by reference: it may
    name objects only this record would have made durable.
    """
    live.tenant.objects.orphan(digest for digest, _ in inline)
    live.structured_ref, live.structured_dirty = {}, True


def load_structured(live: LiveSession, cp: Checkpoint) -> dict[str, Any]:
    """The structured state a checkpoint captured (verified like any state)."""
    ref = cp.structured
    if not ref:
        return {}
    data = live.tenant.read(ref["root"], ref["root_kind"], ref["size"], ref["digest"])
    loaded: dict[str, Any] = json.loads(data)
    return loaded


def structured_closure(live: LiveSession, cp: Checkpoint) -> set[str]:
    ref = cp.structured
    return live.tenant.closure(ref["root"], ref["root_kind"]) if ref else set()


def touch_for_gc(live: LiveSession, cp: Checkpoint) -> None:
    """A new checkpoint sharing existing objects: protect them from a running GC."""
    tenant = live.tenant
    with tenant.gc_lock:
        if tenant.gc_touched is None:
            return
        closure = tenant.closure(cp.root, cp.root_kind) | structured_closure(live, cp)
        gone = [d for d in closure if not tenant.objects.has(d)]
        if gone:
            raise FailedPreconditionError(f"object {gone[0]} of the source was collected")
        tenant.gc_touched.update(closure)


def metadata_matches(metadata: dict[str, Any], flt: dict[str, Any]) -> bool:
    """True when `metadata` has every field of `flt` with an equal value.

    A filter field must be present (a null filter value matches a null value,
    not a missing field), and a boolean matches only a boolean: JSON and
    protobuf Struct cannot tell 1 from 1.0, but Python's `1 == True` would.
    """
    return all(k in metadata and _same_value(metadata[k], v) for k, v in flt.items())


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def validate_namespace(namespace: str) -> None:
    if namespace == "":  # the default namespace, on most saves
        return
    if len(namespace) > MAX_NAME or any(ord(ch) < 32 for ch in namespace):
        raise InvalidArgumentError("namespace must be at most 256 printable characters")


def validate_metadata(metadata: dict[str, Any]) -> None:
    if metadata == {}:  # none, on most saves: nothing to encode
        return
    try:
        encoded = json.dumps(metadata, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"metadata is not JSON-compatible: {exc}") from exc
    if len(encoded) > MAX_METADATA_BYTES:
        raise InvalidArgumentError(f"metadata is larger than {MAX_METADATA_BYTES} bytes")


#: Is a string a digest as the API spells it (64 lowercase hex characters)?
_is_digest = re.compile("[0-9a-f]{64}").fullmatch


def _resume_digest(live: LiveSession, up: ChunkUpload) -> tuple[native.Digester, int]:
    """Where an upload's digest check starts: a digester fed with the state's
    bytes before chunk `start` (a copy kept from its base's check), or (new, 0)."""
    point, start = _resume_point(live, up)
    return (point.copy(), start) if point is not None else (native.Digester(), 0)


def _resume_point(live: LiveSession, up: ChunkUpload) -> tuple[native.Digester | None, int]:
    """The kept digester an upload's check may resume from, and its chunk index."""
    points = live.digest_resume.get(up.base_checkpoint_id) if up.keep else None
    if points:
        start = max((i for i in points if i <= up.keep), default=-1)
        if start >= 0:
            return points[start], start
    return None, 0


def _keep_resume_points(
    live: LiveSession, checkpoint_id: str, points: dict[int, native.Digester]
) -> None:
    """Remember where uploads on `checkpoint_id` may resume their digest check.

    Those of the last DIGEST_RESUME_UPLOADS uploads are kept, not only the
    last one's: a save judged cheap enough for the event loop because its
    check resumes (`save_work`) still resumes when another save of the
    session landed in between.
    """
    with live.lock:
        kept = live.digest_resume
        kept[checkpoint_id] = points
        while len(kept) > DIGEST_RESUME_UPLOADS:
            del kept[next(iter(kept))]
