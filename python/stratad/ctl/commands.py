"""The ``stratad ctl`` commands (see `stratad.ctl` for the list and exit codes)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf import json_format, timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stratad.api.v1 import admin_pb2, checkpoint_pb2, common_pb2, session_pb2
from stratad.ctl.archive import (
    ArchivedCheckpoint,
    ArchivedSession,
    ArchiveError,
    ArchiveReader,
    ArchiveWriter,
)
from stratad.ctl.progress import Progress
from stratad.errors import NotFoundError, StratadError, UnavailableError
from stratad.sdk.client import Client, to_error
from stratad.sdk.connection import Connection, TLSConfig
from stratad.server.auth import token_digest

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3
EXIT_INTERRUPTED = 130
#: Verify and CollectGarbage walk the whole store: never give them less than this.
MAINTENANCE_TIMEOUT = 3600.0

STATUS_NAMES = {
    value: name.removeprefix("SESSION_STATUS_").lower()
    for name, value in common_pb2.SessionStatus.items()
}


class CtlError(StratadError):
    """A failure of the command itself (bad archive path, inconsistent import)."""


@dataclass
class Ctl:
    """What every command gets: where the daemon is, how to print."""

    connection: Connection
    timeout: float
    json: bool
    progress_mode: str
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    _client: Client | None = None

    @property
    def address(self) -> str:
        return self.connection.address

    @property
    def tenant(self) -> str:
        return self.connection.tenant

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client.from_connection(self.connection, timeout=self.timeout)
        return self._client

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Tenant header and bearer token, for calls made on the client's channel."""
        return self.connection.metadata

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def progress(self, label: str, total: int | None = None) -> Progress:
        enabled = {"always": True, "never": False}.get(self.progress_mode)
        return Progress(label, total, enabled=enabled, stream=self.err)

    def emit(self, document: Any, text: str | Callable[[], str]) -> None:
        """Print ``document`` as JSON with --json, else ``text``."""
        if self.json:
            self.out.write(json.dumps(document, indent=2) + "\n")
        else:
            body = text() if callable(text) else text
            if body:
                self.out.write(body if body.endswith("\n") else body + "\n")
        self.out.flush()

    def note(self, message: str) -> None:
        """A remark for the operator on stderr (never mixed into --json output)."""
        self.err.write(f"stratad ctl: {message}\n")
        self.err.flush()


def connection_of(args: argparse.Namespace) -> Connection:
    """The daemon and credentials the flags name; the environment fills in the rest."""
    tls_files = (args.tls_ca, args.tls_cert, args.tls_key)
    tls: TLSConfig | bool | None = args.tls
    if any(tls_files) or args.tls_server_name:
        # Flags complete what the environment says (a CA in env, a client cert by flag).
        base = TLSConfig.from_env(os.environ) or TLSConfig()
        tls = TLSConfig(
            args.tls_ca or base.ca_file,
            args.tls_cert or base.cert_file,
            args.tls_key or base.key_file,
            args.tls_server_name or base.server_name,
        )
    token = Path(args.token_file).read_text().strip() if args.token_file else None
    return Connection.resolve(args.address, tenant=args.tenant, token=token, tls=tls)


def run(args: argparse.Namespace) -> int:
    if args.ctl_command == "token":  # offline: no daemon, no connection
        return run_token(args)
    try:
        connection = connection_of(args)
    except (OSError, ValueError) as exc:
        print(f"stratad ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ctl = Ctl(connection, timeout=args.timeout, json=args.json, progress_mode=args.progress)
    command = args.ctl_command
    sub = getattr(args, f"{command}_command", None)
    handler = COMMANDS[(command, sub) if sub else (command,)]
    try:
        return handler(ctl, args)
    except ArchiveError as exc:
        ctl.note(f"refusing the archive: {exc.message}")
        return EXIT_FAILED
    except UnavailableError as exc:
        ctl.note(f"cannot reach the daemon at {ctl.address}: {exc.message}")
        return EXIT_FAILED
    except StratadError as exc:
        ctl.note(exc.message or type(exc).__name__)
        return EXIT_FAILED
    except OSError as exc:
        ctl.note(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
        return EXIT_FAILED
    except KeyboardInterrupt:
        ctl.note("interrupted")
        return EXIT_INTERRUPTED
    finally:
        ctl.close()


# --- formatting helpers ----------------------------------------------------------------


def to_dict(message: Any) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )
    return result


def session_dict(session: session_pb2.Session) -> dict[str, Any]:
    d = to_dict(session)
    d["status"] = STATUS_NAMES.get(session.status, str(session.status))
    return d


def when(ts: timestamp_pb2.Timestamp) -> str:
    if not ts.seconds and not ts.nanos:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts.seconds))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


# --- health ----------------------------------------------------------------------------


def cmd_health(ctl: Ctl, args: argparse.Namespace) -> int:
    status_names = health_pb2.HealthCheckResponse.ServingStatus
    try:
        response = health_pb2_grpc.HealthStub(ctl.client.channel).Check(
            health_pb2.HealthCheckRequest(service=args.service),
            timeout=min(ctl.timeout, 10.0),
            metadata=ctl.metadata,
        )
    except grpc.RpcError as exc:
        error = to_error(exc)
        ctl.emit({"status": "UNREACHABLE", "error": error.message}, "")
        ctl.note(f"{ctl.address}: {error.message}")
        return EXIT_FAILED
    name = status_names.Name(response.status)
    ctl.emit({"status": name}, name)
    return EXIT_OK if response.status == health_pb2.HealthCheckResponse.SERVING else EXIT_FAILED


# --- sessions -------------------------------------------------------------------------------


def cmd_sessions_ls(ctl: Ctl, args: argparse.Namespace) -> int:
    sessions = list(ctl.client.list_sessions(prefix=args.prefix, page_size=1000))
    rows = [
        [
            s.session_id,
            STATUS_NAMES.get(s.status, "?"),
            str(s.version),
            str(s.checkpoint_count),
            when(s.updated_at),
            ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())),
        ]
        for s in sessions
    ]
    ctl.emit(
        {"sessions": [session_dict(s) for s in sessions]},
        lambda: table(["SESSION", "STATUS", "VERSION", "CHECKPOINTS", "UPDATED", "LABELS"], rows),
    )
    return EXIT_OK


def cmd_sessions_show(ctl: Ctl, args: argparse.Namespace) -> int:
    s = ctl.client.get_session(args.session_id)

    def text() -> str:
        lines = [
            f"session:      {s.session_id}",
            f"status:       {STATUS_NAMES.get(s.status, '?')}",
            f"version:      {s.version}",
            f"checkpoints:  {s.checkpoint_count}",
            f"head:         {s.head_checkpoint_id or '-'}",
            f"created:      {when(s.created_at)}",
            f"updated:      {when(s.updated_at)}",
            f"retention:    keep_last={s.retention.keep_last or 'unlimited'} "
            f"max_age_seconds={s.retention.max_age_seconds or 'unlimited'}",
        ]
        if s.forked_from_checkpoint_id:
            lines.append(f"forked from:  {s.forked_from_checkpoint_id}")
        for key, value in sorted(s.labels.items()):
            lines.append(f"label:        {key}={value}")
        return "\n".join(lines)

    ctl.emit({"session": session_dict(s)}, text)
    return EXIT_OK


def cmd_sessions_rm(ctl: Ctl, args: argparse.Namespace) -> int:
    deleted = []
    for session_id in args.session_ids:
        ctl.client.delete_session(session_id)
        deleted.append(session_id)
        if not ctl.json:
            ctl.out.write(f"deleted {session_id}\n")
    if ctl.json:
        ctl.emit({"deleted": deleted}, "")
    return EXIT_OK


# --- checkpoints and state ----------------------------------------------------------------


def cmd_checkpoints_ls(ctl: Ctl, args: argparse.Namespace) -> int:
    checkpoints = []
    for cp in ctl.client.list_checkpoints(args.session_id, namespace=args.namespace):
        checkpoints.append(cp)
        if args.limit and len(checkpoints) >= args.limit:
            break
    rows = [
        [
            c.checkpoint_id,
            when(c.created_at),
            c.namespace or "-",
            c.name or "-",
            human_bytes(c.size),
            human_bytes(c.stored_bytes),
            c.digest[:12],
            c.parent_checkpoint_id or "-",
        ]
        for c in checkpoints
    ]
    headers = ["CHECKPOINT", "CREATED", "NAMESPACE", "NAME", "SIZE", "STORED", "DIGEST", "PARENT"]
    ctl.emit({"checkpoints": [to_dict(c) for c in checkpoints]}, lambda: table(headers, rows))
    return EXIT_OK


def cmd_state_get(ctl: Ctl, args: argparse.Namespace) -> int:
    loaded = ctl.client.load_state(args.session_id, args.checkpoint, args.namespace)
    info = {
        "session_id": args.session_id,
        "checkpoint_id": loaded.checkpoint_id,
        "content_type": loaded.content_type,
        "digest": loaded.digest,
        "size": len(loaded.data),
        "metadata": json_format.MessageToDict(loaded.metadata),
    }
    if args.output == "-":
        if ctl.json:
            import base64

            info["data_base64"] = base64.b64encode(loaded.data).decode()
            ctl.emit(info, "")
        else:
            sys.stdout.buffer.write(loaded.data)
            sys.stdout.buffer.flush()
        return EXIT_OK
    path = Path(args.output)
    write_atomically(path, loaded.data)
    info["path"] = str(path)
    ctl.emit(
        info,
        f"wrote {len(loaded.data)} bytes of checkpoint {loaded.checkpoint_id} to {path}",
    )
    return EXIT_OK


def write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# --- maintenance ------------------------------------------------------------------------------


def _long_call(ctl: Ctl, label: str, method: Any, request: Any) -> Any:
    """A unary call that may take minutes, with a spinner while it runs."""
    timeout = max(ctl.timeout, MAINTENANCE_TIMEOUT)
    future = method.future(request, timeout=timeout, metadata=ctl.metadata)
    with ctl.progress(label) as progress:
        while True:
            try:
                return future.result(timeout=0.1)
            except grpc.FutureTimeoutError:
                progress.update()
            except grpc.RpcError as exc:
                raise to_error(exc) from None


def cmd_verify(ctl: Ctl, args: argparse.Namespace) -> int:
    report: admin_pb2.VerifyResponse = _long_call(
        ctl, "verify", ctl.client.admin.Verify, admin_pb2.VerifyRequest()
    )

    def text() -> str:
        lines = [f"objects checked: {report.objects_checked}"]
        for c in report.corrupt_objects:
            sessions = ", ".join(c.session_ids) or "no session"
            lines.append(f"CORRUPT {c.digest}: {c.problem} (affects {sessions})")
        for s in report.damaged_sessions:
            lines.append(f"DAMAGED session {s}")
        if report.remote_objects_checked or report.remote_damaged_sessions:
            lines.append(f"objects checked in object storage: {report.remote_objects_checked}")
        for c in report.remote_corrupt_objects:
            lines.append(f"CORRUPT in object storage {c.digest}: {c.problem}")
        for s in report.remote_damaged_sessions:
            lines.append(f"DAMAGED in object storage: session {s}")
        for s in report.remote_damaged_library_segments:
            lines.append(f"DAMAGED in object storage: library segment {s}")
        lines.append("ok" if report.ok else "PROBLEMS FOUND")
        return "\n".join(lines)

    ctl.emit(to_dict(report), text)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def cmd_gc(ctl: Ctl, args: argparse.Namespace) -> int:
    report: admin_pb2.CollectGarbageResponse = _long_call(
        ctl, "gc", ctl.client.admin.CollectGarbage, admin_pb2.CollectGarbageRequest()
    )
    ctl.emit(
        to_dict(report),
        f"removed {report.objects_removed} objects ({human_bytes(report.bytes_freed)}), "
        f"kept {report.objects_kept}, in {report.seconds:.2f}s"
        + (
            f"; object storage: deleted {report.remote_packs_deleted} packs "
            f"({human_bytes(report.remote_bytes_freed)}), condemned "
            f"{report.remote_packs_condemned}"
            if report.remote_packs_deleted or report.remote_packs_condemned
            else ""
        ),
    )
    return EXIT_OK


def cmd_stats(ctl: Ctl, args: argparse.Namespace) -> int:
    s = ctl.client.store_stats()
    text = "\n".join(
        [
            f"sessions:          {s.sessions}",
            f"checkpoints:       {s.checkpoints}",
            f"objects:           {s.objects}",
            f"logical bytes:     {s.logical_bytes} ({human_bytes(s.logical_bytes)})",
            f"unique bytes:      {s.unique_bytes} ({human_bytes(s.unique_bytes)})",
            f"stored bytes:      {s.stored_bytes} ({human_bytes(s.stored_bytes)})",
            f"dedup ratio:       {s.dedup_ratio:.2f}",
            f"compression ratio: {s.compression_ratio:.2f}",
        ]
    )
    ctl.emit(to_dict(s), text)
    return EXIT_OK


def cmd_replication_status(ctl: Ctl, args: argparse.Namespace) -> int:
    s: admin_pb2.GetReplicationStatusResponse = ctl.client.call(
        ctl.client.admin.GetReplicationStatus, admin_pb2.GetReplicationStatusRequest()
    )
    text = "\n".join(
        [
            f"mode:            {s.mode}",
            f"node id:         {s.node_id}",
            f"sessions owned:  {s.sessions_owned}",
            f"bytes behind:    {s.bytes_behind} ({human_bytes(s.bytes_behind)})",
            f"objects queued:  {s.objects_queued}",
            f"lag:             {s.lag_seconds:.3f}s",
            f"last shipment:   {s.last_shipment_seconds:.3f}s",
            f"library behind:  {s.library_records_behind} records "
            f"(lag {s.library_lag_seconds:.3f}s)",
            f"library streams: {s.library_segments} segments, "
            f"{s.library_damaged_segments} damaged segments seen",
        ]
    )
    ctl.emit(to_dict(s), text)
    return EXIT_OK


def cmd_restore(ctl: Ctl, args: argparse.Namespace) -> int:
    request = admin_pb2.RestoreSessionFromRemoteRequest(session_id=args.session_id)
    restored: admin_pb2.RestoreSessionFromRemoteResponse = _long_call(
        ctl, f"restore {args.session_id}", ctl.client.admin.RestoreSessionFromRemote, request
    )
    session = restored.session
    ctl.emit(
        to_dict(restored),
        f"restored {session.session_id} from object storage: version {session.version}, "
        f"{session.checkpoint_count} checkpoints",
    )
    return EXIT_OK


# --- export ----------------------------------------------------------------------------------


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
                loaded = client.load_state(args.session_id, cp.checkpoint_id)
            except NotFoundError:
                raise CtlError(
                    f"checkpoint {cp.checkpoint_id} disappeared during the export "
                    "(retention or a delete): export again, or pause the session first"
                ) from None
            writer.add_checkpoint(_archived_checkpoint(cp), loaded.data)
            logical += len(loaded.data)
            progress.advance()
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


# --- import ----------------------------------------------------------------------------------


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
        self.imported: set[str] = set()
        self.notes: list[str] = []
        self.status = "active"

    def run(self) -> None:
        s = self.manifest.session
        self.client.create_session(
            self.session_id,
            labels=s.labels,
            keep_last=s.keep_last,
            max_age_seconds=s.max_age_seconds,
        )
        try:
            self._checkpoints()
            self._finish()
        except BaseException as exc:
            with contextlib.suppress(StratadError):
                self.client.delete_session(self.session_id)
            if isinstance(exc, StratadError) and not isinstance(exc, ArchiveError):
                raise CtlError(
                    f"import of {self.session_id} failed and was rolled back: {exc.message}"
                ) from exc
            raise

    def _checkpoints(self) -> None:
        checkpoints = self.manifest.checkpoints
        with self.ctl.progress(f"import {self.session_id}", len(checkpoints)) as progress:
            for cp, data in self.reader.states():
                if cp.name:
                    self._named(cp, data)
                else:
                    self._save(cp, data, cp.checkpoint_id)
                self.imported.add(cp.checkpoint_id)
                progress.advance()

    def _save(self, cp: ArchivedCheckpoint, data: bytes, checkpoint_id: str) -> str:
        parent = cp.parent_checkpoint_id if cp.parent_checkpoint_id in self.imported else ""
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


# --- tokens (offline) ---------------------------------------------------------------------


def run_token(args: argparse.Namespace) -> int:
    """``token new`` / ``token hash``: what docs/security.md tells operators to run."""
    if args.token_command == "hash":
        token = sys.stdin.readline().strip()
        if not token:
            print("stratad ctl: token hash reads a token on stdin; got none", file=sys.stderr)
            return EXIT_USAGE
        print(token_digest(token))
        return EXIT_OK
    token = secrets.token_urlsafe(32)
    entry = {"tenant": args.for_tenant, "role": args.role}
    if args.name:
        entry["name"] = args.name
    fields = ", ".join(f"{key} = {json.dumps(value)}" for key, value in entry.items())
    print(token)
    print(f'"{token_digest(token)}" = {{ {fields} }}')
    return EXIT_OK


def _iter_commands() -> Iterator[tuple[tuple[str, ...], Callable[[Ctl, argparse.Namespace], int]]]:
    yield ("health",), cmd_health
    yield ("sessions", "ls"), cmd_sessions_ls
    yield ("sessions", "show"), cmd_sessions_show
    yield ("sessions", "rm"), cmd_sessions_rm
    yield ("checkpoints", "ls"), cmd_checkpoints_ls
    yield ("state", "get"), cmd_state_get
    yield ("verify",), cmd_verify
    yield ("gc",), cmd_gc
    yield ("stats",), cmd_stats
    yield ("replication", "status"), cmd_replication_status
    yield ("restore",), cmd_restore
    yield ("export",), cmd_export
    yield ("import",), cmd_import


COMMANDS: dict[tuple[str, ...], Callable[[Ctl, argparse.Namespace], int]] = dict(_iter_commands())

__all__ = ["COMMANDS", "EXIT_FAILED", "EXIT_OK", "EXIT_PROBLEMS", "Ctl", "run"]
