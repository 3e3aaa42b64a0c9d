"""``stratad ctl export``: a session, with every checkpoint's state, pending writes
and captured structured state, written to one portable archive
(`stratad.ctl.archive`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from google.protobuf import json_format

from stratad.api.v1 import checkpoint_pb2, session_pb2
from stratad.ctl.archive import (
    ArchivedBlob,
    ArchivedCheckpoint,
    ArchivedSession,
    ArchivedWrite,
    ArchiveWriter,
)
from stratad.ctl.context import EXIT_OK, STATUS_NAMES, Ctl, CtlError, human_bytes
from stratad.errors import NotFoundError
from stratad.sdk.client import Client


def cmd_export(ctl: Ctl, args: argparse.Namespace) -> int:
    client = ctl.client
    session = client.get_session(args.session_id)
    newest_first = list(client.list_checkpoints(args.session_id, page_size=1000))
    checkpoints = list(reversed(newest_first))
    path = Path(args.output or f"{args.session_id}.stratad.tar")
    archived = ArchivedSession(
        session_id=session.session_id,
        status=STATUS_NAMES.get(session.status, ""),
        labels=dict(session.labels),
        keep_last=session.retention.keep_last,
        max_age_seconds=session.retention.max_age_seconds,
        head_checkpoint_id=session.head_checkpoint_id,
        forked_from_checkpoint_id=session.forked_from_checkpoint_id,
        created_at=session.created_at.ToJsonString() if session.created_at.seconds else "",
        version=session.version,
    )
    source = {"address": ctl.address, "tenant": ctl.tenant or "default"}
    logical = 0
    with (
        ArchiveWriter(path, archived, source) as writer,
        ctl.progress(f"export {args.session_id}", len(checkpoints)) as progress,
    ):
        for cp in checkpoints:
            try:
                loaded = _load_everything(client, args.session_id, cp.checkpoint_id)
            except NotFoundError:
                raise CtlError(
                    f"checkpoint {cp.checkpoint_id} disappeared during the export "
                    "(retention or a delete): export again, or pause the session first"
                ) from None
            archived_cp = _archived_checkpoint(cp)
            _add_extras(writer, archived_cp, loaded)
            writer.add_checkpoint(archived_cp, loaded.data)
            logical += len(loaded.data)
            progress.advance()
        archived.structured = _structured_blob(writer, _current_structured(client, args.session_id))
    after = client.get_session(args.session_id)
    if after.version != session.version:
        ctl.note(
            f"session {args.session_id} changed during the export (version {session.version} "
            f"-> {after.version}); the archive holds the checkpoints listed at the start"
        )
    size = path.stat().st_size
    summary = {
        "session_id": args.session_id,
        "path": str(path),
        "checkpoints": len(checkpoints),
        "chunks": len(writer.manifest.entries),
        "logical_bytes": logical,
        "archive_bytes": size,
    }
    ctl.emit(
        summary,
        f"exported {args.session_id}: {len(checkpoints)} checkpoints, "
        f"{human_bytes(logical)} of state in {human_bytes(size)} to {path}",
    )
    return EXIT_OK


def _load_everything(
    client: Client, session_id: str, checkpoint_id: str
) -> checkpoint_pb2.LoadStateResponse:
    """A checkpoint's state, pending writes and captured structured state in one call."""
    request = checkpoint_pb2.LoadStateRequest(
        session_id=session_id,
        checkpoint_id=checkpoint_id,
        include_writes=True,
        include_structured=True,
    )
    return client.call(client.checkpoints.LoadState, request)  # type: ignore[no-any-return]


def _add_extras(
    writer: ArchiveWriter, cp: ArchivedCheckpoint, loaded: checkpoint_pb2.LoadStateResponse
) -> None:
    """Store a checkpoint's pending writes and structured state as blobs of the archive."""
    cp.structured = _structured_blob(writer, loaded.structured_json)
    cp.pending_writes = [
        ArchivedWrite(
            task_id=w.task_id,
            task_path=w.task_path,
            idx=w.idx,
            channel=w.channel,
            type=w.type,
            value=writer.add_blob(w.value),
        )
        for w in loaded.checkpoint.pending_writes
    ]


def _structured_blob(writer: ArchiveWriter, structured_json: bytes) -> ArchivedBlob | None:
    """None for no structured state (a checkpoint that captured none, or ``{}``)."""
    if not structured_json or structured_json.strip() == b"{}":
        return None
    return writer.add_blob(structured_json)


def _current_structured(client: Client, session_id: str) -> bytes:
    request = session_pb2.GetStructuredStateRequest(session_id=session_id)
    response = client.call(client.sessions.GetStructuredState, request)
    return bytes(response.structured_json)


def _archived_checkpoint(cp: checkpoint_pb2.Checkpoint) -> ArchivedCheckpoint:
    return ArchivedCheckpoint(
        checkpoint_id=cp.checkpoint_id,
        parent_checkpoint_id=cp.parent_checkpoint_id,
        namespace=cp.namespace,
        name=cp.name,
        content_type=cp.content_type,
        metadata=json_format.MessageToDict(cp.metadata),
        created_at=cp.created_at.ToJsonString() if cp.created_at.seconds else "",
        version=cp.version,
        size=cp.size,
        digest=cp.digest,
        chunks=[],
    )


__all__ = ["cmd_export"]
