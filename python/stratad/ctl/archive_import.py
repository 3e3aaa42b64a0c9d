"""``stratad ctl import``: check an archive (`stratad.ctl.archive`) and re-create its
session on the daemon, all or nothing: checkpoint IDs, parents, names, pending
writes and structured state as they were; a failed import is rolled back."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from stratad.api.v1 import session_pb2
from stratad.ctl.archive import ArchivedBlob, ArchivedCheckpoint, ArchiveError, ArchiveReader
from stratad.ctl.context import EXIT_OK, Ctl, CtlError
from stratad.errors import AlreadyExistsError, StratadError


def cmd_import(ctl: Ctl, args: argparse.Namespace) -> int:
    path = Path(args.archive)
    if not path.is_file():
        raise CtlError(f"{path}: no such archive")
    with ArchiveReader(path, max_state_bytes=args.max_state_bytes) as reader:
        manifest = reader.manifest
        with ctl.progress(f"check {path.name}") as progress:
            reader.verify(lambda done, total: progress.update(done, total))
        if args.verify_only:
            ctl.emit(
                {"archive": str(path), "ok": True, "checkpoints": len(manifest.checkpoints)},
                f"{path}: ok ({len(manifest.checkpoints)} checkpoints of session "
                f"{manifest.session.session_id})",
            )
            return EXIT_OK
        session_id = args.session_id or manifest.session.session_id
        importer = _Importer(ctl, reader, session_id)
        importer.run()
    summary = {
        "session_id": session_id,
        "checkpoints": len(manifest.checkpoints),
        "status": importer.status,
        "notes": importer.notes,
    }
    ctl.emit(
        summary,
        f"imported {session_id}: {len(manifest.checkpoints)} checkpoints from {path}",
    )
    for note in importer.notes:
        ctl.note(note)
    return EXIT_OK


class _Importer:
    """Re-create a verified archive's session on the daemon, all or nothing."""

    def __init__(self, ctl: Ctl, reader: ArchiveReader, session_id: str) -> None:
        self.ctl = ctl
        self.client = ctl.client
        self.reader = reader
        self.manifest = reader.manifest
        self.session_id = session_id
        self.head = ""
        #: The archived checkpoint being imported (named when its ID is taken).
        self.current = ""
        self.imported: set[str] = set()
        self.notes: list[str] = []
        self.status = "active"
        self.has_structured = self.manifest.session.structured is not None or any(
            cp.structured is not None for cp in self.manifest.checkpoints
        )

    def run(self) -> None:
        s = self.manifest.session
        try:
            self.client.create_session(
                self.session_id,
                labels=s.labels,
                keep_last=s.keep_last,
                max_age_seconds=s.max_age_seconds,
            )
        except AlreadyExistsError as exc:
            if self._holds_archived(self.session_id):
                raise CtlError(
                    f"session {self.session_id!r} already exists in {self._tenant()} with the "
                    "archive's checkpoints, whose IDs are unique within a tenant (another "
                    "--session-id would not be enough): import into another --tenant, or "
                    f"delete session {self.session_id!r} first"
                ) from exc
            raise CtlError(
                f"session {self.session_id!r} already exists in {self._tenant()}: import under "
                "another --session-id, or into another --tenant"
            ) from exc
        try:
            self._checkpoints()
            self._finish()
        except BaseException as exc:
            with contextlib.suppress(StratadError):
                self.client.delete_session(self.session_id)
            if isinstance(exc, AlreadyExistsError) and self.current:
                raise CtlError(
                    f"import of {self.session_id} failed and was rolled back: "
                    f"{self._taken(self.current)}"
                ) from exc
            if isinstance(exc, StratadError) and not isinstance(exc, ArchiveError):
                raise CtlError(
                    f"import of {self.session_id} failed and was rolled back: {exc.message}"
                ) from exc
            raise

    def _tenant(self) -> str:
        tenant = self.ctl.tenant
        return f"tenant {tenant!r}" if tenant else "this tenant"

    def _taken(self, checkpoint_id: str) -> str:
        """What to do when the archive's ``checkpoint_id`` is taken in the tenant:
        an import keeps checkpoint IDs, which are unique within a tenant."""
        holder = self._holder(checkpoint_id)
        where = f"session {holder!r} already has" if holder else "another session has"
        remedy = f"delete session {holder!r} first" if holder else "delete that session first"
        return (
            f"{where} checkpoint {checkpoint_id!r} in {self._tenant()}, and an import keeps the "
            "archive's checkpoint IDs (unique within a tenant; --session-id renames only the "
            f"session): import into another --tenant, or {remedy}"
        )

    def _holder(self, checkpoint_id: str) -> str:
        """The archive's original session if it is in this tenant and holds
        ``checkpoint_id`` (the usual case: an archive imported back into the
        tenant it was exported from), else ""."""
        original = self.manifest.session.session_id
        if original == self.session_id:  # the import's own session, deleted by now
            return ""
        return original if self._holds_archived(original, checkpoint_id) else ""

    def _holds_archived(self, session_id: str, checkpoint_id: str = "") -> bool:
        """Whether ``session_id`` holds ``checkpoint_id`` (default: any of the archive's)."""
        wanted = (
            {checkpoint_id}
            if checkpoint_id
            else {c.checkpoint_id for c in self.manifest.checkpoints}
        )
        try:
            return any(c.checkpoint_id in wanted for c in self.client.list_checkpoints(session_id))
        except StratadError:
            return False

    def _checkpoints(self) -> None:
        checkpoints = self.manifest.checkpoints
        with self.ctl.progress(f"import {self.session_id}", len(checkpoints)) as progress:
            for cp, data in self.reader.states():
                self.current = cp.checkpoint_id
                if cp.name:
                    self._named(cp, data)
                else:
                    self._save(cp, data, cp.checkpoint_id)
                self._put_writes(cp)
                self.imported.add(cp.checkpoint_id)
                progress.advance()
            self.current = ""

    def _set_structured(self, blob: ArchivedBlob | None) -> None:
        """Make the session's structured state ``blob``'s (None: none) before a capture.

        Never called for an archive without structured state (a version 1
        archive, or a session that had none): its import needs no more than
        a daemon that predates ReplaceStructuredState.
        """
        if not self.has_structured:
            return
        data = self.reader.blob("structured state", blob) if blob is not None else b"{}"
        request = session_pb2.ReplaceStructuredStateRequest(
            session_id=self.session_id, structured_json=data
        )
        self.client.call(self.client.sessions.ReplaceStructuredState, request)

    def _put_writes(self, cp: ArchivedCheckpoint) -> None:
        """The checkpoint's pending writes, one PutWrites per task (in the archive's order)."""
        tasks: dict[tuple[str, str], list[tuple[int, str, str, bytes]]] = {}
        for w in cp.pending_writes:
            value = self.reader.blob(f"pending write {w.task_id}/{w.idx}", w.value)
            tasks.setdefault((w.task_id, w.task_path), []).append((w.idx, w.channel, w.type, value))
        for (task_id, task_path), writes in tasks.items():
            self.client.put_writes(
                self.session_id, cp.checkpoint_id, task_id, writes, task_path=task_path
            )

    def _save(self, cp: ArchivedCheckpoint, data: bytes, checkpoint_id: str) -> str:
        parent = cp.parent_checkpoint_id if cp.parent_checkpoint_id in self.imported else ""
        self._set_structured(cp.structured)  # what the save captures with the checkpoint
        saved = self.client.save_state(
            self.session_id,
            data,
            content_type=cp.content_type,
            metadata=cp.metadata,
            checkpoint_id=checkpoint_id,
            parent_checkpoint_id=parent,
            namespace=cp.namespace,
        )
        if saved.digest != cp.digest:
            raise CtlError(f"checkpoint {cp.checkpoint_id}: the daemon stored another digest")
        self.head = saved.checkpoint_id
        return str(saved.checkpoint_id)

    def _named(self, cp: ArchivedCheckpoint, data: bytes) -> None:
        """A named checkpoint pins the head: make its parent the head, then pin it."""
        parent = cp.parent_checkpoint_id
        temporary = ""
        if parent in self.imported and self._digest_of(parent) == cp.digest:
            if self.head != parent:
                self.client.restore_checkpoint(parent, make_current=True)
                self.head = parent
        else:
            # The parent is not in the archive (dropped by retention or deleted):
            # save the state under a temporary ID, pin it, then delete it.
            temporary = self._save(cp, data, "")
        self._set_structured(cp.structured)
        created = self.client.create_checkpoint(
            self.session_id, cp.name, metadata=cp.metadata, checkpoint_id=cp.checkpoint_id
        )
        self.head = created.checkpoint_id
        if temporary:
            self.client.delete_checkpoint(temporary)
        if created.digest != cp.digest:
            raise CtlError(f"checkpoint {cp.checkpoint_id}: the daemon pinned another digest")

    def _digest_of(self, checkpoint_id: str) -> str:
        for cp in self.manifest.checkpoints:
            if cp.checkpoint_id == checkpoint_id:
                return cp.digest
        return ""

    def _finish(self) -> None:
        s = self.manifest.session
        if s.head_checkpoint_id in self.imported and self.head != s.head_checkpoint_id:
            self.client.restore_checkpoint(s.head_checkpoint_id, make_current=True)
        # Last: restoring a checkpoint brings back the structured state it captured.
        self._set_structured(s.structured)
        listed = {c.checkpoint_id: c.digest for c in self.client.list_checkpoints(self.session_id)}
        expected = {c.checkpoint_id: c.digest for c in self.manifest.checkpoints}
        if listed != expected:
            missing = sorted(set(expected) - set(listed))
            extra = sorted(set(listed) - set(expected))
            raise CtlError(
                f"the imported session does not hold the archive's checkpoints "
                f"(missing: {missing[:5]}, unexpected: {extra[:5]})"
            )
        if s.status == "paused":
            self.client.pause_execution(self.session_id)
            self.status = "paused"
        elif s.status not in ("", "active"):
            self.notes.append(
                f"the session was {s.status} in the archive; the API cannot set that status, "
                "so it was imported as active"
            )
        if s.forked_from_checkpoint_id:
            self.notes.append(
                f"the session was forked from checkpoint {s.forked_from_checkpoint_id}; "
                "an imported session records no fork origin"
            )


__all__ = ["cmd_import"]
